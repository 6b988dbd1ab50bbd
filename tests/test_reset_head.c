/*
 * test_reset_head.c — vitc_vit_reset_head on a loaded model whose weights
 * live in the file's mapped arena (the router adopts it): the head is
 * replaced, every other tensor kept bit for bit, the old arena freed (run
 * under ASan by `make asan`), the result saved and read back with the same
 * logits and labels; bad arguments change nothing. The families' layouts
 * against torch are in tests/python/test_reset_head.py.
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

#include "vitc.h"

static vitc_vit_config small_config(void) {
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 16;
    c.patch_size = 4;
    c.in_channels = 3;
    c.hidden_dim = 24;
    c.depth = 2;
    c.num_heads = 4;
    c.mlp_dim = 40;
    c.num_classes = 10;
    return c;
}

static float *param(vitc_vit *m, const char *name, size_t *numel) {
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

static void tmp_path(char *path) {
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

static void test_reset_saved_and_loaded(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL, *r = NULL, *r2 = NULL;
    assert_int_equal(vitc_vit_create(&c, 3, &m), VITC_OK);
    char path[] = "/tmp/vitc_test_reset_head_XXXXXX";
    tmp_path(path);
    assert_int_equal(vitc_vit_save(m, path), VITC_OK);
    assert_int_equal(vitc_vit_load(path, NULL, &r), VITC_OK); /* weights in the file's arena */
    size_t n, n0;
    float *qkv0 = param(m, "encoder.layers.encoder_layer_1.self_attention.in_proj_weight", &n0);
    const char *labels[3] = {"cat", "dog", NULL};
    assert_int_equal(vitc_vit_reset_head(r, 3, labels, 11), VITC_OK);
    assert_int_equal(vitc_vit_get_config(r)->num_classes, 3);
    assert_string_equal(vitc_vit_label(r, 1), "dog");
    assert_string_equal(vitc_vit_label(r, 2), "");
    assert_null(vitc_vit_label(r, 3));
    float *qkv = param(r, "encoder.layers.encoder_layer_1.self_attention.in_proj_weight", &n);
    assert_int_equal(n, n0);
    assert_memory_equal(qkv, qkv0, n * sizeof(float));
    /* torchvision's head: zeros, [3, C] */
    float *hw = param(r, "heads.head.weight", &n);
    assert_int_equal(n, 3 * 24);
    for (size_t i = 0; i < n; i++) assert_true(hw[i] == 0.0f);
    for (size_t i = 0; i < n; i++) hw[i] = (float)((int)(i % 5) - 2) * 0.1f;
    float img[2 * 3 * 16 * 16], la[6], lb[6];
    for (size_t i = 0; i < sizeof img / sizeof *img; i++) img[i] = sinf(0.29f * (float)i);
    assert_int_equal(vitc_vit_forward(r, img, 2, 16, 16, la), VITC_OK);
    char path2[] = "/tmp/vitc_test_reset_head_XXXXXX";
    tmp_path(path2);
    assert_int_equal(vitc_vit_save(r, path2), VITC_OK);
    assert_int_equal(vitc_vit_load(path2, NULL, &r2), VITC_OK);
    unlink(path);
    unlink(path2);
    assert_int_equal(vitc_vit_get_config(r2)->num_classes, 3);
    assert_string_equal(vitc_vit_label(r2, 0), "cat");
    assert_int_equal(vitc_vit_forward(r2, img, 2, 16, 16, lb), VITC_OK);
    assert_memory_equal(la, lb, sizeof la);
    vitc_vit_free(m);
    vitc_vit_free(r);
    vitc_vit_free(r2);
}

static void test_reset_bad_args(void **state) {
    (void)state;
    vitc_vit_config c = small_config();
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_reset_head(NULL, 3, NULL, 0), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_create(&c, 3, &m), VITC_OK);
    assert_int_equal(vitc_vit_reset_head(m, 0, NULL, 0), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "num_classes 0"));
    assert_int_equal(vitc_vit_get_config(m)->num_classes, 10);
    /* twice in a row, the second from the first's table */
    assert_int_equal(vitc_vit_reset_head(m, 4, NULL, 1), VITC_OK);
    assert_int_equal(vitc_vit_reset_head(m, 2, NULL, 1), VITC_OK);
    assert_int_equal(vitc_vit_get_config(m)->num_classes, 2);
    assert_null(vitc_vit_label(m, 0));
    vitc_vit_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reset_saved_and_loaded),
        cmocka_unit_test(test_reset_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
