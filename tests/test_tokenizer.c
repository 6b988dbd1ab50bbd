/*
 * test_tokenizer.c — the tokenizer router and CLIP's BPE through the C API
 * on a small byte-level vocabulary written here (the exact ids against
 * open_clip and transformers are in tests/python/test_tokenizer_clip.py):
 * the three layouts, framing and padding, and every malformed input an
 * error naming the file: missing or truncated vocabulary, broken JSON, a
 * merges line with one token, an id out of range, duplicate keys, invalid
 * UTF-8 (its byte offset), and a 1 MB text in bounded time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>
#ifdef VITC_HAVE_ZLIB
#include <zlib.h>
#endif

#include "vitc.h"

#include "testutil.h"

/* ids of the small vocabulary: 0..255 the byte characters in GPT-2's order,
 * 256..511 the same with </w>, then the merges' results and the specials */
enum { AB = 512, ABC_W = 513, HI_W = 514, SOT = 515, EOT = 516 };

static int printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

/* The JSON string body of byte b's character (+ "</w>"). */
static void byte_token(int b, int eow, char *out) {
    int c = b, n = 0;
    if (!printable(b)) {
        for (int x = 0; x < b; x++) n += !printable(x);
        c = 256 + n;
    }
    char *o = out;
    if (c == '"' || c == '\\') *o++ = '\\';
    if (c < 0x80) {
        *o++ = (char)c;
    } else {
        *o++ = (char)(0xC0 | (c >> 6));
        *o++ = (char)(0x80 | (c & 0x3F));
    }
    strcpy(o, eow ? "</w>" : "");
}

/* vocab.json of the small vocabulary; extra: more text before the closing
 * brace (NULL: none); n_bytes: how many byte tokens (512: all). */
static void write_vocab(const char *path, const char *extra, int n_bytes) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    int order[256], k = 0;
    for (int b = 0; b < 256; b++)
        if (printable(b)) order[k++] = b;
    for (int b = 0; b < 256; b++)
        if (!printable(b)) order[k++] = b;
    fputc('{', f);
    for (int i = 0; i < n_bytes; i++) {
        char s[16];
        byte_token(order[i % 256], i >= 256, s);
        fprintf(f, "\"%s\": %d, ", s, i);
    }
    fprintf(f, "\"ab\": %d, \"abc</w>\": %d, \"hi</w>\": %d, \"<|startoftext|>\": %d, "
               "\"<|endoftext|>\": %d%s}",
            AB - 512 + n_bytes, ABC_W - 512 + n_bytes, HI_W - 512 + n_bytes, SOT - 512 + n_bytes,
            EOT - 512 + n_bytes, extra ? extra : "");
    fclose(f);
}

static void write_str(const char *path, const char *s) { tu_write_file(path, s, strlen(s)); }

static const char *MERGES = "#version: 0.2\na b\nab c</w>\nh i</w>\n";

/* A fresh directory holding vocab.json + merges.txt. */
static const char *vm_dir(const char *name, const char *merges) {
    const char *d = tu_tmp_path(name);
    char p[600];
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    write_vocab(p, NULL, 512);
    snprintf(p, sizeof p, "%s/merges.txt", d);
    write_str(p, merges);
    return d;
}

#ifdef VITC_HAVE_TEXT
static void expect_ids(vitc_tokenizer *t, const char *text, const int32_t *want, int nwant,
                       int32_t pad) {
    int32_t ids[77];
    int n = -1;
    assert_int_equal(vitc_tokenizer_encode(t, text, -1, ids, 77, &n), VITC_OK);
    assert_int_equal(n, nwant);
    for (int i = 0; i < nwant; i++) assert_int_equal(ids[i], want[i]);
    for (int i = nwant; i < 77; i++) assert_int_equal(ids[i], pad);
}
#endif

static void test_vocab_merges(void **state) {
    (void)state;
#ifdef VITC_HAVE_TEXT
    vitc_tokenizer *t = NULL;
    assert_int_equal(vitc_tokenizer_load(vm_dir("vm", MERGES), &t), VITC_OK);
    assert_int_equal(vitc_tokenizer_context(t), 77);
    assert_int_equal(vitc_tokenizer_vocab_size(t), 517);
    assert_string_equal(vitc_tokenizer_kind(t), "clip-bpe");
    /* lower case, whitespace runs gone, x</w> = 256 + 'x' - 33 */
    const int32_t want[] = {SOT, ABC_W, HI_W, 256 + 'x' - 33, EOT};
    expect_ids(t, "ABC \t hi\n\nx", want, 5, EOT);
    /* "ab" then "d</w>": the merge applies inside a longer piece */
    const int32_t want2[] = {SOT, AB, 256 + 'd' - 33, EOT, 'a' - 33, 256 + 'b' - 33, EOT};
    expect_ids(t, "abd<|endoftext|>ab", want2, 7, EOT);
    /* truncation keeps the end token last */
    int32_t ids[6];
    int n;
    assert_int_equal(vitc_tokenizer_encode(t, "hi hi hi hi hi hi", -1, ids, 6, &n), VITC_OK);
    assert_int_equal(n, 6);
    assert_int_equal(ids[0], SOT);
    for (int i = 1; i < 5; i++) assert_int_equal(ids[i], HI_W);
    assert_int_equal(ids[5], EOT);
    vitc_tokenizer_free(t);

    /* tokenizer_config.json: the pad token and model_max_length */
    const char *d = vm_dir("vmcfg", MERGES);
    char p[600];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
    write_str(p, "{\"pad_token\": \"!\", \"model_max_length\": 16}");
    assert_int_equal(vitc_tokenizer_load(d, &t), VITC_OK);
    assert_int_equal(vitc_tokenizer_context(t), 16);
    int32_t ids16[16];
    assert_int_equal(vitc_tokenizer_encode(t, "hi", -1, ids16, 0, &n), VITC_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids16[15], 0);
    vitc_tokenizer_free(t);
#else
    skip();
#endif
}

/* tokenizer.json in CLIP's layout, merges in both spellings, gives the same
 * ids; a GPT-2-style one is refused. */
static void test_tokenizer_json(void **state) {
    (void)state;
#ifdef VITC_HAVE_TEXT
    static const char *const merges[] = {
        "[\"a b\", \"ab c</w>\", \"h i</w>\"]",
        "[[\"a\", \"b\"], [\"ab\", \"c</w>\"], [\"h\", \"i</w>\"]]"};
    static const char *const clip_pre =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"<\\\\|startoftext\\\\|>|<\\\\|endoftext\\\\|>|"
        "'s|'t|'re|'ve|'m|'ll|'d|[\\\\p{L}]+|[\\\\p{N}]|[^\\\\s\\\\p{L}\\\\p{N}]+\"}, "
        "\"behavior\": \"Removed\", \"invert\": true}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}";
    for (int k = 0; k < 3; k++) {
        const char *vj = tu_tmp_path("v.json");
        write_vocab(vj, NULL, 512);
        size_t vn;
        unsigned char *vocab = tu_read_file(vj, &vn);
        char *j = malloc(vn + 4096);
        assert_non_null(j);
        const char *pre =
            k < 2 ? clip_pre : "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}";
        snprintf(j, vn + 4096,
                 "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": %d, \"content\": "
                 "\"<|startoftext|>\", \"normalized\": false, \"special\": true}, {\"id\": %d, "
                 "\"content\": \"<|endoftext|>\", \"normalized\": false, \"special\": true}], "
                 "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
                 "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, "
                 "\"content\": \" \"}, {\"type\": \"Lowercase\"}]}, \"pre_tokenizer\": %s, "
                 "\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", "
                 "\"continuing_subword_prefix\": \"\", \"vocab\": %.*s, \"merges\": %s}}",
                 SOT, EOT, pre, (int)vn, (const char *)vocab, merges[k % 2]);
        free(vocab);
        const char *d = tu_tmp_path(k == 0 ? "tj0" : k == 1 ? "tj1" : "tj2");
        mkdir(d, 0755);
        char p[600];
        snprintf(p, sizeof p, "%s/tokenizer.json", d);
        write_str(p, j);
        free(j);
        vitc_tokenizer *t = NULL;
        if (k == 2) {
            assert_int_equal(vitc_tokenizer_load(d, &t), VITC_ERR_UNSUPPORTED);
            assert_null(t);
            tu_assert_message_has("not CLIP's");
            tu_assert_message_has("tokenizer.json");
            continue;
        }
        assert_int_equal(vitc_tokenizer_load(d, &t), VITC_OK);
        const int32_t want[] = {SOT, ABC_W, HI_W, EOT, EOT};
        expect_ids(t, "Abc HI<|endoftext|>", want, 5, EOT);
        vitc_tokenizer_free(t);
    }
#else
    skip();
#endif
}

#ifdef VITC_HAVE_TEXT
/* Each malformed vocabulary: the status and a message naming the file. */
static void expect_load_error(const char *dir, vitc_status want, const char *file,
                              const char *words) {
    vitc_tokenizer *t = (vitc_tokenizer *)1;
    assert_int_equal(vitc_tokenizer_load(dir, &t), want);
    assert_null(t);
    tu_assert_message_has(file);
    tu_assert_message_has(words);
}
#endif

static void test_bad_files(void **state) {
    (void)state;
#ifdef VITC_HAVE_TEXT
    char p[600];
    expect_load_error(tu_tmp_path("nowhere"), VITC_ERR_IO, "nowhere", "No such file");
    /* merges.txt alone */
    const char *d = vm_dir("only_merges", MERGES);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    unlink(p);
    expect_load_error(d, VITC_ERR_IO, "only_merges", "not vocab.json");
    /* a merges line with one token */
    expect_load_error(vm_dir("one_token", "#version: 0.2\na b\nab\n"), VITC_ERR_FORMAT,
                      "merges.txt", "line 3");
    /* a merge whose result is not in the vocabulary */
    expect_load_error(vm_dir("not_in", "#version: 0.2\nx y\n"), VITC_ERR_FORMAT, "merges.txt",
                      "not in the vocabulary");
    /* an empty merges.txt */
    expect_load_error(vm_dir("no_merges", "#version: 0.2\n"), VITC_ERR_FORMAT, "merges.txt",
                      "no merges");
    /* a vocabulary id out of range */
    d = vm_dir("range", MERGES);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    write_vocab(p, ", \"zz\": 99999", 512);
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "outside");
    /* two tokens with one id */
    write_vocab(p, ", \"zz\": 3", 512);
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "two tokens");
    /* a key twice */
    write_vocab(p, ", \"ab\": 517", 512);
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "duplicate");
    /* truncated: JSON cut short, and a vocabulary missing byte tokens */
    write_str(p, "{\"a\": 0, \"b\": ");
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "not a JSON vocabulary");
    write_vocab(p, NULL, 100);
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "too few");
    char extra[8192];
    size_t m = 0;
    for (int i = 0; i < 250; i++) /* enough tokens, but not all the bytes' */
        m += (size_t)snprintf(extra + m, sizeof extra - m, ", \"t%d\": %d", i, 305 + i);
    write_vocab(p, extra, 300);
    expect_load_error(d, VITC_ERR_FORMAT, "vocab.json", "has no token");
    /* tokenizer.json: broken, and a model that is not BPE */
    d = tu_tmp_path("tj_bad");
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    write_str(p, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    expect_load_error(d, VITC_ERR_FORMAT, "tokenizer.json", "not a tokenizer.json");
    write_str(p, "{\"model\": {\"type\": \"WordPiece\"}}");
    expect_load_error(d, VITC_ERR_UNSUPPORTED, "tokenizer.json", "WordPiece");
#ifdef VITC_HAVE_ZLIB
    /* open_clip's gz cut short */
    const char *gz = tu_tmp_path("bpe_simple_vocab_16e6.txt.gz");
    gzFile g = gzopen(gz, "wb");
    assert_non_null(g);
    gzputs(g, "#version: 0.2\ni n\nt h\n");
    gzclose(g);
    expect_load_error(gz, VITC_ERR_FORMAT, "bpe_simple_vocab_16e6.txt.gz", "truncated");
#endif
#else
    vitc_tokenizer *t = (vitc_tokenizer *)1;
    assert_int_equal(vitc_tokenizer_load(vm_dir("notext", MERGES), &t), VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("NO_TEXT");
#endif
}

static void test_bad_text(void **state) {
    (void)state;
#ifdef VITC_HAVE_TEXT
    vitc_tokenizer *t = NULL;
    assert_int_equal(vitc_tokenizer_load(vm_dir("vm_text", MERGES), &t), VITC_OK);
    int32_t ids[77];
    int n;
    assert_int_equal(vitc_tokenizer_encode(t, "ab\xC3", 3, ids, 77, &n), VITC_ERR_INVALID_ARG);
    tu_assert_message_has("byte offset 2");
    assert_int_equal(vitc_tokenizer_encode(t, "ok \xE2\x82\x28", -1, ids, 77, &n),
                     VITC_ERR_INVALID_ARG);
    tu_assert_message_has("byte offset 3");
    /* embedded NUL with an explicit length: a control character, no error */
    assert_int_equal(vitc_tokenizer_encode(t, "hi\0hi", 5, ids, 77, &n), VITC_OK);
    assert_int_equal(n, 5);
    assert_int_equal(ids[2], 256 + 188); /* byte 0 is the first unprintable one */
    /* 1 MB: one giant word, and many words; only the first 75 ids matter */
    size_t big = (size_t)1 << 20;
    char *s = malloc(big + 1);
    assert_non_null(s);
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < big; i++) s[i] = k == 0 ? "ab"[i % 2] : "hi "[i % 3];
        s[big] = 0;
        clock_t c0 = clock();
        assert_int_equal(vitc_tokenizer_encode(t, s, (int64_t)big, ids, 77, &n), VITC_OK);
        double sec = (double)(clock() - c0) / CLOCKS_PER_SEC;
        assert_int_equal(n, 77);
        assert_int_equal(ids[1], k == 0 ? AB : HI_W);
        assert_int_equal(ids[76], EOT);
        assert_true(sec < 5.0);
    }
    free(s);
    vitc_tokenizer_free(t);
#else
    skip();
#endif
}

static int setup(void **state) {
    (void)state;
    return tu_make_tmpdir("/tmp/vitc_tokenizer_XXXXXX");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_merges),
        cmocka_unit_test(test_tokenizer_json),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_text),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown_tmpdir);
}
