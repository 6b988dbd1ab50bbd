/*
 * vit_backward.c — the gradient of the last training forward (vit.c), read
 * bottom-up beside it:
 *
 *   out = head(x_L)                 the family's head (logits or embedding)
 *   per block, last to first:       nn/block.c's backward
 *   x_0 = [prefix tokens, conv_proj(images)] + positions  (then CLIP's pre-norm)
 *
 * Parameter gradients accumulate into m->grad (torch's .grad); g is the
 * gradient of the residual stream, carried from block to block.
 */
#include <string.h>

#include "../kernels/kernels.h"
#include "../rng.h"
#include "family.h"
#include "vit_internal.h"

/* Scratch of one backward, carved from ss->bwd: the block's (nn/block.c),
 * then dpos [N, C] (the position embedding used) and a head's [B (N + 2), C]. */
typedef struct vit_bwd {
    vitc__nn_block_bwd b;
    float *dpos, *head;
} vit_bwd;

static vitc_status vit_bwd_scratch(const vitc_vit *m, vitc__session *ss, vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    size_t BN = (size_t)(ss->a.B * ss->a.N), C = (size_t)c->hidden_dim, sz[9], total = 0;
    int ok = vitc__mul_size(BN, C, &sz[0]) && vitc__mul_size(BN, 3 * C, &sz[4]) &&
             vitc__mul_size(BN, (size_t)c->mlp_dim, &sz[5]) && vitc__mul_size(BN, 2, &sz[6]) &&
             vitc__mul_size((size_t)ss->a.N, C, &sz[7]) &&
             vitc__mul_size(BN + 2 * (size_t)ss->a.B, C, &sz[8]);
    sz[1] = sz[2] = sz[3] = sz[0];
    size_t off[9];
    for (int i = 0; ok && i < 9; i++) {
        off[i] = total;
        ok = vitc__add_size(sz[i], 15, &sz[i]) && vitc__add_size(total, sz[i] & ~(size_t)15, &total);
    }
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "ViT backward scratch overflows");
    VITC_TRY(vitc__buf_reserve(&ss->bwd, total));
    float **dst[9] = {&s->b.g, &s->b.gmid, &s->b.dln, &s->b.datt, &s->b.dqkv, &s->b.dh,
                      &s->b.stats, &s->dpos, &s->head};
    for (int i = 0; i < 9; i++) *dst[i] = ss->bwd.p + off[i];
    return VITC_OK;
}

/* What the recorded forward returned. */
typedef enum { VIT_OUT_CLS, VIT_OUT_MEAN2, VIT_OUT_CLS_MEAN, VIT_OUT_MEAN, VIT_OUT_MAP } vit_out;

static vit_out vit_output_kind(const vitc_vit *m) {
    vitc__vit_head h = vitc__vit_emb_head(m);
    if (h == VIT_HEAD_MEAN2)
        return VIT_OUT_MEAN2;
    if (h == VIT_HEAD_CLS_MEAN)
        return VIT_OUT_CLS_MEAN;
    if (h == VIT_HEAD_MAP)
        return VIT_OUT_MAP;
    return m->n_cls ? VIT_OUT_CLS : VIT_OUT_MEAN; /* CLS, PROJ, a backbone's class token */
}

/* The SigLIP head's backward: its forward again (recorded in head_buf),
 * then dh [B, N, C] = d(MAP(h))/dh of dout [B, C]. */
static vitc_status vit_map_backward(vitc_vit *m, vitc__session *ss, const float *h,
                                    const float *dout, float *dh) {
    const vitc_vit_config *c = &m->cfg;
    int64_t B = ss->a.B, N = ss->a.N, C = c->hidden_dim, M = c->mlp_dim;
    size_t n;
    if (!vitc__mul_size((size_t)(B * N), (size_t)(2 * C), &n) ||
        !vitc__add_size(n, (size_t)(B * (5 * C + M + 2)), &n))
        return vitc__err(VITC_ERR_NOMEM, "attention-pooling head backward overflows");
    VITC_TRY(vitc__buf_reserve(&ss->feat_buf, n));
    float *dkv = ss->feat_buf.p, *da = dkv + B * N * 2 * C, *dln = da + B * C, *datt = dln + B * C;
    float *dq = datt + B * C, *out = dq + B * C, *dhid = out + B * C, *stats = dhid + B * M;
    vitc__vit_map_rec r;
    VITC_TRY(vitc__vit_map_head(m, ss, h, B, N, out, &r));
    /* out = a + mlp(ln(a)): da = dout + ln's share of the MLP's gradient */
    vitc__nn_mlp f = vitc__vit_map_mlp(m, &m->w), gf = vitc__vit_map_mlp(m, &m->g);
    vitc__nn_mlp_backward(&f, &gf, dln, 0.0f, dout, r.ln, r.hpre, r.hact, B, dhid);
    vitc__layernorm_backward_res(da, dout, m->g.map_ln_w, m->g.map_ln_b, dln, r.a, m->w.map_ln_w,
                                 B, C, c->norm_eps, stats);
    vitc__nn_cross p = vitc__vit_map_attn(m, &m->w, B, N), gp = vitc__vit_map_attn(m, &m->g, B, N);
    return vitc__nn_cross_backward(&p, &gp, dh, da, h, &r.x, datt, dq, dkv, &ss->mask_buf);
}

/* The head's backward: s->b.g = dL/dy for the last block's output y
 * ([B, C] when it ran on the class rows alone, else [B, N, C]). */
static vitc_status vit_head_backward(vitc_vit *m, vitc__session *ss, const float *dout,
                                     vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &ss->a;
    int64_t B = a->B, N = a->N, C = c->hidden_dim, K = vitc__vit_head_rows(m), np = m->n_prefix;
    const float *y = vitc__va(a, c->depth, VA_X); /* [B, N, C] or [B, C] */
    float *g = s->b.g, *stats = s->b.stats;
    vit_out kind = vit_output_kind(m);
    if (kind == VIT_OUT_CLS) {
        /* out = head(ln(y[:, 0])) (a classifier, CLIP's projection) or ln(y[:, 0]) */
        float *dcls = s->head, *dx = s->head + B * C; /* [B, C] each */
        if (vitc__vit_emb_head(m) == VIT_HEAD_CLS || vitc__vit_emb_head(m) == VIT_HEAD_PROJ)
            vitc__linear_backward(dcls, C, 0.0f, m->g.head_w, m->g.head_b, dout, K, a->cls_out, C,
                                  m->w.head_w, B, K, C);
        else
            memcpy(dcls, dout, (size_t)(B * C) * sizeof(float));
        memset(dx, 0, (size_t)(B * C) * sizeof(float));
        vitc__layernorm_backward(dx, m->g.ln_w, m->g.ln_b, dcls, a->cls_in, m->w.ln_w, B, C,
                                 c->norm_eps, stats);
        if (ss->rec_cls_only) {
            memcpy(g, dx, (size_t)(B * C) * sizeof(float));
        } else {
            memset(g, 0, (size_t)(B * N * C) * sizeof(float));
            for (int64_t b = 0; b < B; b++)
                memcpy(g + b * N * C, dx + b * C, (size_t)C * sizeof(float));
        }
        return VITC_OK;
    }
    if (kind == VIT_OUT_MEAN2) {
        /* out = (head(t0) + head2(t1)) / 2, t = ln(y[:, 0:2]) */
        float *t = s->head, *dt = t + 2 * B * C, *x2 = s->b.gmid; /* [B, 2, C] */
        VITC_TRY(vitc__buf_reserve(&ss->feat_buf, (size_t)(B * K)));
        float *half = ss->feat_buf.p; /* [B, K] */
        for (int64_t b = 0; b < B; b++)
            memcpy(x2 + b * 2 * C, y + b * N * C, (size_t)(2 * C) * sizeof(float));
        vitc__layernorm(t, x2, m->w.ln_w, m->w.ln_b, 2 * B, C, c->norm_eps);
        for (int64_t i = 0; i < B * K; i++) half[i] = 0.5f * dout[i];
        vitc__linear_backward(dt, 2 * C, 0.0f, m->g.head_w, m->g.head_b, half, K, t, 2 * C,
                              m->w.head_w, B, K, C);
        vitc__linear_backward(dt + C, 2 * C, 0.0f, m->g.head2_w, m->g.head2_b, half, K, t + C,
                              2 * C, m->w.head2_w, B, K, C);
        memset(g, 0, (size_t)(B * N * C) * sizeof(float));
        float *dx2 = s->b.dln; /* [B, 2, C] */
        memset(dx2, 0, (size_t)(2 * B * C) * sizeof(float));
        vitc__layernorm_backward(dx2, m->g.ln_w, m->g.ln_b, dt, x2, m->w.ln_w, 2 * B, C,
                                 c->norm_eps, stats);
        for (int64_t b = 0; b < B; b++)
            memcpy(g + b * N * C, dx2 + b * 2 * C, (size_t)(2 * C) * sizeof(float));
        return VITC_OK;
    }
    /* The rest read every token through the final LayerNorm: dh [B, N, C] first. */
    float *dh = s->b.gmid;
    if (kind == VIT_OUT_CLS_MEAN) {
        /* out = head([h0, mean(h[np:])]) */
        float *h = s->b.dln, *in = s->head, *din = in + 2 * B * C; /* [B,N,C], [B,2C], [B,2C] */
        vitc__layernorm(h, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
        vitc__vit_cls_mean(in, h, B, N, C, np);
        vitc__linear_backward(din, 2 * C, 0.0f, m->g.head_w, m->g.head_b, dout, K, in, 2 * C,
                              m->w.head_w, B, K, 2 * C);
        memset(dh, 0, (size_t)(B * N * C) * sizeof(float));
        for (int64_t b = 0; b < B; b++) {
            const float *r = din + b * 2 * C;
            memcpy(dh + b * N * C, r, (size_t)C * sizeof(float));
            for (int64_t tk = np; tk < N; tk++)
                for (int64_t j = 0; j < C; j++) dh[(b * N + tk) * C + j] = r[C + j] / (float)(N - np);
        }
    } else if (kind == VIT_OUT_MEAN) { /* out = mean(h[np:]) */
        memset(dh, 0, (size_t)(B * N * C) * sizeof(float));
        for (int64_t b = 0; b < B; b++)
            for (int64_t tk = np; tk < N; tk++)
                for (int64_t j = 0; j < C; j++)
                    dh[(b * N + tk) * C + j] = dout[b * C + j] / (float)(N - np);
    } else { /* SigLIP: out = MAP(h) */
        float *h = s->b.dln;
        vitc__layernorm(h, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
        VITC_TRY(vit_map_backward(m, ss, h, dout, dh));
    }
    memset(g, 0, (size_t)(B * N * C) * sizeof(float));
    vitc__layernorm_backward(g, m->g.ln_w, m->g.ln_b, dh, y, m->w.ln_w, B * N, C, c->norm_eps,
                             stats);
    return VITC_OK;
}

/* x_0 = [cls + pos_0, dist + pos_1, registers, conv_proj(patches) + pos_patches]
 * (then pre_layrnorm): s->b.g = dL/dx_0 [B, N, C]. */
static vitc_status vit_embed_backward(vitc_vit *m, vitc__session *ss, vit_bwd *s) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &ss->a;
    int64_t B = a->B, N = a->N, P = a->P, C = c->hidden_dim, np = m->n_prefix;
    int64_t npos = np - m->n_reg, nc = m->n_cls;
    int64_t p = c->patch_size, Kc = (int64_t)c->in_channels * p * p;
    float *g = s->b.g;
    uint8_t *emb = vitc__vit_emb_mask(ss);
    if (emb && m->dropout > 0.0f)
        vitc__dropout_apply(g, g, emb, B * N * C, m->dropout);
    if (m->pre_norm) { /* x_0 = pre_layrnorm(t): the recorded t */
        float *dt = s->b.gmid;
        memset(dt, 0, (size_t)(B * N * C) * sizeof(float));
        vitc__layernorm_backward(dt, m->g.pre_w, m->g.pre_b, g, ss->pre_buf.p, m->w.pre_w, B * N, C,
                                 c->norm_eps, s->b.stats);
        memcpy(g, dt, (size_t)(B * N * C) * sizeof(float));
    }
    /* Sums over the batch for the shared tokens and positions. */
    float *dsum = s->dpos; /* [N, C] */
    memset(dsum, 0, (size_t)(N * C) * sizeof(float));
    vitc__colsum(dsum, g, N * C, B, N * C); /* over images in order, threaded */
    if (nc)
        for (int64_t j = 0; j < C; j++) m->g.cls[j] += dsum[j];
    if (m->n_dist)
        for (int64_t j = 0; j < C; j++) m->g.dist[j] += dsum[nc * C + j];
    for (int64_t j = 0; j < m->n_reg * C; j++) m->g.reg[j] += dsum[npos * C + j];
    /* The position rows used: [0, npos) then the patches' (registers have none). */
    memmove(dsum + npos * C, dsum + np * C, (size_t)(P * C) * sizeof(float));
    int64_t g0 = c->image_size / c->patch_size;
    if (m->t2t) {
        /* T2T-ViT's sinusoid table is a constant (requires_grad=False): no gradient */
    } else if (ss->rec_gh == g0 && ss->rec_gw == g0) {
        for (int64_t i = 0; i < (npos + P) * C; i++) m->g.pos[i] += dsum[i];
    } else { /* resampled: the prefix rows as they are, the grid through the adjoint */
        for (int64_t i = 0; i < npos * C; i++) m->g.pos[i] += dsum[i];
        VITC_TRY(vitc__vit_pos_backward(m, m->g.pos + npos * C, dsum + npos * C, ss->rec_gh,
                                        ss->rec_gw));
    }
    /* Patch embedding: dW += dproj^T patches, db += column sums. */
    float *dproj = s->b.gmid; /* [B*P, C] */
    for (int64_t b = 0; b < B; b++)
        memcpy(dproj + b * P * C, g + (b * N + np) * C, (size_t)(P * C) * sizeof(float));
    if (m->fam && m->fam->embed_backward) /* the family's own embedding (T2T's tokens_to_token) */
        return m->fam->embed_backward(m, ss, dproj, B, (int64_t)ss->rec_gh * p,
                                      (int64_t)ss->rec_gw * p);
    vitc__linear_backward(NULL, 0, 0.0f, m->g.conv_w, m->g.conv_b, dproj, C, a->patches, Kc,
                          m->w.conv_w, B * P, C, Kc);
    return VITC_OK;
}

vitc_status vitc_vit_backward(vitc_vit *m, const float *dlogits) {
    if (!m || !dlogits)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_backward: NULL model or dlogits");
    char why[160];
    if (m->fam && m->fam->can_train && !m->fam->can_train(m, why, sizeof why))
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_backward: %s", why);
    vitc__session *ss = m->own; /* training records on the model's own session only */
    if (!ss || !ss->recorded)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_vit_backward: no recorded forward (call vitc_vit_set_training(m, "
                         "1) and vitc_vit_run or vitc_vit_forward first; a backward consumes the "
                         "recording)");
    const vitc_vit_config *c = &m->cfg;
    VITC_TRY(vitc__vit_grad_alloc(m));
    vit_bwd s;
    VITC_TRY(vit_bwd_scratch(m, ss, &s));
    /* The recording is spent: activations of a second backward would be
     * overwritten scratch in a later forward anyway, and torch refuses too. */
    ss->recorded = 0;
    if (m->head == VIT_HEAD_LINEAR) { /* logits = clf(e): the embedding's gradient first */
        int64_t B = ss->a.B, E = m->embed_dim, K = c->num_classes;
        float *e = ss->clf_buf.p, *de = e + B * E; /* [B, E] each (vit.c's vit_linear_head) */
        vitc__linear_backward(de, E, 0.0f, m->g.clf_w, m->g.clf_b, dlogits, K, e, E, m->w.clf_w,
                              B, K, E);
        dlogits = de;
    }
    VITC_TRY(vit_head_backward(m, ss, dlogits, &s));
    for (int l = c->depth - 1; l >= 0; l--) {
        vitc__nn_block b = vitc__vit_block_desc(m, ss, l, NULL);
        vitc__nn_block_w gw = m->gblocks[l];
        if (m->no_qkv_bias) /* qkv_bias=False: zero rows the model has no parameter for */
            gw.qkv_b = NULL;
        VITC_TRY(vitc__nn_block_backward(&b, ss->rec_cls_only && l == c->depth - 1, &gw, &s.b));
    }
    return vit_embed_backward(m, ss, &s);
}
