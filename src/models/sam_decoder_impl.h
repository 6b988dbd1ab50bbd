/*
 * sam_decoder_impl.h — what sam_decoder.c (the prompt encoder, the
 * two-way transformer) and sam_upscale.c (the upscaling and the
 * hypernetwork products) share: the decoder's weights, one run's scratch,
 * the per-image cache, and the vectorised row helpers.
 */
#ifndef VITC_SAM_DECODER_IMPL_H
#define VITC_SAM_DECODER_IMPL_H

#include <stdint.h>

#include "../kernels/kernels.h"
#include "sam.h"

/* More points than this in one prompt are refused: the released models
 * were trained with at most a few dozen, and the token count bounds the
 * attention's scratch. */
#define SAM_MAX_POINTS 1000
/* Depth bound of the hypernetwork and IoU head MLPs (3 in every release). */
#define SAM_MAX_FFN 8

enum { SAM_ACT_GELU, SAM_ACT_RELU };

typedef struct sam_wb {
    float *w, *b;
    /* a linear layer's w packed for the GEMM once (the prompt's GEMMs have
     * a few rows: packing w per call cost as much as the product); empty
     * without a packing kernel (vitc__linear_pw reads w then) */
    vitc__pweight pw;
} sam_wb;

/* SamAttention: q/k/v projections to I = C / downsample, heads over I. */
typedef struct sam_attn {
    sam_wb q, k, v, o; /* q, k, v: [I, C]; o: [C, I] */
    int64_t I;
} sam_attn;

typedef struct sam_layer {
    sam_attn self, t2i, i2t;
    sam_wb ln1, ln2, ln3, ln4;
    sam_wb lin1, lin2; /* [mlp, C], [C, mlp] */
} sam_layer;

/* SamFeedForward: proj_in, ReLU, (layers, ReLU)..., proj_out. */
typedef struct sam_ffn {
    sam_wb in, mid[SAM_MAX_FFN], out;
    int n_mid;
    int64_t hidden, out_dim;
} sam_ffn;

struct vitc__sam_dec {
    int64_t C, heads, mlp, n_layers, ds, T, iou_hidden, iou_depth, mc, grid, image_size;
    int act_prompt, act_mlp;
    float eps_prompt, eps_dec;
    /* prompt encoder */
    float *pe;             /* [2, C/2] random Fourier features */
    float *point_embed[4]; /* [C] each: background, foreground, box corner 1, corner 2 */
    float *not_a_point, *no_mask; /* [C] */
    sam_wb mconv1, mln1, mconv2, mln2, mconv3; /* convolutions: dense.h layouts */
    /* mask decoder */
    float *iou_token;   /* [C] */
    float *mask_tokens; /* [T, C] */
    sam_layer *layers;  /* [n_layers] */
    sam_attn final;
    sam_wb ln_final;
    sam_wb up1, up_ln, up2; /* up1 [2, 2, C/4, C], up2 [2, 2, C/8, C/4] */
    /* The upscaling's transposed convolutions as linear layers over one
     * input pixel (rows (i, j, o) of the weights above): packed once for
     * the GEMM, their biases repeated per tap ([4 C/4], [4 C/8]). */
    vitc__pweight up1_pw, up2_pw;
    float *up1_b4, *up2_b4;
    /* up1 read through the transformer's LayerNorms (upf_*, NULL when
     * out of memory: the upscaling then reads the image side as it is).
     * upf_w [L, 4 C/4, C]: layer i's up1 weight with column c scaled by
     * prod_{j >= i} w_j[c] (w_j layer j's layer_norm4 weight); upf_u
     * [L + 1, 4 C/4]: u_0 = g_0, u_k = g_k + e_{k-1}, u_L = e_{L-1} + up1's
     * bias (g_i = beta_i M_i, e_i = b_i M_{i+1}, M_i = upf_w[i]^T, beta_i
     * out_proj's bias of layer i's image -> token attention, b_i its
     * layer_norm4 bias); upf_h [L, 4 C/4]: w_i M_{i+1}, upf_w[i]'s row sums. */
    float *upf_w, *upf_u, *upf_h;
    float *upf_wo; /* [L, I, C] (upf_w[i] @ layer i's i2t out_proj weight [C, I])^T */
    /* The second layer's token -> image attention read through the first
     * layer's layer_norm4 (NULL: not made). t1_wk, t1_wv [I, C]: its k and
     * v weights with column c scaled by that LayerNorm's w[c]; t1_c [5, I]:
     * t1_wk beta_0, t1_wk's row sums, t1_wv beta_0, t1_wv's row sums,
     * W_v b_0 + b_v (beta_0 the first layer's i2t out_proj bias, b_0 the
     * LayerNorm's bias), and for its image -> token attention t1_wq (its q
 * weight scaled alike), t1_wq beta_0, t1_wq's row sums (rows 5, 6). */
    float *t1_wk, *t1_wv, *t1_wq, *t1_c;
    /* The final attention read through both layers' layer_norm4 (two
     * layers only; NULL: not made). fin_w [4][I, C]: its k weight with
     * column c scaled by w1[c] w0[c], and by w1[c]; the same of its v
     * weight. fin_c [9, I]: for k then v, fin_w[0] beta_0, fin_w[0]'s row
     * sums, fin_w[1] (b_0 + beta_1), fin_w[1]'s row sums; then W_v b_1 +
     * b_v (w_i, b_i layer i's layer_norm4, beta_i its i2t out_proj bias). */
    float *fin_w[4], *fin_c;
    /* sam_stats.c's constants (two layers; NULL: not made): [3, C] gamma^2,
     * gamma e, e (gamma, b the first layer_norm4's weight and bias, e = b
     * + the second layer's i2t out_proj bias); sums over C of gamma,
     * gamma^2, gamma e, e, e^2 in double */
    float *sf_v;
    double sf_s[5];
    /* t1_wk, t1_wv, t1_wq, fin_w[0..3] packed for the GEMM (their products
     * with a prompt's few rows; empty when not made: the row-major copy
     * is read then) */
    vitc__pweight fold_pw[7];
    sam_ffn hyper[4], iou;
    float *pe_img; /* [grid*grid, C] the dense positional embedding */
    void **bufs;
    int n_bufs, cap_bufs;
    sam_wb **packed; /* the layers whose pw is made, to free */
    int n_packed, cap_packed;
};

/* Scratch of one decoder run. */
typedef struct sam_run {
    int64_t Nt, HW;
    float *tok_pe;    /* [Nt, C] the tokens as they entered (query_point_embedding) */
    float *Q, *Q2;    /* [Nt, C] ping-pong */
    float *qq;        /* [Nt, C] queries + their embedding */
    float *K, *K2;    /* [HW, C] ping-pong */
    float *kk;        /* [HW, C] keys + the image's positional embedding */
    float *aq, *ak, *av, *ao; /* [max(Nt, HW), I] projections, attention output */
    float *hid;       /* [Nt, max(mlp, C, iou_hidden)] MLP hidden */
    const struct vitc__sam_dec_cache *c0; /* the first layer's image side, or NULL */
    /* The tokens read after the transformer (the IoU token, the mask
     * tokens asked for), ascending: the final attention runs on them only */
    int64_t keep[4];
    int n_keep;
    float *ksel; /* [n_keep, C] their final attention */
    const float *tv; /* [T, I] the last image -> token attention's token values */
    const float *vo; /* [H T, C] its values through out_proj */
    int64_t abuf;    /* floats in each of aq, ak, av, ao */
    /* The upscaling's first product read through the image side's
     * LayerNorms (on: see upf_* and upscale_fused): what each layer's
     * image -> token attention and layer_norm4 leave for it. */
    struct {
        int on;
        int64_t HT, Kf;   /* H T; Kf = L HT + 2 L, the columns of the product */
        float *S;         /* [L, HW H T] the attentions' probabilities */
        uint64_t St;      /* bit i: layer i's S stored transposed, [H T, HW] */
        float *st;        /* [L, HW, 2] layer_norm4's mean and 1 / std per row */
        float *Bt;        /* [C, Kf] the product's weight: A_i^T (A_i = vo_i M_i), u_k, -h_i */
        float *V0;        /* [H T, C] the first layer's vo (attend_t2i_layer1) */
        float *rho0, *mu0; /* [HW] the first layer's layer_norm4 1 / std and mean */
        float *V1;        /* [H T, C] the second layer's vo (attend_final) */
        float *rho1, *mu1, *alpha; /* [HW] the second layer's 1 / std, mean; rho0 rho1 */
    } f;
    /* The image side's LayerNorm statistics computed without forming it
     * (sam_stats.c; on: nothing reads K_1 or K_2 themselves). */
    struct {
        int on;
        double *z;  /* [HW, 2] sum and sum of squares of K_1 + beta_1 */
    } sf;
} sam_run;

/* What every prompt without a mask computes alike on one image: the
 * first layer's image side (the embedding plus no_mask_embed, and plus the
 * positional embedding) and its token -> image attention's keys and
 * values projected from them. With them that attention costs 2 T HW I
 * multiply-adds instead of the fold's 2 H T HW C. Made by the first such prompt and published with
 * a compare-and-swap, so an image is read-only to its users and several
 * threads may predict on it at once (a thread that loses the race frees
 * its copy). */
struct vitc__sam_dec_cache {
    const vitc__sam_dec *d; /* the decoder it was made by (used by no other) */
    float *K0, *kk0;        /* [HW, C] embedding + no_mask; the same + the positional embedding */
    float *k, *v;           /* [HW, I] */
    /* [HW, I'] the first layer's image -> token queries (q_proj of kk0),
     * or NULL when that attention is not folded */
    float *q;
    /* [H] each head's keys k_h [HW, dh] and values v_h^T [dh, HW] packed
     * for the GEMM (the token -> image attention as two GEMMs per head,
     * nothing of the image packed per prompt), or NULL (no packing
     * kernel, out of memory): attend_kv then */
    vitc__pweight *kh, *vh;
    /* [H] each head's image -> token queries q_h [HW, dh'] packed, or NULL
     * (attend_i2t_cached's per-head GEMMs then) */
    vitc__pweight *qh;
    /* [HW, C] K0 through the folded up1 of the first layer (d->upf_w), or
     * NULL: the upscaling's prompt-independent part */
    float *P0;
    /* [3][H] or NULL: the second layer's token -> image keys from K0
     * (K0 t1_wk^T) and from the positions ((pe + b0) W_k^T), each head's
     * [HW, dh] packed, and its values from K0 (K0 t1_wv^T), each head's
     * [dh, HW] packed (attend_t2i_layer1) */
    vitc__pweight *t1[5];
    /* [3][H] or NULL: the final attention's keys from K0 (K0 fin_w[0]^T)
     * and from the positions (pe W_k^T), each head's [HW, dh] packed, its
     * values from K0 (K0 fin_w[2]^T) each head's [dh, HW] (attend_final) */
    vitc__pweight *fin[3];
    /* [3][H] or NULL: Q0 = a W_o0, Q0' = (a gamma^2) W_o0, Q1 = (a gamma)
     * W_o1 (a = K0 + the first i2t out_proj's bias, gamma the first
     * layer_norm4's weight, W_oi layer i's i2t out_proj weight), each
     * head's [HW, dh] packed; sfc [HW, 6] a's row sums (sam_stats.c) */
    vitc__pweight *sf[3];
    double *sfc;
    int64_t H;
};

/* The decoder's per-head (and per-mask) tasks, claimed as threads come
 * free: each is a tenth of a millisecond or so, and with a fixed split a
 * thread held up by another process left the other waiting for its share
 * at every region's end. */
static inline void sam_tasks(int64_t n, vitc__task_fn fn, void *ctx) {
    vitc__parallel_for_dynamic(n, 1, fn, ctx);
}

/* y += a x over n floats: restrict and inner loops of a fixed 8, which
 * -O2 vectorises (it leaves loops needing overlap checks or a remainder
 * scalar) */
static inline void axpy_row(float *restrict y, float a, const float *restrict x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] += a * x[i + k];
    for (; i < n; i++) y[i] += a * x[i];
}

/* a . b over n floats: 8 partial sums in loops of a fixed 8 (which the
 * compiler vectorises at -O2), added pairwise at the end. */
static inline float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[c + k] * b[c + k];
    float v = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; c < n; c++) v += a[c] * b[c];
    return v;
}

/* x [HW, I]'s heads packed for the GEMM, p [H]: each x_h [HW, dh] (tr 0)
 * or x_h^T [dh, HW] (tr 1) as a weight; t: [HW dh] scratch. 0 when out of
 * memory (the packs made are freed by the caller). */
int vitc__sam_pack_slices(vitc__pweight *p, const float *x, int64_t HW, int64_t I, int64_t H,
                          int tr, float *t);
void vitc__sam_free_packs(vitc__pweight *p, int64_t n);
/* c->sf and c->sfc for d's two layers (left NULL when out of memory). */
void vitc__sam_sf_cache(struct vitc__sam_dec_cache *c, const vitc__sam_dec *d, int64_t HW);
/* r->f.st's rows of layer 0 (and r->sf.z), then of layer 1, from its
 * S_i, vo and token values (r->vo, r->tv) as that layer's image -> token
 * attention leaves them (sam_stats.c). */
vitc_status vitc__sam_sf_layer0(const vitc__sam_dec *d, sam_run *r);
vitc_status vitc__sam_sf_layer1(const vitc__sam_dec *d, sam_run *r);
/* The random-Fourier positional encoding of the point (u, v) in [-1, 1]
 * into out [C] (the prompt encoder's shared embedding). */
void vitc__sam_pos_encode(const vitc__sam_dec *d, float u, float v, float *out);
/* n floats owned by d (freed with it), or NULL */
float *vitc__sam_dec_alloc(vitc__sam_dec *d, int64_t n);
/* low [n, 4G, 4G] = hyper [n, C/8] . upscale(x [G, G, C]) per pixel (r->f.on:
 * up1 folded through the transformer's LayerNorms). */
vitc_status vitc__sam_upscale(const vitc__sam_dec *d, const sam_run *r, const float *x,
                              const float *hyper, int64_t n, float *low);

#endif
