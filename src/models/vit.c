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

/* Sizes of one forward's buffers, in floats, each rounded to 16 (64 bytes). */
static vitc_status vit_activations(vitc_vit *m, int64_t B, int64_t P) {
    const vitc_vit_config *c = &m->cfg;
    size_t N = (size_t)P + 1, C = (size_t)c->hidden_dim, K, rows, prow, sz[8];
    int ok = vitc__mul_size((size_t)c->in_channels * (size_t)c->patch_size,
                            (size_t)c->patch_size, &K) &&
             vitc__mul_size((size_t)B, N, &rows) && vitc__mul_size((size_t)B, (size_t)P, &prow) &&
             vitc__mul_size(prow, K, &sz[0]) &&             /* patches */
             vitc__mul_size(rows, C, &sz[1]) &&             /* x0 */
             vitc__mul_size(rows, C, &sz[2]) &&             /* x1 */
             vitc__mul_size(rows, C, &sz[3]) &&             /* ln */
             vitc__mul_size(rows, 3 * C, &sz[4]) &&         /* qkv */
             vitc__mul_size(rows, C, &sz[5]) &&             /* att */
             vitc__mul_size(rows, (size_t)c->mlp_dim, &sz[6]) && /* hid */
             vitc__mul_size((size_t)B, C, &sz[7]);          /* cls_out */
    size_t total = 0, off[8];
    for (int i = 0; ok && i < 8; i++) {
        off[i] = total;
        ok = vitc__add_size(sz[i], 15, &sz[i]) && vitc__add_size(total, sz[i] & ~(size_t)15, &total);
    }
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "ViT activations for batch %lld, %lld patches overflow",
                         (long long)B, (long long)P);
    VITC_TRY(vitc__buf_reserve(&m->act, total));
    float **dst[8] = {&m->patches, &m->x0, &m->x1, &m->ln, &m->qkv, &m->att, &m->hid, &m->cls_out};
    for (int i = 0; i < 8; i++) *dst[i] = m->act.p + off[i];
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

/* Attention of every head over the qkv buffer [B, N, 3, H, d] into att
 * [B, N, H, d], for query rows 0..L-1 of each image. */
static vitc__sdpa_desc vit_attention(const vitc_vit *m, int64_t B, int64_t N, int64_t L) {
    int64_t C = m->cfg.hidden_dim, Hh = m->cfg.num_heads, d = C / Hh;
    vitc__sdpa_desc sd = {
        .B = B, .H = Hh, .L = L, .S = N, .D = d, .Dv = d,
        .q = m->qkv, .q_sb = N * 3 * C, .q_sh = d, .q_sr = 3 * C,
        .k = m->qkv + C, .k_sb = N * 3 * C, .k_sh = d, .k_sr = 3 * C,
        .v = m->qkv + 2 * C, .v_sb = N * 3 * C, .v_sh = d, .v_sr = 3 * C,
        .o = m->att, .o_sb = N * C, .o_sh = d, .o_sr = C,
        .scale = 1.0f / sqrtf((float)d),
        .p_sb = Hh * N * N, .p_sh = N * N, .p_sr = N,
    };
    return sd;
}

/* The last block for the head alone: every row's keys and values, but
 * queries, out_proj, LayerNorm and MLP only for the class token (row 0 of
 * each image, stride N*C) — the same numbers for those rows, ~7% fewer
 * FLOPs for ViT-B/16. *cls_out: the block's output class tokens [B, C]. */
static vitc_status vit_last_block(vitc_vit *m, int64_t B, int64_t N, const float **cls_out) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_block *w = &m->blocks[c->depth - 1];
    int64_t C = c->hidden_dim, M = c->mlp_dim, BN = B * N;
    vitc__layernorm(m->ln, m->x0, w->ln1_w, w->ln1_b, BN, C, c->norm_eps);
    /* k, v of every row (weight rows C..3C), q of the class rows. */
    vitc__linear(m->qkv + C, 3 * C, m->ln, C, w->qkv_w + C * C, w->qkv_b + C, NULL, 0, BN,
                 2 * C, C);
    vitc__linear(m->qkv, N * 3 * C, m->ln, N * C, w->qkv_w, w->qkv_b, NULL, 0, B, C, C);
    vitc__sdpa_desc sd = vit_attention(m, B, N, 1);
    VITC_TRY(vitc__sdpa(&sd));
    float *x1 = m->x1;  /* [B, C] */
    float *ln = m->ln;  /* [B, C] */
    float *hid = m->hid; /* [B, M] */
    float *out = m->x1 + B * C; /* [B, C] */
    vitc__linear(x1, C, m->att, N * C, w->proj_w, w->proj_b, m->x0, N * C, B, C, C);
    vitc__layernorm(ln, x1, w->ln2_w, w->ln2_b, B, C, c->norm_eps);
    vitc__linear(hid, M, ln, C, w->fc1_w, w->fc1_b, NULL, 0, B, M, C);
    vitc__gelu(hid, B * M);
    vitc__linear(out, C, hid, M, w->fc2_w, w->fc2_b, x1, C, B, C, M);
    *cls_out = out;
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
    int64_t Hh = c->num_heads, M = c->mlp_dim, BN = B * N, K = Cin * p * p;
    VITC_TRY(vit_activations(m, B, P));
    VITC_TRY(vit_position_embedding(m, gh, gw));

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
    vit_im2col_ctx ic = {m->patches, images, Cin, H, W, p, gh, gw};
    vitc__parallel_for(B * gh, vit_im2col_task, &ic);
    float *proj = m->ln; /* [B*P, C] */
    vitc__linear(proj, C, m->patches, K, m->w.conv_w, m->w.conv_b, NULL, 0, B * P, C, K);
    const float *pos = m->pos_used; /* [N, C] */
    for (int64_t b = 0; b < B; b++) {
        float *xb = m->x0 + b * N * C; /* [N, C] */
        for (int64_t j = 0; j < C; j++) xb[j] = m->w.cls[j] + pos[j];
        for (int64_t t = 0; t < P; t++) {
            const float *src = proj + (b * P + t) * C;
            float *dst = xb + (t + 1) * C;
            for (int64_t j = 0; j < C; j++) dst[j] = src[j] + pos[(t + 1) * C + j];
        }
    }

    /* Logits need only the class tokens out of the last block (see
     * vit_last_block); the maps need every row of every block. */
    int full = logits ? c->depth - 1 : c->depth;
    for (int l = 0; l < full; l++) {
        const vitc__vit_block *w = &m->blocks[l];
        vitc__layernorm(m->ln, m->x0, w->ln1_w, w->ln1_b, BN, C, c->norm_eps);
        /* qkv [B, N, 3, H, d]: the kernel reads q, k, v of head h in place. */
        vitc__linear(m->qkv, 3 * C, m->ln, C, w->qkv_w, w->qkv_b, NULL, 0, BN, 3 * C, C);
        float *probs = NULL; /* [B, H, N, N] */
        if (attn)
            probs = attn + (size_t)l * per_layer;
        else if (rollout)
            probs = m->probs_buf.p;
        vitc__sdpa_desc sd = vit_attention(m, B, N, N);
        sd.probs = probs;
        VITC_TRY(vitc__sdpa(&sd));
        if (rollout)
            vit_rollout_step(m, probs, B, N, l == 0);
        /* x1 = x0 + out_proj(att); x0 = x1 + fc2(gelu(fc1(ln_2(x1)))). */
        vitc__linear(m->x1, C, m->att, C, w->proj_w, w->proj_b, m->x0, C, BN, C, C);
        vitc__layernorm(m->ln, m->x1, w->ln2_w, w->ln2_b, BN, C, c->norm_eps);
        vitc__linear(m->hid, M, m->ln, C, w->fc1_w, w->fc1_b, NULL, 0, BN, M, C);
        vitc__gelu(m->hid, BN * M);
        vitc__linear(m->x0, C, m->hid, M, w->fc2_w, w->fc2_b, m->x1, C, BN, C, M);
    }

    if (rollout)
        memcpy(rollout, m->roll_buf.p, (size_t)(B * N * N) * sizeof(float));
    if (logits) {
        const float *cls; /* [B, C] */
        VITC_TRY(vit_last_block(m, B, N, &cls));
        vitc__layernorm(m->cls_out, cls, m->w.ln_w, m->w.ln_b, B, C, c->norm_eps);
        vitc__linear(logits, c->num_classes, m->cls_out, C, m->w.head_w, m->w.head_b, NULL, 0, B,
                     c->num_classes, C);
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
