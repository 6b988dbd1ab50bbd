/* train.h — what `vitc train`, `vitc eval` and `vitc plot-log` share: the
 * data sets named on the command line, evaluation, checkpoints, options,
 * and the small PNG plotting routine. CLI code: public API only. */
#ifndef VITC_TRAIN_H
#define VITC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "plot.h"

/* ---- options --------------------------------------------------------- */
/* cli_parse (cli.h) with the command's usage text for --help. Positionals:
 * none when arg is NULL, else exactly one (arg_name says what) into *arg.
 * 0: go on; -1: --help printed (exit with CLI_OK); else the exit status
 * (CLI_USAGE, CLI_FAIL), the error printed. */
int topt_parse(const char *cmd, const char *usage, const cli_opt *opts, int n, int argc,
               char **argv, const char *arg_name, const char **arg);

/* ---- data sets ------------------------------------------------------ */
/* --data: "fashion-mnist" (Debian's package), "mnist-dir:DIR"-like plain
 * DIR holding IDX files, or an ImageFolder root with train/ (and val/). */
typedef struct train_data {
    vitc_dataset *train, *eval;  /* eval may be NULL (no val/ split) */
    int idx;                     /* 1: IDX (gray), 0: ImageFolder (RGB) */
    float mean, std;             /* data set statistics for a new model (IDX) */
    char desc[64];               /* "fashion-mnist", "folder" */
} train_data;
/* classes (may be NULL): an evaluation ImageFolder's class list (a model's
 * labels), so that label i means the model's class i. */
int train_data_open(const char *spec, int need_train, int n_classes, const char *const *classes,
                    train_data *d);
void train_data_close(train_data *d);

/* ---- evaluation ----------------------------------------------------- */
typedef struct eval_result {
    int64_t n, correct;
    double loss;          /* mean cross-entropy (no smoothing) */
    int64_t skipped;
} eval_result;
/* Per-class counts kept sparse: cells (true, predicted) -> count in an open
 * addressing table, so that 100,000 classes do not cost a C x C matrix. */
typedef struct eval_counts {
    int C;
    int64_t *total, *hit; /* [C] each */
    int64_t *key, *val;   /* [cap]: true * C + predicted (-1: empty), count */
    size_t n, cap;
} eval_counts;
void eval_counts_free(eval_counts *e);
/* The dense [C, C] matrix of the counts, to show it (small C only), or NULL. */
int64_t *eval_counts_dense(const eval_counts *e);
/* Eval-mode forward over the whole data set in batches. counts (may be
 * NULL) is filled (free it with eval_counts_free, on errors too). */
int train_evaluate(vitc_vit *m, vitc_dataset *ds, int batch, eval_result *r, eval_counts *counts,
                   int quiet, const char *what);
vitc_batch_opts train_batch_opts(const vitc_vit_config *c);
/* The predicted class of logits l [C]: the first of the largest. */
int train_argmax(const float *l, int C);

/* --config FILE: the fields it has (image_size, patch_size, in_channels,
 * hidden_dim, depth, num_heads, mlp_dim, norm_eps, mean, std) into c. */
int train_config_from_file(const char *path, vitc_vit_config *c);

/* ---- outputs ------------------------------------------------------- */
/* A file the run writes (or, in the inputs list, reads), by option name. */
typedef struct train_output {
    const char *opt, *path; /* path NULL: not given */
    int fd;                 /* the lock's (-1: none) */
    char *lock;
    int same_ok;            /* in an input: the output that may be this file
                             * (--out continuing --resume in place), else -1 */
} train_output;
/* Before the first step: every output path is a regular file or absent
 * (never a link, directory, FIFO or device), writable, in a folder that
 * exists and takes new files; the outputs name different files and none is
 * an input (but in[j].same_ok); then each is locked (PATH.lock, flock, non-blocking: a
 * second run on the same file is refused). The error printed, or CLI_OK. */
int train_outputs_open(train_output *out, int n, const train_output *in, int n_in);
/* Unlock and remove the lock files. */
void train_outputs_close(train_output *out, int n);
/* --log: a regular file opened without blocking (a FIFO is refused, not
 * waited on), truncated unless append. */
int train_log_open(const char *path, int append, FILE **f);
/* The log's writes so far reached the file (fflush, ferror): CLI_OK or the
 * error printed. */
int train_log_flush(FILE *f, const char *path);

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_plot_log(int argc, char **argv);
int cmd_demo_fashion(int argc, char **argv);

#endif
