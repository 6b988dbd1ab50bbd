/*
 * test_vit_train.c — the ViT and layers as trainable things: the one
 * parameter table (flat array, state_dict order, torchvision's init), the
 * paramset views an optimizer uses, the live-model registry, and saving a
 * created model so vitc_vit_load reads back the same weights and logits.
 * Gradients against torch are in tests/python/test_vit_train.py.
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

#include "train/train.h"
#include "vitc.h"

/* 1 channel, 28x28, patch 4: the Fashion-MNIST model's shape, 2 blocks. */
static vitc_vit_config small_config(void) {
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 28;
    c.patch_size = 4;
    c.in_channels = 1;
    c.hidden_dim = 24;
    c.depth = 2;
    c.num_heads = 4;
    c.mlp_dim = 40;
    c.num_classes = 10;
    c.mean[0] = 0.5f;
    c.std[0] = 0.25f;
    return c;
}

static const float *param(vitc_vit *m, const char *name, size_t *numel) {
    int i = vitc_vit_find_param(m, name);
    assert_true(i >= 0);
    int nd;
    const int64_t *shape;
    float *data;
    assert_int_equal(vitc_vit_param(m, i, NULL, &nd, &shape, &data, NULL), VITC_OK);
    *numel = 1;
    for (int k = 0; k < nd; k++) *numel *= (size_t)shape[k];
    return data;
}

static void moments(const float *x, size_t n, double *mean, double *sd, double *amax) {
    double s = 0, s2 = 0, a = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        if (fabs(x[i]) > a) a = fabs(x[i]);
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
    *amax = a;
}

/* torchvision's init, tensor by tensor: the distributions' moments and bounds. */
static void test_create_init(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_create(&c, 7, &m), VITC_OK);
    assert_int_equal(vitc_vit_num_params(m), 8 + 12 * c.depth);
    size_t n;
    double mu, sd, amax;
    const float *x = param(m, "class_token", &n);
    moments(x, n, &mu, &sd, &amax);
    assert_true(amax == 0.0);
    x = param(m, "heads.head.weight", &n);
    moments(x, n, &mu, &sd, &amax);
    assert_true(amax == 0.0);
    x = param(m, "encoder.layers.encoder_layer_1.ln_2.weight", &n);
    for (size_t i = 0; i < n; i++) assert_true(x[i] == 1.0f);
    x = param(m, "encoder.pos_embedding", &n);
    assert_int_equal(n, (size_t)(1 + 49) * 24);
    moments(x, n, &mu, &sd, &amax);
    assert_true(fabs(sd - 0.02) < 0.002 && fabs(mu) < 0.002);
    x = param(m, "conv_proj.weight", &n); /* std sqrt(1/16) */
    moments(x, n, &mu, &sd, &amax);
    assert_true(fabs(sd - 0.25) < 0.03);
    x = param(m, "encoder.layers.encoder_layer_0.self_attention.in_proj_weight", &n);
    moments(x, n, &mu, &sd, &amax);
    double bound = sqrt(6.0 / (24 + 72));
    assert_true(amax <= bound && amax > 0.9 * bound);
    assert_true(fabs(sd - bound / sqrt(3.0)) < 0.1 * bound);
    x = param(m, "encoder.layers.encoder_layer_0.mlp.0.bias", &n);
    moments(x, n, &mu, &sd, &amax);
    assert_true(amax > 0 && amax < 1e-5);
    /* Same seed, same weights; another seed, others. */
    vitc_vit *m2 = NULL, *m3 = NULL;
    assert_int_equal(vitc_vit_create(&c, 7, &m2), VITC_OK);
    assert_int_equal(vitc_vit_create(&c, 8, &m3), VITC_OK);
    size_t n2;
    const float *a = param(m, "encoder.pos_embedding", &n), *b = param(m2, "encoder.pos_embedding", &n2);
    assert_memory_equal(a, b, n * sizeof(float));
    b = param(m3, "encoder.pos_embedding", &n2);
    assert_true(memcmp(a, b, n * sizeof(float)) != 0);
    vitc_vit_free(m);
    vitc_vit_free(m2);
    vitc_vit_free(m3);
}

/* The paramset: every table row inside [0, n), non-overlapping, in order,
 * the optimizer's view of the same floats vitc_vit_param hands out; the id
 * dies with the model. */
static void test_paramset(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_create(&c, 1, &m), VITC_OK);
    vitc__paramset ps;
    assert_int_equal(vitc__vit_paramset(m, 0, &ps), VITC_OK);
    assert_null(ps.grad);
    assert_int_equal(ps.nseg, vitc_vit_num_params(m));
    assert_int_equal(vitc__vit_paramset(m, 1, &ps), VITC_OK);
    assert_non_null(ps.grad);
    size_t end = 0;
    for (int i = 0; i < ps.nseg; i++) {
        const char *name;
        float *data, *grad;
        assert_int_equal(vitc_vit_param(m, i, &name, NULL, NULL, &data, &grad), VITC_OK);
        assert_string_equal(name, ps.seg[i].name);
        assert_ptr_equal(data, ps.param + ps.seg[i].offset);
        assert_ptr_equal(grad, ps.grad + ps.seg[i].offset);
        assert_true(ps.seg[i].offset >= end);
        end = ps.seg[i].offset + ps.seg[i].numel;
        for (size_t j = 0; j < ps.seg[i].numel; j++) assert_true(grad[j] == 0.0f);
        int expect_nd = ps.seg[i].ndim == 1 || strstr(name, "class_token") ||
                        strstr(name, "pos_embedding");
        assert_int_equal(ps.seg[i].no_decay, expect_nd);
    }
    assert_true(end <= ps.n);
    uint64_t id = ps.owner_id;
    assert_true(vitc__handle_alive(id));
    vitc_vit_free(m);
    assert_false(vitc__handle_alive(id));
}

/* save -> load: the same tensors, the same logits, the config back. */
static void test_save_load(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL, *r = NULL;
    assert_int_equal(vitc_vit_create(&c, 3, &m), VITC_OK);
    /* Non-zero head so the logits say something. */
    size_t n;
    float *hw = (float *)param(m, "heads.head.weight", &n);
    for (size_t i = 0; i < n; i++) hw[i] = (float)((int)(i % 7) - 3) * 0.05f;
    char path[] = "/tmp/vitc_test_vit_train_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(vitc_vit_save(m, path), VITC_OK);
    assert_int_equal(vitc_vit_load(path, NULL, &r), VITC_OK);
    unlink(path);
    const vitc_vit_config *rc = vitc_vit_get_config(r);
    assert_int_equal(rc->in_channels, 1);
    assert_int_equal(rc->num_heads, 4);
    assert_true(rc->std[0] == 0.25f);
    assert_int_equal(vitc_vit_num_params(r), vitc_vit_num_params(m));
    for (int i = 0; i < vitc_vit_num_params(m); i++) {
        const char *na, *nb;
        float *a, *b;
        int nd;
        const int64_t *sh;
        assert_int_equal(vitc_vit_param(m, i, &na, &nd, &sh, &a, NULL), VITC_OK);
        assert_int_equal(vitc_vit_param(r, i, &nb, NULL, NULL, &b, NULL), VITC_OK);
        assert_string_equal(na, nb);
        size_t k = 1;
        for (int d = 0; d < nd; d++) k *= (size_t)sh[d];
        assert_memory_equal(a, b, k * sizeof(float));
    }
    float img[2 * 28 * 28], la[20], lb[20];
    for (int i = 0; i < 2 * 28 * 28; i++) img[i] = sinf(0.37f * (float)i);
    assert_int_equal(vitc_vit_forward(m, img, 2, 28, 28, la), VITC_OK);
    assert_int_equal(vitc_vit_forward(r, img, 2, 28, 28, lb), VITC_OK);
    assert_memory_equal(la, lb, sizeof la);
    /* The loaded model's flat view covers its (adopted) tensors too. */
    vitc__paramset ps;
    assert_int_equal(vitc__vit_paramset(r, 1, &ps), VITC_OK);
    for (int i = 0; i < ps.nseg; i++) assert_true(ps.seg[i].offset + ps.seg[i].numel <= ps.n);
    vitc_vit_free(m);
    vitc_vit_free(r);
}

static void test_bad_args(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL;
    c.num_heads = 5; /* 24 % 5 */
    assert_int_equal(vitc_vit_create(&c, 0, &m), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "num_heads"));
    assert_null(m);
    assert_int_equal(vitc_vit_create(NULL, 0, &m), VITC_ERR_INVALID_ARG);
    c = small_config();
    assert_int_equal(vitc_vit_create(&c, 0, &m), VITC_OK);
    assert_int_equal(vitc_vit_param(m, 99, NULL, NULL, NULL, NULL, NULL), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_find_param(m, "nope"), -1);
    assert_int_equal(vitc_vit_save(m, "/nonexistent-dir/x.safetensors"), VITC_ERR_IO);
    vitc_vit_free(m);
}

/* backward: refused without a recorded training forward, after an eval
 * forward, and a second time on one recording; gradients accumulate. */
static void test_backward_errors(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_create(&c, 2, &m), VITC_OK);
    float img[3 * 28 * 28], logits[30], dl[30];
    for (int i = 0; i < 3 * 28 * 28; i++) img[i] = cosf(0.11f * (float)i);
    for (int i = 0; i < 30; i++) dl[i] = 0.1f * (float)(i % 4) - 0.1f;
    assert_int_equal(vitc_vit_backward(m, dl), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "no recorded forward"));
    assert_int_equal(vitc_vit_forward(m, img, 3, 28, 28, logits), VITC_OK); /* eval */
    assert_int_equal(vitc_vit_backward(m, dl), VITC_ERR_INVALID_ARG);
    vitc_vit_set_training(m, 1);
    assert_int_equal(vitc_vit_forward(m, img, 3, 28, 28, logits), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, NULL), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_backward(m, dl), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, dl), VITC_ERR_INVALID_ARG);
    /* head.bias gradient = column sums of dlogits, accumulated twice. */
    assert_int_equal(vitc_vit_forward(m, img, 3, 28, 28, logits), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, dl), VITC_OK);
    float *g;
    assert_int_equal(vitc_vit_param(m, vitc_vit_find_param(m, "heads.head.bias"), NULL, NULL,
                                    NULL, NULL, &g), VITC_OK);
    for (int j = 0; j < 10; j++) {
        double want = 2.0 * ((double)dl[j] + dl[10 + j] + dl[20 + j]);
        assert_true(fabs(g[j] - want) < 1e-6);
    }
    assert_int_equal(vitc_vit_zero_grad(m), VITC_OK);
    assert_true(g[0] == 0.0f);
    assert_int_equal(vitc_vit_set_dropout(m, 0.1f, 0.2f, 0.0f), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_dropout(m, 1.0f, 0.0f, 0.0f), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_dropout(m, 0.1f, 0.0f, 0.2f), VITC_OK);
    assert_int_equal(vitc_vit_forward(m, img, 3, 28, 28, logits), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, dl), VITC_OK);
    vitc_vit_free(m);
}

/* Layers: the optimizer's view skips BatchNorm's running statistics. */
static void test_layer_paramset(void **state) {
    (void)state;
    vitc_layer_config cfg = vitc_layer_default_config(VITC_SELF_ATTENTION_BATCH);
    cfg.in_channels = 16;
    vitc_layer *l = NULL;
    assert_int_equal(vitc_layer_create(&cfg, &l), VITC_OK);
    vitc__paramset ps;
    assert_int_equal(vitc__layer_paramset(l, 1, &ps), VITC_OK);
    assert_int_equal(ps.nseg, vitc_layer_num_params(l) - 2);
    for (int i = 0; i < ps.nseg; i++) {
        assert_null(strstr(ps.seg[i].name, "running"));
        assert_true(ps.seg[i].offset + ps.seg[i].numel <= ps.n);
    }
    uint64_t id = ps.owner_id;
    assert_true(vitc__handle_alive(id));
    vitc_layer_free(l);
    assert_false(vitc__handle_alive(id));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_init), cmocka_unit_test(test_paramset),
        cmocka_unit_test(test_save_load),   cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_layer_paramset), cmocka_unit_test(test_backward_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
