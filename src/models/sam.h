/*
 * sam.h — Segment Anything inside the library: the model (sam.c: loading,
 * the image encoder, the public vitc_sam_* calls) and its prompt side
 * (sam_decoder.c: the prompt encoder, the two-way-transformer mask decoder
 * and the post-processing).
 *
 * Calls go one way: sam.c -> sam_decoder.c -> src/nn/ -> src/kernels/.
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
/* Masks for one prompt on e: points and boxes mapped from the original
 * image's pixels into the input square of side input_size (as SamProcessor
 * does), the decoder run, the masks upscaled to input_size, cropped to the
 * resized image and resized to the original size (post_process_masks
 * without the threshold). out's arrays malloc'd (vitc_sam_result_free). */
vitc_status vitc__sam_dec_predict(const vitc__sam_dec *d, const struct vitc_sam_image *e,
                                  int input_size, const vitc_sam_prompt *p, vitc_sam_result *out);

#endif
