/*
 * block.c — the pre-norm transformer encoder block, forward and backward:
 *
 *   mid = x + ls1 * branch(out_proj(attn(qkv(ln_1(x)))))
 *   y   = mid + ls2 * branch(fc2(act(fc1(ln_2(mid)))))
 *
 * (torchvision's EncoderBlock, timm's Block, HF's ViTLayer / Dinov2Layer /
 * CLIPEncoderLayer / SiglipEncoderLayer.) The inference forward keeps the
 * fused paths: LayerNorm inside the qkv and fc1 GEMMs' packers, the
 * activation in fc1's epilogue, residual and layer scale in the epilogue,
 * packed weights. The backward reads what a training forward recorded.
 */
#include <math.h>
#include <string.h>

#include "nn.h"

vitc__sdpa_desc vitc__nn_block_attention(const vitc__nn_block *b, int64_t L) {
    int64_t C = b->C, Hh = b->H, d = C / Hh, N = b->N;
    vitc__sdpa_desc sd = {
        .B = b->B, .H = Hh, .L = L, .S = N, .D = d, .Dv = d,
        .q = b->qkv, .q_sb = N * 3 * C, .q_sh = d, .q_sr = 3 * C,
        .k = b->qkv + C, .k_sb = N * 3 * C, .k_sh = d, .k_sr = 3 * C,
        .v = b->qkv + 2 * C, .v_sb = N * 3 * C, .v_sh = d, .v_sr = 3 * C,
        .o = b->att, .o_sb = N * C, .o_sh = d, .o_sr = C,
        .scale = b->attn_scale > 0.0f ? b->attn_scale : 1.0f / sqrtf((float)d),
        .p_sb = Hh * N * N, .p_sh = N * N, .p_sr = N,
        .lse = b->lse, .lse_sb = Hh * N, .lse_sh = N,
    };
    return sd;
}

void vitc__nn_branch(const vitc__nn_block *b, float *x, int64_t R, const uint8_t *keep,
                     const uint8_t *dp_keep) {
    int64_t C = b->C;
    if (b->dropout > 0.0f)
        vitc__dropout_apply(x, x, keep, R * C, b->dropout);
    if (b->drop_path > 0.0f)
        vitc__drop_path_apply(x, x, dp_keep, b->B, R / b->B * C, b->drop_path, 0);
}

static void nn_branch_forward(const vitc__nn_block *b, float *x, int64_t R, uint8_t *keep,
                              uint8_t *dp_keep) {
    if (b->dropout > 0.0f)
        vitc__dropout_mask(keep, R * b->C, b->dropout, b->rng);
    if (b->drop_path > 0.0f)
        vitc__dropout_mask(dp_keep, b->B, b->drop_path, b->rng);
    vitc__nn_branch(b, x, R, keep, dp_keep);
}

static const vitc__pweight *nn_pw(const vitc__nn_block *b, int k) {
    return b->pw ? &b->pw[k] : NULL;
}

static void nn_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* A training forward's branch output: y [R, C] = res + (ls *) the branch
 * Linear(in [R, K]) regularised (its masks kept for the backward). */
static void nn_branch_out(const vitc__nn_block *b, float *y, const float *in, int64_t K,
                          const float *W, const float *bias, const float *ls, const float *res,
                          int64_t R, uint8_t *keep, uint8_t *dp_keep) {
    int64_t C = b->C;
    vitc__linear(y, C, in, K, W, bias, NULL, 0, R, C, K);
    nn_branch_forward(b, y, R, keep, dp_keep);
    if (ls)
        vitc__scale_add(y, C, ls, res, C, R, C);
    else
        nn_add(y, res, R * C);
}

vitc_status vitc__nn_block_forward(const vitc__nn_block *b, int cls_only) {
    const vitc__nn_block_w *w = b->w;
    const vitc__nn_block_masks *k = &b->k;
    int64_t B = b->B, N = b->N, C = b->C, M = b->M, BN = B * N;
    float *x = b->x, *ln1 = b->ln1, *qkv = b->qkv, *att = b->att, *mid = b->mid, *ln2 = b->ln2;
    float *hpre = b->hpre, *hact = b->hact, *y = b->y;
    /* Inference: nothing reads ln1 and ln2 after the linear layers they feed
     * (training's backward does), so the GEMMs that normalise rows as they
     * convert them may leave them unwritten (vitc__ln_pre.y_unused). */
    int infer = hact == hpre;
    /* ln1 = LayerNorm(x), by the qkv GEMM's packers where it can (vitc__linear_pw_ln). */
    vitc__ln_pre n1 = {ln1, x, w->ln1_w, w->ln1_b, b->eps, infer};
    /* R rows go on past the attention, rs apart in the [B, N, .] buffers. */
    int64_t R = cls_only ? B : BN, rs = cls_only ? N : 1;
    if (cls_only && !b->pw) { /* k, v of every row (weight rows C..3C), q of the class rows */
        vitc__layernorm(ln1, x, w->ln1_w, w->ln1_b, BN, C, b->eps);
        vitc__linear(qkv + C, 3 * C, ln1, C, w->qkv_w + C * C, w->qkv_b + C, NULL, 0, BN, 2 * C, C);
        vitc__linear(qkv, N * 3 * C, ln1, N * C, w->qkv_w, w->qkv_b, NULL, 0, B, C, C);
    } else { /* qkv [B, N, 3, H, d]: the kernel reads q, k, v of head h in place. Packed
              * weights are whole matrices: q of every row then (the same numbers). */
        VITC_TRY(vitc__linear_pw_ln(qkv, 3 * C, &n1, nn_pw(b, VITC__NN_PW_QKV), w->qkv_w,
                                    w->qkv_b, BN, 3 * C, C, 0));
    }
    vitc__sdpa_desc sd = vitc__nn_block_attention(b, cls_only ? 1 : N);
    sd.probs = b->probs;
    sd.prec = b->attn_prec;
    VITC_TRY(vitc__nn_mask_apply(&b->mask, b->mask_buf, &sd));
    if (k->probs) /* attention_dropout: the probabilities kept, o from the dropped ones */
        sd.probs = b->pkeep;
    VITC_TRY(vitc__sdpa(&sd));
    if (k->probs) {
        vitc__dropout_mask(k->probs, B * b->H * N * N, b->attention_dropout, b->rng);
        VITC_TRY(vitc__nn_attn_dropout_forward(&sd, k->probs, b->attention_dropout, b->tmp));
    }
    if (k->att) { /* the branch alone, regularised, (layer-scaled,) then the residual */
        nn_branch_out(b, mid, att, C, w->proj_w, w->proj_b, w->ls1, x, R, k->att, k->dp_att);
    } else if (w->ls1) { /* DINOv2: mid = x + ls1 * out_proj(att), in the GEMM's epilogue */
        VITC_TRY(vitc__linear_pw_scaled(mid, C, att, rs * C, nn_pw(b, VITC__NN_PW_PROJ),
                                        w->proj_w, w->proj_b, w->ls1, x, rs * C, R, C, C));
    } else {
        VITC_TRY(vitc__linear_pw(mid, C, att, rs * C, nn_pw(b, VITC__NN_PW_PROJ), w->proj_w,
                                 w->proj_b, x, rs * C, R, C, C, 0));
    }
    vitc__ln_pre n2 = {ln2, mid, w->ln2_w, w->ln2_b, b->eps, infer}; /* ln2 = LayerNorm(mid) */
    /* Inference: the activation in fc1's epilogue. Training keeps its input for backward. */
    int fused = hact == hpre && !b->swiglu;
    /* Training (row-major weights): hpre and GELU(hpre) from one epilogue. */
    int both = hact != hpre && b->act == VITC__NN_GELU && !b->swiglu && !b->pw;
    if (both) {
        vitc__layernorm(ln2, mid, w->ln2_w, w->ln2_b, R, C, b->eps);
        vitc__linear_act(hpre, M, hact, M, ln2, C, w->fc1_w, w->fc1_b, R, M, C);
    } else {
        VITC_TRY(vitc__linear_pw_ln(hpre, M, &n2, nn_pw(b, VITC__NN_PW_FC1), w->fc1_w, w->fc1_b,
                                    R, M, C, fused ? vitc__nn_act_kernel(b->act) : VITC__ACT_NONE));
        if (hact != hpre && !b->swiglu)
            memcpy(hact, hpre, (size_t)(R * M) * sizeof(float));
    }
    if (b->swiglu) { /* DINOv2 giant: [a, b] = chunk(fc1, 2); silu(a) * b */
        vitc__nn_swiglu_forward(hact, hpre, R, M);
        M /= 2; /* fc2 reads [R, M/2] */
    } else if (!fused && !both) {
        vitc__nn_act_forward(b->act, hact, R * M);
    }
    if (k->hid && b->dropout > 0.0f) { /* the MLP's Dropout after the activation */
        vitc__dropout_mask(k->hid, R * M, b->dropout, b->rng);
        vitc__dropout_apply(hact, hact, k->hid, R * M, b->dropout);
    }
    if (k->out) {
        nn_branch_out(b, y, hact, M, w->fc2_w, w->fc2_b, w->ls2, mid, R, k->out, k->dp_mlp);
    } else if (w->ls2) { /* y = mid + ls2 * fc2(hact) */
        VITC_TRY(vitc__linear_pw_scaled(y, C, hact, M, nn_pw(b, VITC__NN_PW_FC2), w->fc2_w,
                                        w->fc2_b, w->ls2, mid, C, R, C, M));
    } else {
        VITC_TRY(vitc__linear_pw(y, C, hact, M, nn_pw(b, VITC__NN_PW_FC2), w->fc2_w, w->fc2_b,
                                 mid, C, R, C, M, 0));
    }
    return VITC_OK;
}

/* A residual branch's gradient: out = res + ls * branch(f), f = lin(in).
 * gin [R, C] is dL/dout; on return gf (may be gin when no layer scale or
 * regularisation asked for a copy) holds dL/df. f_tmp [R, C]: scratch for
 * recomputing f (layer scale's gradient needs it); dls [C] +=. */
static const float *nn_branch_backward(const vitc__nn_block *b, const float *gin, float *gf,
                                       float *f_tmp, const float *ls, float *dls,
                                       const float *in, int64_t ldin, const float *W,
                                       const float *bias, int64_t R, int64_t K,
                                       const uint8_t *keep, const uint8_t *dp_keep) {
    int64_t C = b->C;
    if (!ls && !keep)
        return gin;
    if (ls) {
        if (dls) { /* dls = colsum(g * branch(f)) */
            vitc__linear(f_tmp, C, in, ldin, W, bias, NULL, 0, R, C, K);
            if (keep)
                vitc__nn_branch(b, f_tmp, R, keep, dp_keep);
            for (int64_t i = 0; i < R * C; i++) f_tmp[i] *= gin[i];
            vitc__colsum(dls, f_tmp, C, R, C);
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < C; j++) gf[r * C + j] = gin[r * C + j] * ls[j];
    } else {
        memcpy(gf, gin, (size_t)(R * C) * sizeof(float));
    }
    if (keep)
        vitc__nn_branch(b, gf, R, keep, dp_keep);
    return gf;
}

vitc_status vitc__nn_block_backward(const vitc__nn_block *b, int cls_only, vitc__nn_block_w *gw,
                                    const vitc__nn_block_bwd *s) {
    const vitc__nn_block_w *w = b->w;
    const vitc__nn_block_masks *k = &b->k;
    int64_t B = b->B, N = b->N, C = b->C, M = b->M, BN = B * N, NC = N * C;
    int64_t M2 = b->swiglu ? M / 2 : M;
    /* R rows past the attention (compact), rs apart in x / ln1 / att. */
    int64_t R = cls_only ? B : BN, rs = cls_only ? N : 1;
    const float *x = b->x, *ln1 = b->ln1, *mid = b->mid, *ln2 = b->ln2;
    const float *hpre = b->hpre, *hact = b->hact;
    float *att = b->att;

    /* y = mid + ls2 * branch(fc2(h)): the branch's gradient (in datt, free now). */
    const float *gf = nn_branch_backward(b, s->g, s->datt, s->dln, w->ls2, gw->ls2, hact, M2,
                                         w->fc2_w, w->fc2_b, R, M2, k->out, k->dp_mlp);
    /* dh: SwiGLU's [R, M/2] gradient goes to dh's back half (see vitc__nn_swiglu_backward's
     * row order), the others' in place. */
    float *dact = b->swiglu ? s->dh + R * M2 : s->dh;
    vitc__linear_backward(dact, M2, 0.0f, gw->fc2_w, gw->fc2_b, gf, C, hact, M2, w->fc2_w, R, C,
                          M2);
    if (k->hid && b->dropout > 0.0f)
        vitc__dropout_apply(dact, dact, k->hid, R * M2, b->dropout);
    if (b->swiglu)
        vitc__nn_swiglu_backward(s->dh, dact, hpre, R, M);
    else
        vitc__nn_act_backward(b->act, s->dh, s->dh, hpre, R * M);
    vitc__linear_backward(s->dln, C, 0.0f, gw->fc1_w, gw->fc1_b, s->dh, M, ln2, C, w->fc1_w, R,
                          M, C);
    /* gmid = g + ln_2's share */
    vitc__layernorm_backward_res(s->gmid, s->g, gw->ln2_w, gw->ln2_b, s->dln, mid, w->ln2_w, R,
                                 C, b->eps, s->stats);

    /* mid = x + ls1 * branch(out_proj(att)): the branch's gradient in dln (free), f in datt. */
    gf = nn_branch_backward(b, s->gmid, s->dln, s->datt, w->ls1, gw->ls1, att, rs * C, w->proj_w,
                            w->proj_b, R, C, k->att, k->dp_att);
    vitc__linear_backward(s->datt, C, 0.0f, gw->proj_w, gw->proj_b, gf, C, att, rs * C, w->proj_w,
                          R, C, C);
    vitc__sdpa_bwd_desc bd = {.f = vitc__nn_block_attention(b, cls_only ? 1 : N)};
    VITC_TRY(vitc__nn_mask_apply(&b->mask, b->mask_buf, &bd.f));
    int64_t d = C / b->H;
    /* cls_only: one query per image; its dq [B, C] after datt [B, C] (N >= 2: both fit). */
    float *dq = cls_only ? s->datt + B * C : s->dqkv;
    bd.dout = s->datt, bd.do_sb = cls_only ? C : NC, bd.do_sh = d, bd.do_sr = C;
    bd.dq = dq, bd.dq_sb = cls_only ? C : bd.f.q_sb, bd.dq_sh = d, bd.dq_sr = cls_only ? C : 3 * C;
    bd.dk = s->dqkv + C, bd.dk_sb = bd.f.k_sb, bd.dk_sh = bd.f.k_sh, bd.dk_sr = bd.f.k_sr;
    bd.dv = s->dqkv + 2 * C, bd.dv_sb = bd.f.v_sb, bd.dv_sh = bd.f.v_sh, bd.dv_sr = bd.f.v_sr;
    if (k->probs)
        VITC_TRY(vitc__nn_attn_dropout_backward(&bd, b->pkeep, k->probs, b->attention_dropout,
                                                b->tmp));
    else
        VITC_TRY(vitc__sdpa_backward(&bd));
    if (cls_only) { /* qkv rows C..3C (k, v) over every row, then rows 0..C (q) over the class rows */
        vitc__linear_backward(s->dln, C, 0.0f, gw->qkv_w + C * C, gw->qkv_b ? gw->qkv_b + C : NULL,
                              s->dqkv + C, 3 * C, ln1, C, w->qkv_w + C * C, BN, 2 * C, C);
        vitc__linear_backward(s->dln, NC, 1.0f, gw->qkv_w, gw->qkv_b, dq, C, ln1, NC, w->qkv_w, B,
                              C, C);
        /* the residual's gradient is gmid on class rows, 0 elsewhere */
        float *g = s->g;
        memset(g, 0, (size_t)(BN * C) * sizeof(float));
        for (int64_t i = 0; i < B; i++) memcpy(g + i * NC, s->gmid + i * C, (size_t)C * sizeof(float));
        vitc__layernorm_backward_res(g, g, gw->ln1_w, gw->ln1_b, s->dln, x, w->ln1_w, BN, C,
                                     b->eps, s->stats);
    } else {
        vitc__linear_backward(s->dln, C, 0.0f, gw->qkv_w, gw->qkv_b, s->dqkv, 3 * C, ln1, C,
                              w->qkv_w, BN, 3 * C, C);
        vitc__layernorm_backward_res(s->g, s->gmid, gw->ln1_w, gw->ln1_b, s->dln, x, w->ln1_w, BN,
                                     C, b->eps, s->stats);
    }
    return VITC_OK;
}
