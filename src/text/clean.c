/*
 * clean.c — the text cleaning of CLIP's two tokenizer families and CLIP's
 * pre-tokenizing regex, on code points.
 *
 * transformers' fast CLIP tokenizer (tokenizer.json, and vocab.json +
 * merges.txt, which AutoTokenizer converts to it) normalizes with NFC, a
 * Replace of \s+ by one space and a per-character Lowercase (Rust's
 * char::to_lowercase: no final-sigma rule). OpenAI's and open_clip's
 * SimpleTokenizer runs ftfy.fix_text, html.unescape twice, a Python
 * split/join on whitespace and str.lower (final sigma included). Both split
 * with the same regex, which is a plain left-to-right scan over character
 * classes; it is written out here (one Unicode table, utf8proc's, for NFC,
 * case and the classes, and no per-call regex state to share between
 * threads).
 *
 * Not reproduced (docs/tokenizers.md): ftfy's mojibake repair
 * (fix_encoding: a heuristic over encodings), and characters assigned
 * after Unicode 15 (utf8proc 2.8's tables) where the references' tables
 * are newer.
 */
#include <stdlib.h>
#include <string.h>

#include "clean.h"

void vitc__cps_free(vitc__cps *b) {
    free(b->cp);
    b->cp = NULL;
    b->n = b->cap = 0;
}

#ifdef VITC_HAVE_TEXT

#include <utf8proc.h>

#include "html_entities.h"

/* ftfy.fix_text's own bounds: segments of at most this many characters,
 * and we stop its repeat-until-stable loop after this many passes (each
 * pass undoes one level of nested escapes such as &amp;amp;...; a deeper
 * nesting is left partly escaped rather than taking quadratic time). */
#define FTFY_MAX_SEGMENT 1000000
#define FTFY_MAX_PASSES 64

static int reserve(vitc__cps *b, size_t extra) {
    if (b->n + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    int32_t *p = realloc(b->cp, cap * sizeof *p);
    if (!p) return 0;
    b->cp = p;
    b->cap = cap;
    return 1;
}

static int push(vitc__cps *b, int32_t c) {
    if (b->n == b->cap && !reserve(b, 1)) return 0;
    b->cp[b->n++] = c;
    return 1;
}

static int push_utf8(vitc__cps *b, const char *s) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(s);
    while (len > 0) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p, len, &c);
        if (k <= 0 || !push(b, c)) return 0;
        p += k;
        len -= k;
    }
    return 1;
}

static void swap(vitc__cps *a, vitc__cps *b) {
    vitc__cps t = *a;
    *a = *b;
    *b = t;
}

vitc_status vitc__utf8_decode(const char *s, size_t len, vitc__cps *out) {
    out->n = 0;
    if (!reserve(out, len + 1)) return vitc__err(VITC_ERR_NOMEM, "out of memory");
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            out->cp[out->n++] = (int32_t)c;
            i++;
            continue;
        }
        int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        int32_t v = (int32_t)(c & (0x3F >> k));
        for (int j = 1; j <= k && i + (size_t)j < len; j++) v = (v << 6) | (p[i + j] & 0x3F);
        out->cp[out->n++] = v;
        i += (size_t)k + 1;
    }
    return VITC_OK;
}

static size_t utf8_put(int32_t c, char *o) {
    return (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)o);
}

/* Unicode White_Space: what \s is to both regex engines (the `regex`
 * module and Oniguruma). */
static int is_ws(int32_t c) {
    if (c < 0x80) return (c >= 9 && c <= 13) || c == 32;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's str.isspace (str.split's separators): White_Space plus the
 * information separators U+001C..U+001F. */
static int is_py_space(int32_t c) { return is_ws(c) || (c >= 0x1C && c <= 0x1F); }

static int is_letter(int32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int is_number(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

/* NFC of in into out (utf8proc works on UTF-8). Below U+0300 nothing
 * composes or decomposes, the common case. */
static int nfc(const vitc__cps *in, vitc__cps *out) {
    out->n = 0;
    size_t i;
    for (i = 0; i < in->n && in->cp[i] < 0x300; i++) {}
    if (i == in->n) {
        if (!reserve(out, in->n)) return 0;
        if (in->n) memcpy(out->cp, in->cp, in->n * sizeof *in->cp);
        out->n = in->n;
        return 1;
    }
    char *u = malloc(in->n * 4 + 1);
    if (!u) return 0;
    size_t m = 0;
    for (i = 0; i < in->n; i++) m += utf8_put(in->cp[i], u + m);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)u, (utf8proc_ssize_t)m, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    free(u);
    if (r < 0) return 0;
    vitc_status s = vitc__utf8_decode((const char *)dst, (size_t)r, out);
    free(dst);
    return s == VITC_OK;
}

/* Rust's char::to_lowercase (and Python's, but for the final sigma): the
 * simple mapping, but U+0130 which lowers to two characters. */
static int lower_char(vitc__cps *out, int32_t c) {
    if (c < 0x80) return push(out, c >= 'A' && c <= 'Z' ? c + 32 : c);
    if (c == 0x130) return push(out, 'i') && push(out, 0x307);
    return push(out, utf8proc_tolower(c));
}

/* Unicode's Cased: Lu, Ll, Lt, anything with a case mapping, and the
 * Other_Lowercase / Other_Uppercase characters that have none (modifier
 * letters such as ª º ʰ, squared letters). */
static int is_cased(int32_t c) {
    static const int32_t other[][2] = {
        {0xaa, 0xaa},       {0xba, 0xba},       {0x2b0, 0x2b8},     {0x2c0, 0x2c1},
        {0x2e0, 0x2e4},     {0x37a, 0x37a},     {0x1d2c, 0x1d6a},   {0x1d78, 0x1d78},
        {0x1d9b, 0x1dbf},   {0x2071, 0x2071},   {0x207f, 0x207f},   {0x2090, 0x209c},
        {0x2c7c, 0x2c7d},   {0xa69c, 0xa69d},   {0xa770, 0xa770},   {0xa7f8, 0xa7f9},
        {0xab5c, 0xab5f},   {0x10780, 0x10780}, {0x10783, 0x10785}, {0x10787, 0x107b0},
        {0x107b2, 0x107ba}, {0x1f130, 0x1f149}, {0x1f150, 0x1f169}, {0x1f170, 0x1f189}};
    utf8proc_category_t k = utf8proc_category(c);
    if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
        utf8proc_tolower(c) != c || utf8proc_toupper(c) != c)
        return 1;
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (c >= other[i][0] && c <= other[i][1]) return 1;
    return 0;
}

static int is_case_ignorable(int32_t c) {
    switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0x5E: case 0x60: case 0xA8: case 0xAD: case 0xAF:
    case 0xB4: case 0xB7: case 0xB8: case 0x387: case 0x55F: case 0x5F4: case 0x2018:
    case 0x2019: case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07:
    case 0xFF0E: case 0xFF1A:
        return 1;
    default:
        break;
    }
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME ||
           k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK;
}

/* Python's str.lower: capital sigma lowers to the final form when a cased
 * letter precedes it and none follows (case-ignorable ones skipped). */
static int final_sigma(const int32_t *cp, size_t n, size_t i) {
    size_t j = i;
    while (j > 0 && is_case_ignorable(cp[j - 1])) j--;
    if (j == 0 || !is_cased(cp[j - 1])) return 0;
    for (j = i + 1; j < n && is_case_ignorable(cp[j]); j++) {}
    return j == n || !is_cased(cp[j]);
}

/* ---- html ---------------------------------------------------------------- */

static int is_alnum_ascii(int32_t c) {
    return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
}
static int hexval(int32_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
    return -1;
}

static const char *entity_find(const struct vitc__entity *tab, size_t n, const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(tab[mid].name, name);
        if (c == 0) return tab[mid].value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
#define HTML5_N (sizeof vitc__html5 / sizeof vitc__html5[0])

/* html.unescape's numeric reference (num > 0x10FFFF saturated there). */
static int push_charref(vitc__cps *out, uint32_t num) {
    for (size_t i = 0; i < sizeof vitc__invalid_charrefs / sizeof vitc__invalid_charrefs[0]; i++)
        if (vitc__invalid_charrefs[i].num == num)
            return push_utf8(out, vitc__invalid_charrefs[i].value);
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return push(out, 0xFFFD);
    for (size_t i = 0; i < sizeof vitc__invalid_codepoints / sizeof vitc__invalid_codepoints[0];
         i++)
        if (num >= vitc__invalid_codepoints[i][0] && num <= vitc__invalid_codepoints[i][1])
            return 1;
    return push(out, (int32_t)num);
}

/* Parses digits (base 10 or 16) of cp[a..b); all must be digits. */
static int parse_num(const int32_t *cp, size_t a, size_t b, int base, uint32_t *num) {
    uint32_t v = 0;
    if (a >= b) return 0;
    for (size_t i = a; i < b; i++) {
        int d = base == 16 ? hexval(cp[i]) : (cp[i] >= '0' && cp[i] <= '9' ? cp[i] - '0' : -1);
        if (d < 0) return 0;
        v = v > 0x10FFFF ? v : v * (uint32_t)base + (uint32_t)d;
    }
    *num = v;
    return 1;
}

/* ftfy's unescape_html: &#?[0-9A-Za-z]{1,24}; replaced when it is an HTML5
 * name ending in ';' (or an all-caps one ftfy adds), or a numeric reference
 * that html.unescape decodes whole into something without ';'. */
static int ftfy_unescape(const vitc__cps *in, vitc__cps *out) {
    const int32_t *cp = in->cp;
    size_t n = in->n, i = 0;
    out->n = 0;
    while (i < n) {
        if (cp[i] != '&') {
            if (!push(out, cp[i++])) return 0;
            continue;
        }
        size_t j = i + 1;
        int hash = j < n && cp[j] == '#';
        if (hash) j++;
        size_t k = j;
        while (k < n && is_alnum_ascii(cp[k])) k++;
        if (k == j || k - j > 24 || k >= n || cp[k] != ';') {
            if (!push(out, cp[i++])) return 0;
            continue;
        }
        size_t mark = out->n;
        int done = 0;
        if (!hash) {
            char name[32];
            size_t m = 0;
            for (size_t q = j; q <= k; q++) name[m++] = (char)cp[q];
            name[m] = 0;
            const char *v = entity_find(vitc__html5, HTML5_N, name);
            if (!v) v = entity_find(vitc__ftfy_caps, VITC__FTFY_CAPS_N, name);
            if (v) {
                if (!push_utf8(out, v)) return 0;
                done = 1;
            }
        } else {
            uint32_t num;
            int ok = (cp[j] == 'x' || cp[j] == 'X') ? parse_num(cp, j + 1, k, 16, &num)
                                                    : parse_num(cp, j, k, 10, &num);
            if (ok) {
                if (!push_charref(out, num)) return 0;
                done = 1;
                for (size_t q = mark; q < out->n; q++)
                    if (out->cp[q] == ';') done = 0;
                if (!done) out->n = mark;
            }
        }
        if (!done) {
            if (!reserve(out, k + 1 - i)) return 0;
            for (size_t q = i; q <= k; q++) out->cp[out->n++] = cp[q];
        }
        i = k + 1;
    }
    return 1;
}

/* Python's html.unescape:
 * &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?) */
static int py_unescape(const vitc__cps *in, vitc__cps *out) {
    const int32_t *cp = in->cp;
    size_t n = in->n, i = 0;
    out->n = 0;
    while (i < n) {
        if (cp[i] != '&' || i + 1 >= n) {
            if (!push(out, cp[i++])) return 0;
            continue;
        }
        size_t j = i + 1;
        if (cp[j] == '#') {
            int base = 10;
            size_t a = j + 1;
            if (a < n && (cp[a] == 'x' || cp[a] == 'X')) {
                base = 16;
                a++;
            }
            size_t b = a;
            while (b < n && (base == 16 ? hexval(cp[b]) >= 0 : (cp[b] >= '0' && cp[b] <= '9')))
                b++;
            if (b == a && base == 16) { /* "&#x" without digits: try decimal (none) */
                b = a = j + 1;
            }
            if (b == a) {
                if (!push(out, cp[i++])) return 0;
                continue;
            }
            uint32_t num;
            parse_num(cp, a, b, base, &num);
            if (!push_charref(out, num)) return 0;
            i = b < n && cp[b] == ';' ? b + 1 : b;
            continue;
        }
        size_t b = j;
        while (b < n && b - j < 32) {
            int32_t c = cp[b];
            if (c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' ||
                c == '#' || c == ';')
                break;
            b++;
        }
        if (b == j) {
            if (!push(out, cp[i++])) return 0;
            continue;
        }
        size_t end = b < n && cp[b] == ';' ? b + 1 : b; /* the match is [i, end) */
        /* s = cp[j..end): the whole name, then its longest prefix of >= 2 */
        char name[40];
        size_t len = end - j, m = 0;
        int ascii = 1;
        for (size_t q = j; q < end; q++) {
            if (cp[q] >= 0x80) ascii = 0;
            name[m++] = (char)cp[q];
        }
        const char *v = NULL;
        size_t x = 0;
        if (ascii) {
            name[len] = 0;
            v = entity_find(vitc__html5, HTML5_N, name);
            x = len;
        }
        if (!v) {
            for (x = len - 1; x >= 2; x--) {
                int ok = 1;
                for (size_t q = 0; q < x; q++)
                    if (cp[j + q] >= 0x80) ok = 0;
                if (!ok) continue;
                char save = name[x];
                name[x] = 0;
                v = entity_find(vitc__html5, HTML5_N, name);
                name[x] = save;
                if (v) break;
            }
        }
        if (v) {
            if (!push_utf8(out, v)) return 0;
            for (size_t q = j + x; q < end; q++)
                if (!push(out, cp[q])) return 0;
        } else {
            for (size_t q = i; q < end; q++)
                if (!push(out, cp[q])) return 0;
        }
        i = end;
    }
    return 1;
}

/* ---- ftfy ----------------------------------------------------------------- */

/* Windows-1252 for 0x80..0x9F, ftfy's "sloppy" variant: the five bytes it
 * leaves undefined decode to themselves. */
static const uint16_t cp1252[32] = {
    0x20AC, 0x81,   0x201A, 0x192,  0x201E, 0x2026, 0x2020, 0x2021, 0x2C6,  0x2030, 0x160,
    0x2039, 0x152,  0x8D,   0x17D,  0x8F,   0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x2DC,  0x2122, 0x161,  0x203A, 0x153,  0x9D,   0x17E,  0x178};

static const char *ligature(int32_t c) {
    switch (c) {
    case 0x132: return "IJ";
    case 0x133: return "ij";
    case 0x149: return "\xca\xbcn";
    case 0x1F1: return "DZ";
    case 0x1F2: return "Dz";
    case 0x1F3: return "dz";
    case 0x1C4: return "D\xc5\xbd";
    case 0x1C5: return "D\xc5\xbe";
    case 0x1C6: return "d\xc5\xbe";
    case 0x1C7: return "LJ";
    case 0x1C8: return "Lj";
    case 0x1C9: return "lj";
    case 0x1CA: return "NJ";
    case 0x1CB: return "Nj";
    case 0x1CC: return "nj";
    case 0xFB00: return "ff";
    case 0xFB01: return "fi";
    case 0xFB02: return "fl";
    case 0xFB03: return "ffi";
    case 0xFB04: return "ffl";
    case 0xFB05: return "\xc5\xbft";
    case 0xFB06: return "st";
    default: return NULL;
    }
}

/* fix_character_width: U+3000 -> space, U+FF01..U+FFEF -> their NFKC. */
static int push_width(vitc__cps *out, int32_t c) {
    if (c == 0x3000) return push(out, ' ');
    utf8proc_uint8_t u[8], *dst = NULL;
    utf8proc_ssize_t m = utf8proc_encode_char(c, u);
    utf8proc_ssize_t r =
        utf8proc_map(u, m, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (r < 0) return 0;
    int ok = 1;
    utf8proc_ssize_t p = 0;
    while (ok && p < r) {
        utf8proc_int32_t v;
        utf8proc_ssize_t k = utf8proc_iterate(dst + p, r - p, &v);
        if (k <= 0) break;
        ok = push(out, v);
        p += k;
    }
    free(dst);
    return ok;
}

static int is_ftfy_control(int32_t c) {
    return (c >= 0 && c <= 8) || c == 0xB || (c >= 0xE && c <= 0x1F) || c == 0x7F ||
           (c >= 0x206A && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

/* One pass of fix_and_explain's loop (fix_encoding left out) over a
 * segment: in -> in, with tmp as scratch. */
static int ftfy_pass(vitc__cps *in, vitc__cps *tmp, int html) {
    if (html) {
        if (!ftfy_unescape(in, tmp)) return 0;
        swap(in, tmp);
    }
    /* c1 controls, ligatures, width, quotes, line breaks in one scan: each
     * maps single characters to ones none of the later steps in this
     * group rewrites differently than in sequence (checked per table). */
    tmp->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        int32_t c = in->cp[i];
        if (c >= 0x80 && c <= 0x9F) c = cp1252[c - 0x80];
        const char *lig = ligature(c);
        int ok;
        if (lig || c == 0x3000 || (c >= 0xFF01 && c <= 0xFFEF)) {
            /* what these expand to still goes through the later steps */
            size_t mark = tmp->n;
            ok = lig ? push_utf8(tmp, lig) : push_width(tmp, c);
            for (size_t q = mark; ok && q < tmp->n; q++) {
                int32_t d = tmp->cp[q];
                if (d == 0x2BC || (d >= 0x2018 && d <= 0x201B)) tmp->cp[q] = '\'';
                else if (d >= 0x201C && d <= 0x201F) tmp->cp[q] = '"';
                else if (d == 0x2028 || d == 0x2029 || d == 0x85) tmp->cp[q] = '\n';
            }
        } else if (c == 0x2BC || (c >= 0x2018 && c <= 0x201B)) {
            ok = push(tmp, '\'');
        } else if (c >= 0x201C && c <= 0x201F) {
            ok = push(tmp, '"');
        } else if (c == '\r') {
            ok = push(tmp, '\n');
            if (i + 1 < in->n && in->cp[i + 1] == '\n') i++;
        } else if (c == 0x2028 || c == 0x2029 || c == 0x85) {
            ok = push(tmp, '\n');
        } else {
            ok = push(tmp, c);
        }
        if (!ok) return 0;
    }
    swap(in, tmp);
    /* terminal escapes ESC [ [0-9;]* [A-Za-z], then the control characters */
    tmp->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        int32_t c = in->cp[i];
        if (c == 0x1B && i + 1 < in->n && in->cp[i + 1] == '[') {
            size_t j = i + 2;
            while (j < in->n && ((in->cp[j] >= '0' && in->cp[j] <= '9') || in->cp[j] == ';')) j++;
            if (j < in->n && (in->cp[j] | 32) >= 'a' && (in->cp[j] | 32) <= 'z') {
                i = j;
                continue;
            }
        }
        if (is_ftfy_control(c)) continue;
        if (!push(tmp, c)) return 0;
    }
    swap(in, tmp);
    if (!nfc(in, tmp)) return 0;
    swap(in, tmp);
    return 1;
}

static int same(const vitc__cps *a, const vitc__cps *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->cp, b->cp, a->n * sizeof *a->cp) == 0);
}

/* ftfy.fix_text: per line (a segment ends after '\n'), HTML unescaping
 * off from the first segment holding '<' on (ftfy's "auto"). */
static int ftfy_fix_text(const int32_t *cp, size_t n, vitc__cps *out, int *html_off) {
    vitc__cps seg = {0}, tmp = {0}, prev = {0};
    int html = !*html_off, ok = 1;
    out->n = 0;
    size_t pos = 0;
    while (ok && pos < n) {
        size_t end = pos;
        while (end < n && cp[end] != '\n') end++;
        end = end < n ? end + 1 : n;
        if (end - pos > FTFY_MAX_SEGMENT) end = pos + FTFY_MAX_SEGMENT;
        for (size_t i = pos; html && i < end; i++)
            if (cp[i] == '<') html = 0;
        seg.n = 0;
        ok = reserve(&seg, end - pos);
        if (!ok) break;
        memcpy(seg.cp, cp + pos, (end - pos) * sizeof *cp);
        seg.n = end - pos;
        for (int pass = 0; ok && pass < FTFY_MAX_PASSES; pass++) {
            prev.n = 0;
            ok = reserve(&prev, seg.n);
            if (!ok) break;
            if (seg.n) memcpy(prev.cp, seg.cp, seg.n * sizeof *seg.cp);
            prev.n = seg.n;
            ok = ftfy_pass(&seg, &tmp, html);
            if (ok && same(&seg, &prev)) break;
        }
        if (ok) ok = reserve(out, seg.n);
        if (ok && seg.n) memcpy(out->cp + out->n, seg.cp, seg.n * sizeof *seg.cp);
        if (ok) out->n += seg.n;
        pos = end;
    }
    *html_off = !html;
    vitc__cps_free(&seg);
    vitc__cps_free(&tmp);
    vitc__cps_free(&prev);
    return ok;
}

static int clean_openai(const int32_t *cp, size_t n, vitc__cps *out, int *html_off) {
    vitc__cps a = {0}, b = {0};
    int ok = ftfy_fix_text(cp, n, &a, html_off) && py_unescape(&a, &b) && py_unescape(&b, &a);
    /* " ".join(text.split()) then lower(), with Python's final sigma */
    out->n = 0;
    if (ok) ok = reserve(out, a.n + 8);
    size_t i = 0;
    while (ok && i < a.n) {
        while (i < a.n && is_py_space(a.cp[i])) i++;
        if (i == a.n) break;
        if (out->n && !push(out, ' ')) ok = 0;
        for (; ok && i < a.n && !is_py_space(a.cp[i]); i++) {
            int32_t c = a.cp[i];
            if (c == 0x3A3)
                ok = push(out, final_sigma(a.cp, a.n, i) ? 0x3C2 : 0x3C3);
            else
                ok = lower_char(out, c);
        }
    }
    vitc__cps_free(&a);
    vitc__cps_free(&b);
    return ok;
}

static int clean_hf(const int32_t *cp, size_t n, vitc__cps *out) {
    vitc__cps in = {cp ? (int32_t *)cp : NULL, n, n}, a = {0};
    int ok = nfc(&in, &a);
    out->n = 0;
    if (ok) ok = reserve(out, a.n + 8);
    for (size_t i = 0; ok && i < a.n;) {
        if (is_ws(a.cp[i])) {
            while (i < a.n && is_ws(a.cp[i])) i++;
            ok = push(out, ' ');
            continue;
        }
        ok = lower_char(out, a.cp[i++]);
    }
    vitc__cps_free(&a);
    return ok;
}

vitc_status vitc__clean(vitc__text_clean mode, const int32_t *in, size_t n, vitc__cps *out,
                        int *html_off) {
    int ok, off = 0;
    if (!html_off) html_off = &off;
    if (mode == VITC__CLEAN_HF_CLIP) {
        ok = clean_hf(in, n, out);
    } else if (mode == VITC__CLEAN_OPENAI) {
        ok = clean_openai(in, n, out, html_off);
    } else {
        out->n = 0;
        ok = reserve(out, n);
        if (ok && n) memcpy(out->cp, in, n * sizeof *in);
        if (ok) out->n = n;
    }
    return ok ? VITC_OK : vitc__err(VITC_ERR_NOMEM, "out of memory cleaning a text");
}

static int fold_eq(int32_t c, int32_t p, int ignore_case) {
    return c == p || (ignore_case && p == 's' && c == 0x17F);
}

/* What no branch of the regex matches: White_Space, and under Python's
 * IGNORECASE U+0345 (its case fold, iota, is a letter, so the negated
 * class refuses it while [\p{L}] does not take it). */
static int is_gap(int32_t c, int ignore_case) { return is_ws(c) || (ignore_case && c == 0x345); }

int vitc__pretok_next(const int32_t *cp, size_t n, size_t *pos, size_t *start, size_t *end,
                      const int32_t *const *special, const size_t *special_len, int nspecial,
                      int ignore_case) {
    size_t i = *pos;
    for (;;) {
        if (i >= n) {
            *pos = n;
            return 0;
        }
        int32_t c = cp[i];
        for (int s = 0; s < nspecial; s++) {
            size_t L = special_len[s], q;
            if (i + L > n) continue;
            for (q = 0; q < L && fold_eq(cp[i + q], special[s][q], ignore_case); q++) {}
            if (q == L) {
                *start = i;
                *end = *pos = i + L;
                return 1 + s;
            }
        }
        if (c == '\'' && i + 1 < n) {
            int32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : -1;
            size_t L = 0;
            if (fold_eq(a, 's', ignore_case) || a == 't' || a == 'm' || a == 'd')
                L = 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
                L = 3;
            if (L) {
                *start = i;
                *end = *pos = i + L;
                return 1 + nspecial;
            }
        }
        size_t j = i + 1;
        if (is_letter(c)) {
            while (j < n && is_letter(cp[j])) j++;
        } else if (is_number(c)) {
            /* one digit per piece */
        } else if (!is_gap(c, ignore_case)) {
            while (j < n && !is_gap(cp[j], ignore_case) && !is_letter(cp[j]) && !is_number(cp[j]))
                j++;
        } else {
            i++;
            continue;
        }
        *start = i;
        *end = *pos = j;
        return 1 + nspecial;
    }
}

#else /* !VITC_HAVE_TEXT: bpe.c refuses to load, so none of this is reached */

vitc_status vitc__utf8_decode(const char *s, size_t len, vitc__cps *out) {
    (void)s; (void)len; (void)out;
    return vitc__err(VITC_ERR_UNSUPPORTED, "built without utf8proc (NO_TEXT)");
}
vitc_status vitc__clean(vitc__text_clean mode, const int32_t *in, size_t n, vitc__cps *out,
                        int *html_off) {
    (void)mode; (void)in; (void)n; (void)out; (void)html_off;
    return vitc__err(VITC_ERR_UNSUPPORTED, "built without utf8proc (NO_TEXT)");
}
int vitc__pretok_next(const int32_t *cp, size_t n, size_t *pos, size_t *start, size_t *end,
                      const int32_t *const *special, const size_t *special_len, int nspecial,
                      int ignore_case) {
    (void)cp; (void)n; (void)pos; (void)start; (void)end; (void)special; (void)special_len;
    (void)nspecial; (void)ignore_case;
    return 0;
}

#endif
