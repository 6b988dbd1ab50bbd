/*
 * layers.h — the attention engine's insides, shared by engine.c (the layer
 * object, its parameter table and the seed presets) and mha.c
 * (MultiheadAttention with masks, SDPA, softmax).
 */
#ifndef VITC_LAYERS_H
#define VITC_LAYERS_H

#include "../kernels/kernels.h"
#include "../params.h"

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
    vitc__buf scratch; /* sized by the largest forward so far, then reused */
};

/* MultiheadAttention's self-attention form of vitc_layer_forward and its
 * shape check (mha.c). */
vitc_status vitc__mha_self_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                   float *out);
vitc_status vitc__mha_check_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                  int *out_ndim, int64_t out_shape[8]);

#endif
