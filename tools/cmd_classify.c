/* cmd_classify.c — placeholder until the command lands; fails loudly. */
#include "cli.h"

int cmd_classify(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'classify' is not built yet");
}
