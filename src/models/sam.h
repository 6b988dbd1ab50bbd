/*
 * sam.h — Segment Anything inside the library: the model (sam.c: loading,
 * the image encoder, the public vitc_sam_* calls) and its prompt side
 * (sam_decoder.c: the prompt encoder and the two-way-transformer mask
 * decoder; sam_post.c: the masks' post-processing).
 *
 * Calls go one way: sam.c -> sam_decoder.c -> sam_post.c, src/nn/ ->
 * src/kernels/.
 */
#ifndef VITC_MODELS_SAM_H
#define VITC_MODELS_SAM_H

#include "family.h"

struct json_t;

/* One image's embedding, what the decoder needs of the image. */
struct vitc_sam_image {
    float *emb;                  /* [C, h, w] channels first (get_image_embeddings) */
    float *emb_cl;               /* [h, w, C] the same, channels last (what the decoder reads) */
    int64_t C, h, w;
    int orig_w, orig_h;          /* the image's size */
    int resized_w, resized_h;    /* its size inside the input square (before padding) */
    /* The decoder's prompt-independent products on this image (sam_decoder.c
     * makes them on first use and publishes them atomically; NULL until
     * then; vitc__sam_dec_cache_free) */
    struct vitc__sam_dec_cache *dec_cache;
};

/* The prompt encoder, mask decoder and shared positional embedding. */
typedef struct vitc__sam_dec vitc__sam_dec;
/* From a SamModel's tensors (prompt_encoder.*, mask_decoder.*,
 * shared_image_embedding.*) and its config.json (prompt_encoder_config,
 * mask_decoder_config; absent keys take transformers' defaults); every
 * tensor's shape checked before use. */
vitc_status vitc__sam_dec_load(vitc__sam_dec **out, const vitc__shards *sh,
                               const struct json_t *config);
void vitc__sam_dec_free(vitc__sam_dec *d);
void vitc__sam_dec_cache_free(struct vitc__sam_dec_cache *c);
/* Masks for one prompt on e: points and boxes mapped from the original
 * image's pixels into the input square of side input_size (as SamProcessor
 * does), the decoder run, the masks upscaled to input_size, cropped to the
 * resized image and resized to the original size (post_process_masks
 * without the threshold). out's arrays malloc'd (vitc_sam_result_free). */
vitc_status vitc__sam_dec_predict(const vitc__sam_dec *d, const struct vitc_sam_image *e,
                                  int input_size, const vitc_sam_prompt *p, vitc_sam_result *out);

/* post_process_masks(binarize=False) (sam_post.c): low [n, lo, lo] logits
 * upscaled to input_size, cropped to resized_w x resized_h and resized to
 * masks [n, oh, ow]; with masks NULL, bin [n, oh, ow] gets 1 where that
 * logit is > 0, else 0. */
vitc_status vitc__sam_post_masks(float *masks, unsigned char *bin, const float *low, int64_t n,
                                 int64_t lo, int input_size, int resized_w, int resized_h,
                                 int64_t ow, int64_t oh);

/* ---- the model (sam.c) and its image encoder (sam_encoder.c) ------- */

/* One encoder block's weights (row-major, torch's layouts). */
typedef struct vitc__sam_layer {
    float *ln1_w, *ln1_b;   /* [C] */
    float *qkv_w, *qkv_b;   /* [3C, C], [3C] (NULL: qkv_bias false) */
    float *proj_w, *proj_b; /* [C, C], [C] */
    float *rel_h, *rel_w;   /* [2g-1, C/H] (g: the window, or the grid), NULL without */
    float *ln2_w, *ln2_b;   /* [C] */
    float *fc1_w, *fc1_b;   /* [M, C], [M] */
    float *fc2_w, *fc2_b;   /* [C, M], [C] */
} vitc__sam_layer;

/* Packed weights of a block, and of the patch and neck convolutions. */
enum { VITC__SAM_PW_QKV, VITC__SAM_PW_PROJ, VITC__SAM_PW_FC1, VITC__SAM_PW_FC2,
       VITC__SAM_PW_LAYER };

/* transformers' SamVisionEncoder. */
typedef struct vitc__sam_enc {
    int C, depth, H, M, patch, img, grid, ws, O; /* width, blocks, heads, MLP, patch, input
                                                  * side, grid = img / patch, window, neck */
    int use_rel, use_abs, qkv_bias, act;         /* act: VITC__NN_* */
    float eps;
    unsigned char *global;   /* [depth] 1: the block attends over the whole grid */
    float *patch_w, *patch_b; /* [C, 3 p p], [C] */
    float *pos;              /* [grid, grid, C] or NULL */
    vitc__sam_layer *layers; /* [depth] */
    float *neck1_w;          /* [O, C] (conv 1x1, no bias) */
    float *nln1_w, *nln1_b;  /* [O] */
    float *neck2_w;          /* [O, O, 3, 3] (conv 3x3 pad 1, no bias) */
    float *nln2_w, *nln2_b;  /* [O] */
    /* [depth * VITC__SAM_PW_LAYER + 3]: the blocks', then patch, neck1,
     * neck2; NULL in fp32 without a packing kernel (OpenBLAS: row-major
     * GEMMs then). A packed matrix's row-major copy above is gone (its
     * pages given back): read the pack, never the copy. */
    vitc__pweight *pw;
    vitc_precision prec; /* the blocks' and the neck's packs (vitc_sam_load_precision) */
} vitc__sam_enc;

struct vitc_sam {
    vitc__sam_enc enc;
    vitc__sam_dec *dec;
};

/* The encoder's tensors (vision_encoder.*) from sh, every shape checked
 * against e's config before anything is allocated; each matrix packed for
 * the GEMM in prec (the patch embedding in fp32) as soon as it is read and
 * its row-major copy given back: afterwards only the packs hold those
 * weights. */
vitc_status vitc__sam_enc_load(vitc__sam_enc *e, const vitc__shards *sh, vitc_precision prec);
void vitc__sam_enc_free(vitc__sam_enc *e);
/* pixels [3, img, img] (preprocessed) -> emb [O, grid, grid] and emb_cl
 * [grid, grid, O]. Scratch is the call's own (bounded: a few grids of
 * activations, nothing of N x N). */
vitc_status vitc__sam_enc_forward(const vitc__sam_enc *e, const float *pixels, float *emb,
                                  float *emb_cl);

#endif
