/*
 * spm.c — SentencePiece's ModelProto read straight from its wire format
 * (varints and length-delimited fields, every length checked against what
 * is left, so a hostile file is an error and never a read out of bounds),
 * the precompiled charsmap (a darts-clone double array mapping UTF-8
 * prefixes to replacement strings: nmt_nfkc's NFKC and control-character
 * rules), and the normalizer that applies it with sentencepiece's
 * whitespace rules, in sentencepiece's order, so the ids come out the same.
 */
#include <stdlib.h>
#include <string.h>

#include "spm.h"

/* ---- protobuf wire format ---------------------------------------------- */

typedef struct pb {
    const uint8_t *p, *end;
} pb;

static int pb_varint(pb *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) return 0;
        uint8_t b = *r->p++;
        if (shift < 64) x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0; /* more than 10 bytes */
}

/* One field: its number, wire type and, for length-delimited ones, the
 * bytes; for varints the value; for fixed32 the raw bits. 0: malformed. */
typedef struct pb_field {
    uint32_t num, wt;
    uint64_t v;
    const uint8_t *data;
    size_t len;
} pb_field;

static int pb_next(pb *r, pb_field *f) {
    uint64_t key;
    if (!pb_varint(r, &key)) return 0;
    f->num = (uint32_t)(key >> 3);
    f->wt = (uint32_t)(key & 7);
    if (f->num == 0 || key >> 32) return 0;
    switch (f->wt) {
    case 0:
        return pb_varint(r, &f->v);
    case 1:
        if (r->end - r->p < 8) return 0;
        r->p += 8;
        return 1;
    case 2: {
        uint64_t n;
        if (!pb_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return 0;
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    case 5: {
        if (r->end - r->p < 4) return 0;
        uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                     (uint32_t)r->p[3] << 24;
        f->v = u;
        r->p += 4;
        return 1;
    }
    default: /* groups (3, 4) are not in sentencepiece's schema */
        return 0;
    }
}

static vitc_status bad(const char *what, const char *field) {
    return vitc__err(VITC_ERR_FORMAT,
                     "%s: not a SentencePiece model (malformed %s); expected the spiece.model "
                     "of a T5 / SigLIP checkpoint",
                     what, field);
}

static vitc_status parse_piece(const uint8_t *d, size_t len, const char *what, int index,
                               vitc__sp_model *m, size_t *str_used) {
    pb r = {d, d + len};
    pb_field f;
    const uint8_t *s = NULL;
    size_t slen = 0;
    float score = 0.0f;
    int type = VITC__SP_NORMAL;
    while (r.p < r.end) {
        if (!pb_next(&r, &f)) return bad(what, "piece");
        if (f.num == 1 && f.wt == 2) {
            s = f.data;
            slen = f.len;
        } else if (f.num == 2 && f.wt == 5) {
            uint32_t u = (uint32_t)f.v;
            memcpy(&score, &u, sizeof score);
        } else if (f.num == 3 && f.wt == 0) {
            if (f.v < 1 || f.v > 6)
                return vitc__err(VITC_ERR_FORMAT, "%s: piece %d has unknown type %llu", what,
                                 index, (unsigned long long)f.v);
            type = (int)f.v;
        }
    }
    if (!s || slen == 0)
        return vitc__err(VITC_ERR_FORMAT, "%s: piece %d is empty (sentencepiece refuses it too)",
                         what, index);
    if (memchr(s, 0, slen))
        return vitc__err(VITC_ERR_FORMAT, "%s: piece %d contains a NUL byte", what, index);
    vitc__sp_piece *p = &m->pieces[index];
    p->off = (uint32_t)*str_used;
    p->len = (uint32_t)slen;
    p->score = score;
    p->type = type;
    memcpy(m->strs + *str_used, s, slen);
    m->strs[*str_used + slen] = 0;
    *str_used += slen + 1;
    return VITC_OK;
}

static vitc_status parse_trainer(const uint8_t *d, size_t len, const char *what,
                                 vitc__sp_model *m) {
    pb r = {d, d + len};
    pb_field f;
    while (r.p < r.end) {
        if (!pb_next(&r, &f)) return bad(what, "trainer_spec");
        if (f.wt != 0) continue;
        int32_t i32 = (int32_t)(uint32_t)f.v; /* int32 fields: two's complement, 64-bit wide */
        switch (f.num) {
        case 3: m->model_type = i32; break;
        case 24: m->ws_suffix = f.v != 0; break;
        case 35: m->byte_fallback = f.v != 0; break;
        case 40: m->unk_id = i32; break;
        case 41: m->bos_id = i32; break;
        case 42: m->eos_id = i32; break;
        case 43: m->pad_id = i32; break;
        default: break;
        }
    }
    return VITC_OK;
}

static vitc_status parse_normalizer(const uint8_t *d, size_t len, const char *what,
                                    vitc__sp_model *m) {
    pb r = {d, d + len};
    pb_field f;
    while (r.p < r.end) {
        if (!pb_next(&r, &f)) return bad(what, "normalizer_spec");
        if (f.num == 2 && f.wt == 2) {
            vitc__charsmap_free(&m->cm);
            m->has_charsmap = 0;
            if (f.len > 0) {
                VITC_TRY(vitc__charsmap_init(&m->cm, f.data, f.len, what));
                m->has_charsmap = 1;
            }
        } else if (f.wt == 0 && f.num == 3) {
            m->add_dummy_prefix = f.v != 0;
        } else if (f.wt == 0 && f.num == 4) {
            m->remove_extra_ws = f.v != 0;
        } else if (f.wt == 0 && f.num == 5) {
            m->escape_ws = f.v != 0;
        }
    }
    return VITC_OK;
}

vitc_status vitc__sp_parse(const uint8_t *buf, size_t len, const char *what, vitc__sp_model *m) {
    memset(m, 0, sizeof *m);
    m->model_type = VITC__SP_UNIGRAM;
    m->unk_id = 0;
    m->bos_id = 1;
    m->eos_id = 2;
    m->pad_id = -1;
    m->add_dummy_prefix = m->remove_extra_ws = m->escape_ws = 1;
    /* First pass: how many pieces and how many bytes they hold, so the
     * allocations are bounded by the file's size. */
    pb r = {buf, buf + len};
    pb_field f;
    size_t n = 0, bytes = 0;
    while (r.p < r.end) {
        if (!pb_next(&r, &f)) return bad(what, "ModelProto");
        if (f.num == 1) {
            if (f.wt != 2) return bad(what, "pieces");
            n++;
            bytes += f.len + 1;
        }
    }
    if (n == 0)
        return vitc__err(VITC_ERR_FORMAT, "%s: no pieces (not a SentencePiece model)", what);
    if (n > INT32_MAX / 2 || bytes > UINT32_MAX)
        return vitc__err(VITC_ERR_FORMAT, "%s: too many pieces (%zu)", what, n);
    m->pieces = calloc(n, sizeof *m->pieces);
    m->strs = malloc(bytes);
    if (!m->pieces || !m->strs) {
        vitc__sp_model_free(m);
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %zu pieces", what, n);
    }
    m->n = (int)n;
    r.p = buf;
    size_t used = 0;
    int idx = 0;
    vitc_status s = VITC_OK;
    while (s == VITC_OK && r.p < r.end) {
        pb_next(&r, &f); /* checked above */
        if (f.num == 1)
            s = parse_piece(f.data, f.len, what, idx++, m, &used);
        else if (f.num == 2 && f.wt == 2)
            s = parse_trainer(f.data, f.len, what, m);
        else if (f.num == 3 && f.wt == 2)
            s = parse_normalizer(f.data, f.len, what, m);
    }
    if (s != VITC_OK) vitc__sp_model_free(m);
    return s;
}

void vitc__sp_model_free(vitc__sp_model *m) {
    if (!m) return;
    free(m->strs);
    free(m->pieces);
    vitc__charsmap_free(&m->cm);
    memset(m, 0, sizeof *m);
}

/* ---- precompiled charsmap ---------------------------------------------- */

vitc_status vitc__charsmap_init(vitc__charsmap *cm, const uint8_t *blob, size_t len,
                                const char *what) {
    memset(cm, 0, sizeof *cm);
    if (len <= 4)
        return vitc__err(VITC_ERR_FORMAT, "%s: precompiled charsmap of %zu bytes is truncated",
                         what, len);
    uint32_t trie = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 |
                    (uint32_t)blob[3] << 24;
    if ((size_t)trie >= len - 4 || trie % 4 != 0 || trie == 0)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: precompiled charsmap's trie size %u does not fit its %zu bytes",
                         what, trie, len);
    size_t rlen = len - 4 - trie;
    if (blob[len - 1] != 0)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: precompiled charsmap's replacement strings are not NUL-terminated",
                         what);
    cm->units = malloc(trie);
    cm->repl = malloc(rlen);
    if (!cm->units || !cm->repl) {
        vitc__charsmap_free(cm);
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    }
    cm->n_units = trie / 4;
    for (size_t i = 0; i < cm->n_units; i++) {
        const uint8_t *q = blob + 4 + 4 * i;
        cm->units[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                       (uint32_t)q[3] << 24;
    }
    memcpy(cm->repl, blob + 4 + trie, rlen);
    cm->repl_len = rlen;
    return VITC_OK;
}

void vitc__charsmap_free(vitc__charsmap *cm) {
    if (!cm) return;
    free(cm->units);
    free(cm->repl);
    memset(cm, 0, sizeof *cm);
}

/* darts-clone's unit layout. */
static inline uint32_t du_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static inline int du_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static inline uint32_t du_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static inline uint32_t du_value(uint32_t u) { return u & ((1u << 31) - 1); }

/* The longest rule that is a prefix of s[0..len) (darts-clone's
 * commonPrefixSearch, keeping the last = longest hit): its length, or 0.
 * *hit_end: the walk reached the end of s. */
static size_t cm_longest(const vitc__charsmap *cm, const char *s, size_t len, uint32_t *value,
                         int *hit_end) {
    const uint32_t *u = cm->units;
    size_t n = cm->n_units, best = 0;
    size_t pos = du_offset(u[0]);
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        pos ^= c;
        if (pos >= n) return best;
        uint32_t unit = u[pos];
        if (du_label(unit) != c) return best;
        pos ^= du_offset(unit);
        if (pos >= n) return best;
        if (du_has_leaf(unit)) {
            best = i + 1;
            *value = du_value(u[pos]);
        }
    }
    *hit_end = 1;
    return best;
}

/* ---- the normalizer ---------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

static size_t utf8_len1(const char *s, size_t len) {
    static const unsigned char tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = tab[(uint8_t)s[0] >> 4];
    return k < len ? k : len;
}

#define SPACE_SYM "\xe2\x96\x81"

/* One step of NormalizePrefix: the replacement (*r, *rl) of the prefix
 * that is consumed (the return value). */
static vitc_status norm_prefix(const vitc__sp_normalizer *nz, const char *s, size_t len,
                               const char **r, size_t *rl, size_t *consumed, int *hit_end) {
    *hit_end = 0;
    if (nz->user) {
        size_t k = nz->user(nz->user_ctx, s, len, hit_end);
        if (k > 0) {
            *r = s;
            *rl = k;
            *consumed = k;
            return VITC_OK;
        }
    }
    uint32_t v = 0;
    size_t k = nz->cm ? cm_longest(nz->cm, s, len, &v, hit_end) : 0;
    if (k == 0) {
        /* the input was checked to be valid UTF-8 */
        *consumed = utf8_len1(s, len);
        *r = s;
        *rl = *consumed;
        return VITC_OK;
    }
    if (v >= nz->cm->repl_len)
        return vitc__err(VITC_ERR_FORMAT,
                         "precompiled charsmap: a rule points at offset %u past its %zu bytes of "
                         "strings (a corrupt tokenizer file)",
                         v, nz->cm->repl_len);
    *r = nz->cm->repl + v;
    *rl = strlen(*r); /* terminated: the strings end with a NUL (checked at load) */
    *consumed = k;
    return VITC_OK;
}

vitc_status vitc__sp_normalize(const vitc__sp_normalizer *nz, const char *text, size_t len,
                               int final, char **out, size_t *out_len, size_t *safe) {
    buf b = {0};
    *out = NULL;
    *out_len = *safe = 0;
    if (!buf_put(&b, "", 0)) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    const char *r;
    size_t rl, k;
    int hit = 0;
    vitc_status s;
    const char *space = nz->escape_ws ? SPACE_SYM : " ";
    size_t space_len = nz->escape_ws ? 3 : 1;
    if (nz->remove_extra_ws) {
        while (len > 0) {
            if ((s = norm_prefix(nz, text, len, &r, &rl, &k, &hit)) != VITC_OK) goto fail;
            if (hit && !final) goto done;
            if (!(rl == 1 && r[0] == ' ')) break;
            text += k;
            len -= k;
        }
    }
    if (len == 0) goto done;
    if (!nz->ws_suffix && nz->add_dummy_prefix && !buf_put(&b, space, space_len)) goto nomem;
    int prev_space = nz->remove_extra_ws;
    while (len > 0) {
        if ((s = norm_prefix(nz, text, len, &r, &rl, &k, &hit)) != VITC_OK) goto fail;
        if (hit && !final) break; /* more text could change this rule */
        while (prev_space && rl > 0 && r[0] == ' ') {
            r++;
            rl--;
        }
        if (rl > 0) {
            for (size_t i = 0; i < rl; i++) {
                int ok = nz->escape_ws && r[i] == ' ' ? buf_put(&b, SPACE_SYM, 3)
                                                      : buf_put(&b, r + i, 1);
                if (!ok) goto nomem;
            }
            prev_space = r[rl - 1] == ' ';
        }
        text += k;
        len -= k;
        if (!nz->remove_extra_ws) prev_space = 0;
    }
    /* Trailing spaces go at the end of the text; before it they are not
     * known to be trailing, so they are not part of the safe output. */
    size_t keep = b.n;
    if (nz->remove_extra_ws)
        while (keep >= space_len && memcmp(b.p + keep - space_len, space, space_len) == 0)
            keep -= space_len;
    if (!final) {
        *safe = keep;
        goto out;
    }
    b.n = keep;
    b.p[b.n] = 0;
    if (nz->ws_suffix && nz->add_dummy_prefix && !buf_put(&b, space, space_len)) goto nomem;
done: /* (also: nothing but spaces so far) */
    *safe = final ? b.n : 0;
out:
    *out = b.p;
    *out_len = b.n;
    return VITC_OK;
nomem:
    s = vitc__err(VITC_ERR_NOMEM, "out of memory normalizing %zu bytes of text", len);
fail:
    free(b.p);
    return s;
}

/* ---- base64 (the charsmap inside tokenizer.json) ----------------------- */

vitc_status vitc__base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_len) {
    uint8_t *o = malloc(len / 4 * 3 + 3);
    if (!o) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0, i;
    for (i = 0; i < len && s[i] != '='; i++) {
        int c = (unsigned char)s[i], v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+' || c == '-') v = 62;
        else if (c == '/' || c == '_') v = 63;
        else {
            free(o);
            return vitc__err(VITC_ERR_FORMAT, "base64: invalid character at offset %zu", i);
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (uint8_t)(acc >> bits);
        }
    }
    for (; i < len; i++)
        if (s[i] != '=') {
            free(o);
            return vitc__err(VITC_ERR_FORMAT, "base64: data after the padding at offset %zu", i);
        }
    *out = o;
    *out_len = n;
    return VITC_OK;
}
