/*
 * tokenizer.h — what the tokenizer router (tokenizer.c) and the two
 * tokenizer models share: CLIP's byte-level BPE (bpe.c) and SentencePiece
 * Unigram (unigram.c). The router finds the files and fills the common
 * fields; each model reads its own files and encodes one text into ids
 * without the special tokens, which the router adds, truncates and pads.
 */
#ifndef VITC_TEXT_TOKENIZER_H
#define VITC_TEXT_TOKENIZER_H

#include "../internal.h"

/* Which text cleaning runs before the model (chosen by the files' source). */
typedef enum vitc__text_clean {
    VITC__CLEAN_HF_CLIP = 0, /* transformers' CLIP fast tokenizer: NFC, whitespace, lower case */
    VITC__CLEAN_OPENAI = 1,  /* OpenAI / open_clip: ftfy's fixes, HTML unescape x2, ws, lower */
    VITC__CLEAN_SIGLIP = 2,  /* SigLIP: lower case, ASCII punctuation removed, whitespace */
    VITC__CLEAN_NONE = 3     /* the model's own normalizer alone */
} vitc__text_clean;

typedef enum vitc__tok_kind { VITC__TOK_BPE = 0, VITC__TOK_UNIGRAM = 1 } vitc__tok_kind;

/* Where the vocabulary is (the router decides, the model reads). */
typedef enum vitc__tok_source {
    VITC__SRC_TOKENIZER_JSON = 0, /* a Hub tokenizer.json */
    VITC__SRC_VOCAB_MERGES = 1,   /* vocab.json + merges.txt (path: the directory) */
    VITC__SRC_OPENCLIP_GZ = 2,    /* bpe_simple_vocab_16e6.txt.gz (needs zlib) */
    VITC__SRC_SPIECE = 3          /* spiece.model, SentencePiece's protobuf */
} vitc__tok_source;

struct vitc_tokenizer {
    vitc__tok_kind kind;
    vitc__text_clean clean;
    int context;     /* ids per text after padding (77 CLIP, 64 SigLIP) */
    int vocab_size;
    int32_t bos;     /* prepended, or -1 (SigLIP adds none) */
    int32_t eos;     /* appended; kept last on truncation */
    int32_t pad;     /* fills ids [n, context) */
    void *impl;      /* the model's own state (bpe.c / unigram.c) */
};

/* Each model: load from a source (path: the file, or the directory for
 * VITC__SRC_VOCAB_MERGES; json: the parsed tokenizer.json for
 * VITC__SRC_TOKENIZER_JSON, else NULL) filling t's fields it knows; encode
 * the bytes text[0..len) (valid UTF-8, checked by the router) into at most
 * cap ids (*n: how many; more is truncated, *n = cap); free. */
vitc_status vitc__bpe_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                           const void *json);
vitc_status vitc__bpe_encode(const vitc_tokenizer *t, const char *text, size_t len, int32_t *ids,
                             int cap, int *n);
void vitc__bpe_free(void *impl);
vitc_status vitc__unigram_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                               const void *json);
vitc_status vitc__unigram_encode(const vitc_tokenizer *t, const char *text, size_t len,
                                 int32_t *ids, int cap, int *n);
void vitc__unigram_free(void *impl);


#endif
