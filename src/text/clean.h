/*
 * clean.h — the text cleaning and the pre-tokenizer of CLIP's tokenizers
 * (clean.c), shared by the BPE model (bpe.c). Text travels as code points
 * (int32) between the steps: every step is a map over characters, and the
 * pre-tokenizer's classes are per character.
 */
#ifndef VITC_TEXT_CLEAN_H
#define VITC_TEXT_CLEAN_H

#include "tokenizer.h"

/* A growable code point buffer (cp: [n], capacity cap). */
typedef struct vitc__cps {
    int32_t *cp;
    size_t n, cap;
} vitc__cps;

void vitc__cps_free(vitc__cps *b);

/* Decodes valid UTF-8 s[0..len) (the router checked it) into out. */
vitc_status vitc__utf8_decode(const char *s, size_t len, vitc__cps *out);

/* Cleans in[0..n) as the source does before splitting, into out:
 *   VITC__CLEAN_HF_CLIP: NFC, each run of White_Space -> one space,
 *     lower case per character (transformers' CLIP fast normalizer);
 *   VITC__CLEAN_OPENAI: ftfy.fix_text's fixes but the mojibake repair,
 *     html.unescape twice, Python's split/join on whitespace, str.lower
 *     (OpenAI's and open_clip's basic_clean + whitespace_clean + lower).
 * Other modes copy the text. */
/* html_off (may be NULL for a whole text): ftfy's HTML unescaping stays off
 * from the first line holding '<' on; a text cleaned in pieces cut after
 * '\n' carries it from piece to piece (start it at 0). */
vitc_status vitc__clean(vitc__text_clean mode, const int32_t *in, size_t n, vitc__cps *out,
                        int *html_off);

/* CLIP's pre-tokenizing regex
 *   <special>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
 * as findall scans it: the next piece of cp[*pos..n) is [*start, *end);
 * returns 0 at the end, else 1 + the index of the special string matched
 * (nspecial of them, code points; an empty list: none), or 1 + nspecial
 * for an ordinary piece. ignore_case: Python's re.IGNORECASE on the
 * (already lower-case) text, where only U+017F long s folds to 's'. */
int vitc__pretok_next(const int32_t *cp, size_t n, size_t *pos, size_t *start, size_t *end,
                      const int32_t *const *special, const size_t *special_len, int nspecial,
                      int ignore_case);

#endif
