/*
 * vit_internal.h — what vit.c (the forward), the model core (model.c) and
 * the loaders (load.c, families/, family.h) share: the model struct and its
 * parameter table (params.h rows: role is a VIT_P_* when layer < 0, else a
 * VIT_L_*).
 */
#ifndef VITC_VIT_INTERNAL_H
#define VITC_VIT_INTERNAL_H

#include "../internal.h"
#include "../kernels/kernels.h"
#include "../nn/nn.h"
#include "../params.h"
#include "../rng.h"

/* T2T-ViT's token transformers (tokens_to_token.attention1/2), one role
 * per tensor of a stage; QKV_B and PRM (the random features w) only in
 * performer mode, whose kqv rows are [k; q; v]. */
enum {
    VIT_T2T_N1_W, VIT_T2T_N1_B, VIT_T2T_QKV_W, VIT_T2T_QKV_B, VIT_T2T_PROJ_W, VIT_T2T_PROJ_B,
    VIT_T2T_N2_W, VIT_T2T_N2_B, VIT_T2T_FC1_W, VIT_T2T_FC1_B, VIT_T2T_FC2_W, VIT_T2T_FC2_B,
    VIT_T2T_PRM, VIT_T2T_NROLE
};

/* Per-model tensors then per-layer tensors, in torchvision's state_dict
 * order; the table of a config is the model ones with the layer ones of
 * every block in between (see vitc__vit_table_build). */
enum {
    VIT_P_CLS, VIT_P_CONV_W, VIT_P_CONV_B, VIT_P_POS, VIT_P_DIST, VIT_P_REG, /* before the blocks */
    VIT_P_PRE_W, VIT_P_PRE_B, /* CLIP's pre_layrnorm, on the embeddings */
    VIT_P_LN_W, VIT_P_LN_B, VIT_P_HEAD_W, VIT_P_HEAD_B, VIT_P_HEAD2_W, VIT_P_HEAD2_B, /* after */
    /* SigLIP's attention-pooling (MAP) head */
    VIT_P_MAP_PROBE, VIT_P_MAP_QKV_W, VIT_P_MAP_QKV_B, VIT_P_MAP_PROJ_W, VIT_P_MAP_PROJ_B,
    VIT_P_MAP_LN_W, VIT_P_MAP_LN_B, VIT_P_MAP_FC1_W, VIT_P_MAP_FC1_B, VIT_P_MAP_FC2_W,
    VIT_P_MAP_FC2_B,
    /* vitc_vit_reset_head's linear classifier over an embedding head's
     * output (VIT_HEAD_LINEAR): [K, E], [K] */
    VIT_P_CLF_W, VIT_P_CLF_B,
    /* T2T-ViT (t2t_vit.c): attention1's VIT_T2T_* rows, attention2's, then
     * tokens_to_token.project; first in its table, as in its state_dict. */
    VIT_P_T2T0,
    VIT_P_T2T_PROJ_W = VIT_P_T2T0 + 2 * VIT_T2T_NROLE,
    VIT_P_T2T_PROJ_B,
    VIT_P_COUNT
};
/* Rows a model has: DIST only with a distillation token, REG only with
 * register tokens, HEAD only with a head, HEAD2 only with DeiT's second
 * head, LS1/LS2 only with layer scale. */
enum {
    VIT_L_LN1_W, VIT_L_LN1_B, VIT_L_QKV_W, VIT_L_QKV_B, VIT_L_PROJ_W, VIT_L_PROJ_B,
    VIT_L_LN2_W, VIT_L_LN2_B, VIT_L_FC1_W, VIT_L_FC1_B, VIT_L_FC2_W, VIT_L_FC2_B,
    VIT_L_LS1, VIT_L_LS2, /* DINOv2's layer scale of each branch */
    VIT_L_COUNT
};

/* Checkpoint key spellings. */
typedef enum vitc__vit_naming {
    VIT_NAMES_TORCHVISION = 0, /* mlp.0 / mlp.3 */
    VIT_NAMES_TORCHVISION_V1 = 1, /* torchvision < 0.13: mlp.linear_1 / mlp.linear_2 */
    VIT_NAMES_TIMM = 2,
    /* T2T-ViT: timm's names for the encoder, the stages' own names for
     * its token transformers, per tokens_type (t2t_vit.c) */
    VIT_NAMES_T2T_TRANSFORMER = 3,
    VIT_NAMES_T2T_PERFORMER = 4
} vitc__vit_naming;


/* A block's parameters: nn/block.c's (the loaders bind these fields). */
typedef vitc__nn_block_w vitc__vit_block;

/* One T2T token transformer: Token_transformer (norm1, attn.qkv without
 * bias, attn.proj, norm2, mlp.fc1/fc2) or Token_performer (norm1, kqv,
 * proj, norm2, mlp.0/mlp.2, w). T = token_dim, dim its input width. */
typedef struct vitc__t2t_stage {
    float *n1_w, *n1_b;     /* [dim] */
    float *qkv_w;           /* [3T, dim]: rows [q; k; v] (transformer), [k; q; v] (performer) */
    float *qkv_b;           /* [3T] performer only */
    float *proj_w, *proj_b; /* [T, T], [T] */
    float *n2_w, *n2_b;     /* [T] */
    float *fc1_w, *fc1_b;   /* [T, T], [T] (mlp_ratio 1) */
    float *fc2_w, *fc2_b;   /* [T, T], [T] */
    float *prm;             /* [m, T] performer's random features, m = T / 2 */
} vitc__t2t_stage;

/* The model's own tensors; a second instance points into the gradients. */
typedef struct vitc__vit_w {
    float *cls;     /* [1, 1, C] */
    float *conv_w;  /* [C, in, p, p], read as [C, in*p*p] */
    float *conv_b;  /* [C] */
    float *pos;     /* [1, 1 + g*g, C], g = image_size / patch */
    float *ln_w, *ln_b; /* [C] */
    float *head_w;  /* [classes, C] */
    float *head_b;  /* [classes] */
    float *dist;    /* [1, 1, C] DeiT's distillation token (token 1) */
    float *head2_w; /* [classes, C] DeiT's distillation head, on token 1 */
    float *head2_b; /* [classes] */
    float *reg;     /* [1, R, C] register tokens (DINOv2 with registers), no position */
    float *pre_w, *pre_b; /* [C] CLIP's pre_layrnorm */
    /* SigLIP's MAP head: probe [1, 1, C], MultiheadAttention in_proj [3C, C]
     * / [3C] and out_proj, LayerNorm, MLP [M, C] / [C, M]. */
    float *map_probe, *map_qkv_w, *map_qkv_b, *map_proj_w, *map_proj_b, *map_ln_w, *map_ln_b;
    float *map_fc1_w, *map_fc1_b, *map_fc2_w, *map_fc2_b;
    vitc__t2t_stage t2t[2];   /* T2T-ViT's tokens_to_token.attention1 / 2 */
    float *t2t_proj_w;        /* [C, 9T] tokens_to_token.project */
    float *t2t_proj_b;        /* [C] */
    float *clf_w;             /* [K, E] VIT_HEAD_LINEAR's classifier over the embedding */
    float *clf_b;             /* [K] */
} vitc__vit_w;

/* Per-family options of the one forward (vit.c); vitc_vit_create and the
 * torchvision/timm loader set the torchvision ones. */
typedef enum vitc__vit_head {
    VIT_HEAD_NONE = 0, /* a backbone (HF ViTModel, DeiTModel): embeddings only */
    VIT_HEAD_CLS = 1,  /* logits = head(ln(x)[:, 0]) */
    VIT_HEAD_MEAN2 = 2, /* DeiT with teacher: (head(ln(x)[:,0]) + head2(ln(x)[:,1])) / 2 */
    VIT_HEAD_PROJ = 3,  /* CLIP: image_embeds = head(ln(x[:, 0])) (bias zero), an embedding */
    VIT_HEAD_MAP = 4,   /* SigLIP: pooler_output = the MAP head over ln(x), an embedding */
    VIT_HEAD_CLS_MEAN = 5, /* DINOv2 classifier: head([ln(x)[:, 0], mean(ln(x) patches)]) */
    /* A classifier over an embedding (vitc_vit_reset_head on CLIP / SigLIP):
     * logits = clf(embedding), the embedding from embed_head (PROJ or MAP) */
    VIT_HEAD_LINEAR = 6
} vitc__vit_head;
enum { VIT_ACT_GELU = VITC__NN_GELU, VIT_ACT_GELU_TANH = VITC__NN_GELU_TANH,
       VIT_ACT_QUICK_GELU = VITC__NN_QUICK_GELU };
typedef enum vitc__vit_pos_rule {
    VIT_POS_ALIGN_CORNERS = VITC__NN_RESAMPLE_ALIGN_CORNERS, /* torchvision: align_corners=True */
    VIT_POS_HALF_PIXEL = VITC__NN_RESAMPLE_HALF_PIXEL, /* HF >= 4.45: to size, align_corners=False */
    VIT_POS_ANTIALIAS = VITC__NN_RESAMPLE_ANTIALIAS    /* the same, antialias=True (DINOv2 + registers) */
} vitc__vit_pos_rule;

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
    VA_PROBS, /* [B, H, N, N] attention probabilities (training with attention_dropout) */
    VA_COUNT
};
typedef struct vitc__vit_acts {
    int64_t B, N, P;
    int training;
    int probs;      /* VA_PROBS kept (training with attention_dropout) */
    float *patches; /* [B*P, in*p*p] im2col of the images */
    float *layers;
    size_t stride;  /* floats from block l to block l + 1; 0 in inference */
    size_t off[VA_COUNT];
    float *cls_in;  /* [B, C] the encoder's class tokens (last block output) */
    float *cls_out; /* [B, C] final-normed class tokens */
} vitc__vit_acts;

static inline float *vitc__va(const vitc__vit_acts *a, int l, int k) {
    if ((k == VA_LSE && !a->training) || (k == VA_PROBS && !a->probs))
        return NULL;
    return a->layers + (size_t)l * a->stride + a->off[k];
}

struct vitc__family;

struct vitc_vit {
    vitc_vit_config cfg;
    char arch[32];
    /* The family that loaded it (family.h): its rows' names, its hooks. */
    const struct vitc__family *fam;
    vitc__vit_naming naming;
    /* Family options (vitc__vit_table_build reads n_prefix and head). */
    int n_prefix;          /* tokens before the patches: class, distillation, registers */
    int n_cls;             /* 1: a class token first; 0: none (SigLIP) */
    int n_dist;            /* 1: DeiT's distillation token after the class token */
    int n_reg;             /* register tokens after those (no position embedding) */
    int layer_scale;       /* blocks scale each branch by ls1 / ls2 (DINOv2) */
    int swiglu;            /* MLP fc2(silu(a) * b), [a, b] = fc1 halves; fc2 [C, mlp/2] */
    int pre_norm;          /* LayerNorm pre (PRE_W/B rows) on the embeddings (CLIP) */
    int final_cls_only;    /* the final LayerNorm acts on the class token alone (CLIP's
                            * post_layernorm): features are the un-normed tokens */
    int mlp_act;           /* MLP activation: VIT_ACT_* */
    vitc__vit_head head;
    /* VIT_HEAD_LINEAR: the embedding head under the classifier (PROJ or
     * MAP) and its output size E; cfg.num_classes is the classifier's K. */
    vitc__vit_head embed_head;
    int embed_dim;
    vitc__vit_pos_rule pos_rule;
    float attn_scale;      /* the blocks' attention scale; 0: head_dim^-0.5 (T2T's qk_scale) */
    /* T2T-ViT (t2t_vit.c): its tokens_to_token module replaces the patch
     * embedding; 0 for every other family. */
    int t2t;               /* VIT_NAMES_T2T_TRANSFORMER or _PERFORMER */
    int t2t_dim;           /* token_dim T */
    int no_qkv_bias;       /* qkv_bias false: the blocks' qkv.bias rows are zeros, not read */
    char family[32];       /* "torchvision", "timm", "hf-vit", "hf-deit" */
    char *ignored;         /* Hub tensors the forward does not use, NUL-separated */
    vitc__hf_proc proc;    /* the Hub model's image processor (present: 1) */
    int n_ignored;

    char *label_text;  /* every label, NUL-separated */
    char **labels;     /* [num_classes] into label_text, NULL when none */

    uint64_t id;  /* vitc__handle_register() */
    int training; /* forward records activations for backward */
    /* Regularisation in training mode (torchvision's dropout and
     * attention_dropout, timm's drop path per block), drawn from rng. */
    float dropout, attention_dropout, drop_path;
    vitc__rng rng;
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

    /* The run state of the model API's forwards and of training (recorded
     * activations, dropout masks): a session of its own, made on first use. */
    struct vitc_session *own;
    /* Inference weights (vit_precision.c): packed for `precision` from the
     * row-major parameters of version pversion; rebuilt at the next
     * model-API forward once wversion moves (vitc_vit_param, an optimizer
     * step); a session only reads them. Training forwards use the row-major
     * parameters. */
    vitc_precision precision;
    /* FP32 or BF16: the attention's q k^T and P v, when attn_precision_set;
     * else vitc_vit_get_attention_precision's default (the weights'). */
    vitc_precision attn_precision;
    int attn_precision_set;
    vitc__pweight *pw;          /* [depth * VIT_PW_COUNT] or NULL */
    vitc__pweight pconv, phead; /* patch embedding (the model's precision), head (fp32) */
    uint64_t wversion, pversion;
    int packed;                 /* pw, pconv, phead hold what was packed at pversion */
    vitc_precision packed_prec;
    const struct vitc__gemm_kernel *packed_for; /* fp32 panels' kernel, or NULL */
    /* The row-major copies of the packed matrices were given back to the
     * OS (their pages hold zeros): the packs are the weights until
     * vitc__vit_rowmajor unpacks them. */
    int released;
    /* The text tower (text.h: CLIP's, SigLIP's), NULL for a vision-only model. */
    struct vitc__text *text;
};

/* What one forward writes (a vitc_session): activations, scratch, the
 * resampled position embedding; the model is only read. The model's own
 * session (own) also records a training forward for backward and draws its
 * dropout masks from the model's rng; other sessions run inference only. */
struct vitc_session {
    const vitc_vit *m;
    uint64_t model_id;   /* m->id: a session outliving its model is refused */
    int own;             /* m->own: training may record */
    vitc__rng *rng;      /* the model's (own session), else NULL: inference draws nothing */
    /* Activations, grown for the largest (batch, image size) seen, reused. */
    vitc__buf act;
    vitc__vit_acts a;
    int recorded;        /* a's training forward is there for backward */
    int rec_gh, rec_gw;  /* its patch grid */
    int rec_cls_only;    /* its last block ran on the class rows alone (vit_block's cls_only) */
    int rec_want;        /* vit.c: record this forward's embedding for backward (training) */
    vitc__buf bwd;       /* backward scratch */
    vitc__buf masks;     /* the recorded forward's keep masks (bytes, vitc__vit_mask) */
    vitc__buf pdrop;     /* [2, N, N] attention-dropout scratch */
    size_t mask_stride;  /* bytes from block l's masks to block l + 1's */
    /* Position embedding resampled for a grid gh x gw: cached per grid and
     * parameter version (pos_ver = wversion + 1 it was computed at; 0: none),
     * so a forward at the same size resamples nothing. */
    vitc__buf pos_buf;
    int pos_gh, pos_gw;
    uint64_t pos_ver;
    const float *pos_used; /* [1 + gh*gw, C]: pos itself or pos_buf */
    int use_packed;      /* this forward reads m->pw (vitc__vit_weights_check) */
    /* Attention-map scratch (only when asked for). */
    vitc__buf probs_buf; /* [B, H, N, N] when the caller gives no attn */
    vitc__buf roll_buf;  /* [B, N, N] rollout + [2, N, N] */
    vitc__buf feat_buf;  /* embeddings' normed tokens; DeiT heads' scratch */
    vitc__buf head_buf;  /* the MAP head's scratch */
    vitc__buf mask_buf;  /* the blocks' additive attention mask, when one is set */
    vitc__buf pre_buf;   /* [B, N, C] pre_layrnorm's input in a training forward */
    vitc__buf t2t_buf;   /* T2T-ViT's token module activations */
    vitc__buf clf_buf;   /* VIT_HEAD_LINEAR: the embedding [B, E] its classifier read, then
                          * the backward's d embedding [B, E] */
    vitc__buf text_buf;  /* the text tower's activations (text.c) */
    /* vitc__vit_forward_layers' taps: the hidden states after stages
     * taps[i] copied (final-normed when tap_norm) to tap_out [n_taps, B, N, C]. */
    const int *taps;
    int n_taps, tap_norm;
    float *tap_out;
};
typedef struct vitc_session vitc__session;
/* The head that makes the model's embedding: VIT_HEAD_LINEAR classifies the
 * embedding of the head under it (embed_head: CLIP's projection, SigLIP's
 * MAP head). */
static inline vitc__vit_head vitc__vit_emb_head(const vitc_vit *m) {
    return m->head == VIT_HEAD_LINEAR ? m->embed_head : m->head;
}
/* Output rows of head_w: the classes, or CLIP's projection width (embed_dim
 * under VIT_HEAD_LINEAR, whose num_classes are the classifier's). */
static inline int64_t vitc__vit_head_rows(const vitc_vit *m) {
    return m->head == VIT_HEAD_LINEAR ? m->embed_dim : m->cfg.num_classes;
}
/* m's own session, made on first use (the model API and training). */
vitc_status vitc__vit_own(vitc_vit *m, vitc__session **out);
/* Whether a forward may read m's weights without writing m: *use_packed
 * when the packs are current; fp32 falls back to the row-major weights
 * when resident; otherwise an error naming vitc_vit_prepare. */
vitc_status vitc__vit_weights_check(const vitc_vit *m, int *use_packed);

/* A block's packed weights, at m->pw[l * VIT_PW_COUNT + k]. */
enum { VIT_PW_QKV = VITC__NN_PW_QKV, VIT_PW_PROJ = VITC__NN_PW_PROJ, VIT_PW_FC1 = VITC__NN_PW_FC1,
       VIT_PW_FC2 = VITC__NN_PW_FC2, VIT_PW_COUNT = VITC__NN_PW_COUNT };
/* Makes the packed weights current for an inference forward (repacking
 * when the parameters, precision, arch or GEMM backend moved): the owner's
 * step before sessions read them (vitc__vit_weights_check). */
vitc_status vitc__vit_prepare_inference(vitc_vit *m);
/* The row-major parameters valid again (unpacking released matrices, then
 * dropping the packs): before training, vitc_vit_param, saving. */
void vitc__vit_rowmajor(vitc_vit *m);
void vitc__vit_pack_free(vitc_vit *m);
/* Gives the pages wholly inside W's n floats back to the OS (their
 * contents become zeros): for arenas that are read once (vit_precision.c). */
void vitc__vit_release(const float *W, size_t n);
/* Packing while loading, so the peak is the converted model plus about one
 * fp32 matrix (vitc_vit_load_precision): _begin with m's table bound and
 * its parameters not yet read; _row after table entry i's values are in
 * place (a Linear weight or the patch embedding is packed and its pages
 * given back at once); _end(m, s) with the load's status (an error
 * unpacks what was packed) — the same packs as vitc_vit_set_precision. */
vitc_status vitc__vit_load_pack_begin(vitc_vit *m, vitc_precision p);
vitc_status vitc__vit_load_pack_row(vitc_vit *m, int entry);
vitc_status vitc__vit_load_pack_end(vitc_vit *m, vitc_status s);
/* ---- The model core (model.c): what every family shares -------------- */

/* A model with torchvision's family options (a loader changes them). */
vitc_vit *vitc__vit_alloc(void);
/* m->labels [n] and m->label_text from arr, a jansson array of n strings
 * (the caller checked them); what names the file in errors. */
struct json_t;
vitc_status vitc__vit_keep_labels(vitc_vit *m, struct json_t *arr, const char *what);
/* The shape of tensor `name` when it has ndim dims, each in [1, 2^20];
 * NULL when absent or otherwise. */
const int64_t *vitc__vit_file_shape(const vitc_safetensors *st, const char *name, int ndim);
/* Build m->table for m->cfg with m->fam's rows and names (sizes
 * overflow-checked), with 64-byte aligned offsets and n_params, and
 * allocate blocks. */
vitc_status vitc__vit_table_build(vitc_vit *m);
/* Name of a table row in m's spelling ("conv_proj.weight", ...). */
const char *vitc__vit_entry_name(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap);

/* Input width of T2T stage s: in*7*7 for attention1, T*3*3 for attention2. */
static inline int64_t vitc__t2t_stage_dim(const vitc_vit *m, int s) {
    return s ? 9 * (int64_t)m->t2t_dim : 49 * (int64_t)m->cfg.in_channels;
}

/* Keep masks of block l (training with dropout or drop path; NULL
 * otherwise): [B*N*C] after out_proj, [B*N*mlp] after GELU, [B*N*C] after
 * fc2, [B] drop path of each branch, [B*H*N*N] attention dropout; emb:
 * [B*N*C] after the embedding. */
typedef struct vitc__vit_mask {
    uint8_t *att, *hid, *out, *dp_att, *dp_mlp;
    uint8_t *probs; /* [B*H*N*N] attention dropout (NULL without) */
} vitc__vit_mask;
static inline uint8_t *vitc__vit_emb_mask(const vitc__session *s) {
    return s->mask_stride ? (uint8_t *)s->masks.p : NULL;
}
static inline vitc__vit_mask vitc__vit_block_mask(const vitc_vit *m, const vitc__session *s,
                                                  int l) {
    vitc__vit_mask k = {0};
    if (!s->mask_stride)
        return k;
    size_t BNC = (size_t)(s->a.B * s->a.N * m->cfg.hidden_dim);
    size_t BNM = (size_t)(s->a.B * s->a.N * m->cfg.mlp_dim);
    k.att = (uint8_t *)s->masks.p + BNC + (size_t)l * s->mask_stride;
    k.hid = k.att + BNC;
    k.out = k.hid + BNM;
    k.dp_att = k.out + BNC;
    k.dp_mlp = k.dp_att + s->a.B;
    if (s->a.probs)
        k.probs = k.dp_mlp + s->a.B;
    return k;
}

/* Block l of the session s on m as an nn block (vit.c): the
 * forward's and the backward's view; probs: attention maps asked for. */
vitc__nn_block vitc__vit_block_desc(const vitc_vit *m, vitc__session *s, int l, float *probs);

/* SigLIP's attention-pooling head (SiglipMultiheadAttentionPoolingHead)
 * on the normed tokens h [B, N, C] into out [B, C] (vit.c):
 *   a = out_proj(MHA(query = probe, keys and values = h))   [B, C]
 *   out = a + fc2(act(fc1(layernorm(a))))
 * r non-NULL: what its backward reads, in s->head_buf. */
typedef struct vitc__vit_map_rec {
    vitc__nn_cross_rec x; /* q [C], kv [B, N, 2C], att [B, C], lse [B, H] */
    float *a, *ln, *hpre, *hact; /* [B, C], [B, C], [B, mlp], [B, mlp] */
} vitc__vit_map_rec;
vitc_status vitc__vit_map_head(const vitc_vit *m, vitc__session *s, const float *h, int64_t B,
                               int64_t N, float *out, vitc__vit_map_rec *r);
/* The head's pieces over w (m->w or the gradients m->g). */
vitc__nn_cross vitc__vit_map_attn(const vitc_vit *m, const vitc__vit_w *w, int64_t B, int64_t N);
vitc__nn_mlp vitc__vit_map_mlp(const vitc_vit *m, const vitc__vit_w *w);
/* DINOv2's head input from the final-normed tokens h [B, N, C]: in [B, 2C]
 * = [class token, mean of the tokens after the np prefix ones], as the
 * forward and its backward both build it. */
void vitc__vit_cls_mean(float *in, const float *h, int64_t B, int64_t N, int64_t C, int64_t np);
/* The adjoint of the position resampling of vit.c (m->pos_rule) from the
 * checkpoint's g x g grid to gh x gw: dsrc [g*g, C] += R^T ddst [gh*gw, C]. */
vitc_status vitc__vit_pos_backward(const vitc_vit *m, float *dsrc, const float *ddst, int64_t gh,
                                   int64_t gw);

/* The hidden states after the given stages (0: the embeddings, l: block
 * l's output, as transformers' hidden_states[l]) of one inference forward,
 * each through the final LayerNorm when norm (Dinov2Backbone's
 * apply_layernorm): outs [n, B, N, C], every token, prefix rows first. */
vitc_status vitc__vit_forward_layers(const vitc_vit *m, vitc__session *s, const float *images,
                                     int B, int H, int W, const int *stages, int n, int norm,
                                     float *outs);

/* Gradient array and structs on first use (vit_train.c). */
vitc_status vitc__vit_grad_alloc(vitc_vit *m);

/* T2T-ViT's forward (t2t_vit.c; its names and configuration: families/t2t.c). */
/* After the weights are bound: the engine layers of transformer mode. */
/* tokens_to_token(images [B, in, H, W]) -> out [B * g*g, C], H = W = 16 g. */
vitc_status vitc__t2t_tokens(const vitc_vit *m, vitc__session *s, const float *images, int64_t B,
                             int64_t H, int64_t W, float *out);
/* The gradient of the last recorded (training) tokens_to_token for dout
 * [B * g*g, C], added into m->g's T2T rows; transformer mode only. */
vitc_status vitc__t2t_tokens_backward(vitc_vit *m, vitc__session *s, const float *dout, int64_t B,
                                      int64_t H, int64_t W);

#endif
