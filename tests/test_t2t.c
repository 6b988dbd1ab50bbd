/*
 * test_t2t.c — T2T-ViT against numbers PyTorch wrote (tests/reference/
 * gen_t2t.py: the original's modules re-implemented in t2t_ref.py, two tiny
 * random models): logits and the class-token embedding in both token modes
 * (Token_transformer on the engine's T2TAttention, Token_performer), the
 * engine layers following a parameter written through vitc_vit_param, and
 * what must be refused with a message: another image size, a missing
 * tensor, a preset of other shapes, saving, training.
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

#include "vitc.h"

#define REF "tests/reference/t2t/"

static vitc_safetensors *io; /* t2t_io.safetensors */
static const char *const modes[2] = {"transformer", "performer"};

static const float *ref(const char *name, int64_t numel) {
    int nd;
    const int64_t *shape;
    const float *data = tu_tensor(io, name, &nd, &shape);
    assert_int_equal(tu_numel(nd, shape), numel);
    return data;
}

static void close_to(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        double tol = 1e-4 * fmax(1.0, fabs((double)want[i]));
        if (!(fabs((double)got[i] - (double)want[i]) <= tol))
            fail_msg("%s[%lld]: %g, PyTorch %g", what, (long long)i, (double)got[i],
                     (double)want[i]);
    }
}

static int setup(void **state) {
    (void)state;
    return tu_ref_setup("test_t2t", "/tmp/vitc_test_t2t_XXXXXX", REF "t2t_io.safetensors", &io);
}

static int teardown(void **state) {
    (void)state;
    vitc_safetensors_free(io);
    tu_rm_tree(tu_tmpdir);
    return 0;
}

static vitc_vit *load(const char *mode) {
    char path[200];
    vitc_vit *m = NULL;
    snprintf(path, sizeof path, REF "%s.safetensors", mode);
    if (vitc_vit_load(path, NULL, &m) != VITC_OK)
        fail_msg("%s: %s", path, vitc_last_error());
    return m;
}

static void test_both_modes(void **state) {
    (void)state;
    const float *x = ref("input", 2 * 3 * 32 * 32);
    for (int k = 0; k < 2; k++) {
        char name[64];
        vitc_vit *m = load(modes[k]);
        assert_string_equal(vitc_vit_family(m), "t2t-vit");
        assert_int_equal(vitc_vit_has_head(m), 1);
        float logits[10], cls[64];
        assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, logits), VITC_OK);
        snprintf(name, sizeof name, "%s_logits", modes[k]);
        close_to(logits, ref(name, 10), 10, name);
        assert_int_equal(vitc_vit_embed(m, x, 2, 32, 32, VITC_POOL_DEFAULT, cls), VITC_OK);
        snprintf(name, sizeof name, "%s_cls", modes[k]);
        close_to(cls, ref(name, 64), 64, name);
        /* bf16 blocks: close to fp32 (the token module stays fp32) */
        assert_int_equal(vitc_vit_set_precision(m, VITC_PRECISION_BF16), VITC_OK);
        float lp[10];
        assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, lp), VITC_OK);
        for (int i = 0; i < 10; i++) assert_true(fabsf(lp[i] - logits[i]) < 0.1f);
        vitc_vit_free(m);
    }
}

/* The transformer stages run in the engine's T2TAttention layers, which
 * hold copies: a weight written through vitc_vit_param must reach them. */
static void test_param_write_reaches_engine(void **state) {
    (void)state;
    const float *x = ref("input", 2 * 3 * 32 * 32);
    vitc_vit *m = load("transformer");
    int i = vitc_vit_find_param(m, "tokens_to_token.attention1.attn.qkv.weight");
    assert_true(i >= 0);
    const char *nm;
    int nd;
    const int64_t *shape;
    float *w, *g, a[10], b[10];
    assert_int_equal(vitc_vit_param(m, i, &nm, &nd, &shape, &w, &g), VITC_OK);
    assert_int_equal(nd, 2);
    assert_int_equal(shape[0], 24);
    assert_int_equal(shape[1], 147);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, a), VITC_OK);
    /* data is valid until the next forward: asked again after one */
    assert_int_equal(vitc_vit_param(m, i, &nm, &nd, &shape, &w, &g), VITC_OK);
    float keep = w[5];
    w[5] += 3.0f;
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, b), VITC_OK);
    double d = 0.0;
    for (int k = 0; k < 10; k++) d = fmax(d, fabs((double)a[k] - b[k]));
    assert_true(d > 1e-5);
    assert_int_equal(vitc_vit_param(m, i, &nm, &nd, &shape, &w, &g), VITC_OK);
    w[5] = keep;
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, b), VITC_OK);
    close_to(b, ref("transformer_logits", 10), 10, "restored");
    vitc_vit_free(m);
}

static void test_refusals(void **state) {
    (void)state;
    vitc_vit *m = load("performer");
    float *x48 = calloc(3 * 48 * 48, sizeof(float)), logits[5];
    assert_non_null(x48);
    assert_int_equal(vitc_vit_forward(m, x48, 1, 48, 48, logits), VITC_ERR_SHAPE);
    assert_non_null(strstr(vitc_last_error(), "32x32"));
    free(x48);
    const char *path = tu_tmp_path("resaved.safetensors");
    assert_int_equal(vitc_vit_save(m, path), VITC_ERR_UNSUPPORTED);
    float d[5] = {0};
    assert_int_equal(vitc_vit_backward(m, d), VITC_ERR_UNSUPPORTED);
    assert_non_null(strstr(vitc_last_error(), "T2T-ViT"));
    vitc_vit_free(m);

    /* Every tensor but one, written back: the error names the missing one. */
    vitc_safetensors *st;
    assert_int_equal(vitc_safetensors_load(REF "transformer.safetensors", &st), VITC_OK);
    int n = vitc_safetensors_count(st), k = 0;
    const char **names = calloc((size_t)n, sizeof *names);
    int *nds = calloc((size_t)n, sizeof *nds);
    const int64_t **shapes = calloc((size_t)n, sizeof *shapes);
    const float **data = calloc((size_t)n, sizeof *data);
    assert_true(names && nds && shapes && data);
    for (int j = 0; j < n; j++) {
        const char *dt;
        assert_int_equal(vitc_safetensors_tensor(st, j, &names[j], &dt, &nds[j], &shapes[j],
                                                 &data[j]), VITC_OK);
        if (!strcmp(names[j], "tokens_to_token.attention2.mlp.fc1.bias"))
            k = j;
    }
    /* that one last, then written without it */
    const char *tn = names[k];
    const int64_t *ts = shapes[k];
    const float *td = data[k];
    int tnd = nds[k];
    names[k] = names[n - 1], shapes[k] = shapes[n - 1], data[k] = data[n - 1], nds[k] = nds[n - 1];
    names[n - 1] = tn, shapes[n - 1] = ts, data[n - 1] = td, nds[n - 1] = tnd;
    k = n - 1;
    const char *key = "vitc.config", *val = vitc_safetensors_get_metadata(st, "vitc.config");
    path = tu_tmp_path("missing.safetensors");
    assert_int_equal(vitc_safetensors_save(path, k, names, nds, shapes, data, 1, &key, &val),
                     VITC_OK);
    assert_int_equal(vitc_vit_load(path, NULL, &m), VITC_ERR_KEY);
    assert_null(m);
    assert_non_null(strstr(vitc_last_error(), "tokens_to_token.attention2.mlp.fc1.bias"));
    /* No vitc.config: these shapes are no preset's, and a named preset is
     * checked tensor by tensor. */
    path = tu_tmp_path("bare.safetensors");
    assert_int_equal(vitc_safetensors_save(path, n, names, nds, shapes, data, 0, NULL, NULL),
                     VITC_OK);
    assert_int_equal(vitc_vit_load(path, NULL, &m), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "--arch"));
    assert_int_not_equal(vitc_vit_load(path, "t2t_vit_t_14", &m), VITC_OK);
    assert_non_null(strstr(vitc_last_error(), "tokens_to_token.project.weight"));
    assert_int_equal(vitc_vit_load(path, "vit_b_16", &m), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "t2t_vit_t_24"));
    free(names);
    free(nds);
    free(shapes);
    free(data);
    vitc_safetensors_free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_modes),
        cmocka_unit_test(test_param_write_reaches_engine),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
