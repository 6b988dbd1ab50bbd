/* cmd_inspect.c — placeholder until the command lands; fails loudly. */
#include "cli.h"

int cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'inspect' is not built yet");
}
