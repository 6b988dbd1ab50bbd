/*
 * vit_backward.c — the gradient of the last training forward (vit.c), read
 * bottom-up beside it:
 *
 *   logits = heads(ln(x_L[:, 0]))          head, final LayerNorm on class rows
 *   per block, last to first:
 *     y   = mid + fc2(gelu(fc1(ln_2(mid))))
 *     mid = x + out_proj(attn(qkv(ln_1(x))))   attention: vitc__sdpa_backward
 *   x_0 = cat(class_token, conv_proj(images)) + pos_embedding
 *
 * Parameter gradients accumulate into m->grad (torch's .grad); g is the
 * gradient of the residual stream, carried from block to block.
 */
#include <string.h>

#include "../kernels/kernels.h"
#include "../rng.h"
#include "vit_internal.h"

/* Scratch of one backward, carved from m->bwd. */
typedef struct vit_bwd {
    float *g, *gmid; /* [B, N, C] stream gradient at a block's output / at mid */
    float *dln;      /* [B, N, C] gradient at a LayerNorm output */
    float *datt;     /* [B, N, C] gradient at the attention output */
    float *dqkv;     /* [B, N, 3C] */
    float *dh;       /* [B, N, mlp] */
    float *stats;    /* [2 B N] LayerNorm mean/rstd */
    float *dpos;     /* [N, C] gradient at the position embedding used */
} vit_bwd;

static vitc_status vit_bwd_scratch(vitc_vit *m, vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    size_t BN = (size_t)(m->a.B * m->a.N), C = (size_t)c->hidden_dim, sz[8], total = 0;
    int ok = vitc__mul_size(BN, C, &sz[0]) && vitc__mul_size(BN, 3 * C, &sz[4]) &&
             vitc__mul_size(BN, (size_t)c->mlp_dim, &sz[5]) && vitc__mul_size(BN, 2, &sz[6]) &&
             vitc__mul_size((size_t)m->a.N, C, &sz[7]);
    sz[1] = sz[2] = sz[3] = sz[0];
    size_t off[8];
    for (int i = 0; ok && i < 8; i++) {
        off[i] = total;
        ok = vitc__add_size(sz[i], 15, &sz[i]) && vitc__add_size(total, sz[i] & ~(size_t)15, &total);
    }
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "ViT backward scratch overflows");
    VITC_TRY(vitc__buf_reserve(&m->bwd, total));
    float **dst[8] = {&s->g, &s->gmid, &s->dln, &s->datt, &s->dqkv, &s->dh, &s->stats, &s->dpos};
    for (int i = 0; i < 8; i++) *dst[i] = m->bwd.p + off[i];
    return VITC_OK;
}

/* The attention backward with dropped probabilities (o = dropout(P) V),
 * per head, from the kept P [B, H, N, N]:
 *   dV = Pd^T dO, dP = dropout(dO V^T), dS = P * (dP - rowsum(dP * P)),
 *   dQ = scale dS K, dK = scale dS^T Q. */
static vitc_status vit_attention_dropout_backward(vitc_vit *m, const vitc__sdpa_bwd_desc *bd,
                                                 const float *P, const uint8_t *keep) {
    const vitc__sdpa_desc *f = &bd->f;
    int64_t N = f->S, d = f->D, NN = N * N;
    float p = m->attention_dropout;
    VITC_TRY(vitc__buf_reserve(&m->pdrop, 2 * (size_t)NN));
    float *T = m->pdrop.p, *G = T + NN; /* [N, N] each */
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            int64_t bh = b * f->H + h;
            const float *Pb = P + bh * NN;
            const float *q = f->q + b * f->q_sb + h * f->q_sh, *k = f->k + b * f->k_sb + h * f->k_sh;
            const float *v = f->v + b * f->v_sb + h * f->v_sh;
            const float *dout = bd->dout + b * bd->do_sb + h * bd->do_sh;
            vitc__dropout_apply(T, Pb, keep + bh * NN, NN, p);
            vitc__gemm(1, 0, N, d, N, 1.0f, T, N, dout, bd->do_sr, 0.0f,
                       bd->dv + b * bd->dv_sb + h * bd->dv_sh, bd->dv_sr);
            vitc__gemm(0, 1, N, N, d, 1.0f, dout, bd->do_sr, v, f->v_sr, 0.0f, G, N);
            vitc__dropout_apply(G, G, keep + bh * NN, NN, p);
            for (int64_t i = 0; i < N; i++) {
                float *g = G + i * N;
                const float *pr = Pb + i * N;
                float r = 0.0f;
                for (int64_t j = 0; j < N; j++) r += g[j] * pr[j];
                for (int64_t j = 0; j < N; j++) g[j] = pr[j] * (g[j] - r);
            }
            vitc__gemm(0, 0, N, d, N, f->scale, G, N, k, f->k_sr, 0.0f,
                       bd->dq + b * bd->dq_sb + h * bd->dq_sh, bd->dq_sr);
            vitc__gemm(1, 0, N, d, N, f->scale, G, N, q, f->q_sr, 0.0f,
                       bd->dk + b * bd->dk_sb + h * bd->dk_sh, bd->dk_sr);
        }
    return VITC_OK;
}

/* Block l backward: s->g holds dL/dy on entry and dL/dx on return. */
static vitc_status vit_block_backward(vitc_vit *m, int l, vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &m->a;
    const vitc__vit_block *w = &m->blocks[l];
    vitc__vit_block *gw = &m->gblocks[l];
    int64_t B = a->B, N = a->N, C = c->hidden_dim, M = c->mlp_dim, BN = B * N;
    const float *x = vitc__va(a, l, VA_X), *ln1 = vitc__va(a, l, VA_LN1);
    const float *qkv = vitc__va(a, l, VA_QKV), *mid = vitc__va(a, l, VA_MID);
    const float *ln2 = vitc__va(a, l, VA_LN2), *hpre = vitc__va(a, l, VA_HPRE);
    const float *hact = vitc__va(a, l, VA_HACT);
    float *att = vitc__va(a, l, VA_ATT), *lse = vitc__va(a, l, VA_LSE);

    vitc__vit_mask k = vitc__vit_block_mask(m, l);
    /* y = mid + fc2(h): dmid = g + ln_2's share, dh = g W2. */
    /* gmid = g + ln_2's share: a copy first only when the branch's
     * regularisation is about to change g in place. */
    const float *gres = s->g;
    if (k.out) {
        memcpy(s->gmid, s->g, (size_t)(BN * C) * sizeof(float));
        gres = s->gmid;
        vitc__vit_branch(m, l, s->g, k.out, k.dp_mlp);
    }
    vitc__linear_backward(s->dh, M, 0.0f, gw->fc2_w, gw->fc2_b, s->g, C, hact, M, w->fc2_w, BN, C,
                          M);
    if (k.hid && m->dropout > 0.0f)
        vitc__dropout_apply(s->dh, s->dh, k.hid, BN * M, m->dropout);
    vitc__gelu_backward(s->dh, s->dh, hpre, BN * M);
    vitc__linear_backward(s->dln, C, 0.0f, gw->fc1_w, gw->fc1_b, s->dh, M, ln2, C, w->fc1_w, BN,
                          M, C);
    vitc__layernorm_backward_res(s->gmid, gres, gw->ln2_w, gw->ln2_b, s->dln, mid, w->ln2_w, BN,
                                 C, c->norm_eps, s->stats);
    /* mid = x + out_proj(att): dx = dmid + ln_1's share (g is free now). */
    gres = s->gmid;
    if (k.att) {
        memcpy(s->g, s->gmid, (size_t)(BN * C) * sizeof(float));
        gres = s->g;
        vitc__vit_branch(m, l, s->gmid, k.att, k.dp_att);
    }
    vitc__linear_backward(s->datt, C, 0.0f, gw->proj_w, gw->proj_b, s->gmid, C, att, C, w->proj_w,
                          BN, C, C);
    vitc__sdpa_bwd_desc bd = {.f = vitc__vit_attention(m, qkv, att, B, N, N)};
    bd.f.lse = lse;
    bd.f.lse_sb = c->num_heads * N;
    bd.f.lse_sh = N;
    bd.dout = s->datt, bd.do_sb = bd.f.o_sb, bd.do_sh = bd.f.o_sh, bd.do_sr = bd.f.o_sr;
    bd.dq = s->dqkv, bd.dq_sb = bd.f.q_sb, bd.dq_sh = bd.f.q_sh, bd.dq_sr = bd.f.q_sr;
    bd.dk = s->dqkv + C, bd.dk_sb = bd.f.k_sb, bd.dk_sh = bd.f.k_sh, bd.dk_sr = bd.f.k_sr;
    bd.dv = s->dqkv + 2 * C, bd.dv_sb = bd.f.v_sb, bd.dv_sh = bd.f.v_sh, bd.dv_sr = bd.f.v_sr;
    if (k.probs)
        VITC_TRY(vit_attention_dropout_backward(m, &bd, vitc__va(a, l, VA_PROBS), k.probs));
    else
        VITC_TRY(vitc__sdpa_backward(&bd));
    vitc__linear_backward(s->dln, C, 0.0f, gw->qkv_w, gw->qkv_b, s->dqkv, 3 * C, ln1, C, w->qkv_w,
                          BN, 3 * C, C);
    vitc__layernorm_backward_res(s->g, gres, gw->ln1_w, gw->ln1_b, s->dln, x, w->ln1_w, BN, C,
                                 c->norm_eps, s->stats);
    return VITC_OK;
}

/* The last block of a forward that ran it on the class rows only (vit.c's
 * cls_only, m->rec_cls_only): the loss reads x_L[:, 0] alone, so every
 * other row's gradient after the attention is exactly zero and the MLP,
 * ln_2 and out_proj backward run on B rows instead of B*N (torch computes
 * the same sums with zero rows added). mid, ln2, hpre, hact are [B, C] /
 * [B, mlp] compact; att's class rows are N*C apart. The attention backward
 * has one query per image: dq for the class rows, dk, dv for every row,
 * so qkv's backward is two products: k, v over all rows, q over class rows.
 * s->g holds dL/dy [B, C] (compact) on entry and dL/dx [B, N, C] on return. */
static vitc_status vit_last_block_backward_cls(vitc_vit *m, int l, vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &m->a;
    const vitc__vit_block *w = &m->blocks[l];
    vitc__vit_block *gw = &m->gblocks[l];
    int64_t B = a->B, N = a->N, C = c->hidden_dim, M = c->mlp_dim, BN = B * N, NC = N * C;
    const float *x = vitc__va(a, l, VA_X), *ln1 = vitc__va(a, l, VA_LN1);
    const float *qkv = vitc__va(a, l, VA_QKV), *mid = vitc__va(a, l, VA_MID);
    const float *ln2 = vitc__va(a, l, VA_LN2), *hpre = vitc__va(a, l, VA_HPRE);
    const float *hact = vitc__va(a, l, VA_HACT);
    float *att = vitc__va(a, l, VA_ATT), *lse = vitc__va(a, l, VA_LSE);
    float *g = s->g, *gmid = s->gmid; /* [B, C] */
    float *datt = s->datt, *dq = s->datt + B * C; /* [B, C] each (N >= 2: both fit) */

    vitc__linear_backward(s->dh, M, 0.0f, gw->fc2_w, gw->fc2_b, g, C, hact, M, w->fc2_w, B, C, M);
    vitc__gelu_backward(s->dh, s->dh, hpre, B * M);
    vitc__linear_backward(s->dln, C, 0.0f, gw->fc1_w, gw->fc1_b, s->dh, M, ln2, C, w->fc1_w, B, M,
                          C);
    vitc__layernorm_backward_res(gmid, g, gw->ln2_w, gw->ln2_b, s->dln, mid, w->ln2_w, B, C,
                                 c->norm_eps, s->stats);
    vitc__linear_backward(datt, C, 0.0f, gw->proj_w, gw->proj_b, gmid, C, att, NC, w->proj_w, B,
                          C, C);
    vitc__sdpa_bwd_desc bd = {.f = vitc__vit_attention(m, qkv, att, B, N, 1)};
    bd.f.lse = lse;
    bd.f.lse_sb = c->num_heads * N;
    bd.f.lse_sh = N;
    int64_t d = C / c->num_heads;
    bd.dout = datt, bd.do_sb = C, bd.do_sh = d, bd.do_sr = C;
    bd.dq = dq, bd.dq_sb = C, bd.dq_sh = d, bd.dq_sr = C;
    bd.dk = s->dqkv + C, bd.dk_sb = bd.f.k_sb, bd.dk_sh = bd.f.k_sh, bd.dk_sr = bd.f.k_sr;
    bd.dv = s->dqkv + 2 * C, bd.dv_sb = bd.f.v_sb, bd.dv_sh = bd.f.v_sh, bd.dv_sr = bd.f.v_sr;
    VITC_TRY(vitc__sdpa_backward(&bd));
    /* qkv rows C..3C (k, v) over every row, then rows 0..C (q) over the class rows, added. */
    vitc__linear_backward(s->dln, C, 0.0f, gw->qkv_w + C * C, gw->qkv_b + C, s->dqkv + C, 3 * C,
                          ln1, C, w->qkv_w + C * C, BN, 2 * C, C);
    vitc__linear_backward(s->dln, NC, 1.0f, gw->qkv_w, gw->qkv_b, dq, C, ln1, NC, w->qkv_w, B, C,
                          C);
    /* mid = x + out_proj(att): the residual's gradient is gmid on class rows, 0 elsewhere. */
    memset(g, 0, (size_t)(BN * C) * sizeof(float));
    for (int64_t b = 0; b < B; b++)
        memcpy(g + b * NC, gmid + b * C, (size_t)C * sizeof(float));
    vitc__layernorm_backward_res(g, g, gw->ln1_w, gw->ln1_b, s->dln, x, w->ln1_w, BN, C,
                                 c->norm_eps, s->stats);
    return VITC_OK;
}

vitc_status vitc_vit_backward(vitc_vit *m, const float *dlogits) {
    if (!m || !dlogits)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_backward: NULL model or dlogits");
    if (m->t2t)
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_backward: T2T-ViT runs forward only "
                         "(inference)");
    /* The backward has torchvision's block: no layer scale, SwiGLU or other activation. */
    if (m->n_prefix != 1 || m->head != VIT_HEAD_CLS || m->layer_scale || m->swiglu ||
        m->mlp_act != VIT_ACT_GELU || m->pre_norm)
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_backward: training a %s model (%d prefix "
                         "tokens, %s) is not supported", m->family, m->n_prefix,
                         m->head == VIT_HEAD_NONE   ? "no head"
                         : m->head != VIT_HEAD_CLS  ? "its head"
                         : m->layer_scale           ? "layer scale"
                                                    : "its block");
    if (!m->recorded)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_vit_backward: no recorded forward (call vitc_vit_set_training(m, "
                         "1) and vitc_vit_forward first; a backward consumes the recording)");
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &m->a;
    int64_t B = a->B, N = a->N, P = a->P, C = c->hidden_dim, K = c->num_classes;
    int64_t p = c->patch_size, Kc = (int64_t)c->in_channels * p * p;
    VITC_TRY(vitc__vit_grad_alloc(m));
    vit_bwd s;
    VITC_TRY(vit_bwd_scratch(m, &s));
    /* The recording is spent: activations of a second backward would be
     * overwritten scratch in a later forward anyway, and torch refuses too. */
    m->recorded = 0;

    /* Head and final LayerNorm, on the class rows only. */
    float *dcls = s.dln; /* [B, C] */
    vitc__linear_backward(dcls, C, 0.0f, m->g.head_w, m->g.head_b, dlogits, K, a->cls_out, C,
                          m->w.head_w, B, K, C);
    float *dclsx = s.datt; /* [B, C] */
    memset(dclsx, 0, (size_t)(B * C) * sizeof(float));
    vitc__layernorm_backward(dclsx, m->g.ln_w, m->g.ln_b, dcls, a->cls_in, m->w.ln_w, B, C,
                             c->norm_eps, s.stats);
    int last = c->depth - 1;
    if (m->rec_cls_only && last >= 0) { /* the last block's rows past its attention: [B, C] */
        memcpy(s.g, dclsx, (size_t)(B * C) * sizeof(float));
        VITC_TRY(vit_last_block_backward_cls(m, last, &s));
        last--;
    } else {
        memset(s.g, 0, (size_t)(B * N * C) * sizeof(float));
        for (int64_t b = 0; b < B; b++)
            memcpy(s.g + b * N * C, dclsx + b * C, (size_t)C * sizeof(float));
    }
    for (int l = last; l >= 0; l--) VITC_TRY(vit_block_backward(m, l, &s));

    uint8_t *emb = vitc__vit_emb_mask(m);
    if (emb && m->dropout > 0.0f)
        vitc__dropout_apply(s.g, s.g, emb, B * N * C, m->dropout);
    /* x_0 = cat(cls, proj) + pos: sum over the batch for the shared ones. */
    memset(s.dpos, 0, (size_t)(N * C) * sizeof(float));
    vitc__colsum(s.dpos, s.g, N * C, B, N * C); /* over images in order, threaded */
    for (int64_t j = 0; j < C; j++) m->g.cls[j] += s.dpos[j];
    int64_t g0 = c->image_size / c->patch_size;
    if (m->rec_gh == g0 && m->rec_gw == g0) {
        for (int64_t i = 0; i < N * C; i++) m->g.pos[i] += s.dpos[i];
    } else { /* interpolated: the class row as is, the grid through the adjoint */
        for (int64_t j = 0; j < C; j++) m->g.pos[j] += s.dpos[j];
        vitc__bicubic_ac_backward(m->g.pos + C, s.dpos + C, C, g0, g0, m->rec_gh, m->rec_gw);
    }
    /* Patch embedding: dW += dproj^T patches, db += column sums. */
    float *dproj = s.gmid; /* [B*P, C] */
    for (int64_t b = 0; b < B; b++)
        memcpy(dproj + b * P * C, s.g + (b * N + 1) * C, (size_t)(P * C) * sizeof(float));
    vitc__linear_backward(NULL, 0, 0.0f, m->g.conv_w, m->g.conv_b, dproj, C, a->patches, Kc,
                          m->w.conv_w, B * P, C, Kc);
    return VITC_OK;
}
