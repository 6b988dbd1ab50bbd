/*
 * nn.h — the transformer's building blocks, each with its forward and its
 * backward side by side (llm.c style): activations and the MLP (mlp.c),
 * attention with masks and dropout on the probabilities (attn.c), the
 * pre-norm encoder block (block.c). They read only the kernels
 * (src/kernels/) and know nothing of a model: callers hand them weights,
 * activation buffers and options in a descriptor.
 *
 * Gradients follow the kernels' rule: parameter gradients accumulate (+=,
 * as torch's .grad), input gradients are overwritten unless said otherwise.
 */
#ifndef VITC_NN_H
#define VITC_NN_H

#include "../internal.h"
#include "../kernels/kernels.h"
#include "../rng.h"

/* ---- activations and the MLP (mlp.c) ------------------------------ */

/* The MLP's activation. The values are the models' VIT_ACT_* (the loaders
 * store these). */
enum {
    VITC__NN_GELU = 0,       /* exact erf GELU (torch nn.GELU()) */
    VITC__NN_GELU_TANH = 1,  /* 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) (SigLIP) */
    VITC__NN_QUICK_GELU = 2  /* x sigmoid(1.702 x) (OpenAI CLIP) */
};

/* The kernel table's fused-epilogue code (VITC__ACT_*) of act. */
int vitc__nn_act_kernel(int act);
/* x = act(x) in place, n floats, vectorised and threaded (the kernels'). */
void vitc__nn_act_forward(int act, float *x /* [n] */, int64_t n);
/* dx = dy * act'(x); dx may be dy. */
void vitc__nn_act_backward(int act, float *dx /* [n] */, const float *dy /* [n] */,
                           const float *x /* [n] */, int64_t n);
/* SwiGLU over fc1's halves: out[r, j] = silu(h[r, j]) * h[r, M/2 + j];
 * out may be h (compacted in place, row by row). */
void vitc__nn_swiglu_forward(float *out /* [R, M/2] */, const float *h /* [R, M] */, int64_t R,
                             int64_t M);
/* dh [R, M] from dout [R, M/2] and the forward's input h; dh must not be h;
 * dout may be dh + R*M/2 (its back half). */
void vitc__nn_swiglu_backward(float *dh /* [R, M] */, const float *dout /* [R, M/2] */,
                              const float *h /* [R, M] */, int64_t R, int64_t M);

/* An MLP fc2(act(fc1(x))) (+ res) of rows of width C, hidden width M
 * (SwiGLU: fc1 gives M, fc2 reads M/2). */
typedef struct vitc__nn_mlp {
    const float *fc1_w, *fc1_b; /* [M, C], [M] */
    const float *fc2_w, *fc2_b; /* [C, M or M/2], [C] */
    int64_t C, M;
    int act, swiglu;
} vitc__nn_mlp;
/* y = fc2(act(fc1(x))) + res (res may be NULL), rows R; records hpre [R, M]
 * (fc1's output) and hact [R, M] (the activation's, SwiGLU [R, M/2]). */
void vitc__nn_mlp_forward(const vitc__nn_mlp *p, float *y /* [R, C] */, const float *x /* [R, C] */,
                          const float *res, int64_t R, float *hpre, float *hact);
/* dx [R, C] (beta 0 overwrite, 1 add) from dy; gradients of fc1/fc2 added
 * into g (the same struct over gradient arrays; NULL pointers skipped).
 * dh: [R, M] scratch. */
void vitc__nn_mlp_backward(const vitc__nn_mlp *p, const vitc__nn_mlp *g, float *dx, float beta,
                           const float *dy /* [R, C] */, const float *x, const float *hpre,
                           const float *hact, int64_t R, float *dh);

/* ---- attention (attn.c) ------------------------------------------- */

/* An additive mask or bias over the scores, from a provider: fills
 * mask [L, S] (shared by every image and head) for L queries and S keys.
 * A causal mask and a relative-position bias plug in here. */
typedef enum { VITC__NN_MASK_NONE = 0, VITC__NN_MASK_CAUSAL = 1 } vitc__nn_mask_kind;
typedef struct vitc__nn_mask {
    vitc__nn_mask_kind kind;
    /* kind NONE with fill set: a custom provider (a bias table, ...). */
    void (*fill)(void *ctx, float *mask /* [L, S], per_image: [B, L, S] */, int64_t L, int64_t S);
    void *ctx;
    /* fill writes one [L, S] mask per image (sequences of different
     * lengths in one batch, as a text tower's pooled rows see) */
    int per_image;
} vitc__nn_mask;
/* The [L, S] mask of m into buf, and the sdpa descriptor's view of it
 * (strides 0 over images and heads); nothing when m is NULL or none. */
vitc_status vitc__nn_mask_apply(const vitc__nn_mask *m, vitc__buf *buf, vitc__sdpa_desc *sd);

/* One head of attention with dropout on its probabilities, given
 * P [L, S] = softmax(scale q k^T + mask): the core the models' blocks (P
 * kept) and the layers' MultiheadAttention (P recomputed per head) share.
 * o [L, Dv] (row stride o_sr) = dropout(P, keep) V; T: [L, S] scratch. */
void vitc__nn_dropout_pv(float *o, int64_t o_sr, const float *P, const uint8_t *keep, float p,
                         const float *v, int64_t v_sr, int64_t L, int64_t S, int64_t Dv, float *T);
/* One head's operands and gradients (row strides *_sr): q [L, D], k [S, D],
 * v [S, Dv], dout [L, Dv] -> dq [L, D], dk [S, D], dv [S, Dv] (overwritten). */
typedef struct vitc__nn_head_grad {
    int64_t L, S, D, Dv;
    float scale;
    const float *q, *k, *v, *dout;
    int64_t q_sr, k_sr, v_sr, do_sr;
    float *dq, *dk, *dv;
    int64_t dq_sr, dk_sr, dv_sr;
} vitc__nn_head_grad;
/* Head (b, h) of a backward: bd's forward operands and gradient views. */
vitc__nn_head_grad vitc__nn_head_at(const vitc__sdpa_bwd_desc *bd, int64_t b, int64_t h);
/* Its backward from the forward's P [L, S] and keep; T: [L, S] scratch. */
void vitc__nn_dropout_attn_head_backward(const vitc__nn_head_grad *h, const float *P,
                                         const uint8_t *keep, float p, float *T);
/* o = dropout(P) V of every head again from the kept P = sd->probs
 * [B, H, L, S] (attention dropout, nn.MultiheadAttention's): keep
 * [B*H*L*S] from vitc__dropout_mask. tmp: scratch. */
vitc_status vitc__nn_attn_dropout_forward(const vitc__sdpa_desc *sd, const uint8_t *keep, float p,
                                          vitc__buf *tmp);
/* Its backward, given the forward's P [B, H, L, S] and keep: dq, dk, dv of bd. */
vitc_status vitc__nn_attn_dropout_backward(const vitc__sdpa_bwd_desc *bd, const float *P,
                                           const uint8_t *keep, float p, vitc__buf *tmp);

/* The self-attention sublayer over x [B, N, Cin]:
 *   q, k, v = x Wqkv^T (+ b)          [B, N, 3D], heads grouped (head h at h*D/H)
 *   o = sdpa(q, k, v) (+ mask)        [B, N, D]
 *   y = out_proj(o) (+ v: T2T's skip, the width changing Cin -> D) */
typedef struct vitc__nn_attn {
    const float *qkv_w, *qkv_b; /* [3D, Cin], [3D] or NULL */
    const float *out_w, *out_b; /* [Cout, D], [Cout] */
    int64_t B, N, Cin, D, Cout, H;
    float scale;                /* 0: (D/H)^-0.5 */
    int v_skip;                 /* y += v (Cout = D) */
    vitc__nn_mask mask;
} vitc__nn_attn;
/* Recorded: qkv [B*N, 3D], att [B*N, D], lse [B, H, N] (NULL in inference). */
typedef struct vitc__nn_attn_rec {
    float *qkv, *att, *lse;
} vitc__nn_attn_rec;
vitc_status vitc__nn_attn_forward(const vitc__nn_attn *p, float *y /* [B*N, Cout] */,
                                  const float *x, const vitc__nn_attn_rec *r, vitc__buf *mask_buf);
/* dx [B*N, Cin] (overwritten) from dy; parameter gradients added into g
 * (NULL skipped). Scratch: datt [B*N, D], dqkv [B*N, 3D]. */
vitc_status vitc__nn_attn_backward(const vitc__nn_attn *p, const vitc__nn_attn *g, float *dx,
                                   const float *dy, const float *x, const vitc__nn_attn_rec *r,
                                   float *datt, float *dqkv, vitc__buf *mask_buf);

/* Cross-attention of queries from another sequence (SigLIP's MAP head: one
 * learnt probe per image) over x's rows, nn.MultiheadAttention's in_proj
 * [3C, C] split in q rows [0, C) and k, v rows [C, 3C):
 *   q = probe Wq^T + bq (L rows, shared by every image)
 *   k, v = x Wk^T + bk, x Wv^T + bv    o = out_proj(sdpa(q, k, v)) */
typedef struct vitc__nn_cross {
    const float *probe;        /* [L, C] */
    const float *in_w, *in_b;  /* [3C, C], [3C] */
    const float *out_w, *out_b; /* [C, C], [C] */
    int64_t B, L, S, C, H;
    vitc__nn_mask mask;
} vitc__nn_cross;
/* Records q [L, C], kv [B, S, 2C], att [B, L, C], lse [B, H, L]; y [B, L, C]. */
typedef struct vitc__nn_cross_rec {
    float *q, *kv, *att, *lse;
} vitc__nn_cross_rec;
vitc_status vitc__nn_cross_forward(const vitc__nn_cross *p, float *y, const float *x,
                                   const vitc__nn_cross_rec *r, vitc__buf *mask_buf);
/* dx [B, S, C] (overwritten) from dy [B, L, C]; parameter gradients into g
 * (probe, in_w/in_b, out_w/out_b; NULL skipped). scratch: datt [B, L, C],
 * dq [B, L, C], dkv [B, S, 2C]. */
vitc_status vitc__nn_cross_backward(const vitc__nn_cross *p, const vitc__nn_cross *g, float *dx,
                                    const float *dy, const float *x, const vitc__nn_cross_rec *r,
                                    float *datt, float *dq, float *dkv, vitc__buf *mask_buf);

/* ---- the patch embedding and the position table (embed.c) --------- */

/* Output length of nn.Unfold(k, stride s, padding p) over n. */
static inline int64_t vitc__nn_unfold_out(int64_t n, int64_t k, int64_t s, int64_t p) {
    return (n + 2 * p - k) / s + 1;
}
/* nn.Unfold(k, s, p) of src, read as [B, C, h, w] (an image) or, tokens,
 * [B, h*w, C], into rows dst [B, oh*ow, C*k*k] ordered (c, ky, kx) as
 * Unfold's output transposed (conv weights' [out, C, k, k] order); zeros
 * outside. A ViT's patch embedding is k = s = patch, p = 0, then one GEMM. */
void vitc__nn_unfold(float *dst, const float *src, int tokens, int64_t B, int64_t C, int64_t h,
                     int64_t w, int64_t k, int64_t s, int64_t p);
/* Its adjoint (nn.Fold): dsrc (same layout as src) += the rows ddst sent back. */
void vitc__nn_fold(float *dsrc, const float *ddst, int tokens, int64_t B, int64_t C, int64_t h,
                   int64_t w, int64_t k, int64_t s, int64_t p);

/* Bicubic resampling of a position grid src [ih*iw, C] (position-major)
 * to dst [oh*ow, C], as F.interpolate(mode="bicubic") with: */
enum {
    VITC__NN_RESAMPLE_ALIGN_CORNERS = 0, /* align_corners=True (torchvision) */
    VITC__NN_RESAMPLE_HALF_PIXEL = 1,    /* align_corners=False to a size (HF >= 4.45) */
    VITC__NN_RESAMPLE_ANTIALIAS = 2      /* the same, antialias=True (DINOv2 with registers);
                                          * grids up to 1024, shrinking at most 15x */
};
/* tmp: [ih*ow, C] scratch for ANTIALIAS (unused otherwise). */
vitc_status vitc__nn_resample(int rule, float *dst, float *tmp, const float *src, int64_t C,
                              int64_t ih, int64_t iw, int64_t oh, int64_t ow);
/* The adjoint: dsrc [ih*iw, C] += R^T ddst [oh*ow, C]. */
vitc_status vitc__nn_resample_backward(int rule, float *dsrc, const float *ddst, int64_t C,
                                       int64_t ih, int64_t iw, int64_t oh, int64_t ow);
/* F.interpolate(mode="bicubic", align_corners=True) of src [ih*iw, C] into
 * dst [oh*ow, C], and its adjoint accumulated into dsrc. */
void vitc__bicubic_ac(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw, int64_t oh,
                      int64_t ow);
void vitc__bicubic_ac_backward(float *dsrc, const float *ddst, int64_t C, int64_t ih, int64_t iw,
                               int64_t oh, int64_t ow);

/* ---- the pre-norm encoder block (block.c) ------------------------- */

typedef struct vitc__nn_block_w {
    float *ln1_w, *ln1_b;   /* [C] */
    float *qkv_w;           /* [3C, C] rows [Wq; Wk; Wv], head h at rows h*d.. */
    float *qkv_b;           /* [3C] */
    float *proj_w;          /* [C, C] */
    float *proj_b;          /* [C] */
    float *ln2_w, *ln2_b;   /* [C] */
    float *fc1_w;           /* [mlp, C] */
    float *fc1_b;           /* [mlp] */
    float *fc2_w;           /* [C, mlp] (SwiGLU: [C, mlp/2]) */
    float *fc2_b;           /* [C] */
    float *ls1, *ls2;       /* [C] layer scale (DINOv2), NULL without */
} vitc__nn_block_w;

/* A block's packed inference weights (vitc__nn_block.pw[k]). */
enum { VITC__NN_PW_QKV, VITC__NN_PW_PROJ, VITC__NN_PW_FC1, VITC__NN_PW_FC2, VITC__NN_PW_COUNT };

/* Keep masks of a training forward with regularisation (NULL otherwise):
 * [B*N*C] after out_proj, [B*N*mlp] after the activation, [B*N*C] after
 * fc2, [B] drop path of each branch, [B*H*N*N] attention dropout. */
typedef struct vitc__nn_block_masks {
    uint8_t *att, *hid, *out, *dp_att, *dp_mlp;
    uint8_t *probs;
} vitc__nn_block_masks;

/*   mid = x + ls1 * branch(out_proj(attn(qkv(ln_1(x)))))
 *   y   = mid + ls2 * branch(fc2(act(fc1(ln_2(mid)))))
 * branch = dropout then drop path (training), ls = layer scale (or 1). */
typedef struct vitc__nn_block {
    const vitc__nn_block_w *w;
    const vitc__pweight *pw; /* [VITC__NN_PW_COUNT] packed weights, or NULL (row-major) */
    int64_t B, N, C, H, M;   /* images, tokens, width, heads, fc1's width */
    float eps, attn_scale;   /* attn_scale 0: head_dim^-0.5 */
    int act, swiglu;
    vitc_precision attn_prec; /* the attention's products: vitc__sdpa_desc.prec */
    vitc__nn_mask mask;
    float dropout, attention_dropout, drop_path; /* drop_path: this block's rate */
    vitc__rng *rng;          /* draws the masks (forward) */
    vitc__nn_block_masks k;
    /* Activations ([B, N, .] rows; past the attention [B, .] when cls_only):
     * x input, ln1, qkv [B, N, 3, H, d], att [B, N, H, d], lse [B, H, N]
     * (training), mid, ln2, hpre / hact [.., M] (may alias: inference),
     * y output, pkeep [B, H, N, N] (attention dropout), probs: the maps
     * asked for (or NULL). */
    float *x, *ln1, *qkv, *att, *lse, *mid, *ln2, *hpre, *hact, *y, *pkeep, *probs;
    vitc__buf *tmp;          /* scratch of attention dropout and masks */
    vitc__buf *mask_buf;
} vitc__nn_block;

/* The attention view of the block's qkv/att for query rows 0..L-1. */
vitc__sdpa_desc vitc__nn_block_attention(const vitc__nn_block *b, int64_t L);
/* One block forward. cls_only: queries, out_proj, LayerNorm and MLP only
 * for row 0 of each image (every row's keys and values still); the rows
 * after the attention are then [B, C] compact. */
vitc_status vitc__nn_block_forward(const vitc__nn_block *b, int cls_only);

/* Scratch of the block backward: g, gmid, dln, datt [B*N, C], dqkv
 * [B*N, 3C], dh [B*N, M], stats [2 B N]. */
typedef struct vitc__nn_block_bwd {
    float *g, *gmid, *dln, *datt, *dqkv, *dh, *stats;
} vitc__nn_block_bwd;
/* The gradient of the recorded forward b (cls_only as it ran): s->g holds
 * dL/dy on entry ([B, C] when cls_only) and dL/dx [B, N, C] on return;
 * parameter gradients added into gw. */
vitc_status vitc__nn_block_backward(const vitc__nn_block *b, int cls_only, vitc__nn_block_w *gw,
                                    const vitc__nn_block_bwd *s);
/* A branch's dropout and drop path in place on x [R, C] with b's masks
 * (the same call is its own backward). */
void vitc__nn_branch(const vitc__nn_block *b, float *x, int64_t R, const uint8_t *keep,
                     const uint8_t *dp_keep);

#endif
