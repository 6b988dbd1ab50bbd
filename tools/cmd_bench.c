/* cmd_bench.c — placeholder until the command lands; fails loudly. */
#include "cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'bench' is not built yet");
}
