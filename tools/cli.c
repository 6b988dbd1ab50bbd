/*
 * cli.c — what the vitc commands share: error reporting, escaping untrusted
 * text, the one option parser, and turning an image file into what a ViT
 * reads. Kept apart from main (vitc.c) so that a fuzz target can link it.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* ------------------------------------------------------------------ */
/* Escaping and errors                                                */
/* ------------------------------------------------------------------ */

/* The shown form of one byte of untrusted text, NUL-terminated in out. */
static void cli_escape_byte(unsigned char c, char out[5]) {
    if (c == '\n')
        memcpy(out, "\\n", 3);
    else if (c == '\t')
        memcpy(out, "\\t", 3);
    else if (c < 0x20 || c == 0x7f)
        snprintf(out, 5, "\\x%02x", c);
    else {
        out[0] = (char)c;
        out[1] = '\0';
    }
}

void cli_put_escaped(FILE *f, const char *s, size_t max) {
    char e[5];
    for (size_t i = 0; s[i] && i < max; i++) {
        cli_escape_byte((unsigned char)s[i], e);
        fputs(e, f);
    }
}

void cli_escape(char *dst, size_t cap, const char *s) {
    size_t n = 0;
    char e[5];
    if (cap == 0)
        return;
    for (; *s; s++) {
        size_t len;
        cli_escape_byte((unsigned char)*s, e);
        len = strlen(e);
        if (n + len >= cap)
            break;
        memcpy(dst + n, e, len);
        n += len;
    }
    dst[n] = '\0';
}

/* The length of the valid UTF-8 sequence at p (1..4), 0 when it is not one
 * (overlong forms, surrogates and code points past U+10FFFF included, as
 * jansson and Python reject them). */
static int utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!n)
        return 0;
    unsigned lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int k = 2; k < n; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return n;
}

char *cli_utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s);
    char *out = malloc(3 * len + 1), *o = out; /* U+FFFD is 3 bytes for 1 */
    if (!out)
        return NULL;
    while (*p) {
        int n = utf8_len(p);
        if (n) {
            memcpy(o, p, (size_t)n);
            o += n, p += n;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3, p++;
        }
    }
    *o = 0;
    return out;
}

void cli_json_string(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            p++;
        } else if (c < 0x20) {
            static const char esc[] = "btn\0fr";
            if (c >= 8 && c <= 13 && c != 11)
                fprintf(f, "\\%c", esc[c - 8]);
            else
                fprintf(f, "\\u%04x", c);
            p++;
        } else {
            int n = utf8_len(p);
            if (n) {
                fwrite(p, 1, (size_t)n, f);
                p += n;
            } else {
                fputs("\\ufffd", f);
                p++;
            }
        }
    }
    fputc('"', f);
}

void cli_json_number(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f); /* JSON has no NaN or infinity */
}

/* "vitc: error: " and the message on one line: a newline in a path or in a
 * library message naming a file's contents must not start a line of its own. */
static void cli_vmessage(const char *prefix, const char *fmt, va_list ap) {
    char small[1024], *msg = small;
    va_list ap2;
    int n;
    va_copy(ap2, ap);
    n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1)) != NULL)
        vsnprintf(msg, (size_t)n + 1, fmt, ap2);
    else if (n >= (int)sizeof small)
        msg = small; /* out of memory: the cut message still says what failed */
    va_end(ap2);
    fputs(prefix, stderr);
    cli_put_escaped(stderr, n < 0 ? fmt : msg, SIZE_MAX);
    fputc('\n', stderr);
    if (msg != small)
        free(msg);
}

static void cli_verror(const char *fmt, va_list ap) { cli_vmessage("vitc: error: ", fmt, ap); }

void cli_warning(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_vmessage("vitc: warning: ", fmt, ap);
    va_end(ap);
}

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(fmt, ap);
    va_end(ap);
    return CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try 'vitc %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return CLI_USAGE;
}

int cli_lib_error(const char *what) { return cli_error("%s: %s", what, vitc_last_error()); }

void cli_l2_normalize(float *x, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (size_t i = 0; i < n; i++) s += (double)x[r * n + i] * x[r * n + i];
        float inv = (float)(1.0 / fmax(sqrt(s), 1e-12));
        for (size_t i = 0; i < n; i++) x[r * n + i] *= inv;
    }
}

size_t cli_numel(int nd, const int64_t *shape) {
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)shape[i];
    return n;
}

int cli_ranked_cmp(const void *a, const void *b) {
    const cli_ranked *x = a, *y = b;
    int xn = isnan(x->score), yn = isnan(y->score);
    if (xn != yn)
        return xn - yn;
    if (!xn && x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->index - y->index;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_stderr_tty(void) { return isatty(2); }

void cli_fmt_time(double s, char *buf, size_t cap) {
    long t = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void cli_progress_start(cli_progress *p, const char *what, int64_t total, int quiet) {
    memset(p, 0, sizeof *p);
    p->what = what;
    p->total = total;
    p->on = !quiet;
    p->tty = cli_stderr_tty();
    p->t0 = p->last = cli_now();
}

void cli_progress_update(cli_progress *p, int64_t done) {
    if (!p->on)
        return;
    double t = cli_now();
    /* A log file or a pipe gets a line every 10 s at most: a short run
     * leaves nothing there, a long one a heartbeat, not a flood. */
    if (t - p->last < (p->tty ? 0.25 : 10.0) && (!p->tty || done < p->total))
        return;
    double ips = done / (t - p->t0 > 1e-9 ? t - p->t0 : 1e-9);
    char eta[32];
    cli_fmt_time(ips > 0 ? (double)(p->total - done) / ips : 0, eta, sizeof eta);
    fprintf(stderr, "%s%s: %lld/%lld images, %.1f img/s, ETA %s%s", p->tty ? "\r" : "", p->what,
            (long long)done, (long long)p->total, ips, eta, p->tty ? "\033[K" : "\n");
    p->last = t;
    p->shown = p->tty;
}

void cli_progress_clear(cli_progress *p) {
    if (p->shown)
        fputs("\r\033[K", stderr);
    p->shown = 0;
}

int cli_attention_precision(const char *name) {
    if (name && !strcmp(name, "auto")) return CLI_ATTN_AUTO;
    int p = vitc_precision_parse(name);
    return p;
}

int cli_set_precision(const char *cmd, vitc_vit *m, const char *name, const char *attn) {
    if (attn) {
        int a = cli_attention_precision(attn);
        if (a < 0)
            return cli_usage_error(cmd, "--attention-precision must be auto, fp32, bf16 or int8, not \"%s\"",
                                   attn);
        if ((a == CLI_ATTN_AUTO ? vitc_vit_set_attention_precision_auto(m)
                                : vitc_vit_set_attention_precision(m, (vitc_precision)a)) != VITC_OK)
            return cli_lib_error("--attention-precision");
    }
    int p, rc = cli_parse_precision(cmd, name, &p);
    if (rc != CLI_OK || p < 0)
        return rc;
    if (vitc_vit_set_precision(m, (vitc_precision)p) != VITC_OK)
        return cli_lib_error("--precision");
    return CLI_OK;
}

int cli_parse_precision(const char *cmd, const char *name, int *p) {
    *p = -1;
    if (!name)
        return CLI_OK;
    if ((*p = vitc_precision_parse(name)) < 0)
        return cli_usage_error(cmd, "--precision must be fp32, bf16 or int8, not \"%s\"", name);
    return CLI_OK;
}

vitc_status cli_load_vit(const char *path, const char *arch, int precision, vitc_vit **m) {
    return precision < 0 ? vitc_vit_load(path, arch, m)
                         : vitc_vit_load_precision(path, arch, (vitc_precision)precision, m);
}

/* ------------------------------------------------------------------ */
/* Options                                                            */
/* ------------------------------------------------------------------ */

int cli_parse_long(const char *s, long min, long max, long *out) {
    char *end;
    long v;
    /* strtol alone would take "", " 5" and "5x" (as 5, with *end unchecked) */
    if (!s || !(isdigit((unsigned char)s[0]) ||
                ((s[0] == '-' || s[0] == '+') && isdigit((unsigned char)s[1]))))
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double min, double max, double *out) {
    char *end;
    double v;
    if (!s || !*s || isspace((unsigned char)s[0]))
        return -1;
    v = strtod(s, &end);
    if (*end || !isfinite(v) || !(v >= min && v <= max))
        return -1;
    *out = v;
    return 0;
}

/* The option argv[i] names, and its inline "=value" if any. */
static const cli_opt *cli_find(const cli_spec *spec, const char *a, const char **inline_val) {
    *inline_val = NULL;
    for (int k = 0; k < spec->n_opts; k++) {
        const cli_opt *o = &spec->opts[k];
        size_t n = strlen(o->name);
        if (o->alias && !strcmp(a, o->alias))
            return o;
        if (strncmp(a, o->name, n) == 0 && (a[n] == '\0' || a[n] == '=')) {
            if (a[n] == '=')
                *inline_val = a + n + 1;
            return o;
        }
    }
    return NULL;
}

/* Levenshtein distance of a[0..na) and b[0..nb), or more than 2 once it is
 * sure to be (only a typo's distance matters; rows stop early). */
static int cli_edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    enum { MAXLEN = 64 };
    int row[MAXLEN + 1];
    if (na > MAXLEN || nb > MAXLEN || (na > nb ? na - nb : nb - na) > 2)
        return 3;
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0], best;
        row[0] = best = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int d = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < d)
                d = up + 1;
            if (row[j - 1] + 1 < d)
                d = row[j - 1] + 1;
            row[j] = d;
            diag = up;
            if (d < best)
                best = d;
        }
        if (best > 2)
            return 3;
    }
    return row[nb];
}

/* Of n names, the k-th at (const char *const *)(first + k * stride) (an
 * array of strings, or a name field of an array of structs), the closest
 * to a[0..na) within two edits, or NULL. */
static const char *cli_nearest_of(const char *a, size_t na, const void *first, size_t stride,
                                  int n) {
    const char *best = NULL;
    int best_d = 3;
    for (int k = 0; k < n; k++) {
        const char *name = *(const char *const *)((const char *)first + (size_t)k * stride);
        int d = cli_edit_distance(a, na, name, strlen(name));
        if (d < best_d) {
            best_d = d;
            best = name;
        }
    }
    return best;
}

const char *cli_nearest_name(const char *a, const char *const *names, int n) {
    return cli_nearest_of(a, strlen(a), names, sizeof *names, n);
}

/* The spec's option closest to the unknown a, its "=value" ignored. */
static const char *cli_nearest(const cli_spec *spec, const char *a) {
    const char *eq = strchr(a, '=');
    if (spec->n_opts < 1)
        return NULL;
    return cli_nearest_of(a, eq ? (size_t)(eq - a) : strlen(a), &spec->opts[0].name,
                          sizeof spec->opts[0], spec->n_opts);
}

static int cli_set(const cli_opt *o, const char *v, char *err, size_t err_len) {
    char shown[80];
    if (o->kind == CLI_STRING) {
        *(const char **)o->dest = v;
    } else if (o->kind == CLI_INT) {
        long x;
        if (cli_parse_long(v, (long)o->min, (long)o->max, &x) != 0) {
            cli_escape(shown, sizeof shown, v);
            snprintf(err, err_len, "'%s' wants an integer in [%ld, %ld], got '%s'", o->name,
                     (long)o->min, (long)o->max, shown);
            return CLI_PARSE_ERROR;
        }
        *(int *)o->dest = (int)x;
    } else if (o->kind == CLI_FLOAT || o->kind == CLI_DOUBLE) {
        double x;
        if (cli_parse_double(v, o->min, o->max, &x) != 0) {
            cli_escape(shown, sizeof shown, v);
            snprintf(err, err_len, "'%s' wants a number in [%g, %g], got '%s'", o->name, o->min,
                     o->max, shown);
            return CLI_PARSE_ERROR;
        }
        if (o->kind == CLI_FLOAT)
            *(float *)o->dest = (float)x;
        else
            *(double *)o->dest = x;
    }
    if (o->given)
        *o->given = 1;
    return CLI_PARSE_OK;
}

int cli_parse(const cli_spec *spec, int argc, char **argv, char **pos, int *n_pos, char *err,
              size_t err_len) {
    char shown[80];
    int rest = 0;
    *n_pos = 0;
    if (err_len)
        err[0] = '\0';
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        const cli_opt *o;
        if (rest || a[0] != '-' || !a[1] || !strcmp(a, "--")) {
            if (!rest && !strcmp(a, "--")) {
                rest = 1;
                continue;
            }
            if (spec->max_pos >= 0 && *n_pos >= spec->max_pos) {
                cli_escape(shown, sizeof shown, a);
                if (spec->max_pos == 0)
                    snprintf(err, err_len, "unexpected argument '%s'", shown);
                else
                    snprintf(err, err_len, "one %s at a time (got '%s' too)", spec->pos_name,
                             shown);
                return CLI_PARSE_ERROR;
            }
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return CLI_PARSE_HELP;
        cli_escape(shown, sizeof shown, a);
        if (!(o = cli_find(spec, a, &v))) {
            const char *near = cli_nearest(spec, a);
            if (near)
                snprintf(err, err_len, "unknown option '%s' (did you mean %s?)", shown, near);
            else
                snprintf(err, err_len, "unknown option '%s'", shown);
            return CLI_PARSE_ERROR;
        }
        if (o->kind == CLI_FLAG) {
            if (v) {
                snprintf(err, err_len, "option '%s' takes no value", o->name);
                return CLI_PARSE_ERROR;
            }
            *(int *)o->dest = 1;
            if (o->given)
                *o->given = 1;
            continue;
        }
        if (!v) {
            if (i + 1 >= argc) {
                snprintf(err, err_len, "option '%s' needs a value", shown);
                return CLI_PARSE_ERROR;
            }
            v = argv[++i];
        }
        if (cli_set(o, v, err, err_len) != CLI_PARSE_OK)
            return CLI_PARSE_ERROR;
    }
    return CLI_PARSE_OK;
}

int cli_parse_command(const char *cmd, const cli_spec *spec, int argc, char **argv, char **pos,
                      int *n_pos) {
    char err[256];
    int rc = cli_parse(spec, argc, argv, pos, n_pos, err, sizeof err);
    if (rc == CLI_PARSE_ERROR)
        return cli_usage_error(cmd, "%s", err);
    return rc;
}

int cli_require_head(const char *model_path, const vitc_vit *m) {
    if (vitc_vit_has_head(m))
        return CLI_OK;
    return cli_error("%s: this model has no classification head (a backbone): use `vitc embed` "
                     "for its image embeddings", model_path);
}

int cli_out_format(const char *cmd, const char *opt, const char *path, const char *what,
                   const char *const *exts, int n) {
    const char *base = strrchr(path, '/'), *dot;
    char names[128] = "";
    base = base ? base + 1 : path;
    dot = strrchr(base, '.');
    if (!dot || dot == base) /* "out", ".hidden": no extension */
        return 0;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(dot, exts[i]))
            return i;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%s", i == 0 ? "" : i + 1 < n ? ", " : " or ",
                 exts[i]);
    }
    cli_usage_error(cmd, "%s %s: %s writes %s; name the file %s", opt, path, cmd, what, names);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Images into a ViT                                                  */
/* ------------------------------------------------------------------ */

int cli_parse_images(const char *cmd, const char *usage, const cli_spec *spec, int argc,
                     char **argv, const char *const *model, char ***images, int *n_images) {
    int rc;
    *images = calloc((size_t)argc, sizeof **images);
    if (!*images)
        return cli_error("out of memory");
    rc = cli_parse_command(cmd, spec, argc, argv, *images, n_images);
    if (rc == CLI_PARSE_HELP) {
        fputs(usage, stdout);
        return -1;
    }
    if (rc != 0)
        return rc;
    if (!*model)
        return cli_usage_error(cmd, "--model is required");
    if (*n_images == 0)
        return cli_usage_error(cmd, "no images given");
    return 0;
}

int cli_model_input(const char *model_path, const vitc_vit_config *cfg, int crop, int crop_set,
                    int resize, int resize_set, cli_input *in) {
    in->crop = crop_set ? crop : cfg->image_size;
    in->height = in->width = in->crop;
    in->proc = NULL;
    in->resize = resize_set ? resize : (int)((int64_t)in->crop * 256 / 224);
    in->channels = cfg->in_channels;
    if (in->crop < cfg->patch_size)
        return cli_error("--crop %d is smaller than the model's patch size %d", in->crop,
                         cfg->patch_size);
    /* The forward reads in_channels planes per image: images make 1 or 3,
     * any other count would be read past what was filled. */
    if (in->channels != 1 && in->channels != 3)
        return cli_error("%s: the model takes %d input channels; images make 1 (luminance) or "
                         "3 (RGB)", model_path, in->channels);
    if (__builtin_mul_overflow((size_t)in->crop * (size_t)in->crop, (size_t)in->channels,
                               &in->per_image))
        return cli_error("--crop %d is too large", in->crop);
    return CLI_OK;
}

int cli_model_processor(const vitc_vit *m, int crop_set, int resize_set, cli_input *in) {
    int h1, w1, h2, w2;
    if (crop_set || resize_set || !vitc_vit_has_processor(m))
        return CLI_OK;
    if (vitc_vit_preprocess_size(m, 640, 480, &h1, &w1) != VITC_OK ||
        vitc_vit_preprocess_size(m, 480, 1000, &h2, &w2) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    if (h1 != h2 || w1 != w2)
        return cli_error("the model's image processor makes sizes that depend on the image (no "
                         "center crop); give --crop for torchvision's fixed one");
    if (h1 < vitc_vit_get_config(m)->patch_size || w1 < vitc_vit_get_config(m)->patch_size)
        return cli_error("the model's image processor makes %dx%d, smaller than a patch", w1, h1);
    in->proc = m;
    /* The model's channel count, not the processor's RGB: a 1-channel
     * model read 3 planes per image as 3 images' worth (issue 21, H2). */
    in->height = h1, in->width = w1, in->channels = vitc_vit_get_config(m)->in_channels;
    in->per_image = (size_t)in->channels * (size_t)h1 * (size_t)w1; /* both <= 16384 */
    return CLI_OK;
}

int cli_open_model(const char *cmd, const cli_model_opts *o, vitc_vit **m, cli_input *in) {
    int rc, p;
    if ((rc = cli_parse_precision(cmd, o->precision, &p)) != CLI_OK)
        return rc;
    /* Packed while read: the load peaks near the converted model. */
    if (cli_load_vit(o->model, o->arch, p, m) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    if ((rc = cli_set_precision(cmd, *m, NULL, o->attn_precision)) != CLI_OK)
        return rc;
    if ((rc = cli_model_input(o->model, vitc_vit_get_config(*m), o->crop, o->crop_set, o->resize,
                              o->resize_set, in)) != CLI_OK)
        return rc;
    return o->processor ? cli_model_processor(*m, o->crop_set, o->resize_set, in) : CLI_OK;
}

vitc_status cli_load_input(const char *path, const vitc_vit_config *cfg, const cli_input *in,
                           float *out) {
    vitc_image img;
    vitc_status st = vitc_image_load_flags(path, 0, in->proc ? vitc_vit_image_flags(in->proc) : 0,
                                           &img);
    int h, w;
    if (st == VITC_OK && in->proc) {
        st = vitc_vit_preprocess_size(in->proc, img.width, img.height, &h, &w);
        if (st == VITC_OK && in->channels == 1) {
            /* A gray model's processor sees the image as PIL's convert("L")
             * gives it (transformers' processors make as many planes as the
             * image has): luminance in every plane, the first plane kept,
             * normalised with the first mean and std. */
            size_t np = (size_t)img.width * (size_t)img.height;
            float *rgb = malloc((size_t)3 * (size_t)h * (size_t)w * sizeof *rgb);
            for (size_t i = 0; i < np; i++) {
                uint8_t *px = img.rgb + 3 * i;
                uint32_t l = (px[0] * 19595u + px[1] * 38470u + px[2] * 7471u + 0x8000u) >> 16;
                px[0] = px[1] = px[2] = (uint8_t)l;
            }
            st = rgb ? vitc_vit_preprocess(in->proc, &img, rgb) : VITC_ERR_NOMEM;
            if (st == VITC_OK)
                memcpy(out, rgb, (size_t)h * (size_t)w * sizeof *rgb);
            else if (!rgb)
                cli_error("out of memory preprocessing %s", path);
            free(rgb);
        } else if (st == VITC_OK) {
            st = vitc_vit_preprocess(in->proc, &img, out);
        }
        vitc_image_free(&img);
        return st;
    }
    if (st == VITC_OK)
        st = vitc_image_preprocess_channels(&img, in->resize, in->crop, in->channels, cfg->mean,
                                            cfg->std, out);
    vitc_image_free(&img);
    return st;
}

int cli_fill_batch(char *const *paths, int n, int *next, const vitc_vit_config *cfg,
                   const cli_input *in, int max, float *batch, const char **got, int clear_line,
                   int *failed) {
    int nb = 0;
    while (nb < max && *next < n) {
        const char *path = paths[(*next)++];
        if (cli_load_input(path, cfg, in, batch + in->per_image * (size_t)nb) != VITC_OK) {
            if (clear_line) /* the error must not land on the progress line */
                fputs("\r\033[K", stderr);
            cli_error("%s", vitc_last_error());
            (*failed)++;
            continue;
        }
        got[nb++] = path;
    }
    return nb;
}
