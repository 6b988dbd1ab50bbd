/*
 * tokenizer.c — the tokenizer router: finds a checkpoint's vocabulary
 * files, hands them to the model that reads them (bpe.c, unigram.c), and
 * frames every text the same way: the start token, the model's ids, the
 * end token kept last when the text is truncated, the pad id up to the
 * context length.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "tokenizer.h"

/* A tokenizer.json is a few MB (CLIP 2.2 MB, SigLIP 2's Gemma 34 MB); far
 * more is not a tokenizer, and jansson's tree costs ~80x the file. */
#define VITC__TOKENIZER_JSON_MAX ((int64_t)64 << 20)

int64_t vitc__utf8_invalid_at(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            if (c == 0xED) hi = 0x9F;      /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            if (c == 0xF4) hi = 0x8F;      /* past U+10FFFF */
        } else {
            return (int64_t)i;
        }
        if (i + k >= len) return (int64_t)i; /* cut short */
        if (p[i + 1] < lo || p[i + 1] > hi) return (int64_t)i;
        for (size_t j = 2; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return (int64_t)i;
        i += k + 1;
    }
    return -1;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* tokenizer.json: its model.type picks the model. */
static vitc_status load_json(vitc_tokenizer *t, const char *path) {
    FILE *f; /* a regular file only (a FIFO would block), at most the cap */
    VITC_TRY(vitc__open_regular(path, (uint64_t)VITC__TOKENIZER_JSON_MAX, &f, NULL));
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root)
        return vitc__err(VITC_ERR_FORMAT, "%s: not a tokenizer.json (%s, line %d)", path,
                         jerr.text, jerr.line);
    json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    vitc_status s;
    if (!json_is_object(model)) {
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: no \"model\" object (a tokenizer.json from tokenizers >= 0.10 has one)",
                      path);
    } else if (type && strcmp(type, "BPE") == 0) {
        t->kind = VITC__TOK_BPE;
        s = vitc__bpe_load(t, VITC__SRC_TOKENIZER_JSON, path, root);
    } else if (type && strcmp(type, "Unigram") == 0) {
        t->kind = VITC__TOK_UNIGRAM;
        s = vitc__unigram_load(t, VITC__SRC_TOKENIZER_JSON, path, root);
    } else {
        s = vitc__err(VITC_ERR_UNSUPPORTED,
                      "%s: tokenizer model \"%s\" is not supported (vitc reads CLIP's BPE and "
                      "SentencePiece Unigram)",
                      path, type ? type : "(none)");
    }
    json_decref(root);
    return s;
}

static vitc_status load_dir(vitc_tokenizer *t, const char *dir) {
    static const char *const names[] = {"tokenizer.json", "vocab.json", "spiece.model",
                                        "bpe_simple_vocab_16e6.txt.gz"};
    char *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = join(dir, names[i]);
        if (!p[i]) {
            for (int j = 0; j < i; j++) free(p[j]);
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        }
    }
    vitc_status s;
    char *merges = join(dir, "merges.txt");
    if (!merges) {
        s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    } else if (is_file(p[0])) {
        s = load_json(t, p[0]);
    } else if (is_file(p[1]) || is_file(merges)) {
        if (!is_file(p[1]) || !is_file(merges)) {
            s = vitc__err(VITC_ERR_IO, "%s: has %s but not %s (CLIP's BPE needs both)", dir,
                          is_file(p[1]) ? "vocab.json" : "merges.txt",
                          is_file(p[1]) ? "merges.txt" : "vocab.json");
        } else {
            t->kind = VITC__TOK_BPE;
            s = vitc__bpe_load(t, VITC__SRC_VOCAB_MERGES, dir, NULL);
        }
    } else if (is_file(p[2])) {
        t->kind = VITC__TOK_UNIGRAM;
        s = vitc__unigram_load(t, VITC__SRC_SPIECE, p[2], NULL);
    } else if (is_file(p[3])) {
        t->kind = VITC__TOK_BPE;
        s = vitc__bpe_load(t, VITC__SRC_OPENCLIP_GZ, p[3], NULL);
    } else {
        s = vitc__err(VITC_ERR_IO,
                      "%s: no tokenizer: expected tokenizer.json, vocab.json + merges.txt, "
                      "spiece.model or bpe_simple_vocab_16e6.txt.gz",
                      dir);
    }
    free(merges);
    for (int i = 0; i < 4; i++) free(p[i]);
    return s;
}

vitc_status vitc_tokenizer_load(const char *path, vitc_tokenizer **out) {
    if (!out) return vitc__err(VITC_ERR_INVALID_ARG, "vitc_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return vitc__err(VITC_ERR_INVALID_ARG, "vitc_tokenizer_load: path is NULL");
    struct stat st;
    if (stat(path, &st) != 0) return vitc__err(VITC_ERR_IO, "%s: %s", path, strerror(errno));
    vitc_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    t->bos = t->eos = t->pad = -1;
    vitc_status s;
    if (S_ISDIR(st.st_mode)) {
        s = load_dir(t, path);
    } else if (!S_ISREG(st.st_mode)) {
        s = vitc__err(VITC_ERR_IO, "%s: not a regular file or a directory", path);
    } else if (ends_with(path, ".json")) {
        s = load_json(t, path);
    } else if (ends_with(path, ".model")) {
        t->kind = VITC__TOK_UNIGRAM;
        s = vitc__unigram_load(t, VITC__SRC_SPIECE, path, NULL);
    } else if (ends_with(path, ".gz")) {
        t->kind = VITC__TOK_BPE;
        s = vitc__bpe_load(t, VITC__SRC_OPENCLIP_GZ, path, NULL);
    } else {
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: not a tokenizer file (tokenizer.json, spiece.model, "
                      "bpe_simple_vocab_16e6.txt.gz, or a directory with vocab.json + merges.txt)",
                      path);
    }
    if (s == VITC_OK && (t->eos < 0 || t->pad < 0 || t->context < 2 || t->vocab_size <= 0))
        s = vitc__err(VITC_ERR_FORMAT, "%s: the tokenizer has no end or pad token or context",
                      path);
    if (s != VITC_OK) {
        vitc_tokenizer_free(t);
        return s;
    }
    *out = t;
    return VITC_OK;
}

void vitc_tokenizer_free(vitc_tokenizer *t) {
    if (!t) return;
    if (t->impl) {
        if (t->kind == VITC__TOK_BPE)
            vitc__bpe_free(t->impl);
        else
            vitc__unigram_free(t->impl);
    }
    free(t);
}

vitc_status vitc_tokenizer_encode(const vitc_tokenizer *t, const char *text, int64_t len,
                                  int32_t *ids, int context, int *n) {
    if (!t || !text || !ids)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_tokenizer_encode: NULL argument");
    if (context <= 0) context = t->context;
    int head = t->bos >= 0 ? 1 : 0;
    if (context < head + 1)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_tokenizer_encode: context %d leaves no room for the special tokens",
                         context);
    size_t nbytes = len < 0 ? strlen(text) : (size_t)len;
    int64_t bad = vitc__utf8_invalid_at(text, nbytes);
    if (bad >= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "text is not valid UTF-8 (byte offset %lld)",
                         (long long)bad);
    int k = 0;
    int cap = context - head - 1;
    vitc_status s = VITC_OK;
    if (cap > 0)
        s = t->kind == VITC__TOK_BPE ? vitc__bpe_encode(t, text, nbytes, ids + head, cap, &k)
                                     : vitc__unigram_encode(t, text, nbytes, ids + head, cap, &k);
    if (s != VITC_OK) return s;
    if (head) ids[0] = t->bos;
    ids[head + k] = t->eos;
    int used = head + k + 1;
    for (int i = used; i < context; i++) ids[i] = t->pad;
    if (n) *n = used;
    return VITC_OK;
}

int vitc_tokenizer_context(const vitc_tokenizer *t) { return t ? t->context : 0; }
int vitc_tokenizer_vocab_size(const vitc_tokenizer *t) { return t ? t->vocab_size : 0; }
const char *vitc_tokenizer_kind(const vitc_tokenizer *t) {
    if (!t) return "";
    return t->kind == VITC__TOK_BPE ? "clip-bpe" : "sentencepiece-unigram";
}
