/* cli.h — what the vitc subcommands share. The CLI calls only the public API
 * (and the header-only generator src/rng.h, which has no linkage). */
#ifndef VITC_CLI_H
#define VITC_CLI_H

#include <stdio.h>

#include "vitc.h"

/* Exit codes (DESIGN.md section 4). */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* "vitc: error: ..." on stderr; returns CLI_FAIL. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "vitc: error: ...\nTry 'vitc CMD --help'." on stderr; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The library's last error as a CLI failure. */
int cli_lib_error(const char *what);
/* Parse a non-negative int option value; 0 on success. */
int cli_parse_int(const char *s, int *out);
/* 1 when stderr is a terminal (progress then updates one line). */
int cli_stderr_tty(void);

typedef int (*cli_cmd_fn)(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_classify(int argc, char **argv);
int cmd_attention_map(int argc, char **argv);

#endif
