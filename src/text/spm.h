/*
 * spm.h — SentencePiece's model file and normalizer, without protobuf or
 * sentencepiece: a bounds-checked reader of the ModelProto wire format
 * (spm.c) and the normalizer that runs before segmentation (the
 * precompiled charsmap's longest-match rewrite, the whitespace rules, the
 * U+2581 escape), as sentencepiece 0.2 runs it. unigram.c segments.
 */
#ifndef VITC_TEXT_SPM_H
#define VITC_TEXT_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

/* SentencePiece.Type (sentencepiece_model.proto). */
enum {
    VITC__SP_NORMAL = 1,
    VITC__SP_UNKNOWN = 2,
    VITC__SP_CONTROL = 3,
    VITC__SP_USER_DEFINED = 4,
    VITC__SP_UNUSED = 5,
    VITC__SP_BYTE = 6
};

/* TrainerSpec.ModelType. */
enum { VITC__SP_UNIGRAM = 1, VITC__SP_BPE = 2, VITC__SP_WORD = 3, VITC__SP_CHAR = 4 };

typedef struct vitc__sp_piece {
    uint32_t off, len; /* the bytes: strs + off, NUL-terminated */
    float score;
    int type;
} vitc__sp_piece;

/* The double-array trie (darts-clone units) and the NUL-terminated
 * replacement strings of a precompiled charsmap. */
typedef struct vitc__charsmap {
    uint32_t *units;
    size_t n_units;
    char *repl;
    size_t repl_len;
} vitc__charsmap;

typedef struct vitc__sp_model {
    char *strs;
    vitc__sp_piece *pieces;
    int n;
    /* TrainerSpec (defaults as the proto declares them) */
    int model_type;
    int unk_id, bos_id, eos_id, pad_id;
    int byte_fallback, ws_suffix;
    /* NormalizerSpec */
    int add_dummy_prefix, remove_extra_ws, escape_ws;
    int has_charsmap;
    vitc__charsmap cm;
} vitc__sp_model;

/* Parse a ModelProto (buf[0..len)). what names the file in messages. */
vitc_status vitc__sp_parse(const uint8_t *buf, size_t len, const char *what, vitc__sp_model *m);
void vitc__sp_model_free(vitc__sp_model *m);

/* Copy and check a charsmap blob: uint32 trie size (little endian), the
 * trie, the replacement strings (which must end with a NUL so that every
 * in-range offset names a terminated string). */
vitc_status vitc__charsmap_init(vitc__charsmap *cm, const uint8_t *blob, size_t len,
                                const char *what);
void vitc__charsmap_free(vitc__charsmap *cm);

/* User-defined pieces are matched before the charsmap and kept as they are:
 * the longest one that is a prefix of s[0..len), its length or 0; *hit_end
 * set when the match ran into the end of s (more text could extend it). */
typedef size_t (*vitc__sp_user_match)(const void *ctx, const char *s, size_t len, int *hit_end);

typedef struct vitc__sp_normalizer {
    const vitc__charsmap *cm; /* NULL: no rewrite (identity) */
    int add_dummy_prefix, remove_extra_ws, escape_ws, ws_suffix;
    vitc__sp_user_match user;
    const void *user_ctx;
} vitc__sp_normalizer;

/* sentencepiece's Normalizer::Normalize: text[0..len) (valid UTF-8) into a
 * malloc'd *out of *out_len bytes (NUL-terminated). final 0: text is only
 * the start of the text (cut at a character boundary); then *safe is how
 * many bytes of *out are certainly the start of the whole text's output
 * (before the first rule that ran into the cut, without trailing U+2581s,
 * which the end of the text could remove); final 1: *safe = *out_len.
 * Fails on a charsmap whose trie points outside its strings, or on memory. */
vitc_status vitc__sp_normalize(const vitc__sp_normalizer *nz, const char *text, size_t len,
                               int final, char **out, size_t *out_len, size_t *safe);

/* base64 (RFC 4648, padding optional) into a malloc'd buffer. */
vitc_status vitc__base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_len);

#endif
