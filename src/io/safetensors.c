/*
 * safetensors.c — read and write safetensors files.
 *
 * Files are untrusted input: every header field is checked before it is
 * used, every size derived from the file is overflow-checked, and the rules
 * of the reference implementation (huggingface/safetensors, tensor.rs) are
 * enforced, so that a file vitc accepts is one the reference accepts too:
 * the header is a JSON object of at most 100,000,000 bytes, tensors cover
 * the byte buffer contiguously from 0 with no hole or overlap, names are
 * unique, __metadata__ is a string -> string map.
 *
 * Every tensor is converted to float32 into one 64-byte aligned allocation,
 * so a layer can point at its weights without another copy. A loaded file
 * therefore costs its F32 size in memory and never more than that: data is
 * read straight into place (F16/BF16 are read into the upper half of their
 * own destination and widened in place).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <jansson.h>

#include "internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* The reference implementation's MAX_HEADER_SIZE. */
#define ST_MAX_HEADER ((uint64_t)100000000)

/* ST_I64 only in a file loaded with VITC__ST_KEEP_I64 (Hub checkpoints carry
 * int64 position_ids buffers): listed with data NULL, never converted. */
typedef enum { ST_F32, ST_F16, ST_BF16, ST_I64 } st_dtype;

static const char *const st_dtype_names[] = {"F32", "F16", "BF16", "I64"};
static const size_t st_dtype_size[] = {4, 2, 2, 8};

/* The dtypes of the format that vitc does not convert: named in the error so
 * that a user knows the file is valid but unsupported. */
static const char *const st_other_dtypes[] = {
    "BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "F64", "I64", "U64", "C64",
    "F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
    "F8_E5M2FNUZ"};

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t *shape;  /* [ndim] (NULL when ndim == 0) */
    size_t numel;
    uint64_t begin, end; /* byte range in the file's data buffer */
    float *data;     /* [numel], inside vitc_safetensors.arena */
    int pending;     /* VITC__ST_LAZY: data not read yet */
} st_tensor;

struct vitc_safetensors {
    int n;
    st_tensor *t;    /* [n], sorted by data offset = the order in the file */
    struct st_name {
        const char *name;
        int index;
    } *by_name;      /* [n] sorted by name, for find */
    int n_meta;
    char **meta_key; /* [n_meta] in header order */
    char **meta_val;
    float *arena;    /* every tensor's float32 data */
    int keep_i64;    /* VITC__ST_KEEP_I64 */
    /* VITC__ST_LAZY: each tensor is read when asked for
     * (vitc__safetensors_read), so a loader can convert one tensor and
     * give its pages back before the next is read. The file is opened for
     * the reads and may be closed between them (vitc__safetensors_park):
     * a model of 4,096 shards never holds 4,096 descriptors. */
    int lazy_mode;
    FILE *lazy;       /* open while reading; NULL when parked */
    dev_t dev;        /* the file parsed, to know it again when reopened */
    ino_t ino;
    uint64_t fsize;
    uint64_t data_at; /* the data buffer's first byte in the file */
    char *path;       /* for messages while lazy */
};

/* ------------------------------------------------------------------ */
/* Conversions                                                        */
/* ------------------------------------------------------------------ */

/* IEEE half -> single, exact for every input: subnormal halves become
 * normal floats, inf stays inf, NaN keeps its sign and payload. */
static float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* Subnormal: value = man * 2^-24. Normalise the mantissa. */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float st_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Widen n 16-bit values stored at byte offset 2n of dst into n floats at
 * dst, in place. Going forward is safe: float i occupies bytes [4i, 4i+4),
 * which lie below the 16-bit value i+1 at 2n + 2i + 2 for every i < n. */
static void st_widen_in_place(float *dst, size_t n, st_dtype dt) {
    const unsigned char *src = (const unsigned char *)dst + 2 * n;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = dt == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
    }
}

/* ------------------------------------------------------------------ */
/* Freeing                                                            */
/* ------------------------------------------------------------------ */

void vitc_safetensors_free(vitc_safetensors *st) {
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        free(st->t[i].name);
        free(st->t[i].shape);
    }
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_key[i]);
        free(st->meta_val[i]);
    }
    free(st->t);
    free(st->by_name);
    free(st->meta_key);
    free(st->meta_val);
    vitc__free(st->arena);
    if (st->lazy)
        fclose(st->lazy);
    free(st->path);
    free(st);
}

/* ------------------------------------------------------------------ */
/* Header parsing                                                     */
/* ------------------------------------------------------------------ */

static char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static const char *st_json_type(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number with a fraction";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

/* A non-negative JSON integer. */
static int st_uint(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(j);
    return 1;
}

static vitc_status st_parse_tensor(st_tensor *t, int keep_i64, const char *name, const json_t *e,
                                   const char *fname) {
    if (!json_is_object(e))
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s' is %s, not an object", fname, name,
                         st_json_type(e));
    const json_t *jd = json_object_get(e, "dtype");
    const json_t *js = json_object_get(e, "shape");
    const json_t *jo = json_object_get(e, "data_offsets");
    if (!jd || !js || !jo)
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s' lacks \"%s\"", fname, name,
                         !jd ? "dtype" : !js ? "shape" : "data_offsets");
    if (json_object_size(e) != 3) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)e, k, v) {
            if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
                return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s' has an unknown field \"%s\"",
                                 fname, name, k);
        }
    }

    if (!json_is_string(jd))
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': dtype is %s, not a string", fname,
                         name, st_json_type(jd));
    const char *ds = json_string_value(jd);
    int found = 0;
    for (int d = 0; d < 3; d++)
        if (!strcmp(ds, st_dtype_names[d])) {
            t->dtype = (st_dtype)d;
            found = 1;
        }
    if (!found && keep_i64 && !strcmp(ds, "I64")) {
        t->dtype = ST_I64;
        found = 1;
    }
    if (!found) {
        for (size_t d = 0; d < sizeof st_other_dtypes / sizeof *st_other_dtypes; d++)
            if (!strcmp(ds, st_other_dtypes[d]))
                return vitc__err(VITC_ERR_UNSUPPORTED,
                                 "%s: tensor '%s' has dtype %s; vitc reads only F32, F16 and BF16",
                                 fname, name, ds);
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s' has unknown dtype \"%.40s\"", fname,
                         name, ds);
    }

    if (!json_is_array(js))
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': shape is %s, not an array", fname,
                         name, st_json_type(js));
    size_t nd = json_array_size(js);
    if (nd > VITC_SAFETENSORS_MAX_NDIM)
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': shape has %zu dimensions (at most %d)",
                         fname, name, nd, VITC_SAFETENSORS_MAX_NDIM);
    t->ndim = (int)nd;
    if (nd) {
        t->shape = malloc(nd * sizeof(int64_t));
        if (!t->shape)
            return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", fname);
    }
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        const json_t *jv = json_array_get(js, i);
        if (!st_uint(jv, &d))
            return vitc__err(VITC_ERR_FORMAT,
                             "%s: tensor '%s': shape[%zu] is %s; dimensions are non-negative integers",
                             fname, name, i,
                             json_is_integer(jv) ? "negative" : st_json_type(jv));
        t->shape[i] = (int64_t)d;
    }

    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': data_offsets is not [begin, end]",
                         fname, name);
    if (!st_uint(json_array_get(jo, 0), &t->begin) || !st_uint(json_array_get(jo, 1), &t->end))
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets must be two non-negative integers", fname,
                         name);
    if (t->end < t->begin)
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] end before they begin", fname, name, t->begin, t->end);

    char sbuf[160];
    int ok;
    size_t bytes;
    t->numel = vitc__numel(t->ndim, t->shape, &ok);
    if (!ok || !vitc__mul_size(t->numel, st_dtype_size[t->dtype], &bytes) ||
        bytes > UINT64_MAX / 2)
        return vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': %s %s is too large (overflow)", fname,
                         name, ds, vitc__shape_str(sbuf, sizeof sbuf, t->ndim, t->shape));
    if ((uint64_t)bytes != t->end - t->begin)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                         " bytes but %s %s needs %zu",
                         fname, name, t->begin, t->end, t->end - t->begin, ds,
                         vitc__shape_str(sbuf, sizeof sbuf, t->ndim, t->shape), bytes);
    t->name = st_strdup(name);
    if (!t->name)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", fname);
    return VITC_OK;
}

static int st_cmp_offset(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    /* Empty tensors share their begin with the next one; put them first so
     * the contiguity check sees begin == previous end for both. */
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    /* qsort is not stable: equal ranges (empty tensors) go by name so the
     * order is the same everywhere. */
    return strcmp(x->name, y->name);
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const struct st_name *)a)->name, ((const struct st_name *)b)->name);
}

/*
 * The header is read without building a JSON tree of all of it: jansson's
 * tree costs up to ~80x the text (3 MB of "{}" took 234 MB; a header near
 * the 100 MB limit, gigabytes). A small scanner walks the two levels a
 * safetensors header has (the root object and __metadata__'s object) and
 * hands jansson one piece at a time: a key, one tensor entry (at most
 * ST_MAX_ENTRY_ITEMS values), one metadata value. jansson still checks all
 * of the JSON inside each piece (escapes, UTF-8, numbers); the scanner checks
 * the punctuation between pieces. Peak memory is the header, what the result
 * keeps (bounded by the limits below), and one entry's tree.
 */

/* Limits of docs/limits.md: far above any real checkpoint (ViT-H has 390
 * tensors, the largest sharded LLM files a few thousand), low enough that
 * what they hold stays under ~40 MB. */
#define ST_MAX_TENSORS 262144
#define ST_MAX_META 65536
/* A tensor entry holds dtype, shape (at most VITC_SAFETENSORS_MAX_NDIM
 * dims) and data_offsets: about 70 containers and commas at most. */
#define ST_MAX_ENTRY_ITEMS 256
/* A header nests 3 deep; deeper is refused without recursion. */
#define ST_MAX_DEPTH 64

typedef struct st_scan {
    const char *h;
    size_t len, pos;
    const char *fname;
    vitc_status s; /* the error, message set, once something failed */
} st_scan;

static int st_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void st_skip_ws(st_scan *sc) {
    while (sc->pos < sc->len && st_ws(sc->h[sc->pos]))
        sc->pos++;
}

static int st_at(const st_scan *sc, char c) { return sc->pos < sc->len && sc->h[sc->pos] == c; }

static int st_syntax(st_scan *sc, const char *what) {
    sc->s = vitc__err(VITC_ERR_FORMAT, "%s: header is not valid JSON: %s (header byte %zu)",
                      sc->fname, what, sc->pos);
    return 0;
}

/* Past the string that starts at pos; jansson checks what is inside. */
static int st_skip_string(st_scan *sc) {
    size_t p = sc->pos + 1;
    while (p < sc->len && sc->h[p] != '"')
        p += sc->h[p] == '\\' ? 2 : 1;
    if (p >= sc->len) {
        sc->pos = sc->len;
        return st_syntax(sc, "a string does not end");
    }
    sc->pos = p + 1;
    return 1;
}

/* Past one value. *items counts its containers and commas, which bounds the
 * number of values in it and so the size of jansson's tree for it. */
static int st_skip_value(st_scan *sc, size_t *items) {
    *items = 0;
    if (sc->pos >= sc->len)
        return st_syntax(sc, "the header ends where a value should be");
    char c = sc->h[sc->pos];
    if (c == '"')
        return st_skip_string(sc);
    if (c != '{' && c != '[') {
        size_t start = sc->pos;
        while (sc->pos < sc->len && !st_ws(c = sc->h[sc->pos]) && c != ',' && c != '}' &&
               c != ']' && c != ':' && c != '"' && c != '{' && c != '[')
            sc->pos++;
        return sc->pos > start ? 1 : st_syntax(sc, "a value was expected");
    }
    int depth = 0;
    while (sc->pos < sc->len) {
        c = sc->h[sc->pos];
        if (c == '"') {
            if (!st_skip_string(sc))
                return 0;
            continue;
        }
        if (c == '{' || c == '[') {
            if (++depth > ST_MAX_DEPTH)
                return st_syntax(sc, "nested deeper than a safetensors header can be");
            ++*items;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                sc->pos++;
                return 1;
            }
        } else if (c == ',') {
            ++*items;
        }
        sc->pos++;
    }
    return st_syntax(sc, "the header ends inside a value");
}

/* The next member of the object being scanned: call with pos just after its
 * '{' and *first = 1. 1: key and val hold the spans; 0: the closing '}' was
 * passed, or an error (sc->s). */
static int st_next_member(st_scan *sc, int *first, size_t key[2], size_t val[2],
                          size_t *items) {
    st_skip_ws(sc);
    if (st_at(sc, '}')) {
        sc->pos++;
        return 0;
    }
    if (!*first) {
        if (!st_at(sc, ','))
            return st_syntax(sc, "',' or '}' was expected");
        sc->pos++;
        st_skip_ws(sc);
    }
    *first = 0;
    if (!st_at(sc, '"'))
        return st_syntax(sc, "a quoted key was expected");
    key[0] = sc->pos;
    if (!st_skip_string(sc))
        return 0;
    key[1] = sc->pos;
    st_skip_ws(sc);
    if (!st_at(sc, ':'))
        return st_syntax(sc, "':' was expected");
    sc->pos++;
    st_skip_ws(sc);
    val[0] = sc->pos;
    if (!st_skip_value(sc, items))
        return 0;
    val[1] = sc->pos;
    return 1;
}

size_t vitc__json_items(const char *s, size_t len) {
    size_t items = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < len && s[i] != '"'; i++)
                i += s[i] == '\\';
        } else {
            items += c == '{' || c == '[' || c == ',';
        }
    }
    return items;
}

static json_t *st_decode(st_scan *sc, const size_t span[2]) {
    json_error_t jerr;
    json_t *j = json_loadb(sc->h + span[0], span[1] - span[0],
                           JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (j)
        return j;
    if (json_error_code(&jerr) == json_error_out_of_memory)
        sc->s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory while parsing the %zu-byte header",
                          sc->fname, sc->len);
    else
        sc->s = vitc__err(VITC_ERR_FORMAT, "%s: header is not valid JSON: %s (header byte %zu)",
                          sc->fname, jerr.text, span[0] + (size_t)jerr.position);
    return NULL;
}

/* A decoded key, as a new string. */
static char *st_key(st_scan *sc, const size_t span[2]) {
    json_t *k = st_decode(sc, span);
    if (!k)
        return NULL;
    char *s = st_strdup(json_string_value(k));
    json_decref(k);
    if (!s)
        sc->s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", sc->fname);
    return s;
}

/* What a value is, for a message; containers are named without parsing. */
static const char *st_kind(st_scan *sc, const size_t span[2]) {
    char c = sc->h[span[0]];
    if (c == '{' || c == '[')
        return c == '{' ? "an object" : "an array";
    json_t *j = st_decode(sc, span);
    const char *k = j ? st_json_type(j) : NULL;
    json_decref(j);
    return k;
}

/* Grow an array of n elements of size sz to hold n + 1, doubling; the new
 * part is zeroed (free relies on NULL members). */
static int st_grow(void *pp, int n, int *cap, size_t sz) {
    if (n < *cap)
        return 1;
    int nc = *cap ? 2 * *cap : 64;
    void *p = realloc(*(void **)pp, (size_t)nc * sz);
    if (!p)
        return 0;
    memset((char *)p + (size_t)*cap * sz, 0, (size_t)(nc - *cap) * sz);
    *(void **)pp = p;
    *cap = nc;
    return 1;
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* __metadata__'s value: null or a string -> string map. */
static vitc_status st_parse_metadata(vitc_safetensors *st, st_scan *sc, const size_t span[2]) {
    const char *fname = sc->fname;
    if (sc->h[span[0]] != '{') {
        const char *k = st_kind(sc, span);
        if (!k)
            return sc->s;
        if (!strcmp(k, "null"))
            return VITC_OK;
        return vitc__err(VITC_ERR_FORMAT, "%s: __metadata__ is %s, not a string -> string map",
                         fname, k);
    }
    int cap = 0, capv = 0, first = 1;
    size_t key[2], val[2], items;
    sc->pos = span[0] + 1;
    while (st_next_member(sc, &first, key, val, &items)) {
        if (st->n_meta >= ST_MAX_META)
            return vitc__err(VITC_ERR_FORMAT, "%s: __metadata__ has more than %d entries "
                             "(vitc's limit)", fname, ST_MAX_META);
        if (!st_grow(&st->meta_key, st->n_meta, &cap, sizeof(char *)) ||
            !st_grow(&st->meta_val, st->n_meta, &capv, sizeof(char *)))
            return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for metadata", fname);
        char *k = st_key(sc, key);
        if (!k)
            return sc->s;
        st->meta_key[st->n_meta++] = k; /* counted now so that free releases it */
        if (sc->h[val[0]] != '"') {
            const char *kind = st_kind(sc, val);
            if (!kind)
                return sc->s;
            return vitc__err(VITC_ERR_FORMAT, "%s: __metadata__ value of '%s' is %s, not a "
                             "string", fname, k, kind);
        }
        json_t *v = st_decode(sc, val);
        if (!v)
            return sc->s;
        st->meta_val[st->n_meta - 1] = st_strdup(json_string_value(v));
        json_decref(v);
        if (!st->meta_val[st->n_meta - 1])
            return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for metadata", fname);
    }
    if (sc->s != VITC_OK)
        return sc->s;
    if (st->n_meta < 2)
        return VITC_OK;
    /* Duplicate keys, as jansson's JSON_REJECT_DUPLICATES would say. */
    char **sorted = malloc((size_t)st->n_meta * sizeof *sorted);
    if (!sorted)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for metadata", fname);
    memcpy(sorted, st->meta_key, (size_t)st->n_meta * sizeof *sorted);
    qsort(sorted, (size_t)st->n_meta, sizeof *sorted, st_cmp_str);
    vitc_status s = VITC_OK;
    for (int i = 1; i < st->n_meta && s == VITC_OK; i++)
        if (!strcmp(sorted[i], sorted[i - 1]))
            s = vitc__err(VITC_ERR_FORMAT, "%s: __metadata__ has a duplicate key '%s'", fname,
                          sorted[i]);
    free(sorted);
    return s;
}

/* Parse and validate the header; on success st->t describes every tensor
 * and the data buffer of buf_len bytes is exactly covered. */
static vitc_status st_parse_header(vitc_safetensors *st, const char *hdr, size_t hlen,
                                   uint64_t buf_len, const char *fname) {
    if (hlen == 0 || hdr[0] != '{')
        return vitc__err(VITC_ERR_FORMAT, "%s: the header does not start with '{' (not a "
                         "safetensors file?)", fname);
    st_scan sc = {hdr, hlen, 1, fname, VITC_OK};
    int cap = 0, first = 1, meta_seen = 0;
    size_t key[2], val[2], items;
    vitc_status s = VITC_OK;
    while (st_next_member(&sc, &first, key, val, &items)) {
        char *name = st_key(&sc, key);
        if (!name)
            return sc.s;
        if (!strcmp(name, "__metadata__")) {
            free(name);
            if (meta_seen++)
                return vitc__err(VITC_ERR_FORMAT, "%s: the header has a duplicate key "
                                 "'__metadata__'", fname);
            size_t next = sc.pos;
            VITC_TRY(st_parse_metadata(st, &sc, val));
            sc.pos = next;
            continue;
        }
        if (st->n >= ST_MAX_TENSORS)
            s = vitc__err(VITC_ERR_FORMAT, "%s: more than %d tensors (vitc's limit)", fname,
                          ST_MAX_TENSORS);
        else if (!st_grow(&st->t, st->n, &cap, sizeof(st_tensor)))
            s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %d tensors", fname, st->n + 1);
        else if (items > ST_MAX_ENTRY_ITEMS)
            s = vitc__err(VITC_ERR_FORMAT, "%s: tensor '%s': the entry holds over %d values; a "
                          "tensor has dtype, shape (at most %d dimensions) and data_offsets",
                          fname, name, ST_MAX_ENTRY_ITEMS, VITC_SAFETENSORS_MAX_NDIM);
        if (s == VITC_OK) {
            /* Counted before parsing so that free releases a half-filled entry. */
            st_tensor *t = &st->t[st->n++];
            json_t *e = st_decode(&sc, val);
            s = e ? st_parse_tensor(t, st->keep_i64, name, e, fname) : sc.s;
            json_decref(e);
        }
        free(name);
        if (s != VITC_OK)
            return s;
    }
    if (sc.s != VITC_OK)
        return sc.s;
    st_skip_ws(&sc);
    if (sc.pos != sc.len) {
        st_syntax(&sc, "something follows the header's object");
        return sc.s;
    }
    st->by_name = calloc(st->n ? (size_t)st->n : 1, sizeof *st->by_name);
    if (!st->by_name)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %d tensors", fname, st->n);
    /* Duplicate names first, as jansson's JSON_REJECT_DUPLICATES would. */
    for (int i = 0; i < st->n; i++)
        st->by_name[i].name = st->t[i].name;
    qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, st_cmp_name);
    for (int i = 1; i < st->n; i++)
        if (!strcmp(st->by_name[i].name, st->by_name[i - 1].name))
            return vitc__err(VITC_ERR_FORMAT, "%s: the header has a duplicate tensor '%s'",
                             fname, st->by_name[i].name);

    if (st->n) /* st->t is NULL without tensors, and qsort may not take NULL */
        qsort(st->t, (size_t)st->n, sizeof(st_tensor), st_cmp_offset);
    uint64_t pos = 0;
    for (int i = 0; i < st->n; i++) {
        const st_tensor *t = &st->t[i];
        if (t->begin != pos) {
            if (t->begin < pos)
                s = vitc__err(VITC_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                              "] overlap the previous tensor '%s', which ends at %" PRIu64,
                              fname, t->name, t->begin, t->end, st->t[i - 1].name, pos);
            else
                s = vitc__err(VITC_ERR_FORMAT,
                              "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                              "] leave a hole: the tensors before it end at %" PRIu64,
                              fname, t->name, t->begin, t->end, pos);
            goto done;
        }
        if (t->end > buf_len) {
            s = vitc__err(VITC_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                          "] run past the end of the %" PRIu64 "-byte data buffer (truncated file?)",
                          fname, t->name, t->begin, t->end, buf_len);
            goto done;
        }
        pos = t->end;
    }
    if (pos != buf_len) {
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: the tensors cover %" PRIu64 " bytes of the %" PRIu64
                      "-byte data buffer; the rest is not indexed",
                      fname, pos, buf_len);
        goto done;
    }
    for (int i = 0; i < st->n; i++) {
        st->by_name[i].name = st->t[i].name;
        st->by_name[i].index = i;
    }
    qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, st_cmp_name);
done:
    return s;
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

/* Where the data buffer comes from: memory, or a file positioned at its
 * first byte (tensors are read in offset order, so reads are sequential). */
typedef struct st_source {
    const unsigned char *mem;
    FILE *f;
} st_source;

static vitc_status st_read(st_source *src, uint64_t off, void *dst, size_t n, const char *fname,
                           const char *tname) {
    if (n == 0)
        return VITC_OK;
    if (src->mem) {
        memcpy(dst, src->mem + off, n);
        return VITC_OK;
    }
    if (fread(dst, 1, n, src->f) != n)
        return vitc__err(VITC_ERR_IO, "%s: tensor '%s': %s", fname, tname,
                         ferror(src->f) ? strerror(errno) : "file ended early (changed while read?)");
    return VITC_OK;
}

/* Tensor t's bytes from src into its arena slot, widened to float32. */
static vitc_status st_read_tensor(st_tensor *t, st_source *src, const char *fname) {
    if (t->dtype == ST_F32)
        return st_read(src, t->begin, t->data, t->numel * 4, fname, t->name);
    VITC_TRY(st_read(src, t->begin, (unsigned char *)t->data + 2 * t->numel, t->numel * 2, fname,
                     t->name));
    st_widen_in_place(t->data, t->numel, t->dtype);
    return VITC_OK;
}

static vitc_status st_load_data(vitc_safetensors *st, st_source *src, const char *fname) {
    size_t total = 0;
    for (int i = 0; i < st->n; i++) {
        /* Bounded by twice the file size (checked against the buffer),
         * but still checked: size_t may be narrower than the offsets. */
        if (st->t[i].dtype != ST_I64 && !vitc__add_size(total, st->t[i].numel, &total))
            return vitc__err(VITC_ERR_NOMEM, "%s: tensors too large for this machine", fname);
    }
    size_t bytes;
    if (!vitc__mul_size(total, sizeof(float), &bytes))
        return vitc__err(VITC_ERR_NOMEM, "%s: tensors too large for this machine", fname);
    st->arena = vitc__alloc(bytes);
    if (!st->arena)
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate %zu bytes for the tensors", fname,
                         bytes);
    size_t at = 0;
    for (int i = 0; i < st->n; i++) {
        st_tensor *t = &st->t[i];
        if (t->dtype == ST_I64) { /* listed, not converted: data stays NULL */
            /* The file is read in order: step over its bytes. */
            if (!src->mem && fseeko(src->f, (off_t)(t->end - t->begin), SEEK_CUR) != 0)
                return vitc__err(VITC_ERR_IO, "%s: tensor '%s': %s", fname, t->name,
                                 strerror(errno));
            continue;
        }
        t->data = st->arena + at;
        at += t->numel;
        /* Lazy: the arena's pages stay untouched (not resident) until read. */
        t->pending = st->lazy_mode;
        if (!t->pending)
            VITC_TRY(st_read_tensor(t, src, fname));
    }
    return VITC_OK;
}

static vitc_status st_finish(vitc_safetensors *st, vitc_status s, vitc_safetensors **out) {
    if (s != VITC_OK) {
        vitc_safetensors_free(st);
        return s;
    }
    *out = st;
    return VITC_OK;
}

/* A file whose header length is impossible is most often another format
 * given by mistake: a PyTorch checkpoint, an image. Naming it (and the fix)
 * beats reporting a 19-digit header length. VITC_OK when the first bytes
 * b[0..n) match nothing known. */
static vitc_status st_other_format(const unsigned char *b, size_t n, const char *name) {
    static const struct {
        const char *magic;
        size_t len;
        const char *what;
    } kinds[] = {
        {"\x89PNG\r\n\x1a\n", 8, "a PNG image, not a model"},
        {"\xff\xd8\xff", 3, "a JPEG image, not a model"},
        {"GIF87a", 6, "a GIF image, not a model"},
        {"GIF89a", 6, "a GIF image, not a model"},
        {"\x93NUMPY", 6, "a NumPy .npy array, not a safetensors model"},
        {"\x89HDF\r\n\x1a\n", 8, "an HDF5 file (Keras?), not a safetensors model"},
        {"GGUF", 4, "a GGUF file (llama.cpp), not a safetensors model"},
        {"\x1f\x8b", 2, "gzip-compressed, not a safetensors model: decompress it first"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (n >= kinds[i].len && !memcmp(b, kinds[i].magic, kinds[i].len))
            return vitc__err(VITC_ERR_FORMAT, "%s is %s", name, kinds[i].what);
    /* torch.save writes a zip since PyTorch 1.6, a bare pickle before it
     * (and with _use_new_zipfile_serialization=False): protocols 2 to 5. */
    if (n >= 4 && !memcmp(b, "PK\x03\x04", 4))
        return vitc__err(VITC_ERR_FORMAT,
                         "%s is a zip archive (a PyTorch checkpoint, .pth/.pt?), not safetensors: "
                         "convert it with `python tools/export_safetensors.py %s out.safetensors` "
                         "(tools/ of vitc's source)", name, name);
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s is a Python pickle (a PyTorch checkpoint, .pth/.pt/.bin?), not "
                         "safetensors: convert it with `python tools/export_safetensors.py %s "
                         "out.safetensors` (tools/ of vitc's source)", name, name);
    return VITC_OK;
}

vitc_status vitc_safetensors_load_memory(const void *bytes, size_t len, vitc_safetensors **out) {
    const char *fname = "<memory>";
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_load_memory: out is NULL");
    *out = NULL;
    if (!bytes && len)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_load_memory: bytes is NULL");
    if (len < 8)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: %zu bytes are too few for a safetensors file (8-byte header length "
                         "first)", fname, len);
    const unsigned char *b = bytes;
    uint64_t hlen;
    memcpy(&hlen, b, 8);
    if ((hlen > ST_MAX_HEADER || hlen > (uint64_t)len - 8) && st_other_format(b, len, fname))
        return VITC_ERR_FORMAT;
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)len - 8)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: header length %" PRIu64 " exceeds %s (%" PRIu64 " bytes)", fname,
                         hlen, hlen > ST_MAX_HEADER ? "the format's limit" : "the data after it",
                         hlen > ST_MAX_HEADER ? ST_MAX_HEADER : (uint64_t)len - 8);
    vitc_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", fname);
    vitc_status s = st_parse_header(st, (const char *)b + 8, (size_t)hlen,
                                    (uint64_t)len - 8 - hlen, fname);
    if (s == VITC_OK) {
        st_source src = {b + 8 + hlen, NULL};
        s = st_load_data(st, &src, fname);
    }
    return st_finish(st, s, out);
}

vitc_status vitc_safetensors_load(const char *path, vitc_safetensors **out) {
    return vitc__safetensors_load_flags(path, 0, out);
}

vitc_status vitc__safetensors_load_flags(const char *path, int flags, vitc_safetensors **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_load: out is NULL");
    *out = NULL;
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_load: path is NULL");
    FILE *f;
    uint64_t fsize;
    VITC_TRY(vitc__open_regular(path, 0, &f, &fsize));
    vitc_status s = VITC_OK;
    vitc_safetensors *st = NULL;
    char *hdr = NULL;
    unsigned char len8[8];
    if (fsize < 8 || fread(len8, 1, 8, f) != 8) {
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: %" PRIu64 " bytes are too few for a safetensors file (8-byte header "
                      "length first)", path, fsize);
        goto done;
    }
    uint64_t hlen;
    memcpy(&hlen, len8, 8);
    if ((hlen > ST_MAX_HEADER || hlen > fsize - 8) &&
        (s = st_other_format(len8, sizeof len8, path)) != VITC_OK)
        goto done;
    if (hlen > ST_MAX_HEADER || hlen > fsize - 8) {
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: header length %" PRIu64 " exceeds %s (%" PRIu64 " bytes)", path, hlen,
                      hlen > ST_MAX_HEADER ? "the format's limit" : "the rest of the file",
                      hlen > ST_MAX_HEADER ? ST_MAX_HEADER : fsize - 8);
        goto done;
    }
    hdr = malloc(hlen ? (size_t)hlen : 1);
    if (!hdr) {
        s = vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate the %" PRIu64 "-byte header", path,
                      hlen);
        goto done;
    }
    if (fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen) {
        s = vitc__err(VITC_ERR_IO, "%s: cannot read the header: %s", path,
                      ferror(f) ? strerror(errno) : "file ended early");
        goto done;
    }
    st = calloc(1, sizeof *st);
    if (!st) {
        s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    st->keep_i64 = (flags & VITC__ST_KEEP_I64) != 0;
    if (flags & VITC__ST_LAZY) {
        struct stat sb;
        st->lazy_mode = 1;
        st->data_at = 8 + hlen;
        st->fsize = fsize;
        if (fstat(fileno(f), &sb) == 0)
            st->dev = sb.st_dev, st->ino = sb.st_ino;
        if (!(st->path = st_strdup(path))) {
            s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
    }
    s = st_parse_header(st, hdr, (size_t)hlen, fsize - 8 - hlen, path);
    free(hdr);
    hdr = NULL;
    if (s == VITC_OK) {
        st_source src = {NULL, f};
        s = st_load_data(st, &src, path);
    }
    /* Lazy: closed now, reopened by the first read (vitc__safetensors_read). */
    s = st_finish(st, s, out);
    st = NULL;
done:
    free(hdr);
    vitc_safetensors_free(st);
    if (f)
        fclose(f);
    return s;
}

vitc_status vitc__safetensors_read(vitc_safetensors *st, int i) {
    if (!st || i < 0 || i >= st->n)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc__safetensors_read: no tensor %d", i);
    st_tensor *t = &st->t[i];
    if (!t->pending)
        return VITC_OK;
    if (!st->lazy) {
        FILE *f;
        uint64_t size;
        struct stat sb;
        VITC_TRY(vitc__open_regular(st->path, 0, &f, &size));
        if (fstat(fileno(f), &sb) != 0 || sb.st_dev != st->dev || sb.st_ino != st->ino ||
            size != st->fsize) {
            fclose(f);
            return vitc__err(VITC_ERR_IO, "%s: the file was replaced or changed size while it "
                             "was loaded", st->path);
        }
        st->lazy = f;
    }
    if (fseeko(st->lazy, (off_t)(st->data_at + t->begin), SEEK_SET) != 0)
        return vitc__err(VITC_ERR_IO, "%s: tensor '%s': %s", st->path, t->name, strerror(errno));
    st_source src = {NULL, st->lazy};
    VITC_TRY(st_read_tensor(t, &src, st->path));
    t->pending = 0;
    return VITC_OK;
}

vitc_status vitc__safetensors_read_at(vitc_safetensors *st, const float *data) {
    /* A linear scan: a model has hundreds of tensors, read once each. */
    for (int i = 0; st && i < st->n; i++)
        if (st->t[i].data == data && data)
            return vitc__safetensors_read(st, i);
    return VITC_OK; /* not this file's (a row of zeros, a transposed copy): nothing to read */
}

void vitc__safetensors_park(vitc_safetensors *st) {
    if (st && st->lazy) {
        fclose(st->lazy);
        st->lazy = NULL;
    }
}

vitc_status vitc__safetensors_read_rest(vitc_safetensors *st) {
    if (!st || !st->lazy_mode)
        return VITC_OK;
    for (int i = 0; i < st->n; i++)
        VITC_TRY(vitc__safetensors_read(st, i));
    vitc__safetensors_park(st);
    st->lazy_mode = 0;
    free(st->path);
    st->path = NULL;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Access                                                             */
/* ------------------------------------------------------------------ */

int vitc_safetensors_count(const vitc_safetensors *st) { return st ? st->n : 0; }

vitc_status vitc_safetensors_tensor(const vitc_safetensors *st, int i, const char **name,
                                    const char **dtype, int *ndim, const int64_t **shape,
                                    const float **data) {
    if (!st)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_tensor: st is NULL");
    if (i < 0 || i >= st->n)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_tensor: index %d out of [0, %d)",
                         i, st->n);
    const st_tensor *t = &st->t[i];
    if (name)
        *name = t->name;
    if (dtype)
        *dtype = st_dtype_names[t->dtype];
    if (ndim)
        *ndim = t->ndim;
    if (shape)
        *shape = t->shape;
    if (data)
        *data = t->data;
    return VITC_OK;
}

int vitc_safetensors_find(const vitc_safetensors *st, const char *name) {
    if (!st || !name)
        return -1;
    int lo = 0, hi = st->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->by_name[mid].name, name);
        if (c == 0)
            return st->by_name[mid].index;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int vitc_safetensors_metadata_count(const vitc_safetensors *st) { return st ? st->n_meta : 0; }

vitc_status vitc_safetensors_metadata(const vitc_safetensors *st, int i, const char **key,
                                      const char **value) {
    if (!st)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_metadata: st is NULL");
    if (i < 0 || i >= st->n_meta)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_safetensors_metadata: index %d out of [0, %d)", i, st->n_meta);
    if (key)
        *key = st->meta_key[i];
    if (value)
        *value = st->meta_val[i];
    return VITC_OK;
}

const char *vitc_safetensors_get_metadata(const vitc_safetensors *st, const char *key) {
    if (!st || !key)
        return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta_key[i], key))
            return st->meta_val[i];
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Writing                                                            */
/* ------------------------------------------------------------------ */

typedef struct st_wsort {
    const char *name;
    int index;
} st_wsort;

static int st_cmp_wsort(const void *a, const void *b) {
    return strcmp(((const st_wsort *)a)->name, ((const st_wsort *)b)->name);
}

/* Everything about the arguments is checked before the file is touched. */
static vitc_status st_check_save_args(const char *path, int n, const char *const *names,
                                      const int *ndims, const int64_t *const *shapes,
                                      const float *const *data, int n_meta,
                                      const char *const *meta_keys,
                                      const char *const *meta_values, size_t *numel) {
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_safetensors_save: path is NULL");
    if (n < 0 || n_meta < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: negative tensor or metadata count", path);
    if (n > 0 && (!names || !ndims || !shapes || !data))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: names, ndims, shapes or data is NULL", path);
    if (n_meta > 0 && (!meta_keys || !meta_values))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: metadata keys or values are NULL", path);
    for (int i = 0; i < n; i++) {
        if (!names[i])
            return vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor %d has no name", path, i);
        if (!strcmp(names[i], "__metadata__"))
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "%s: '__metadata__' is reserved and cannot name a tensor", path);
        if (ndims[i] < 0 || ndims[i] > VITC_SAFETENSORS_MAX_NDIM)
            return vitc__err(VITC_ERR_SHAPE, "%s: tensor '%s': %d dimensions (0 to %d)", path,
                             names[i], ndims[i], VITC_SAFETENSORS_MAX_NDIM);
        if (ndims[i] > 0 && !shapes[i])
            return vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor '%s': shape is NULL", path,
                             names[i]);
        int ok;
        size_t bytes;
        numel[i] = vitc__numel(ndims[i], shapes[i], &ok);
        if (!ok || !vitc__mul_size(numel[i], sizeof(float), &bytes) ||
            (uint64_t)bytes > (uint64_t)INT64_MAX / 2) {
            char sb[160];
            return vitc__err(VITC_ERR_SHAPE, "%s: tensor '%s': bad shape %s (negative or too large)",
                             path, names[i], vitc__shape_str(sb, sizeof sb, ndims[i], shapes[i]));
        }
        if (numel[i] > 0 && !data[i])
            return vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor '%s': data is NULL", path,
                             names[i]);
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta_keys[i] || !meta_values[i])
            return vitc__err(VITC_ERR_INVALID_ARG, "%s: metadata entry %d is NULL", path, i);
        for (int j = 0; j < i; j++)
            if (!strcmp(meta_keys[i], meta_keys[j]))
                return vitc__err(VITC_ERR_INVALID_ARG, "%s: metadata key '%s' given twice", path,
                                 meta_keys[i]);
    }
    return VITC_OK;
}

/* The JSON header, padded with spaces to a multiple of 8 like the reference
 * writer, so the data buffer starts 8-byte aligned. */
static vitc_status st_build_header(const char *path, int n, const st_wsort *order,
                                   const int *ndims, const int64_t *const *shapes,
                                   const size_t *numel, int n_meta, const char *const *meta_keys,
                                   const char *const *meta_values, char **out, size_t *out_len) {
    vitc_status s = VITC_OK;
    json_t *root = json_object();
    if (!root)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        for (int i = 0; i < n_meta; i++) {
            json_t *v = json_string(meta_values[i]);
            if (!v) {
                s = vitc__err(VITC_ERR_INVALID_ARG, "%s: metadata '%s': value is not valid UTF-8",
                              path, meta_keys[i]);
                goto done;
            }
            if (json_object_set_new(m, meta_keys[i], v)) {
                s = vitc__err(VITC_ERR_INVALID_ARG, "%s: metadata key '%s' is not valid UTF-8",
                              path, meta_keys[i]);
                goto done;
            }
        }
    }
    json_int_t off = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k].index;
        json_int_t bytes = (json_int_t)(numel[i] * sizeof(float)), end;
        /* Each size was checked alone; their sum must fit an offset too. */
        if (__builtin_add_overflow(off, bytes, &end)) {
            s = vitc__err(VITC_ERR_SHAPE, "%s: tensor '%s': the tensors add up to more bytes "
                          "than a file offset holds", path, order[k].name);
            goto done;
        }
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        int bad = !e || !sh || !of;
        for (int d = 0; !bad && d < ndims[i]; d++)
            bad |= json_array_append_new(sh, json_integer((json_int_t)shapes[i][d])) != 0;
        bad = bad || json_array_append_new(of, json_integer(off)) ||
              json_array_append_new(of, json_integer(end)) ||
              json_object_set_new(e, "dtype", json_string("F32"));
        if (bad) {
            json_decref(e);
            json_decref(sh);
            json_decref(of);
            s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        if (json_object_set_new(root, order[k].name, e)) {
            s = vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor name '%s' is not valid UTF-8", path,
                          order[k].name);
            goto done;
        }
        off = end;
    }
    char *txt = json_dumps(root, JSON_COMPACT);
    if (!txt) {
        s = vitc__err(VITC_ERR_NOMEM, "%s: cannot serialise the header", path);
        goto done;
    }
    size_t len = strlen(txt), padded = (len + 7) & ~(size_t)7;
    char *h = malloc(padded ? padded : 1);
    if (!h) {
        free(txt);
        s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(h, txt, len);
    memset(h + len, ' ', padded - len);
    free(txt);
    *out = h;
    *out_len = padded;
done:
    json_decref(root);
    return s;
}

typedef struct st_wctx {
    const char *hdr;
    size_t hlen;
    int n;
    const st_wsort *order;
    const size_t *numel;
    const float *const *data;
} st_wctx;

static vitc_status st_write(FILE *f, void *p) {
    const st_wctx *c = p;
    uint64_t hl = (uint64_t)c->hlen;
    if (fwrite(&hl, 8, 1, f) != 1 || fwrite(c->hdr, 1, c->hlen, f) != c->hlen)
        return VITC_ERR_IO; /* vitc__write_file names the stdio error */
    for (int k = 0; k < c->n; k++) {
        int i = c->order[k].index;
        if (c->numel[i] && fwrite(c->data[i], sizeof(float), c->numel[i], f) != c->numel[i])
            return VITC_ERR_IO;
    }
    return VITC_OK;
}

vitc_status vitc_safetensors_save(const char *path, int n, const char *const *names,
                                  const int *ndims, const int64_t *const *shapes,
                                  const float *const *data, int n_meta,
                                  const char *const *meta_keys,
                                  const char *const *meta_values) {
    vitc_status s;
    size_t *numel = calloc(n > 0 ? (size_t)n : 1, sizeof(size_t));
    st_wsort *order = calloc(n > 0 ? (size_t)n : 1, sizeof(st_wsort));
    char *hdr = NULL;
    size_t hlen = 0;
    if (!numel || !order) {
        s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path ? path : "(null)");
        goto done;
    }
    s = st_check_save_args(path, n, names, ndims, shapes, data, n_meta, meta_keys, meta_values,
                           numel);
    if (s != VITC_OK)
        goto done;
    /* Sorted by name like the reference writer (all F32, so no alignment
     * order is needed), which also puts duplicate names side by side. */
    for (int i = 0; i < n; i++) {
        order[i].name = names[i];
        order[i].index = i;
    }
    qsort(order, (size_t)n, sizeof *order, st_cmp_wsort);
    for (int k = 1; k < n; k++)
        if (!strcmp(order[k].name, order[k - 1].name)) {
            s = vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor name '%s' given twice", path,
                          order[k].name);
            goto done;
        }
    s = st_build_header(path, n, order, ndims, shapes, numel, n_meta, meta_keys, meta_values,
                        &hdr, &hlen);
    if (s != VITC_OK)
        goto done;

    st_wctx wc = {hdr, hlen, n, order, numel, data};
    s = vitc__write_file(path, st_write, &wc);
done:
    free(hdr);
    free(numel);
    free(order);
    return s;
}
