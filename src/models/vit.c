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
 * Loading: load.c (the router), families/ and model.c (the parameter table).
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
    vitc__vit_pack_free(m);
    vitc__t2t_free(m);
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
    vitc__buf_free(&m->pdrop);
    vitc__buf_free(&m->pos_buf);
    vitc__buf_free(&m->probs_buf);
    vitc__buf_free(&m->roll_buf);
    vitc__buf_free(&m->feat_buf);
    vitc__buf_free(&m->head_buf);
    free(m->ignored);
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

/* Taps and weights at source coordinate real; taps past the edge are
 * clamped, as upsample_get_value_bounded does. */
static void vit_cubic_at(float real, int64_t in, int64_t idx[4], float w[4]) {
    int64_t i0 = (int64_t)floorf(real);
    vit_cubic_weights(w, real - (float)i0);
    for (int k = 0; k < 4; k++) {
        int64_t i = i0 - 1 + k;
        idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    }
}

/* Source taps and weights of output index o, align_corners=True. */
static void vit_cubic_taps(int64_t o, int64_t in, int64_t out, int64_t idx[4], float w[4]) {
    float scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    float real = scale * (float)o;
    vit_cubic_at(real, in, idx, w);
}

/* The same with align_corners=False and an output size (no scale factor):
 * source (o + 0.5) * in/out - 0.5, not clamped (cubic), as
 * area_pixel_compute_source_index computes it; HF's ViT family resamples
 * its position grid so (transformers >= 4.45). */
static void vit_cubic_taps_hp(int64_t o, int64_t in, float scale, int64_t idx[4], float w[4]) {
    vit_cubic_at(scale * ((float)o + 0.5f) - 0.5f, in, idx, w);
}

/* mode: 0 align_corners=True; 1 half-pixel to a size. */
static void vit_bicubic(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw,
                        int64_t oh, int64_t ow, int mode) {
    float sy = (float)ih / (float)oh, sx = (float)iw / (float)ow;
    for (int64_t y = 0; y < oh; y++) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        if (mode)
            vit_cubic_taps_hp(y, ih, sy, ys, wy);
        else
            vit_cubic_taps(y, ih, oh, ys, wy);
        for (int64_t x = 0; x < ow; x++) {
            if (mode)
                vit_cubic_taps_hp(x, iw, sx, xs, wx);
            else
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

void vitc__bicubic_ac(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw, int64_t oh,
                      int64_t ow) {
    vit_bicubic(dst, src, C, ih, iw, oh, ow, 0);
}

/* Keys' cubic with a = -0.5, the kernel of PyTorch's antialiased bicubic
 * (and PIL's). */
static double vit_keys(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
}

/* One axis of F.interpolate(mode="bicubic", antialias=True,
 * align_corners=False): output o reads inputs lo[o] .. lo[o] + n[o] - 1 with
 * weights w[o * taps ..], normalised to sum 1 (the support widens with the
 * downscale factor, as PIL's filters). taps: the most any output reads. */
static void vit_aa_axis(int64_t in, int64_t out, int64_t taps, int64_t *lo, int64_t *n, float *w) {
    double scale = (double)in / (double)out, sup = scale > 1.0 ? scale : 1.0;
    double support = 2.0 * sup;
    for (int64_t o = 0; o < out; o++) {
        double center = scale * ((double)o + 0.5), total = 0.0, ws[64];
        int64_t a = (int64_t)(center - support + 0.5), b = (int64_t)(center + support + 0.5);
        if (a < 0)
            a = 0;
        if (b > in)
            b = in;
        if (b - a > taps)
            b = a + taps;
        for (int64_t j = a; j < b; j++) total += ws[j - a] = vit_keys(((double)j - center + 0.5) / sup);
        lo[o] = a;
        n[o] = b - a;
        for (int64_t j = a; j < b; j++)
            w[o * taps + j - a] = (float)(total != 0.0 ? ws[j - a] / total : 0.0);
    }
}

/* Antialiased bicubic of src [ih*iw, C] into dst [oh*ow, C], width first
 * then height (PyTorch's separable order), through tmp [ih*ow, C]. Grids
 * are bounded (taps <= 64: a position grid shrinking by over 15x is
 * refused by the caller). */
static vitc_status vit_bicubic_aa(float *dst, float *tmp, const float *src, int64_t C, int64_t ih,
                                  int64_t iw, int64_t oh, int64_t ow) {
    int64_t lo[2][1024], n[2][1024], tx = 64, ty = 64;
    float *w[2] = {malloc((size_t)(ow * tx) * sizeof(float)),
                   malloc((size_t)(oh * ty) * sizeof(float))};
    if (!w[0] || !w[1]) {
        free(w[0]);
        free(w[1]);
        return vitc__err(VITC_ERR_NOMEM, "antialiased resampling weights");
    }
    vit_aa_axis(iw, ow, tx, lo[0], n[0], w[0]);
    vit_aa_axis(ih, oh, ty, lo[1], n[1], w[1]);
    for (int64_t y = 0; y < ih; y++)
        for (int64_t x = 0; x < ow; x++) {
            float *d = tmp + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
            for (int64_t k = 0; k < n[0][x]; k++) {
                const float *s = src + (y * iw + lo[0][x] + k) * C;
                float wk = w[0][x * tx + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * s[c];
            }
        }
    for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
            float *d = dst + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
            for (int64_t k = 0; k < n[1][y]; k++) {
                const float *s = tmp + ((lo[1][y] + k) * ow + x) * C;
                float wk = w[1][y * ty + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * s[c];
            }
        }
    free(w[0]);
    free(w[1]);
    return VITC_OK;
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
 * token's row kept, the patch rows as a [C, g, g] image, bicubic), once per
 * grid while the parameters do not move (wversion: vitc_vit_param, loading
 * a state, an optimizer step). */
static vitc_status vit_position_embedding(vitc_vit *m, int64_t gh, int64_t gw) {
    int64_t g = m->cfg.image_size / m->cfg.patch_size, C = m->cfg.hidden_dim;
    int64_t np = m->n_prefix - m->n_reg; /* rows before the patch rows: registers have none */
    if (gh == g && gw == g) {
        m->pos_used = m->w.pos;
        return VITC_OK;
    }
    if (m->pos_buf.p && m->pos_ver == m->wversion + 1 && m->pos_gh == gh && m->pos_gw == gw) {
        m->pos_used = m->pos_buf.p;
        return VITC_OK;
    }
    int aa = m->pos_rule == VIT_POS_ANTIALIAS;
    if (aa && (gh > 1024 || gw > 1024 || g > 15 * gh || g > 15 * gw))
        return vitc__err(VITC_ERR_SHAPE, "antialiased position embedding from a %lldx%lld grid "
                         "to %lldx%lld is out of vitc's range (grids up to 1024, shrinking at "
                         "most 15x)", (long long)g, (long long)g, (long long)gh, (long long)gw);
    size_t n, t;
    if (!vitc__mul_size((size_t)(gh * gw + np), (size_t)C, &n) ||
        !vitc__mul_size((size_t)(g * gw), (size_t)C, &t) || !vitc__add_size(n, t, &t))
        return vitc__err(VITC_ERR_NOMEM, "position embedding for a %lldx%lld grid overflows",
                         (long long)gh, (long long)gw);
    m->pos_gh = m->pos_gw = 0;
    VITC_TRY(vitc__buf_reserve(&m->pos_buf, aa ? t : n));
    /* The class (and distillation) rows are kept as they are. */
    memcpy(m->pos_buf.p, m->w.pos, (size_t)(np * C) * sizeof(float));
    if (aa)
        VITC_TRY(vit_bicubic_aa(m->pos_buf.p + np * C, m->pos_buf.p + n, m->w.pos + np * C, C, g, g, gh, gw));
    else
        vit_bicubic(m->pos_buf.p + np * C, m->w.pos + np * C, C, g, g, gh, gw,
                    m->pos_rule == VIT_POS_HALF_PIXEL);
    m->pos_gh = (int)gh;
    m->pos_gw = (int)gw;
    m->pos_ver = m->wversion + 1;
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
    size_t N = (size_t)P + (size_t)m->n_prefix, C = (size_t)c->hidden_dim, K = 0, rows = 0, prow = 0,
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
    int probs = training && m->attention_dropout > 0.0f;
    ok = ok && vitc__mul_size(sz[VA_LSE], N, &sz[VA_PROBS]);
    /* Inference: what backward alone needs shares a buffer. */
    int alias[VA_COUNT] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    if (!training)
        alias[VA_LN2] = VA_LN1, alias[VA_HACT] = VA_HPRE, alias[VA_LSE] = VA_X;
    if (!probs)
        alias[VA_PROBS] = VA_X;
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
    a->B = B, a->N = (int64_t)N, a->P = P, a->training = training, a->probs = probs;
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

typedef struct vit_tokens_ctx {
    const vitc_vit *m;
    const float *proj; /* [B*P, C] */
    float *x;          /* [B, N, C] */
    int64_t P, N, C;
} vit_tokens_ctx;

/* Image b's tokens [cls, dist (DeiT), registers (DINOv2), patches] plus
 * the position embedding; registers get none, npos rows of it come before
 * the patches'. */
static void vit_tokens_task(void *ctx, int64_t b, int tid) {
    const vit_tokens_ctx *t = ctx;
    const vitc_vit *m = t->m;
    const float *pos = m->pos_used; /* [N, C] */
    int64_t C = t->C, np = m->n_prefix, npos = np - m->n_reg, nc = m->n_cls;
    float *xb = t->x + b * t->N * C; /* [N, C] */
    (void)tid;
    if (nc)
        for (int64_t j = 0; j < C; j++) xb[j] = m->w.cls[j] + pos[j];
    if (m->n_dist)
        for (int64_t j = 0; j < C; j++) xb[nc * C + j] = m->w.dist[j] + pos[nc * C + j];
    if (m->n_reg)
        memcpy(xb + npos * C, m->w.reg, (size_t)(m->n_reg * C) * sizeof(float));
    for (int64_t p = 0; p < t->P; p++) {
        const float *src = t->proj + (b * t->P + p) * C;
        float *dst = xb + (p + np) * C;
        for (int64_t j = 0; j < C; j++) dst[j] = src[j] + pos[(p + npos) * C + j];
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
        .scale = m->attn_scale > 0.0f ? m->attn_scale : 1.0f / sqrtf((float)d),
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

/* y = x W^T + b (+ res) (then the activation act, VITC__ACT_*) with block
 * l's weight k: its packed copy in an inference forward, else the
 * row-major W (fp32). */
static vitc_status vit_linear(const vitc_vit *m, int l, int k, float *y, int64_t ldy,
                              const float *x, int64_t ldx, const float *W, const float *b,
                              const float *res, int64_t ldr, int64_t M, int64_t N, int64_t K,
                              int act) {
    const vitc__pweight *pw = m->use_packed ? &m->pw[l * VIT_PW_COUNT + k] : NULL;
    return vitc__linear_pw(y, ldy, x, ldx, pw, W, b, res, ldr, M, N, K, act);
}

/* vit_linear of ln->y = LayerNorm(ln->x), that LayerNorm done with it. */
static vitc_status vit_linear_ln(const vitc_vit *m, int l, int k, float *y, int64_t ldy,
                                 const vitc__ln_pre *ln, const float *W, const float *b, int64_t M,
                                 int64_t N, int64_t K, int act) {
    const vitc__pweight *pw = m->use_packed ? &m->pw[l * VIT_PW_COUNT + k] : NULL;
    return vitc__linear_pw_ln(y, ldy, ln, pw, W, b, M, N, K, act);
}

/* y = res + gamma * (x W^T + b): DINOv2's layer scale, in the GEMM's
 * epilogue like the residual (vitc__linear_pw_scaled). */
static vitc_status vit_linear_ls(const vitc_vit *m, int l, int k, float *y, const float *x,
                                 int64_t ldx, const float *W, const float *b, const float *gamma,
                                 const float *res, int64_t ldr, int64_t M, int64_t N, int64_t K) {
    const vitc__pweight *pw = m->use_packed ? &m->pw[l * VIT_PW_COUNT + k] : NULL;
    return vitc__linear_pw_scaled(y, N, x, ldx, pw, W, b, gamma, res, ldr, M, N, K);
}

/* The MLP's activation as a kernel-table activation (VITC__ACT_*): erf
 * GELU, tanh-GELU (gelu_pytorch_tanh, SigLIP) or quick-GELU (x * sigmoid(1.702
 * x), OpenAI CLIP), vectorised and threaded (ops*.c). */
static int vit_act(const vitc_vit *m) {
    return m->mlp_act == VIT_ACT_QUICK_GELU  ? VITC__ACT_QUICK_GELU
           : m->mlp_act == VIT_ACT_GELU_TANH ? VITC__ACT_TANH_GELU
                                             : VITC__ACT_GELU;
}

static void vit_activation(const vitc_vit *m, float *x, int64_t n) {
    int act = vit_act(m);
    if (act == VITC__ACT_QUICK_GELU)
        vitc__quick_gelu(x, n);
    else if (act == VITC__ACT_TANH_GELU)
        vitc__tanh_gelu(x, n);
    else
        vitc__gelu(x, n);
}

static void vit_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* nn.MultiheadAttention's dropout of the attention probabilities: o of
 * every head again as dropout(P) V, P = sd->probs [B, H, N, N] kept as it
 * is for backward. One [N, N] scratch, heads one after another, each
 * product over the pool. */
vitc_status vitc__vit_attention_dropout(vitc_vit *m, const vitc__sdpa_desc *sd,
                                        const uint8_t *keep) {
    int64_t N = sd->S, d = sd->D, NN = N * N;
    VITC_TRY(vitc__buf_reserve(&m->pdrop, (size_t)NN));
    float *T = m->pdrop.p; /* [N, N] */
    for (int64_t b = 0; b < sd->B; b++)
        for (int64_t h = 0; h < sd->H; h++) {
            int64_t bh = b * sd->H + h;
            vitc__dropout_apply(T, sd->probs + bh * NN, keep + bh * NN, NN, m->attention_dropout);
            vitc__gemm(0, 0, N, d, N, 1.0f, T, N, sd->v + b * sd->v_sb + h * sd->v_sh, sd->v_sr,
                       0.0f, sd->o + b * sd->o_sb + h * sd->o_sh, sd->o_sr);
        }
    return VITC_OK;
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
    /* ln1 = LayerNorm(x), by the qkv GEMM's packers where it can (vitc__linear_pw_ln). */
    vitc__ln_pre n1 = {ln1, x, w->ln1_w, w->ln1_b, c->norm_eps};
    /* R rows go on past the attention, rs apart in the [B, N, .] buffers. */
    int64_t R = cls_only ? B : BN, rs = cls_only ? N : 1;
    if (cls_only && !m->use_packed) { /* k, v of every row (weight rows C..3C), q of the class rows */
        vitc__layernorm(ln1, x, w->ln1_w, w->ln1_b, BN, C, c->norm_eps);
        vitc__linear(qkv + C, 3 * C, ln1, C, w->qkv_w + C * C, w->qkv_b + C, NULL, 0, BN, 2 * C, C);
        vitc__linear(qkv, N * 3 * C, ln1, N * C, w->qkv_w, w->qkv_b, NULL, 0, B, C, C);
    } else { /* qkv [B, N, 3, H, d]: the kernel reads q, k, v of head h in place. Packed
              * weights are whole matrices: q of every row then (the same numbers). */
        VITC_TRY(vit_linear_ln(m, l, VIT_PW_QKV, qkv, 3 * C, &n1, w->qkv_w, w->qkv_b, BN, 3 * C, C,
                               0));
    }
    vitc__sdpa_desc sd = vitc__vit_attention(m, qkv, att, B, N, cls_only ? 1 : N);
    sd.probs = probs;
    sd.bf16 = m->attn_precision == VITC_PRECISION_BF16 && !a->training;
    sd.lse = vitc__va(a, l, VA_LSE); /* [B, H, N], training only */
    sd.lse_sb = c->num_heads * N;
    sd.lse_sh = N;
    vitc__vit_mask k = vitc__vit_block_mask(m, l); /* training with regularisation */
    if (k.probs) /* attention_dropout: the probabilities kept, o from the dropped ones */
        sd.probs = vitc__va(a, l, VA_PROBS);
    VITC_TRY(vitc__sdpa(&sd));
    if (k.probs) {
        vitc__dropout_mask(k.probs, B * c->num_heads * N * N, m->attention_dropout, &m->rng);
        VITC_TRY(vitc__vit_attention_dropout(m, &sd, k.probs));
    }
    if (k.att) { /* the branch alone, regularised, (layer-scaled,) then the residual */
        vitc__linear(mid, C, att, C, w->proj_w, w->proj_b, NULL, 0, R, C, C);
        vit_branch_forward(m, l, mid, k.att, k.dp_att);
        if (w->ls1)
            vitc__scale_add(mid, C, w->ls1, x, C, R, C);
        else
            vit_add(mid, x, R * C);
    } else if (w->ls1) { /* DINOv2: mid = x + ls1 * out_proj(att) */
        VITC_TRY(vit_linear_ls(m, l, VIT_PW_PROJ, mid, att, rs * C, w->proj_w, w->proj_b, w->ls1,
                               x, rs * C, R, C, C));
    } else {
        VITC_TRY(vit_linear(m, l, VIT_PW_PROJ, mid, C, att, rs * C, w->proj_w, w->proj_b, x,
                            rs * C, R, C, C, 0));
    }
    vitc__ln_pre n2 = {ln2, mid, w->ln2_w, w->ln2_b, c->norm_eps}; /* ln2 = LayerNorm(mid) */
    /* Inference: the activation in fc1's epilogue. Training keeps its input for backward. */
    int fused = hact == hpre && !m->swiglu;
    /* Training (row-major weights): hpre and GELU(hpre) from one epilogue. */
    int both = hact != hpre && m->mlp_act == VIT_ACT_GELU && !m->swiglu && !m->use_packed;
    if (both) {
        vitc__layernorm(ln2, mid, w->ln2_w, w->ln2_b, R, C, c->norm_eps);
        vitc__linear_act(hpre, M, hact, M, ln2, C, w->fc1_w, w->fc1_b, R, M, C);
    } else {
        VITC_TRY(vit_linear_ln(m, l, VIT_PW_FC1, hpre, M, &n2, w->fc1_w, w->fc1_b, R, M, C,
                               fused ? vit_act(m) : VITC__ACT_NONE));
        if (hact != hpre)
            memcpy(hact, hpre, (size_t)(R * M) * sizeof(float));
    }
    if (m->swiglu) { /* DINOv2 giant: [a, b] = chunk(fc1, 2); silu(a) * b, compacted in place */
        int64_t h2 = M / 2;
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < h2; j++) {
                float a0 = hact[r * M + j], b0 = hact[r * M + h2 + j];
                hact[r * h2 + j] = a0 / (1.0f + expf(-a0)) * b0;
            }
        M = h2; /* fc2 reads [R, M/2] */
    } else if (!fused && !both) {
        vit_activation(m, hact, R * M);
    }
    if (k.hid && m->dropout > 0.0f) { /* MLPBlock's Dropout after the GELU */
        vitc__dropout_mask(k.hid, R * M, m->dropout, &m->rng);
        vitc__dropout_apply(hact, hact, k.hid, R * M, m->dropout);
    }
    if (k.out) {
        vitc__linear(y, C, hact, M, w->fc2_w, w->fc2_b, NULL, 0, R, C, M);
        vit_branch_forward(m, l, y, k.out, k.dp_mlp);
        if (w->ls2)
            vitc__scale_add(y, C, w->ls2, mid, C, R, C);
        else
            vit_add(y, mid, R * C);
    } else if (w->ls2) { /* y = mid + ls2 * fc2(hact) */
        VITC_TRY(vit_linear_ls(m, l, VIT_PW_FC2, y, hact, M, w->fc2_w, w->fc2_b, w->ls2, mid, C,
                               R, C, M));
    } else {
        VITC_TRY(vit_linear(m, l, VIT_PW_FC2, y, C, hact, M, w->fc2_w, w->fc2_b, mid, C, R, C, M,
                            0));
    }
    if (out)
        *out = y;
    return VITC_OK;
}

/* A classifier: CLIP's projection and SigLIP's head give embeddings. */
int vitc_vit_has_head(const vitc_vit *m) {
    return m && (m->head == VIT_HEAD_CLS || m->head == VIT_HEAD_MEAN2 ||
                 m->head == VIT_HEAD_CLS_MEAN || m->head == VIT_HEAD_LINEAR);
}

/* Dinov2ForImageClassification: logits = head([h[:, 0], mean(h[:, np:])]),
 * h = ln(y) on every token (registers excluded from the mean). */
static vitc_status vit_logits_cls_mean(vitc_vit *m, const float *y, float *logits) {
    const vitc_vit_config *c = &m->cfg;
    int64_t B = m->a.B, N = m->a.N, C = c->hidden_dim, K = c->num_classes, np = m->n_prefix;
    size_t n, t;
    if (!vitc__mul_size((size_t)(B * N), (size_t)C, &n) ||
        !vitc__mul_size((size_t)B, (size_t)(2 * C), &t) || !vitc__add_size(n, t, &n))
        return vitc__err(VITC_ERR_NOMEM, "DINOv2 head for batch %lld overflows", (long long)B);
    VITC_TRY(vitc__buf_reserve(&m->feat_buf, n));
    float *h = m->feat_buf.p, *in = h + B * N * C; /* [B, N, C], [B, 2C] */
    vitc__layernorm(h, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
    for (int64_t b = 0; b < B; b++) {
        float *r = in + b * 2 * C;
        memcpy(r, h + b * N * C, (size_t)C * sizeof(float));
        for (int64_t j = 0; j < C; j++) r[C + j] = 0.0f;
        for (int64_t tk = np; tk < N; tk++)
            for (int64_t j = 0; j < C; j++) r[C + j] += h[(b * N + tk) * C + j];
        for (int64_t j = 0; j < C; j++) r[C + j] /= (float)(N - np);
    }
    vitc__linear(logits, K, in, 2 * C, m->w.head_w, m->w.head_b, NULL, 0, B, K, 2 * C);
    return VITC_OK;
}

/* DeiT with teacher: logits = (head(ln(x)[:, 0]) + head2(ln(x)[:, 1])) / 2,
 * y the last block's [B, N, C] output. */
static vitc_status vit_logits_mean2(vitc_vit *m, const float *y, float *logits) {
    const vitc_vit_config *c = &m->cfg;
    int64_t B = m->a.B, N = m->a.N, C = c->hidden_dim, K = c->num_classes;
    size_t n;
    if (!vitc__mul_size((size_t)B, (size_t)(2 * C + K), &n))
        return vitc__err(VITC_ERR_NOMEM, "DeiT heads for batch %lld overflow", (long long)B);
    VITC_TRY(vitc__buf_reserve(&m->feat_buf, n));
    float *t = m->feat_buf.p, *d = t + 2 * B * C; /* [B, 2, C], [B, K] */
    for (int64_t b = 0; b < B; b++)
        memcpy(t + b * 2 * C, y + b * N * C, (size_t)(2 * C) * sizeof(float));
    vitc__layernorm(t, t, m->w.ln_w, m->w.ln_b, 2 * B, C, c->norm_eps);
    vitc__linear(logits, K, t, 2 * C, m->w.head_w, m->w.head_b, NULL, 0, B, K, C);
    vitc__linear(d, K, t + C, 2 * C, m->w.head2_w, m->w.head2_b, NULL, 0, B, K, C);
    for (int64_t i = 0; i < B * K; i++) logits[i] = (logits[i] + d[i]) * 0.5f;
    return VITC_OK;
}

/* The whole forward. logits, attn, rollout, features ([B, N, C]: every
 * token after the final LayerNorm) may each be NULL. cls: the class tokens
 * after the final LayerNorm into m->a.cls_out [B, C] (embeddings that need
 * no other token: the last block then runs for the class rows only). */
static vitc_status vit_run(vitc_vit *m, const float *images, int B_, int H_, int W_, float *logits,
                           float *attn, float *rollout, float *features, int cls) {
    if (!m || !images)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT forward: NULL model or images");
    if (logits && !vitc_vit_has_head(m))
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT forward: this %s model is a backbone with no "
                         "classification head; ask for embeddings (vitc_vit_embed)", m->family);
    /* vitc_vit_reset_head's classifier over an embedding: no forward yet */
    if (m->head == VIT_HEAD_LINEAR)
        return vitc__err(VITC_ERR_UNSUPPORTED, "ViT forward: the classifier over this %s "
                         "model's embedding (vitc_vit_reset_head) has no forward yet", m->family);
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
    int64_t gh = H / p, gw = W / p, P = gh * gw, np = m->n_prefix, N = P + np, C = c->hidden_dim;
    int64_t Hh = c->num_heads, K = Cin * p * p;
    if (m->t2t && (gh != c->image_size / p || gw != c->image_size / p))
        return vitc__err(VITC_ERR_SHAPE, "T2T-ViT forward: images [%d, %d, %d, %d]: this model "
                         "takes %dx%d images (its sinusoid position table has %d tokens)", B_,
                         c->in_channels, H_, W_, c->image_size, c->image_size,
                         (c->image_size / c->patch_size) * (c->image_size / c->patch_size));
    /* A training forward of logits records every block for backward. */
    int record = m->training && logits && !attn && !rollout && !features;
    m->recorded = 0;
    /* Inference reads packed weights, (re)built once the parameters moved.
     * fp32 can do without them (same numbers from the row-major ones). */
    if (m->training) {
        m->use_packed = 0;
        vitc__vit_rowmajor(m);
    } else {
        VITC_TRY(vitc__vit_prepare_inference(m));
    }
    VITC_TRY(vit_activations(m, B, P, record));
    VITC_TRY(vit_position_embedding(m, gh, gw));
    const vitc__vit_acts *a = &m->a;
    m->mask_stride = 0;
    if (record && (m->dropout > 0.0f || m->drop_path > 0.0f || m->attention_dropout > 0.0f)) {
        /* Keep masks, bytes: the embedding's, then per block (vitc__vit_mask). */
        size_t BNC, BNM, BHNN = 0, per = 0, total = 0;
        int ok = vitc__mul_size((size_t)(B * N), (size_t)C, &BNC) &&
                 vitc__mul_size((size_t)(B * N), (size_t)c->mlp_dim, &BNM) &&
                 (!a->probs || vitc__mul_size((size_t)(B * N * Hh), (size_t)N, &BHNN)) &&
                 vitc__add_size(2 * BNC, BNM, &per) && vitc__add_size(per, 2 * (size_t)B, &per) &&
                 vitc__add_size(per, BHNN, &per) &&
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

    float *proj = vitc__va(a, 0, VA_LN1); /* [B*P, C] */
    if (m->t2t) { /* T2T-ViT: its tokens_to_token module (t2t_vit.c) */
        VITC_TRY(vitc__t2t_tokens(m, images, B, H, W, proj));
    } else { /* Patch embedding: conv k = s = p is one GEMM over im2col rows. */
        vit_im2col_ctx ic = {a->patches, images, Cin, H, W, p, gh, gw};
        vitc__parallel_for(B * gh, vit_im2col_task, &ic);
        VITC_TRY(vitc__linear_pw(proj, C, a->patches, K, m->pconv.data ? &m->pconv : NULL,
                                 m->w.conv_w, m->w.conv_b, NULL, 0, B * P, C, K, 0));
    }
    /* [cls, dist (DeiT), registers (DINOv2), patches] plus position embeddings */
    vit_tokens_ctx tc = {m, proj, vitc__va(a, 0, VA_X), P, N, C};
    vitc__parallel_for(B, vit_tokens_task, &tc);

    if (m->pre_norm) /* CLIP's pre_layrnorm */
        vitc__layernorm(vitc__va(a, 0, VA_X), vitc__va(a, 0, VA_X), m->w.pre_w, m->w.pre_b, B * N, C,
                        c->norm_eps);
    uint8_t *emb = vitc__vit_emb_mask(m); /* Encoder's dropout(input + pos) */
    if (emb && m->dropout > 0.0f) {
        vitc__dropout_mask(emb, B * N * C, m->dropout, &m->rng);
        vitc__dropout_apply(vitc__va(a, 0, VA_X), vitc__va(a, 0, VA_X), emb, B * N * C, m->dropout);
    }

    /* Logits and class-token embeddings need only the class tokens out of
     * the last block; the maps need every row. So does a training forward
     * whose last block is regularised (masks over every row); else backward
     * reads the class rows alone too (vit_backward.c). */
    const float *y = NULL; /* the last block's output: [B, C] cls_only, else [B, N, C] */
    int compact = ((logits && m->head == VIT_HEAD_CLS) || cls) && !features && !attn &&
                  !rollout && m->n_cls &&
                  (!record || (m->dropout == 0.0f && m->drop_path == 0.0f &&
                               m->attention_dropout == 0.0f));
    for (int l = 0; l < c->depth; l++) {
        int cls_only = compact && l == c->depth - 1;
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
    if (features && m->final_cls_only) /* CLIP's last_hidden_state is not normed */
        memcpy(features, y, (size_t)(B * N * C) * sizeof(float));
    else if (features) /* HF's last_hidden_state: every token through the final LayerNorm */
        vitc__layernorm(features, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
    if (logits && m->head == VIT_HEAD_MEAN2) {
        VITC_TRY(vit_logits_mean2(m, y, logits));
    } else if (logits && m->head == VIT_HEAD_CLS_MEAN) {
        VITC_TRY(vit_logits_cls_mean(m, y, logits));
    } else if (logits || cls) {
        int64_t ys = compact ? C : N * C; /* class rows of y */
        for (int64_t b = 0; b < B; b++)
            memcpy(a->cls_in + b * C, y + b * ys, (size_t)C * sizeof(float));
        vitc__layernorm(a->cls_out, a->cls_in, m->w.ln_w, m->w.ln_b, B, C, c->norm_eps);
    }
    if (logits && m->head == VIT_HEAD_CLS) {
        VITC_TRY(vitc__linear_pw(logits, c->num_classes, a->cls_out, C,
                                 m->phead.data ? &m->phead : NULL, m->w.head_w, m->w.head_b, NULL,
                                 0, B, c->num_classes, C, 0));
    }
    if (record) {
        m->recorded = 1;
        m->rec_cls_only = compact;
        m->rec_gh = (int)gh;
        m->rec_gw = (int)gw;
    }
    return VITC_OK;
}

vitc_status vitc_vit_forward(vitc_vit *m, const float *images, int B, int H, int W,
                             float *logits) {
    if (!logits)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_forward: NULL logits");
    return vit_run(m, images, B, H, W, logits, NULL, NULL, NULL, 0);
}

vitc_status vitc_vit_attention_maps(vitc_vit *m, const float *images, int B, int H, int W,
                                    float *attn, float *rollout) {
    if (!attn && !rollout)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_attention_maps: attn and rollout are "
                                               "both NULL");
    return vit_run(m, images, B, H, W, NULL, attn, rollout, NULL, 0);
}

/* ------------------------------------------------------------------ */
/* Embeddings                                                         */
/* ------------------------------------------------------------------ */

int vitc_vit_num_prefix_tokens(const vitc_vit *m) { return m ? m->n_prefix : 0; }
/* A classifier: CLIP's projection gives an embedding, not logits. */


/* SigLIP's attention-pooling head (SiglipMultiheadAttentionPoolingHead) on
 * the normed tokens h [B, N, C]:
 *   a = out_proj(MHA(query = probe, keys and values = h))   [B, C]
 *   out = a + fc2(act(fc1(layernorm(a))))                   [B, C] */
static vitc_status vit_map_head(vitc_vit *m, const float *h, int64_t B, int64_t N, float *out) {
    const vitc_vit_config *c = &m->cfg;
    int64_t C = c->hidden_dim, M = c->mlp_dim, Hh = c->num_heads, d = C / Hh;
    size_t kv, rest, n;
    if (!vitc__mul_size((size_t)(B * N), (size_t)(2 * C), &kv) ||
        !vitc__mul_size((size_t)B, (size_t)(4 * C + M), &rest) || !vitc__add_size(kv, rest, &n))
        return vitc__err(VITC_ERR_NOMEM, "attention-pooling head for [%lld, %lld, %lld] overflows",
                         (long long)B, (long long)N, (long long)C);
    VITC_TRY(vitc__buf_reserve(&m->head_buf, n));
    float *k = m->head_buf.p, *q = k + kv, *att = q + B * C, *a = att + B * C, *ln = a + B * C;
    float *hid = ln + B * C;
    /* One query per image (the probe), keys and values from every token. */
    vitc__linear(q, C, m->w.map_probe, C, m->w.map_qkv_w, m->w.map_qkv_b, NULL, 0, 1, C, C);
    for (int64_t b = 1; b < B; b++) memcpy(q + b * C, q, (size_t)C * sizeof(float));
    vitc__linear(k, 2 * C, h, C, m->w.map_qkv_w + C * C, m->w.map_qkv_b + C, NULL, 0, B * N, 2 * C,
                 C);
    vitc__sdpa_desc sd = {
        .B = B, .H = Hh, .L = 1, .S = N, .D = d, .Dv = d,
        .q = q, .q_sb = C, .q_sh = d, .q_sr = C,
        .k = k, .k_sb = N * 2 * C, .k_sh = d, .k_sr = 2 * C,
        .v = k + C, .v_sb = N * 2 * C, .v_sh = d, .v_sr = 2 * C,
        .o = att, .o_sb = C, .o_sh = d, .o_sr = C,
        .scale = 1.0f / sqrtf((float)d),
    };
    VITC_TRY(vitc__sdpa(&sd));
    vitc__linear(a, C, att, C, m->w.map_proj_w, m->w.map_proj_b, NULL, 0, B, C, C);
    vitc__layernorm(ln, a, m->w.map_ln_w, m->w.map_ln_b, B, C, c->norm_eps);
    vitc__linear(hid, M, ln, C, m->w.map_fc1_w, m->w.map_fc1_b, NULL, 0, B, M, C);
    vit_activation(m, hid, B * M);
    vitc__linear(out, C, hid, M, m->w.map_fc2_w, m->w.map_fc2_b, a, C, B, C, M);
    return VITC_OK;
}
const char *vitc_vit_family(const vitc_vit *m) { return m ? m->family : NULL; }
int vitc_vit_num_ignored(const vitc_vit *m) { return m ? m->n_ignored : 0; }

const char *vitc_vit_ignored(const vitc_vit *m, int i) {
    if (!m || i < 0 || i >= m->n_ignored)
        return NULL;
    const char *p = m->ignored;
    while (i--) p += strlen(p) + 1;
    return p;
}

vitc_status vitc_vit_forward_features(vitc_vit *m, const float *images, int B, int H, int W,
                                      float *out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_forward_features: NULL out");
    return vit_run(m, images, B, H, W, NULL, NULL, NULL, out, 0);
}

vitc_status vitc_vit_embed_size(const vitc_vit *m, vitc_pool pool, int H, int W, int64_t *floats) {
    if (!m || !floats)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed_size: NULL argument");
    int64_t C = m->cfg.hidden_dim, p = m->cfg.patch_size;
    if (H < p || W < p)
        return vitc__err(VITC_ERR_SHAPE, "vitc_vit_embed_size: %dx%d is smaller than the patch "
                         "size %lld", H, W, (long long)p);
    switch (pool) {
    case VITC_POOL_DEFAULT:
        *floats = m->head == VIT_HEAD_PROJ ? m->cfg.num_classes : C;
        return VITC_OK;
    case VITC_POOL_CLS:
    case VITC_POOL_MEAN: *floats = C; return VITC_OK;
    case VITC_POOL_TOKENS: *floats = (int64_t)(H / p) * (W / p) * C; return VITC_OK;
    }
    return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: unknown pool %d", (int)pool);
}

vitc_status vitc_vit_embed(vitc_vit *m, const float *images, int B, int H, int W, vitc_pool pool,
                           float *out) {
    int64_t per;
    if (!m || !images || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: NULL argument");
    if (B < 1)
        return vitc__err(VITC_ERR_SHAPE, "vitc_vit_embed: batch %d must be positive", B);
    VITC_TRY(vitc_vit_embed_size(m, pool, H, W, &per));
    int64_t C = m->cfg.hidden_dim, p = m->cfg.patch_size, P = (int64_t)(H / p) * (W / p);
    int64_t np = m->n_prefix, N = P + np;
    size_t n;
    if (!vitc__mul_size((size_t)B * (size_t)N, (size_t)C, &n))
        return vitc__err(VITC_ERR_NOMEM, "vitc_vit_embed: [%d, %lld, %lld] overflows", B,
                         (long long)N, (long long)C);
    if (pool == VITC_POOL_CLS && !m->n_cls)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: this %s model has no class token "
                         "(pool default, mean or tokens)", m->family);
    if (pool == VITC_POOL_DEFAULT && !m->n_cls && m->head != VIT_HEAD_MAP)
        pool = VITC_POOL_MEAN; /* no class token, no head: the mean of the tokens */
    if (pool == VITC_POOL_CLS || (pool == VITC_POOL_DEFAULT && m->head != VIT_HEAD_MAP)) {
        /* The class token after the final LayerNorm (CLIP's post_layernorm),
         * projected for CLIP's image_embeds: the last block's other rows are
         * not needed, so it runs for the class rows only. */
        VITC_TRY(vit_run(m, images, B, H, W, NULL, NULL, NULL, NULL, 1));
        if (pool == VITC_POOL_DEFAULT && m->head == VIT_HEAD_PROJ)
            vitc__linear(out, per, m->a.cls_out, C, m->w.head_w, m->w.head_b, NULL, 0, B, per, C);
        else
            memcpy(out, m->a.cls_out, (size_t)(B * C) * sizeof(float));
        return VITC_OK;
    }
    /* feat_buf is the DeiT heads' scratch, unused on this path. */
    VITC_TRY(vitc__buf_reserve(&m->feat_buf, n));
    float *f = m->feat_buf.p;
    VITC_TRY(vit_run(m, images, B, H, W, NULL, NULL, NULL, f, 0));
    if (pool == VITC_POOL_DEFAULT) /* SigLIP */
        return vit_map_head(m, f, B, N, out);
    for (int64_t b = 0; b < B; b++) {
        const float *fb = f + b * N * C;
        float *o = out + b * per;
        if (pool == VITC_POOL_TOKENS) {
            memcpy(o, fb + np * C, (size_t)(P * C) * sizeof(float));
        } else { /* mean of the normed patch tokens */
            for (int64_t j = 0; j < C; j++) o[j] = 0.0f;
            for (int64_t t = np; t < N; t++)
                for (int64_t j = 0; j < C; j++) o[j] += fb[t * C + j];
            for (int64_t j = 0; j < C; j++) o[j] /= (float)P;
        }
    }
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* The model's own image processor (Hub models)                       */
/* ------------------------------------------------------------------ */

int vitc_vit_has_processor(const vitc_vit *m) { return m && m->proc.present; }

int vitc_vit_image_flags(const vitc_vit *m) {
    return m && m->proc.present && m->proc.convert_rgb ? VITC_IMAGE_ALPHA_WHITE : 0;
}

vitc_status vitc_vit_preprocess_size(const vitc_vit *m, int width, int height, int *H, int *W) {
    int rh, rw;
    if (!m || !H || !W)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_preprocess_size: NULL argument");
    if (!m->proc.present)
        return vitc__err(VITC_ERR_INVALID_ARG, "this %s model has no image processor", m->family);
    if (width < 1 || height < 1)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d is empty", width, height);
    return vitc__hf_output_size(&m->proc, width, height, H, W, &rh, &rw);
}

vitc_status vitc_vit_preprocess(const vitc_vit *m, const vitc_image *img, float *out) {
    if (!m || !img || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_preprocess: NULL argument");
    if (!m->proc.present)
        return vitc__err(VITC_ERR_INVALID_ARG, "this %s model has no image processor", m->family);
    return vitc__hf_preprocess(&m->proc, img, out);
}
