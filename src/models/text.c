/* text.c — placeholder until the text towers land (this session). */
#include "vit_internal.h"

int vitc_vit_has_text(const vitc_vit *m) { (void)m; return 0; }
int vitc_vit_text_dim(const vitc_vit *m) { (void)m; return 0; }
int vitc_vit_text_context(const vitc_vit *m) { (void)m; return 0; }
const vitc_tokenizer *vitc_vit_tokenizer(const vitc_vit *m) { (void)m; return NULL; }
vitc_status vitc_vit_logit_params(const vitc_vit *m, float *scale, float *bias, int *has_bias) {
    (void)m; (void)scale; (void)bias; (void)has_bias;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this model has no text tower");
}
vitc_status vitc_vit_encode_text_ids(vitc_vit *m, const int32_t *ids, int B, int L, float *out) {
    (void)m; (void)ids; (void)B; (void)L; (void)out;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this model has no text tower");
}
vitc_status vitc_vit_encode_text(vitc_vit *m, const char *const *texts, int B, float *out) {
    (void)m; (void)texts; (void)B; (void)out;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this model has no text tower");
}
vitc_status vitc_session_encode_text_ids(vitc_session *s, const int32_t *ids, int B, int L,
                                         float *out) {
    (void)s; (void)ids; (void)B; (void)L; (void)out;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this model has no text tower");
}
