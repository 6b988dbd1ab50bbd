/*
 * layers.h — the attention engine's insides, shared by engine.c (the layer
 * object, its parameter table and the seed presets) and mha.c
 * (MultiheadAttention with masks, SDPA, softmax).
 */
#ifndef VITC_LAYERS_H
#define VITC_LAYERS_H

#include "../kernels/kernels.h"
#include "../params.h"
#include "../rng.h"

#define VITC__MAX_PARAMS 12


/* Stages of the engine; each preset picks one of each. */
typedef enum { VITC__IN_TOKENS, VITC__IN_IMAGE, VITC__IN_PATCHES } vitc__in_kind;
typedef enum { VITC__NORM_NONE, VITC__NORM_GROUP, VITC__NORM_BATCH } vitc__norm_kind;
typedef enum {
    VITC__QKV_SEPARATE, /* three nn.Linear (or 1x1 convs) into one packed buffer */
    VITC__QKV_FUSED,    /* one nn.Linear to 2*dq + dv */
    VITC__QKV_MATMUL    /* x @ W, no bias (the NumPy seed) */
} vitc__qkv_kind;
typedef enum {
    VITC__HEADS_GROUPED, /* [q | k | v], each [heads, d]: reshape(B,N,3,H,d) */
    VITC__HEADS_PER_HEAD /* [heads, (q k v)]: rearrange 'n s (h d) -> (n h) s d', chunk */
} vitc__head_layout;
typedef enum { VITC__OUT_LINEAR, VITC__OUT_MATMUL, VITC__OUT_NONE } vitc__out_kind;
typedef enum { VITC__RES_NONE, VITC__RES_INPUT, VITC__RES_V } vitc__res_kind;

typedef struct vitc__plan {
    vitc__in_kind in;
    vitc__norm_kind norm;
    vitc__qkv_kind qkv;
    vitc__head_layout layout;
    vitc__out_kind outp;
    vitc__res_kind res;
    int64_t cin;     /* token width into the projections */
    int64_t dq, dv;  /* q (= k) and v widths over all heads */
    int64_t cout;    /* output token width */
    int64_t heads;
    float scale;
} vitc__plan;

/* Where a training forward left its activations in the layer's scratch
 * (float offsets), and the shapes it ran on. valid = 0 after an eval-mode
 * forward, a failed one, or a parameter reload. */
typedef struct vitc__record {
    int valid;
    int ndim, out_ndim;
    int64_t shape[4], out_shape[4];
    size_t o_x;    /* [B, C, HW] copy of the input (norm presets) */
    size_t o_norm; /* [B, C, HW] normalised image */
    size_t o_cols; /* [M, C*p*p] patch rows */
    size_t o_tok;  /* [M, cin] tokens */
    size_t o_qkv;  /* [M, 2dq+dv] */
    size_t o_o;    /* [M, dv] attention output */
    size_t o_y;    /* [M, cout] out-projection before the residual */
    size_t o_stat; /* [2, C] BatchNorm batch mean, biased variance */
    size_t o_lse;  /* [B, H, N] attention log-sum-exp per row */
} vitc__record;

/* MultiheadAttention's training record (mha.c): the attention views of
 * its last training-mode forward, every pointer into the layer's scratch
 * (q, k, v, o, the merged mask, copies of the inputs). */
typedef struct vitc__mha_record {
    int valid;
    int self;                   /* one packed in-projection (query = key = value) */
    int ndim;                   /* of query, key, value */
    int64_t qshape[3], kshape[3], vshape[3];
    vitc__sdpa_desc sd;         /* q, k, v, o, mask as the forward read them */
    const float *xq, *xk, *xv;  /* [L*B, E], [S*B, kdim], [S*B, vdim] in the inputs' token order */
    int64_t ldqkv;              /* row stride of the projected q, k, v (E, or 3E when self) */
    int64_t S0;                 /* keys given (sd.S adds bias_k's and the zero key) */
    int64_t kv_sl;              /* rows between keys: 1 batch_first, B otherwise */
    const uint8_t *keep;        /* [B, H, L, S] dropout's kept weights, NULL without dropout */
} vitc__mha_record;

struct vitc_layer {
    vitc_layer_config cfg;
    vitc__plan plan;
    int training;
    int nparams;
    vitc__param params[VITC__MAX_PARAMS]; /* state_dict order, buffers included */
    int ntrain;
    vitc__param train[VITC__MAX_PARAMS];  /* the rows an optimizer updates (no buffers) */
    float *store; /* [store_len] every parameter and buffer, in table order */
    float *grad;  /* [store_len] same layout; NULL until training asks for it */
    size_t store_len;
    uint64_t id;  /* vitc__handle_register() */
    /* Roles, pointing into store (NULL when the kind has none). */
    float *w_patch, *b_patch;           /* [E, C, p, p], [E] */
    float *w_q, *b_q, *w_k, *b_k;       /* [dq, cin] ([cin, dq] for MATMUL), [dq] */
    float *w_v, *b_v;                   /* [dv, cin] ([cin, dv] for MATMUL), [dv] */
    float *w_qkv, *b_qkv;               /* [2dq+dv, cin], [2dq+dv] */
    float *w_o, *b_o;                   /* [cout, dv] ([dv, cout] for MATMUL), [cout] */
    float *norm_w, *norm_b;             /* [C] */
    float *run_mean, *run_var;          /* [C] */
    float *gamma;                       /* [1] */
    float *bias_k, *bias_v;             /* [1, 1, E] (MHA add_bias_kv) */
    vitc__buf scratch; /* sized by the largest forward so far, then reused */
    /* Training: what the last training-mode forward left in scratch for
     * backward (engine_backward.c), and the gradients. */
    vitc__record rec;
    vitc__mha_record mrec;
    vitc__rng rng;      /* dropout masks; seeded by reset_parameters */
    vitc__buf bscratch; /* backward's own scratch */
};

/* MultiheadAttention's self-attention form of vitc_layer_forward and its
 * shape check (mha.c). */
vitc_status vitc__mha_self_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                   float *out);
vitc_status vitc__mha_check_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                  int *out_ndim, int64_t out_shape[8]);

/* Scratch carve-out: consecutive 64-byte aligned regions of one buffer,
 * sizes checked (ok = 0 once any size overflows). */
typedef struct vitc__carve { size_t used; int ok; } vitc__carve;
static inline size_t vitc__take(vitc__carve *c, size_t a, size_t b) {
    size_t n, at = c->used;
    if (!vitc__mul_size(a, b, &n) || !vitc__add_size(n, 15, &n))
        c->ok = 0;
    n &= ~(size_t)15;
    if (!vitc__add_size(c->used, n, &c->used))
        c->ok = 0;
    return at;
}

/* The engine's attention views of a packed qkv [B, N, 2dq+dv] and o
 * [B, N, dv] in the plan's head layout (forward; backward passes the
 * gradient buffers, which share the layout). */
void vitc__engine_sdpa_desc(const vitc__plan *p, vitc__sdpa_desc *sd, float *qkv, float *o,
                            int64_t B, int64_t N);

/* Attention with dropout on its weights, through the probabilities, one
 * head at a time (engine_backward.c): o = (softmax(scale q k^T + mask) *
 * keep / (1 - p)) v. Forward: f's q, k, v, mask, scale in, o out; keep
 * [B, H, L, S] is drawn from r; the dropped weights go to f->probs when
 * set. Backward: g holds the gradient views in f's layout (g->q, g->k, g->v
 * receive dq, dk, dv, overwritten; g->o is dO), from the same keep. P and
 * dP: [L, S] scratch each. */
void vitc__sdpa_dropout_forward(const vitc__sdpa_desc *f, uint8_t *keep, float p, vitc__rng *r,
                                float *P);
void vitc__sdpa_dropout_backward(const vitc__sdpa_desc *f, const vitc__sdpa_desc *g,
                                 const uint8_t *keep, float p, float *P, float *dP);

/* Backward of y [M, N] = x [M, K] op(W) (+ bias), op(W) = W^T (nn.Linear,
 * W [N, K]) or W (matmul = 1, W [K, N]): dx [M, K] = beta * dx + dy op(W)^T
 * (skipped when dx is NULL), dW and db (may be NULL) accumulate. */
void vitc__proj_backward(float *dx, int64_t lddx, float beta, float *dW, float *db,
                         const float *dy, int64_t ldy, const float *x, int64_t ldx,
                         const float *W, int matmul, int64_t M, int64_t N, int64_t K);
/* The gradient of a parameter (a pointer into store): the same offset in grad. */
float *vitc__grad_of(vitc_layer *l, const float *param);
/* Allocates the gradients (zeroed) on first use. */
vitc_status vitc__layer_ensure_grad(vitc_layer *l);

/* The engine's backward (engine_backward.c): reads l->rec, writes dx,
 * accumulates into l->grad. */
vitc_status vitc__engine_backward(vitc_layer *l, const float *dy, float *dx);

#endif
