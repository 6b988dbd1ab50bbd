/*
 * test_vit.c — the Vision Transformer against numbers PyTorch wrote
 * (tests/reference/gen_vit.py: a tiny torchvision ViT with every parameter
 * random): logits at the trained size and, through the position-embedding
 * interpolation, at another; BF16 weights; per-layer attention
 * probabilities and the rollout; timm and legacy torchvision names; and
 * checkpoints that must be refused with a message naming the tensor.
 * Run from the repository root.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "models/vit_internal.h"
#include "vitc.h"

#define REF "tests/reference/vit/"

static vitc_safetensors *io;   /* tiny_io.safetensors */
static vitc_safetensors *wts;  /* tiny.safetensors */

static const float *ref(const char *name, int ndim, const int64_t *want) {
    int nd;
    const int64_t *shape;
    const float *data = tu_tensor(io, name, &nd, &shape);
    assert_int_equal(nd, ndim);
    for (int k = 0; k < nd; k++) assert_int_equal(shape[k], want[k]);
    return data;
}

static int setup(void **state) {
    (void)state;
    if (tu_ref_setup("test_vit", "/tmp/vitc_test_vit_XXXXXX", REF "tiny_io.safetensors", &io))
        return -1;
    return tu_ref_load("test_vit", REF "tiny.safetensors", &wts);
}

static int teardown(void **state) {
    (void)state;
    vitc_safetensors_free(io);
    vitc_safetensors_free(wts);
    tu_rm_tree(tu_tmpdir);
    return 0;
}

/* The whole-model contract: |vitc - torch| <= 1e-3 * max(1, |torch|) and
 * the same top-5 in the same order. */
static void check_logits(const float *got, const float *want, int B, int classes) {
    for (int b = 0; b < B; b++) {
        const float *g = got + b * classes, *w = want + b * classes;
        for (int j = 0; j < classes; j++) {
            float tol = 1e-3f * fmaxf(1.0f, fabsf(w[j]));
            if (!(fabsf(g[j] - w[j]) <= tol))
                fail_msg("logit [%d, %d]: vitc %.7g, torch %.7g", b, j, (double)g[j],
                         (double)w[j]);
        }
        int tg[5], tw[5];
        for (int r = 0; r < 5; r++) {
            tg[r] = tw[r] = -1;
            for (int j = 0; j < classes; j++) {
                int used_g = 0, used_w = 0;
                for (int q = 0; q < r; q++) used_g |= tg[q] == j, used_w |= tw[q] == j;
                if (!used_g && (tg[r] < 0 || g[j] > g[tg[r]])) tg[r] = j;
                if (!used_w && (tw[r] < 0 || w[j] > w[tw[r]])) tw[r] = j;
            }
            assert_int_equal(tg[r], tw[r]);
        }
    }
}

static void check_close(const float *got, const float *want, size_t n, float tol, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol * fmaxf(1.0f, fabsf(want[i]))))
            fail_msg("%s[%zu]: vitc %.7g, torch %.7g", what, i, (double)got[i], (double)want[i]);
}

/* ------------------------------------------------------------------ */
/* Numbers                                                            */
/* ------------------------------------------------------------------ */

/* gen_vit.py's tiny model: 32px, patch 8, 3 channels, dim 64, depth 2,
 * MLP 128, 10 classes, with heads heads. */
static void check_tiny_config(const vitc_vit_config *c, int heads) {
    assert_int_equal(c->image_size, 32);
    assert_int_equal(c->patch_size, 8);
    assert_int_equal(c->in_channels, 3);
    assert_int_equal(c->hidden_dim, 64);
    assert_int_equal(c->depth, 2);
    assert_int_equal(c->num_heads, heads);
    assert_int_equal(c->mlp_dim, 128);
    assert_int_equal(c->num_classes, 10);
}

static void test_logits(void **state) {
    (void)state;
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(REF "tiny.safetensors", NULL, &m), VITC_OK);
    const vitc_vit_config *c = vitc_vit_get_config(m);
    check_tiny_config(c, 4);
    assert_true(fabsf(c->norm_eps - 1e-6f) < 1e-12f);
    assert_true(fabsf(c->mean[0] - 0.485f) < 1e-7f && fabsf(c->std[2] - 0.225f) < 1e-7f);
    assert_string_equal(vitc_vit_arch_name(m), "custom");
    assert_string_equal(vitc_vit_label(m, 3), "class 3");
    assert_null(vitc_vit_label(m, 10));
    assert_null(vitc_vit_label(m, -1));

    const float *x = ref("input", 4, (int64_t[]){2, 3, 32, 32});
    const float *want = ref("logits", 2, (int64_t[]){2, 10});
    float got[20], one[10];
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, got), VITC_OK);
    check_logits(got, want, 2, 10);
    /* Image 1 alone gives its row of the batch: no mixing across images. */
    assert_int_equal(vitc_vit_forward(m, x + 3 * 32 * 32, 1, 32, 32, one), VITC_OK);
    check_close(one, got + 10, 10, 1e-5f, "batch-of-one logits");
    /* Again after a larger image: buffers re-sized, nothing stale. */
    const float *x48 = ref("input48", 4, (int64_t[]){2, 3, 48, 48});
    float tmp[20];
    assert_int_equal(vitc_vit_forward(m, x48, 2, 48, 48, tmp), VITC_OK);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, tmp), VITC_OK);
    check_close(tmp, got, 20, 1e-6f, "logits after a resize");
    vitc_vit_free(m);
}

/* Model file's logits for the 2 images input [2, 3, S, S] against the
 * reference logits [2, 10]. */
static void check_file_logits(const char *file, const char *input, const char *logits, int S) {
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(file, NULL, &m), VITC_OK);
    const float *x = ref(input, 4, (int64_t[]){2, 3, S, S});
    const float *want = ref(logits, 2, (int64_t[]){2, 10});
    float got[20];
    assert_int_equal(vitc_vit_forward(m, x, 2, S, S, got), VITC_OK);
    check_logits(got, want, 2, 10);
    vitc_vit_free(m);
}

/* Another image size: torchvision's interpolate_embeddings route. */
static void test_interpolated_size(void **state) {
    (void)state;
    check_file_logits(REF "tiny.safetensors", "input48", "logits48", 48);
}

static void test_bicubic(void **state) {
    (void)state;
    const float *src = ref("interp_src", 4, (int64_t[]){1, 3, 4, 4});
    static const int sizes[3][2] = {{7, 7}, {3, 3}, {5, 6}};
    for (int s = 0; s < 3; s++) {
        int oh = sizes[s][0], ow = sizes[s][1];
        char name[32];
        snprintf(name, sizeof name, "interp_%dx%d", oh, ow);
        const float *want = ref(name, 4, (int64_t[]){1, 3, oh, ow});
        /* The resampler works position-major ([h*w, C]), as the embedding is stored. */
        float in[16 * 3], out[49 * 3];
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 16; i++) in[i * 3 + c] = src[c * 16 + i];
        vitc__bicubic_ac(out, in, 3, 4, 4, oh, ow);
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < oh * ow; i++)
                if (fabsf(out[i * 3 + c] - want[c * oh * ow + i]) > 1e-6f)
                    fail_msg("%s: channel %d pixel %d: %.7g vs torch %.7g", name, c, i,
                             (double)out[i * 3 + c], (double)want[c * oh * ow + i]);
    }
}

static void test_bf16(void **state) {
    (void)state;
    check_file_logits(REF "tiny_bf16.safetensors", "input", "logits_bf16", 32);
}

static void test_attention_maps(void **state) {
    (void)state;
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(REF "tiny.safetensors", NULL, &m), VITC_OK);
    const float *x = ref("input", 4, (int64_t[]){2, 3, 32, 32});
    const float *want_a = ref("attn", 5, (int64_t[]){2, 2, 4, 17, 17});
    const float *want_r = ref("rollout", 3, (int64_t[]){2, 17, 17});
    enum { NA = 2 * 2 * 4 * 17 * 17, NR = 2 * 17 * 17 };
    float *attn = malloc(NA * sizeof(float)), *roll = malloc(NR * sizeof(float));
    float *roll2 = malloc(NR * sizeof(float));
    assert_non_null(attn);
    assert_non_null(roll);
    assert_non_null(roll2);
    assert_int_equal(vitc_vit_attention_maps(m, x, 2, 32, 32, attn, roll), VITC_OK);
    check_close(attn, want_a, NA, 1e-5f, "attn");
    check_close(roll, want_r, NR, 1e-5f, "rollout");
    /* Either output alone gives the same numbers. */
    memset(roll2, 0, NR * sizeof(float));
    assert_int_equal(vitc_vit_attention_maps(m, x, 2, 32, 32, NULL, roll2), VITC_OK);
    check_close(roll2, roll, NR, 1e-6f, "rollout without attn");
    memset(attn, 0, NA * sizeof(float));
    assert_int_equal(vitc_vit_attention_maps(m, x, 2, 32, 32, attn, NULL), VITC_OK);
    check_close(attn, want_a, NA, 1e-5f, "attn without rollout");
    assert_int_equal(vitc_vit_attention_maps(m, x, 2, 32, 32, NULL, NULL), VITC_ERR_INVALID_ARG);
    free(attn);
    free(roll);
    free(roll2);
    vitc_vit_free(m);
}

static void test_bad_inputs(void **state) {
    (void)state;
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(REF "tiny.safetensors", NULL, &m), VITC_OK);
    const float *x = ref("input", 4, (int64_t[]){2, 3, 32, 32});
    float out[20];
    assert_int_equal(vitc_vit_forward(m, x, 1, 30, 32, out), VITC_ERR_SHAPE);
    assert_non_null(strstr(vitc_last_error(), "patch size 8"));
    assert_int_equal(vitc_vit_forward(m, x, 0, 32, 32, out), VITC_ERR_SHAPE);
    assert_int_equal(vitc_vit_forward(m, NULL, 1, 32, 32, out), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_forward(m, x, 1, 32, 32, NULL), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_forward(NULL, x, 1, 32, 32, out), VITC_ERR_INVALID_ARG);
    vitc_vit_free(m);
    vitc_vit_free(NULL);
    assert_int_equal(vitc_vit_load(REF "no_such.safetensors", NULL, &m), VITC_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(vitc_last_error(), "no_such.safetensors"));
}

/* ------------------------------------------------------------------ */
/* Checkpoints rewritten from tiny.safetensors                        */
/* ------------------------------------------------------------------ */

/* How to rewrite one tensor: return 0 to drop it; may rename it (into
 * name, 160 bytes) and change its shape (same data, a prefix of it). */
typedef int (*edit_fn)(char *name, int *ndim, int64_t *shape);

/* tiny.safetensors with edit applied to every tensor, an optional extra
 * tensor, and metadata (the file's own unless meta_value is given; ""
 * drops it). Returns the path. */
static const char *rewrite(const char *file, edit_fn edit, const char *extra,
                           const char *meta_value) {
    int n = vitc_safetensors_count(wts), k = 0;
    char(*names)[160] = calloc((size_t)n + 1, sizeof *names);
    const char **np = calloc((size_t)n + 1, sizeof *np);
    int *nd = calloc((size_t)n + 1, sizeof *nd);
    int64_t(*shapes)[8] = calloc((size_t)n + 1, sizeof *shapes);
    const int64_t **sp = calloc((size_t)n + 1, sizeof *sp);
    const float **dp = calloc((size_t)n + 1, sizeof *dp);
    assert_true(names && np && nd && shapes && sp && dp);
    for (int i = 0; i < n; i++) {
        const char *nm, *dt;
        const int64_t *shape;
        const float *data;
        int d;
        assert_int_equal(vitc_safetensors_tensor(wts, i, &nm, &dt, &d, &shape, &data), VITC_OK);
        snprintf(names[k], sizeof names[k], "%s", nm);
        nd[k] = d;
        memcpy(shapes[k], shape, (size_t)d * sizeof(int64_t));
        if (edit && !edit(names[k], &nd[k], shapes[k]))
            continue;
        np[k] = names[k];
        sp[k] = shapes[k];
        dp[k] = data;
        k++;
    }
    static const float one = 1.0f;
    if (extra) {
        snprintf(names[k], sizeof names[k], "%s", extra);
        np[k] = names[k];
        nd[k] = 1;
        shapes[k][0] = 1;
        sp[k] = shapes[k];
        dp[k] = &one;
        k++;
    }
    const char *key = "vitc.config";
    const char *val = meta_value ? meta_value : vitc_safetensors_get_metadata(wts, key);
    int n_meta = val && *val ? 1 : 0;
    const char *path = tu_tmp_path(file);
    assert_int_equal(vitc_safetensors_save(path, k, np, nd, sp, dp, n_meta, &key, &val), VITC_OK);
    free(names);
    free(np);
    free(nd);
    free(shapes);
    free(sp);
    free(dp);
    return path;
}

static int replace(char *name, const char *from, const char *to) {
    char *p = strstr(name, from);
    if (!p)
        return 0;
    char tail[160];
    snprintf(tail, sizeof tail, "%s", p + strlen(from));
    snprintf(p, 160 - (size_t)(p - name), "%s%s", to, tail);
    return 1;
}

/* torchvision -> timm, as the rename table in docs/vit.md. */
static int to_timm(char *name, int *ndim, int64_t *shape) {
    (void)ndim;
    (void)shape;
    static const char *const tab[][2] = {
        {"class_token", "cls_token"}, {"conv_proj.", "patch_embed.proj."},
        {"encoder.pos_embedding", "pos_embed"}, {"encoder.layers.encoder_layer_", "blocks."},
        {"ln_1.", "norm1."}, {"ln_2.", "norm2."},
        {"self_attention.in_proj_weight", "attn.qkv.weight"},
        {"self_attention.in_proj_bias", "attn.qkv.bias"},
        {"self_attention.out_proj.", "attn.proj."}, {"mlp.0.", "mlp.fc1."},
        {"mlp.3.", "mlp.fc2."}, {"encoder.ln.", "norm."}, {"heads.head.", "head."},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) replace(name, tab[i][0], tab[i][1]);
    return 1;
}

static int to_legacy(char *name, int *ndim, int64_t *shape) {
    (void)ndim;
    (void)shape;
    replace(name, "mlp.0.", "mlp.linear_1.");
    replace(name, "mlp.3.", "mlp.linear_2.");
    return 1;
}

static void check_renamed(const char *path, const char *arch) {
    vitc_vit *m;
    if (vitc_vit_load(path, arch, &m) != VITC_OK)
        fail_msg("%s", vitc_last_error());
    const float *x = ref("input", 4, (int64_t[]){2, 3, 32, 32});
    const float *want = ref("logits", 2, (int64_t[]){2, 10});
    float got[20];
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, got), VITC_OK);
    check_logits(got, want, 2, 10);
    vitc_vit_free(m);
    unlink(path);
}

static void test_timm_names(void **state) {
    (void)state;
    check_renamed(rewrite("timm.safetensors", to_timm, NULL, NULL), NULL);
}

static void test_legacy_names(void **state) {
    (void)state;
    check_renamed(rewrite("legacy.safetensors", to_legacy, NULL, NULL), NULL);
}

/* No metadata: the shapes tell everything but the heads (hidden/64 = 1). */
static void test_inferred_config(void **state) {
    (void)state;
    const char *path = rewrite("bare.safetensors", NULL, NULL, "");
    vitc_vit *m;
    assert_int_equal(vitc_vit_load(path, NULL, &m), VITC_OK);
    check_tiny_config(vitc_vit_get_config(m), 1);
    assert_null(vitc_vit_label(m, 0));
    vitc_vit_free(m);
    /* A preset whose shapes the file does not have: the first tensor named. */
    assert_int_equal(vitc_vit_load(path, "vit_b_16", &m), VITC_ERR_SHAPE);
    assert_non_null(strstr(vitc_last_error(), "class_token: expected [1, 1, 768], file has [1, 1, 64]"));
    assert_int_equal(vitc_vit_load(path, "vit_q_99", &m), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "vit_q_99"));
    unlink(path);
}

static const char *const drop_me = "encoder.layers.encoder_layer_1.ln_2.bias";
static int drop_one(char *name, int *ndim, int64_t *shape) {
    (void)ndim;
    (void)shape;
    return strcmp(name, drop_me) != 0;
}
static int bad_pos(char *name, int *ndim, int64_t *shape) {
    if (strcmp(name, "encoder.pos_embedding") == 0) {
        *ndim = 3;
        shape[1] = 10; /* [1, 10, 64]: a prefix of the real data */
    }
    return 1;
}
static int bad_fc2(char *name, int *ndim, int64_t *shape) {
    if (strcmp(name, "encoder.layers.encoder_layer_0.mlp.3.weight") == 0) {
        *ndim = 2;
        shape[0] = 64;
        shape[1] = 127;
    }
    return 1;
}
static int no_cls(char *name, int *ndim, int64_t *shape) {
    (void)ndim;
    (void)shape;
    return strcmp(name, "class_token") != 0 && strcmp(name, "conv_proj.weight") != 0;
}

static void expect_error(const char *path, vitc_status status, const char *needle1,
                         const char *needle2) {
    vitc_vit *m = (vitc_vit *)&m;
    vitc_status s = vitc_vit_load(path, NULL, &m);
    if (s != status)
        fail_msg("%s: status %d (%s), expected %d", path, s, vitc_last_error(), status);
    assert_null(m);
    if (!strstr(vitc_last_error(), needle1) || (needle2 && !strstr(vitc_last_error(), needle2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", vitc_last_error(), needle1,
                 needle2 ? needle2 : "");
    unlink(path);
}

static void test_bad_checkpoints(void **state) {
    (void)state;
    expect_error(rewrite("missing.safetensors", drop_one, NULL, NULL), VITC_ERR_KEY,
                 "missing tensor encoder.layers.encoder_layer_1.ln_2.bias", "[64]");
    expect_error(rewrite("pos.safetensors", bad_pos, NULL, NULL), VITC_ERR_SHAPE,
                 "encoder.pos_embedding: expected [1, 17, 64], file has [1, 10, 64]", NULL);
    expect_error(rewrite("fc2.safetensors", bad_fc2, NULL, NULL), VITC_ERR_SHAPE,
                 "encoder.layers.encoder_layer_0.mlp.3.weight: expected [64, 128], file has "
                 "[64, 127]",
                 NULL);
    expect_error(rewrite("extra.safetensors", NULL, "heads.pre_logits.bias", NULL), VITC_ERR_KEY,
                 "unexpected tensor heads.pre_logits.bias [1]", NULL);
    expect_error(rewrite("nocls.safetensors", no_cls, NULL, NULL), VITC_ERR_KEY, "class_token",
                 NULL);
    expect_error(rewrite("json.safetensors", NULL, NULL, "{\"depth\": 2,"), VITC_ERR_FORMAT,
                 "vitc.config", NULL);
    expect_error(rewrite("depth.safetensors", NULL, NULL, "{\"depth\": 3}"), VITC_ERR_KEY,
                 "missing tensor encoder.layers.encoder_layer_2.ln_1.weight", NULL);
    expect_error(rewrite("heads.safetensors", NULL, NULL, "{\"num_heads\": 5}"),
                 VITC_ERR_INVALID_ARG, "num_heads 5", NULL);
    expect_error(rewrite("huge.safetensors", NULL, NULL, "{\"hidden_dim\": 1e300}"),
                 VITC_ERR_FORMAT, "hidden_dim", NULL);
    expect_error(rewrite("labels.safetensors", NULL, NULL, "{\"labels\": [\"a\", \"b\"]}"),
                 VITC_ERR_FORMAT, "2 labels for 10 classes", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits),          cmocka_unit_test(test_interpolated_size),
        cmocka_unit_test(test_bicubic),         cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_attention_maps),  cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_timm_names),      cmocka_unit_test(test_legacy_names),
        cmocka_unit_test(test_inferred_config), cmocka_unit_test(test_bad_checkpoints),
    };
    return cmocka_run_group_tests_name("vit", tests, setup, teardown);
}
