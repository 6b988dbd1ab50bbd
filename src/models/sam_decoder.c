/*
 * sam_decoder.c — SAM's prompt encoder, mask decoder and post-processing.
 * (Being written: until it lands, loading a SAM model fails here with a
 * clear message rather than at link time.)
 */
#include "sam.h"

vitc_status vitc__sam_dec_load(vitc__sam_dec **out, const vitc__shards *sh,
                               const struct json_t *config) {
    (void)sh, (void)config;
    *out = NULL;
    return vitc__err(VITC_ERR_UNSUPPORTED, "SAM's mask decoder is not built in this version");
}
void vitc__sam_dec_free(vitc__sam_dec *d) { (void)d; }
vitc_status vitc__sam_dec_predict(const vitc__sam_dec *d, const struct vitc_sam_image *e,
                                  int input_size, const vitc_sam_prompt *p, vitc_sam_result *out) {
    (void)d, (void)e, (void)input_size, (void)p, (void)out;
    return vitc__err(VITC_ERR_UNSUPPORTED, "SAM's mask decoder is not built in this version");
}
