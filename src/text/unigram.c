/* unigram.c — placeholder until the unigram tokenizer lands (this session). */
#include "tokenizer.h"

vitc_status vitc__unigram_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                           const void *json) {
    (void)t; (void)src; (void)json;
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: this tokenizer is not built in yet", path);
}
vitc_status vitc__unigram_encode(const vitc_tokenizer *t, const char *text, size_t len, int32_t *ids,
                             int cap, int *n) {
    (void)t; (void)text; (void)len; (void)ids; (void)cap; (void)n;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this tokenizer is not built in yet");
}
void vitc__unigram_free(void *impl) { (void)impl; }
