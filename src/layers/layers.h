/*
 * layers.h — the attention layers' insides. Files, each calling only those
 * listed before it:
 *
 *   functional.c       scaled_dot_product_attention, softmax, attention
 *                      with dropout on its weights (forward and backward)
 *   layer.c            the layer object: parameter table, load, gradients
 *   engine.c           the presets' parameter tables, shapes, forward
 *   engine_backward.c  their backward
 *   mha.c              MultiheadAttention (table, shapes, forward, backward)
 *   kinds.c            the kind table (vitc__layer_ops per kind) and the
 *                      public calls that dispatch through it
 */
#ifndef VITC_LAYERS_H
#define VITC_LAYERS_H

#include "../carve.h"
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

/* A layer's tensors by role (NULL when the kind has none). One struct
 * points into store, a second of the same type into grad: the parameter
 * table's slots are offsets into this type, so one vitc__params_bind fills
 * either. */
typedef struct vitc__layer_w {
    float *w_patch, *b_patch;           /* [E, C, p, p], [E] */
    float *w_q, *b_q, *w_k, *b_k;       /* [dq, cin] ([cin, dq] for MATMUL), [dq] */
    float *w_v, *b_v;                   /* [dv, cin] ([cin, dv] for MATMUL), [dv] */
    float *w_qkv, *b_qkv;               /* [2dq+dv, cin], [2dq+dv] */
    float *w_o, *b_o;                   /* [cout, dv] ([dv, cout] for MATMUL), [cout] */
    float *norm_w, *norm_b;             /* [C] */
    float *run_mean, *run_var;          /* [C] */
    float *gamma;                       /* [1] */
    float *bias_k, *bias_v;             /* [1, 1, E] (MHA add_bias_kv) */
} vitc__layer_w;

/* A parameter row's slot: the role in vitc__layer_w it binds. */
#define VITC__SLOT(field) offsetof(vitc__layer_w, field)

/* What a layer kind supplies (kinds.c holds one per vitc_layer_kind).
 * build: the plan and the parameter table in torch's state_dict order,
 * after the kind-independent configuration checks. The rest are the kind's
 * vitc_layer_output_shape, vitc_layer_forward and vitc_layer_backward,
 * called with non-NULL arguments. */
typedef struct vitc__layer_ops {
    const char *name;
    vitc_status (*build)(vitc_layer *l);
    vitc_status (*output_shape)(const vitc_layer *l, int ndim, const int64_t *shape, int *out_ndim,
                                int64_t out_shape[8]);
    vitc_status (*forward)(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                           float *out);
    vitc_status (*backward)(vitc_layer *l, const float *dy, int ndim, const int64_t *shape,
                            float *dx);
} vitc__layer_ops;

struct vitc_layer {
    vitc_layer_config cfg;
    const vitc__layer_ops *ops;
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
    vitc__layer_w w; /* into store */
    vitc__layer_w g; /* into grad: all NULL until vitc__layer_ensure_grad */
    vitc__buf scratch; /* sized by the largest forward so far, then reused */
    /* Training: what the last training-mode forward left in scratch for
     * backward, and the gradients. */
    vitc__record rec;
    vitc__mha_record mrec;
    vitc__rng rng;      /* dropout masks; seeded by reset_parameters */
    vitc__buf bscratch; /* backward's own scratch */
    vitc__buf xscratch; /* MultiheadAttention's self-attention backward: d_key, d_value */
};

/* ---- functional.c ------------------------------------------------------ */

/* Attention with dropout on its weights, through the probabilities, one
 * head at a time: o = (softmax(scale q k^T + mask) * keep / (1 - p)) v.
 * Forward: f's q, k, v, mask, scale in, o out; keep [B, H, L, S] is drawn
 * from r; the dropped weights go to f->probs when set. Backward: g holds
 * the gradient views in f's layout (g->q, g->k, g->v receive dq, dk, dv,
 * overwritten; g->o is dO), from the same keep, recomputing P per head.
 * P and dP: [L, S] scratch each. */
void vitc__sdpa_dropout_forward(const vitc__sdpa_desc *f, uint8_t *keep, float p, vitc__rng *r,
                                float *P);
void vitc__sdpa_dropout_backward(const vitc__sdpa_desc *f, const vitc__sdpa_desc *g,
                                 const uint8_t *keep, float p, float *P, float *dP);

/* ---- layer.c ----------------------------------------------------------- */

/* A layer of cfg's kind, before its table: checks what every kind shares
 * (sizes in range, eps, momentum, qk_scale). Free with vitc_layer_free. */
vitc_status vitc__layer_alloc(const vitc_layer_config *cfg, const vitc__layer_ops *ops,
                              vitc_layer **out);
/* After ops->build: lays out, allocates and binds the store, then
 * reset_parameters(0). */
vitc_status vitc__layer_finish(vitc_layer *l);
/* One row of the parameter table (build). */
void vitc__layer_add_param(vitc_layer *l, const char *name, const char *alias, size_t slot,
                           vitc__init init, int64_t fan_in, int64_t fan_out, int ndim, int64_t d0,
                           int64_t d1, int64_t d2, int64_t d3);
/* VITC_ERR_INVALID_ARG "<kind>: what" (build). */
vitc_status vitc__layer_bad_config(const vitc_layer *l, const char *what);
/* VITC_ERR_SHAPE "<kind>: input has shape ..., expected ..." (output_shape). */
vitc_status vitc__layer_shape_err(const vitc_layer *l, int ndim, const int64_t *shape,
                                  const char *expected);
/* Allocates the gradients (zeroed) on first use and binds l->g to them. */
vitc_status vitc__layer_ensure_grad(vitc_layer *l);

/* ---- engine.c ---------------------------------------------------------- */

/* The presets' builds, one per block (the three SelfAttention kinds
 * share one). */
vitc_status vitc__engine_build_attention_block(vitc_layer *l);
vitc_status vitc__engine_build_conv_sa(vitc_layer *l);
vitc_status vitc__engine_build_self_attention(vitc_layer *l);
vitc_status vitc__engine_build_t2t(vitc_layer *l);
vitc_status vitc__engine_build_single_head(vitc_layer *l);
vitc_status vitc__engine_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                      int *out_ndim, int64_t out_shape[8]);
vitc_status vitc__engine_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                 float *out);
/* The engine's attention views of a packed qkv [B, N, 2dq+dv] and o
 * [B, N, dv] in the plan's head layout (forward; backward passes the
 * gradient buffers, which share the layout). */
void vitc__engine_sdpa_desc(const vitc__plan *p, vitc__sdpa_desc *sd, float *qkv, float *o,
                            int64_t B, int64_t N);

/* ---- engine_backward.c ------------------------------------------------- */

/* Reads l->rec, writes dx, accumulates into l->grad. */
vitc_status vitc__engine_backward(vitc_layer *l, const float *dy, int ndim, const int64_t *shape,
                                  float *dx);

/* ---- mha.c ------------------------------------------------------------- */

/* MultiheadAttention as a layer: self-attention of its input
 * (query = key = value). */
vitc_status vitc__mha_build(vitc_layer *l);
vitc_status vitc__mha_self_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                        int *out_ndim, int64_t out_shape[8]);
vitc_status vitc__mha_self_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                   float *out);
vitc_status vitc__mha_self_backward(vitc_layer *l, const float *dy, int ndim,
                                    const int64_t *shape, float *dx);

#endif
