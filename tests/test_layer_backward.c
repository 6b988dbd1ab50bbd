/* test_layer_backward.c — the layer training API through vitc.h: every
 * preset's input gradient against a central difference of its own forward
 * (in double around float32 evaluations, along a random direction), gradient
 * accumulation and zero_grad, gradients by name and alias, scratch reuse
 * across input sizes, and the errors.
 * (Parity with torch autograd is tests/python/test_layer_grads.py.) */
#include <math.h>
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

static uint64_t rng = 0x853C49E6748FEA9Bull;
static double drand(void) {
    return tu_drand(&rng);
}
static void fill(float *a, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) a[i] = (float)((2.0 * drand() - 1.0) * scale);
}
static size_t numel(int nd, const int64_t *s) {
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)s[i];
    return n;
}

/* sum(dy * layer(x)) in double. */
static double loss(vitc_layer *l, const float *x, int nd, const int64_t *shape, const float *dy,
                   float *y, size_t ny) {
    assert_int_equal(vitc_layer_forward(l, x, nd, shape, y), VITC_OK);
    double s = 0.0;
    for (size_t i = 0; i < ny; i++) s += (double)dy[i] * y[i];
    return s;
}

static void check_kind(vitc_layer_config cfg, int nd, const int64_t *shape) {
    vitc_layer *l;
    assert_int_equal(vitc_layer_create(&cfg, &l), VITC_OK);
    assert_int_equal(vitc_layer_reset_parameters(l, 11), VITC_OK);
    /* ConvSA's gamma starts at 0, which would hide the attention branch. */
    float *g;
    if (vitc_layer_grad(l, "gamma", NULL, NULL, &g) == VITC_OK) {
        for (int i = 0; i < vitc_layer_num_params(l); i++) {
            const char *name;
            float *d;
            vitc_layer_param(l, i, &name, NULL, NULL, &d);
            if (strcmp(name, "gamma") == 0) d[0] = 0.7f;
        }
    }
    int ond;
    int64_t os[8];
    assert_int_equal(vitc_layer_output_shape(l, nd, shape, &ond, os), VITC_OK);
    size_t nx = numel(nd, shape), ny = numel(ond, os);
    float *x = malloc(nx * sizeof *x), *u = malloc(nx * sizeof *u), *xp = malloc(nx * sizeof *x);
    float *dy = malloc(ny * sizeof *dy), *y = malloc(ny * sizeof *y), *dx = malloc(nx * sizeof *dx);
    fill(x, nx, 1.0);
    fill(u, nx, 1.0);
    fill(dy, ny, 1.0);
    loss(l, x, nd, shape, dy, y, ny);
    assert_int_equal(vitc_layer_backward(l, dy, ond, os, dx), VITC_OK);
    double ana = 0.0, h = 1e-2;
    for (size_t i = 0; i < nx; i++) ana += (double)dx[i] * u[i];
    for (size_t i = 0; i < nx; i++) xp[i] = (float)(x[i] + h * u[i]);
    double lp = loss(l, xp, nd, shape, dy, y, ny);
    for (size_t i = 0; i < nx; i++) xp[i] = (float)(x[i] - h * u[i]);
    double lm = loss(l, xp, nd, shape, dy, y, ny);
    double num = (lp - lm) / (2 * h);
    if (!(fabs(num - ana) <= 2e-3 * fmax(1.0, fabs(num)))) {
        fprintf(stderr, "kind %d: <dx, u> = %.7g, central difference %.7g\n", cfg.kind, ana, num);
        fail();
    }
    vitc_layer_free(l);
    free(x), free(u), free(xp), free(dy), free(y), free(dx);
}

static void test_every_kind_matches_differences(void **state) {
    (void)state;
    vitc_layer_config c;
    c = vitc_layer_default_config(VITC_ATTENTION_BLOCK);
    c.in_channels = 2, c.patch_size = 2, c.embed_dim = 8, c.num_heads = 2;
    check_kind(c, 4, (int64_t[]){2, 2, 4, 6});
    c = vitc_layer_default_config(VITC_CONV_SA_BLOCK);
    c.in_channels = 16;
    check_kind(c, 4, (int64_t[]){3, 16, 2, 3});
    c = vitc_layer_default_config(VITC_SELF_ATTENTION_GROUP);
    c.in_channels = 6;
    check_kind(c, 4, (int64_t[]){2, 6, 3, 1});
    c = vitc_layer_default_config(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 6;
    check_kind(c, 4, (int64_t[]){3, 6, 2, 2});
    c = vitc_layer_default_config(VITC_SELF_ATTENTION_MULTIHEAD);
    c.in_channels = 6, c.num_heads = 3;
    check_kind(c, 4, (int64_t[]){2, 6, 1, 3});
    c = vitc_layer_default_config(VITC_T2T_ATTENTION);
    c.in_channels = 5, c.embed_dim = 6, c.num_heads = 2, c.bias = 1;
    check_kind(c, 3, (int64_t[]){2, 4, 5});
    c = vitc_layer_default_config(VITC_SINGLE_HEAD_ATTENTION);
    c.in_channels = 5, c.embed_dim = 3;
    check_kind(c, 3, (int64_t[]){1, 7, 5});
    c = vitc_layer_default_config(VITC_MULTIHEAD_ATTENTION); /* self-attention: dq + dk + dv */
    c.embed_dim = 8, c.num_heads = 2, c.add_bias_kv = 1;
    check_kind(c, 3, (int64_t[]){5, 2, 8});
}

static void test_accumulate_zero_grad_names(void **state) {
    (void)state;
    vitc_layer_config c = vitc_layer_default_config(VITC_SELF_ATTENTION_GROUP);
    c.in_channels = 4;
    vitc_layer *l;
    assert_int_equal(vitc_layer_create(&c, &l), VITC_OK);
    int64_t shape[] = {2, 4, 3, 2};
    float x[48], y[48], dy[48], dx[48];
    fill(x, 48, 1.0);
    fill(dy, 48, 1.0);
    assert_int_equal(vitc_layer_forward(l, x, 4, shape, y), VITC_OK);
    int nd;
    const int64_t *s;
    float *gq, *galias, once[16];
    assert_int_equal(vitc_layer_grad(l, "q.weight", &nd, &s, &gq), VITC_OK);
    assert_int_equal(nd, 2);
    assert_int_equal(s[0], 4);
    for (int i = 0; i < 16; i++) assert_true(gq[i] == 0.0f); /* zeros before any backward */
    assert_int_equal(vitc_layer_backward(l, dy, 4, shape, dx), VITC_OK);
    memcpy(once, gq, sizeof once);
    assert_int_equal(vitc_layer_backward(l, dy, 4, shape, dx), VITC_OK);
    double nz = 0.0;
    for (int i = 0; i < 16; i++) {
        assert_true(fabsf(gq[i] - 2.0f * once[i]) <= 1e-6f * (1.0f + fabsf(once[i])));
        nz += fabs(once[i]);
    }
    assert_true(nz > 0.0);
    assert_int_equal(vitc_layer_grad(l, "query.weight", NULL, NULL, &galias), VITC_OK);
    assert_ptr_equal(galias, gq);
    assert_int_equal(vitc_layer_zero_grad(l), VITC_OK);
    for (int i = 0; i < 16; i++) assert_true(gq[i] == 0.0f);
    assert_int_equal(vitc_layer_grad(l, "nope", NULL, NULL, &galias), VITC_ERR_KEY);
    vitc_layer_free(l);

    c = vitc_layer_default_config(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 4;
    assert_int_equal(vitc_layer_create(&c, &l), VITC_OK);
    assert_int_equal(vitc_layer_grad(l, "norm.running_mean", NULL, NULL, &galias), VITC_ERR_KEY);
    assert_non_null(strstr(vitc_last_error(), "buffer"));
    vitc_layer_free(l);
}

/* One training step (forward, backward) on x; dx and every gradient into
 * out (dx first, then the gradients in table order); returns the count. */
static size_t step(vitc_layer *l, const float *x, int nd, const int64_t *shape, const float *dy,
                   float *out) {
    int ond;
    int64_t os[8];
    assert_int_equal(vitc_layer_output_shape(l, nd, shape, &ond, os), VITC_OK);
    float *y = malloc(numel(ond, os) * sizeof *y);
    assert_int_equal(vitc_layer_zero_grad(l), VITC_OK);
    assert_int_equal(vitc_layer_forward(l, x, nd, shape, y), VITC_OK);
    assert_int_equal(vitc_layer_backward(l, dy, ond, os, out), VITC_OK);
    size_t n = numel(nd, shape);
    for (int i = 0; i < vitc_layer_num_params(l); i++) {
        const char *name;
        int gnd;
        const int64_t *gs;
        float *g;
        vitc_layer_param(l, i, &name, NULL, NULL, NULL);
        if (vitc_layer_grad(l, name, &gnd, &gs, &g) != VITC_OK)
            continue; /* a buffer */
        memcpy(out + n, g, numel(gnd, gs) * sizeof *g);
        n += numel(gnd, gs);
    }
    free(y);
    return n;
}

/* A layer whose scratch a larger input grew (forward, backward and
 * MultiheadAttention's self-attention backward each keep theirs) gives the
 * same bits on a smaller input as a fresh layer. */
static void check_reused_scratch(vitc_layer_config cfg, int nd, const int64_t *big,
                                 const int64_t *small) {
    vitc_layer *a, *b;
    assert_int_equal(vitc_layer_create(&cfg, &a), VITC_OK);
    assert_int_equal(vitc_layer_create(&cfg, &b), VITC_OK);
    assert_int_equal(vitc_layer_reset_parameters(a, 5), VITC_OK);
    assert_int_equal(vitc_layer_reset_parameters(b, 5), VITC_OK);
    size_t nb = numel(nd, big), ns = numel(nd, small), cap = nb + 4096;
    float *xb = malloc(nb * sizeof *xb), *xs = malloc(ns * sizeof *xs);
    float *dyb = malloc(4 * nb * sizeof *dyb), *dys = malloc(4 * ns * sizeof *dys);
    float *ra = calloc(cap, sizeof *ra), *rb = calloc(cap, sizeof *rb);
    fill(xb, nb, 1.0);
    fill(dyb, 4 * nb, 1.0);
    fill(xs, ns, 1.0);
    fill(dys, 4 * ns, 1.0);
    step(a, xb, nd, big, dyb, ra);
    size_t n = step(a, xs, nd, small, dys, ra);
    assert_int_equal(step(b, xs, nd, small, dys, rb), n);
    assert_true(n < cap);
    assert_memory_equal(ra, rb, n * sizeof *ra);
    vitc_layer_free(a);
    vitc_layer_free(b);
    free(xb), free(xs), free(dyb), free(dys), free(ra), free(rb);
}

static void test_reused_scratch(void **state) {
    (void)state;
    vitc_layer_config c = vitc_layer_default_config(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 8, c.num_heads = 2, c.add_bias_kv = 1;
    check_reused_scratch(c, 3, (int64_t[]){7, 3, 8}, (int64_t[]){4, 2, 8});
    c.add_bias_kv = 0, c.batch_first = 1;
    check_reused_scratch(c, 3, (int64_t[]){3, 7, 8}, (int64_t[]){2, 4, 8});
    c = vitc_layer_default_config(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 6;
    check_reused_scratch(c, 4, (int64_t[]){3, 6, 3, 3}, (int64_t[]){2, 6, 2, 2});
    c = vitc_layer_default_config(VITC_T2T_ATTENTION);
    c.in_channels = 5, c.embed_dim = 6, c.num_heads = 2, c.bias = 1;
    check_reused_scratch(c, 3, (int64_t[]){3, 6, 5}, (int64_t[]){2, 4, 5});
}

static void test_errors(void **state) {
    (void)state;
    vitc_layer_config c = vitc_layer_default_config(VITC_T2T_ATTENTION);
    c.in_channels = 4, c.embed_dim = 6, c.num_heads = 2;
    vitc_layer *l;
    assert_int_equal(vitc_layer_create(&c, &l), VITC_OK);
    int64_t xs[] = {2, 3, 4}, ys[] = {2, 3, 6}, bad[] = {2, 3, 5};
    float x[24], y[36], dy[36], dx[24];
    fill(x, 24, 1.0);
    fill(dy, 36, 1.0);
    assert_int_equal(vitc_layer_backward(l, dy, 3, ys, dx), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "training-mode forward"));
    assert_int_equal(vitc_layer_forward(l, x, 3, xs, y), VITC_OK);
    assert_int_equal(vitc_layer_backward(l, dy, 3, bad, dx), VITC_ERR_SHAPE);
    assert_non_null(strstr(vitc_last_error(), "dy has shape [2, 3, 5]"));
    assert_int_equal(vitc_layer_backward(l, dy, 2, ys, dx), VITC_ERR_SHAPE);
    assert_int_equal(vitc_layer_backward(l, NULL, 3, ys, dx), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_layer_backward(l, dy, 3, ys, dx), VITC_OK);
    vitc_layer_set_training(l, 0);
    assert_int_equal(vitc_layer_forward(l, x, 3, xs, y), VITC_OK);
    assert_int_equal(vitc_layer_backward(l, dy, 3, ys, dx), VITC_ERR_INVALID_ARG);
    /* a failed forward leaves nothing recorded either */
    vitc_layer_set_training(l, 1);
    assert_int_equal(vitc_layer_forward(l, x, 3, xs, y), VITC_OK);
    assert_int_equal(vitc_layer_forward(l, x, 3, bad, y), VITC_ERR_SHAPE);
    assert_int_equal(vitc_layer_backward(l, dy, 3, ys, dx), VITC_ERR_INVALID_ARG);
    vitc_layer_free(l);

    c = vitc_layer_default_config(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 4, c.num_heads = 2, c.dropout = 1.5f;
    assert_int_equal(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_matches_differences),
        cmocka_unit_test(test_accumulate_zero_grad_names),
        cmocka_unit_test(test_reused_scratch),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
