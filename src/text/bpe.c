/* bpe.c — placeholder until the bpe tokenizer lands (this session). */
#include "tokenizer.h"

vitc_status vitc__bpe_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                           const void *json) {
    (void)t; (void)src; (void)json;
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: this tokenizer is not built in yet", path);
}
vitc_status vitc__bpe_encode(const vitc_tokenizer *t, const char *text, size_t len, int32_t *ids,
                             int cap, int *n) {
    (void)t; (void)text; (void)len; (void)ids; (void)cap; (void)n;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this tokenizer is not built in yet");
}
void vitc__bpe_free(void *impl) { (void)impl; }
