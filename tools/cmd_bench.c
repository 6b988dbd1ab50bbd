/*
 * cmd_bench.c — `vitc bench`: time the standard workloads
 * section 6 through the public API only, and put the numbers next to the
 * machine's own peak in the workload's precision (fp32 FMA, bf16 or int8
 * dot products), measured here rather than taken from a data sheet
 * (bench_peak.c).
 *
 * Per workload: deterministic random weights and inputs, warm-up, then R
 * timed forwards (CLOCK_MONOTONIC); the median is reported. FLOPs count the
 * multiply-adds of the GEMMs and of attention only (2 per multiply-add);
 * norms, softmax, GELU and residuals are left out, as PyTorch's and
 * FlashAttention's accounting does.
 *
 * Memory: the peak resident set (VmHWM) during the workload minus the
 * resident set just before it was set up, so weights, inputs, outputs and
 * every workspace count. VmHWM is reset through /proc/self/clear_refs before
 * each workload; when several workloads share a process, memory freed by one
 * may be reused by the next, so `make bench` runs each in a fresh process.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_peak.h"
#include "bench_train.h"
#include "cli.h"
#include "rng.h"

/* ------------------------------------------------------------------ */
/* Clock, random numbers, memory                                       */
/* ------------------------------------------------------------------ */

/* Uniform in [-a, a); a fixed seed per workload makes every run time the
 * same numbers (timings of exp and of denormals depend on the values). */
static void bench_fill(float *x, size_t n, float a, uint64_t *s) {
    vitc__rng r = {*s};
    for (size_t i = 0; i < n; i++)
        x[i] = a * (2.0f * (float)vitc__rng_uniform(&r) - 1.0f);
    *s = r.s;
}

static float *bench_random(size_t n, float a, uint64_t seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (x)
        bench_fill(x, n, a, &seed);
    return x;
}

/* A field of /proc/self/status in KiB, -1 when unavailable. */
static long bench_status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t n = strlen(field);
    long v = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Reset VmHWM to the current RSS (Linux >= 4.0); 0 on success. */
static int bench_reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    int ok;
    if (!f)
        return -1;
    ok = fputs("5", f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Workloads                                                           */
/* ------------------------------------------------------------------ */

typedef struct bench_ctx {
    vitc_layer *layer;
    vitc_vit *vit;
    float *x, *q, *k, *v, *out;
    int ndim;
    int64_t shape[8];
    int vit_batch, vit_size;
    int vit_embed; /* a Hub embedding model: vitc_vit_embed's default pooling */
    vitc_tensor_view tq, tk, tv;
    void *train; /* the training workloads' state (bench_train.c) */
} bench_ctx;

typedef struct bench_workload {
    const char *name;
    const char *what;  /* the PyTorch it stands for */
    const char *shape; /* input shape, as docs/bench.md writes it */
    /* Sets up ctx (weights, inputs, outputs) and the FLOP count. */
    int (*setup)(const struct bench_workload *w, bench_ctx *c, const char *model, double *flops,
                 char *note, size_t note_cap);
    vitc_status (*run)(bench_ctx *c);
    /* Layer presets. */
    vitc_layer_kind kind;
    int ch, heads;
    int64_t in_shape[4];
    int vit_batch;
} bench_workload;

static void bench_release(bench_ctx *c) {
    vitc_layer_free(c->layer);
    vitc_vit_free(c->vit);
    free(c->x);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->out);
    bench_train_free(c->train);
    memset(c, 0, sizeof *c);
}

static int bench_ends(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Weights as PyTorch's initialisers would roughly give them: uniform in
 * +-1/sqrt(fan_in) for matrices and convolutions, norms near identity,
 * running variance 1, ConvSABlock's gamma non-zero (zero would make the
 * block the identity in value, though not in work). */
static void bench_init_params(vitc_layer *layer, uint64_t seed) {
    int n = vitc_layer_num_params(layer);
    for (int i = 0; i < n; i++) {
        const char *name;
        int nd;
        const int64_t *sh;
        float *d;
        if (vitc_layer_param(layer, i, &name, &nd, &sh, &d) != VITC_OK || !d)
            continue;
        size_t numel = cli_numel(nd, sh);
        if (bench_ends(name, "running_var")) {
            for (size_t j = 0; j < numel; j++)
                d[j] = 1.0f;
        } else if (bench_ends(name, "running_mean") || bench_ends(name, "num_batches_tracked")) {
            memset(d, 0, numel * sizeof *d);
        } else if (!strcmp(name, "gamma")) {
            for (size_t j = 0; j < numel; j++)
                d[j] = 0.5f;
        } else if (strstr(name, "norm") && bench_ends(name, "weight")) {
            bench_fill(d, numel, 0.1f, &seed);
            for (size_t j = 0; j < numel; j++)
                d[j] += 1.0f;
        } else if (nd >= 2) {
            size_t fan_in = numel / (size_t)sh[0];
            bench_fill(d, numel, 1.0f / sqrtf((float)(fan_in ? fan_in : 1)), &seed);
        } else {
            bench_fill(d, numel, 0.05f, &seed);
        }
    }
}

static int bench_setup_layer(const bench_workload *w, bench_ctx *c, const char *model,
                             double *flops, char *note, size_t note_cap) {
    vitc_layer_config cfg = vitc_layer_default_config(w->kind);
    int64_t osh[8];
    int ond;
    size_t nin = 1, nout = 1;
    double B = (double)w->in_shape[0];
    (void)model, (void)note, (void)note_cap;
    cfg.in_channels = w->ch;
    cfg.num_heads = w->heads;
    if (w->kind == VITC_MULTIHEAD_ATTENTION) {
        cfg.embed_dim = w->ch;
        cfg.batch_first = 1;
    }
    if (vitc_layer_create(&cfg, &c->layer) != VITC_OK)
        return cli_lib_error(w->name);
    bench_init_params(c->layer, 0x5EED0000u + (uint64_t)w->kind);
    vitc_layer_set_training(c->layer, 0);
    c->ndim = 3 + (w->in_shape[3] > 0);
    for (int i = 0; i < c->ndim; i++)
        c->shape[i] = w->in_shape[i];
    nin = cli_numel(c->ndim, c->shape);
    if (vitc_layer_output_shape(c->layer, c->ndim, c->shape, &ond, osh) != VITC_OK)
        return cli_lib_error(w->name);
    nout = cli_numel(ond, osh);
    c->x = bench_random(nin, 1.7f, 0xA11CE + (uint64_t)w->kind);
    c->out = calloc(nout, sizeof(float));
    if (!c->x || !c->out)
        return cli_error("%s: out of memory", w->name);

    /* FLOPs of the GEMMs and attention (2 per multiply-add). */
    if (w->kind == VITC_MULTIHEAD_ATTENTION) {
        double L = (double)w->in_shape[1], E = w->ch;
        *flops = B * (2 * L * E * 3 * E + 4 * L * L * E + 2 * L * E * E);
    } else {
        double C = w->ch, N = (double)w->in_shape[2] * (double)w->in_shape[3];
        if (w->kind == VITC_CONV_SA_BLOCK) {
            double c8 = (double)(w->ch / 8); /* q, k: C -> C/8; v: C -> C */
            *flops = B * (2 * N * C * (2 * c8 + C) + 2 * N * N * (c8 + C));
        } else { /* SelfAttention, SelfAttentionMultiHead: qkv C->3C, proj C->C */
            *flops = B * (2 * N * C * 4 * C + 4 * N * N * C);
        }
    }
    return 0;
}

static vitc_status bench_run_layer(bench_ctx *c) {
    return vitc_layer_forward(c->layer, c->x, c->ndim, c->shape, c->out);
}

static int bench_setup_sdpa(const bench_workload *w, bench_ctx *c, const char *model,
                            double *flops, char *note, size_t note_cap) {
    size_t n = cli_numel(4, w->in_shape);
    (void)model, (void)note, (void)note_cap;
    c->q = bench_random(n, 1.0f, 1);
    c->k = bench_random(n, 1.0f, 2);
    c->v = bench_random(n, 1.0f, 3);
    c->out = calloc(n, sizeof(float));
    if (!c->q || !c->k || !c->v || !c->out)
        return cli_error("%s: out of memory", w->name);
    c->tq.data = c->q;
    c->tk.data = c->k;
    c->tv.data = c->v;
    c->tq.ndim = c->tk.ndim = c->tv.ndim = 4;
    for (int i = 0; i < 4; i++)
        c->tq.shape[i] = c->tk.shape[i] = c->tv.shape[i] = w->in_shape[i];
    /* 4·B·H·L·S·d: QK^T and PV, L = S here. */
    *flops = 4.0 * (double)w->in_shape[0] * (double)w->in_shape[1] * (double)w->in_shape[2] *
             (double)w->in_shape[2] * (double)w->in_shape[3];
    return 0;
}

static vitc_status bench_run_sdpa(bench_ctx *c) {
    return vitc_sdpa(&c->tq, &c->tk, &c->tv, NULL, VITC_MASK_NONE, 0.0f, c->out);
}

/* --precision of the vit_* workloads. */
static vitc_precision bench_precision = VITC_PRECISION_FP32;
/* --attention-precision of the vit_* workloads (CLI_ATTN_AUTO: the weights'). */
static int bench_attn_precision = CLI_ATTN_AUTO;

/* Returns -1 (skip, note set) when no checkpoint was given. The vit_*
 * workloads run the classifier at the model's image size; the Hub rows
 * (dinov2_*, clip_*) the default embedding (DINOv2's pooler_output, CLIP's
 * image_embeds) of 224 px images, DINOv2's 518-px position grid resampled
 * as on every Hub call. */
static int bench_setup_vit(const bench_workload *w, bench_ctx *c, const char *model,
                           double *flops, char *note, size_t note_cap) {
    const vitc_vit_config *g;
    double P, N, D, M, B = w->vit_batch;
    size_t n;
    int64_t per = 0;
    int hub = strncmp(w->name, "vit_", 4) != 0;
    if (!model) {
        snprintf(note, note_cap, "skipped: needs a checkpoint (--model %s)",
                 hub ? "a Hub model directory" : "vit_b_16.safetensors");
        return -1;
    }
    /* Packed while read, so built_hwm_kb shows the precision's load peak. */
    if (vitc_vit_load_precision(model, NULL, bench_precision, &c->vit) != VITC_OK)
        return cli_lib_error("--model");
    if (hub) { /* a row's own family: --model names one checkpoint for every row */
        const char *fam = vitc_vit_family(c->vit), *want = w->name[0] == 'd' ? "dinov2" : "clip";
        if (!strstr(fam, want)) {
            snprintf(note, note_cap, "skipped: --model is a %s model, this row needs a %s one",
                     fam, want);
            return -1;
        }
    }
    if (bench_attn_precision != CLI_ATTN_AUTO &&
        vitc_vit_set_attention_precision(c->vit, (vitc_precision)bench_attn_precision) != VITC_OK)
        return cli_lib_error("--attention-precision");
    g = vitc_vit_get_config(c->vit);
    vitc_precision ap = vitc_vit_get_attention_precision(c->vit);
    snprintf(note, note_cap, "%s, %d px, %s%s%s", vitc_vit_arch_name(c->vit), g->image_size,
             vitc_precision_name(bench_precision), ap == VITC_PRECISION_FP32 ? "" : ", ",
             ap == VITC_PRECISION_FP32 ? "" : ap == VITC_PRECISION_BF16 ? "bf16 attention"
                                                                        : "int8 attention");
    c->vit_batch = w->vit_batch;
    c->vit_size = hub ? 224 : g->image_size;
    c->vit_embed = hub;
    if (hub && vitc_vit_embed_size(c->vit, VITC_POOL_DEFAULT, 224, 224, &per) != VITC_OK)
        return cli_lib_error("--model");
    if (!hub)
        per = g->num_classes;
    n = (size_t)w->vit_batch * (size_t)g->in_channels * (size_t)c->vit_size * (size_t)c->vit_size;
    c->x = bench_random(n, 2.0f, 0x1A4E);
    c->out = calloc((size_t)w->vit_batch * (size_t)per, sizeof(float));
    if (!c->x || !c->out)
        return cli_error("%s: out of memory", w->name);
    /* Patch embedding, per layer qkv + attention + out-proj + MLP, head
     * (a Hub backbone's num_classes is 0, CLIP's the projection's width). */
    P = (double)(c->vit_size / g->patch_size) * (double)(c->vit_size / g->patch_size);
    N = P + vitc_vit_num_prefix_tokens(c->vit);
    D = g->hidden_dim;
    M = g->mlp_dim;
    *flops = B * (2 * P * D * g->in_channels * g->patch_size * g->patch_size +
                  g->depth * (2 * N * D * 3 * D + 4 * N * N * D + 2 * N * D * D + 4 * N * D * M) +
                  2 * D * g->num_classes);
    return 0;
}

static vitc_status bench_run_vit(bench_ctx *c) {
    if (c->vit_embed)
        return vitc_vit_embed(c->vit, c->x, c->vit_batch, c->vit_size, c->vit_size,
                              VITC_POOL_DEFAULT, c->out);
    return vitc_vit_forward(c->vit, c->x, c->vit_batch, c->vit_size, c->vit_size, c->out);
}

/* --quick: the training workloads at tiny sizes (tests the driver). */
static int bench_quick;

static int bench_setup_train(const bench_workload *w, bench_ctx *c, const char *model,
                             double *flops, char *note, size_t note_cap) {
    return bench_train_setup(w->name, model, bench_quick, &c->train, flops, note, note_cap);
}

static vitc_status bench_run_train(bench_ctx *c) { return bench_train_run(c->train); }

static const bench_workload bench_workloads[] = {
    {"sdpa", "softmax(Q K^T / sqrt(d)) V", "q,k,v [1,8,4096,64]", bench_setup_sdpa,
     bench_run_sdpa, 0, 0, 0, {1, 8, 4096, 64}, 0},
    {"mha", "nn.MultiheadAttention(768, 12, batch_first=True), need_weights=False",
     "(1,197,768)", bench_setup_layer, bench_run_layer, VITC_MULTIHEAD_ATTENTION, 768, 12,
     {1, 197, 768, 0}, 0},
    {"convsa", "ConvSABlock(64)", "[8,64,32,32]", bench_setup_layer, bench_run_layer,
     VITC_CONV_SA_BLOCK, 64, 1, {8, 64, 32, 32}, 0},
    {"sa_multihead", "SelfAttentionMultiHead(32, 4), eval", "[64,32,16,16]", bench_setup_layer,
     bench_run_layer, VITC_SELF_ATTENTION_MULTIHEAD, 32, 4, {64, 32, 16, 16}, 0},
    {"sa_group", "SelfAttention(512, norm=\"group\")", "[1,512,64,64]", bench_setup_layer,
     bench_run_layer, VITC_SELF_ATTENTION_GROUP, 512, 1, {1, 512, 64, 64}, 0},
    {"vit_b16_b1", "ViT-B/16 forward, batch 1", "[1,3,224,224]", bench_setup_vit, bench_run_vit,
     0, 0, 0, {0, 0, 0, 0}, 1},
    {"vit_b16_b8", "ViT-B/16 forward, batch 8", "[8,3,224,224]", bench_setup_vit, bench_run_vit,
     0, 0, 0, {0, 0, 0, 0}, 8},
    {"dinov2_b14_b1", "DINOv2-B/14 (Dinov2Model) pooler_output, batch 1", "[1,3,224,224]",
     bench_setup_vit, bench_run_vit, 0, 0, 0, {0, 0, 0, 0}, 1},
    {"dinov2_b14_b8", "DINOv2-B/14 (Dinov2Model) pooler_output, batch 8", "[8,3,224,224]",
     bench_setup_vit, bench_run_vit, 0, 0, 0, {0, 0, 0, 0}, 8},
    {"clip_b16_b1", "CLIP ViT-B/16 image tower (CLIPVisionModelWithProjection) image_embeds, "
     "batch 1", "[1,3,224,224]", bench_setup_vit, bench_run_vit, 0, 0, 0, {0, 0, 0, 0}, 1},
    {"clip_b16_b8", "CLIP ViT-B/16 image tower (CLIPVisionModelWithProjection) image_embeds, "
     "batch 8", "[8,3,224,224]", bench_setup_vit, bench_run_vit, 0, 0, 0, {0, 0, 0, 0}, 8},
    {"train_fmnist", "Fashion-MNIST ViT training step (forward, cross-entropy, backward, AdamW)",
     "[128,1,28,28]", bench_setup_train, bench_run_train, 0, 0, 0, {0, 0, 0, 0}, 128},
    {"train_vit_b16_b8", "ViT-B/16 training step (forward, cross-entropy, backward, AdamW)",
     "[8,3,224,224]", bench_setup_train, bench_run_train, 0, 0, 0, {0, 0, 0, 0}, 8},
    {"finetune_dinov2_s14_b8", "DINOv2-S/14 with a new 10-class head "
     "(Dinov2ForImageClassification), training step", "[8,3,224,224]", bench_setup_train,
     bench_run_train, 0, 0, 0, {0, 0, 0, 0}, 8},
    {"finetune_clip_b16_b8", "CLIP ViT-B/16 tower with a new 10-class Linear on image_embeds, "
     "training step", "[8,3,224,224]", bench_setup_train, bench_run_train, 0, 0, 0,
     {0, 0, 0, 0}, 8},
    {"sdpa_bwd", "attention backward: dQ, dK, dV of softmax(Q K^T / sqrt(d)) V",
     "q,k,v [1,8,4096,64]", bench_setup_train, bench_run_train, 0, 0, 0, {1, 8, 4096, 64}, 0},
};
#define BENCH_NW ((int)(sizeof bench_workloads / sizeof bench_workloads[0]))

/* ------------------------------------------------------------------ */
/* Timing loop                                                         */
/* ------------------------------------------------------------------ */

typedef struct bench_result {
    int status; /* 0 ran, -1 skipped, >0 failed (CLI exit code) */
    char note[160];
    double flops;
    int reps;
    double *ms; /* reps timings, sorted */
    double median_ms, min_ms;
    /* KiB: RSS before the workload was built; peak and RSS once built;
     * peak during warm-up and timed forwards; getrusage's max RSS. */
    long base_rss_kb, built_hwm_kb, built_rss_kb, run_hwm_kb, maxrss_kb;
    int hwm_reset; /* VmHWM could be reset, so the peaks are the workload's */
} bench_result;

static int bench_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long bench_max(long a, long b) { return a > b ? a : b; }

/* One updating line on a terminal, plain lines otherwise (docs/cli.md). */
__attribute__((format(printf, 1, 2))) static void bench_progress(const char *fmt, ...) {
    va_list ap;
    int tty = cli_stderr_tty();
    va_start(ap, fmt);
    fputs(tty ? "\r\033[Kvitc bench: " : "vitc bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(tty ? "" : "\n", stderr);
    fflush(stderr);
    va_end(ap);
}

static void bench_progress_end(void) {
    if (cli_stderr_tty())
        fputs("\r\033[K", stderr);
}

static void bench_one(const bench_workload *w, const char *model, int repeat, int quiet,
                      bench_result *r) {
    bench_ctx c;
    double t0, warm = 0, total = 0;
    int max_reps = repeat > 0 ? repeat : 1000;
    memset(&c, 0, sizeof c);
    memset(r, 0, sizeof *r);
    r->hwm_reset = bench_reset_hwm() == 0;
    r->base_rss_kb = bench_status_kb("VmRSS");
    if (!quiet)
        bench_progress("%s ...", w->name);
    r->status = w->setup(w, &c, model, &r->flops, r->note, sizeof r->note);
    if (r->status) {
        bench_release(&c);
        return;
    }
    r->built_hwm_kb = bench_status_kb("VmHWM");
    r->built_rss_kb = bench_status_kb("VmRSS");
    if (r->hwm_reset)
        bench_reset_hwm();
    /* Warm-up: at least one forward (it sizes the workspaces), and more
     * until 0.3 s are spent so that caches, pages and the thread pool of
     * the short workloads are settled too. */
    for (int i = 0; i < 50 && (i < 1 || warm < 0.3); i++) {
        t0 = cli_now();
        if (w->run(&c) != VITC_OK) {
            r->status = cli_lib_error(w->name);
            bench_release(&c);
            return;
        }
        warm += cli_now() - t0;
    }
    r->ms = malloc((size_t)max_reps * sizeof *r->ms);
    if (!r->ms) {
        r->status = cli_error("out of memory");
        bench_release(&c);
        return;
    }
    /* Default (no --repeat): 10 timings, or fewer (at least 3) once 5 s are
     * spent, so that the slow workloads stay bearable. */
    for (r->reps = 0; r->reps < max_reps; r->reps++) {
        if (repeat <= 0 && r->reps >= 3 && (r->reps >= 10 || total > 5.0))
            break;
        t0 = cli_now();
        if (w->run(&c) != VITC_OK) {
            r->status = cli_lib_error(w->name);
            break;
        }
        r->ms[r->reps] = 1e3 * (cli_now() - t0);
        total += r->ms[r->reps] * 1e-3;
    }
    r->run_hwm_kb = bench_status_kb("VmHWM");
    {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0)
            r->maxrss_kb = ru.ru_maxrss;
    }
    bench_release(&c);
    if (r->status || r->reps == 0)
        return;
    qsort(r->ms, (size_t)r->reps, sizeof *r->ms, bench_cmp);
    r->min_ms = r->ms[0];
    r->median_ms = r->reps % 2 ? r->ms[r->reps / 2]
                               : 0.5 * (r->ms[r->reps / 2 - 1] + r->ms[r->reps / 2]);
}

/* ------------------------------------------------------------------ */
/* Command                                                             */
/* ------------------------------------------------------------------ */

static void bench_help(FILE *f) {
    fprintf(f,
            "usage: vitc bench [--threads N] [--repeat R] [--only NAME[,NAME...]]\n"
            "                  [--model vit_b_16.safetensors] [--json] [--no-peak]\n"
            "                  [--peak-only] [--quiet] [--quick]\n\n"
            "Time the standard workloads (docs/bench.md) with random weights:\n"
            "warm-up, then the median of R forwards; GFLOP/s and the fraction of the\n"
            "peak measured here in the row's precision (fp32 FMA; bf16 or int8 dot\n"
            "products for --precision; per core, times the threads in use); peak memory.\n\n"
            "  --threads N   threads of the library, 1..256 (default: the CPUs this process may use)\n"
            "  --repeat R    timed forwards per workload, 1..100000 (default: 10, fewer past 5 s, >= 3)\n"
            "  --only LIST   comma-separated workload names (default: all)\n"
            "  --model FILE  a ViT-B/16 checkpoint for the vit_* workloads, a DINOv2 or CLIP\n"
            "                Hub directory for the dinov2_* / clip_* / finetune_* rows\n"
            "                (skipped without)\n"
            "  --precision P fp32, bf16 or int8 weight GEMMs in the vit_* workloads (default fp32)\n"
            "  --attention-precision A\n"
            "                auto, fp32, bf16 or int8 q k^T and P v in the vit_* workloads\n"
            "                (default auto: the --precision's, bf16 or int8, where faster,\n"
            "                else fp32)\n"
            "  --json        one JSON object on stdout instead of the table\n"
            "  --no-peak     do not measure the peaks (fractions are then absent)\n"
            "  --peak-only   measure the fp32, bf16 and int8 peaks (those this CPU has; AMX\n"
            "                tiles where present) and run no workload\n"
            "  --quiet       no progress lines on stderr\n"
            "  --quick       the training workloads at tiny sizes, the finetune_* rows at\n"
            "                batch 2 and two patches a side (tests the driver only)\n"
            "\nworkloads:\n");
    for (int i = 0; i < BENCH_NW; i++)
        fprintf(f, "  %-13s %s on %s\n", bench_workloads[i].name, bench_workloads[i].what,
                bench_workloads[i].shape);
}

static int bench_selected(const char *only, const char *name) {
    size_t n = strlen(name);
    const char *p = only;
    if (!only)
        return 1;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* The precision a row's "% of peak" is over: --precision for the rows that
 * take it (the vit_*, dinov2_* and clip_* forwards), fp32 for the others. */
static bench_peak_prec bench_row_prec(const bench_workload *w) {
    if (w->setup != bench_setup_vit)
        return BENCH_PEAK_FP32;
    return bench_precision == VITC_PRECISION_BF16   ? BENCH_PEAK_BF16
           : bench_precision == VITC_PRECISION_INT8 ? BENCH_PEAK_INT8
                                                    : BENCH_PEAK_FP32;
}

static int bench_peak_quiet;
static void bench_peak_progress(const char *what) {
    if (!bench_peak_quiet)
        bench_progress("measuring %s ...", what);
}

static void bench_peak_json(const bench_peak *pk, bench_peak_prec p, int threads) {
    printf("\"%s\": {\"isa\": ", bench_peak_name(p));
    if (pk->isa)
        printf("\"%s\", \"unit\": \"%s\", \"one_thread\": %.2f, \"all_threads\": %.2f, "
               "\"threads\": %d",
               pk->isa, bench_peak_unit(p), pk->one, pk->all, threads);
    else
        printf("null");
    if (pk->vec_isa)
        printf(", \"vector\": {\"isa\": \"%s\", \"one_thread\": %.2f, \"all_threads\": %.2f}",
               pk->vec_isa, pk->vec_one, pk->vec_all);
    if (pk->why) {
        printf(", \"why\": ");
        cli_json_string(stdout, pk->why);
    }
    printf("}");
}

static void bench_peak_text(const bench_peak *pk, bench_peak_prec p, int threads) {
    if (p == BENCH_PEAK_FP32) /* the line's wording predates the others: scripts read it */
        printf("FMA peak (%s, measured): %.1f GFLOP/s on 1 core", pk->isa, pk->one);
    else
        printf("%s peak (%s, measured): %.1f %s on 1 core", bench_peak_name(p), pk->isa, pk->one,
               bench_peak_unit(p));
    if (threads > 1)
        printf(", %.1f on %d threads at once", pk->all, threads);
    if (pk->vec_isa) {
        printf(" (%s: %.1f on 1 core", pk->vec_isa, pk->vec_one);
        if (threads > 1)
            printf(", %.1f on %d threads", pk->vec_all, threads);
        putchar(')');
    }
    putchar('\n');
}

int cmd_bench(int argc, char **argv) {
    int threads = 0, repeat = 0, json = 0, no_peak = 0, peak_only = 0, quiet = 0;
    const char *only = NULL, *model = NULL, *precision = NULL, *attn_precision = NULL;
    bench_peak peaks[BENCH_PEAK_N];
    bench_result res[BENCH_NW];
    int ran = 0, rc = CLI_OK;

    const cli_opt opts[] = {
        {"--threads", NULL, CLI_INT, &threads, 1, CLI_MAX_THREADS, NULL},
        {"--repeat", NULL, CLI_INT, &repeat, 1, 100000, NULL},
        {"--only", NULL, CLI_STRING, &only, 0, 0, NULL},
        {"--model", NULL, CLI_STRING, &model, 0, 0, NULL},
        {"--precision", NULL, CLI_STRING, &precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &attn_precision, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {"--no-peak", NULL, CLI_FLAG, &no_peak, 0, 0, NULL},
        {"--peak-only", NULL, CLI_FLAG, &peak_only, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &quiet, 0, 0, NULL},
        {"--quick", NULL, CLI_FLAG, &bench_quick, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 0, "argument"};
    int n_pos;
    rc = cli_parse_command("bench", &spec, argc, argv, NULL, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        bench_help(stdout);
        return CLI_OK;
    }
    if (rc != 0)
        return rc;
    if (precision) {
        int pr = vitc_precision_parse(precision);
        if (pr < 0)
            return cli_usage_error("bench", "--precision must be fp32, bf16 or int8, not \"%s\"",
                                   precision);
        bench_precision = (vitc_precision)pr;
    }
    if (attn_precision) {
        int pr = cli_attention_precision(attn_precision);
        if (pr < 0)
            return cli_usage_error("bench", "--attention-precision must be auto, fp32, bf16 or int8, not \"%s\"",
                                   attn_precision);
        bench_attn_precision = pr;
    }
    if (only) { /* every name must be known: a typo silently benchmarking nothing helps nobody */
        const char *p = only;
        while (*p) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            int found = 0;
            for (int i = 0; i < BENCH_NW; i++)
                found |= strlen(bench_workloads[i].name) == len &&
                         !strncmp(p, bench_workloads[i].name, len);
            if (!found)
                return cli_usage_error("bench", "--only: unknown workload '%.*s'", (int)len, p);
            if (!e)
                break;
            p = e + 1;
        }
    }

    if (threads > 0)
        vitc_set_num_threads(threads);
    threads = vitc_get_num_threads();

    /* --peak-only: every precision's; a run: fp32's and --precision's. */
    memset(peaks, 0, sizeof peaks);
    bench_peak_quiet = quiet;
    for (int p = 0; p < BENCH_PEAK_N && (!no_peak || peak_only); p++) {
        int want = peak_only || p == BENCH_PEAK_FP32;
        for (int i = 0; i < BENCH_NW && !want; i++)
            want = bench_selected(only, bench_workloads[i].name) &&
                   bench_row_prec(&bench_workloads[i]) == (bench_peak_prec)p;
        if (want)
            bench_peak_measure((bench_peak_prec)p, threads, bench_peak_progress, &peaks[p]);
    }

    for (int i = 0; i < BENCH_NW; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].status = -2; /* not selected */
        if (peak_only || !bench_selected(only, bench_workloads[i].name))
            continue;
        bench_one(&bench_workloads[i], model, repeat, quiet, &res[i]);
        if (res[i].status > 0)
            rc = res[i].status;
        ran++;
    }

    if (!quiet)
        bench_progress_end();
    if (json) {
        printf("{\"vitc_version\": \"%s\", \"arch\": \"%s\", \"gemm\": \"%s\", \"threads\": %d,\n",
               vitc_version(), vitc_get_arch(), vitc_get_gemm_backend(), threads);
        printf(" \"fma_peak\": {\"isa\": \"%s\", \"gflops_1_thread\": %.2f, "
               "\"gflops_all_threads\": %.2f},\n \"peaks\": {",
               peaks[0].isa ? peaks[0].isa : "none", peaks[0].one, peaks[0].all);
        for (int p = 0, first = 1; p < BENCH_PEAK_N; p++) {
            if (!peaks[p].isa && !peaks[p].why)
                continue; /* not measured in this run */
            printf("%s", first ? "" : ", ");
            bench_peak_json(&peaks[p], (bench_peak_prec)p, threads);
            first = 0;
        }
        printf("},\n \"workloads\": [");
        int first = 1;
        for (int i = 0; i < BENCH_NW; i++) {
            const bench_workload *w = &bench_workloads[i];
            const bench_result *r = &res[i];
            if (r->status == -2)
                continue;
            printf("%s\n  {\"name\": \"%s\", \"what\": ", first ? "" : ",", w->name);
            cli_json_string(stdout, w->what);
            printf(", \"shape\": \"%s\", \"status\": \"%s\", \"note\": ", w->shape,
                   r->status == 0 ? "ok" : r->status < 0 ? "skipped" : "failed");
            cli_json_string(stdout, r->note);
            if (r->status == 0) {
                double gf = r->flops / (r->median_ms * 1e-3) * 1e-9;
                printf(", \"flops\": %.0f, \"repeats\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f,"
                       " \"gflops\": %.3f",
                       r->flops, r->reps, r->median_ms, r->min_ms, gf);
                const bench_peak *pk = &peaks[bench_row_prec(w)];
                printf(", \"peak_precision\": \"%s\"", bench_peak_name(bench_row_prec(w)));
                if (pk->one > 0)
                    printf(", \"peak_fraction\": %.4f", gf / (pk->one * threads));
                printf(", \"times_ms\": [");
                for (int j = 0; j < r->reps; j++)
                    printf("%s%.4f", j ? ", " : "", r->ms[j]);
                printf("], \"base_rss_kb\": %ld, \"built_hwm_kb\": %ld, \"built_rss_kb\": %ld,"
                       " \"run_hwm_kb\": %ld, \"peak_extra_kb\": %ld, \"hwm_reset\": %s,"
                       " \"maxrss_kb\": %ld",
                       r->base_rss_kb, r->built_hwm_kb, r->built_rss_kb, r->run_hwm_kb,
                       bench_max(r->built_hwm_kb, r->run_hwm_kb) - r->base_rss_kb,
                       r->hwm_reset ? "true" : "false", r->maxrss_kb);
            }
            printf("}");
            first = 0;
        }
        printf("%s]}\n", first ? "" : "\n ");
    } else {
        char cpu[1024];
        printf("vitc %s: kernels %s, gemm %s, %d thread%s\n", vitc_version(), vitc_get_arch(),
               vitc_get_gemm_backend(), threads, threads == 1 ? "" : "s");
        vitc_cpu_info(cpu, sizeof cpu, VITC_CPU_INFO_TEXT);
        fputs(cpu, stdout);
        for (int p = 0; p < BENCH_PEAK_N; p++) {
            if (peaks[p].isa)
                bench_peak_text(&peaks[p], (bench_peak_prec)p, threads);
            else if (peaks[p].why)
                printf("%s peak: none (%s)\n", bench_peak_name((bench_peak_prec)p), peaks[p].why);
        }
        if (ran) {
            printf("\n%-13s %-20s %9s %10s %9s %7s %9s\n", "workload", "shape", "GFLOP",
                   "median ms", "GFLOP/s", "%peak", "peak MB");
            for (int i = 0; i < BENCH_NW; i++) {
                const bench_workload *w = &bench_workloads[i];
                const bench_result *r = &res[i];
                if (r->status == -2)
                    continue;
                if (r->status != 0) {
                    printf("%-13s %-20s %s\n", w->name, w->shape,
                           r->status < 0 ? r->note : "failed (see the error above)");
                    continue;
                }
                double gf = r->flops / (r->median_ms * 1e-3) * 1e-9;
                char pk[16] = "-";
                double p1 = peaks[bench_row_prec(w)].one;
                if (p1 > 0)
                    snprintf(pk, sizeof pk, "%.0f%%", 100 * gf / (p1 * threads));
                printf("%-13s %-20s %9.3f %10.3f %9.1f %7s %9.1f\n", w->name, w->shape,
                       r->flops * 1e-9, r->median_ms, gf, pk,
                       (double)(bench_max(r->built_hwm_kb, r->run_hwm_kb) - r->base_rss_kb) /
                           1024.0);
            }
            printf("\nGFLOP counts GEMM and attention multiply-adds (x2); %%peak = GFLOP/s over\n"
                   "(1-core peak x %d threads), the peak of the row's precision (%s for the\n"
                   "ViT, DINOv2 and CLIP rows, fp32 for the others); peak MB = peak RSS while\n"
                   "the workload was built and run minus RSS before it was built.\n",
                   threads, vitc_precision_name(bench_precision));
        }
    }
    for (int i = 0; i < BENCH_NW; i++)
        free(res[i].ms);
    return rc;
}
