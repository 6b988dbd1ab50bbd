/*
 * cmd_classify.c — `vitc classify`: images in, top-k classes out.
 *
 * Images are decoded and preprocessed one by one into a batch buffer and run
 * through the model B at a time, so the weights are streamed once per batch
 * rather than once per image. An image that cannot be read is reported and
 * skipped; the run goes on and exits 1 at the end.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#define CLASSIFY_DEFAULT_BATCH 8
#define CLASSIFY_MAX_BATCH 4096
#define CLASSIFY_MAX_CROP 16384

static const char classify_usage[] =
    "usage: vitc classify --model M.safetensors [options] IMAGE...\n"
    "\n"
    "Classify PNG or JPEG images with a Vision Transformer checkpoint.\n"
    "Preprocessing is torchvision's eval transform: resize the shorter side\n"
    "(antialiased bilinear), center crop, /255, normalize with the model's\n"
    "mean and std.\n"
    "\n"
    "options:\n"
    "  --model FILE     safetensors checkpoint (torchvision, timm or T2T-ViT names)\n"
    "                   or a Hugging Face Hub directory (docs/hub.md)\n"
    "  --arch NAME      architecture when the file has no vitc.config metadata\n"
    "                   (vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14,\n"
    "                   vit_tiny_patch16_224, vit_small_patch16_224,\n"
    "                   vit_base_patch16_224, t2t_vit_7, t2t_vit_10, t2t_vit_12,\n"
    "                   t2t_vit_14, t2t_vit_19, t2t_vit_24, t2t_vit_t_14,\n"
    "                   t2t_vit_t_19, t2t_vit_t_24)\n"
    "  --labels FILE    class names, one per line (default: the file's metadata)\n"
    "  --topk K         classes to print per image, 1.. (default 5)\n"
    "  --crop C         center crop size, 1..16384 (default: the model's image size)\n"
    "  --resize R       shorter side before cropping, 0..16384 (default\n"
    "                   crop*256/224; 0: no resize)\n"
    "  --batch B        images per forward pass, 1..4096 (default 8)\n"
    "  --threads N      threads, 1..256 (default: all CPUs available)\n"
    CLI_PRECISION_HELP
    "  --json           one JSON object per image and line:\n"
    "                   {\"image\": PATH, \"topk\": [{\"index\": I, \"label\": STR|null,\n"
    "                   \"prob\": P, \"logit\": L}, ...]}\n"
    "  --quiet          no progress line on stderr\n"
    "  -h, --help       this help\n"
    "\n"
    "prob is the softmax of the logits over all classes. Exit status: 0 ok,\n"
    "1 when an image or the model could not be used, 2 for a usage error.\n";

typedef struct classify_opts {
    const char *model, *arch, *labels, *precision, *attn_precision;
    int topk, crop, resize, batch, threads, json, quiet;
    int resize_set, crop_set;
    char **images;
    int n_images;
} classify_opts;

static int parse_args(int argc, char **argv, classify_opts *o) {
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o->arch, 0, 0, NULL},
        {"--labels", NULL, CLI_STRING, &o->labels, 0, 0, NULL},
        {"--topk", NULL, CLI_INT, &o->topk, 1, 1000000000, NULL},
        {"--crop", NULL, CLI_INT, &o->crop, 1, CLASSIFY_MAX_CROP, &o->crop_set},
        {"--resize", NULL, CLI_INT, &o->resize, 0, CLASSIFY_MAX_CROP, &o->resize_set},
        {"--batch", NULL, CLI_INT, &o->batch, 1, CLASSIFY_MAX_BATCH, NULL},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o->precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o->attn_precision, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &o->json, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &o->quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), -1, "image"};
    o->topk = 5;
    o->batch = CLASSIFY_DEFAULT_BATCH;
    return cli_parse_images("classify", classify_usage, &spec, argc, argv, &o->model, &o->images,
                            &o->n_images);
}

/* Labels file: one name per line; "\r\n" endings accepted. The size limit
 * bounds what getline can be made to allocate: ImageNet-21k's 21,843 names
 * take under 1 MB. */
#define CLI_MAX_LABELS_BYTES (16 << 20)
int cli_read_labels(const char *path, int n_classes, char ***out) {
    FILE *f;
    char **labels;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0;
    if (vitc_open_read(path, CLI_MAX_LABELS_BYTES, &f, NULL) != VITC_OK)
        return cli_error("%s (the --labels file)", vitc_last_error());
    labels = calloc((size_t)n_classes, sizeof *labels);
    if (!labels) {
        fclose(f);
        return cli_error("out of memory");
    }
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (n >= n_classes) {
            n++;
            continue;
        }
        if (!(labels[n++] = strdup(line))) {
            n = -1;
            break;
        }
    }
    free(line);
    fclose(f);
    if (n != n_classes) {
        for (int i = 0; i < n_classes; i++)
            free(labels[i]);
        free(labels);
        if (n < 0)
            return cli_error("out of memory");
        return cli_error("%s: %d labels for a model of %d classes", path, n, n_classes);
    }
    *out = labels;
    return 0;
}

static void print_result(const classify_opts *o, const char *path, const float *logits,
                         int n_classes, int k, char **file_labels, const vitc_vit *m,
                         cli_ranked *rank) {
    double mx = -INFINITY, sum = 0.0;
    for (int c = 0; c < n_classes; c++)
        if (logits[c] > mx)
            mx = logits[c];
    for (int c = 0; c < n_classes; c++)
        sum += exp((double)logits[c] - mx);
    for (int c = 0; c < n_classes; c++) {
        rank[c].score = logits[c];
        rank[c].index = c;
    }
    qsort(rank, (size_t)n_classes, sizeof *rank, cli_ranked_cmp);
    if (o->json) {
        fputs("{\"image\": ", stdout);
        cli_json_string(stdout, path);
        fputs(", \"topk\": [", stdout);
    } else {
        cli_put_escaped(stdout, path, SIZE_MAX);
        putchar('\n');
    }
    for (int r = 0; r < k; r++) {
        int c = rank[r].index;
        const char *label = file_labels ? file_labels[c] : vitc_vit_label(m, c);
        double prob = exp((double)logits[c] - mx) / sum;
        if (o->json) {
            printf("%s{\"index\": %d, \"label\": ", r ? ", " : "", c);
            if (label)
                cli_json_string(stdout, label);
            else
                fputs("null", stdout);
            fputs(", \"prob\": ", stdout);
            cli_json_number(stdout, prob);
            fputs(", \"logit\": ", stdout);
            cli_json_number(stdout, logits[c]);
            fputc('}', stdout);
        } else {
            /* labels come from a file: no raw terminal control codes */
            printf("  %2d. %6.2f%%  logit %9.4f  class %4d%s", r + 1, 100.0 * prob,
                   (double)logits[c], c, label ? "  " : "");
            if (label)
                cli_put_escaped(stdout, label, SIZE_MAX);
            putchar('\n');
        }
    }
    if (o->json)
        fputs("]}\n", stdout);
}

/* One line of progress on stderr once the run has taken over a second:
 * rewritten in place on a terminal, a plain line every few seconds otherwise. */
typedef struct progress {
    double start, last;
    int tty, shown, quiet;
} progress;

static void progress_update(progress *p, int done, int total) {
    double t = cli_now(), el = t - p->start;
    if (p->quiet || el < 1.0 || done >= total)
        return;
    if (!p->tty && p->shown && t - p->last < 5.0)
        return;
    fprintf(stderr, "%sclassify: %d/%d images, %.1f images/s%s", p->tty ? "\r" : "", done, total,
            done / el, p->tty ? "\033[K" : "\n");
    fflush(stderr);
    p->shown = 1;
    p->last = t;
}

static void progress_end(progress *p, int done, int total) {
    double el = cli_now() - p->start;
    if (p->quiet || !p->shown)
        return;
    fprintf(stderr, "%sclassify: %d/%d images in %.1f s, %.1f images/s\n", p->tty ? "\r" : "",
            done, total, el, done / (el > 0 ? el : 1));
}

/* 1 when each of the n rows of logits holds one value n_classes times. */
static int all_scores_equal(const float *logits, int n, int n_classes) {
    for (int b = 0; b < n; b++)
        for (int c = 1; c < n_classes; c++)
            if (logits[(size_t)b * n_classes + c] != logits[(size_t)b * n_classes])
                return 0;
    return n > 0 && n_classes > 1;
}

int cmd_classify(int argc, char **argv) {
    classify_opts o;
    vitc_vit *m = NULL;
    const vitc_vit_config *cfg = NULL;
    char **labels = NULL;
    float *batch = NULL, *logits = NULL;
    cli_ranked *rank = NULL;
    const char **batch_paths = NULL;
    cli_input in;
    size_t batch_bytes;
    int rc, failed = 0, done = 0, k, warned_flat = 0;
    progress prog;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        free(o.images);
        return rc < 0 ? CLI_OK : rc;
    }
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    memset(&prog, 0, sizeof prog);
    prog.start = cli_now();
    prog.tty = cli_stderr_tty();
    prog.quiet = o.quiet;

    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, o.crop,
                               o.crop_set, o.resize, o.resize_set, 1};
    if ((rc = cli_open_model("classify", &mo, &m, &in)) != CLI_OK)
        goto done;
    cfg = vitc_vit_get_config(m);
    if ((rc = cli_require_head(o.model, m)) != CLI_OK)
        goto done;
    if (o.labels && (rc = cli_read_labels(o.labels, cfg->num_classes, &labels)) != 0)
        goto done;
    k = o.topk < cfg->num_classes ? o.topk : cfg->num_classes;
    if (o.batch > o.n_images)
        o.batch = o.n_images;

    if (!__builtin_mul_overflow(sizeof(float) * in.per_image, (size_t)o.batch, &batch_bytes))
        batch = malloc(batch_bytes);
    logits = malloc(sizeof(float) * (size_t)cfg->num_classes * (size_t)o.batch);
    rank = malloc(sizeof *rank * (size_t)cfg->num_classes);
    batch_paths = malloc(sizeof *batch_paths * (size_t)o.batch);
    if (!batch || !logits || !rank || !batch_paths) {
        rc = cli_error("out of memory for a batch of %d images of %dx%dx%d", o.batch,
                       in.channels, in.height, in.width);
        goto done;
    }

    for (int next = 0; next < o.n_images;) {
        int nb = cli_fill_batch(o.images, o.n_images, &next, cfg, &in, o.batch, batch,
                                batch_paths, prog.tty && prog.shown, &failed);
        if (nb == 0)
            continue;
        /* batch holds nb images of in.per_image = in_channels * crop * crop
         * floats, what the forward reads for [nb, in_channels, crop, crop] */
        if (vitc_vit_forward(m, batch, nb, in.height, in.width, logits) != VITC_OK) {
            rc = cli_error("forward pass: %s", vitc_last_error());
            goto done;
        }
        if (prog.tty && prog.shown)
            fputs("\r\033[K", stderr); /* results must not land on the progress line */
        if (!warned_flat && all_scores_equal(logits, nb, cfg->num_classes)) {
            /* torchvision zero-initialises the head: a random or untrained
             * model otherwise prints 0.10% for every class with no reason */
            cli_warning("every class gets the same score: %s's classification head is all "
                        "zeros (an untrained or --random-init model); use trained weights",
                        o.model);
            warned_flat = 1;
        }
        for (int b = 0; b < nb; b++)
            print_result(&o, batch_paths[b], logits + (size_t)b * cfg->num_classes,
                         cfg->num_classes, k, labels, m, rank);
        fflush(stdout);
        done += nb;
        progress_update(&prog, done + failed, o.n_images);
    }
    progress_end(&prog, done + failed, o.n_images);
    if (fflush(stdout) != 0 || ferror(stdout))
        rc = cli_error("writing the results failed: %s", strerror(errno));
    else
        rc = failed ? CLI_FAIL : CLI_OK;
    if (failed && !o.quiet)
        fprintf(stderr, "vitc: %d of %d images could not be classified\n", failed, o.n_images);

done:
    if (labels && cfg) {
        for (int i = 0; i < cfg->num_classes; i++)
            free(labels[i]);
        free(labels);
    }
    free(batch);
    free(logits);
    free(rank);
    free(batch_paths);
    free(o.images);
    vitc_vit_free(m);
    return rc;
}
