/*
 * bench_train.c — the training workloads of `vitc bench`, through the public
 * API only: what a C user writes to train a ViT (create with random init,
 * training mode, forward, vitc_cross_entropy, vitc_vit_backward, AdamW) and
 * the attention backward on its own; and fine-tuning a loaded Hub model
 * (vitc_vit_reset_head, then the same step). Sizes match bench/bench.py's
 * PyTorch side (and its --quick sizes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench_train.h"
#include "cli.h"
#include "rng.h"

typedef struct bench_train {
    /* ViT step */
    vitc_vit *vit;
    vitc_optimizer *opt;
    float *x;       /* [B, C, H, H] */
    int64_t *y;     /* [B] */
    float *logits;  /* [B, classes] */
    float *dlogits; /* [B, classes] */
    int B, H, classes;
    int hub; /* a loaded Hub model with a new head: its primary output is the logits */
    /* attention backward: q, k, v, dout, dq, dk, dv, o [1, 8, L, 64]; lse [1, 8, L] */
    float *q, *k, *v, *dout, *dq, *dk, *dv, *o, *lse;
    vitc_tensor_view tq, tk, tv;
    int64_t L;
} bench_train;

static float *bench_train_random(size_t n, float a, uint64_t seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    vitc__rng r = {seed};
    for (size_t i = 0; x && i < n; i++)
        x[i] = a * (float)(2.0 * vitc__rng_uniform(&r) - 1.0);
    return x;
}

/* Forward FLOPs of a ViT (GEMMs and attention, 2 per multiply-add), as
 * cmd_bench.c and bench.py count them. */
static double vit_forward_flops(const vitc_vit_config *g, int B) {
    double P = (double)(g->image_size / g->patch_size) * (double)(g->image_size / g->patch_size);
    double N = P + 1, D = g->hidden_dim, M = g->mlp_dim;
    return B * (2 * P * D * g->in_channels * g->patch_size * g->patch_size +
                g->depth * (2 * N * D * 3 * D + 4 * N * N * D + 2 * N * D * D + 4 * N * D * M) +
                2 * D * g->num_classes);
}

/* Inputs, labels and logit buffers of a training step of B images. */
static int alloc_step_buffers(bench_train *t, const char *name, int channels) {
    size_t nx = (size_t)t->B * (size_t)channels * (size_t)t->H * (size_t)t->H;
    t->x = bench_train_random(nx, 2.0f, 0x7A11);
    t->y = malloc((size_t)t->B * sizeof *t->y);
    t->logits = malloc((size_t)t->B * (size_t)t->classes * sizeof(float));
    t->dlogits = malloc((size_t)t->B * (size_t)t->classes * sizeof(float));
    if (!t->x || !t->y || !t->logits || !t->dlogits)
        return cli_error("%s: out of memory", name);
    vitc__rng r = {0x1AB};
    for (int b = 0; b < t->B; b++)
        t->y[b] = (int64_t)(vitc__rng_next(&r) % (uint64_t)t->classes);
    return 0;
}

static int setup_vit_step(bench_train *t, const char *name, int quick, double *flops, char *note,
                          size_t note_cap) {
    vitc_vit_config g = vitc_vit_default_config();
    int B;
    if (!strcmp(name, "train_fmnist")) {
        /* issue 8's Fashion-MNIST model */
        g.image_size = 28, g.patch_size = 4, g.in_channels = 1, g.hidden_dim = 96;
        g.depth = quick ? 1 : 6, g.num_heads = 4, g.mlp_dim = 192, g.num_classes = 10;
        g.mean[0] = g.mean[1] = g.mean[2] = 0.5f;
        g.std[0] = g.std[1] = g.std[2] = 0.5f;
        B = quick ? 4 : 128;
    } else { /* train_vit_b16_b8: torchvision vit_b_16 */
        if (quick)
            g.image_size = 32, g.depth = 2;
        B = quick ? 2 : 8;
    }
    if (vitc_vit_create(&g, 0, &t->vit) != VITC_OK)
        return cli_lib_error(name);
    vitc_vit_set_training(t->vit, 1);
    vitc_optim_config oc = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    oc.weight_decay = 0.05;
    if (vitc_optimizer_create_vit(t->vit, &oc, &t->opt) != VITC_OK)
        return cli_lib_error(name);
    t->B = B, t->H = g.image_size, t->classes = g.num_classes;
    int rc = alloc_step_buffers(t, name, g.in_channels);
    if (rc)
        return rc;
    /* backward = 2 x forward (dX and dW GEMMs); AdamW's element-wise work
     * is not counted. */
    *flops = 3.0 * vit_forward_flops(&g, B);
    snprintf(note, note_cap, "batch %d, %d px, depth %d, AdamW", B, g.image_size, g.depth);
    return 0;
}

/* finetune_dinov2_s14_b8 / finetune_clip_b16_b8: the Hub directory --model
 * names (the row's own family, as the inference rows check), a new
 * 10-class head in the family's classifier layout, then the training step
 * at 224 px (its position table resampled, as on every Hub call).
 * -1 (skipped, note set) without a directory of the row's family, or while
 * the library has no forward for that head yet. */
static int setup_finetune(bench_train *t, const char *name, const char *model, int quick,
                          double *flops, char *note, size_t note_cap) {
    int dino = strstr(name, "dinov2") != NULL;
    const char *want = dino ? "dinov2" : "clip";
    int64_t E = 0, probe_out = 0;
    if (!model) {
        snprintf(note, note_cap, "skipped: needs a %s Hub model directory (--model DIR)", want);
        return -1;
    }
    if (vitc_vit_load(model, NULL, &t->vit) != VITC_OK)
        return cli_lib_error("--model");
    const char *fam = vitc_vit_family(t->vit);
    if (!strstr(fam, want)) {
        snprintf(note, note_cap, "skipped: --model is a %s model, this row needs a %s one", fam,
                 want);
        return -1;
    }
    const vitc_vit_config *g = vitc_vit_get_config(t->vit);
    /* the width the new head reads: DINOv2's [CLS, mean of patches] (2 D),
     * CLIP's image_embeds (the projection's width) */
    if (!dino && vitc_vit_embed_size(t->vit, VITC_POOL_DEFAULT, 224, 224, &E) != VITC_OK)
        return cli_lib_error("--model");
    t->classes = 10;
    if (vitc_vit_reset_head(t->vit, t->classes, NULL, 0x4EAD) != VITC_OK)
        return cli_lib_error(name);
    /* One eval-mode image of a single patch: a head the library cannot run
     * yet is a skipped row naming the library's reason, not a failure. */
    {
        int p = g->patch_size;
        float *img = calloc((size_t)g->in_channels * (size_t)p * (size_t)p, sizeof *img);
        float *out = NULL;
        vitc_status s = vitc_vit_output_size(t->vit, p, p, &probe_out);
        if (s == VITC_OK && img && (out = malloc((size_t)probe_out * sizeof *out)))
            s = vitc_vit_run(t->vit, img, 1, p, p, out);
        free(img);
        free(out);
        if (s == VITC_ERR_UNSUPPORTED) {
            snprintf(note, note_cap, "skipped: %s", vitc_last_error());
            return -1;
        }
        if (s != VITC_OK)
            return cli_lib_error(name);
    }
    vitc_vit_set_training(t->vit, 1);
    vitc_optim_config oc = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    oc.weight_decay = 0.05;
    if (vitc_optimizer_create_vit(t->vit, &oc, &t->opt) != VITC_OK)
        return cli_lib_error(name);
    t->hub = 1;
    t->B = quick ? 2 : 8;
    t->H = quick ? 2 * g->patch_size : 224;
    /* the step's loss reads the primary output as the new head's logits */
    if (vitc_vit_output_size(t->vit, t->H, t->H, &probe_out) != VITC_OK)
        return cli_lib_error(name);
    if (probe_out != t->classes)
        return cli_error("%s: the model's output after vitc_vit_reset_head is %lld floats per "
                         "image, not the %d logits of its new head", name, (long long)probe_out,
                         t->classes);
    int rc = alloc_step_buffers(t, name, g->in_channels);
    if (rc)
        return rc;
    double P = (double)(t->H / g->patch_size) * (double)(t->H / g->patch_size);
    double N = P + vitc_vit_num_prefix_tokens(t->vit), D = g->hidden_dim, M = g->mlp_dim;
    double head = dino ? 2 * (2 * D) * t->classes : 2 * D * (double)E + 2 * (double)E * t->classes;
    /* 3 x forward, as the other training rows count it */
    *flops = 3.0 * t->B *
             (2 * P * D * g->in_channels * g->patch_size * g->patch_size +
              g->depth * (2 * N * D * 3 * D + 4 * N * N * D + 2 * N * D * D + 4 * N * D * M) +
              head);
    snprintf(note, note_cap, "%s, batch %d, %d px, depth %d, new %d-class head, AdamW",
             vitc_vit_arch_name(t->vit), t->B, t->H, g->depth, t->classes);
    return 0;
}

#define BT_TRY(expr)                  \
    do {                              \
        vitc_status bt_s = (expr);    \
        if (bt_s != VITC_OK)          \
            return bt_s;              \
    } while (0)

static vitc_status run_vit_step(bench_train *t) {
    float loss;
    BT_TRY(vitc_optimizer_zero_grad(t->opt));
    if (t->hub) /* the model's primary output: the new head's logits */
        BT_TRY(vitc_vit_run(t->vit, t->x, t->B, t->H, t->H, t->logits));
    else
        BT_TRY(vitc_vit_forward(t->vit, t->x, t->B, t->H, t->H, t->logits));
    BT_TRY(vitc_cross_entropy(t->logits, t->y, t->B, t->classes, 0.0f, &loss, t->dlogits));
    BT_TRY(vitc_vit_backward(t->vit, t->dlogits));
    return vitc_optimizer_step(t->opt);
}

/* q, k, v and dout [1, 8, L, 64]. A training step keeps the forward's
 * output and log-sum-exp (vitc_sdpa_lse, run once here, untimed), so the
 * timed call is the backward from them, vitc_sdpa_backward_lse, as
 * PyTorch's side times its backward with the graph kept. */
static int setup_sdpa_bwd(bench_train *t, int quick, double *flops, char *note, size_t note_cap) {
    t->L = quick ? 256 : 4096;
    size_t n = (size_t)8 * (size_t)t->L * 64;
    t->q = bench_train_random(n, 1.0f, 1);
    t->k = bench_train_random(n, 1.0f, 2);
    t->v = bench_train_random(n, 1.0f, 3);
    t->dout = bench_train_random(n, 1.0f, 4);
    t->dq = malloc(n * sizeof(float));
    t->dk = malloc(n * sizeof(float));
    t->dv = malloc(n * sizeof(float));
    t->o = malloc(n * sizeof(float));
    t->lse = malloc((size_t)8 * (size_t)t->L * sizeof(float));
    if (!t->q || !t->k || !t->v || !t->dout || !t->dq || !t->dk || !t->dv || !t->o || !t->lse)
        return cli_error("sdpa_bwd: out of memory");
    vitc_tensor_view *views[3] = {&t->tq, &t->tk, &t->tv};
    float *data[3] = {t->q, t->k, t->v};
    for (int i = 0; i < 3; i++) {
        views[i]->data = data[i];
        views[i]->ndim = 4;
        views[i]->shape[0] = 1, views[i]->shape[1] = 8, views[i]->shape[2] = t->L;
        views[i]->shape[3] = 64;
    }
    if (vitc_sdpa_lse(&t->tq, &t->tk, &t->tv, NULL, VITC_MASK_NONE, 0.0f, t->o, t->lse) != VITC_OK)
        return cli_lib_error("sdpa_bwd");
    /* Five L x S x d products of 2 flops per multiply-add: S = Q K^T again
     * (P from the saved lse), dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q. */
    *flops = 10.0 * 8.0 * (double)t->L * (double)t->L * 64.0;
    snprintf(note, note_cap, "L = S = %lld, no mask, from the saved out and lse",
             (long long)t->L);
    return 0;
}

int bench_train_setup(const char *name, const char *model, int quick, void **state,
                      double *flops, char *note, size_t note_cap) {
    bench_train *t = calloc(1, sizeof *t);
    *state = t;
    if (!t)
        return cli_error("%s: out of memory", name);
    if (!strcmp(name, "sdpa_bwd"))
        return setup_sdpa_bwd(t, quick, flops, note, note_cap);
    if (!strncmp(name, "finetune_", 9))
        return setup_finetune(t, name, model, quick, flops, note, note_cap);
    return setup_vit_step(t, name, quick, flops, note, note_cap);
}

vitc_status bench_train_run(void *state) {
    bench_train *t = state;
    if (t->q)
        return vitc_sdpa_backward_lse(&t->tq, &t->tk, &t->tv, NULL, VITC_MASK_NONE, 0.0f, t->o,
                                      t->lse, t->dout, t->dq, t->dk, t->dv);
    return run_vit_step(t);
}

void bench_train_free(void *state) {
    bench_train *t = state;
    if (!t)
        return;
    vitc_optimizer_free(t->opt); /* before its model */
    vitc_vit_free(t->vit);
    float *bufs[] = {t->x,  t->logits, t->dlogits, t->q, t->k, t->v,
                     t->dout, t->dq, t->dk,      t->dv, t->o, t->lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(t->y);
    free(t);
}
