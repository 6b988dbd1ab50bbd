/*
 * cli_args.c — libFuzzer target for the command-line option parser,
 * cli_parse (tools/cli.c), which every vitc command uses.
 *
 * The input is split at NUL bytes into argv; its first byte picks how many
 * positional arguments the spec takes. The spec has every kind of option
 * the commands use (flags with an alias, strings, bounded integers, bounded
 * floats), each with a `given` marker. Only the parser runs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *model = NULL, *method = NULL;
    int quiet = 0, json = 0, topk = -7, crop = -7, threads = -7;
    float alpha = -7.0f;
    int given[8] = {0};
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &model, 0, 0, &given[0]},
        {"--method", NULL, CLI_STRING, &method, 0, 0, &given[1]},
        {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, &given[2]},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, &given[3]},
        {"--topk", NULL, CLI_INT, &topk, 1, 1000000000, &given[4]},
        {"--crop", NULL, CLI_INT, &crop, 1, 16384, &given[5]},
        {"--threads", NULL, CLI_INT, &threads, 1, CLI_MAX_THREADS, &given[6]},
        {"--alpha", NULL, CLI_FLOAT, &alpha, 0, 1, &given[7]},
    };
    char *buf, *argv[FUZZ_MAX_ARGS + 2], *pos[FUZZ_MAX_ARGS + 2], err[256];
    int argc = 1, n_pos = -1, rc;
    if (size < 1)
        return 0;
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), (int)(data[0] % 4) - 1,
                           "image"};
    /* One byte more than the arguments, so the last one is NUL-terminated. */
    if (!(buf = calloc(size, 1)))
        abort();
    memcpy(buf, data + 1, size - 1);
    argv[0] = "cmd";
    for (size_t i = 0; i < size - 1 && argc <= FUZZ_MAX_ARGS; i++)
        if (i == 0 || buf[i - 1] == '\0')
            argv[argc++] = buf + i;
    argv[argc] = NULL;
    rc = cli_parse(&spec, argc, argv, pos, &n_pos, err, sizeof err);
    if (rc == CLI_PARSE_ERROR) {
        /* One line, for "vitc: error: ..." */
        if (!err[0] || strchr(err, '\n'))
            abort();
    } else if (rc == CLI_PARSE_OK) {
        if (n_pos < 0 || n_pos >= argc || (spec.max_pos >= 0 && n_pos > spec.max_pos))
            abort();
        for (int i = 0; i < n_pos; i++)
            if (pos[i] < buf || pos[i] >= buf + size)
                abort(); /* positionals point into argv */
        /* A value stored is in its range; an option not given is untouched. */
        if (given[4] ? topk < 1 : topk != -7)
            abort();
        if (given[5] ? crop < 1 || crop > 16384 : crop != -7)
            abort();
        if (given[6] ? threads < 1 || threads > CLI_MAX_THREADS : threads != -7)
            abort();
        if (given[7] ? !(alpha >= 0.0f && alpha <= 1.0f) : alpha != -7.0f)
            abort();
        if (given[0] != (model != NULL) || given[2] != quiet || given[3] != json)
            abort();
    } else if (rc != CLI_PARSE_HELP) {
        abort();
    }
    free(buf);
    return 0;
}
