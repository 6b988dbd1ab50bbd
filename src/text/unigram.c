/*
 * unigram.c — SentencePiece Unigram (T5's c4_en / mc4 vocabularies, which
 * SigLIP uses) read from spiece.model or from a tokenizer.json's Unigram
 * model, segmented as sentencepiece 0.2.3's Unigram encoder segments
 * (same loop order, same float sums and re-centring, same tie-breaking:
 * the first of equal scores wins; ties between equal sums are common, so
 * the float rounding must be the same too), with its unknown-piece merging
 * and byte fallback, and
 * SigLIP's text cleaning as transformers' SiglipTokenizer runs it.
 *
 * SiglipTokenizer (transformers 5.24; there is no fast SigLIP tokenizer,
 * AutoTokenizer returns this one) encodes a text as
 *   t = "▁" + text.replace("▁", " ")
 *   t = lower(t), ASCII punctuation removed, \s+ -> " ", strip
 *   pieces = sentencepiece.encode(unk_token + t)[len(encode(unk_token)):]
 *   ids = pieces + [eos], truncated keeping eos, padded with pad (</s>)
 * and this file reproduces each step, the unk-token prefix included (the
 * prefix changes where the normalizer sees whitespace).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "spm.h"
#include "tokenizer.h"

#ifdef VITC_HAVE_TEXT
#include <utf8proc.h>

/* A spiece.model is a few MB (c4_en 0.8 MB, mc4 4.3 MB). */
#define UG_FILE_MAX ((int64_t)64 << 20)
/* sentencepiece's penalty of an unknown piece below the lowest score. */
#define UG_UNK_PENALTY 10.0f
/* |score| past which sentencepiece re-centres the Viterbi sums. */
#define UG_SCORE_RESET 100000.0f

/* A byte trie of the pieces sentencepiece matches (NORMAL, USER_DEFINED,
 * UNUSED): per node the piece id ending there (or -1) and its children's
 * edges, sorted by label, contiguous. */
typedef struct ug_trie {
    int32_t *value;  /* [nodes] */
    uint32_t *first; /* [nodes] */
    uint32_t *count; /* [nodes] */
    uint8_t *label;  /* [nodes - 1] */
    uint32_t *child; /* [nodes - 1] */
    int32_t root[256];
    uint32_t nodes;
} ug_trie;

typedef struct ug {
    vitc__sp_model sp;
    ug_trie trie;
    float min_score;
    int32_t byte_id[256];
    vitc__sp_normalizer nz;
    /* SigLIP: lower case? the unk-token text prepended, how many tokens it
     * makes (dropped) */
    int lower;
    char *prefix;
    size_t prefix_len;
    int skip;
} ug;

static void trie_free(ug_trie *t) {
    free(t->value);
    free(t->first);
    free(t->count);
    free(t->label);
    free(t->child);
    memset(t, 0, sizeof *t);
}

static inline int32_t trie_step(const ug_trie *t, int32_t node, uint8_t c) {
    if (node == 0) return t->root[c];
    uint32_t lo = t->first[node], hi = lo + t->count[node];
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (t->label[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->first[node] + t->count[node] && t->label[lo] == c ? (int32_t)t->child[lo] : -1;
}

typedef struct ug_key {
    const char *s;
    int id;
} ug_key;

static int cmp_key(const void *a, const void *b) {
    return strcmp(((const ug_key *)a)->s, ((const ug_key *)b)->s);
}

static int in_trie(int type) {
    return type == VITC__SP_NORMAL || type == VITC__SP_USER_DEFINED || type == VITC__SP_UNUSED;
}

/* Insertion in sorted order: a key's path reuses a node's last child or
 * appends a new one, so labels arrive sorted; then the sibling lists are
 * laid out contiguously. Nodes <= the pieces' bytes + 1. */
static vitc_status trie_build(ug_trie *t, const vitc__sp_model *m, const char *what) {
    memset(t, 0, sizeof *t);
    int n = 0;
    size_t bytes = 1;
    for (int i = 0; i < m->n; i++)
        if (in_trie(m->pieces[i].type)) {
            n++;
            bytes += m->pieces[i].len;
        }
    ug_key *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int32_t *fc = malloc(bytes * sizeof *fc), *ns = malloc(bytes * sizeof *ns),
            *lc = malloc(bytes * sizeof *lc);
    uint8_t *lab = malloc(bytes);
    t->value = malloc(bytes * sizeof *t->value);
    t->first = malloc(bytes * sizeof *t->first);
    t->count = calloc(bytes, sizeof *t->count);
    t->label = malloc(bytes);
    t->child = malloc(bytes * sizeof *t->child);
    vitc_status s = VITC_OK;
    if (!order || !fc || !ns || !lc || !lab || !t->value || !t->first || !t->count || !t->label ||
        !t->child) {
        s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory for the vocabulary", what);
        goto out;
    }
    n = 0;
    for (int i = 0; i < m->n; i++)
        if (in_trie(m->pieces[i].type)) {
            order[n].s = m->strs + m->pieces[i].off;
            order[n++].id = i;
        }
    qsort(order, (size_t)n, sizeof *order, cmp_key);
    uint32_t nodes = 1;
    fc[0] = ns[0] = lc[0] = -1;
    t->value[0] = -1;
    for (int k = 0; k < n; k++) {
        const vitc__sp_piece *p = &m->pieces[order[k].id];
        const uint8_t *key = (const uint8_t *)m->strs + p->off;
        int32_t node = 0;
        for (uint32_t d = 0; d < p->len; d++) {
            int32_t ch = lc[node];
            if (ch >= 0 && lab[ch] == key[d]) {
                node = ch;
                continue;
            }
            int32_t nw = (int32_t)nodes++;
            lab[nw] = key[d];
            fc[nw] = ns[nw] = lc[nw] = -1;
            t->value[nw] = -1;
            if (ch < 0)
                fc[node] = nw;
            else
                ns[ch] = nw;
            lc[node] = nw;
            node = nw;
        }
        if (t->value[node] >= 0) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: piece \"%s\" is defined twice (ids %d and %d)",
                          what, m->strs + p->off, t->value[node], order[k].id);
            goto out;
        }
        t->value[node] = order[k].id;
    }
    uint32_t e = 0;
    for (uint32_t i = 0; i < nodes; i++) {
        t->first[i] = e;
        for (int32_t ch = fc[i]; ch >= 0; ch = ns[ch]) {
            t->label[e] = lab[ch];
            t->child[e] = (uint32_t)ch;
            e++;
        }
        t->count[i] = e - t->first[i];
    }
    /* shared prefixes leave most of the upper bound unused */
    void *q;
    if ((q = realloc(t->value, nodes * sizeof *t->value))) t->value = q;
    if ((q = realloc(t->first, nodes * sizeof *t->first))) t->first = q;
    if ((q = realloc(t->count, nodes * sizeof *t->count))) t->count = q;
    if (e > 0 && (q = realloc(t->label, e))) t->label = q;
    if (e > 0 && (q = realloc(t->child, e * sizeof *t->child))) t->child = q;
    for (int c = 0; c < 256; c++) t->root[c] = -1;
    for (uint32_t j = 0; j < t->count[0]; j++) t->root[t->label[j]] = (int32_t)t->child[j];
    t->nodes = nodes;
out:
    free(order);
    free(fc);
    free(ns);
    free(lc);
    free(lab);
    if (s != VITC_OK) trie_free(t);
    return s;
}

/* The longest user-defined piece at s (the normalizer keeps them intact). */
static size_t user_match(const void *ctx, const char *s, size_t len, int *hit_end) {
    const ug *u = ctx;
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < len; i++) {
        node = trie_step(&u->trie, node, (uint8_t)s[i]);
        if (node < 0) return best;
        int32_t id = u->trie.value[node];
        if (id >= 0 && u->sp.pieces[id].type == VITC__SP_USER_DEFINED) best = i + 1;
    }
    *hit_end = 1;
    return best;
}

/* ---- segmentation ------------------------------------------------------- */

typedef struct ug_node {
    int32_t id;
    float score;
    int32_t start; /* -1: not reached */
} ug_node;

/* The tokens of the best path's pieces before byte e (backtraced),
 * unknown runs merged into one, or spelled as bytes with byte fallback, as
 * sentencepiece's processor does. pid, pend: scratch [e + 1]; ids [e + 1]. */
static int collect(const ug *u, const ug_node *best, const char *norm, int32_t e, int32_t *pid,
                   int32_t *pend, int32_t *ids) {
    int np = 0;
    for (; e > 0; e = best[e].start) {
        pid[np] = best[e].id;
        pend[np] = e;
        np++;
    }
    int nt = 0, prev_unk = 0;
    for (int k = np - 1; k >= 0; k--) {
        int32_t id = pid[k];
        int is_unk = id == u->sp.unk_id;
        if (is_unk && u->sp.byte_fallback) {
            for (int32_t b = best[pend[k]].start; b < pend[k]; b++)
                ids[nt++] = u->byte_id[(uint8_t)norm[b]];
        } else if (!(is_unk && prev_unk)) {
            ids[nt++] = id;
        }
        prev_unk = is_unk;
    }
    return nt;
}

/* Viterbi over norm[0..n) (sentencepiece's EncodeOptimized), stopping at
 * the first position no piece crosses once the pieces before it give at
 * least need tokens: every later choice starts from there, so those tokens
 * are the whole text's. final 0: norm is only the start of the normalized
 * text, and a piece that runs into its end could be longer; no cut after
 * it counts, and without a cut *out is NULL (call again with more text).
 * Tokens into a malloc'd *out. */
static vitc_status segment(const ug *u, const char *norm, int32_t n, int need, int final,
                           int32_t **out, int *nout) {
    ug_node *best = malloc(((size_t)n + 1) * sizeof *best);
    int32_t *pid = malloc(((size_t)n + 1) * sizeof *pid);
    int32_t *pend = malloc(((size_t)n + 1) * sizeof *pend);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!best || !pid || !pend || !ids) {
        free(best);
        free(pid);
        free(pend);
        free(ids);
        return vitc__err(VITC_ERR_NOMEM, "out of memory segmenting %d bytes", n);
    }
    for (int32_t i = 0; i <= n; i++) {
        best[i].id = -1;
        best[i].score = 0.0f;
        best[i].start = -1;
    }
    const float unk_score = u->min_score - UG_UNK_PENALTY;
    int32_t end = n, reach = 0, next_check = 256;
    int32_t at = 0, cut = 0, open_end = 0;
    for (;;) {
        if (!open_end && reach <= at && (at >= next_check || (at == n && !final))) {
            /* a cut: count the tokens before it */
            int32_t e = at, np = 0;
            while (e > 0) {
                np++;
                e = best[e].start;
            }
            if (np >= need) {
                if (collect(u, best, norm, at, pid, pend, ids) >= need) {
                    end = at;
                    cut = 1;
                    break;
                }
            }
            next_check = at * 2;
        }
        if (at >= n) break;
        float till = best[at].score;
        if (till < -UG_SCORE_RESET || till > UG_SCORE_RESET) {
            /* sentencepiece re-centres long sums (float keeps ~7 digits) on
             * the nodes reached so far; the rounding of later sums, and so
             * their ties, follow from it */
            for (int32_t i = at; i <= reach; i++)
                if (i == at || best[i].start != -1) best[i].score -= till;
            till = 0.0f;
        }
        int32_t mblen;
        {
            static const unsigned char tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
            mblen = tab[(uint8_t)norm[at] >> 4];
            if (mblen > n - at) mblen = n - at;
        }
        int has_single = 0;
        int32_t node = 0;
        for (int32_t kp = at;;) {
            if (kp >= n) {
                open_end = 1;
                break;
            }
            node = trie_step(&u->trie, node, (uint8_t)norm[kp]);
            kp++;
            if (node < 0) break;
            int32_t id = u->trie.value[node];
            if (id < 0) continue;
            const vitc__sp_piece *p = &u->sp.pieces[id];
            if (p->type == VITC__SP_UNUSED) continue;
            ug_node *tn = &best[kp];
            int32_t length = kp - at;
            /* user-defined pieces score 0.1 per byte past the first */
            float score = p->type == VITC__SP_USER_DEFINED ? 0.1f * (float)(length - 1) : p->score;
            float cand = score + till;
            if (tn->start == -1 || cand > tn->score) {
                tn->score = cand;
                tn->start = at;
                tn->id = id;
            }
            if (kp > reach) reach = kp;
            if (!has_single && length == mblen) has_single = 1;
        }
        if (!has_single) {
            ug_node *tn = &best[at + mblen];
            float cand = unk_score + till;
            if (tn->start == -1 || cand > tn->score) {
                tn->score = cand;
                tn->start = at;
                tn->id = u->sp.unk_id;
            }
            if (at + mblen > reach) reach = at + mblen;
        }
        at += mblen;
    }
    if (!final && !cut) {
        free(best);
        free(pid);
        free(pend);
        free(ids);
        *out = NULL;
        *nout = 0;
        return VITC_OK;
    }
    int nt = collect(u, best, norm, end, pid, pend, ids);
    free(best);
    free(pid);
    free(pend);
    *out = ids;
    *nout = nt;
    return VITC_OK;
}

/* ---- SigLIP's cleaning (Python's str.lower, string.punctuation, \s) ---- */

/* str.isspace(): bidirectional WS / B / S or category Zs. */
static int py_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

static int ascii_punct(int32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

static int cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}

/* Case_Ignorable: Mn Me Cf Lm Sk, or Word_Break MidLetter / MidNumLet /
 * Single_Quote. */
static int case_ignorable(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    if (k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
        k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK)
        return 1;
    switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0xB7: case 0x387: case 0x55F: case 0x5F4:
    case 0x2018: case 0x2019: case 0x2024: case 0x2027: case 0xFE13: case 0xFE52:
    case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
        return 1;
    default:
        return 0;
    }
}

static int32_t next_cp(const char *text, size_t len, size_t *i) {
    int32_t c;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)text + *i, (utf8proc_ssize_t)(len - *i), &c);
    if (k <= 0) { /* checked by the router; defensive */
        c = 0xFFFD;
        k = 1;
    }
    *i += (size_t)k;
    return c == 0x2581 ? 0x20 : c; /* SiglipTokenizer: text.replace("▁", " ") */
}

/* prefix + canonicalize("▁" + text.replace("▁", " ")) of text[0..lim)
 * (lim a character boundary; the whole text is len bytes: a final sigma
 * looks past lim) into a malloc'd buffer: the start of what the whole
 * text gives. Lower case grows a character by at most 8 bytes (U+0130:
 * two code points). */
static vitc_status siglip_clean(const ug *u, const char *text, size_t len, size_t lim,
                                char **out, size_t *out_len) {
    char *o = malloc(u->prefix_len + 4 + 8 * lim + 1);
    if (!o) return vitc__err(VITC_ERR_NOMEM, "out of memory cleaning %zu bytes of text", lim);
    memcpy(o, u->prefix, u->prefix_len);
    size_t n = u->prefix_len;
    n += (size_t)utf8proc_encode_char(0x2581, (utf8proc_uint8_t *)o + n);
    /* the "▁" put in front: neither cased nor case-ignorable */
    int prev_cased = 0, pending_space = 0;
    for (size_t i = 0; i < lim;) {
        int32_t c = next_cp(text, lim, &i);
        int32_t lc = c;
        if (u->lower) {
            if (c == 0x130) {
                lc = -1;
            } else if (c == 0x3A3) {
                /* Final_Sigma, as CPython decides it */
                int fin = prev_cased;
                if (fin) {
                    size_t j = i;
                    int32_t d = 0;
                    int found = 0;
                    while (j < len) {
                        d = next_cp(text, len, &j);
                        if (!case_ignorable(d)) {
                            found = 1;
                            break;
                        }
                    }
                    fin = !found || !cased(d);
                }
                lc = fin ? 0x3C2 : 0x3C3;
            } else {
                lc = utf8proc_tolower(c);
            }
        }
        if (!case_ignorable(c)) prev_cased = cased(c);
        if (ascii_punct(c)) continue;
        if (py_space(c)) {
            pending_space = 1;
            continue;
        }
        if (pending_space) {
            o[n++] = ' ';
            pending_space = 0;
        }
        if (lc == -1) {
            o[n++] = 'i';
            n += (size_t)utf8proc_encode_char(0x307, (utf8proc_uint8_t *)o + n);
        } else {
            n += (size_t)utf8proc_encode_char(lc, (utf8proc_uint8_t *)o + n);
        }
    }
    o[n] = 0;
    *out = o;
    *out_len = n;
    return VITC_OK;
}

/* ---- loading ------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len) {
    FILE *f; /* a regular file only: a FIFO would block fopen */
    if (vitc__open_regular(path, 0, &f, NULL) != VITC_OK) return NULL;
    char *p = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size >= 0 && (int64_t)st.st_size <= UG_FILE_MAX) {
        p = malloc((size_t)st.st_size + 1);
        if (p && fread(p, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            free(p);
            p = NULL;
        }
        if (p) {
            p[st.st_size] = 0;
            *len = (size_t)st.st_size;
        }
    }
    fclose(f);
    return p;
}

/* name in path's directory (malloc'd), or NULL. */
static char *sibling(const char *path, const char *name) {
    const char *slash = strrchr(path, '/');
    size_t d = slash ? (size_t)(slash - path) + 1 : 0;
    size_t b = strlen(name);
    char *p = malloc(d + b + 1);
    if (!p) return NULL;
    memcpy(p, path, d);
    memcpy(p + d, name, b + 1);
    return p;
}

static json_t *load_sibling(const char *path, const char *name) {
    char *p = sibling(path, name);
    if (!p) return NULL;
    json_t *j; /* absent, not a regular file, over 8 MiB or not JSON: none */
    if (vitc__json_load_capped(p, (uint64_t)8 << 20, 0, "a tokenizer config", &j) != VITC_OK)
        j = NULL;
    free(p);
    return j;
}

/* A special token in a config: "</s>" or {"content": "</s>", ...}. */
static const char *token_str(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int piece_id(const vitc__sp_model *m, const char *s) {
    if (!s) return -1;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->strs + m->pieces[i].off, s) == 0) return i;
    return -1;
}

/* tokenizer.json's Unigram model into the same form a spiece.model has. */
static vitc_status from_json(vitc__sp_model *m, json_t *root, const char *path) {
    memset(m, 0, sizeof *m);
    m->model_type = VITC__SP_UNIGRAM;
    m->bos_id = m->eos_id = m->pad_id = -1;
    m->remove_extra_ws = m->escape_ws = 1;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *unk = json_object_get(model, "unk_id");
    size_t n = json_array_size(vocab);
    if (!json_is_array(vocab) || n == 0 || n > INT32_MAX / 2)
        return vitc__err(VITC_ERR_FORMAT, "%s: the Unigram model has no \"vocab\" array", path);
    if (!json_is_integer(unk) || json_integer_value(unk) < 0 ||
        json_integer_value(unk) >= (json_int_t)n)
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "%s: the Unigram model has no valid \"unk_id\" (vitc needs one, as "
                         "sentencepiece does)",
                         path);
    m->unk_id = (int)json_integer_value(unk);
    m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(vocab, i);
        const char *s = json_string_value(json_array_get(e, 0));
        if (!json_is_array(e) || json_array_size(e) != 2 || !s || !*s ||
            !json_is_number(json_array_get(e, 1)))
            return vitc__err(VITC_ERR_FORMAT,
                             "%s: vocab entry %zu is not [\"piece\", score] with a non-empty piece",
                             path, i);
        bytes += strlen(s) + 1;
    }
    m->pieces = calloc(n, sizeof *m->pieces);
    m->strs = malloc(bytes);
    if (!m->pieces || !m->strs) {
        vitc__sp_model_free(m);
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    }
    m->n = (int)n;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(vocab, i);
        const char *s = json_string_value(json_array_get(e, 0));
        size_t l = strlen(s);
        memcpy(m->strs + off, s, l + 1);
        m->pieces[i].off = (uint32_t)off;
        m->pieces[i].len = (uint32_t)l;
        m->pieces[i].score = (float)json_number_value(json_array_get(e, 1));
        unsigned b;
        char tail;
        m->pieces[i].type = m->byte_fallback && l == 6 && sscanf(s, "<0x%2X%c", &b, &tail) == 2 &&
                                    tail == '>'
                                ? VITC__SP_BYTE
                                : VITC__SP_NORMAL;
        off += l + 1;
    }
    m->pieces[m->unk_id].type = VITC__SP_UNKNOWN;
    /* added tokens: special ones are sentencepiece's control pieces (never
     * matched in text), the others user-defined pieces */
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (json_int_t)n || !content)
            continue;
        int k = (int)json_integer_value(id);
        if (strcmp(content, m->strs + m->pieces[k].off) != 0 || k == m->unk_id) continue;
        m->pieces[k].type =
            json_is_true(json_object_get(a, "special")) ? VITC__SP_CONTROL : VITC__SP_USER_DEFINED;
    }
    /* The normalizer: the Precompiled charsmap, alone or first in a
     * Sequence with the whitespace rules sentencepiece applies itself. */
    json_t *nz = json_object_get(root, "normalizer");
    json_t *pre = NULL;
    if (json_is_object(nz)) {
        const char *type = json_string_value(json_object_get(nz, "type"));
        json_t *list = json_object_get(nz, "normalizers");
        if (type && strcmp(type, "Precompiled") == 0) {
            pre = nz;
        } else if (type && strcmp(type, "Sequence") == 0 && json_is_array(list)) {
            for (size_t i = 0; i < json_array_size(list); i++) {
                json_t *x = json_array_get(list, i);
                const char *t = json_string_value(json_object_get(x, "type"));
                if (t && strcmp(t, "Precompiled") == 0 && !pre) {
                    pre = x;
                } else if (!(t && (strcmp(t, "Strip") == 0 || strcmp(t, "Replace") == 0))) {
                    vitc__sp_model_free(m);
                    return vitc__err(VITC_ERR_UNSUPPORTED,
                                     "%s: normalizer \"%s\" is not supported (vitc reads the "
                                     "Precompiled charsmap of a converted SentencePiece model)",
                                     path, t ? t : "(none)");
                }
            }
        } else {
            vitc__sp_model_free(m);
            return vitc__err(VITC_ERR_UNSUPPORTED,
                             "%s: normalizer \"%s\" is not supported (vitc reads the Precompiled "
                             "charsmap of a converted SentencePiece model)",
                             path, type ? type : "(none)");
        }
    }
    if (pre) {
        const char *b64 = json_string_value(json_object_get(pre, "precompiled_charsmap"));
        if (b64 && *b64) {
            uint8_t *blob;
            size_t blen;
            vitc_status s = vitc__base64_decode(b64, strlen(b64), &blob, &blen);
            if (s == VITC_OK) {
                s = vitc__charsmap_init(&m->cm, blob, blen, path);
                free(blob);
            }
            if (s != VITC_OK) {
                vitc__sp_model_free(m);
                return s;
            }
            m->has_charsmap = 1;
        }
    }
    /* The pre-tokenizer: Metaspace, whose prepend scheme is the dummy prefix. */
    json_t *pt = json_object_get(root, "pre_tokenizer");
    if (json_is_object(pt)) {
        const char *type = json_string_value(json_object_get(pt, "type"));
        if (type && strcmp(type, "Sequence") == 0 &&
            json_array_size(json_object_get(pt, "pretokenizers")) == 1) {
            pt = json_array_get(json_object_get(pt, "pretokenizers"), 0);
            type = json_string_value(json_object_get(pt, "type"));
        }
        if (!type || strcmp(type, "Metaspace") != 0) {
            vitc__sp_model_free(m);
            return vitc__err(VITC_ERR_UNSUPPORTED,
                             "%s: pre_tokenizer \"%s\" is not supported with a Unigram model "
                             "(vitc reads SentencePiece conversions: Metaspace)",
                             path, type ? type : "(none)");
        }
        const char *scheme = json_string_value(json_object_get(pt, "prepend_scheme"));
        json_t *aps = json_object_get(pt, "add_prefix_space");
        m->add_dummy_prefix = scheme ? strcmp(scheme, "never") != 0 : !json_is_false(aps);
    }
    return VITC_OK;
}

static vitc_status finish(vitc_tokenizer *t, ug *u, const char *path, int json_src) {
    vitc__sp_model *m = &u->sp;
    if (m->model_type != VITC__SP_UNIGRAM)
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "%s: a SentencePiece %s model; vitc reads Unigram models only (SigLIP "
                         "v1's T5 vocabularies), not SigLIP 2's Gemma BPE",
                         path, m->model_type == VITC__SP_BPE ? "BPE" : "word/char");
    int unk = -1;
    for (int i = 0; i < m->n; i++)
        if (m->pieces[i].type == VITC__SP_UNKNOWN) {
            if (unk >= 0)
                return vitc__err(VITC_ERR_FORMAT, "%s: two unknown pieces (%d and %d)", path,
                                 unk, i);
            unk = i;
        }
    if (unk < 0)
        return vitc__err(VITC_ERR_FORMAT, "%s: no unknown piece (sentencepiece requires one)",
                         path);
    m->unk_id = unk;
    for (int b = 0; b < 256; b++) u->byte_id[b] = -1;
    if (m->byte_fallback) {
        for (int i = 0; i < m->n; i++) {
            unsigned b;
            char tail;
            if (m->pieces[i].type == VITC__SP_BYTE &&
                sscanf(m->strs + m->pieces[i].off, "<0x%2X%c", &b, &tail) == 2 && tail == '>')
                u->byte_id[b & 255] = i;
        }
        for (int b = 0; b < 256; b++)
            if (u->byte_id[b] < 0)
                return vitc__err(VITC_ERR_FORMAT,
                                 "%s: byte fallback is on but piece <0x%02X> is missing", path,
                                 b);
    }
    u->min_score = 3.402823466e+38f;
    for (int i = 0; i < m->n; i++)
        if (m->pieces[i].type == VITC__SP_NORMAL) {
            if (m->pieces[i].score < u->min_score) u->min_score = m->pieces[i].score;
        }
    VITC_TRY(trie_build(&u->trie, m, path));
    int has_user = 0;
    for (int i = 0; i < m->n; i++) has_user |= m->pieces[i].type == VITC__SP_USER_DEFINED;

    /* The checkpoint's configuration: SiglipTokenizer's cleaning and
     * special tokens, the text tower's positions. */
    json_t *tc = load_sibling(path, "tokenizer_config.json");
    json_t *sm = load_sibling(path, "special_tokens_map.json");
    json_t *cfg = load_sibling(path, "config.json");
    const char *cls = json_string_value(json_object_get(tc, "tokenizer_class"));
    int siglip = cls ? strcmp(cls, "SiglipTokenizer") == 0 : !json_src;
    json_t *dl = json_object_get(tc, "do_lower_case");
    u->lower = siglip && !json_is_false(dl);
    int legacy = !json_is_false(json_object_get(tc, "legacy"));
    const char *eos = token_str(json_object_get(tc, "eos_token"));
    if (!eos) eos = token_str(json_object_get(sm, "eos_token"));
    const char *pad = token_str(json_object_get(tc, "pad_token"));
    if (!pad) pad = token_str(json_object_get(sm, "pad_token"));
    const char *unk_tok = token_str(json_object_get(tc, "unk_token"));
    if (!unk_tok) unk_tok = token_str(json_object_get(sm, "unk_token"));
    if (!unk_tok) unk_tok = m->strs + m->pieces[unk].off;
    t->eos = piece_id(m, eos ? eos : "</s>");
    if (t->eos < 0) t->eos = m->eos_id >= 0 && m->eos_id < m->n ? m->eos_id : -1;
    t->pad = piece_id(m, pad ? pad : (siglip ? "</s>" : "<pad>"));
    if (t->pad < 0) t->pad = m->pad_id >= 0 && m->pad_id < m->n ? m->pad_id : t->eos;
    t->bos = -1;
    int ctx = 0;
    json_t *txt = json_object_get(cfg, "text_config");
    json_t *mpe = json_object_get(txt, "max_position_embeddings");
    json_t *mml = json_object_get(tc, "model_max_length");
    if (json_is_integer(mpe) && json_integer_value(mpe) >= 2 && json_integer_value(mpe) <= 65536)
        ctx = (int)json_integer_value(mpe);
    else if (json_is_integer(mml) && json_integer_value(mml) >= 2 &&
             json_integer_value(mml) <= 65536)
        ctx = (int)json_integer_value(mml);
    else
        ctx = 64;
    t->context = ctx;
    t->vocab_size = m->n;
    t->clean = siglip ? VITC__CLEAN_SIGLIP : VITC__CLEAN_NONE;
    vitc_status s = VITC_OK;
    u->nz.cm = m->has_charsmap ? &m->cm : NULL;
    u->nz.add_dummy_prefix = m->add_dummy_prefix;
    u->nz.remove_extra_ws = m->remove_extra_ws;
    u->nz.escape_ws = m->escape_ws;
    u->nz.ws_suffix = m->ws_suffix;
    u->nz.user = has_user ? user_match : NULL;
    u->nz.user_ctx = u;
    if (siglip) {
        /* transformers' non-legacy mode turns the dummy prefix off in the
         * model itself */
        if (!legacy) u->nz.add_dummy_prefix = 0;
        size_t pl = strlen(unk_tok);
        u->prefix = malloc(pl + 1);
        if (!u->prefix) {
            s = vitc__err(VITC_ERR_NOMEM, "out of memory");
        } else {
            memcpy(u->prefix, unk_tok, pl + 1);
            u->prefix_len = pl;
            char *norm = NULL;
            size_t nl = 0;
            size_t safe;
            s = vitc__sp_normalize(&u->nz, unk_tok, pl, 1, &norm, &nl, &safe);
            int32_t *ids = NULL;
            int nt = 0;
            if (s == VITC_OK && nl > (size_t)INT32_MAX / 8)
                s = vitc__err(VITC_ERR_FORMAT, "%s: unk token too long", path);
            if (s == VITC_OK) s = segment(u, norm, (int32_t)nl, INT32_MAX, 1, &ids, &nt);
            u->skip = nt;
            free(ids);
            free(norm);
        }
    }
    json_decref(tc);
    json_decref(sm);
    json_decref(cfg);
    return s;
}

vitc_status vitc__unigram_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                               const void *json) {
    /* transformers' SiglipTokenizer reads spiece.model even when a
     * tokenizer.json lies beside it (there is no fast SigLIP tokenizer), so
     * vitc reads what it reads. */
    char *spiece = NULL;
    if (src == VITC__SRC_TOKENIZER_JSON) {
        json_t *tc = load_sibling(path, "tokenizer_config.json");
        const char *cls = json_string_value(json_object_get(tc, "tokenizer_class"));
        struct stat st;
        if (cls && strcmp(cls, "SiglipTokenizer") == 0 && (spiece = sibling(path, "spiece.model")) &&
            stat(spiece, &st) == 0 && S_ISREG(st.st_mode)) {
            src = VITC__SRC_SPIECE;
            path = spiece;
        }
        json_decref(tc);
    }
    ug *u = calloc(1, sizeof *u);
    if (!u) {
        free(spiece);
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    }
    vitc_status s;
    if (src == VITC__SRC_SPIECE) {
        size_t len = 0;
        struct stat st;
        char *data = NULL;
        if (stat(path, &st) == 0 && (int64_t)st.st_size > UG_FILE_MAX) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: %lld bytes, more than a SentencePiece model has",
                          path, (long long)st.st_size);
        } else if (!(data = read_all(path, &len))) {
            s = vitc__err(VITC_ERR_IO, "%s: cannot read it", path);
        } else {
            s = vitc__sp_parse((const uint8_t *)data, len, path, &u->sp);
        }
        free(data);
    } else if (src == VITC__SRC_TOKENIZER_JSON) {
        s = from_json(&u->sp, (json_t *)json, path);
    } else {
        s = vitc__err(VITC_ERR_INVALID_ARG, "%s: not a Unigram tokenizer source", path);
    }
    if (s == VITC_OK) s = finish(t, u, path, src == VITC__SRC_TOKENIZER_JSON);
    free(spiece);
    if (s != VITC_OK) {
        vitc__unigram_free(u);
        return s;
    }
    t->impl = u;
    return VITC_OK;
}

/* Texts are cleaned, normalized and segmented from a first piece of
 * UG_FIRST bytes, doubled until the ids needed are known to be the whole
 * text's: a megabyte costs about what its first few kilobytes cost. */
#define UG_FIRST ((size_t)4096)

vitc_status vitc__unigram_encode(const vitc_tokenizer *t, const char *text, size_t len,
                                 int32_t *ids, int cap, int *n) {
    const ug *u = t->impl;
    *n = 0;
    int siglip = t->clean == VITC__CLEAN_SIGLIP;
    int skip = siglip ? u->skip : 0;
    int32_t *tok = NULL;
    int nt = 0;
    for (size_t lim = UG_FIRST;; lim *= 2) {
        int final = lim >= len;
        if (final) {
            lim = len;
        } else {
            while (lim > 0 && ((uint8_t)text[lim] & 0xC0) == 0x80) lim--;
        }
        char *clean = NULL, *norm = NULL;
        size_t cl = 0, nl = 0, safe = 0;
        const char *in = text;
        size_t in_len = lim;
        vitc_status s = VITC_OK;
        if (siglip) {
            s = siglip_clean(u, text, len, lim, &clean, &cl);
            in = clean;
            in_len = cl;
        }
        if (s == VITC_OK) s = vitc__sp_normalize(&u->nz, in, in_len, final, &norm, &nl, &safe);
        free(clean);
        if (s == VITC_OK && safe > (size_t)INT32_MAX / 8)
            s = vitc__err(VITC_ERR_INVALID_ARG, "text of %zu bytes is too long to tokenize", len);
        if (s == VITC_OK) s = segment(u, norm, (int32_t)safe, skip + cap + 1, final, &tok, &nt);
        free(norm);
        if (s != VITC_OK) return s;
        if (tok || final) break;
    }
    /* transformers: tokens[k:] if len(tokens) >= k else tokens */
    int from = nt >= skip ? skip : 0;
    int k = nt - from < cap ? nt - from : cap;
    if (k > 0) memcpy(ids, tok + from, (size_t)k * sizeof *ids);
    free(tok);
    *n = k;
    return VITC_OK;
}

void vitc__unigram_free(void *impl) {
    ug *u = impl;
    if (!u) return;
    trie_free(&u->trie);
    vitc__sp_model_free(&u->sp);
    free(u->prefix);
    free(u);
}

#else /* !VITC_HAVE_TEXT */

vitc_status vitc__unigram_load(vitc_tokenizer *t, vitc__tok_source src, const char *path,
                               const void *json) {
    (void)t;
    (void)src;
    (void)json;
    return vitc__err(VITC_ERR_UNSUPPORTED,
                     "%s: this libvitc was built without text support (install utf8proc, "
                     "libutf8proc-dev, and rebuild)",
                     path);
}
vitc_status vitc__unigram_encode(const vitc_tokenizer *t, const char *text, size_t len,
                                 int32_t *ids, int cap, int *n) {
    (void)t;
    (void)text;
    (void)len;
    (void)ids;
    (void)cap;
    (void)n;
    return vitc__err(VITC_ERR_UNSUPPORTED, "this libvitc was built without text support");
}
void vitc__unigram_free(void *impl) { (void)impl; }

#endif
