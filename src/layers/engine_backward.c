/*
 * engine_backward.c — the attention engine's stages in reverse (engine.c's
 * forward, read bottom to top), and the training API of a layer: backward,
 * zero_grad, gradients by torch name.
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
#include "../train/train.h"
#include "layers.h"

/* The gradient of a parameter: the same offset in grad as in store. */
float *vitc__grad_of(vitc_layer *l, const float *param) {
    return param ? l->grad + (param - l->store) : NULL;
}

/* nn.Linear through vitc__linear_backward; the NumPy seed's plain x @ W
 * (no bias) here: dx = dy W^T, dW [K, N] += x^T dy. */
void vitc__proj_backward(float *dx, int64_t lddx, float beta, float *dW, float *db,
                         const float *dy, int64_t ldy, const float *x, int64_t ldx,
                         const float *W, int matmul, int64_t M, int64_t N, int64_t K) {
    if (!matmul) {
        vitc__linear_backward(dx, lddx, beta, dW, db, dy, ldy, x, ldx, W, M, N, K);
        return;
    }
    if (dx) vitc__gemm(0, 1, M, K, N, 1.0f, dy, ldy, W, N, beta, dx, lddx);
    vitc__gemm(1, 0, K, N, M, 1.0f, x, ldx, dy, ldy, 1.0f, dW, N);
}

/* P [L, S] = softmax(scale q k^T + mask) of head (b, h). A row whose keys
 * are all masked is NaN when the weights are returned (f->probs), else 0:
 * torch 2.x's MultiheadAttention, whose need_weights=False path is its SDPA. */
static void head_probs(const vitc__sdpa_desc *f, int64_t b, int64_t h, float *P) {
    int64_t L = f->L, S = f->S;
    const float *q = f->q + b * f->q_sb + h * f->q_sh; // [L, D] row stride q_sr
    const float *k = f->k + b * f->k_sb + h * f->k_sh; // [S, D]
    vitc__gemm(0, 1, L, S, f->D, f->scale, q, f->q_sr, k, f->k_sr, 0.0f, P, S);
    if (!f->mask) {
        vitc__softmax_rows(P, L, S, 1.0f);
        return;
    }
    const float *m = f->mask + b * f->m_sb + h * f->m_sh; // [L, S] row stride m_sr
    for (int64_t i = 0; i < L; i++) {
        float *pr = P + i * S, mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
            pr[j] += m[i * f->m_sr + j];
            if (pr[j] > mx) mx = pr[j];
        }
        vitc__softmax_rows(pr, 1, S, 1.0f);
        if (mx == -INFINITY && !f->probs) memset(pr, 0, (size_t)S * sizeof *pr);
    }
}

void vitc__sdpa_dropout_forward(const vitc__sdpa_desc *f, uint8_t *keep, float p, vitc__rng *r,
                                float *P) {
    int64_t L = f->L, S = f->S;
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            uint8_t *kp = keep + (b * f->H + h) * L * S; // [L, S]
            head_probs(f, b, h, P);
            vitc__dropout_mask(kp, L * S, p, r);
            vitc__dropout_apply(P, P, kp, L * S, p);
            if (f->probs) {
                float *w = f->probs + b * f->p_sb + h * f->p_sh; // [L, S] row stride p_sr
                for (int64_t i = 0; i < L; i++) memcpy(w + i * f->p_sr, P + i * S, S * sizeof *P);
            }
            const float *v = f->v + b * f->v_sb + h * f->v_sh; // [S, Dv]
            float *o = f->o + b * f->o_sb + h * f->o_sh;       // [L, Dv]
            vitc__gemm(0, 0, L, f->Dv, S, 1.0f, P, S, v, f->v_sr, 0.0f, o, f->o_sr);
        }
}

/* With Pd = P * keep / (1 - p): dV = Pd^T dO, dPd = dO V^T, dP = dPd * keep
 * / (1 - p), dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale
 * dS^T Q. */
void vitc__sdpa_dropout_backward(const vitc__sdpa_desc *f, const vitc__sdpa_desc *g,
                                 const uint8_t *keep, float p, float *P, float *dP) {
    int64_t L = f->L, S = f->S, D = f->D, Dv = f->Dv;
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            const uint8_t *kp = keep + (b * f->H + h) * L * S;  // [L, S]
            const float *q = f->q + b * f->q_sb + h * f->q_sh; // [L, D]
            const float *k = f->k + b * f->k_sb + h * f->k_sh; // [S, D]
            const float *v = f->v + b * f->v_sb + h * f->v_sh; // [S, Dv]
            const float *dO = g->o + b * g->o_sb + h * g->o_sh; // [L, Dv]
            float *dq = (float *)g->q + b * g->q_sb + h * g->q_sh; // [L, D]
            float *dk = (float *)g->k + b * g->k_sb + h * g->k_sh; // [S, D]
            float *dv = (float *)g->v + b * g->v_sb + h * g->v_sh; // [S, Dv]
            head_probs(f, b, h, P);
            vitc__dropout_apply(dP, P, kp, L * S, p); /* Pd, for dV */
            vitc__gemm(1, 0, S, Dv, L, 1.0f, dP, S, dO, g->o_sr, 0.0f, dv, g->v_sr);
            vitc__gemm(0, 1, L, S, Dv, 1.0f, dO, g->o_sr, v, f->v_sr, 0.0f, dP, S);
            vitc__dropout_apply(dP, dP, kp, L * S, p);
            for (int64_t i = 0; i < L; i++) {
                float *pr = P + i * S, *dpr = dP + i * S;
                double delta = 0.0;
                for (int64_t j = 0; j < S; j++) delta += (double)pr[j] * dpr[j];
                for (int64_t j = 0; j < S; j++) dpr[j] = pr[j] * (dpr[j] - (float)delta);
            }
            vitc__gemm(0, 0, L, D, S, f->scale, dP, S, k, f->k_sr, 0.0f, dq, g->q_sr);
            vitc__gemm(1, 0, S, D, L, f->scale, dP, S, q, f->q_sr, 0.0f, dk, g->k_sr);
        }
}

vitc_status vitc__layer_ensure_grad(vitc_layer *l) {
    vitc__paramset ps;
    return vitc__layer_paramset(l, 1, &ps);
}

vitc_status vitc__engine_backward(vitc_layer *l, const float *dout, float *dx) {
    const vitc__plan *p = &l->plan;
    const vitc__record *r = &l->rec;
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
        if (l->gamma) {
            /* y is o here (ConvSA has no out-projection). */
            double sg = 0.0;
            for (int64_t i = 0; i < M * C; i++) sg += (double)t[i] * o[i];
            vitc__grad_of(l, l->gamma)[0] += (float)sg;
            float gm = l->gamma[0];
            for (int64_t i = 0; i < M * C; i++) t[i] *= gm;
        }
        dyt = t;
    }

    /* 4. Output projection (and T2T's V skip). */
    const float *dO = dyt; // [M, dv]
    if (p->outp != VITC__OUT_NONE) {
        float *t = g + o_do;
        vitc__proj_backward(t, p->dv, 0.0f, vitc__grad_of(l, l->w_o), vitc__grad_of(l, l->b_o), dyt, p->cout, o,
                      p->dv, l->w_o, p->outp == VITC__OUT_MATMUL, M, p->cout, p->dv);
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
        vitc__proj_backward(dtok, cin, 0.0f, vitc__grad_of(l, l->w_q), vitc__grad_of(l, l->b_q), dqkv, W3, tok, cin,
                      l->w_q, 0, M, p->dq, cin);
        vitc__proj_backward(dtok, cin, 1.0f, vitc__grad_of(l, l->w_k), vitc__grad_of(l, l->b_k), dqkv + p->dq, W3,
                      tok, cin, l->w_k, 0, M, p->dq, cin);
        vitc__proj_backward(dtok, cin, 1.0f, vitc__grad_of(l, l->w_v), vitc__grad_of(l, l->b_v), dqkv + 2 * p->dq,
                      W3, tok, cin, l->w_v, 0, M, p->dv, cin);
        break;
    case VITC__QKV_FUSED:
        vitc__proj_backward(dtok, cin, 0.0f, vitc__grad_of(l, l->w_qkv), vitc__grad_of(l, l->b_qkv), dqkv, W3, tok,
                      cin, l->w_qkv, 0, M, W3, cin);
        break;
    case VITC__QKV_MATMUL:
        vitc__proj_backward(dtok, cin, 0.0f, vitc__grad_of(l, l->w_q), NULL, dqkv, W3, tok, cin, l->w_q, 1, M,
                      p->dq, cin);
        vitc__proj_backward(dtok, cin, 1.0f, vitc__grad_of(l, l->w_k), NULL, dqkv + p->dq, W3, tok, cin,
                      l->w_k, 1, M, p->dq, cin);
        vitc__proj_backward(dtok, cin, 1.0f, vitc__grad_of(l, l->w_v), NULL, dqkv + 2 * p->dq, W3, tok, cin,
                      l->w_v, 1, M, p->dv, cin);
        break;
    }

    /* 1. Back to the input: patch conv, or tokens to channels (through the norm). */
    if (p->in == VITC__IN_PATCHES) {
        int64_t k = l->cfg.patch_size;
        float *dcols = g + o_dcols; // [M, K]
        vitc__proj_backward(dcols, K, 0.0f, vitc__grad_of(l, l->w_patch), vitc__grad_of(l, l->b_patch), dtok, cin,
                      s + r->o_cols, K, l->w_patch, 0, M, cin, K);
        vitc__unpatchify(dx, dcols, B, C, r->shape[2], r->shape[3], k);
    } else if (p->in == VITC__IN_IMAGE && p->norm == VITC__NORM_NONE) {
        vitc__transpose_add(dx, dtok, dout, 1.0f, B, C, N);
    } else if (p->in == VITC__IN_IMAGE) {
        float *dimg = g + o_dimg; // [B, C, HW]
        const float *x = s + r->o_x;
        vitc__channels_to_tokens(dimg, dtok, B, N, C); /* [B, N, C] -> [B, C, N] */
        if (p->norm == VITC__NORM_GROUP) {
            vitc__groupnorm_backward(dx, vitc__grad_of(l, l->norm_w), vitc__grad_of(l, l->norm_b), dimg, x,
                                     l->norm_w, B, C, HW, 1, l->cfg.eps);
        } else {
            const float *mean = s + r->o_stat, *var = mean + C; // [C], [C]
            vitc__batchnorm_backward(dx, vitc__grad_of(l, l->norm_w), vitc__grad_of(l, l->norm_b), dimg, x,
                                     mean, var, l->norm_w, l->cfg.eps, 1, B, C, HW);
        }
        for (int64_t i = 0; i < B * C * HW; i++) dx[i] += dout[i];
    }
    return VITC_OK;
}

/* ---- the training API --------------------------------------------------- */

/* vitc_layer_forward's MultiheadAttention is self-attention of x: its
 * gradient is d_query + d_key + d_value. */
static vitc_status mha_self_backward(vitc_layer *l, const float *dy, int ndim,
                                     const int64_t *shape, float *dx) {
    const vitc__mha_record *r = &l->mrec;
    if (!r->valid)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention: backward needs a training-mode forward first");
    for (int i = 0; i < r->ndim; i++)
        if (r->kshape[i] != r->qshape[i] || r->vshape[i] != r->qshape[i])
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "MultiheadAttention: the recorded forward had a key or value unlike "
                             "the query; use vitc_mha_backward");
    vitc_tensor_view d = {dy, ndim, {0}};
    if (ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_SHAPE, "backward: dy has %d dimensions", ndim);
    memcpy(d.shape, shape, (size_t)ndim * sizeof *shape);
    int ok;
    size_t n = vitc__numel(r->ndim, r->qshape, &ok);
    float *dk = vitc__alloc(2 * n * sizeof(float) + 1), *dv = dk + n; // [n], [n]
    if (!dk)
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: cannot allocate the backward's gradients");
    vitc_status st = vitc_mha_backward(l, &d, dx, dk, dv);
    if (st == VITC_OK)
        for (size_t i = 0; i < n; i++) dx[i] += dk[i] + dv[i];
    vitc__free(dk);
    return st;
}

vitc_status vitc_layer_backward(vitc_layer *l, const float *dy, int ndim, const int64_t *shape,
                                float *dx) {
    if (!l || !dy || !shape || !dx)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_backward: NULL argument");
    if (l->cfg.kind == VITC_MULTIHEAD_ATTENTION)
        return mha_self_backward(l, dy, ndim, shape, dx);
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
    return vitc__engine_backward(l, dy, dx);
}

vitc_status vitc_layer_zero_grad(vitc_layer *l) {
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_zero_grad: layer is NULL");
    if (l->grad)
        memset(l->grad, 0, l->store_len * sizeof(float));
    return VITC_OK;
}

vitc_status vitc_layer_grad(vitc_layer *l, const char *name, int *ndim, const int64_t **shape,
                            float **grad) {
    if (!l || !name)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_grad: NULL argument");
    for (int i = 0; i < l->nparams; i++) {
        const vitc__param *p = &l->params[i];
        if (strcmp(name, p->name) != 0 && !(p->alias && strcmp(name, p->alias) == 0))
            continue;
        if (p->buffer)
            return vitc__err(VITC_ERR_KEY, "\"%s\" is a buffer, not a parameter: it has no gradient",
                             name);
        VITC_TRY(vitc__layer_ensure_grad(l));
        if (ndim) *ndim = p->ndim;
        if (shape) *shape = p->shape;
        if (grad) *grad = l->grad + p->offset;
        return VITC_OK;
    }
    return vitc__err(VITC_ERR_KEY, "no parameter \"%s\"", name);
}
