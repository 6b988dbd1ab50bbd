/*
 * test_tokenizer_unigram.c — SentencePiece models written byte by byte:
 * a small valid one (with and without a one-rule charsmap) tokenizes as
 * sentencepiece would, and every malformed file is an error value naming
 * what is wrong: truncated at every byte, bad varints, lengths past the
 * end, huge piece counts, unknown wire or piece types, duplicate pieces,
 * no unknown piece, charsmaps whose sizes or offsets point outside the
 * blob, BPE models, and tokenizer.json files vitc does not read. The exact
 * ids against transformers are in tests/python/test_tokenizer_siglip.py.
 * Run under ASan by `make asan`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vitc.h"

#include "testutil.h"

/* ---- a protobuf writer ------------------------------------------------- */

typedef struct pbw {
    uint8_t b[4096];
    size_t n;
} pbw;

static void w_raw(pbw *w, const void *p, size_t n) {
    assert_true(w->n + n <= sizeof w->b);
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void w_varint(pbw *w, uint64_t v) {
    do {
        uint8_t c = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (v) c |= 0x80;
        w_raw(w, &c, 1);
    } while (v);
}

static void w_int(pbw *w, int field, int64_t v) {
    w_varint(w, (uint64_t)field << 3);
    w_varint(w, (uint64_t)v);
}

static void w_bytes(pbw *w, int field, const void *p, size_t n) {
    w_varint(w, (uint64_t)field << 3 | 2);
    w_varint(w, n);
    w_raw(w, p, n);
}

static void w_piece(pbw *w, const char *s, float score, int type) {
    pbw p = {{0}, 0};
    w_bytes(&p, 1, s, strlen(s));
    uint32_t u;
    memcpy(&u, &score, 4);
    uint8_t le[5] = {2 << 3 | 5, (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16),
                     (uint8_t)(u >> 24)};
    w_raw(&p, le, 5);
    w_int(&p, 3, type);
    w_bytes(w, 1, p.b, p.n);
}

/* A darts-clone array with one rule, "a" -> repl + value: the root's
 * offset 1 leads 'a' to unit 0x60, whose offset 2 leads to the value unit
 * 0x62. */
static size_t charsmap(uint8_t *blob, uint32_t value, uint32_t trie_bytes_claimed) {
    uint32_t units[99] = {0};
    units[0] = 1u << 10;
    units[0x60] = (2u << 10) | (1u << 8) | 0x61;
    units[0x62] = value | (1u << 31);
    uint32_t tb = trie_bytes_claimed ? trie_bytes_claimed : (uint32_t)sizeof units;
    memcpy(blob, &tb, 4);
    memcpy(blob + 4, units, sizeof units);
    memcpy(blob + 4 + sizeof units, "b\0", 2);
    return 4 + sizeof units + 2;
}

enum { CM_NONE, CM_GOOD, CM_BAD_OFFSET, CM_BAD_SIZE };

/* pieces: 0 <pad>, 1 </s>, 2 <unk>, 3 "▁b", 4 "▁", 5 "b", 6 "a" */
static size_t model(uint8_t *out, int cm, int model_type, int dup, int no_unk) {
    pbw w = {{0}, 0};
    w_piece(&w, "<pad>", 0, 3);
    w_piece(&w, "</s>", 0, 3);
    w_piece(&w, "<unk>", 0, no_unk ? 1 : 2);
    w_piece(&w, "\xe2\x96\x81" "b", -1.0f, 1);
    w_piece(&w, "\xe2\x96\x81", -2.0f, 1);
    w_piece(&w, "b", -3.0f, 1);
    w_piece(&w, dup ? "b" : "a", -3.0f, 1);
    pbw t = {{0}, 0};
    w_int(&t, 3, model_type);
    w_int(&t, 40, 2);
    w_int(&t, 41, -1);
    w_int(&t, 42, 1);
    w_int(&t, 43, 0);
    w_bytes(&w, 2, t.b, t.n);
    pbw nz = {{0}, 0};
    w_bytes(&nz, 1, "nmt_nfkc", 8);
    if (cm != CM_NONE) {
        uint8_t blob[512];
        size_t n = charsmap(blob, cm == CM_BAD_OFFSET ? 1000 : 0, cm == CM_BAD_SIZE ? 4000 : 0);
        w_bytes(&nz, 2, blob, n);
    }
    w_bytes(&w, 3, nz.b, nz.n);
    memcpy(out, w.b, w.n);
    return w.n;
}

static vitc_status load_bytes(const void *p, size_t n, vitc_tokenizer **t) {
    char *path = tu_tmp_path("spiece.model");
    tu_write_file(path, p, n);
    return vitc_tokenizer_load(path, t);
}

static int setup(void **state) {
    (void)state;
    return tu_make_tmpdir("/tmp/vitc_unigram_XXXXXX");
}

static int have_text(void) {
    uint8_t m[4096];
    size_t n = model(m, CM_NONE, 1, 0, 0);
    vitc_tokenizer *t = NULL;
    vitc_status s = load_bytes(m, n, &t);
    vitc_tokenizer_free(t);
    return !(s == VITC_ERR_UNSUPPORTED && strstr(vitc_last_error(), "without text support"));
}

static void test_valid_model(void **state) {
    (void)state;
    if (!have_text()) skip();
    uint8_t m[4096];
    size_t n = model(m, CM_NONE, 1, 0, 0);
    vitc_tokenizer *t = NULL;
    assert_int_equal(load_bytes(m, n, &t), VITC_OK);
    assert_string_equal(vitc_tokenizer_kind(t), "sentencepiece-unigram");
    assert_int_equal(vitc_tokenizer_context(t), 64);
    assert_int_equal(vitc_tokenizer_vocab_size(t), 7);
    int32_t ids[64];
    int k = 0;
    /* SigLIP: "B!" -> "▁b" (lower case, punctuation gone), </s>, pad </s> */
    assert_int_equal(vitc_tokenizer_encode(t, "B!", -1, ids, 0, &k), VITC_OK);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 3);
    for (int i = 1; i < 64; i++) assert_int_equal(ids[i], 1);
    /* "a" is a piece, but "▁a" is not: "▁" + "a" */
    assert_int_equal(vitc_tokenizer_encode(t, "a", -1, ids, 8, &k), VITC_OK);
    assert_int_equal(k, 3);
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], 6);
    /* unknown characters merge into one <unk> */
    assert_int_equal(vitc_tokenizer_encode(t, "bxyz", -1, ids, 8, &k), VITC_OK);
    assert_int_equal(k, 3);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2);
    /* truncation keeps </s> last */
    assert_int_equal(vitc_tokenizer_encode(t, "b b b b b b", -1, ids, 4, &k), VITC_OK);
    assert_int_equal(k, 4);
    assert_int_equal(ids[2], 3);
    assert_int_equal(ids[3], 1);
    vitc_tokenizer_free(t);
}

static void test_charsmap(void **state) {
    (void)state;
    if (!have_text()) skip();
    uint8_t m[4096];
    int32_t ids[8];
    int k = 0;
    vitc_tokenizer *t = NULL;
    /* the rule rewrites "a" to "b": "a" -> "▁b" */
    size_t n = model(m, CM_GOOD, 1, 0, 0);
    assert_int_equal(load_bytes(m, n, &t), VITC_OK);
    assert_int_equal(vitc_tokenizer_encode(t, "a", -1, ids, 8, &k), VITC_OK);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 3);
    vitc_tokenizer_free(t);
    /* a rule pointing past the strings: an error when it is used */
    n = model(m, CM_BAD_OFFSET, 1, 0, 0);
    assert_int_equal(load_bytes(m, n, &t), VITC_OK);
    assert_int_equal(vitc_tokenizer_encode(t, "b", -1, ids, 8, &k), VITC_OK);
    assert_int_equal(vitc_tokenizer_encode(t, "a", -1, ids, 8, &k), VITC_ERR_FORMAT);
    tu_assert_message_has("charsmap");
    vitc_tokenizer_free(t);
    t = NULL;
    /* a trie size larger than the blob */
    n = model(m, CM_BAD_SIZE, 1, 0, 0);
    assert_int_equal(load_bytes(m, n, &t), VITC_ERR_FORMAT);
    tu_assert_message_has("trie size");
    assert_null(t);
}

static void test_truncated_everywhere(void **state) {
    (void)state;
    if (!have_text()) skip();
    uint8_t m[4096];
    size_t n = model(m, CM_GOOD, 1, 0, 0);
    int errors = 0;
    for (size_t cut = 0; cut < n; cut++) {
        vitc_tokenizer *t = NULL;
        vitc_status s = load_bytes(m, cut, &t);
        if (s == VITC_OK) {
            /* a cut between fields is a shorter valid message */
            int32_t ids[8];
            int k;
            vitc_status e = vitc_tokenizer_encode(t, "ab b", -1, ids, 8, &k);
            assert_true(e == VITC_OK || e == VITC_ERR_FORMAT);
            vitc_tokenizer_free(t);
        } else {
            assert_int_equal(s, VITC_ERR_FORMAT);
            assert_true(strlen(vitc_last_error()) > 10);
            assert_null(t);
            errors++;
        }
    }
    assert_true(errors > (int)n / 2);
}

static void expect_format(const uint8_t *p, size_t n, const char *needle) {
    vitc_tokenizer *t = NULL;
    assert_int_equal(load_bytes(p, n, &t), VITC_ERR_FORMAT);
    tu_assert_message_has(needle);
    assert_null(t);
}

static void test_malformed_wire(void **state) {
    (void)state;
    if (!have_text()) skip();
    /* a varint of 11 bytes */
    uint8_t v[12];
    memset(v, 0xFF, 11);
    v[11] = 0x01;
    expect_format(v, 12, "malformed");
    /* a length of 2^62 */
    pbw w = {{0}, 0};
    w_varint(&w, 1 << 3 | 2);
    w_varint(&w, (uint64_t)1 << 62);
    w_raw(&w, "abc", 3);
    expect_format(w.b, w.n, "malformed");
    /* a group (wire type 3) */
    uint8_t g[2] = {1 << 3 | 3, 0};
    expect_format(g, 2, "malformed");
    /* field number 0 */
    uint8_t z[2] = {0 << 3 | 0, 1};
    expect_format(z, 2, "malformed");
    /* nothing but empty pieces: thousands claimed by a small file */
    pbw e = {{0}, 0};
    for (int i = 0; i < 1000; i++) w_bytes(&e, 1, "", 0);
    expect_format(e.b, e.n, "empty");
    /* no pieces at all */
    pbw t = {{0}, 0};
    w_int(&t, 3, 1);
    pbw top = {{0}, 0};
    w_bytes(&top, 2, t.b, t.n);
    expect_format(top.b, top.n, "no pieces");
    /* an unknown piece type */
    pbw u = {{0}, 0};
    w_piece(&u, "<unk>", 0, 9);
    expect_format(u.b, u.n, "unknown type");
}

static void test_bad_models(void **state) {
    (void)state;
    if (!have_text()) skip();
    uint8_t m[4096];
    size_t n = model(m, CM_NONE, 1, 1, 0);
    expect_format(m, n, "defined twice");
    n = model(m, CM_NONE, 1, 0, 1);
    expect_format(m, n, "no unknown piece");
    vitc_tokenizer *t = NULL;
    n = model(m, CM_NONE, 2, 0, 0);
    assert_int_equal(load_bytes(m, n, &t), VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("BPE");
    assert_null(t);
}

static vitc_status load_json(const char *text, vitc_tokenizer **t) {
    char *path = tu_tmp_path("tokenizer.json");
    tu_write_file(path, text, strlen(text));
    return vitc_tokenizer_load(path, t);
}

#define VOCAB "\"vocab\": [[\"<pad>\", 0], [\"</s>\", 0], [\"<unk>\", 0], [\"\\u2581b\", -1]]"

static void test_unsupported_json(void **state) {
    (void)state;
    if (!have_text()) skip();
    vitc_tokenizer *t = NULL;
    /* a minimal valid one */
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, " VOCAB "},"
                               "\"pre_tokenizer\": {\"type\": \"Metaspace\", "
                               "\"prepend_scheme\": \"always\"}}",
                               &t),
                     VITC_OK);
    int32_t ids[4];
    int k;
    assert_int_equal(vitc_tokenizer_encode(t, "b", -1, ids, 4, &k), VITC_OK);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 1);
    vitc_tokenizer_free(t);
    t = NULL;
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", " VOCAB "}}", &t),
                     VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("unk_id");
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, \"vocab\": 3}}",
                               &t),
                     VITC_ERR_FORMAT);
    tu_assert_message_has("vocab");
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, "
                               "\"vocab\": [[\"a\", \"x\"]]}}",
                               &t),
                     VITC_ERR_FORMAT);
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, " VOCAB "},"
                               "\"normalizer\": {\"type\": \"Lowercase\"}}",
                               &t),
                     VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("Lowercase");
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, " VOCAB "},"
                               "\"normalizer\": {\"type\": \"Precompiled\", "
                               "\"precompiled_charsmap\": \"@@@@\"}}",
                               &t),
                     VITC_ERR_FORMAT);
    tu_assert_message_has("base64");
    /* valid base64 of a blob too short to hold a trie */
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, " VOCAB "},"
                               "\"normalizer\": {\"type\": \"Precompiled\", "
                               "\"precompiled_charsmap\": \"AAAA\"}}",
                               &t),
                     VITC_ERR_FORMAT);
    tu_assert_message_has("charsmap");
    assert_int_equal(load_json("{\"model\": {\"type\": \"Unigram\", \"unk_id\": 2, " VOCAB "},"
                               "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
                               &t),
                     VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("ByteLevel");
    assert_int_equal(load_json("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", &t),
                     VITC_ERR_UNSUPPORTED);
    assert_null(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_model),      cmocka_unit_test(test_charsmap),
        cmocka_unit_test(test_truncated_everywhere), cmocka_unit_test(test_malformed_wire),
        cmocka_unit_test(test_bad_models),       cmocka_unit_test(test_unsupported_json),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown_tmpdir);
}
