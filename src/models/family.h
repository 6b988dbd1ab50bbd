/*
 * family.h — a ViT family (torchvision, timm, HF ViT/DeiT, DINOv2, CLIP,
 * SigLIP, T2T-ViT) as one const struct behind one interface.
 *
 * The loader router (load.c) opens the source once (a .safetensors file, a
 * Hub directory's config.json and shards), asks each family's detect in a
 * fixed order, strongest evidence first (stb's stbi__load_main), and lets
 * the first that claims it configure the model; the model core (model.c)
 * then builds the parameter table from the family's rows and names, and
 * the weights are read (model.c for a file in the table's own names, hub.c
 * for a family whose file names map onto the table).
 *
 * Calls go one way: load.c -> families/ -> hub.c, file_config.c -> model.c.
 * Adding a family: one file in families/ and one line in load.c's list.
 */
#ifndef VITC_FAMILY_H
#define VITC_FAMILY_H

#include "vit_internal.h"

struct json_t;

/* Sanity bounds on a config read from a file: far above any real ViT, low
 * enough that the table and the size math cannot run away. */
#define VIT_MAX_DIM (1 << 20)
#define VIT_MAX_DEPTH 4096

/* ---- names: how the families spell the table's rows ---------------- */

/* Every LayerNorm and Linear of a checkpoint is a module whose two tensors
 * are "<module>.weight" and "<module>.bias": one name gives both rows
 * (role##_W and role##_B are adjacent roles). */
#define VITC__WB(role, module) [role##_W] = module ".weight", [role##_B] = module ".bias"
/* A block's twelve rows: its modules' names, the qkv rows in full (a fused
 * in_proj_weight, or a "%s" the query/key/value names fill). */
#define VITC__BLOCK_NAMES(ln1, qkv_w, qkv_b, proj, ln2, fc1, fc2)                            \
    VITC__WB(VIT_L_LN1, ln1), [VIT_L_QKV_W] = qkv_w, [VIT_L_QKV_B] = qkv_b,                 \
        VITC__WB(VIT_L_PROJ, proj), VITC__WB(VIT_L_LN2, ln2), VITC__WB(VIT_L_FC1, fc1),     \
        VITC__WB(VIT_L_FC2, fc2)
/* Every row before the MAP head, as the single-file spellings name them
 * (torchvision's canonical one, timm's): the prefix tokens, then modules. */
#define VITC__MODEL_NAMES(cls, conv, pos, dist, reg, pre, ln, head, head2)                   \
    [VIT_P_CLS] = cls, [VIT_P_POS] = pos, [VIT_P_DIST] = dist, [VIT_P_REG] = reg,           \
        VITC__WB(VIT_P_CONV, conv), VITC__WB(VIT_P_PRE, pre), VITC__WB(VIT_P_LN, ln),       \
        VITC__WB(VIT_P_HEAD, head), VITC__WB(VIT_P_HEAD2, head2)
/* An attention-pooling (MAP) head's rows: its probe, then its modules. */
#define VITC__MAP_NAMES(probe, qkv_w, qkv_b, proj, ln, fc1, fc2)                             \
    [VIT_P_MAP_PROBE] = probe, [VIT_P_MAP_QKV_W] = qkv_w, [VIT_P_MAP_QKV_B] = qkv_b,        \
        VITC__WB(VIT_P_MAP_PROJ, proj), VITC__WB(VIT_P_MAP_LN, ln),                         \
        VITC__WB(VIT_P_MAP_FC1, fc1), VITC__WB(VIT_P_MAP_FC2, fc2)
/* timm's names (timm's ViT, timm's CLIP towers, T2T-ViT's encoder): its
 * blocks (blocks.N. + these) and its attn_pool head (also the canonical
 * spelling's, model.c). */
extern const char *const vitc__timm_layer_names[VIT_L_COUNT];
#define VITC__TIMM_MAP_NAMES                                                                 \
    VITC__MAP_NAMES("attn_pool.latent", "attn_pool.qkv.weight", "attn_pool.qkv.bias",       \
                    "attn_pool.proj", "attn_pool.norm", "attn_pool.mlp.fc1",                \
                    "attn_pool.mlp.fc2")
/* transformers' CLIP and SigLIP encoder layers (encoder.layers.N.), which
 * are the same module; their q/k/v and ViT's / DINOv2's query/key/value. */
extern const char *const vitc__hf_clip_layer_names[VIT_L_COUNT];
/* transformers' ViT / DeiT embeddings, final norm and classifiers, which
 * DINOv2 names alike (it has no distillation token or head). */
extern const char *const vitc__hf_vit_model_names[VIT_P_T2T0];
extern const char *const vitc__qkv_short[3], *const vitc__qkv_long[3];

/* A Hub model's weights: one .safetensors or the shards of an index, each
 * read lazily (a tensor when taken, its pages given back after). */
typedef struct vitc__shards {
    int n;
    vitc_safetensors **st; /* [n] shards */
    char **names;          /* [n] shard file names */
    unsigned char **used;  /* [n][count] tensor consumed or listed */
    int prec;              /* vitc_precision to pack for while filling, or -1 */
} vitc__shards;

struct vitc__hub_names;

/* What detect looks at, and what configure may fill in for the reading. */
typedef struct vitc__src {
    const char *path;   /* what the caller named; NULL from vitc_vit_from_safetensors */
    char *dir;          /* the Hub directory, or the directory holding path */
    const char *arch;   /* the caller's architecture name, or NULL */
    int prec;           /* vitc_precision to pack for while reading, or -1 */
    /* config.json of a Hub directory (model_type), of timm's Hub layout
     * (architecture: timm_hub), or NULL */
    struct json_t *config;
    int timm_hub;
    int open_clip_dir;  /* open_clip's Hub layout (open_clip_config.json) */
    const char *weights; /* the weights file (or index) read */
    /* A single .safetensors in the table's own names (torchvision, timm,
     * T2T): the router's (own) or the caller's. */
    const vitc_safetensors *st;
    vitc_safetensors *own;
    int adopt;          /* own's converted arena becomes the parameters */
    vitc__shards shards; /* names mapped by a Hub family: read by hub.c */
    struct json_t *aux; /* a family's own side config (open_clip_config.json), freed by the router */
    /* Set by a Hub family's configure for hub.c's reading. */
    const struct vitc__hub_names *names;
    const char *pre;    /* the backbone prefix present in the file */
    int mean2;          /* DeiT with teacher: its class head is cls_classifier */
    int qkv_bias;       /* 0: the blocks' qkv biases are zeros, not read */
} vitc__src;

typedef struct vitc__family {
    const char *name;
    /* 1 when src is this family's; cheap, no side effects. NULL: a Hub
     * family's (vitc__hub_family_detect over hub_types and saved). */
    int (*detect)(const vitc__src *src);
    /* m's config, options, family string, arch name and labels from src;
     * may choose src->names / adopt for the reading. NULL: a Hub family's
     * (vitc__hub_family_configure). */
    vitc_status (*configure)(vitc_vit *m, vitc__src *src);
    /* A Hub family's model types [n_hub_types], and the m->family strings
     * (NULL-ended) of the files vitc_vit_save wrote from its models. */
    const struct vitc__hub_names *hub_types;
    int n_hub_types;
    const char *const *saved;
    /* The family's spelling of a table row; NULL: the canonical one
     * (torchvision's keys, vitc__vit_canonical_name). */
    const char *(*row_name)(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap);
    /* Rows of its own (role >= VIT_P_T2T0): present?, then shape, init
     * and slot; NULL: none. */
    int (*has_row)(const vitc_vit *m, int role);
    void (*row)(vitc__param *e, const vitc_vit *m);
    /* The embedding in place of the patch convolution: images [B, in, H, W]
     * -> out [B * P, C]; NULL: the shared conv_proj (T2T's tokens_to_token). */
    vitc_status (*embed)(const vitc_vit *m, vitc__session *s, const float *images, int64_t B,
                         int64_t H, int64_t W, float *out);
    /* Its backward: the gradient of out [B * P, C] into the family's own
     * parameters (the training forward recorded on s). */
    vitc_status (*embed_backward)(vitc_vit *m, vitc__session *s, const float *dout, int64_t B,
                                  int64_t H, int64_t W);
    /* 1 when vitc_vit_backward can train m (its forward has a backward);
     * else 0 with the reason in why. NULL: every model of the family trains. */
    int (*can_train)(const vitc_vit *m, char *why, size_t cap);
    /* vitc_vit_reset_head: the classifier layout a fresh head takes (a
     * VIT_HEAD_*) and its init of a weight row (std of normal_; < 0: torch
     * Linear's default, 0: zeros; trunc: trunc_normal_). NULL: fresh_head;
     * both unset (VIT_HEAD_NONE): refused. */
    vitc__vit_head (*new_head)(const vitc_vit *m);
    vitc__vit_head fresh_head; /* with new_head NULL: the layout, whatever m's head */
    double head_std;
    int head_trunc;
} vitc__family;
/* A Hub family's fields from its array of model types and its saved names. */
#define VITC__HUB_FAMILY(types, saved_names)                                                 \
    .hub_types = types, .n_hub_types = (int)(sizeof types / sizeof types[0]),               \
    .saved = saved_names

extern const vitc__family vitc__family_torchvision, vitc__family_timm, vitc__family_t2t,
    vitc__family_hf_vit, vitc__family_dinov2, vitc__family_clip, vitc__family_siglip;

/* ---- model.c ------------------------------------------------------- */

/* 3 numbers of a JSON array into f (left as they are otherwise). */
void vitc__json_floats3(struct json_t *a, float *f);

/* The canonical spelling of a row: torchvision's state_dict keys, what
 * vitc_vit_create and the Hub families' tables use. */
const char *vitc__vit_canonical_name(const vitc__param *e, char *buf, size_t cap);
extern const char *const vitc__canonical_model_names[VIT_P_T2T0];
/* A family's new_head that keeps m's head layout (a backbone's: a head on
 * the class token), as torchvision's and timm's classifiers do. */
vitc__vit_head vitc__vit_head_kept(const vitc_vit *m);
extern const char *const vitc__canonical_layer_names[VIT_L_COUNT];
/* The config's values in range and consistent; headless: a backbone (no
 * head tensors), whose num_classes is 0. */
vitc_status vitc__vit_check_config(const vitc_vit_config *c, int headless);
/* params bound to the table's slots, the model registered. */
vitc_status vitc__vit_bind(vitc_vit *m);
/* The weights of a file in the table's own names (src->st): every row
 * present with its shape, no other tensor but training state; src->own's
 * arena adopted when src->adopt (else copied out), packed for src->prec
 * while read. */
vitc_status vitc__vit_read_file(vitc_vit *m, vitc__src *src);

/* ---- file_config.c: a torchvision / timm file (presets, vitc.config) - */

/* Names a single-file ViT spelling needs to infer its config. */
typedef struct vitc__ckpt_names {
    const char *const *model, *const *layer; /* the rows' names [VIT_P_T2T0], [VIT_L_COUNT] */
    const char *layer_fmt;    /* "blocks.%d." */
    const char *fc1_w;        /* NULL: layer's (torchvision < 0.13 spells it otherwise) */
    int timm;                 /* timm's mean/std 0.5 and preset names */
} vitc__ckpt_names;
/* Options from the names (distillation token, layer scale, a head), then
 * the config: the tensors' shapes, an asked preset's structure, the
 * file's vitc.config; m->arch named after the preset it is. */
vitc_status vitc__ckpt_configure(vitc_vit *m, const vitc_safetensors *st, const char *arch,
                                 const vitc__ckpt_names *n);
/* A file vitc_vit_save wrote from a model of one of families (a NULL-
 * ended list of m->family strings): its vitc.family names it. */
int vitc__ckpt_saved(const vitc__src *src, const char *const *families);
/* Such a model's options, processor, config and labels from vitc.family
 * and vitc.config (its tensors have the table's canonical names). */
vitc_status vitc__ckpt_saved_configure(vitc_vit *m, vitc__src *src);
/* vitc.config's text over m->cfg, field by field (labels too). */
vitc_status vitc__ckpt_metadata(vitc_vit *m, const char *text);
/* m->arch: the preset of m's config in the spelling (timm: timm's), or
 * "custom". */
void vitc__ckpt_name_arch(vitc_vit *m, int timm);

/* ---- hub.c: Hub directories ---------------------------------------- */

/* How a Hub family names the table's rows. */
typedef enum { HUB_KIND_VIT, HUB_KIND_DINO, HUB_KIND_CLIP, HUB_KIND_SIGLIP } vitc__hub_kind;
typedef struct vitc__hub_names {
    const char *type, *family, *prefix; /* prefix: the head classes' base_model_prefix */
    /* The tower's own model type, read alike but for its config not nested
     * in type's vision_config (clip_vision_model); NULL: none. */
    const char *vision_type;
    vitc__hub_kind kind;
    const char *const *model, *const *layer; /* [VIT_P_COUNT], [VIT_L_COUNT]; "%s" takes pre */
    const char *layer_fmt;    /* "encoder.layer.%d." */
    const char *const *qkv;   /* query/key/value or q/k/v; NULL: one fused in_proj */
    float eps;
    int patch, dist, registers, layer_scale;
    vitc__vit_pos_rule pos;
    int proj_t;               /* the projection stored [C, embed] (open_clip's visual.proj) */
} vitc__hub_names;

/* path's JSON object (through the non-blocking regular-file helper),
 * bounded by the kind of Hub file its name says (docs/limits.md). */
vitc_status vitc__hub_read_json(const char *path, struct json_t **out);
/* s (NULL: "") into dst[cap], cut at a UTF-8 character boundary when too
 * long, so a name is never left ending inside a character. */
void vitc__name_copy(char *dst, size_t cap, const char *s);
char *vitc__hub_join(const char *dir, const char *name);
int vitc__hub_exists(const char *path);
/* weights (a .safetensors, or an index naming shards beside it in dir)
 * into sh; vitc__shards_free frees them. */
vitc_status vitc__shards_open(vitc__shards *sh, const char *dir, const char *weights);
void vitc__shards_free(vitc__shards *sh);
/* The tensor called name in any shard (marked used): data, dims, shape. */
int vitc__shards_find(const vitc__shards *sh, const char *name, const float **data, int *nd,
                      const int64_t **shape);
/* config.json's model_type, or NULL. */
const char *vitc__hub_model_type(const vitc__src *src);
/* Copy the tensor name of shape want [wnd] from the shards into dst (read
 * then its pages given back), or the error naming it; dst NULL: only check
 * that it is there with that shape. squeeze: leading 1s of want may be
 * missing in the file (CLIP's class and position embeddings). */
vitc_status vitc__hub_take(const vitc__shards *h, const char *name, const int64_t *want, int wnd,
                           int squeeze, float *dst);
/* The entry of list[n] for src's model_type, or NULL. */
const vitc__hub_names *vitc__hub_match(const vitc__src *src, const vitc__hub_names *list, int n);
/* A transformers model from config.json with names fam (vit, deit,
 * dinov2, clip, siglip): config, options, labels, processor. */
vitc_status vitc__hub_configure(vitc_vit *m, vitc__src *src, const vitc__hub_names *fam);
/* A Hub family's detect and configure: a file saved from one of its
 * models (f->saved), or a Hub directory of one of its model types. */
int vitc__hub_family_detect(const vitc__family *f, const vitc__src *src);
vitc_status vitc__hub_family_configure(const vitc__family *f, vitc_vit *m, vitc__src *src);
/* The image processor (preprocessor_config.json over m->family's class
 * defaults); its mean/std become the config's. */
vitc_status vitc__hub_processor(vitc_vit *m, const char *dir);
/* Read the table's rows from src->shards in src->names' spelling,
 * packing for src->prec; leftover tensors listed or refused. */
vitc_status vitc__hub_read(vitc_vit *m, vitc__src *src);
/* The error when no family claims a Hub config.json. */
vitc_status vitc__hub_unknown(const vitc__src *src);
/* timm's Hub layout: its config.json's pretrained_cfg mean/std and
 * architecture name over what the file alone gave. */
vitc_status vitc__hub_timm_config(vitc_vit *m, const vitc__src *src);

#endif
