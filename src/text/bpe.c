/*
 * bpe.c — CLIP's byte-level BPE: every UTF-8 byte of a piece is one
 * symbol (GPT-2's bytes_to_unicode alphabet), the last one carries the
 * "</w>" word end, and merges apply lowest rank first. Three sources:
 * a Hub tokenizer.json, vocab.json + merges.txt (what AutoTokenizer
 * converts to the same fast tokenizer), and open_clip's
 * bpe_simple_vocab_16e6.txt.gz (the vocabulary built as SimpleTokenizer
 * builds it). The model is read-only after load: threads share it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#ifdef VITC_HAVE_ZLIB
#include <zlib.h>
#endif

#include "clean.h"
#include "tokenizer.h"

#ifdef VITC_HAVE_TEXT

/* Files larger than this are not a CLIP vocabulary (merges.txt 525 kB,
 * the gz 1.6 MB unpacked); the bound keeps a wrong path from eating RAM. */
#define BPE_FILE_MAX ((size_t)64 << 20)
#define CLIP_MERGES (49152 - 256 - 2) /* open_clip reads lines[1 : 48895] */
#define MAX_ADDED 64

typedef struct {
    uint64_t key; /* (left id << 32 | right id) + 1; 0: empty */
    int32_t rank, id;
} merge_slot;

typedef struct {
    int32_t byte_id[256], byte_id_w[256]; /* each byte's symbol, alone and with </w> */
    merge_slot *mt;                       /* [mmask + 1] open addressing */
    size_t mmask;
    int openai;                           /* cleaning and specials of open_clip */
    int nspecial;                         /* pieces the regex keeps whole */
    int32_t special_cp[2][16];
    size_t special_len[2];
    int32_t special_id[2];                /* open_clip: their ids; HF: -1 (BPE'd) */
    int resplit;                          /* HF: ByteLevel's regex re-splits them */
    int nadded;                           /* HF added tokens, matched on the raw text */
    char *added[MAX_ADDED];
    size_t added_len[MAX_ADDED];
    int32_t added_id[MAX_ADDED];
} bpe_model;

/* ---- a string -> id table used while loading ---------------------------- */

typedef struct {
    char *arena;
    size_t used, size;
    size_t *off;      /* [cap] offsets into arena, (size_t)-1 empty */
    uint32_t *len;
    int32_t *id;
    size_t cap, n;
} vocab_t;

static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int vocab_init(vocab_t *v, size_t expect) {
    memset(v, 0, sizeof *v);
    v->cap = 64;
    while (v->cap < expect * 2) v->cap *= 2;
    v->off = malloc(v->cap * sizeof *v->off);
    v->len = malloc(v->cap * sizeof *v->len);
    v->id = malloc(v->cap * sizeof *v->id);
    v->size = expect * 12 + 64;
    v->arena = malloc(v->size);
    if (!v->off || !v->len || !v->id || !v->arena) return 0;
    memset(v->off, 0xFF, v->cap * sizeof *v->off);
    return 1;
}

static void vocab_free(vocab_t *v) {
    free(v->arena);
    free(v->off);
    free(v->len);
    free(v->id);
}

/* -1: absent */
static int32_t vocab_get(const vocab_t *v, const char *s, size_t n) {
    size_t m = v->cap - 1, i = (size_t)hash_str(s, n) & m;
    while (v->off[i] != (size_t)-1) {
        if (v->len[i] == n && memcmp(v->arena + v->off[i], s, n) == 0) return v->id[i];
        i = (i + 1) & m;
    }
    return -1;
}

/* 0: out of memory, 1: added, 2: the key was there already */
static int vocab_put(vocab_t *v, const char *s, size_t n, int32_t id) {
    if ((v->n + 1) * 2 > v->cap) {
        vocab_t w;
        if (!vocab_init(&w, v->cap)) {
            vocab_free(&w);
            return 0;
        }
        free(w.arena);
        w.arena = v->arena;
        w.used = v->used;
        w.size = v->size;
        for (size_t i = 0; i < v->cap; i++) {
            if (v->off[i] == (size_t)-1) continue;
            size_t j = (size_t)hash_str(v->arena + v->off[i], v->len[i]) & (w.cap - 1);
            while (w.off[j] != (size_t)-1) j = (j + 1) & (w.cap - 1);
            w.off[j] = v->off[i];
            w.len[j] = v->len[i];
            w.id[j] = v->id[i];
        }
        w.n = v->n;
        free(v->off);
        free(v->len);
        free(v->id);
        *v = w;
    }
    size_t m = v->cap - 1, i = (size_t)hash_str(s, n) & m;
    while (v->off[i] != (size_t)-1) {
        if (v->len[i] == n && memcmp(v->arena + v->off[i], s, n) == 0) return 2;
        i = (i + 1) & m;
    }
    if (v->used + n > v->size) {
        size_t size = v->size * 2 + n;
        char *a = realloc(v->arena, size);
        if (!a) return 0;
        v->arena = a;
        v->size = size;
    }
    memcpy(v->arena + v->used, s, n);
    v->off[i] = v->used;
    v->len[i] = (uint32_t)n;
    v->id[i] = id;
    v->used += n;
    v->n++;
    return 1;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the others for U+0100 + their order. */
static int byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

static size_t put_utf8(int c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    o[0] = (char)(0xC0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

/* ---- merges --------------------------------------------------------------- */

static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static const merge_slot *merge_find(const bpe_model *m, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)mix(key) & m->mmask;
    while (m->mt[i].key) {
        if (m->mt[i].key == key) return &m->mt[i];
        i = (i + 1) & m->mmask;
    }
    return NULL;
}

static void merge_put(bpe_model *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)mix(key) & m->mmask;
    while (m->mt[i].key && m->mt[i].key != key) i = (i + 1) & m->mmask;
    m->mt[i].key = key; /* a repeated pair: the later rank wins, as in both references */
    m->mt[i].rank = rank;
    m->mt[i].id = id;
}

/* Adds merge `rank` (a + b) of file `what` (line for the message). */
static vitc_status add_merge(bpe_model *m, const vocab_t *v, const char *a, size_t na,
                             const char *b, size_t nb, int32_t rank, const char *what,
                             long line) {
    char buf[512];
    int32_t ia = vocab_get(v, a, na), ib = vocab_get(v, b, nb);
    if (na + nb > sizeof buf)
        return vitc__err(VITC_ERR_FORMAT, "%s: merge %ld is longer than %zu bytes", what, line,
                         sizeof buf);
    memcpy(buf, a, na);
    memcpy(buf + na, b, nb);
    int32_t id = vocab_get(v, buf, na + nb);
    if (ia < 0 || ib < 0 || id < 0)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: merge %ld (\"%.*s %.*s\") names a token not in the vocabulary",
                         what, line, (int)na, a, (int)nb, b);
    merge_put(m, ia, ib, rank, id);
    return VITC_OK;
}

static vitc_status alloc_merges(bpe_model *m, size_t n) {
    size_t cap = 64;
    while (cap < n * 2) cap *= 2;
    m->mt = calloc(cap, sizeof *m->mt);
    if (!m->mt) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    m->mmask = cap - 1;
    return VITC_OK;
}

/* Each byte's symbol ids; a vocabulary without them is not byte-level. */
static vitc_status byte_ids(bpe_model *m, const vocab_t *v, const char *what) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t k = put_utf8(byte_char(b), s);
        m->byte_id[b] = vocab_get(v, s, k);
        memcpy(s + k, "</w>", 4);
        m->byte_id_w[b] = vocab_get(v, s, k + 4);
        if (m->byte_id[b] < 0 || m->byte_id_w[b] < 0)
            return vitc__err(VITC_ERR_FORMAT,
                             "%s: byte 0x%02x has no token (alone and with \"</w>\"): not CLIP's "
                             "byte-level BPE vocabulary",
                             what, b);
    }
    return VITC_OK;
}

static void set_special(bpe_model *m, int k, const char *s, int32_t id) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) m->special_cp[k][i] = (unsigned char)s[i];
    m->special_len[k] = n;
    m->special_id[k] = id;
}

/* ---- files ---------------------------------------------------------------- */

static vitc_status read_file(const char *path, char **out, size_t *n) {
    FILE *f;
    VITC_TRY(vitc__open_regular(path, 0, &f, NULL)); /* a FIFO would block fopen */
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    vitc_status s = VITC_OK;
    while (buf) {
        if (len == cap) {
            if (cap >= BPE_FILE_MAX) {
                s = vitc__err(VITC_ERR_FORMAT, "%s: more than %zu MiB, not a CLIP vocabulary",
                              path, BPE_FILE_MAX >> 20);
                break;
            }
            char *p = realloc(buf, cap * 2 + 1);
            if (!p) break;
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    if (!buf) s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    else if (s == VITC_OK && ferror(f)) s = vitc__err(VITC_ERR_IO, "%s: read error", path);
    fclose(f);
    if (s != VITC_OK) {
        free(buf);
        return s;
    }
    buf[len] = 0;
    *out = buf;
    *n = len;
    return VITC_OK;
}

#ifdef VITC_HAVE_ZLIB
static vitc_status read_gz(const char *path, char **out, size_t *n) {
    gzFile g = gzopen(path, "rb");
    if (!g) return vitc__err(VITC_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    vitc_status s = VITC_OK;
    while (buf) {
        if (len == cap) {
            if (cap >= BPE_FILE_MAX) {
                s = vitc__err(VITC_ERR_FORMAT,
                              "%s: unpacks to more than %zu MiB, not a CLIP vocabulary",
                              path, BPE_FILE_MAX >> 20);
                break;
            }
            char *p = realloc(buf, cap * 2 + 1);
            if (!p) break;
            buf = p;
            cap *= 2;
        }
        int r = gzread(g, buf + len, (unsigned)(cap - len));
        if (r < 0) {
            int e;
            s = vitc__err(VITC_ERR_FORMAT, "%s: not a readable gzip file (%s)", path,
                          gzerror(g, &e));
            break;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    if (!buf) s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    gzclose(g);
    if (s != VITC_OK) {
        free(buf);
        return s;
    }
    buf[len] = 0;
    *out = buf;
    *n = len;
    return VITC_OK;
}
#endif

/* The next line of buf (from *pos), without its '\n' (and '\r'). */
static int next_line(const char *buf, size_t n, size_t *pos, const char **line, size_t *len) {
    if (*pos >= n) return 0;
    const char *s = buf + *pos, *e = memchr(s, '\n', n - *pos);
    size_t k = e ? (size_t)(e - s) : n - *pos;
    *pos += k + (e ? 1 : 0);
    if (k && s[k - 1] == '\r') k--;
    *line = s;
    *len = k;
    return 1;
}

/* "a b" -> the two halves; 0 unless exactly two space-separated parts. */
static int split_merge(const char *s, size_t n, size_t *na, const char **b, size_t *nb) {
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s) return 0;
    *na = (size_t)(sp - s);
    *b = sp + 1;
    *nb = n - *na - 1;
    return *nb > 0 && !memchr(*b, ' ', *nb);
}

/* open_clip's SimpleTokenizer: the 256 byte characters, the same with
 * </w>, one token per merge of lines[1 : 48895], then the two specials. */
static vitc_status load_gz(vitc_tokenizer *t, bpe_model *m, const char *path) {
#ifndef VITC_HAVE_ZLIB
    (void)t; (void)m;
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: built without zlib (NO_ZLIB), cannot read a .gz",
                     path);
#else
    char *buf = NULL;
    size_t n = 0;
    vitc_status s = read_gz(path, &buf, &n);
    if (s != VITC_OK) return s;
    vocab_t v;
    if (!vocab_init(&v, 49408) || alloc_merges(m, CLIP_MERGES) != VITC_OK) {
        vocab_free(&v);
        free(buf);
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    }
    /* bs order: the printable bytes first, then the rest */
    int order[256], k = 0;
    for (int b = 0; b < 256; b++)
        if (byte_char(b) == b) order[k++] = b;
    for (int b = 0; b < 256; b++)
        if (byte_char(b) != b) order[k++] = b;
    int32_t id = 0;
    int ok = 1;
    for (int w = 0; w < 2 && ok; w++)
        for (int i = 0; i < 256 && ok; i++) {
            char str[8];
            size_t len = put_utf8(byte_char(order[i]), str);
            if (w) {
                memcpy(str + len, "</w>", 4);
                len += 4;
            }
            ok = vocab_put(&v, str, len, id++) == 1;
        }
    size_t pos = 0;
    const char *line;
    size_t len;
    next_line(buf, n, &pos, &line, &len); /* the "#version" header */
    /* first pass: the vocabulary; merges need all of it for their ids */
    size_t start = pos;
    long count = 0;
    for (; ok && count < CLIP_MERGES && next_line(buf, n, &pos, &line, &len); count++) {
        size_t na, nb;
        const char *b;
        if (!split_merge(line, len, &na, &b, &nb)) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: line %ld is not a merge \"a b\"", path, count + 2);
            break;
        }
        char cat[512];
        if (na + nb > sizeof cat) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: line %ld is too long", path, count + 2);
            break;
        }
        memcpy(cat, line, na);
        memcpy(cat + na, b, nb);
        int r = vocab_put(&v, cat, na + nb, id);
        if (!r) ok = 0;
        if (r == 1) id++;
    }
    if (s == VITC_OK && ok && count < CLIP_MERGES)
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: %ld merges, CLIP's vocabulary has %d (a truncated file?)", path, count,
                      CLIP_MERGES);
    if (s == VITC_OK && ok) {
        /* SimpleTokenizer builds a list then a dict: a repeated merge keeps
         * its later position; the exact file has none */
        if (id != 49406)
            s = vitc__err(VITC_ERR_FORMAT, "%s: %d distinct tokens, CLIP's vocabulary has 49406",
                          path, (int)id);
    }
    if (s == VITC_OK && ok) {
        ok = vocab_put(&v, "<start_of_text>", 15, 49406) == 1 &&
             vocab_put(&v, "<end_of_text>", 13, 49407) == 1;
        pos = start;
        for (long r = 0; s == VITC_OK && r < CLIP_MERGES; r++) {
            next_line(buf, n, &pos, &line, &len);
            size_t na, nb;
            const char *b;
            split_merge(line, len, &na, &b, &nb);
            s = add_merge(m, &v, line, na, b, nb, (int32_t)r, path, r + 2);
        }
    }
    if (s == VITC_OK && !ok) s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (s == VITC_OK) s = byte_ids(m, &v, path);
    if (s == VITC_OK) {
        m->openai = 1;
        m->nspecial = 2;
        set_special(m, 0, "<start_of_text>", 49406);
        set_special(m, 1, "<end_of_text>", 49407);
        t->clean = VITC__CLEAN_OPENAI;
        t->context = 77;
        t->vocab_size = 49408;
        t->bos = 49406;
        t->eos = 49407;
        t->pad = 0; /* open_clip pads with zeros */
    }
    vocab_free(&v);
    free(buf);
    return s;
#endif
}

/* vocab.json's object (or tokenizer.json's model.vocab) into v. */
static vitc_status vocab_from_json(vocab_t *v, json_t *obj, const char *what) {
    if (!json_is_object(obj))
        return vitc__err(VITC_ERR_FORMAT, "%s: the vocabulary is not a JSON object", what);
    size_t n = json_object_size(obj);
    if (n < 512)
        return vitc__err(VITC_ERR_FORMAT, "%s: %zu tokens, too few for CLIP's byte-level BPE "
                         "(a truncated vocabulary?)", what, n);
    if (n > ((size_t)1 << 24))
        return vitc__err(VITC_ERR_FORMAT, "%s: %zu tokens, more than vitc reads", what, n);
    if (!vocab_init(v, n)) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    unsigned char *seen = calloc(n, 1);
    if (!seen) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *val;
    vitc_status s = VITC_OK;
    json_object_foreach(obj, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || (size_t)id >= n) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: token \"%.40s\" has id %s%lld, outside 0..%zu",
                          what, key, json_is_integer(val) ? "" : "(not an integer) ",
                          (long long)id, n - 1);
            break;
        }
        if (seen[id]) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: id %lld is given to two tokens", what,
                          (long long)id);
            break;
        }
        seen[id] = 1;
        if (!vocab_put(v, key, strlen(key), (int32_t)id)) {
            s = vitc__err(VITC_ERR_NOMEM, "out of memory");
            break;
        }
    }
    free(seen);
    return s;
}

static vitc_status merges_from_txt(bpe_model *m, const vocab_t *v, const char *path) {
    char *buf = NULL;
    size_t n = 0;
    vitc_status s = read_file(path, &buf, &n);
    if (s != VITC_OK) return s;
    size_t pos = 0, len;
    const char *line;
    long count = 0, lineno = 0;
    while (next_line(buf, n, &pos, &line, &len)) count++;
    s = alloc_merges(m, (size_t)count);
    pos = 0;
    int32_t rank = 0;
    while (s == VITC_OK && next_line(buf, n, &pos, &line, &len)) {
        lineno++;
        if (len >= 8 && memcmp(line, "#version", 8) == 0) continue;
        if (len == 0 && pos >= n) break; /* the final newline */
        size_t na, nb;
        const char *b;
        if (!split_merge(line, len, &na, &b, &nb)) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: line %ld is not a merge of two tokens \"a b\"",
                          path, lineno);
            break;
        }
        s = add_merge(m, v, line, na, b, nb, rank++, path, lineno);
    }
    if (s == VITC_OK && rank == 0) s = vitc__err(VITC_ERR_FORMAT, "%s: no merges", path);
    free(buf);
    return s;
}

static vitc_status merges_from_json(bpe_model *m, const vocab_t *v, json_t *arr,
                                    const char *path) {
    if (!json_is_array(arr))
        return vitc__err(VITC_ERR_FORMAT, "%s: model.merges is not an array", path);
    size_t n = json_array_size(arr);
    vitc_status s = alloc_merges(m, n);
    for (size_t i = 0; s == VITC_OK && i < n; i++) {
        json_t *e = json_array_get(arr, i);
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(e)) { /* the older "a b" spelling */
            a = json_string_value(e);
            if (!split_merge(a, strlen(a), &na, &b, &nb))
                return vitc__err(VITC_ERR_FORMAT, "%s: merge %zu is not \"a b\"", path, i);
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            na = strlen(a);
            nb = strlen(b);
        } else {
            return vitc__err(VITC_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]",
                             path, i);
        }
        s = add_merge(m, v, a, na, b, nb, (int32_t)i, path, (long)i);
    }
    if (s == VITC_OK && n == 0) s = vitc__err(VITC_ERR_FORMAT, "%s: no merges", path);
    return s;
}

static const char *CLIP_SPLIT_V5 =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|"
    "'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";
#define CLIP_SPLIT_OLD (CLIP_SPLIT_V5 + 34) /* the same without the two specials */

static const char *jstr(json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

/* transformers' CLIP layout: Sequence[NFC, Replace(\s+, " "), Lowercase]
 * then Sequence[Split(CLIP's regex, Removed, invert), ByteLevel]. 1 with
 * *specials set when the regex keeps <|startoftext|>/<|endoftext|> whole,
 * *resplit when ByteLevel runs its own regex (use_regex) after it. */
static int is_clip_layout(json_t *root, int *specials, int *resplit) {
    json_t *nz = json_object_get(root, "normalizer"), *pt = json_object_get(root, "pre_tokenizer");
    json_t *ns = json_object_get(nz, "normalizers"), *ps = json_object_get(pt, "pretokenizers");
    if (!jstr(nz, "type") || strcmp(jstr(nz, "type"), "Sequence") || json_array_size(ns) != 3)
        return 0;
    const char *t0 = jstr(json_array_get(ns, 0), "type"), *t1 = jstr(json_array_get(ns, 1), "type"),
               *t2 = jstr(json_array_get(ns, 2), "type");
    const char *rx = jstr(json_object_get(json_array_get(ns, 1), "pattern"), "Regex");
    if (!t0 || !t1 || !t2 || strcmp(t0, "NFC") || strcmp(t1, "Replace") ||
        strcmp(t2, "Lowercase") ||
        !rx || strcmp(rx, "\\s+") || !jstr(json_array_get(ns, 1), "content") ||
        strcmp(jstr(json_array_get(ns, 1), "content"), " "))
        return 0;
    if (!jstr(pt, "type") || strcmp(jstr(pt, "type"), "Sequence") || json_array_size(ps) != 2)
        return 0;
    json_t *sp = json_array_get(ps, 0), *bl = json_array_get(ps, 1);
    const char *srx = jstr(json_object_get(sp, "pattern"), "Regex");
    if (!jstr(sp, "type") || strcmp(jstr(sp, "type"), "Split") || !srx ||
        !jstr(sp, "behavior") || strcmp(jstr(sp, "behavior"), "Removed") ||
        !json_is_true(json_object_get(sp, "invert")) || !jstr(bl, "type") ||
        strcmp(jstr(bl, "type"), "ByteLevel") ||
        json_is_true(json_object_get(bl, "add_prefix_space")))
        return 0;
    json_t *ur = json_object_get(bl, "use_regex"); /* absent: true */
    *resplit = !json_is_false(ur);
    if (strcmp(srx, CLIP_SPLIT_V5) == 0)
        *specials = 1;
    else if (strcmp(srx, CLIP_SPLIT_OLD) == 0)
        *specials = 0;
    else
        return 0;
    return 1;
}

/* tokenizer_config.json (else special_tokens_map.json) beside the
 * vocabulary: the pad token and model_max_length. */
static void read_config(const char *dir, char *pad, size_t padcap, int *context) {
    static const char *const names[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (int i = 0; i < 2; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        json_t *r; /* absent, not a regular file or not JSON: not read */
        if (vitc__json_load_capped(p, (uint64_t)1 << 20, 0, "a tokenizer config", &r) != VITC_OK)
            continue;
        json_t *pt = json_object_get(r, "pad_token");
        const char *s = json_is_string(pt) ? json_string_value(pt) : jstr(pt, "content");
        if (s && !pad[0]) snprintf(pad, padcap, "%s", s);
        json_t *ml = json_object_get(r, "model_max_length");
        /* transformers writes a huge float when the length is unknown */
        if (json_is_integer(ml) && json_integer_value(ml) >= 2 &&
            json_integer_value(ml) <= 4096 && !*context)
            *context = (int)json_integer_value(ml);
        json_decref(r);
    }
}

static int32_t token_id(const bpe_model *m, const vocab_t *v, const char *s) {
    for (int i = 0; i < m->nadded; i++)
        if (strcmp(m->added[i], s) == 0) return m->added_id[i];
    return vocab_get(v, s, strlen(s));
}

static vitc_status add_added(bpe_model *m, const char *content, int32_t id, const char *what) {
    if (m->nadded == MAX_ADDED)
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s: more than %d added tokens", what, MAX_ADDED);
    if (!content[0]) return vitc__err(VITC_ERR_FORMAT, "%s: an added token is empty", what);
    m->added[m->nadded] = strdup(content);
    if (!m->added[m->nadded]) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    m->added_len[m->nadded] = strlen(content);
    m->added_id[m->nadded++] = id;
    return VITC_OK;
}

static vitc_status load_hf(vitc_tokenizer *t, bpe_model *m, vitc__tok_source src,
                           const char *path, json_t *root) {
    vocab_t v;
    memset(&v, 0, sizeof v);
    char dir[4096], file[4400];
    vitc_status s = VITC_OK;
    int specials = 1, resplit = 1;
    json_t *vj = NULL;
    if (src == VITC__SRC_TOKENIZER_JSON) {
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
        snprintf(file, sizeof file, "%s", path);
        json_t *model = json_object_get(root, "model");
        const char *eow = jstr(model, "end_of_word_suffix");
        const char *csp = jstr(model, "continuing_subword_prefix");
        if (!eow || strcmp(eow, "</w>") || (csp && csp[0]) ||
            !is_clip_layout(root, &specials, &resplit))
            return vitc__err(VITC_ERR_UNSUPPORTED,
                             "%s: a BPE tokenizer.json that is not CLIP's (vitc reads CLIP's: "
                             "\"</w>\" word ends, NFC + whitespace + lowercase normalizer, CLIP's "
                             "split regex then ByteLevel; GPT-2-style and pre-4.17 CLIP files are "
                             "not supported: rebuild it from vocab.json + merges.txt)",
                             path);
        s = vocab_from_json(&v, json_object_get(model, "vocab"), path);
        if (s == VITC_OK) s = byte_ids(m, &v, path);
        if (s == VITC_OK) s = merges_from_json(m, &v, json_object_get(model, "merges"), path);
        json_t *at = json_object_get(root, "added_tokens");
        size_t i;
        json_t *e;
        json_array_foreach(at, i, e) {
            if (s != VITC_OK) break;
            const char *c = jstr(e, "content");
            json_t *idj = json_object_get(e, "id");
            if (!c || !json_is_integer(idj) || json_integer_value(idj) < 0 ||
                json_integer_value(idj) >= (json_int_t)(v.n + json_array_size(at))) {
                s = vitc__err(VITC_ERR_FORMAT, "%s: added token %zu has no content or a bad id",
                              path, i);
                break;
            }
            s = add_added(m, c, (int32_t)json_integer_value(idj), path);
        }
    } else {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/vocab.json", path);
        json_error_t jerr;
        FILE *f;
        VITC_TRY(vitc__open_regular(file, (uint64_t)BPE_FILE_MAX, &f, NULL));
        vj = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
        fclose(f);
        if (!vj)
            return vitc__err(VITC_ERR_FORMAT, "%s: not a JSON vocabulary (%s, line %d)", file,
                             jerr.text, jerr.line);
        s = vocab_from_json(&v, vj, file);
        if (s == VITC_OK) s = byte_ids(m, &v, file);
        if (s == VITC_OK) {
            snprintf(file, sizeof file, "%s/merges.txt", path);
            s = merges_from_txt(m, &v, file);
        }
        /* CLIPTokenizer's specials (bos, eos = unk = pad) */
        static const char *const sp[] = {"<|startoftext|>", "<|endoftext|>"};
        for (int k = 0; s == VITC_OK && k < 2; k++) {
            int32_t id = vocab_get(&v, sp[k], strlen(sp[k]));
            if (id < 0)
                s = vitc__err(VITC_ERR_FORMAT, "%s/vocab.json: no \"%s\" token", path, sp[k]);
            else
                s = add_added(m, sp[k], id, path);
        }
    }
    if (s == VITC_OK) {
        char pad[256] = "";
        int context = 0;
        read_config(dir, pad, sizeof pad, &context);
        t->clean = VITC__CLEAN_HF_CLIP;
        t->context = context ? context : 77;
        t->bos = token_id(m, &v, "<|startoftext|>");
        t->eos = token_id(m, &v, "<|endoftext|>");
        t->pad = pad[0] ? token_id(m, &v, pad) : t->eos;
        int32_t maxid = (int32_t)v.n - 1;
        for (int i = 0; i < m->nadded; i++)
            if (m->added_id[i] > maxid) maxid = m->added_id[i];
        t->vocab_size = maxid + 1;
        if (t->bos < 0 || t->eos < 0)
            s = vitc__err(VITC_ERR_FORMAT, "%s: no <|startoftext|> or <|endoftext|> token", path);
        else if (t->pad < 0)
            s = vitc__err(VITC_ERR_FORMAT, "%s: the pad token \"%s\" is not in the vocabulary",
                          dir, pad);
        /* The newer regex keeps a lower-cased "<|endoftext|>" whole (which
         * moves the next piece's start), then ByteLevel's GPT-2 regex
         * re-splits it into "<|" "endoftext" "|>"; it re-splits no other
         * CLIP piece. */
        m->nspecial = specials ? 2 : 0;
        m->resplit = resplit;
        set_special(m, 0, "<|startoftext|>", -1);
        set_special(m, 1, "<|endoftext|>", -1);
    }
    json_decref(vj);
    vocab_free(&v);
    return s;
}

void vitc__bpe_free(void *impl) {
    bpe_model *m = impl;
    if (!m) return;
    for (int i = 0; i < m->nadded; i++) free(m->added[i]);
    free(m->mt);
    free(m);
}

vitc_status vitc__bpe_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                           const void *json) {
    bpe_model *m = calloc(1, sizeof *m);
    if (!m) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    vitc_status s;
    if (src == VITC__SRC_OPENCLIP_GZ)
        s = load_gz(t, m, path);
    else if (src == VITC__SRC_TOKENIZER_JSON || src == VITC__SRC_VOCAB_MERGES)
        s = load_hf(t, m, src, path, (json_t *)json);
    else
        s = vitc__err(VITC_ERR_UNSUPPORTED, "%s: not a BPE vocabulary", path);
    if (s != VITC_OK) {
        vitc__bpe_free(m);
        return s;
    }
    t->impl = m;
    return VITC_OK;
}

/* ---- encoding -------------------------------------------------------------- */

typedef struct {
    int32_t rank, pos;
} heap_e;

/* The scratch of one encode call (nothing is shared between calls). */
typedef struct {
    vitc__cps raw, clean;
    char *bytes;
    int32_t *sym, *prev, *next;
    heap_e *heap;
    size_t cap;
} scratch;

static void scratch_free(scratch *w) {
    vitc__cps_free(&w->raw);
    vitc__cps_free(&w->clean);
    free(w->bytes);
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->heap);
}

static int scratch_grow(scratch *w, size_t n) {
    if (n <= w->cap) return 1;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    char *b = realloc(w->bytes, cap);
    if (b) w->bytes = b;
    int32_t *s = realloc(w->sym, cap * sizeof *s);
    if (s) w->sym = s;
    int32_t *p = realloc(w->prev, cap * sizeof *p);
    if (p) w->prev = p;
    int32_t *q = realloc(w->next, cap * sizeof *q);
    if (q) w->next = q;
    heap_e *h = realloc(w->heap, 3 * cap * sizeof *h);
    if (h) w->heap = h;
    if (!b || !s || !p || !q || !h) return 0;
    w->cap = cap;
    return 1;
}

static int heap_less(heap_e a, heap_e b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_e *h, size_t *n, heap_e e) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static heap_e heap_pop(heap_e *h, size_t *n) {
    heap_e top = h[0], e = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], e)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = e;
    return top;
}

static void push_pair(const bpe_model *m, scratch *w, size_t *hn, int32_t i) {
    int32_t j = w->next[i];
    if (i < 0 || j < 0) return;
    const merge_slot *ms = merge_find(m, w->sym[i], w->sym[j]);
    if (ms) heap_push(w->heap, hn, (heap_e){ms->rank, i});
}

/* BPE of one piece's bytes w->bytes[0..nb): lowest rank first, leftmost
 * among equals (the merge order of tokenizers' BPE; with ranks where a
 * merge's parts come before it, the same as SimpleTokenizer's
 * merge-all-occurrences loop). Appends at most cap - *k ids. */
static void bpe_piece(const bpe_model *m, scratch *w, size_t nb, int32_t *ids, int cap, int *k) {
    const unsigned char *b = (const unsigned char *)w->bytes;
    for (size_t i = 0; i < nb; i++) {
        w->sym[i] = i + 1 < nb ? m->byte_id[b[i]] : m->byte_id_w[b[i]];
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < nb ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < nb; i++) push_pair(m, w, &hn, (int32_t)i);
    while (hn) {
        heap_e e = heap_pop(w->heap, &hn);
        int32_t i = e.pos, j = w->next[i];
        if (w->sym[i] < 0 || j < 0) continue;
        const merge_slot *ms = merge_find(m, w->sym[i], w->sym[j]);
        if (!ms || ms->rank != e.rank) continue; /* stale */
        w->sym[i] = ms->id;
        w->sym[j] = -1;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = i;
        if (w->prev[i] >= 0) push_pair(m, w, &hn, w->prev[i]);
        push_pair(m, w, &hn, i);
    }
    for (int32_t i = 0; i >= 0 && *k < cap; i = w->next[i]) ids[(*k)++] = w->sym[i];
}

static vitc_status bpe_cps(const bpe_model *m, scratch *w, const int32_t *cp, size_t n,
                           int32_t *ids, int cap, int *k);

/* Cleans and splits text[0..len) and appends its ids (at most cap). A long
 * text is cleaned in chunks of about CHUNK bytes, cut where no step of the
 * cleaning looks across: before an ASCII space (HF: NFC, case and the split
 * are local, and whitespace never becomes a piece), after a '\n' (OpenAI:
 * ftfy works per line, and no entity or final sigma spans a line break).
 * Once the ids are full the rest of the text is never cleaned. */
#define CHUNK 4096
static vitc_status encode_segment(const vitc_tokenizer *t, const bpe_model *m, scratch *w,
                                  const char *text, size_t len, int32_t *ids, int cap, int *k) {
    const int32_t *sp[2] = {m->special_cp[0], m->special_cp[1]};
    int html_off = 0;
    size_t p = 0;
    while (p < len && *k < cap) {
        size_t q = len;
        if (len - p > CHUNK) {
            q = p + CHUNK;
            if (t->clean == VITC__CLEAN_OPENAI)
                while (q < len && text[q - 1] != '\n') q++;
            else
                while (q < len && !(text[q] == ' ' || (text[q] >= 9 && text[q] <= 13))) q++;
        }
        vitc_status s = vitc__utf8_decode(text + p, q - p, &w->raw);
        if (s == VITC_OK) s = vitc__clean(t->clean, w->raw.cp, w->raw.n, &w->clean, &html_off);
        if (s != VITC_OK) return s;
        p = q;
        size_t pos = 0, a, e;
        int r;
        while (*k < cap && (r = vitc__pretok_next(w->clean.cp, w->clean.n, &pos, &a, &e, sp,
                                                  m->special_len, m->nspecial, m->openai))) {
            if (r <= m->nspecial && m->special_id[r - 1] >= 0) {
                ids[(*k)++] = m->special_id[r - 1];
                continue;
            }
            if (r <= m->nspecial && m->resplit) { /* "<|" name "|>", each its own word */
                size_t cut[4] = {a, a + 2, e - 2, e};
                for (int c = 0; c < 3 && *k < cap; c++)
                    if ((s = bpe_cps(m, w, w->clean.cp + cut[c], cut[c + 1] - cut[c], ids, cap,
                                     k)))
                        return s;
                continue;
            }
            if ((s = bpe_cps(m, w, w->clean.cp + a, e - a, ids, cap, k))) return s;
        }
    }
    return VITC_OK;
}

/* BPE of the code points cp[0..n) as one word. */
static vitc_status bpe_cps(const bpe_model *m, scratch *w, const int32_t *cp, size_t n,
                           int32_t *ids, int cap, int *k) {
    if (!scratch_grow(w, n * 4 + 1)) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    size_t nb = 0;
    for (size_t q = 0; q < n; q++) {
        int32_t c = cp[q];
        unsigned char *o = (unsigned char *)w->bytes + nb;
        if (c < 0x80) {
            o[0] = (unsigned char)c;
            nb += 1;
        } else if (c < 0x800) {
            o[0] = (unsigned char)(0xC0 | (c >> 6));
            o[1] = (unsigned char)(0x80 | (c & 0x3F));
            nb += 2;
        } else if (c < 0x10000) {
            o[0] = (unsigned char)(0xE0 | (c >> 12));
            o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            o[2] = (unsigned char)(0x80 | (c & 0x3F));
            nb += 3;
        } else {
            o[0] = (unsigned char)(0xF0 | (c >> 18));
            o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            o[3] = (unsigned char)(0x80 | (c & 0x3F));
            nb += 4;
        }
    }
    bpe_piece(m, w, nb, ids, cap, k);
    return VITC_OK;
}

vitc_status vitc__bpe_encode(const vitc_tokenizer *t, const char *text, size_t len, int32_t *ids,
                             int cap, int *n) {
    const bpe_model *m = t->impl;
    scratch w;
    memset(&w, 0, sizeof w);
    int k = 0;
    vitc_status s = VITC_OK;
    size_t pos = 0;
    /* transformers matches its added tokens on the raw text first, leftmost
     * then longest; the text between them is normalized on its own */
    while (s == VITC_OK && k < cap && pos <= len) {
        size_t best = len;
        int which = -1;
        for (int i = 0; i < m->nadded; i++) {
            const char *f = NULL;
            for (size_t q = pos; q + m->added_len[i] <= len; q++) {
                const char *hit = memchr(text + q, m->added[i][0], len - q);
                if (!hit || (size_t)(hit - text) + m->added_len[i] > len) break;
                q = (size_t)(hit - text);
                if (memcmp(hit, m->added[i], m->added_len[i]) == 0) {
                    f = hit;
                    break;
                }
            }
            if (!f) continue;
            size_t at = (size_t)(f - text);
            if (at < best || (at == best && which >= 0 && m->added_len[i] > m->added_len[which])) {
                best = at;
                which = i;
            }
        }
        if (best > pos) s = encode_segment(t, m, &w, text + pos, best - pos, ids, cap, &k);
        if (which < 0) break;
        if (s == VITC_OK && k < cap) ids[k++] = m->added_id[which];
        pos = best + m->added_len[which];
    }
    scratch_free(&w);
    *n = k;
    return s;
}

#else /* !VITC_HAVE_TEXT */

vitc_status vitc__bpe_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                           const void *json) {
    (void)t; (void)src; (void)json;
    return vitc__err(VITC_ERR_UNSUPPORTED,
                     "%s: vitc was built without utf8proc (NO_TEXT); install "
                     "libutf8proc-dev and rebuild to read CLIP's tokenizer",
                     path);
}
vitc_status vitc__bpe_encode(const vitc_tokenizer *t, const char *text, size_t len, int32_t *ids,
                             int cap, int *n) {
    (void)t; (void)text; (void)len; (void)ids; (void)cap; (void)n;
    return vitc__err(VITC_ERR_UNSUPPORTED, "built without utf8proc (NO_TEXT)");
}
void vitc__bpe_free(void *impl) { (void)impl; }

#endif
