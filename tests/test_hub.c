/*
 * test_hub.c — Hugging Face Hub directories through the C API (the numbers
 * against torch are in tests/python/test_hub.py): query/key/value fused in
 * [q; k; v] order, prefix present or absent, sharded index, ignored
 * tensors listed, embeddings' shapes, the image processor's sizes, and every
 * malformed directory an error naming what is wrong. Run under ASan by
 * `make asan`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "vitc.h"

#include "testutil.h"

enum { D = 8, M = 16, P = 4, IMG = 8, NPOS = 1 + (IMG / P) * (IMG / P), K = 3 };

static char dir[256];

static void write_text(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static const char *vit_config =
    "{\"model_type\": \"vit\", \"architectures\": [\"ViTForImageClassification\"],"
    " \"hidden_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"intermediate_size\": 16, \"image_size\": 8, \"patch_size\": 4, \"num_channels\": 3,"
    " \"id2label\": {\"0\": \"cat\", \"1\": \"dog\", \"2\": \"fox\"}}";

/* The tensors of a 1-block HF ViT classifier; values i * 0.01 + tensor id
 * so that each tensor is recognisable. extra: one more name (NULL: none);
 * drop: a name left out (NULL: none). split: 0 one file, else 2 shards. */
static void write_model(const char *pre, const char *extra, const char *drop, int split) {
    char names[32][96];
    int64_t shapes[32][4];
    int nd[32], n = 0;
#define T(name, r, a, b, c, d)                                                                     \
    do {                                                                                           \
        snprintf(names[n], sizeof names[n], "%s%s", strncmp(name, "classifier", 10) ? pre : "",   \
                 name);                                                                            \
        nd[n] = r;                                                                                 \
        shapes[n][0] = a, shapes[n][1] = b, shapes[n][2] = c, shapes[n][3] = d;                    \
        n++;                                                                                       \
    } while (0)
    T("embeddings.cls_token", 3, 1, 1, D, 0);
    T("embeddings.position_embeddings", 3, 1, NPOS, D, 0);
    T("embeddings.patch_embeddings.projection.weight", 4, D, 3, P, P);
    T("embeddings.patch_embeddings.projection.bias", 1, D, 0, 0, 0);
    const char *lin[] = {"attention.attention.query", "attention.attention.key",
                         "attention.attention.value", "attention.output.dense"};
    for (int i = 0; i < 4; i++) {
        char b[96];
        snprintf(b, sizeof b, "encoder.layer.0.%s.weight", lin[i]);
        T(b, 2, D, D, 0, 0);
        snprintf(b, sizeof b, "encoder.layer.0.%s.bias", lin[i]);
        T(b, 1, D, 0, 0, 0);
    }
    T("encoder.layer.0.layernorm_before.weight", 1, D, 0, 0, 0);
    T("encoder.layer.0.layernorm_before.bias", 1, D, 0, 0, 0);
    T("encoder.layer.0.layernorm_after.weight", 1, D, 0, 0, 0);
    T("encoder.layer.0.layernorm_after.bias", 1, D, 0, 0, 0);
    T("encoder.layer.0.intermediate.dense.weight", 2, M, D, 0, 0);
    T("encoder.layer.0.intermediate.dense.bias", 1, M, 0, 0, 0);
    T("encoder.layer.0.output.dense.weight", 2, D, M, 0, 0);
    T("encoder.layer.0.output.dense.bias", 1, D, 0, 0, 0);
    T("layernorm.weight", 1, D, 0, 0, 0);
    T("layernorm.bias", 1, D, 0, 0, 0);
    T("classifier.weight", 2, K, D, 0, 0);
    T("classifier.bias", 1, K, 0, 0, 0);
    if (extra)
        T(extra, 1, 2, 0, 0, 0);
#undef T
    const char *np[32];
    const int64_t *sp[32];
    const float *dp[32];
    float *data[32];
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (drop && strstr(names[i], drop))
            continue;
        size_t numel = 1;
        for (int k = 0; k < nd[i]; k++) numel *= (size_t)shapes[i][k];
        data[m] = malloc(numel * sizeof(float));
        for (size_t j = 0; j < numel; j++)
            data[m][j] = (float)i + 0.01f * (float)(j % 50) - 0.2f;
        np[m] = names[i], sp[m] = shapes[i], dp[m] = data[m];
        nd[m] = nd[i];
        m++;
    }
    char path[512];
    int ndims[32];
    for (int i = 0; i < m; i++) ndims[i] = nd[i];
    if (!split) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        assert_int_equal(vitc_safetensors_save(path, m, np, ndims, sp, dp, 0, NULL, NULL), VITC_OK);
    } else { /* even tensors in shard 1, odd in shard 2, and the index */
        char index[8192] = "{\"metadata\": {}, \"weight_map\": {";
        for (int s = 0; s < 2; s++) {
            const char *n2[32];
            const int64_t *s2[32];
            const float *d2[32];
            int k2[32], c = 0;
            for (int i = s; i < m; i += 2) {
                n2[c] = np[i], s2[c] = sp[i], d2[c] = dp[i], k2[c] = ndims[i];
                c++;
                char e[160];
                snprintf(e, sizeof e, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                         strlen(index) > 40 ? ", " : "", np[i], s + 1);
                strncat(index, e, sizeof index - strlen(index) - 1);
            }
            snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
            assert_int_equal(vitc_safetensors_save(path, c, n2, k2, s2, d2, 0, NULL, NULL),
                             VITC_OK);
        }
        strncat(index, "}}", sizeof index - strlen(index) - 1);
        write_text("model.safetensors.index.json", index);
    }
    for (int i = 0; i < m; i++) free(data[i]);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/vitc_test_hub_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    const char *files[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "preprocessor_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) remove_file(files[i]);
    rmdir(dir);
    return 0;
}

static void clean(void) {
    remove_file("model.safetensors");
    remove_file("model.safetensors.index.json");
    remove_file("model-00001-of-00002.safetensors");
    remove_file("model-00002-of-00002.safetensors");
    remove_file("preprocessor_config.json");
}

static void expect_error(const char *needle) {
    vitc_vit *m = (vitc_vit *)1;
    vitc_status s = vitc_vit_load(dir, NULL, &m);
    assert_int_not_equal(s, VITC_OK);
    assert_null(m);
    tu_assert_message_has(needle);
}

/* Loads with or without the prefix, as one file or shards; q/k/v fused in
 * order; labels; logits and embeddings run. */
static void test_load(void **state) {
    (void)state;
    for (int variant = 0; variant < 3; variant++) {
        clean();
        write_text("config.json", vit_config);
        write_model(variant == 1 ? "" : "vit.", variant == 0 ? "pooler.dense.bias" : NULL, NULL,
                    variant == 2);
        vitc_vit *m;
        assert_int_equal(vitc_vit_load(dir, NULL, &m), VITC_OK);
        assert_string_equal(vitc_vit_family(m), "hf-vit");
        assert_true(vitc_vit_has_head(m));
        assert_string_equal(vitc_vit_label(m, 2), "fox");
        assert_int_equal(vitc_vit_num_ignored(m), variant == 0);
        if (variant == 0)
            assert_string_equal(vitc_vit_ignored(m, 0), "vit.pooler.dense.bias");
        const vitc_vit_config *c = vitc_vit_get_config(m);
        assert_int_equal(c->num_classes, K);
        assert_true(c->norm_eps < 1e-11f && c->norm_eps > 0.0f);
        int qi = vitc_vit_find_param(m, "encoder.layers.encoder_layer_0.self_attention.in_proj_weight");
        assert_true(qi >= 0);
        const char *name;
        int nd;
        const int64_t *shape;
        float *w;
        assert_int_equal(vitc_vit_param(m, qi, &name, &nd, &shape, &w, NULL), VITC_OK);
        assert_int_equal(shape[0], 3 * D);
        /* Tensor ids in write order: query 4, key 6, value 8 (value - 0.2 at j = 0). */
        assert_float_equal(w[0], 4.0f - 0.2f, 1e-6);
        assert_float_equal(w[D * D], 6.0f - 0.2f, 1e-6);
        assert_float_equal(w[2 * D * D], 8.0f - 0.2f, 1e-6);
        float x[2 * 3 * 12 * 8], logits[2 * K], feat[2 * (1 + 6) * D], emb[2 * D];
        for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)((i * 7) % 13) / 13.0f;
        assert_int_equal(vitc_vit_forward(m, x, 2, 12, 8, logits), VITC_OK);
        assert_int_equal(vitc_vit_forward_features(m, x, 2, 12, 8, feat), VITC_OK);
        assert_int_equal(vitc_vit_embed(m, x, 2, 12, 8, VITC_POOL_CLS, emb), VITC_OK);
        assert_memory_equal(emb, feat, D * sizeof(float));
        int64_t per;
        assert_int_equal(vitc_vit_embed_size(m, VITC_POOL_TOKENS, 12, 8, &per), VITC_OK);
        assert_int_equal(per, 6 * D);
        vitc_vit_free(m);
    }
}

/* The processor: legacy int size is a square for ViT; a shortest-edge
 * CLIP-style size gives image-dependent sizes. */
static void test_processor(void **state) {
    (void)state;
    clean();
    write_text("config.json", vit_config);
    write_model("vit.", NULL, NULL, 0);
    write_text("preprocessor_config.json", "{\"size\": 12, \"resample\": 3}");
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(dir, NULL, &m), VITC_OK);
    assert_true(vitc_vit_has_processor(m));
    int H, W;
    assert_int_equal(vitc_vit_preprocess_size(m, 30, 17, &H, &W), VITC_OK);
    assert_int_equal(H, 12);
    assert_int_equal(W, 12);
    uint8_t rgb[17 * 30 * 3];
    for (size_t i = 0; i < sizeof rgb; i++) rgb[i] = (uint8_t)(i * 37);
    vitc_image img = {30, 17, rgb};
    float out[3 * 12 * 12];
    assert_int_equal(vitc_vit_preprocess(m, &img, out), VITC_OK);
    for (size_t i = 0; i < sizeof out / sizeof *out; i++)
        assert_true(out[i] >= -1.0f && out[i] <= 1.0f); /* 0.5 mean/std of [0, 1] */
    vitc_vit_free(m);
    write_text("preprocessor_config.json", "{\"resample\": 1}");
    expect_error("resample must be 2");
    write_text("preprocessor_config.json", "{\"size\": {\"longest_edge\": 3}}");
    expect_error("\"size\" must be");
    remove_file("preprocessor_config.json");
}

static void test_malformed(void **state) {
    (void)state;
    clean();
    write_model("vit.", NULL, NULL, 0);
    remove_file("config.json");
    expect_error("no config.json");
    write_text("config.json", "{\"model_type\": 3}");
    expect_error("no \"model_type\"");
    write_text("config.json", "{\"model_type\": \"swin\"}");
    expect_error("unknown model_type \"swin\"");
    write_text("config.json", "[1]");
    expect_error("config.json is not a JSON object");
    write_text("config.json",
               "{\"model_type\": \"vit\", \"architectures\": [\"ViTForImageClassification\"],"
               " \"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
               " \"intermediate_size\": 16, \"image_size\": 8, \"patch_size\": 4}");
    expect_error("missing tensor vit.encoder.layer.1.layernorm_before.weight");
    write_text("config.json",
               "{\"model_type\": \"vit\", \"hidden_size\": 8, \"num_hidden_layers\": 1,"
               " \"num_attention_heads\": 2, \"intermediate_size\": 32, \"image_size\": 8,"
               " \"patch_size\": 4}");
    expect_error("intermediate.dense.weight: expected [32, 8], file has [16, 8]");
    write_text("config.json", vit_config);
    clean();
    write_model("vit.", NULL, "key.bias", 0);
    expect_error("missing tensor vit.encoder.layer.0.attention.attention.key.bias");
    clean();
    write_model("vit.", "unknown", NULL, 0);
    expect_error("unexpected tensor vit.unknown");
    clean();
    expect_error("no model.safetensors");
    write_model("vit.", NULL, NULL, 1);
    remove_file("model-00002-of-00002.safetensors");
    expect_error("model-00002-of-00002.safetensors named by the index is missing");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x\"}}");
    expect_error("is not a file name");
    write_text("model.safetensors.index.json", "{\"weight_map\": 1}");
    expect_error("no \"weight_map\" object");
    clean();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_processor),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
