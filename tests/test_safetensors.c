/*
 * test_safetensors.c — the safetensors reader and writer: round trips, the
 * F16/BF16 conversions against independent formulas, files written by the
 * numpy writer tests/reference/st_write.py, and a corpus of corrupt files
 * that must each be refused with a message (never a crash or a leak; run
 * under `make asan` / `make valgrind` for the latter).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include <cmocka.h>

#include "vitc.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                            */
/* ------------------------------------------------------------------ */

#include "testutil.h"

static int setup_dir(void **state) {
    (void)state;
    return tu_make_tmpdir("/tmp/vitc_test_st_XXXXXX");
}


/* A safetensors image from a header string and data bytes; hlen_override
 * (when not UINT64_MAX) is written as the header length instead of the
 * true one, for lying headers. */
static unsigned char *make_file(const char *hdr, const void *data, size_t dlen,
                                uint64_t hlen_override, size_t *len) {
    size_t hl = strlen(hdr);
    unsigned char *b = malloc(8 + hl + dlen + 1);
    assert_non_null(b);
    uint64_t h = hlen_override != UINT64_MAX ? hlen_override : (uint64_t)hl;
    memcpy(b, &h, 8);
    memcpy(b + 8, hdr, hl);
    if (dlen)
        memcpy(b + 8 + hl, data, dlen);
    *len = 8 + hl + dlen;
    return b;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static const char *fixture(const char *name) {
    static char p[512];
    const char *dirs[] = {"tests/reference/safetensors", "../tests/reference/safetensors",
                          "../../tests/reference/safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dirs[i], name);
        if (access(p, R_OK) == 0)
            return p;
    }
    fail_msg("fixture %s not found (run from the repository root)", name);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Round trip through the writer                                      */
/* ------------------------------------------------------------------ */

static void test_roundtrip(void **state) {
    (void)state;
    float a[6] = {1, -2, 3.5f, INFINITY, -0.0f, 1e-42f}, b[1] = {7}, s[1] = {-3.25f};
    float c[24];
    for (int i = 0; i < 24; i++)
        c[i] = (float)i * 0.5f - 3;
    c[5] = NAN;
    int64_t sa[2] = {2, 3}, sb[1] = {1}, sc[3] = {2, 3, 4}, se[2] = {0, 5};
    /* Unsorted, with a name that needs escaping and a non-ASCII one. */
    const char *names[] = {"z.weight", "a \"quoted\"\\name\n", "\xc3\xa9t\xc3\xa9", "scalar",
                           "empty"};
    const int ndims[] = {2, 1, 3, 0, 2};
    const int64_t *shapes[] = {sa, sb, sc, NULL, se};
    const float *data[] = {a, b, c, s, NULL};
    const char *mk[] = {"format", "vitc.config", "empty"};
    const char *mv[] = {"pt", "{\"depth\": 2, \"labels\": [\"a\\\"b\", \"\\u00e9\"]}", ""};
    const char *path = tu_tmp_path("rt.safetensors");
    assert_int_equal(vitc_safetensors_save(path, 5, names, ndims, shapes, data, 3, mk, mv),
                     VITC_OK);
    assert_int_equal(tu_dir_entries(), 1); /* no temp file left behind */

    size_t len;
    unsigned char *bytes = tu_read_file(path, &len);
    assert_non_null(bytes);
    uint64_t hl;
    memcpy(&hl, bytes, 8);
    assert_int_equal(hl % 8, 0);
    assert_int_equal(bytes[8], '{');
    assert_int_equal(len, 8 + hl + 4 * (6 + 1 + 24 + 1));

    for (int pass = 0; pass < 2; pass++) {
        vitc_safetensors *st = NULL;
        if (pass == 0)
            assert_int_equal(vitc_safetensors_load(path, &st), VITC_OK);
        else
            assert_int_equal(vitc_safetensors_load_memory(bytes, len, &st), VITC_OK);
        assert_int_equal(vitc_safetensors_count(st), 5);
        /* Sorted by name by the writer; the reader keeps file order. */
        const char *want[] = {"a \"quoted\"\\name\n", "empty", "scalar", "z.weight",
                              "\xc3\xa9t\xc3\xa9"};
        for (int i = 0; i < 5; i++) {
            const char *name, *dtype;
            int nd;
            const int64_t *shape;
            const float *d;
            assert_int_equal(vitc_safetensors_tensor(st, i, &name, &dtype, &nd, &shape, &d),
                             VITC_OK);
            assert_string_equal(name, want[i]);
            assert_string_equal(dtype, "F32");
            assert_true(((uintptr_t)d % 4) == 0);
            int k = -1;
            for (int j = 0; j < 5; j++)
                if (!strcmp(names[j], name))
                    k = j;
            assert_int_not_equal(k, -1);
            assert_int_equal(vitc_safetensors_find(st, name), i);
            assert_int_equal(nd, ndims[k]);
            size_t n = 1;
            for (int j = 0; j < nd; j++) {
                assert_int_equal(shape[j], shapes[k][j]);
                n *= (size_t)shape[j];
            }
            for (size_t j = 0; j < n; j++)
                assert_int_equal(f32_bits(d[j]), f32_bits(data[k][j]));
        }
        assert_int_equal(vitc_safetensors_find(st, "missing"), -1);
        assert_int_equal(vitc_safetensors_find(st, ""), -1);
        assert_int_equal(vitc_safetensors_metadata_count(st), 3);
        for (int i = 0; i < 3; i++) {
            const char *k, *v;
            assert_int_equal(vitc_safetensors_metadata(st, i, &k, &v), VITC_OK);
            assert_string_equal(k, mk[i]);
            assert_string_equal(v, mv[i]);
            assert_string_equal(vitc_safetensors_get_metadata(st, mk[i]), mv[i]);
        }
        assert_null(vitc_safetensors_get_metadata(st, "nope"));
        vitc_safetensors_free(st);
    }
    free(bytes);

    /* Overwriting an existing file replaces it whole. */
    assert_int_equal(vitc_safetensors_save(path, 1, names, ndims, shapes, data, 0, NULL, NULL),
                     VITC_OK);
    vitc_safetensors *st;
    assert_int_equal(vitc_safetensors_load(path, &st), VITC_OK);
    assert_int_equal(vitc_safetensors_count(st), 1);
    assert_int_equal(vitc_safetensors_metadata_count(st), 0);
    vitc_safetensors_free(st);

    /* An empty file (no tensors, no metadata) is valid. */
    assert_int_equal(vitc_safetensors_save(path, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL),
                     VITC_OK);
    assert_int_equal(vitc_safetensors_load(path, &st), VITC_OK);
    assert_int_equal(vitc_safetensors_count(st), 0);
    vitc_safetensors_free(st);
    unlink(path);
}

/* ------------------------------------------------------------------ */
/* Writer errors: nothing written, nothing left behind                */
/* ------------------------------------------------------------------ */

static void expect_save_fails(const char *path, int n, const char *const *names, const int *ndims,
                              const int64_t *const *shapes, const float *const *data, int nm,
                              const char *const *mk, const char *const *mv, const char *needle) {
    vitc_status s = vitc_safetensors_save(path, n, names, ndims, shapes, data, nm, mk, mv);
    assert_int_not_equal(s, VITC_OK);
    tu_assert_message_has(needle);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_save_errors(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    int64_t s2[1] = {2}, neg[2] = {2, -1}, huge[3] = {INT64_MAX / 2, 4, 4};
    const char *p = tu_tmp_path("bad.safetensors");
    const char *dup[] = {"w", "w"};
    const int nd1[] = {1, 1};
    const int64_t *sh[] = {s2, s2};
    const float *dd[] = {x, x};
    expect_save_fails(p, 2, dup, nd1, sh, dd, 0, NULL, NULL, "'w' given twice");

    const char *one[] = {"w"};
    const int nd2[] = {2}, nd3[] = {3}, ndm[] = {-1};
    const int64_t *shn[] = {neg}, *shh[] = {huge};
    expect_save_fails(p, 1, one, nd2, shn, dd, 0, NULL, NULL, "[2, -1]");
    expect_save_fails(p, 1, one, nd3, shh, dd, 0, NULL, NULL, "too large");
    expect_save_fails(p, 1, one, ndm, sh, dd, 0, NULL, NULL, "'w'");
    const float *nod[] = {NULL};
    expect_save_fails(p, 1, one, nd1, sh, nod, 0, NULL, NULL, "data is NULL");
    const char *res[] = {"__metadata__"};
    expect_save_fails(p, 1, res, nd1, sh, dd, 0, NULL, NULL, "reserved");
    const char *badutf[] = {"w\xff"};
    expect_save_fails(p, 1, badutf, nd1, sh, dd, 0, NULL, NULL, "UTF-8");
    const char *mk[] = {"k", "k"}, *mv[] = {"1", "2"};
    expect_save_fails(p, 1, one, nd1, sh, dd, 2, mk, mv, "'k' given twice");
    const char *mv_bad[] = {"\xc3"};
    expect_save_fails(p, 1, one, nd1, sh, dd, 1, mk, mv_bad, "UTF-8");
    const char *nullname[] = {NULL};
    expect_save_fails(p, 1, nullname, nd1, sh, dd, 0, NULL, NULL, "no name");
    expect_save_fails(p, -1, one, nd1, sh, dd, 0, NULL, NULL, "negative");
    /* Two sizes that are each fine but whose sum overflows an offset (the
     * check comes before any data is read). */
    int64_t big[1] = {INT64_MAX / 8 - 1};
    const char *three[] = {"a", "b", "c"};
    const int nd1x3[] = {1, 1, 1};
    const int64_t *shb[] = {big, big, big};
    const float *ddd[] = {x, x, x};
    expect_save_fails(p, 3, three, nd1x3, shb, ddd, 0, NULL, NULL, "add up");
    assert_int_not_equal(vitc_safetensors_save(NULL, 1, one, nd1, sh, dd, 0, NULL, NULL), VITC_OK);
    assert_int_equal(tu_dir_entries(), 0);

    /* A directory that does not exist: an i/o error naming the path. */
    const char *nodir = "/nonexistent-vitc-dir/x.safetensors";
    assert_int_equal(vitc_safetensors_save(nodir, 1, one, nd1, sh, dd, 0, NULL, NULL), VITC_ERR_IO);
    assert_non_null(strstr(vitc_last_error(), nodir));
}

/* ------------------------------------------------------------------ */
/* Conversions: every F16 and BF16 bit pattern                        */
/* ------------------------------------------------------------------ */

/* IEEE half by its definition, with ldexp: an implementation independent of
 * the bit manipulation in the library. */
static uint32_t f16_expected_bits(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) /* inf, or NaN whose payload moves to the top of the float's */
        return ((uint32_t)sign << 31) | 0x7F800000u | ((uint32_t)m << 13);
    double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return f32_bits((float)(sign ? -v : v));
}

static void check_all_16bit(const char *dtype) {
    enum { N = 65536 };
    uint16_t *raw = malloc(N * 2);
    assert_non_null(raw);
    for (uint32_t i = 0; i < N; i++)
        raw[i] = (uint16_t)i;
    char hdr[160];
    /* Padded with spaces like a real writer, exercising trailing space. */
    snprintf(hdr, sizeof hdr,
             "{\"all\":{\"dtype\":\"%s\",\"shape\":[256,256],\"data_offsets\":[0,%d]}}   ", dtype,
             N * 2);
    size_t len;
    unsigned char *file = make_file(hdr, raw, N * 2, UINT64_MAX, &len);
    vitc_safetensors *st;
    assert_int_equal(vitc_safetensors_load_memory(file, len, &st), VITC_OK);
    const float *d;
    const char *dt;
    assert_int_equal(vitc_safetensors_tensor(st, 0, NULL, &dt, NULL, NULL, &d), VITC_OK);
    assert_string_equal(dt, dtype);
    int f16 = !strcmp(dtype, "F16");
    for (uint32_t i = 0; i < N; i++) {
        uint32_t want = f16 ? f16_expected_bits((uint16_t)i) : i << 16;
        if (f32_bits(d[i]) != want)
            fail_msg("%s 0x%04x -> 0x%08x, want 0x%08x", dtype, i, f32_bits(d[i]), want);
#if defined(__FLT16_MAX__)
        /* The compiler's own conversion agrees on every non-NaN value. */
        if (f16 && !isnan(d[i])) {
            _Float16 h;
            memcpy(&h, &raw[i], 2);
            assert_int_equal(f32_bits((float)h), f32_bits(d[i]));
        }
#endif
    }
    vitc_safetensors_free(st);
    free(file);
    free(raw);
}

static void test_f16_all_patterns(void **state) {
    (void)state;
    check_all_16bit("F16");
}

static void test_bf16_all_patterns(void **state) {
    (void)state;
    check_all_16bit("BF16");
}

/* Odd element counts put the in-place widening at unaligned half offsets. */
static void test_f16_odd_counts(void **state) {
    (void)state;
    for (int n = 0; n < 9; n++) {
        uint16_t raw[2 * 9];
        int nt = 2;
        for (int i = 0; i < nt * n; i++)
            raw[i] = (uint16_t)(0x3C00 + i * 37);
        char hdr[256];
        snprintf(hdr, sizeof hdr,
                 "{\"a\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}",
                 n, 2 * n, n, 2 * n, 4 * n);
        size_t len;
        unsigned char *file = make_file(hdr, raw, (size_t)(4 * n), UINT64_MAX, &len);
        vitc_safetensors *st;
        assert_int_equal(vitc_safetensors_load_memory(file, len, &st), VITC_OK);
        const float *a, *b;
        assert_int_equal(vitc_safetensors_tensor(st, 0, NULL, NULL, NULL, NULL, &a), VITC_OK);
        assert_int_equal(vitc_safetensors_tensor(st, 1, NULL, NULL, NULL, NULL, &b), VITC_OK);
        for (int i = 0; i < n; i++) {
            assert_int_equal(f32_bits(a[i]), f16_expected_bits(raw[i]));
            assert_int_equal(f32_bits(b[i]), (uint32_t)raw[n + i] << 16);
        }
        vitc_safetensors_free(st);
        free(file);
    }
}

/* ------------------------------------------------------------------ */
/* A file written by the independent numpy writer                     */
/* ------------------------------------------------------------------ */

static const float *get(vitc_safetensors *st, const char *name, const char *dtype, int ndim,
                        const int64_t *shape) {
    int i = vitc_safetensors_find(st, name);
    if (i < 0)
        fail_msg("tensor %s missing", name);
    const char *dt;
    int nd;
    const int64_t *sh;
    const float *d;
    assert_int_equal(vitc_safetensors_tensor(st, i, NULL, &dt, &nd, &sh, &d), VITC_OK);
    assert_string_equal(dt, dtype);
    assert_int_equal(nd, ndim);
    for (int j = 0; j < nd; j++)
        assert_int_equal(sh[j], shape[j]);
    assert_true(((uintptr_t)d % 4) == 0);
    return d;
}

static void test_numpy_fixture(void **state) {
    (void)state;
    vitc_safetensors *st;
    const char *path = fixture("mixed.safetensors");
    assert_int_equal(vitc_safetensors_load(path, &st), VITC_OK);
    assert_int_equal(vitc_safetensors_count(st), 7);
    const int64_t s48[] = {4, 8}, s16[] = {16}, s35[] = {3, 5}, s04[] = {0, 4}, s123[] = {1, 2, 3};
    const float *f16 = get(st, "f16", "F16", 2, s48);
    const float *f16e = get(st, "f16_expect", "F32", 2, s48);
    for (int i = 0; i < 32; i++)
        assert_int_equal(f32_bits(f16[i]), f32_bits(f16e[i]));
    /* The fixture has the specials: subnormals, inf, NaN. */
    assert_true(f16[2] == ldexpf(1, -24) && isinf(f16[10]) && isnan(f16[12]));
    const float *bf = get(st, "bf16", "BF16", 1, s16);
    const float *bfe = get(st, "bf16_expect", "F32", 1, s16);
    for (int i = 0; i < 16; i++)
        assert_int_equal(f32_bits(bf[i]), f32_bits(bfe[i]));
    get(st, "f32", "F32", 2, s35);
    get(st, "empty", "F32", 2, s04);
    const float *w = get(st, "layer.0.w\xc3\xa9ight", "F32", 3, s123);
    for (int i = 0; i < 6; i++)
        assert_true(w[i] == (float)i);
    assert_string_equal(vitc_safetensors_get_metadata(st, "format"), "pt");
    assert_string_equal(vitc_safetensors_get_metadata(st, "unicode"), "h\xc3\xa9llo \xe2\x9c\x93");
    assert_string_equal(vitc_safetensors_get_metadata(st, "quote"), "a\"b\\c\n");

    /* Same bytes through memory; then through our writer and back. */
    size_t len;
    unsigned char *bytes = tu_read_file(path, &len);
    vitc_safetensors *m;
    assert_int_equal(vitc_safetensors_load_memory(bytes, len, &m), VITC_OK);
    int n = vitc_safetensors_count(st);
    assert_int_equal(vitc_safetensors_count(m), n);
    const char *names[8];
    int ndims[8];
    const int64_t *shapes[8];
    const float *data[8];
    for (int i = 0; i < n; i++) {
        const char *n2;
        int nd2;
        const int64_t *sh2;
        const float *d2;
        vitc_safetensors_tensor(st, i, &names[i], NULL, &ndims[i], &shapes[i], &data[i]);
        vitc_safetensors_tensor(m, i, &n2, NULL, &nd2, &sh2, &d2);
        assert_string_equal(names[i], n2);
        size_t cnt = 1;
        for (int j = 0; j < nd2; j++)
            cnt *= (size_t)sh2[j];
        if (cnt)
            assert_memory_equal(data[i], d2, cnt * 4);
    }
    vitc_safetensors_free(m);
    free(bytes);
    const char *p2 = tu_tmp_path("resaved.safetensors");
    assert_int_equal(vitc_safetensors_save(p2, n, names, ndims, shapes, data, 0, NULL, NULL),
                     VITC_OK);
    assert_int_equal(vitc_safetensors_load(p2, &m), VITC_OK);
    for (int i = 0; i < n; i++) {
        int j = vitc_safetensors_find(m, names[i]);
        const float *d2;
        const char *dt;
        assert_true(j >= 0);
        vitc_safetensors_tensor(m, j, NULL, &dt, NULL, NULL, &d2);
        assert_string_equal(dt, "F32");
        size_t cnt = 1;
        for (int k = 0; k < ndims[i]; k++)
            cnt *= (size_t)shapes[i][k];
        for (size_t k = 0; k < cnt; k++)
            assert_int_equal(f32_bits(d2[k]), f32_bits(data[i][k]));
    }
    vitc_safetensors_free(m);
    vitc_safetensors_free(st);
    unlink(p2);
}

/* ------------------------------------------------------------------ */
/* Corrupt files                                                      */
/* ------------------------------------------------------------------ */

/* Must fail from memory and from a file, with a message holding needle. */
static void expect_bad(const unsigned char *b, size_t len, const char *needle) {
    vitc_safetensors *st = (vitc_safetensors *)&st; /* must be reset to NULL */
    vitc_status s = vitc_safetensors_load_memory(b, len, &st);
    if (s == VITC_OK)
        fail_msg("accepted a bad file (expected \"%s\")", needle);
    assert_null(st);
    tu_assert_message_has(needle);
    const char *p = tu_tmp_path("corrupt.safetensors");
    tu_write_file(p, b, len);
    st = (vitc_safetensors *)&st;
    assert_int_not_equal(vitc_safetensors_load(p, &st), VITC_OK);
    assert_null(st);
    if (!strstr(vitc_last_error(), needle) || !strstr(vitc_last_error(), p))
        fail_msg("file message \"%s\" lacks \"%s\" or the path", vitc_last_error(), needle);
    unlink(p);
}

static void expect_bad_hdr(const char *hdr, size_t dlen, const char *needle) {
    unsigned char data[256] = {0};
    size_t len;
    assert_true(dlen <= sizeof data);
    unsigned char *b = make_file(hdr, data, dlen, UINT64_MAX, &len);
    expect_bad(b, len, needle);
    free(b);
}

#define T(name, rest) "\"" name "\":{" rest "}"
#define F32(shape, off) "\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" off

static void test_corrupt_headers(void **state) {
    (void)state;
    /* A valid baseline, to show the corpus is not failing for another
     * reason. */
    {
        unsigned char data[24] = {0};
        size_t len;
        unsigned char *b = make_file("{" T("a", F32("[2]", "[0,8]")) "," T("b", F32("[4]", "[8,24]"))
                                     "}", data, 24, UINT64_MAX, &len);
        vitc_safetensors *st;
        assert_int_equal(vitc_safetensors_load_memory(b, len, &st), VITC_OK);
        vitc_safetensors_free(st);
        free(b);
    }
    expect_bad_hdr("[1,2]", 0, "start with '{'");
    expect_bad_hdr(" {}", 0, "start with '{'");
    expect_bad_hdr("", 0, "start with '{'");
    expect_bad_hdr("{\"a\":", 0, "not valid JSON");
    expect_bad_hdr("{} x", 0, "not valid JSON");
    {
        /* A NUL byte inside the header length (C strings cannot say it). */
        size_t len;
        unsigned char *b = make_file("{}\x01   ", NULL, 0, UINT64_MAX, &len);
        b[10] = 0;
        expect_bad(b, len, "not valid JSON");
        free(b);
    }
    expect_bad_hdr("{\"\xff\":{}}", 0, "not valid JSON");
    /* Duplicate tensor names and duplicate fields. */
    expect_bad_hdr("{" T("a", F32("[1]", "[0,4]")) "," T("a", F32("[1]", "[4,8]")) "}", 8,
                   "duplicate");
    expect_bad_hdr("{" T("a", "\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[0,4]") "}", 4, "duplicate");
    /* Entries of the wrong kind or with missing / extra fields. */
    expect_bad_hdr("{\"a\":[1]}", 0, "'a' is an array, not an object");
    expect_bad_hdr("{" T("a", "\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, "lacks \"dtype\"");
    expect_bad_hdr("{" T("a", "\"dtype\":\"F32\",\"data_offsets\":[0,4]") "}", 4,
                   "lacks \"shape\"");
    expect_bad_hdr("{" T("a", "\"dtype\":\"F32\",\"shape\":[1]") "}", 4, "lacks \"data_offsets\"");
    expect_bad_hdr("{" T("a", F32("[1]", "[0,4]") ",\"extra\":1") "}", 4, "unknown field \"extra\"");
    /* dtypes. */
    expect_bad_hdr("{" T("w", "\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]") "}", 8,
                   "tensor 'w' has dtype I64");
    expect_bad_hdr("{" T("w", "\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,8]") "}", 8,
                   "unknown dtype \"Q4\"");
    expect_bad_hdr("{" T("w", "\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]") "}", 4,
                   "dtype is an integer");
    expect_bad_hdr("{" T("w", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4,
                   "unknown dtype");
    /* Shapes. */
    expect_bad_hdr("{" T("w", F32("[-1]", "[0,4]")) "}", 4, "shape[0] is negative");
    expect_bad_hdr("{" T("w", F32("[1.0]", "[0,4]")) "}", 4, "shape[0] is a number with a fraction");
    expect_bad_hdr("{" T("w", F32("[\"1\"]", "[0,4]")) "}", 4, "shape[0] is a string");
    expect_bad_hdr("{" T("w", F32("7", "[0,4]")) "}", 4, "shape is an integer");
    expect_bad_hdr("{" T("w", F32("[99999999999999999999]", "[0,4]")) "}", 4, "not valid JSON");
    expect_bad_hdr("{" T("w", F32("[4294967296,4294967296]", "[0,4]")) "}", 4, "overflow");
    expect_bad_hdr("{" T("w", F32("[9223372036854775807,2]", "[0,4]")) "}", 4, "overflow");
    expect_bad_hdr("{" T("w", F32("[4611686018427387904]", "[0,4]")) "}", 4, "overflow");
    expect_bad_hdr("{" T("w", F32("[1152921504606846976]", "[0,4]")) "}", 4,
                   "needs 4611686018427387904");
    expect_bad_hdr("{" T("w", F32("[5,6]", "[0,100]")) "}", 100,
                   "tensor 'w': data_offsets [0, 100] hold 100 bytes but F32 [5, 6] needs 120");
    /* A huge shape whose byte count matches huge offsets: caught by the
     * buffer bound before any allocation. */
    expect_bad_hdr("{" T("w", F32("[1000000000000]", "[0,4000000000000]")) "}", 4,
                   "run past the end");
    /* Offsets. */
    expect_bad_hdr("{" T("w", F32("[1]", "[0]")) "}", 4, "not [begin, end]");
    expect_bad_hdr("{" T("w", F32("[1]", "[0,4,8]")) "}", 4, "not [begin, end]");
    expect_bad_hdr("{" T("w", F32("[1]", "{}")) "}", 4, "not [begin, end]");
    expect_bad_hdr("{" T("w", F32("[1]", "[-4,0]")) "}", 4, "non-negative");
    expect_bad_hdr("{" T("w", F32("[1]", "[0.0,4]")) "}", 4, "non-negative");
    expect_bad_hdr("{" T("w", F32("[0]", "[4,0]")) "}", 4, "end before they begin");
    expect_bad_hdr("{" T("w", F32("[1]", "[4,8]")) "}", 8, "leave a hole");
    expect_bad_hdr("{" T("a", F32("[2]", "[0,8]")) "," T("b", F32("[2]", "[4,12]")) "}", 12,
                   "overlap the previous tensor 'a'");
    expect_bad_hdr("{" T("a", F32("[1]", "[0,4]")) "," T("b", F32("[1]", "[8,12]")) "}", 12,
                   "tensor 'b'");
    expect_bad_hdr("{" T("a", F32("[2]", "[0,8]")) "}", 4, "run past the end");
    expect_bad_hdr("{" T("a", F32("[1]", "[0,4]")) "}", 8, "not indexed");
    expect_bad_hdr("{}", 4, "not indexed");
    /* Offsets near 2^64: jansson refuses > INT64_MAX, the rest must not
     * wrap. */
    expect_bad_hdr("{" T("a", F32("[0]", "[9223372036854775807,9223372036854775807]")) "}", 0,
                   "leave a hole");
    expect_bad_hdr("{" T("a", F32("[1]", "[0,18446744073709551615]")) "}", 4, "not valid JSON");
    /* Nesting deep enough to overflow a recursive parser's stack. */
    {
        enum { DEPTH = 200000 };
        char *h = malloc(2 * DEPTH + 64);
        assert_non_null(h);
        size_t k = (size_t)sprintf(h, "{\"__metadata__\":{\"k\":");
        memset(h + k, '[', DEPTH);
        memset(h + k + DEPTH, ']', DEPTH);
        strcpy(h + k + 2 * DEPTH, "}}");
        expect_bad_hdr(h, 0, "not valid JSON");
        free(h);
    }
    /* Metadata. */
    expect_bad_hdr("{\"__metadata__\":{\"k\":1}}", 0, "value of 'k' is an integer");
    expect_bad_hdr("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, "value of 'k' is an object");
    expect_bad_hdr("{\"__metadata__\":[\"k\"]}", 0, "__metadata__ is an array");
    expect_bad_hdr("{\"__metadata__\":\"k\"}", 0, "__metadata__ is a string");
    expect_bad_hdr("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "not valid JSON");
    expect_bad_hdr("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "duplicate");
    expect_bad_hdr("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate");
}

static void test_corrupt_lengths(void **state) {
    (void)state;
    unsigned char data[8] = {0};
    const char *hdr = "{" T("a", F32("[2]", "[0,8]")) "}";
    size_t len;
    /* Header length larger than the file, than the format's limit, and
     * absurd. */
    unsigned char *b = make_file(hdr, data, 8, strlen(hdr) + 9, &len);
    expect_bad(b, len, "exceeds");
    free(b);
    b = make_file(hdr, data, 8, 100000001, &len);
    expect_bad(b, len, "exceeds the format's limit");
    free(b);
    b = make_file(hdr, data, 8, UINT64_MAX - 3, &len);
    expect_bad(b, len, "exceeds");
    free(b);
    /* Header length shorter than the JSON: the header is cut mid-object. */
    b = make_file(hdr, data, 8, strlen(hdr) - 1, &len);
    expect_bad(b, len, "not valid JSON");
    free(b);
    b = make_file(hdr, data, 8, 0, &len);
    expect_bad(b, len, "start with '{'");
    free(b);
    /* Too short for the length field itself. */
    expect_bad((const unsigned char *)"\x02\0\0", 3, "too few");
    expect_bad((const unsigned char *)"", 0, "too few");
}

/* Another format given as a model is named, with the fix for a PyTorch
 * checkpoint; a header length that merely looks like a magic stays a
 * safetensors question. */
static void test_other_formats_named(void **state) {
    (void)state;
    static const struct {
        const char *bytes;
        size_t len;
        const char *words;
    } cases[] = {
        {"PK\x03\x04\x00\x00\x08\x08\x00\x00", 10, "zip archive (a PyTorch checkpoint"},
        {"\x80\x02}q\x00(X\x01\x00\x00\x00", 12, "Python pickle (a PyTorch checkpoint"},
        {"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00", 10, "Python pickle"},
        {"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR", 16, "is a PNG image, not a model"},
        {"\xff\xd8\xff\xe0\x00\x10JFIF", 10, "is a JPEG image, not a model"},
        {"GIF89a\x01\x00\x01\x00", 10, "is a GIF image, not a model"},
        {"\x93NUMPY\x01\x00v\x00", 10, "NumPy .npy array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* from memory, then as a file (the message then names its path) */
        expect_bad((const unsigned char *)cases[i].bytes, cases[i].len, cases[i].words);
        if (strstr(cases[i].words, "PyTorch")) {
            char want[600];
            snprintf(want, sizeof want, "python tools/export_safetensors.py %s out.safetensors",
                     tu_tmp_path("corrupt.safetensors"));
            tu_assert_message_has(want);
        }
    }
    /* 0x80 0x02 as the low bytes of a 640-byte header length: within the
     * file, so the usual header error, no guess. */
    unsigned char b[8 + 640] = {0x80, 0x02};
    memset(b + 8, ' ', 640);
    expect_bad(b, sizeof b, "start with '{'");
    assert_null(strstr(vitc_last_error(), "pickle"));
}

/* Every prefix of a valid file is an error, and so is every file with one
 * byte appended. Bytes past a prefix are never read: the prefix is copied
 * into an allocation of exactly its length so ASan/valgrind catch an
 * overread. */
static void test_truncated_every_prefix(void **state) {
    (void)state;
    float a[3] = {1, 2, 3};
    uint16_t h[3] = {0x3C00, 0x4000, 0x7C00};
    unsigned char data[18];
    memcpy(data, a, 12);
    memcpy(data + 12, h, 6);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      T("a", F32("[3]", "[0,12]")) ","
                      T("h", "\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[12,18]") "}  ";
    size_t len;
    unsigned char *full = make_file(hdr, data, sizeof data, UINT64_MAX, &len);
    vitc_safetensors *st;
    assert_int_equal(vitc_safetensors_load_memory(full, len, &st), VITC_OK);
    vitc_safetensors_free(st);
    const char *p = tu_tmp_path("prefix.safetensors");
    for (size_t n = 0; n < len; n++) {
        unsigned char *cut = malloc(n ? n : 1);
        assert_non_null(cut);
        memcpy(cut, full, n);
        st = NULL;
        if (vitc_safetensors_load_memory(cut, n, &st) == VITC_OK)
            fail_msg("prefix of %zu of %zu bytes accepted", n, len);
        assert_null(st);
        assert_true(strlen(vitc_last_error()) > 0);
        tu_write_file(p, cut, n);
        if (vitc_safetensors_load(p, &st) == VITC_OK)
            fail_msg("file prefix of %zu of %zu bytes accepted", n, len);
        assert_true(strlen(vitc_last_error()) > 0);
        free(cut);
    }
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, full, len);
    longer[len] = 0;
    expect_bad(longer, len + 1, "not indexed");
    free(longer);
    free(full);
    unlink(p);
}

/* Every single-byte change of a valid file either loads or fails cleanly
 * (a small deterministic fuzz; tests/fuzz/safetensors.c is the real one). */
static void test_byte_flips(void **state) {
    (void)state;
    float a[4] = {1, 2, 3, 4};
    const char *hdr = "{\"__metadata__\":{\"k\":\"v\"}," T("a", F32("[2,2]", "[0,16]")) "}";
    size_t len;
    unsigned char *full = make_file(hdr, a, sizeof a, UINT64_MAX, &len);
    const unsigned char vals[] = {0, 1, '"', '{', '}', '[', ']', ',', ':', '-', '9', 0x80, 0xff};
    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            unsigned char *b = malloc(len);
            memcpy(b, full, len);
            b[i] = vals[v];
            vitc_safetensors *st = NULL;
            if (vitc_safetensors_load_memory(b, len, &st) == VITC_OK) {
                /* Whatever loaded must be self-consistent. */
                for (int t = 0; t < vitc_safetensors_count(st); t++) {
                    int nd;
                    const int64_t *sh;
                    const float *d;
                    assert_int_equal(vitc_safetensors_tensor(st, t, NULL, NULL, &nd, &sh, &d),
                                     VITC_OK);
                    size_t cnt = 1;
                    for (int k = 0; k < nd; k++)
                        cnt *= (size_t)sh[k];
                    volatile float sum = 0;
                    for (size_t k = 0; k < cnt; k++)
                        sum += d[k];
                    (void)sum;
                }
                vitc_safetensors_free(st);
            } else {
                assert_null(st);
                assert_true(strlen(vitc_last_error()) > 0);
            }
            free(b);
        }
    free(full);
}

static void test_bad_paths_and_args(void **state) {
    (void)state;
    vitc_safetensors *st = NULL;
    assert_int_equal(vitc_safetensors_load("/nonexistent/x.safetensors", &st), VITC_ERR_IO);
    assert_non_null(strstr(vitc_last_error(), "/nonexistent/x.safetensors"));
    assert_null(st);
    assert_int_not_equal(vitc_safetensors_load(tu_tmpdir, &st), VITC_OK);
    assert_non_null(strstr(vitc_last_error(), tu_tmpdir));
    assert_int_not_equal(vitc_safetensors_load(NULL, &st), VITC_OK);
    assert_int_not_equal(vitc_safetensors_load("x", NULL), VITC_OK);
    assert_int_not_equal(vitc_safetensors_load_memory(NULL, 10, &st), VITC_OK);
    assert_int_equal(vitc_safetensors_count(NULL), 0);
    assert_int_equal(vitc_safetensors_metadata_count(NULL), 0);
    assert_int_equal(vitc_safetensors_find(NULL, "a"), -1);
    assert_null(vitc_safetensors_get_metadata(NULL, "a"));
    vitc_safetensors_free(NULL);

    const char *hdr = "{" T("a", F32("[1]", "[0,4]")) "}";
    float one = 1;
    size_t len;
    unsigned char *b = make_file(hdr, &one, 4, UINT64_MAX, &len);
    assert_int_equal(vitc_safetensors_load_memory(b, len, &st), VITC_OK);
    free(b); /* the reader copied what it needs */
    const float *d;
    assert_int_equal(vitc_safetensors_tensor(st, 0, NULL, NULL, NULL, NULL, &d), VITC_OK);
    assert_true(d[0] == 1.0f);
    assert_int_equal(vitc_safetensors_tensor(st, 1, NULL, NULL, NULL, NULL, &d),
                     VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "index 1"));
    assert_int_equal(vitc_safetensors_tensor(st, -1, NULL, NULL, NULL, NULL, &d),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_safetensors_metadata(st, 0, NULL, NULL), VITC_ERR_INVALID_ARG);
    /* A null metadata value is the same as none (the reference's Option). */
    vitc_safetensors_free(st);
    b = make_file("{\"__metadata__\":null}", NULL, 0, UINT64_MAX, &len);
    assert_int_equal(vitc_safetensors_load_memory(b, len, &st), VITC_OK);
    assert_int_equal(vitc_safetensors_metadata_count(st), 0);
    vitc_safetensors_free(st);
    free(b);
}

/* VITC_SAFETENSORS_MAX_NDIM dimensions load and save; one more is refused
 * both ways (a reader with numpy 1.x behind it holds only 32). */
static void test_rank_limit(void **state) {
    (void)state;
    enum { MAX = VITC_SAFETENSORS_MAX_NDIM };
    int64_t ones[MAX + 1];
    for (int i = 0; i <= MAX; i++) ones[i] = 1;
    float one = 1;
    const char *name[] = {"a"};
    const int64_t *sh[] = {ones};
    const float *dd[] = {&one};
    const char *p = tu_tmp_path("rank.safetensors");
    for (int nd = MAX; nd <= MAX + 1; nd++) {
        char hdr[512] = "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[";
        for (int i = 0; i < nd; i++) strcat(hdr, i ? ",1" : "1");
        strcat(hdr, "]}}");
        size_t len;
        unsigned char *b = make_file(hdr, &one, 4, UINT64_MAX, &len);
        const int ndims[] = {nd};
        char needle[64];
        if (nd <= MAX) {
            vitc_safetensors *st;
            int got;
            assert_int_equal(vitc_safetensors_load_memory(b, len, &st), VITC_OK);
            assert_int_equal(vitc_safetensors_tensor(st, 0, NULL, NULL, &got, NULL, NULL), VITC_OK);
            assert_int_equal(got, nd);
            vitc_safetensors_free(st);
            assert_int_equal(vitc_safetensors_save(p, 1, name, ndims, sh, dd, 0, NULL, NULL), VITC_OK);
            unlink(p);
        } else {
            snprintf(needle, sizeof needle, "%d dimensions (at most %d)", nd, MAX);
            expect_bad(b, len, needle);
            snprintf(needle, sizeof needle, "%d dimensions (0 to %d)", nd, MAX);
            expect_save_fails(p, 1, name, ndims, sh, dd, 0, NULL, NULL, needle);
        }
        free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_save_errors),
        cmocka_unit_test(test_f16_all_patterns),
        cmocka_unit_test(test_bf16_all_patterns),
        cmocka_unit_test(test_f16_odd_counts),
        cmocka_unit_test(test_numpy_fixture),
        cmocka_unit_test(test_corrupt_headers),
        cmocka_unit_test(test_corrupt_lengths),
        cmocka_unit_test(test_other_formats_named),
        cmocka_unit_test(test_truncated_every_prefix),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_bad_paths_and_args),
        cmocka_unit_test(test_rank_limit),
    };
    return cmocka_run_group_tests_name("safetensors", tests, setup_dir, tu_teardown_tmpdir);
}
