/* cmd_demo.c — placeholder until the command lands; fails loudly. */
#include "cli.h"

int cmd_demo(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'demo' is not built yet");
}
