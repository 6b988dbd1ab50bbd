/* cli.h — what the vitc subcommands share. The CLI calls only the public API
 * (and the header-only generator src/rng.h, which has no linkage). */
#ifndef VITC_CLI_H
#define VITC_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vitc.h"

/* Exit codes (docs/cli.md). */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* "vitc: error: ..." on stderr, one line (control characters in the text,
 * e.g. from a path or a file, are escaped); returns CLI_FAIL. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "vitc: warning: ..." on stderr, one line, escaped as cli_error's. */
void cli_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "vitc: error: ...\nTry 'vitc CMD --help'." on stderr; returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The library's last error as a CLI failure. */
int cli_lib_error(const char *what);
/* Elements of a tensor of nd dims shape[0..nd) (the library checked the
 * shape: the product fits). */
size_t cli_numel(int nd, const int64_t *shape);
/* L2-normalise each of rows rows of n floats x [rows, n] in place
 * (F.normalize: / max(norm, 1e-12)). */
void cli_l2_normalize(float *x, size_t rows, size_t n);
/* A labels file of exactly n_classes lines into *out (n_classes strings,
 * each and the array malloc'd); else the error is printed, CLI_FAIL. */
int cli_read_labels(const char *path, int n_classes, char ***out);
/* A score and what it belongs to; cli_ranked_cmp (qsort) orders by
 * descending score, ties by ascending index, NaN last. */
typedef struct cli_ranked {
    float score;
    int index;
} cli_ranked;
int cli_ranked_cmp(const void *a, const void *b);
/* Seconds on the monotonic clock (differences are what count). */
double cli_now(void);
/* 1 when stderr is a terminal (progress then updates one line). */
int cli_stderr_tty(void);
/* s seconds as "m:ss" or "h:mm:ss" (0:00 for a negative or absurd value). */
void cli_fmt_time(double s, char *buf, size_t cap);
/* Progress through total images on stderr, one helper for every command:
 * on a terminal one updating line with the rate and the time left; else a
 * line every 10 s at most (none in a short run). Nothing when quiet. */
typedef struct cli_progress {
    const char *what;
    int64_t total;
    double t0, last;
    int on, tty, shown;
} cli_progress;
void cli_progress_start(cli_progress *p, const char *what, int64_t total, int quiet);
/* done of total finished: shown when the interval has passed. */
void cli_progress_update(cli_progress *p, int64_t done);
/* Clear the terminal's progress line, before other output and at the end. */
void cli_progress_clear(cli_progress *p);
/* --precision NAME and --attention-precision ATTN (NULL: leave it to follow
 * the weights' precision) on m:
 * CLI_USAGE for an unknown name (cmd names the command), CLI_FAIL when
 * packing fails. */
int cli_set_precision(const char *cmd, vitc_vit *m, const char *name, const char *attn);
/* --precision's value: *p a vitc_precision, or -1 when name is NULL; a
 * usage error for an unknown name. */
int cli_parse_precision(const char *cmd, const char *name, int *p);
/* vitc_vit_load, or vitc_vit_load_precision when precision >= 0 (the
 * weights packed while read: the load's peak is the converted model's). */
vitc_status cli_load_vit(const char *path, const char *arch, int precision, vitc_vit **m);
/* The attention's precision by name: VITC_PRECISION_FP32 / _BF16,
 * CLI_ATTN_AUTO for "auto" (the weights' precision decides), or -1. */
#define CLI_ATTN_AUTO 100
int cli_attention_precision(const char *name);
#define CLI_PRECISION_HELP \
    "  --precision P    fp32, bf16 or int8 arithmetic of the weight GEMMs\n" \
    "                   (default fp32; vitc --version says which kernels run)\n" \
    "  --attention-precision A\n" \
    "                   auto, fp32, bf16 or int8 operands of the attention's q k^T\n" \
    "                   and P v (default auto: the --precision's, bf16 or int8,\n" \
    "                   where the CPU runs it faster, else fp32; the softmax\n" \
    "                   stays fp32)\n"


/* Untrusted text (labels, metadata, tensor names, paths) shown on a
 * terminal: control characters are written escaped (\n, \t, \xHH), never
 * raw. At most max bytes of s. */
void cli_put_escaped(FILE *f, const char *s, size_t max);
/* The same into dst (always NUL-terminated; cut when cap is too small). */
void cli_escape(char *dst, size_t cap, const char *s);
/* s as a JSON string, quotes included: UTF-8 passed through, bytes that
 * are not valid UTF-8 as U+FFFD, so the output stays valid JSON. */
void cli_json_string(FILE *f, const char *s);
/* A new copy of s with each byte that is not part of valid UTF-8 replaced by
 * U+FFFD (for jansson, which refuses such strings); NULL when out of memory. */
char *cli_utf8_valid(const char *s);
/* v as a JSON number ("%.9g"), null for NaN and infinity (JSON has neither). */
void cli_json_number(FILE *f, double v);

/* ------------------------------------------------------------------ */
/* Options: one parser for every command                              */
/* ------------------------------------------------------------------ */

typedef enum cli_opt_kind {
    CLI_FLAG,   /* no value; dest: int *, set to 1 */
    CLI_STRING, /* dest: const char ** */
    CLI_INT,    /* dest: int *; a decimal integer in [min, max] */
    CLI_FLOAT,  /* dest: float *; a finite number in [min, max] */
    CLI_DOUBLE, /* dest: double *; a finite number in [min, max] */
} cli_opt_kind;

typedef struct cli_opt {
    const char *name;  /* "--topk" */
    const char *alias; /* "-q", or NULL */
    cli_opt_kind kind;
    void *dest;
    double min, max; /* CLI_INT, CLI_FLOAT, CLI_DOUBLE: accepted range, inclusive */
    int *given;      /* set to 1 when the option appears; may be NULL */
} cli_opt;

typedef struct cli_spec {
    const cli_opt *opts;
    int n_opts;
    int max_pos;          /* positional arguments accepted; -1: any number */
    const char *pos_name; /* what they are ("image", "file"), for messages */
} cli_spec;

enum { CLI_PARSE_OK = 0, CLI_PARSE_HELP = 1, CLI_PARSE_ERROR = 2 };

/* Parse argv[1..argc): "--name value", "--name=value", flags, "-h"/"--help",
 * "--" (the rest is positional). Positionals go to pos (room for argc
 * pointers), their count to *n_pos. Returns CLI_PARSE_OK, CLI_PARSE_HELP, or
 * CLI_PARSE_ERROR with a one-line message in err. Prints nothing and keeps
 * no state: the fuzz target calls it as it is. */
int cli_parse(const cli_spec *spec, int argc, char **argv, char **pos, int *n_pos, char *err,
              size_t err_len);
/* cli_parse for command cmd, with the usage error printed: 0 to go on,
 * CLI_PARSE_HELP, or CLI_USAGE. */
int cli_parse_command(const char *cmd, const cli_spec *spec, int argc, char **argv, char **pos,
                      int *n_pos);
/* The image commands' parse: the positionals, the images, into a new
 * *images (the caller frees it, on errors too); usage printed on --help (-1
 * returned); *model (an option's dest) required, and one image at least.
 * 0 to go on, else the exit status (the error printed). */
int cli_parse_images(const char *cmd, const char *usage, const cli_spec *spec, int argc,
                     char **argv, const char *const *model, char ***images, int *n_images);
/* Of names[0..n), the one within two edits (Levenshtein) of a and closest,
 * for a "did you mean" after a typo; NULL when none is that close. */
const char *cli_nearest_name(const char *a, const char *const *names, int n);
/* Which of exts[0..n) (".png", ...; any case) path's file name ends in:
 * its index; 0 for a name with no extension (exts[0] is the default). Else
 * the usage error "OPT PATH: CMD writes WHAT; name the file ..." is printed
 * and -1 returned: a name that promises another format (x.jpg, e.txt) must
 * not get PNG or .npy bytes under it. */
int cli_out_format(const char *cmd, const char *opt, const char *path, const char *what,
                   const char *const *exts, int n);
/* CLI_OK when m has a classification head; else the error, naming the
 * command that serves a backbone (the library's own message names its C
 * function), and CLI_FAIL. */
int cli_require_head(const char *model_path, const vitc_vit *m);
/* Strict numbers: the whole string, no spaces, in range, finite; 0 or -1. */
int cli_parse_long(const char *s, long min, long max, long *out);
int cli_parse_double(const char *s, double min, double max, double *out);

/* Threads as every command takes them. */
#define CLI_MAX_THREADS 256

/* ------------------------------------------------------------------ */
/* Images into a ViT                                                  */
/* ------------------------------------------------------------------ */

/* What a ViT command feeds the model for each image. */
typedef struct cli_input {
    int crop, resize, channels;
    int height, width; /* what the forward reads: crop x crop, or the processor's size */
    const vitc_vit *proc; /* a Hub model whose own image processor is used, or NULL */
    size_t per_image; /* floats per image: channels * height * width */
} cli_input;

/* crop and resize as given (or 0 and not set: the model's defaults), checked
 * against the model: crop >= patch, a channel count images can make (1 or
 * 3). CLI_OK or a reported CLI_FAIL. */
int cli_model_input(const char *model_path, const vitc_vit_config *cfg, int crop, int crop_set,
                    int resize, int resize_set, cli_input *in);
/* A Hub model's own image processor (preprocessor_config.json) instead of
 * torchvision's transform, unless --crop or --resize asked for that; its
 * output size must not depend on the image. CLI_OK or a reported CLI_FAIL. */
int cli_model_processor(const vitc_vit *m, int crop_set, int resize_set, cli_input *in);
/* The model options the image commands share. */
typedef struct cli_model_opts {
    const char *model, *arch, *precision, *attn_precision;
    int crop, crop_set, resize, resize_set;
    int processor; /* a Hub model's own processor when no --crop/--resize */
} cli_model_opts;
/* *m = --model (with --arch) at --precision / --attention-precision, and
 * in from cli_model_input (then cli_model_processor when o->processor);
 * cmd names the command in usage errors. CLI_OK, else reported; *m (or
 * NULL) is the caller's to free either way. */
int cli_open_model(const char *cmd, const cli_model_opts *o, vitc_vit **m, cli_input *in);
/* Decode and preprocess one image into out [channels, height, width]. */
vitc_status cli_load_input(const char *path, const vitc_vit_config *cfg, const cli_input *in,
                           float *out);
/* The next images paths[*next..n) that decode, up to max, into batch
 * [max, in->per_image] and their paths into got[max]; one that does not is
 * reported (after clearing the progress line when clear_line) and counted
 * in *failed. Returns how many were read (0 only when none are left). */
int cli_fill_batch(char *const *paths, int n, int *next, const vitc_vit_config *cfg,
                   const cli_input *in, int max, float *batch, const char **got, int clear_line,
                   int *failed);

typedef int (*cli_cmd_fn)(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_classify(int argc, char **argv);
int cmd_attention_map(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_similar(int argc, char **argv);
int cmd_zero_shot(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_depth(int argc, char **argv);
int cmd_segment(int argc, char **argv);

#endif
