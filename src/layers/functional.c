/*
 * functional.c — the free functions scaled_dot_product_attention (torch
 * 2.x semantics) and softmax with temperature, each with its backward, and
 * attention with dropout on its weights, the one implementation
 * MultiheadAttention's training forward and backward use. Below the layer
 * object: nothing here knows of one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "../nn/nn.h"


static const char *shp(char *buf, size_t cap, const vitc_tensor_view *t) {
    return vitc__shape_str(buf, cap, t->ndim < 0 || t->ndim > 8 ? 0 : t->ndim, t->shape);
}

/* 1 when q, k and v each hold at most 2^50 elements: the product does not
 * overflow, and the buffers derived from them stay allocatable sizes. */
static int qkv_numel_ok(const vitc_tensor_view *q, const vitc_tensor_view *k,
                        const vitc_tensor_view *v) {
    const vitc_tensor_view *t[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        int ok;
        size_t n = vitc__numel(t[i]->ndim, t[i]->shape, &ok);
        if (!ok || n > ((size_t)1 << 50))
            return 0;
    }
    return 1;
}

/* ---- attention with dropout on its weights ------------------------- */

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
            /* P becomes dropout(P) in place: the weights MultiheadAttention returns */
            vitc__nn_dropout_pv(f->o + b * f->o_sb + h * f->o_sh, f->o_sr, P, kp, p,
                                f->v + b * f->v_sb + h * f->v_sh, f->v_sr, L, S, f->Dv, P);
            if (f->probs) {
                float *w = f->probs + b * f->p_sb + h * f->p_sh; // [L, S] row stride p_sr
                for (int64_t i = 0; i < L; i++) memcpy(w + i * f->p_sr, P + i * S, S * sizeof *P);
            }
        }
}

/* P recomputed per head (nothing [B, H, L, S] kept), then the shared core. */
void vitc__sdpa_dropout_backward(const vitc__sdpa_desc *f, const vitc__sdpa_desc *g,
                                 const uint8_t *keep, float p, float *P, float *dP) {
    int64_t L = f->L, S = f->S;
    /* g's views as a backward's: dO from g->o, dq, dk, dv into g->q, g->k, g->v */
    vitc__sdpa_bwd_desc bd = {
        .f = *f, .dout = g->o, .do_sb = g->o_sb, .do_sh = g->o_sh, .do_sr = g->o_sr,
        .dq = (float *)g->q, .dq_sb = g->q_sb, .dq_sh = g->q_sh, .dq_sr = g->q_sr,
        .dk = (float *)g->k, .dk_sb = g->k_sb, .dk_sh = g->k_sh, .dk_sr = g->k_sr,
        .dv = (float *)g->v, .dv_sb = g->v_sb, .dv_sh = g->v_sh, .dv_sr = g->v_sr};
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            vitc__nn_head_grad hg = vitc__nn_head_at(&bd, b, h);
            head_probs(f, b, h, P);
            vitc__nn_dropout_attn_head_backward(&hg, P, keep + (b * f->H + h) * L * S, p, dP);
        }
}

/* ---- scaled_dot_product_attention ------------------------------------ */

/* The gradient of a forward described by sd (o, lse set): dout, dq, dk, dv
 * contiguous like o, q, k, v. */
static vitc_status sdpa_grad(vitc__sdpa_desc *sd, int saved, const float *dout, float *dq,
                             float *dk, float *dv) {
    if (!saved) /* o and the log-sum-exp the backward recomputes P from */
        VITC_TRY(vitc__sdpa(sd));
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = *sd;
    bd.dout = dout, bd.do_sb = sd->o_sb, bd.do_sh = sd->o_sh, bd.do_sr = sd->o_sr;
    bd.dq = dq, bd.dq_sb = sd->q_sb, bd.dq_sh = sd->q_sh, bd.dq_sr = sd->q_sr;
    bd.dk = dk, bd.dk_sb = sd->k_sb, bd.dk_sh = sd->k_sh, bd.dk_sr = sd->k_sr;
    bd.dv = dv, bd.dv_sb = sd->v_sb, bd.dv_sh = sd->v_sh, bd.dv_sr = sd->v_sr;
    return vitc__sdpa_backward(&bd);
}

/* vitc_sdpa (writing lse [B*H*L] too when given), and with dout set its
 * backward (lse then required): after computing out and lse, or from the
 * caller's (saved: out and lse are only read). */
static vitc_status sdpa_impl(const vitc_tensor_view *q, const vitc_tensor_view *k,
                             const vitc_tensor_view *v, const vitc_tensor_view *mask,
                             vitc_mask_type mask_type, float scale, float *out, float *lse,
                             int saved, const float *dout, float *dq, float *dk, float *dv) {
    char s1[96], s2[96], s3[96], s4[96];
    if (!q || !k || !v || !out || !q->data || !k->data || !v->data)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: NULL q, k, v or out");
    /* Checked before the "<= 0 means default" rule below, which NaN would
     * otherwise fall into silently; an infinite scale makes every output NaN. */
    if (!isfinite(scale))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "scaled_dot_product_attention: scale %g is not finite (give a finite scale "
                         "> 0, or 0 for the default 1/sqrt(d))",
                         (double)scale);
    int nd = q->ndim;
    int ok = nd >= 2 && nd <= 8 && k->ndim == nd && v->ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = q->shape[i] >= 1 && k->shape[i] >= 1 && v->shape[i] >= 1 &&
             q->shape[i] <= ((int64_t)1 << 40) && k->shape[i] <= ((int64_t)1 << 40) &&
             v->shape[i] <= ((int64_t)1 << 40) &&
             (i >= nd - 2 || (k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i]));
    ok = ok && k->shape[nd - 1] == q->shape[nd - 1] && v->shape[nd - 2] == k->shape[nd - 2];
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE,
                         "scaled_dot_product_attention: q %s, k %s, v %s do not fit "
                         "(expected [..., L, d], [..., S, d], [..., S, dv] with equal leading dims, "
                         "every dim >= 1)",
                         shp(s1, sizeof s1, q), shp(s2, sizeof s2, k), shp(s3, sizeof s3, v));
    int64_t L = q->shape[nd - 2], D = q->shape[nd - 1], S = k->shape[nd - 2], Dv = v->shape[nd - 1];
    /* Leading dims: the last one is the kernel's H, the rest flatten into its B. */
    int nlead = nd - 2;
    int64_t H = nlead ? q->shape[nd - 3] : 1, B = 1;
    for (int i = 0; i < nlead - 1; i++) B *= q->shape[i];
    if (!qkv_numel_ok(q, k, v))
        return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: q, k or v too large");

    vitc__sdpa_desc sd = {0};
    sd.B = B; sd.H = H; sd.L = L; sd.S = S; sd.D = D; sd.Dv = Dv;
    sd.q = q->data; sd.q_sb = H * L * D; sd.q_sh = L * D; sd.q_sr = D;
    sd.k = k->data; sd.k_sb = H * S * D; sd.k_sh = S * D; sd.k_sr = D;
    sd.v = v->data; sd.v_sb = H * S * Dv; sd.v_sh = S * Dv; sd.v_sr = Dv;
    sd.o = out; sd.o_sb = H * L * Dv; sd.o_sh = L * Dv; sd.o_sr = Dv;
    sd.scale = scale > 0.0f ? scale : (float)(1.0 / sqrt((double)D));

    float *tmp = NULL;
    if (mask && mask->data && mask_type != VITC_MASK_NONE) {
        if (mask_type != VITC_MASK_BOOL && mask_type != VITC_MASK_FLOAT)
            return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: bad mask type %d",
                             (int)mask_type);
        /* Right-align the mask's shape with [..., L, S]; every dim 1 or equal. */
        int mn = mask->ndim;
        int64_t full[8], ms[8];
        for (int i = 0; i < nlead; i++) full[i] = q->shape[i];
        full[nd - 2] = L;
        full[nd - 1] = S;
        int good = mn >= 0 && mn <= nd;
        for (int i = 0; good && i < nd; i++) {
            int j = i - (nd - mn);
            ms[i] = j < 0 ? 1 : mask->shape[j];
            good = ms[i] == 1 || ms[i] == full[i];
        }
        if (!good)
            return vitc__err(VITC_ERR_SHAPE,
                             "scaled_dot_product_attention: mask %s does not broadcast to %s",
                             shp(s1, sizeof s1, mask), vitc__shape_str(s4, sizeof s4, nd, full));
        /* The kernel wants a contiguous S and one stride over the flattened
         * outer dims: copy into that form when the mask is not already in it
         * (and always for bool, which becomes 0 / -inf). */
        int outer_ones = 1, outer_full = 1;
        for (int i = 0; i < nlead - 1; i++) {
            outer_ones = outer_ones && ms[i] == 1;
            outer_full = outer_full && ms[i] == full[i];
        }
        int64_t ts[8];
        for (int i = 0; i < nd; i++) ts[i] = ms[i];
        if (!outer_ones && !outer_full)
            for (int i = 0; i < nlead - 1; i++) ts[i] = full[i];
        ts[nd - 1] = S;
        int direct = mask_type == VITC_MASK_FLOAT && ms[nd - 1] == S && (outer_ones || outer_full);
        int ts_ok;
        size_t ts_n = vitc__numel(nd, ts, &ts_ok);
        if (!ts_ok || ts_n > ((size_t)1 << 56))
            return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: mask too large");
        int64_t st[8], acc = 1; /* contiguous strides of ts */
        for (int i = nd - 1; i >= 0; i--) {
            st[i] = acc;
            acc *= ts[i];
        }
        if (!direct) {
            size_t bytes;
            if (!vitc__mul_size((size_t)acc, sizeof(float), &bytes) || !(tmp = vitc__alloc(bytes)))
                return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: cannot allocate the mask");
            /* Source strides of the mask in the right-aligned frame, 0 where it broadcasts. */
            int64_t sst[8], sacc = 1;
            for (int i = nd - 1; i >= 0; i--) {
                sst[i] = ms[i] == 1 ? 0 : sacc;
                sacc *= ms[i];
            }
            for (int64_t e = 0; e < acc; e++) {
                int64_t rem = e, si = 0;
                for (int i = 0; i < nd; i++) {
                    int64_t idx = rem / st[i];
                    rem %= st[i];
                    si += idx * sst[i];
                }
                if (mask_type == VITC_MASK_BOOL)
                    tmp[e] = ((const uint8_t *)mask->data)[si] ? 0.0f : -INFINITY;
                else
                    tmp[e] = ((const float *)mask->data)[si];
            }
        }
        sd.mask = direct ? mask->data : tmp;
        sd.m_sr = ts[nd - 2] == 1 ? 0 : st[nd - 2];
        sd.m_sh = nlead == 0 || ts[nd - 3] == 1 ? 0 : st[nd - 3];
        sd.m_sb = nlead < 2 || (outer_ones && ts[nlead - 2] == 1) ? 0 : st[nlead - 2];
    }
    vitc_status s;
    if (lse) sd.lse = lse, sd.lse_sb = H * L, sd.lse_sh = L;
    if (dout) {
        s = sdpa_grad(&sd, saved, dout, dq, dk, dv);
    } else {
        s = vitc__sdpa(&sd);
    }
    vitc__free(tmp);
    return s;
}

vitc_status vitc_sdpa(const vitc_tensor_view *q, const vitc_tensor_view *k, const vitc_tensor_view *v,
                      const vitc_tensor_view *mask, vitc_mask_type mask_type, float scale, float *out) {
    return sdpa_impl(q, k, v, mask, mask_type, scale, out, NULL, 0, NULL, NULL, NULL, NULL);
}

vitc_status vitc_sdpa_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                          const vitc_tensor_view *v, const vitc_tensor_view *mask,
                          vitc_mask_type mask_type, float scale, float *out, float *lse) {
    if (!lse)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: NULL lse");
    return sdpa_impl(q, k, v, mask, mask_type, scale, out, lse, 0, NULL, NULL, NULL, NULL);
}

vitc_status vitc_sdpa_backward_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                                   const vitc_tensor_view *v, const vitc_tensor_view *mask,
                                   vitc_mask_type mask_type, float scale, const float *out,
                                   const float *lse, const float *dout, float *dq, float *dk,
                                   float *dv) {
    if (!out || !lse || !dout || !dq || !dk || !dv)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention backward: NULL "
                                               "out, lse, dout, dq, dk or dv");
    /* The backward only reads out and lse (the descriptor's fields are
     * writable because the forward fills them). */
    return sdpa_impl(q, k, v, mask, mask_type, scale, (float *)out, (float *)lse, 1, dout, dq, dk,
                     dv);
}

vitc_status vitc_sdpa_backward(const vitc_tensor_view *q, const vitc_tensor_view *k,
                               const vitc_tensor_view *v, const vitc_tensor_view *mask,
                               vitc_mask_type mask_type, float scale, const float *dout, float *dq,
                               float *dk, float *dv) {
    if (!q || !v || !dout || !dq || !dk || !dv)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention backward: NULL "
                                               "q, v, dout, dq, dk or dv");
    /* The forward's o [..., L, dv] and lse [..., L]; sdpa_impl checks the
     * shapes in full before either is touched. */
    int nd = q->ndim, ok = nd >= 2 && nd <= 8 && v->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = q->shape[i] >= 1 && v->shape[i] >= 1;
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "scaled_dot_product_attention backward: q (%dD) and v "
                                         "(%dD) need equal ranks in [2, 8] and dims >= 1",
                         q->ndim, v->ndim);
    size_t rows = 1, no = 0, bytes_o, bytes_l;
    for (int i = 0; ok && i < nd - 1; i++) ok = vitc__mul_size(rows, (size_t)q->shape[i], &rows);
    ok = ok && vitc__mul_size(rows, (size_t)v->shape[nd - 1], &no) &&
         vitc__mul_size(no, sizeof(float), &bytes_o) && vitc__mul_size(rows, sizeof(float), &bytes_l);
    if (!ok) return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention backward: sizes too large");
    float *o = vitc__alloc(bytes_o), *lse = vitc__alloc(bytes_l); /* [..., L, dv], [..., L] */
    vitc_status s = o && lse ? sdpa_impl(q, k, v, mask, mask_type, scale, o, lse, 0, dout, dq, dk, dv)
                             : vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention backward: "
                                                         "cannot allocate the forward's output");
    vitc__free(o);
    vitc__free(lse);
    return s;
}

/* ---- softmax -------------------------------------------------------- */

vitc_status vitc_softmax(const float *x, int ndim, const int64_t *shape, int dim, float temperature,
                         float *out) {
    char s1[96];
    if (!x || !out || (ndim > 0 && !shape) || ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: NULL argument or ndim %d out of [0, 8]", ndim);
    if (temperature == 0.0f || !isfinite(temperature))
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: temperature %g must be finite and non-zero",
                         (double)temperature);
    int nd = ndim ? ndim : 1;
    if (dim < -nd || dim >= nd)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: dim %d out of range for shape %s", dim,
                         vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (dim < 0) dim += nd;
    int ok;
    size_t total = vitc__numel(ndim, shape, &ok);
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "softmax: bad shape %s", vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (total == 0)
        return VITC_OK;
    int64_t n = ndim ? shape[dim] : 1, inner = 1;
    for (int i = dim + 1; i < ndim; i++) inner *= shape[i];
    int64_t outer = (int64_t)total / (n * inner);
    /* x / temperature, divided as torch does (a multiply by 1/t would move
     * logits in the thousands by an ulp, and their softmax visibly). */
    if (inner == 1) {
        for (size_t i = 0; i < total; i++) out[i] = x[i] / temperature;
        vitc__softmax_rows(out, outer, n, 1.0f);
        return VITC_OK;
    }
    float *row = vitc__alloc((size_t)n * sizeof(float)); // [n]
    if (!row)
        return vitc__err(VITC_ERR_NOMEM, "softmax: cannot allocate a row of %lld", (long long)n);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *xs = x + o * n * inner + i;
            float *os = out + o * n * inner + i;
            for (int64_t j = 0; j < n; j++) row[j] = xs[j * inner] / temperature;
            vitc__softmax_rows(row, 1, n, 1.0f);
            for (int64_t j = 0; j < n; j++) os[j * inner] = row[j];
        }
    vitc__free(row);
    return VITC_OK;
}

vitc_status vitc_softmax_backward(const float *y, const float *dy, int ndim, const int64_t *shape,
                                  int dim, float temperature, float *dx) {
    char s1[96];
    if (!y || !dy || !dx || (ndim > 0 && !shape) || ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "softmax backward: NULL argument or ndim %d out of [0, 8]", ndim);
    if (temperature == 0.0f || !isfinite(temperature))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "softmax backward: temperature %g must be finite and non-zero",
                         (double)temperature);
    int nd = ndim ? ndim : 1;
    if (dim < -nd || dim >= nd)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax backward: dim %d out of range for shape %s",
                         dim, vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (dim < 0) dim += nd;
    int ok;
    size_t total = vitc__numel(ndim, shape, &ok);
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "softmax backward: bad shape %s",
                         vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (total == 0) return VITC_OK;
    int64_t n = ndim ? shape[dim] : 1, inner = 1;
    for (int i = dim + 1; i < ndim; i++) inner *= shape[i];
    int64_t outer = (int64_t)total / (n * inner);
    /* d(x / t) / dx = 1 / t: the division's gradient, as torch's autograd
     * takes it (1/t rounded once, applied as a multiply). */
    float it = 1.0f / temperature;
    if (inner == 1) {
        vitc__softmax_rows_backward(dx, y, dy, outer, n, it);
        return VITC_OK;
    }
    float *buf = vitc__alloc((size_t)n * 3 * sizeof(float)); // [3, n]: y, dy, dx of one row
    if (!buf)
        return vitc__err(VITC_ERR_NOMEM, "softmax backward: cannot allocate a row of %lld",
                         (long long)n);
    float *yr = buf, *gr = buf + n, *xr = buf + 2 * n;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            size_t base = (size_t)(o * n * inner + i);
            for (int64_t j = 0; j < n; j++) {
                yr[j] = y[base + (size_t)(j * inner)];
                gr[j] = dy[base + (size_t)(j * inner)];
            }
            vitc__softmax_rows_backward(xr, yr, gr, 1, n, it);
            for (int64_t j = 0; j < n; j++) dx[base + (size_t)(j * inner)] = xr[j];
        }
    vitc__free(buf);
    return VITC_OK;
}
