/*
 * engine_backward.c — the attention engine's stages in reverse (engine.c's
 * forward, read bottom to top).
 *
 *   out = y, or channels-first gamma*y + x    dy -> dyt [B, N, cout] (+ dgamma, dx += dout)
 *   y   = out-projection(o) (+ v)             dyt -> do [B, N, dv] (+ dW_o, db_o; dv += dyt)
 *   o   = sdpa(q, k, v)                       do -> dqkv [B, N, 2dq+dv], same layout as qkv
 *   qkv = projection(tokens)                  dqkv -> dtok [B, N, cin] (+ dW, db)
 *   tokens = in-stage(norm(x))                dtok -> dx (+ norm and patch-conv gradients)
 *
 * The forward (training mode) leaves every activation backward reads in the
 * layer's scratch (vitc__record); backward has its own scratch, so inference
 * memory is what it was. Parameter gradients accumulate into l->grad, which
 * has store's layout, until zero_grad.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../kernels/ops_layers_backward.h"
#include "../kernels/ops_layers.h"
#include "layers.h"

/* nn.Linear through vitc__linear_backward; the NumPy seed's plain x @ W
 * (no bias) here: dx = dy W^T, dW [K, N] += x^T dy. */
static void proj_backward(float *dx, int64_t lddx, float beta, float *dW, float *db,
                          const float *dy, int64_t ldy, const float *x, int64_t ldx,
                          const float *W, int matmul, int64_t M, int64_t N, int64_t K) {
    if (!matmul) {
        vitc__linear_backward(dx, lddx, beta, dW, db, dy, ldy, x, ldx, W, M, N, K);
        return;
    }
    if (dx) vitc__gemm(0, 1, M, K, N, 1.0f, dy, ldy, W, N, beta, dx, lddx);
    vitc__gemm(1, 0, K, N, M, 1.0f, x, ldx, dy, ldy, 1.0f, dW, N);
}

vitc_status vitc__engine_backward(vitc_layer *l, const float *dout, int ndim,
                                  const int64_t *shape, float *dx) {
    const vitc__plan *p = &l->plan;
    const vitc__record *r = &l->rec;
    if (!r->valid)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "backward needs a training-mode forward first (none recorded since "
                         "the last eval-mode or failed forward)");
    int same = ndim == r->out_ndim;
    for (int i = 0; same && i < ndim; i++) same = shape[i] == r->out_shape[i];
    if (!same) {
        char a[160], b[160];
        return vitc__err(VITC_ERR_SHAPE, "backward: dy has shape %s, the forward's output was %s",
                         vitc__shape_str(a, sizeof a, ndim < 0 ? 0 : ndim > 8 ? 8 : ndim, shape),
                         vitc__shape_str(b, sizeof b, r->out_ndim, r->out_shape));
    }
    float *s = l->scratch.p; /* the forward's activations */
    int64_t B = r->shape[0], N, C = 0, HW = 0;
    if (p->in == VITC__IN_TOKENS) {
        N = r->shape[1];
    } else {
        C = r->shape[1];
        HW = r->shape[2] * r->shape[3];
        N = p->in == VITC__IN_PATCHES ? r->out_shape[1] : HW;
    }
    int64_t M = B * N, W3 = 2 * p->dq + p->dv, K = 0;
    if (p->in == VITC__IN_PATCHES) K = C * l->cfg.patch_size * l->cfg.patch_size;

    /* Regions: token-major dy, dO, dqkv, dtokens, dcols, dimage. */
    vitc__carve cv = {0, 1};
    size_t o_dyt = 0, o_do = 0, o_dtok = 0, o_dcols = 0, o_dimg = 0;
    if (p->res == VITC__RES_INPUT) o_dyt = vitc__take(&cv, (size_t)M, (size_t)p->cout);
    if (p->outp != VITC__OUT_NONE) o_do = vitc__take(&cv, (size_t)M, (size_t)p->dv);
    size_t o_dqkv = vitc__take(&cv, (size_t)M, (size_t)W3);
    if (p->in != VITC__IN_TOKENS) o_dtok = vitc__take(&cv, (size_t)M, (size_t)p->cin);
    if (p->in == VITC__IN_PATCHES) o_dcols = vitc__take(&cv, (size_t)M, (size_t)K);
    if (p->norm != VITC__NORM_NONE) o_dimg = vitc__take(&cv, (size_t)B * C, (size_t)HW);
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "backward scratch size for this input overflows");
    VITC_TRY(vitc__buf_reserve(&l->bscratch, cv.used));
    VITC_TRY(vitc__layer_ensure_grad(l));
    float *g = l->bscratch.p;
    const float *qkv = s + r->o_qkv; // [M, W3]
    const float *o = s + r->o_o;     // [M, dv]

    /* 5. Residual: out[b,c,n] = gamma * y[b,n,c] + x[b,c,n]. */
    const float *dyt = dout; // [M, cout]
    if (p->res == VITC__RES_INPUT) {
        float *t = g + o_dyt; // [M, C]
        vitc__channels_to_tokens(t, dout, B, C, N);
        if (l->w.gamma) {
            /* y is o here (ConvSA has no out-projection). */
            double sg = 0.0;
            for (int64_t i = 0; i < M * C; i++) sg += (double)t[i] * o[i];
            l->g.gamma[0] += (float)sg;
            float gm = l->w.gamma[0];
            for (int64_t i = 0; i < M * C; i++) t[i] *= gm;
        }
        dyt = t;
    }

    /* 4. Output projection (and T2T's V skip). */
    const float *dO = dyt; // [M, dv]
    if (p->outp != VITC__OUT_NONE) {
        float *t = g + o_do;
        proj_backward(t, p->dv, 0.0f, l->g.w_o, l->g.b_o, dyt, p->cout, o,
                      p->dv, l->w.w_o, p->outp == VITC__OUT_MATMUL, M, p->cout, p->dv);
        dO = t;
    }

    /* 3. Attention: dq, dk, dv into dqkv where the projection wrote q, k, v. */
    float *dqkv = g + o_dqkv; // [M, W3]
    vitc__sdpa_desc f, gd;
    vitc__engine_sdpa_desc(p, &f, (float *)qkv, (float *)o, B, N);
    vitc__engine_sdpa_desc(p, &gd, dqkv, (float *)dO, B, N);
    if (p->outp == VITC__OUT_NONE) { /* dO is dyt, of row stride cout = dv */
        gd.o_sr = p->cout;
        gd.o_sb = N * p->cout;
    }
    f.lse = s + r->o_lse; // [B, H, N]
    f.lse_sb = p->heads * N;
    f.lse_sh = N;
    VITC_TRY(vitc__sdpa_backward(&(vitc__sdpa_bwd_desc){
        f, gd.o, gd.o_sb, gd.o_sh, gd.o_sr, (float *)gd.q, gd.q_sb, gd.q_sh, gd.q_sr,
        (float *)gd.k, gd.k_sb, gd.k_sh, gd.k_sr, (float *)gd.v, gd.v_sb, gd.v_sh, gd.v_sr}));
    if (p->res == VITC__RES_V) /* y = proj(o) + v */
        for (int64_t m = 0; m < M; m++) {
            float *dv = dqkv + m * W3 + 2 * p->dq;
            const float *d = dyt + m * p->cout;
            for (int64_t j = 0; j < p->dv; j++) dv[j] += d[j];
        }

    /* 2. Projections into q, k, v. */
    float *dtok = p->in == VITC__IN_TOKENS ? dx : g + o_dtok; // [M, cin]
    /* Token inputs are the caller's x, of which the forward kept a copy. */
    const float *tok = s + (p->in == VITC__IN_TOKENS ? r->o_x : r->o_tok); // [M, cin]
    int64_t cin = p->cin;
    switch (p->qkv) {
    case VITC__QKV_SEPARATE:
        proj_backward(dtok, cin, 0.0f, l->g.w_q, l->g.b_q, dqkv, W3, tok, cin,
                      l->w.w_q, 0, M, p->dq, cin);
        proj_backward(dtok, cin, 1.0f, l->g.w_k, l->g.b_k, dqkv + p->dq, W3,
                      tok, cin, l->w.w_k, 0, M, p->dq, cin);
        proj_backward(dtok, cin, 1.0f, l->g.w_v, l->g.b_v, dqkv + 2 * p->dq,
                      W3, tok, cin, l->w.w_v, 0, M, p->dv, cin);
        break;
    case VITC__QKV_FUSED:
        proj_backward(dtok, cin, 0.0f, l->g.w_qkv, l->g.b_qkv, dqkv, W3, tok,
                      cin, l->w.w_qkv, 0, M, W3, cin);
        break;
    case VITC__QKV_MATMUL:
        proj_backward(dtok, cin, 0.0f, l->g.w_q, NULL, dqkv, W3, tok, cin, l->w.w_q, 1, M,
                      p->dq, cin);
        proj_backward(dtok, cin, 1.0f, l->g.w_k, NULL, dqkv + p->dq, W3, tok, cin,
                      l->w.w_k, 1, M, p->dq, cin);
        proj_backward(dtok, cin, 1.0f, l->g.w_v, NULL, dqkv + 2 * p->dq, W3, tok, cin,
                      l->w.w_v, 1, M, p->dv, cin);
        break;
    }

    /* 1. Back to the input: patch conv, or tokens to channels (through the norm). */
    if (p->in == VITC__IN_PATCHES) {
        int64_t k = l->cfg.patch_size;
        float *dcols = g + o_dcols; // [M, K]
        proj_backward(dcols, K, 0.0f, l->g.w_patch, l->g.b_patch, dtok, cin,
                      s + r->o_cols, K, l->w.w_patch, 0, M, cin, K);
        vitc__unpatchify(dx, dcols, B, C, r->shape[2], r->shape[3], k);
    } else if (p->in == VITC__IN_IMAGE && p->norm == VITC__NORM_NONE) {
        vitc__transpose_add(dx, dtok, dout, 1.0f, B, C, N);
    } else if (p->in == VITC__IN_IMAGE) {
        float *dimg = g + o_dimg; // [B, C, HW]
        const float *x = s + r->o_x;
        vitc__channels_to_tokens(dimg, dtok, B, N, C); /* [B, N, C] -> [B, C, N] */
        if (p->norm == VITC__NORM_GROUP) {
            vitc__groupnorm_backward(dx, l->g.norm_w, l->g.norm_b, dimg, x,
                                     l->w.norm_w, B, C, HW, 1, l->cfg.eps);
        } else {
            const float *mean = s + r->o_stat, *var = mean + C; // [C], [C]
            vitc__batchnorm_backward(dx, l->g.norm_w, l->g.norm_b, dimg, x,
                                     mean, var, l->w.norm_w, l->cfg.eps, 1, B, C, HW);
        }
        for (int64_t i = 0; i < B * C * HW; i++) dx[i] += dout[i];
    }
    return VITC_OK;
}
