/*
 * vit_internal.h — what vit.c (the forward) and vit_load.c (checkpoints)
 * share: the model struct and its parameter table (params.h rows: role is a
 * VIT_P_* when layer < 0, else a VIT_L_*).
 */
#ifndef VITC_VIT_INTERNAL_H
#define VITC_VIT_INTERNAL_H

#include "../internal.h"
#include "../kernels/kernels.h"
#include "../params.h"
#include "../rng.h"

/* Per-model tensors then per-layer tensors, in torchvision's state_dict
 * order; the table of a config is the model ones with the layer ones of
 * every block in between (see vitc__vit_table_build). */
enum {
    VIT_P_CLS, VIT_P_CONV_W, VIT_P_CONV_B, VIT_P_POS, /* before the blocks */
    VIT_P_LN_W, VIT_P_LN_B, VIT_P_HEAD_W, VIT_P_HEAD_B, /* after them */
    VIT_P_COUNT
};
enum {
    VIT_L_LN1_W, VIT_L_LN1_B, VIT_L_QKV_W, VIT_L_QKV_B, VIT_L_PROJ_W, VIT_L_PROJ_B,
    VIT_L_LN2_W, VIT_L_LN2_B, VIT_L_FC1_W, VIT_L_FC1_B, VIT_L_FC2_W, VIT_L_FC2_B,
    VIT_L_COUNT
};

/* Checkpoint key spellings. */
typedef enum vitc__vit_naming {
    VIT_NAMES_TORCHVISION = 0, /* mlp.0 / mlp.3 */
    VIT_NAMES_TORCHVISION_V1 = 1, /* torchvision < 0.13: mlp.linear_1 / mlp.linear_2 */
    VIT_NAMES_TIMM = 2
} vitc__vit_naming;


typedef struct vitc__vit_block {
    float *ln1_w, *ln1_b;   /* [C] */
    float *qkv_w;           /* [3C, C] rows [Wq; Wk; Wv], head h at rows h*d.. */
    float *qkv_b;           /* [3C] */
    float *proj_w;          /* [C, C] */
    float *proj_b;          /* [C] */
    float *ln2_w, *ln2_b;   /* [C] */
    float *fc1_w;           /* [mlp, C] */
    float *fc1_b;           /* [mlp] */
    float *fc2_w;           /* [C, mlp] */
    float *fc2_b;           /* [C] */
} vitc__vit_block;

/* The model's own tensors; a second instance points into the gradients. */
typedef struct vitc__vit_w {
    float *cls;     /* [1, 1, C] */
    float *conv_w;  /* [C, in, p, p], read as [C, in*p*p] */
    float *conv_b;  /* [C] */
    float *pos;     /* [1, 1 + g*g, C], g = image_size / patch */
    float *ln_w, *ln_b; /* [C] */
    float *head_w;  /* [classes, C] */
    float *head_b;  /* [classes] */
} vitc__vit_w;

/* A block's activations. In a training forward every block has its own
 * (block l at layers + l * stride, one past the last holding the encoder's
 * output); inference has stride 0 and aliases what backward alone needs
 * (LN1/LN2 outputs, GELU input/output, block input/output), so its memory
 * does not grow. */
enum {
    VA_X,    /* [B, N, C] block input (the previous block's output) */
    VA_LN1,  /* [B, N, C] ln_1(x); also the [B*P, C] patch projection */
    VA_QKV,  /* [B, N, 3, H, d] */
    VA_ATT,  /* [B, N, H, d] attention output, heads interleaved like torch */
    VA_LSE,  /* [B, H, N] attention log-sum-exp per row (training only) */
    VA_MID,  /* [B, N, C] x + out_proj(att) */
    VA_LN2,  /* [B, N, C] ln_2(mid) */
    VA_HPRE, /* [B, N, mlp] fc1 output, GELU's input */
    VA_HACT, /* [B, N, mlp] GELU output */
    VA_COUNT
};
typedef struct vitc__vit_acts {
    int64_t B, N, P;
    int training;
    float *patches; /* [B*P, in*p*p] im2col of the images */
    float *layers;
    size_t stride;  /* floats from block l to block l + 1; 0 in inference */
    size_t off[VA_COUNT];
    float *cls_in;  /* [B, C] the encoder's class tokens (last block output) */
    float *cls_out; /* [B, C] final-normed class tokens */
} vitc__vit_acts;

static inline float *vitc__va(const vitc__vit_acts *a, int l, int k) {
    if (k == VA_LSE && !a->training)
        return NULL;
    return a->layers + (size_t)l * a->stride + a->off[k];
}

struct vitc_vit {
    vitc_vit_config cfg;
    char arch[32];
    vitc__vit_naming naming;

    char *label_text;  /* every label, NUL-separated */
    char **labels;     /* [num_classes] into label_text, NULL when none */

    uint64_t id;  /* vitc__handle_register() */
    int training; /* forward records activations for backward */
    /* Regularisation in training mode (torchvision's dropout and
     * attention_dropout, timm's drop path per block), drawn from rng. */
    float dropout, attention_dropout, drop_path;
    vitc__rng rng;
    vitc__buf masks;    /* the recorded forward's keep masks (bytes, see vit_masks) */
    size_t mask_stride; /* bytes from block l's masks to block l + 1's */
    int n_entries;
    vitc__param *table; /* [n_entries] state_dict order, names in the file's spelling */
    char *names;        /* the table's names, NUL-separated */
    size_t n_params;
    float *params; /* [n_params] every parameter: one allocation, or the arena of
                    * weights_file (vitc_vit_load maps the file's converted tensors,
                    * so loading holds one copy of the weights) */
    float *grad;   /* [n_params] same layout; NULL until training asks for it */
    vitc_safetensors *weights_file;

    vitc__vit_w w, g;          /* parameters and their gradients (g set with grad) */
    vitc__vit_block *blocks;   /* [depth] */
    vitc__vit_block *gblocks;  /* [depth] gradients, NULL until grad */

    /* Activations, grown for the largest (batch, image size) seen, reused. */
    vitc__buf act;
    vitc__vit_acts a;
    int recorded;        /* a's training forward is there for backward */
    int rec_gh, rec_gw;  /* its patch grid */
    vitc__buf bwd;       /* backward scratch */
    /* Position embedding resampled for a grid gh x gw (cached per grid). */
    vitc__buf pos_buf;
    int pos_gh, pos_gw;
    float *pos_used; /* [1 + gh*gw, C]: pos itself or pos_buf */
    /* Attention-map scratch (only when asked for). */
    vitc__buf probs_buf; /* [B, H, N, N] when the caller gives no attn */
    vitc__buf roll_buf;  /* [B, N, N] rollout + [2, N, N] */
};

/* Build m->table for m->cfg in m->naming's spelling (sizes overflow-checked),
 * with 64-byte aligned offsets and n_params, and allocate blocks. */
vitc_status vitc__vit_table_build(vitc_vit *m);
/* Name of a table row in a spelling ("conv_proj.weight", ...). */
const char *vitc__vit_entry_name(const vitc__param *e, vitc__vit_naming naming, char *buf,
                                 size_t cap);

/* Keep masks of block l (training with dropout or drop path; NULL
 * otherwise): [B*N*C] after out_proj, [B*N*mlp] after GELU, [B*N*C] after
 * fc2, [B] drop path of each branch; emb: [B*N*C] after the embedding. */
typedef struct vitc__vit_mask {
    uint8_t *att, *hid, *out, *dp_att, *dp_mlp;
} vitc__vit_mask;
static inline uint8_t *vitc__vit_emb_mask(const vitc_vit *m) {
    return m->mask_stride ? (uint8_t *)m->masks.p : NULL;
}
static inline vitc__vit_mask vitc__vit_block_mask(const vitc_vit *m, int l) {
    vitc__vit_mask k = {0};
    if (!m->mask_stride)
        return k;
    size_t BNC = (size_t)(m->a.B * m->a.N * m->cfg.hidden_dim);
    size_t BNM = (size_t)(m->a.B * m->a.N * m->cfg.mlp_dim);
    k.att = (uint8_t *)m->masks.p + BNC + (size_t)l * m->mask_stride;
    k.hid = k.att + BNC;
    k.out = k.hid + BNM;
    k.dp_att = k.out + BNC;
    k.dp_mlp = k.dp_att + m->a.B;
    return k;
}

/* Drop path rate of block l, and a branch's dropout + drop path in place
 * with recorded masks (the same call is its own backward) (vit.c). */
float vitc__vit_drop_path_rate(const vitc_vit *m, int l);
void vitc__vit_branch(const vitc_vit *m, int l, float *x, const uint8_t *keep,
                      const uint8_t *dp_keep);

/* Gradient array and structs on first use (vit_train.c). */
vitc_status vitc__vit_grad_alloc(vitc_vit *m);

/* F.interpolate(mode="bicubic", align_corners=True) of src [C, ih, iw]
 * stored position-major ([ih*iw, C]) into dst [oh*ow, C]. */
void vitc__bicubic_ac(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw, int64_t oh,
                      int64_t ow);

/* The adjoint of vitc__bicubic_ac, accumulated into dsrc [ih*iw, C]. */
void vitc__bicubic_ac_backward(float *dsrc, const float *ddst, int64_t C, int64_t ih, int64_t iw,
                               int64_t oh, int64_t ow);

/* The attention view of qkv [B, N, 3, H, d] -> att [B, N, H, d] (vit.c). */
vitc__sdpa_desc vitc__vit_attention(const vitc_vit *m, const float *qkv, float *att, int64_t B,
                                    int64_t N, int64_t L);

#endif
