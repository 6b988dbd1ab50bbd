/*
 * t2t_vit.c — T2T-ViT (yitu-opensource/T2T-ViT, the source of seed 003's
 * Attention): its tokens_to_token module in place of the patch embedding,
 * then the one ViT encoder of vit.c (timm-named pre-norm blocks, LayerNorm
 * eps 1e-5, attention scale qk_scale or head_dim^-0.5):
 *
 *   x = unfold(images, k 7, s 4, pad 2)          [B, (H/4)^2, in*49]
 *   x = attention1(x)                            [B, (H/4)^2, T]
 *   x = unfold(x as [B, T, H/4, W/4], 3, 2, 1)   [B, (H/8)^2, 9T]
 *   x = attention2(x)                            [B, (H/8)^2, T]
 *   x = unfold(x as [B, T, H/8, W/8], 3, 2, 1)   [B, (H/16)^2, 9T]
 *   x = project(x)                               [B, (H/16)^2, C]
 *   then [cls, x] + pos_embed (the sinusoid table the checkpoint holds),
 *   the blocks, norm, head(x[:, 0])   (vit.c)
 *
 * A stage is a Token_transformer (tokens_type "transformer", t2t_vit_t_*):
 *   x = Attention(norm1(x))  the engine's T2TAttention (src/layers): qkv
 *                            without bias, softmax(q k^T dim^-0.5) v, proj,
 *                            + v (the V skip: the width changes dim -> T)
 *   x = x + mlp(norm2(x))    fc1, GELU, fc2 (mlp_ratio 1)
 * or a Token_performer ("performer", t2t_vit_*), one head of random-feature
 * attention:
 *   k, q, v = split(kqv(norm1(x)))                [B, L, T] each, that order
 *   phi(u) = exp(u w^T - |u|^2 / 2) / sqrt(m)     w [m, T] (stored), m = T/2
 *   y = phi(q) (phi(k)^T v) / (phi(q) . sum_t phi(k)_t + 1e-8)
 *   x = v + proj(y);  x = x + mlp(norm2(x))       mlp.0, GELU, mlp.2
 *
 * The checkpoint keeps its own names (tokens_to_token.attention1...,
 * blocks.N...); vitc.config holds T2T_ViT's constructor arguments. Its
 * names, presets and configuration are the family's (families/t2t.c).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "../layers/layers.h"
#include "vit_internal.h"

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

vitc_status vitc__t2t_ready(vitc_vit *m) {
    if (m->t2t != VIT_NAMES_T2T_TRANSFORMER)
        return VITC_OK;
    for (int s = 0; s < 2; s++) {
        /* Token_transformer's Attention: head_dim = dim // num_heads of
         * the *input* width, so the scale is dim^-0.5, not T^-0.5. */
        vitc_layer_config lc = vitc_layer_default_config(VITC_T2T_ATTENTION);
        lc.in_channels = (int)vitc__t2t_stage_dim(m, s);
        lc.embed_dim = m->t2t_dim;
        lc.num_heads = 1;
        lc.bias = 0;
        lc.qk_scale = (float)pow((double)lc.in_channels, -0.5);
        VITC_TRY(vitc_layer_create(&lc, &m->t2t_attn[s]));
        vitc_layer_set_training(m->t2t_attn[s], 0);
    }
    return VITC_OK;
}

void vitc__t2t_free(vitc_vit *m) {
    for (int s = 0; s < 2; s++) {
        vitc_layer_free(m->t2t_attn[s]);
        m->t2t_attn[s] = NULL;
    }
    vitc__buf_free(&m->t2t_buf);
}

/* The engine layers' weights from the table, again whenever the model's
 * parameters moved (vitc_vit_param hands out writable pointers). */
static vitc_status t2t_sync(vitc_vit *m) {
    if (m->t2t != VIT_NAMES_T2T_TRANSFORMER || m->t2t_synced == m->wversion + 1)
        return VITC_OK;
    for (int s = 0; s < 2; s++) {
        const vitc__t2t_stage *w = &m->w.t2t[s];
        int64_t T = m->t2t_dim, qs[2] = {3 * T, vitc__t2t_stage_dim(m, s)}, ps[2] = {T, T}, bs[1] = {T};
        const char *names[3] = {"qkv.weight", "proj.weight", "proj.bias"};
        int nd[3] = {2, 2, 1};
        const int64_t *shapes[3] = {qs, ps, bs};
        const float *data[3] = {w->qkv_w, w->proj_w, w->proj_b};
        VITC_TRY(vitc_layer_load(m->t2t_attn[s], 3, names, nd, shapes, data, 1));
    }
    m->t2t_synced = m->wversion + 1;
    return VITC_OK;
}

/* nn.Unfold(k, stride s, padding p) of src, read as [B, C, h, w] (an image,
 * or tokens [B, h*w, C] when tokens), into rows [B, oh*ow, C*k*k] ordered
 * (c, ky, kx) as Unfold's output transposed; zeros outside. */
typedef struct t2t_unfold_ctx {
    float *dst;
    const float *src;
    int64_t C, h, w, k, s, p, oh, ow;
    int tokens;
} t2t_unfold_ctx;

static void t2t_unfold_task(void *ctx, int64_t i, int tid) {
    const t2t_unfold_ctx *u = ctx;
    (void)tid;
    int64_t b = i / u->oh, oy = i % u->oh, K = u->C * u->k * u->k;
    for (int64_t ox = 0; ox < u->ow; ox++) {
        float *d = u->dst + ((b * u->oh + oy) * u->ow + ox) * K; /* [C, k, k] */
        for (int64_t c = 0; c < u->C; c++)
            for (int64_t ky = 0; ky < u->k; ky++) {
                int64_t y = oy * u->s - u->p + ky;
                for (int64_t kx = 0; kx < u->k; kx++) {
                    int64_t x = ox * u->s - u->p + kx;
                    float v = 0.0f;
                    if (y >= 0 && y < u->h && x >= 0 && x < u->w)
                        v = u->tokens ? u->src[((b * u->h + y) * u->w + x) * u->C + c]
                                      : u->src[((b * u->C + c) * u->h + y) * u->w + x];
                    d[(c * u->k + ky) * u->k + kx] = v;
                }
            }
    }
}

static void t2t_unfold(float *dst, const float *src, int tokens, int64_t B, int64_t C, int64_t h,
                       int64_t w, int64_t k, int64_t s, int64_t p, int64_t oh, int64_t ow) {
    t2t_unfold_ctx u = {dst, src, C, h, w, k, s, p, oh, ow, tokens};
    vitc__parallel_for(B * oh, t2t_unfold_task, &u);
}

/* Token_performer's attention on kqv [B, L, 3T] (rows k | q | v) into
 * out [B*L, T] = v + proj(y); fp scratch: kp, qp [B*L, m], ksum [m],
 * D [L], kptv [T, m], y [B*L, T]. */
static void t2t_performer(const vitc__t2t_stage *w, const float *kqv, int64_t B, int64_t L,
                          int64_t T, float *kp, float *qp, float *ksum, float *D, float *kptv,
                          float *y, float *out) {
    int64_t mm = T / 2, M = B * L, W3 = 3 * T;
    const float *k = kqv, *q = kqv + T, *v = kqv + 2 * T; /* [M, T] at stride 3T */
    float sqrt_m = (float)sqrt((double)mm);
    /* phi(u) = exp(u w^T - |u|^2 / 2) / sqrt(m), as prm_exp computes it */
    for (int pass = 0; pass < 2; pass++) {
        const float *u = pass ? q : k;
        float *ph = pass ? qp : kp; /* [M, m] */
        vitc__linear(ph, mm, u, W3, w->prm, NULL, NULL, 0, M, mm, T);
        for (int64_t r = 0; r < M; r++) {
            float xd = 0.0f;
            for (int64_t j = 0; j < T; j++) xd += u[r * W3 + j] * u[r * W3 + j];
            xd /= 2.0f;
            for (int64_t j = 0; j < mm; j++) ph[r * mm + j] = expf(ph[r * mm + j] - xd) / sqrt_m;
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const float *kb = kp + b * L * mm, *qb = qp + b * L * mm; /* [L, m] */
        const float *vb = v + b * L * W3;                         /* [L, T] at stride 3T */
        float *yb = y + b * L * T;                                /* [L, T] */
        for (int64_t j = 0; j < mm; j++) ksum[j] = 0.0f;
        for (int64_t t = 0; t < L; t++)
            for (int64_t j = 0; j < mm; j++) ksum[j] += kb[t * mm + j];
        for (int64_t t = 0; t < L; t++) { /* D = phi(q) . sum_t phi(k) */
            float d = 0.0f;
            for (int64_t j = 0; j < mm; j++) d += qb[t * mm + j] * ksum[j];
            D[t] = d;
        }
        /* kptv [T, m] = v^T phi(k); y [L, T] = phi(q) kptv^T / (D + eps) */
        vitc__gemm(1, 0, T, mm, L, 1.0f, vb, W3, kb, mm, 0.0f, kptv, mm);
        vitc__gemm(0, 1, L, T, mm, 1.0f, qb, mm, kptv, mm, 0.0f, yb, T);
        for (int64_t t = 0; t < L; t++) {
            float den = D[t] + 1e-8f;
            for (int64_t j = 0; j < T; j++) yb[t * T + j] /= den;
        }
    }
    vitc__linear(out, T, y, T, w->proj_w, w->proj_b, v, W3, M, T, T); /* v + proj(y) */
}

/* One stage on x [B, L, dim] into out [B*L, T]; sc: the scratch carved by
 * vitc__t2t_tokens. */
typedef struct t2t_scratch {
    float *ln;          /* [B*L, dim] norm1(x) */
    float *att;         /* [B*L, T] the attention's output (with its V skip) */
    float *h, *hid;     /* [B*L, T] norm2(att), the MLP's hidden (the performer's y first) */
    float *kqv;         /* [B*L, 3T] performer: k | q | v */
    float *kp, *qp;     /* [B*L, m] performer: phi(k), phi(q) */
    float *ksum, *D;    /* [m], [L] performer: sum_t phi(k), the normaliser */
    float *kptv;        /* [T, m] performer: v^T phi(k) of one image */
} t2t_scratch;

static vitc_status t2t_stage(vitc_vit *m, int s, float *x, int64_t B, int64_t L,
                             const t2t_scratch *sc, float *out) {
    const vitc__t2t_stage *w = &m->w.t2t[s];
    int64_t dim = vitc__t2t_stage_dim(m, s), T = m->t2t_dim, M = B * L;
    vitc__layernorm(sc->ln, x, w->n1_w, w->n1_b, M, dim, m->cfg.norm_eps);
    if (m->t2t == VIT_NAMES_T2T_TRANSFORMER) {
        int64_t shape[3] = {B, L, dim};
        VITC_TRY(vitc_layer_forward(m->t2t_attn[s], sc->ln, 3, shape, sc->att));
    } else {
        vitc__linear(sc->kqv, 3 * T, sc->ln, dim, w->qkv_w, w->qkv_b, NULL, 0, M, 3 * T, dim);
        t2t_performer(w, sc->kqv, B, L, T, sc->kp, sc->qp, sc->ksum, sc->D, sc->kptv, sc->hid,
                      sc->att);
    }
    /* x = att + fc2(gelu(fc1(norm2(att)))) */
    vitc__layernorm(sc->h, sc->att, w->n2_w, w->n2_b, M, T, m->cfg.norm_eps);
    vitc__linear(sc->hid, T, sc->h, T, w->fc1_w, w->fc1_b, NULL, 0, M, T, T);
    vitc__gelu(sc->hid, M * T);
    vitc__linear(out, T, sc->hid, T, w->fc2_w, w->fc2_b, sc->att, T, M, T, T);
    return VITC_OK;
}

/* Output side of nn.Unfold(k, s, p) over n. */
static int64_t t2t_out(int64_t n, int64_t k, int64_t s, int64_t p) { return (n + 2 * p - k) / s + 1; }

vitc_status vitc__t2t_tokens(vitc_vit *m, const float *images, int64_t B, int64_t H, int64_t W,
                             float *out) {
    int64_t Cin = m->cfg.in_channels, T = m->t2t_dim, C = m->cfg.hidden_dim, mm = T / 2;
    int64_t h1 = t2t_out(H, 7, 4, 2), w1 = t2t_out(W, 7, 4, 2);
    int64_t h2 = t2t_out(h1, 3, 2, 1), w2 = t2t_out(w1, 3, 2, 1);
    int64_t h3 = t2t_out(h2, 3, 2, 1), w3 = t2t_out(w2, 3, 2, 1);
    int64_t L1 = h1 * w1, L2 = h2 * w2, L3 = h3 * w3, d0 = 49 * Cin, d1 = 9 * T;
    VITC_TRY(t2t_sync(m));
    /* Regions: the unfolded rows (the widest stage input), norm1's output,
     * the stage's attention / output, norm2, the MLP's hidden, and the
     * performer's kqv, features and sums; sized for stage 1, the longest. */
    size_t rows = (size_t)(B * L1), widest = (size_t)(d0 > d1 ? d0 : d1);
    vitc__carve cv = {0, 1};
    size_t o_cols = vitc__take(&cv, rows, widest), o_ln = vitc__take(&cv, rows, widest);
    size_t o_att = vitc__take(&cv, rows, (size_t)T), o_h = vitc__take(&cv, rows, (size_t)T);
    size_t o_hid = vitc__take(&cv, rows, (size_t)T), o_x = vitc__take(&cv, rows, (size_t)T);
    size_t o_kqv = 0, o_kp = 0, o_qp = 0, o_ks = 0, o_D = 0, o_kv = 0;
    if (m->t2t == VIT_NAMES_T2T_PERFORMER) {
        o_kqv = vitc__take(&cv, rows, (size_t)(3 * T));
        o_kp = vitc__take(&cv, rows, (size_t)mm);
        o_qp = vitc__take(&cv, rows, (size_t)mm);
        o_ks = vitc__take(&cv, 1, (size_t)mm);
        o_D = vitc__take(&cv, (size_t)L1, 1);
        o_kv = vitc__take(&cv, (size_t)T, (size_t)mm);
    }
    if (!cv.ok) /* cols also holds the later, smaller unfolds (L3 <= L2 <= L1) */
        return vitc__err(VITC_ERR_NOMEM, "T2T-ViT tokens for [%lld, %lld, %lld, %lld] overflow",
                         (long long)B, (long long)Cin, (long long)H, (long long)W);
    VITC_TRY(vitc__buf_reserve(&m->t2t_buf, cv.used));
    float *base = m->t2t_buf.p; /* the regions above */
    t2t_scratch sc = {base + o_ln, base + o_att, base + o_h, base + o_hid, base + o_kqv,
                      base + o_kp, base + o_qp, base + o_ks, base + o_D, base + o_kv};
    float *cols = base + o_cols, *x = base + o_x; /* [B*L, dim], [B*L, T] */
    t2t_unfold(cols, images, 0, B, Cin, H, W, 7, 4, 2, h1, w1);       /* soft_split0 */
    VITC_TRY(t2t_stage(m, 0, cols, B, L1, &sc, x));                   /* attention1 */
    t2t_unfold(cols, x, 1, B, T, h1, w1, 3, 2, 1, h2, w2);            /* soft_split1 */
    VITC_TRY(t2t_stage(m, 1, cols, B, L2, &sc, x));                   /* attention2 */
    t2t_unfold(cols, x, 1, B, T, h2, w2, 3, 2, 1, h3, w3);            /* soft_split2 */
    vitc__linear(out, C, cols, d1, m->w.t2t_proj_w, m->w.t2t_proj_b, NULL, 0, B * L3, C, d1);
    return VITC_OK;
}
