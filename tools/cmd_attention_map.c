/* cmd_attention_map.c — placeholder until the command lands; fails loudly. */
#include "cli.h"

int cmd_attention_map(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'attention_map' is not built yet");
}
