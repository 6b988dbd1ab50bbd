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
 *   x = Attention(norm1(x))  T2TAttention (nn/attn.c's sublayer with the V skip): qkv
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


#include "../carve.h"
#include "../nn/nn.h"
#include "vit_internal.h"

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */



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

/* One stage's activations: its input rows (an unfold) cols [B*L, dim],
 * norm1's ln [B*L, dim], the attention's qkv [B*L, 3T], o [B*L, T], lse
 * [B, L] (training), a = its output with the V skip [B*L, T], norm2's h,
 * the MLP's hpre / hact (the same in inference), out [B*L, T]; and the
 * performer's kqv, phi(k), phi(q) [B*L, m], ksum [m], D [L], kptv [T, m]. */
typedef struct t2t_acts {
    float *cols, *ln, *qkv, *o, *lse, *a, *h, *hpre, *hact, *out;
    float *kqv, *kp, *qp, *ksum, *D, *kptv;
} t2t_acts;

static vitc__nn_attn t2t_attn(const vitc_vit *m, const vitc__t2t_stage *w, int s, int64_t B,
                              int64_t L) {
    /* Token_transformer's Attention: head_dim = dim // num_heads of the
     * *input* width, so the scale is dim^-0.5, not T^-0.5; one head. */
    int64_t dim = vitc__t2t_stage_dim(m, s), T = m->t2t_dim;
    vitc__nn_attn p = {.qkv_w = w->qkv_w, .out_w = w->proj_w, .out_b = w->proj_b, .B = B,
                       .N = L, .Cin = dim, .D = T, .Cout = T, .H = 1,
                       .scale = (float)pow((double)dim, -0.5), .v_skip = 1};
    return p;
}

static vitc__nn_mlp t2t_mlp(const vitc_vit *m, const vitc__t2t_stage *w) {
    vitc__nn_mlp p = {.fc1_w = w->fc1_w, .fc1_b = w->fc1_b, .fc2_w = w->fc2_w, .fc2_b = w->fc2_b,
                      .C = m->t2t_dim, .M = m->t2t_dim, .act = VITC__NN_GELU};
    return p;
}

/* One stage on t->cols [B, L, dim] into t->out [B*L, T]. */
static vitc_status t2t_stage(const vitc_vit *m, vitc__session *ss, int s, int64_t B, int64_t L,
                             const t2t_acts *t) {
    const vitc__t2t_stage *w = &m->w.t2t[s];
    int64_t dim = vitc__t2t_stage_dim(m, s), T = m->t2t_dim, M = B * L;
    vitc__layernorm(t->ln, t->cols, w->n1_w, w->n1_b, M, dim, m->cfg.norm_eps);
    if (m->t2t == VIT_NAMES_T2T_TRANSFORMER) {
        vitc__nn_attn p = t2t_attn(m, w, s, B, L);
        vitc__nn_attn_rec r = {t->qkv, t->o, t->lse};
        VITC_TRY(vitc__nn_attn_forward(&p, t->a, t->ln, &r, &ss->mask_buf));
    } else {
        vitc__linear(t->kqv, 3 * T, t->ln, dim, w->qkv_w, w->qkv_b, NULL, 0, M, 3 * T, dim);
        t2t_performer(w, t->kqv, B, L, T, t->kp, t->qp, t->ksum, t->D, t->kptv, t->hpre, t->a);
    }
    /* x = a + fc2(gelu(fc1(norm2(a)))) */
    vitc__layernorm(t->h, t->a, w->n2_w, w->n2_b, M, T, m->cfg.norm_eps);
    vitc__nn_mlp f = t2t_mlp(m, w);
    vitc__nn_mlp_forward(&f, t->out, t->h, t->a, M, t->hpre, t->hact);
    return VITC_OK;
}

/* The unfolds' geometry for H x W images: stage s reads L[s] rows of
 * width d[s] on a grid gh[s] x gw[s] (s = 2: project's input). */
typedef struct t2t_geo {
    int64_t gh[4], gw[4], L[3], d[3];
} t2t_geo;

static t2t_geo t2t_geometry(const vitc_vit *m, int64_t H, int64_t W) {
    t2t_geo g;
    int64_t T = m->t2t_dim;
    g.gh[0] = H, g.gw[0] = W;
    g.gh[1] = vitc__nn_unfold_out(H, 7, 4, 2), g.gw[1] = vitc__nn_unfold_out(W, 7, 4, 2);
    for (int i = 2; i < 4; i++) {
        g.gh[i] = vitc__nn_unfold_out(g.gh[i - 1], 3, 2, 1);
        g.gw[i] = vitc__nn_unfold_out(g.gw[i - 1], 3, 2, 1);
    }
    for (int i = 0; i < 3; i++) g.L[i] = g.gh[i + 1] * g.gw[i + 1];
    g.d[0] = 49 * m->cfg.in_channels, g.d[1] = g.d[2] = 9 * T;
    return g;
}

/* Carves ss->t2t_buf: inference one set of stage regions (stage 1 the
 * longest) shared by both stages, cols also holding the later unfolds;
 * training (record, transformer mode) each stage its own, and cols3. */
static vitc_status t2t_carve(const vitc_vit *m, vitc__session *ss, int64_t B, const t2t_geo *g,
                             int record, t2t_acts t[2], float **cols3) {
    int64_t T = m->t2t_dim, mm = T / 2;
    int perf = m->t2t == VIT_NAMES_T2T_PERFORMER;
    size_t off[2][16] = {{0}}, o3 = 0;
    vitc__carve cv = {0, 1};
    for (int s = 0; s < (record ? 2 : 1); s++) {
        size_t rows = (size_t)(B * g->L[s]);
        size_t widest = record ? (size_t)g->d[s] : (size_t)(g->d[0] > g->d[1] ? g->d[0] : g->d[1]);
        size_t *o = off[s];
        o[0] = vitc__take(&cv, rows, widest), o[1] = vitc__take(&cv, rows, widest);
        o[2] = vitc__take(&cv, rows, 3 * (size_t)T), o[3] = vitc__take(&cv, rows, (size_t)T);
        o[4] = record ? vitc__take(&cv, rows, 1) : 0;
        o[5] = vitc__take(&cv, rows, (size_t)T), o[6] = vitc__take(&cv, rows, (size_t)T);
        o[7] = vitc__take(&cv, rows, (size_t)T);
        o[8] = record ? vitc__take(&cv, rows, (size_t)T) : o[7];
        o[9] = vitc__take(&cv, rows, (size_t)T);
        if (perf) {
            o[10] = vitc__take(&cv, rows, (size_t)(3 * T));
            o[11] = vitc__take(&cv, rows, (size_t)mm), o[12] = vitc__take(&cv, rows, (size_t)mm);
            o[13] = vitc__take(&cv, 1, (size_t)mm), o[14] = vitc__take(&cv, (size_t)g->L[s], 1);
            o[15] = vitc__take(&cv, (size_t)T, (size_t)mm);
        }
    }
    if (record)
        o3 = vitc__take(&cv, (size_t)(B * g->L[2]), (size_t)g->d[2]);
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "T2T-ViT tokens for [%lld, %lld, %lld, %lld] overflow",
                         (long long)B, (long long)m->cfg.in_channels, (long long)g->gh[0],
                         (long long)g->gw[0]);
    VITC_TRY(vitc__buf_reserve(&ss->t2t_buf, cv.used));
    float *base = ss->t2t_buf.p;
    for (int s = 0; s < 2; s++) {
        const size_t *o = off[record ? s : 0];
        float **dst[16] = {&t[s].cols, &t[s].ln, &t[s].qkv, &t[s].o, &t[s].lse, &t[s].a, &t[s].h,
                           &t[s].hpre, &t[s].hact, &t[s].out, &t[s].kqv, &t[s].kp, &t[s].qp,
                           &t[s].ksum, &t[s].D, &t[s].kptv};
        for (int k = 0; k < 16; k++) *dst[k] = base + o[k];
        if (!record)
            t[s].lse = NULL;
    }
    *cols3 = record ? base + o3 : t[0].cols;
    return VITC_OK;
}

vitc_status vitc__t2t_tokens(const vitc_vit *m, vitc__session *ss, const float *images, int64_t B,
                             int64_t H, int64_t W, float *out) {
    int64_t Cin = m->cfg.in_channels, T = m->t2t_dim, C = m->cfg.hidden_dim;
    t2t_geo g = t2t_geometry(m, H, W);
    /* A training forward keeps every stage for vitc__t2t_tokens_backward. */
    int record = ss->a.training && m->t2t == VIT_NAMES_T2T_TRANSFORMER;
    t2t_acts t[2];
    float *cols3;
    VITC_TRY(t2t_carve(m, ss, B, &g, record, t, &cols3));
    vitc__nn_unfold(t[0].cols, images, 0, B, Cin, H, W, 7, 4, 2);               /* soft_split0 */
    VITC_TRY(t2t_stage(m, ss, 0, B, g.L[0], &t[0]));                                /* attention1 */
    vitc__nn_unfold(t[1].cols, t[0].out, 1, B, T, g.gh[1], g.gw[1], 3, 2, 1);     /* soft_split1 */
    VITC_TRY(t2t_stage(m, ss, 1, B, g.L[1], &t[1]));                                /* attention2 */
    vitc__nn_unfold(cols3, t[1].out, 1, B, T, g.gh[2], g.gw[2], 3, 2, 1);         /* soft_split2 */
    vitc__linear(out, C, cols3, g.d[2], m->w.t2t_proj_w, m->w.t2t_proj_b, NULL, 0, B * g.L[2], C,
                 g.d[2]);
    return VITC_OK;
}

/* One transformer-mode stage backward: dx [B*L, dim] from dout [B*L, T];
 * sc: dh, dhid, da, datt [B*L, T], dqkv [B*L, 3T], dln [B*L, dim], stats. */
static vitc_status t2t_stage_backward(vitc_vit *m, vitc__session *ss, int s, int64_t B, int64_t L,
                                      const t2t_acts *t, const float *dout, float *dx, float *sc) {
    const vitc__t2t_stage *w = &m->w.t2t[s];
    vitc__t2t_stage *gw = &m->g.t2t[s];
    int64_t dim = vitc__t2t_stage_dim(m, s), T = m->t2t_dim, M = B * L;
    float *dh = sc, *dhid = dh + M * T, *da = dhid + M * T, *datt = da + M * T;
    float *dqkv = datt + M * T, *dln = dqkv + 3 * M * T, *stats = dln + M * dim;
    vitc__nn_mlp f = t2t_mlp(m, w), gf = t2t_mlp(m, gw);
    vitc__nn_mlp_backward(&f, &gf, dh, 0.0f, dout, t->h, t->hpre, t->hact, M, dhid);
    vitc__layernorm_backward_res(da, dout, gw->n2_w, gw->n2_b, dh, t->a, w->n2_w, M, T,
                                 m->cfg.norm_eps, stats);
    vitc__nn_attn p = t2t_attn(m, w, s, B, L), gp = t2t_attn(m, gw, s, B, L);
    vitc__nn_attn_rec r = {t->qkv, t->o, t->lse};
    VITC_TRY(vitc__nn_attn_backward(&p, &gp, dln, da, t->ln, &r, datt, dqkv, &ss->mask_buf));
    memset(dx, 0, (size_t)(M * dim) * sizeof(float));
    vitc__layernorm_backward(dx, gw->n1_w, gw->n1_b, dln, t->cols, w->n1_w, M, dim,
                             m->cfg.norm_eps, stats);
    return VITC_OK;
}

vitc_status vitc__t2t_tokens_backward(vitc_vit *m, vitc__session *ss, const float *dout, int64_t B,
                                      int64_t H, int64_t W) {
    if (m->t2t != VIT_NAMES_T2T_TRANSFORMER)
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_backward: T2T-ViT's Token_performer "
                         "stages (tokens_type \"performer\") have no backward; the transformer "
                         "mode (t2t_vit_t_*) trains");
    int64_t T = m->t2t_dim, C = m->cfg.hidden_dim;
    t2t_geo g = t2t_geometry(m, H, W);
    t2t_acts t[2];
    float *cols3;
    VITC_TRY(t2t_carve(m, ss, B, &g, 1, t, &cols3)); /* the recorded regions (same sizes: no move) */
    /* Scratch: dcols [B*L0, max d], d(stage out) [B*L0, T], the stage's (9 T + 2 dim + 2) rows. */
    int64_t M0 = B * g.L[0], dmax = g.d[0] > g.d[1] ? g.d[0] : g.d[1];
    size_t n;
    if (!vitc__mul_size((size_t)M0, (size_t)(3 * dmax + 8 * T + 2), &n))
        return vitc__err(VITC_ERR_NOMEM, "T2T-ViT backward overflows");
    vitc__buf buf = {0};
    VITC_TRY(vitc__buf_reserve(&buf, n));
    float *dcols = buf.p, *dx = dcols + M0 * dmax, *sc = dx + M0 * T;
    vitc_status st = VITC_OK;
    /* project: dcols3 = dout W; the rows fold back onto stage 2's tokens */
    vitc__linear_backward(dcols, g.d[2], 0.0f, m->g.t2t_proj_w, m->g.t2t_proj_b, dout, C, cols3,
                          g.d[2], m->w.t2t_proj_w, B * g.L[2], C, g.d[2]);
    for (int s = 1; s >= 0 && st == VITC_OK; s--) {
        memset(dx, 0, (size_t)(B * g.L[s] * T) * sizeof(float));
        vitc__nn_fold(dx, dcols, 1, B, T, g.gh[s + 1], g.gw[s + 1], 3, 2, 1);
        st = t2t_stage_backward(m, ss, s, B, g.L[s], &t[s], dx, dcols, sc);
    }
    vitc__buf_free(&buf);
    return st;
}
