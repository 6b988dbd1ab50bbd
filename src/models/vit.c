/*
 * vit.c — the Vision Transformer forward (torchvision 0.14's
 * VisionTransformer in eval mode), batched: all B*N token rows of a batch go
 * through each GEMM together.
 *
 *   x = conv_proj(images) as im2col @ W^T        [B, P, C], P = (H/p)(W/p)
 *   x = cat(class_token, x) + pos_embedding      [B, N, C], N = 1 + P
 *   per block:  x = x + out_proj(MHA(ln_1(x)))
 *               x = x + mlp(ln_2(x))             Linear, GELU(erf), Linear
 *   logits = heads(ln(x)[:, 0])                  [B, classes]
 *
 * Loading (names, configs, the parameter table) is in vit_load.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../rng.h"
#include "../train/train.h"
#include "vit_internal.h"

void vitc_vit_free(vitc_vit *m) {
    if (!m)
        return;
    vitc__handle_unregister(m->id);
    if (!m->weights_file)
        vitc__free(m->params);
    vitc_safetensors_free(m->weights_file);
    vitc__free(m->grad);
    free(m->table);
    free(m->names);
    free(m->blocks);
    free(m->gblocks);
    free(m->labels);
    free(m->label_text);
    vitc__buf_free(&m->act);
    vitc__buf_free(&m->bwd);
    vitc__buf_free(&m->masks);
    vitc__buf_free(&m->pos_buf);
    vitc__buf_free(&m->probs_buf);
    vitc__buf_free(&m->roll_buf);
    free(m);
}

const vitc_vit_config *vitc_vit_get_config(const vitc_vit *m) { return m ? &m->cfg : NULL; }
const char *vitc_vit_arch_name(const vitc_vit *m) { return m ? m->arch : NULL; }

const char *vitc_vit_label(const vitc_vit *m, int index) {
    if (!m || !m->labels || index < 0 || index >= m->cfg.num_classes)
        return NULL;
    return m->labels[index];
}

/* ------------------------------------------------------------------ */
/* Position embedding resampling                                      */
/* ------------------------------------------------------------------ */

/* PyTorch's cubic convolution kernel, A = -0.75 (UpSample.h). */
static void vit_cubic_weights(float w[4], float t) {
    const float A = -0.75f;
    float x1 = t + 1.0f, x2 = 1.0f - t, x3 = 2.0f - t;
    w[0] = ((A * x1 - 5.0f * A) * x1 + 8.0f * A) * x1 - 4.0f * A;
    w[1] = ((A + 2.0f) * t - (A + 3.0f)) * t * t + 1.0f;
    w[2] = ((A + 2.0f) * x2 - (A + 3.0f)) * x2 * x2 + 1.0f;
    w[3] = ((A * x3 - 5.0f * A) * x3 + 8.0f * A) * x3 - 4.0f * A;
}

/* Source taps and weights of output index o, align_corners=True; taps past
 * the edge are clamped, as upsample_get_value_bounded does. */
static void vit_cubic_taps(int64_t o, int64_t in, int64_t out, int64_t idx[4], float w[4]) {
    float scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    float real = scale * (float)o;
    int64_t i0 = (int64_t)floorf(real);
    vit_cubic_weights(w, real - (float)i0);
    for (int k = 0; k < 4; k++) {
        int64_t i = i0 - 1 + k;
        idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    }
}

void vitc__bicubic_ac(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw, int64_t oh,
                      int64_t ow) {
    for (int64_t y = 0; y < oh; y++) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        vit_cubic_taps(y, ih, oh, ys, wy);
        for (int64_t x = 0; x < ow; x++) {
            vit_cubic_taps(x, iw, ow, xs, wx);
            float *d = dst + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int a = 0; a < 4; a++) {
                    const float *row = src + ys[a] * iw * C + c;
                    float r = 0.0f;
                    for (int b = 0; b < 4; b++) r += wx[b] * row[xs[b] * C];
                    acc += wy[a] * r;
                }
                d[c] = acc;
            }
        }
    }
}

/* The adjoint of vitc__bicubic_ac: dsrc [ih*iw, C] += the transpose of the
 * resampling applied to ddst [oh*ow, C] (each tap's weight sends ddst back
 * to the clamped source it read). */
void vitc__bicubic_ac_backward(float *dsrc, const float *ddst, int64_t C, int64_t ih, int64_t iw,
                               int64_t oh, int64_t ow) {
    for (int64_t y = 0; y < oh; y++) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        vit_cubic_taps(y, ih, oh, ys, wy);
        for (int64_t x = 0; x < ow; x++) {
            vit_cubic_taps(x, iw, ow, xs, wx);
            const float *g = ddst + (y * ow + x) * C;
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) {
                    float wab = wy[a] * wx[b];
                    float *d = dsrc + (ys[a] * iw + xs[b]) * C;
                    for (int64_t c = 0; c < C; c++) d[c] += wab * g[c];
                }
        }
    }
}

/* m->pos_used for a gh x gw grid: the checkpoint's own when it matches,
 * else resampled as torchvision's interpolate_embeddings does (the class
 * token's row kept, the patch rows as a [C, g, g] image, bicubic). */
static vitc_status vit_position_embedding(vitc_vit *m, int64_t gh, int64_t gw) {
    int64_t g = m->cfg.image_size / m->cfg.patch_size, C = m->cfg.hidden_dim;
    if (gh == g && gw == g) {
        m->pos_used = m->w.pos;
        return VITC_OK;
    }
    if (m->pos_buf.p && m->pos_gh == gh && m->pos_gw == gw) {
        m->pos_used = m->pos_buf.p;
        return VITC_OK;
    }
    size_t n;
    if (!vitc__mul_size((size_t)(gh * gw + 1), (size_t)C, &n))
        return vitc__err(VITC_ERR_NOMEM, "position embedding for a %lldx%lld grid overflows",
                         (long long)gh, (long long)gw);
    m->pos_gh = m->pos_gw = 0;
    VITC_TRY(vitc__buf_reserve(&m->pos_buf, n));
    memcpy(m->pos_buf.p, m->w.pos, (size_t)C * sizeof(float));
    vitc__bicubic_ac(m->pos_buf.p + C, m->w.pos + C, C, g, g, gh, gw);
    m->pos_gh = (int)gh;
    m->pos_gw = (int)gw;
    m->pos_used = m->pos_buf.p;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Activations                                                        */
/* ------------------------------------------------------------------ */

/* Carve m->act for a forward of B images of P patches: training keeps
 * every block's activations (depth + 1 blocks, the last only VA_X),
 * inference one block with the aliases of vitc__vit_acts. Each buffer is
 * rounded to 16 floats (64 bytes). */
static vitc_status vit_activations(vitc_vit *m, int64_t B, int64_t P, int training) {
    const vitc_vit_config *c = &m->cfg;
    size_t N = (size_t)P + 1, C = (size_t)c->hidden_dim, K = 0, rows = 0, prow = 0,
           sz[VA_COUNT] = {0}, patches = 0,
           cls = 0, block = 0, total = 0, nblocks = training ? (size_t)c->depth + 1 : 1;
    int ok = vitc__mul_size((size_t)c->in_channels * (size_t)c->patch_size,
                            (size_t)c->patch_size, &K) &&
             vitc__mul_size((size_t)B, N, &rows) && vitc__mul_size((size_t)B, (size_t)P, &prow) &&
             vitc__mul_size(prow, K, &patches) && vitc__mul_size((size_t)B, C, &cls) &&
             vitc__mul_size(rows, C, &sz[VA_X]) && vitc__mul_size(rows, 3 * C, &sz[VA_QKV]) &&
             vitc__mul_size(rows, (size_t)c->mlp_dim, &sz[VA_HPRE]) &&
             vitc__mul_size(rows, (size_t)c->num_heads, &sz[VA_LSE]);
    sz[VA_LN1] = sz[VA_ATT] = sz[VA_MID] = sz[VA_LN2] = sz[VA_X];
    sz[VA_HACT] = sz[VA_HPRE];
    /* Inference: what backward alone needs shares a buffer. */
    int alias[VA_COUNT] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
    if (!training)
        alias[VA_LN2] = VA_LN1, alias[VA_HACT] = VA_HPRE, alias[VA_LSE] = VA_X;
    for (int k = 0; ok && k < VA_COUNT; k++) {
        if (alias[k] >= 0) {
            m->a.off[k] = m->a.off[alias[k]];
            continue;
        }
        m->a.off[k] = block;
        ok = vitc__add_size(sz[k], 15, &sz[k]) && vitc__add_size(block, sz[k] & ~(size_t)15, &block);
    }
    size_t layers;
    ok = ok && vitc__mul_size(block, nblocks, &layers) && vitc__add_size(patches, 15, &patches) &&
         vitc__add_size(cls, 15, &cls) && vitc__add_size(layers, patches & ~(size_t)15, &total) &&
         vitc__add_size(total, 2 * (cls & ~(size_t)15), &total);
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "ViT activations for batch %lld, %lld patches overflow",
                         (long long)B, (long long)P);
    VITC_TRY(vitc__buf_reserve(&m->act, total));
    vitc__vit_acts *a = &m->a;
    a->B = B, a->N = (int64_t)N, a->P = P, a->training = training;
    a->layers = m->act.p;
    a->stride = training ? block : 0;
    a->patches = a->layers + layers;
    a->cls_in = a->patches + (patches & ~(size_t)15);
    a->cls_out = a->cls_in + (cls & ~(size_t)15);
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

typedef struct vit_im2col_ctx {
    float *patches;      /* [B*gh*gw, Cin*p*p] */
    const float *images; /* [B, Cin, H, W] */
    int64_t Cin, H, W, p, gh, gw;
} vit_im2col_ctx;

/* One row of patches (image b = i / gh, patch row i % gh) into im2col rows
 * ordered (c, ky, kx) like conv_proj.weight's [C, Cin, p, p]. */
static void vit_im2col_task(void *ctx, int64_t i, int tid) {
    const vit_im2col_ctx *a = ctx;
    (void)tid;
    int64_t b = i / a->gh, py = i % a->gh, K = a->Cin * a->p * a->p;
    for (int64_t px = 0; px < a->gw; px++) {
        float *dst = a->patches + ((b * a->gh + py) * a->gw + px) * K;
        for (int64_t c = 0; c < a->Cin; c++)
            for (int64_t ky = 0; ky < a->p; ky++) {
                const float *src =
                    a->images + ((b * a->Cin + c) * a->H + py * a->p + ky) * a->W + px * a->p;
                memcpy(dst + (c * a->p + ky) * a->p, src, (size_t)a->p * sizeof(float));
            }
    }
}

/* Folds one layer's probabilities into the rollout (see docs/vit.md):
 * A = mean over heads + I, rows renormalised, R = A @ R. */
static void vit_rollout_step(vitc_vit *m, const float *probs, int64_t B, int64_t N, int first) {
    int64_t Hh = m->cfg.num_heads;
    float *R = m->roll_buf.p;       /* [B, N, N] */
    float *A = R + B * N * N;       /* [N, N] */
    float *T = A + N * N;           /* [N, N] */
    float inv_h = 1.0f / (float)Hh;
    for (int64_t b = 0; b < B; b++) {
        const float *pb = probs + b * Hh * N * N; /* [H, N, N] */
        for (int64_t i = 0; i < N * N; i++) {
            float s = 0.0f;
            for (int64_t h = 0; h < Hh; h++) s += pb[h * N * N + i];
            A[i] = s * inv_h;
        }
        for (int64_t i = 0; i < N; i++) {
            float *row = A + i * N, sum = 0.0f;
            row[i] += 1.0f;
            for (int64_t j = 0; j < N; j++) sum += row[j];
            for (int64_t j = 0; j < N; j++) row[j] /= sum;
        }
        float *Rb = R + b * N * N;
        if (first) {
            memcpy(Rb, A, (size_t)(N * N) * sizeof(float));
        } else {
            vitc__gemm(0, 0, N, N, N, 1.0f, A, N, Rb, N, 0.0f, T, N);
            memcpy(Rb, T, (size_t)(N * N) * sizeof(float));
        }
    }
}

/* Attention of every head over qkv [B, N, 3, H, d] into att [B, N, H, d],
 * for query rows 0..L-1 of each image (query row stride N*3C when L = 1). */
vitc__sdpa_desc vitc__vit_attention(const vitc_vit *m, const float *qkv, float *att, int64_t B,
                                     int64_t N, int64_t L) {
    int64_t C = m->cfg.hidden_dim, Hh = m->cfg.num_heads, d = C / Hh;
    vitc__sdpa_desc sd = {
        .B = B, .H = Hh, .L = L, .S = N, .D = d, .Dv = d,
        .q = qkv, .q_sb = N * 3 * C, .q_sh = d, .q_sr = 3 * C,
        .k = qkv + C, .k_sb = N * 3 * C, .k_sh = d, .k_sr = 3 * C,
        .v = qkv + 2 * C, .v_sb = N * 3 * C, .v_sh = d, .v_sr = 3 * C,
        .o = att, .o_sb = N * C, .o_sh = d, .o_sr = C,
        .scale = 1.0f / sqrtf((float)d),
        .p_sb = Hh * N * N, .p_sh = N * N, .p_sr = N,
    };
    return sd;
}

/* timm's stochastic depth rule: rates rising linearly from 0 at the first
 * block to drop_path at the last (torch.linspace(0, drop_path, depth)). */
float vitc__vit_drop_path_rate(const vitc_vit *m, int l) {
    int d = m->cfg.depth;
    return d > 1 ? m->drop_path * (float)l / (float)(d - 1) : 0.0f;
}

/* A residual branch's regularisation, in place on x [B, N, C]:
 * dropout(p = m->dropout), then drop path of the sample. Linear and
 * diagonal in x, so backward applies the same to the gradient. */
void vitc__vit_branch(const vitc_vit *m, int l, float *x, const uint8_t *keep,
                      const uint8_t *dp_keep) {
    int64_t B = m->a.B, NC = m->a.N * m->cfg.hidden_dim;
    float pd = vitc__vit_drop_path_rate(m, l);
    if (m->dropout > 0.0f)
        vitc__dropout_apply(x, x, keep, B * NC, m->dropout);
    if (pd > 0.0f)
        vitc__drop_path_apply(x, x, dp_keep, B, NC, pd, 0);
}

static void vit_branch_forward(vitc_vit *m, int l, float *x, uint8_t *keep, uint8_t *dp_keep) {
    int64_t B = m->a.B, NC = m->a.N * m->cfg.hidden_dim;
    float pd = vitc__vit_drop_path_rate(m, l);
    if (m->dropout > 0.0f)
        vitc__dropout_mask(keep, B * NC, m->dropout, &m->rng);
    if (pd > 0.0f)
        vitc__dropout_mask(dp_keep, B, pd, &m->rng);
    vitc__vit_branch(m, l, x, keep, dp_keep);
}

static void vit_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* One encoder block l on m->a (torchvision's EncoderBlock):
 *   mid = x + out_proj(MHA(ln_1(x)));  out = mid + fc2(gelu(fc1(ln_2(mid))))
 * cls_only: queries, out_proj, LayerNorm and MLP only for the class token
 * (row 0 of each image; every row's keys and values still) — the same
 * numbers for those rows, ~7% fewer FLOPs for the last block of
 * ViT-B/16; the rows after the attention are then [B, C] compact and
 * *out points at them. probs [B, H, N, N] may be NULL. */
static vitc_status vit_block(vitc_vit *m, int l, int cls_only, float *probs, const float **out) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_block *w = &m->blocks[l];
    const vitc__vit_acts *a = &m->a;
    int64_t B = a->B, N = a->N, C = c->hidden_dim, M = c->mlp_dim, BN = B * N;
    float *x = vitc__va(a, l, VA_X), *ln1 = vitc__va(a, l, VA_LN1), *qkv = vitc__va(a, l, VA_QKV);
    float *att = vitc__va(a, l, VA_ATT), *mid = vitc__va(a, l, VA_MID);
    float *ln2 = vitc__va(a, l, VA_LN2), *hpre = vitc__va(a, l, VA_HPRE);
    float *hact = vitc__va(a, l, VA_HACT), *y = vitc__va(a, l + (a->training ? 1 : 0), VA_X);
    vitc__layernorm(ln1, x, w->ln1_w, w->ln1_b, BN, C, c->norm_eps);
    /* R rows go on past the attention, rs apart in the [B, N, .] buffers. */
    int64_t R = cls_only ? B : BN, rs = cls_only ? N : 1;
    if (cls_only) { /* k, v of every row (weight rows C..3C), q of the class rows */
        vitc__linear(qkv + C, 3 * C, ln1, C, w->qkv_w + C * C, w->qkv_b + C, NULL, 0, BN, 2 * C, C);
        vitc__linear(qkv, N * 3 * C, ln1, N * C, w->qkv_w, w->qkv_b, NULL, 0, B, C, C);
    } else { /* qkv [B, N, 3, H, d]: the kernel reads q, k, v of head h in place */
        vitc__linear(qkv, 3 * C, ln1, C, w->qkv_w, w->qkv_b, NULL, 0, BN, 3 * C, C);
    }
    vitc__sdpa_desc sd = vitc__vit_attention(m, qkv, att, B, N, cls_only ? 1 : N);
    sd.probs = probs;
    sd.lse = vitc__va(a, l, VA_LSE); /* [B, H, N], training only */
    sd.lse_sb = c->num_heads * N;
    sd.lse_sh = N;
    VITC_TRY(vitc__sdpa(&sd));
    vitc__vit_mask k = vitc__vit_block_mask(m, l); /* training with regularisation */
    if (k.att) { /* the branch alone, regularised, then the residual */
        vitc__linear(mid, C, att, C, w->proj_w, w->proj_b, NULL, 0, R, C, C);
        vit_branch_forward(m, l, mid, k.att, k.dp_att);
        vit_add(mid, x, R * C);
    } else {
        vitc__linear(mid, C, att, rs * C, w->proj_w, w->proj_b, x, rs * C, R, C, C);
    }
    vitc__layernorm(ln2, mid, w->ln2_w, w->ln2_b, R, C, c->norm_eps);
    vitc__linear(hpre, M, ln2, C, w->fc1_w, w->fc1_b, NULL, 0, R, M, C);
    if (hact != hpre) /* training keeps GELU's input for backward */
        memcpy(hact, hpre, (size_t)(R * M) * sizeof(float));
    vitc__gelu(hact, R * M);
    if (k.hid && m->dropout > 0.0f) { /* MLPBlock's Dropout after the GELU */
        vitc__dropout_mask(k.hid, R * M, m->dropout, &m->rng);
        vitc__dropout_apply(hact, hact, k.hid, R * M, m->dropout);
    }
    if (k.out) {
        vitc__linear(y, C, hact, M, w->fc2_w, w->fc2_b, NULL, 0, R, C, M);
        vit_branch_forward(m, l, y, k.out, k.dp_mlp);
        vit_add(y, mid, R * C);
    } else {
        vitc__linear(y, C, hact, M, w->fc2_w, w->fc2_b, mid, C, R, C, M);
    }
    if (out)
        *out = y;
    return VITC_OK;
}

/* The whole forward. logits, attn, rollout may each be NULL. */
static vitc_status vit_run(vitc_vit *m, const float *images, int B_, int H_, int W_, float *logits,
                           float *attn, float *rollout) {
    if (!m || !images)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT forward: NULL model or images");
    const vitc_vit_config *c = &m->cfg;
    if (B_ < 1 || H_ < 1 || W_ < 1)
        return vitc__err(VITC_ERR_SHAPE, "ViT forward: images [%d, %d, %d, %d] must be non-empty",
                         B_, c->in_channels, H_, W_);
    if (H_ % c->patch_size || W_ % c->patch_size)
        return vitc__err(VITC_ERR_SHAPE,
                         "ViT forward: images [%d, %d, %d, %d]: height and width must be "
                         "multiples of the patch size %d",
                         B_, c->in_channels, H_, W_, c->patch_size);
    int64_t B = B_, H = H_, W = W_, p = c->patch_size, Cin = c->in_channels;
    int64_t gh = H / p, gw = W / p, P = gh * gw, N = P + 1, C = c->hidden_dim;
    int64_t Hh = c->num_heads, K = Cin * p * p;
    /* A training forward of logits records every block for backward. */
    int record = m->training && logits && !attn && !rollout;
    m->recorded = 0;
    VITC_TRY(vit_activations(m, B, P, record));
    VITC_TRY(vit_position_embedding(m, gh, gw));
    const vitc__vit_acts *a = &m->a;
    m->mask_stride = 0;
    if (record && (m->dropout > 0.0f || m->drop_path > 0.0f)) {
        /* Keep masks, bytes: the embedding's, then per block (vitc__vit_mask). */
        size_t BNC, BNM, per = 0, total = 0;
        int ok = vitc__mul_size((size_t)(B * N), (size_t)C, &BNC) &&
                 vitc__mul_size((size_t)(B * N), (size_t)c->mlp_dim, &BNM) &&
                 vitc__add_size(2 * BNC, BNM, &per) && vitc__add_size(per, 2 * (size_t)B, &per) &&
                 vitc__mul_size(per, (size_t)c->depth, &total) &&
                 vitc__add_size(total, BNC + 3, &total);
        if (!ok)
            return vitc__err(VITC_ERR_NOMEM, "ViT dropout masks overflow");
        VITC_TRY(vitc__buf_reserve(&m->masks, total / 4 + 1));
        m->mask_stride = per;
    }

    size_t per_layer = 0, roll = 0;
    if (attn || rollout) {
        /* B*H*N*N and B*N*N + 2*N*N, checked (N*N itself fits: N <= B*N). */
        size_t nn;
        int ok = vitc__mul_size((size_t)N, (size_t)N, &nn) &&
                 vitc__mul_size(nn, (size_t)(B * Hh), &per_layer) &&
                 vitc__mul_size(nn, (size_t)B + 2, &roll);
        if (!ok)
            return vitc__err(VITC_ERR_NOMEM, "attention maps [%lld, %lld, %lld, %lld] overflow",
                             (long long)B, (long long)Hh, (long long)N, (long long)N);
        if (!attn)
            VITC_TRY(vitc__buf_reserve(&m->probs_buf, per_layer));
        if (rollout)
            VITC_TRY(vitc__buf_reserve(&m->roll_buf, roll));
    }

    /* Patch embedding: conv k = s = p is one GEMM over im2col rows. */
    vit_im2col_ctx ic = {a->patches, images, Cin, H, W, p, gh, gw};
    vitc__parallel_for(B * gh, vit_im2col_task, &ic);
    float *proj = vitc__va(a, 0, VA_LN1); /* [B*P, C] */
    vitc__linear(proj, C, a->patches, K, m->w.conv_w, m->w.conv_b, NULL, 0, B * P, C, K);
    const float *pos = m->pos_used; /* [N, C] */
    for (int64_t b = 0; b < B; b++) {
        float *xb = vitc__va(a, 0, VA_X) + b * N * C; /* [N, C] */
        for (int64_t j = 0; j < C; j++) xb[j] = m->w.cls[j] + pos[j];
        for (int64_t t = 0; t < P; t++) {
            const float *src = proj + (b * P + t) * C;
            float *dst = xb + (t + 1) * C;
            for (int64_t j = 0; j < C; j++) dst[j] = src[j] + pos[(t + 1) * C + j];
        }
    }

    uint8_t *emb = vitc__vit_emb_mask(m); /* Encoder's dropout(input + pos) */
    if (emb && m->dropout > 0.0f) {
        vitc__dropout_mask(emb, B * N * C, m->dropout, &m->rng);
        vitc__dropout_apply(vitc__va(a, 0, VA_X), vitc__va(a, 0, VA_X), emb, B * N * C, m->dropout);
    }

    /* Inference logits need only the class tokens out of the last block;
     * the maps, and backward, need every row of every block. */
    const float *y = NULL; /* the last block's output: [B, C] cls_only, else [B, N, C] */
    for (int l = 0; l < c->depth; l++) {
        int cls_only = logits && !record && l == c->depth - 1;
        float *probs = NULL; /* [B, H, N, N] */
        if (attn)
            probs = attn + (size_t)l * per_layer;
        else if (rollout)
            probs = m->probs_buf.p;
        VITC_TRY(vit_block(m, l, cls_only, probs, &y));
        if (rollout)
            vit_rollout_step(m, probs, B, N, l == 0);
    }

    if (rollout)
        memcpy(rollout, m->roll_buf.p, (size_t)(B * N * N) * sizeof(float));
    if (logits) {
        int64_t ys = record ? N * C : C; /* class rows of y */
        for (int64_t b = 0; b < B; b++)
            memcpy(a->cls_in + b * C, y + b * ys, (size_t)C * sizeof(float));
        vitc__layernorm(a->cls_out, a->cls_in, m->w.ln_w, m->w.ln_b, B, C, c->norm_eps);
        vitc__linear(logits, c->num_classes, a->cls_out, C, m->w.head_w, m->w.head_b, NULL, 0, B,
                     c->num_classes, C);
    }
    if (record) {
        m->recorded = 1;
        m->rec_gh = (int)gh;
        m->rec_gw = (int)gw;
    }
    return VITC_OK;
}

vitc_status vitc_vit_forward(vitc_vit *m, const float *images, int B, int H, int W,
                             float *logits) {
    if (!logits)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_forward: NULL logits");
    return vit_run(m, images, B, H, W, logits, NULL, NULL);
}

vitc_status vitc_vit_attention_maps(vitc_vit *m, const float *images, int B, int H, int W,
                                    float *attn, float *rollout) {
    if (!attn && !rollout)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_attention_maps: attn and rollout are "
                                               "both NULL");
    return vit_run(m, images, B, H, W, NULL, attn, rollout);
}
