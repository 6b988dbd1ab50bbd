/*
 * attn.c — attention pieces with their backward: the additive mask
 * providers, dropout on the probabilities, and cross-attention from
 * learnt queries (SigLIP's attention-pooling head).
 *
 *   o = dropout(P) V, P = softmax(scale q k^T + mask)
 *   dV = Pd^T dO, dP = dropout(dO V^T), dS = P * (dP - rowsum(dP * P)),
 *   dQ = scale dS K, dK = scale dS^T Q
 */
#include <math.h>
#include <string.h>

#include "nn.h"

vitc_status vitc__nn_mask_apply(const vitc__nn_mask *m, vitc__buf *buf, vitc__sdpa_desc *sd) {
    if (!m || (m->kind == VITC__NN_MASK_NONE && !m->fill))
        return VITC_OK;
    int64_t L = sd->L, S = sd->S, imgs = m->per_image && m->fill ? sd->B : 1;
    size_t n;
    if (!vitc__mul_size((size_t)L, (size_t)S, &n) || !vitc__mul_size(n, (size_t)imgs, &n))
        return vitc__err(VITC_ERR_NOMEM, "attention mask [%lld, %lld] overflows", (long long)L,
                         (long long)S);
    VITC_TRY(vitc__buf_reserve(buf, n));
    float *mk = buf->p; /* [L, S] */
    if (m->kind == VITC__NN_MASK_CAUSAL) {
        /* Query i sees keys j <= i + (S - L): the last queries end the sequence. */
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < S; j++) mk[i * S + j] = j <= i + (S - L) ? 0.0f : -INFINITY;
    } else {
        m->fill(m->ctx, mk, L, S);
    }
    sd->mask = mk;
    sd->m_sb = imgs > 1 ? L * S : 0;
    sd->m_sh = 0;
    sd->m_sr = S;
    return VITC_OK;
}

void vitc__nn_dropout_pv(float *o, int64_t o_sr, const float *P, const uint8_t *keep, float p,
                         const float *v, int64_t v_sr, int64_t L, int64_t S, int64_t Dv, float *T) {
    vitc__dropout_apply(T, P, keep, L * S, p);
    vitc__gemm(0, 0, L, Dv, S, 1.0f, T, S, v, v_sr, 0.0f, o, o_sr);
}

void vitc__nn_dropout_attn_head_backward(const vitc__nn_head_grad *h, const float *P,
                                         const uint8_t *keep, float p, float *T) {
    int64_t L = h->L, S = h->S;
    /* T = Pd first (for dV), then, Pd spent, dP = dropout(dO V^T). */
    vitc__dropout_apply(T, P, keep, L * S, p);
    vitc__gemm(1, 0, S, h->Dv, L, 1.0f, T, S, h->dout, h->do_sr, 0.0f, h->dv, h->dv_sr);
    vitc__gemm(0, 1, L, S, h->Dv, 1.0f, h->dout, h->do_sr, h->v, h->v_sr, 0.0f, T, S);
    vitc__dropout_apply(T, T, keep, L * S, p);
    for (int64_t i = 0; i < L; i++) {
        float *g = T + i * S;
        const float *pr = P + i * S;
        double r = 0.0; /* rowsum(P * dP), in double as the row can be long */
        for (int64_t j = 0; j < S; j++) r += (double)g[j] * pr[j];
        for (int64_t j = 0; j < S; j++) g[j] = pr[j] * (g[j] - (float)r);
    }
    vitc__gemm(0, 0, L, h->D, S, h->scale, T, S, h->k, h->k_sr, 0.0f, h->dq, h->dq_sr);
    vitc__gemm(1, 0, S, h->D, L, h->scale, T, S, h->q, h->q_sr, 0.0f, h->dk, h->dk_sr);
}

vitc_status vitc__nn_attn_dropout_forward(const vitc__sdpa_desc *sd, const uint8_t *keep, float p,
                                          vitc__buf *tmp) {
    int64_t L = sd->L, S = sd->S, LS = L * S;
    VITC_TRY(vitc__buf_reserve(tmp, (size_t)LS));
    for (int64_t b = 0; b < sd->B; b++)
        for (int64_t h = 0; h < sd->H; h++) {
            int64_t bh = b * sd->H + h;
            vitc__nn_dropout_pv(sd->o + b * sd->o_sb + h * sd->o_sh, sd->o_sr,
                                sd->probs + bh * LS, keep + bh * LS, p,
                                sd->v + b * sd->v_sb + h * sd->v_sh, sd->v_sr, L, S, sd->Dv,
                                tmp->p);
        }
    return VITC_OK;
}

vitc__nn_head_grad vitc__nn_head_at(const vitc__sdpa_bwd_desc *bd, int64_t b, int64_t h) {
    const vitc__sdpa_desc *f = &bd->f;
    return (vitc__nn_head_grad){
        .L = f->L, .S = f->S, .D = f->D, .Dv = f->Dv, .scale = f->scale,
        .q = f->q + b * f->q_sb + h * f->q_sh, .q_sr = f->q_sr,
        .k = f->k + b * f->k_sb + h * f->k_sh, .k_sr = f->k_sr,
        .v = f->v + b * f->v_sb + h * f->v_sh, .v_sr = f->v_sr,
        .dout = bd->dout + b * bd->do_sb + h * bd->do_sh, .do_sr = bd->do_sr,
        .dq = bd->dq + b * bd->dq_sb + h * bd->dq_sh, .dq_sr = bd->dq_sr,
        .dk = bd->dk + b * bd->dk_sb + h * bd->dk_sh, .dk_sr = bd->dk_sr,
        .dv = bd->dv + b * bd->dv_sb + h * bd->dv_sh, .dv_sr = bd->dv_sr,
    };
}

vitc_status vitc__nn_attn_dropout_backward(const vitc__sdpa_bwd_desc *bd, const float *P,
                                           const uint8_t *keep, float p, vitc__buf *tmp) {
    const vitc__sdpa_desc *f = &bd->f;
    int64_t L = f->L, S = f->S, LS = L * S;
    VITC_TRY(vitc__buf_reserve(tmp, (size_t)LS));
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            int64_t bh = b * f->H + h;
            vitc__nn_head_grad hg = vitc__nn_head_at(bd, b, h);
            vitc__nn_dropout_attn_head_backward(&hg, P + bh * LS, keep + bh * LS, p, tmp->p);
        }
    return VITC_OK;
}

/* The sdpa view of a cross-attention's recorded q [L, C] (shared by the
 * images), kv [B, S, 2C], att [B, L, C]. */
static vitc__sdpa_desc nn_cross_view(const vitc__nn_cross *p, const vitc__nn_cross_rec *r) {
    int64_t C = p->C, d = C / p->H, S = p->S, L = p->L;
    vitc__sdpa_desc sd = {
        .B = p->B, .H = p->H, .L = L, .S = S, .D = d, .Dv = d,
        .q = r->q, .q_sb = 0, .q_sh = d, .q_sr = C,
        .k = r->kv, .k_sb = S * 2 * C, .k_sh = d, .k_sr = 2 * C,
        .v = r->kv + C, .v_sb = S * 2 * C, .v_sh = d, .v_sr = 2 * C,
        .o = r->att, .o_sb = L * C, .o_sh = d, .o_sr = C,
        .scale = 1.0f / sqrtf((float)d),
        .lse = r->lse, .lse_sb = p->H * L, .lse_sh = L,
    };
    return sd;
}

vitc_status vitc__nn_cross_forward(const vitc__nn_cross *p, float *y, const float *x,
                                   const vitc__nn_cross_rec *r, vitc__buf *mask_buf) {
    int64_t C = p->C, B = p->B, L = p->L, S = p->S;
    vitc__linear(r->q, C, p->probe, C, p->in_w, p->in_b, NULL, 0, L, C, C);
    vitc__linear(r->kv, 2 * C, x, C, p->in_w + C * C, p->in_b ? p->in_b + C : NULL, NULL, 0,
                 B * S, 2 * C, C);
    vitc__sdpa_desc sd = nn_cross_view(p, r);
    VITC_TRY(vitc__nn_mask_apply(&p->mask, mask_buf, &sd));
    VITC_TRY(vitc__sdpa(&sd));
    vitc__linear(y, C, r->att, C, p->out_w, p->out_b, NULL, 0, B * L, C, C);
    return VITC_OK;
}

vitc_status vitc__nn_cross_backward(const vitc__nn_cross *p, const vitc__nn_cross *g, float *dx,
                                    const float *dy, const float *x, const vitc__nn_cross_rec *r,
                                    float *datt, float *dq, float *dkv, vitc__buf *mask_buf) {
    int64_t C = p->C, B = p->B, L = p->L, S = p->S, d = C / p->H;
    vitc__linear_backward(datt, C, 0.0f, (float *)g->out_w, (float *)g->out_b, dy, C, r->att, C,
                          p->out_w, B * L, C, C);
    vitc__sdpa_bwd_desc bd = {.f = nn_cross_view(p, r)};
    VITC_TRY(vitc__nn_mask_apply(&p->mask, mask_buf, &bd.f));
    /* dq per image (the query rows are shared: summed after). */
    bd.dout = datt, bd.do_sb = L * C, bd.do_sh = d, bd.do_sr = C;
    bd.dq = dq, bd.dq_sb = L * C, bd.dq_sh = d, bd.dq_sr = C;
    bd.dk = dkv, bd.dk_sb = S * 2 * C, bd.dk_sh = d, bd.dk_sr = 2 * C;
    bd.dv = dkv + C, bd.dv_sb = S * 2 * C, bd.dv_sh = d, bd.dv_sr = 2 * C;
    VITC_TRY(vitc__sdpa_backward(&bd));
    vitc__linear_backward(dx, C, 0.0f, g->in_w ? (float *)g->in_w + C * C : NULL,
                          g->in_b ? (float *)g->in_b + C : NULL, dkv, 2 * C, x, C,
                          p->in_w + C * C, B * S, 2 * C, C);
    /* q = probe Wq^T + bq for every image: the images' dq summed over the batch. */
    for (int64_t b = 1; b < B; b++)
        for (int64_t i = 0; i < L * C; i++) dq[i] += dq[b * L * C + i];
    vitc__linear_backward((float *)g->probe, C, 1.0f, (float *)g->in_w, (float *)g->in_b, dq, C,
                          p->probe, C, p->in_w, L, C, C);
    return VITC_OK;
}

/* ---- the self-attention sublayer ------------------------------------ */

/* The sdpa view of qkv [B, N, 3D] (heads grouped: head h's q at h*d) and
 * att [B, N, D]. */
static vitc__sdpa_desc nn_attn_view(const vitc__nn_attn *p, const vitc__nn_attn_rec *r) {
    int64_t D = p->D, d = D / p->H, N = p->N;
    vitc__sdpa_desc sd = {
        .B = p->B, .H = p->H, .L = N, .S = N, .D = d, .Dv = d,
        .q = r->qkv, .q_sb = N * 3 * D, .q_sh = d, .q_sr = 3 * D,
        .k = r->qkv + D, .k_sb = N * 3 * D, .k_sh = d, .k_sr = 3 * D,
        .v = r->qkv + 2 * D, .v_sb = N * 3 * D, .v_sh = d, .v_sr = 3 * D,
        .o = r->att, .o_sb = N * D, .o_sh = d, .o_sr = D,
        .scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)d),
        .lse = r->lse, .lse_sb = p->H * N, .lse_sh = N,
    };
    return sd;
}

vitc_status vitc__nn_attn_forward(const vitc__nn_attn *p, float *y, const float *x,
                                  const vitc__nn_attn_rec *r, vitc__buf *mask_buf) {
    int64_t M = p->B * p->N, D = p->D;
    vitc__linear(r->qkv, 3 * D, x, p->Cin, p->qkv_w, p->qkv_b, NULL, 0, M, 3 * D, p->Cin);
    vitc__sdpa_desc sd = nn_attn_view(p, r);
    VITC_TRY(vitc__nn_mask_apply(&p->mask, mask_buf, &sd));
    VITC_TRY(vitc__sdpa(&sd));
    vitc__linear(y, p->Cout, r->att, D, p->out_w, p->out_b, p->v_skip ? r->qkv + 2 * D : NULL,
                 3 * D, M, p->Cout, D);
    return VITC_OK;
}

vitc_status vitc__nn_attn_backward(const vitc__nn_attn *p, const vitc__nn_attn *g, float *dx,
                                   const float *dy, const float *x, const vitc__nn_attn_rec *r,
                                   float *datt, float *dqkv, vitc__buf *mask_buf) {
    int64_t M = p->B * p->N, D = p->D, d = D / p->H, N = p->N;
    vitc__linear_backward(datt, D, 0.0f, (float *)g->out_w, (float *)g->out_b, dy, p->Cout,
                          r->att, D, p->out_w, M, p->Cout, D);
    vitc__sdpa_bwd_desc bd = {.f = nn_attn_view(p, r)};
    VITC_TRY(vitc__nn_mask_apply(&p->mask, mask_buf, &bd.f));
    bd.dout = datt, bd.do_sb = N * D, bd.do_sh = d, bd.do_sr = D;
    bd.dq = dqkv, bd.dq_sb = N * 3 * D, bd.dq_sh = d, bd.dq_sr = 3 * D;
    bd.dk = dqkv + D, bd.dk_sb = N * 3 * D, bd.dk_sh = d, bd.dk_sr = 3 * D;
    bd.dv = dqkv + 2 * D, bd.dv_sb = N * 3 * D, bd.dv_sh = d, bd.dv_sr = 3 * D;
    VITC_TRY(vitc__sdpa_backward(&bd));
    if (p->v_skip) /* y = v + out_proj(o): dy reaches v directly too */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < D; j++) dqkv[i * 3 * D + 2 * D + j] += dy[i * p->Cout + j];
    vitc__linear_backward(dx, p->Cin, 0.0f, (float *)g->qkv_w, (float *)g->qkv_b, dqkv, 3 * D, x,
                          p->Cin, p->qkv_w, M, 3 * D, p->Cin);
    return VITC_OK;
}
