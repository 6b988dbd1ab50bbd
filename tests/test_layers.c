/*
 * test_layers.c — every attention layer against tensors PyTorch wrote
 * (tests/reference/gen_layers.py -> tests/reference/layers/NAME.safetensors),
 * through the public API only, and the error paths: bad configurations,
 * missing / unexpected / mis-shaped weights, bad input and mask shapes.
 *
 * Tolerance (the project's): max|vitc - torch| <= 1e-5 * max(1, max|torch|).
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

#include "testutil.h"

/* ---- helpers -------------------------------------------------------- */

static vitc_safetensors *load_ref(const char *name) {
    char p[512];
    const char *dirs[] = {"tests/reference/layers", "../tests/reference/layers",
                          "../../tests/reference/layers"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s.safetensors", dirs[i], name);
        if (access(p, R_OK) == 0) {
            vitc_safetensors *st = NULL;
            if (vitc_safetensors_load(p, &st) != VITC_OK)
                fail_msg("%s: %s", p, vitc_last_error());
            return st;
        }
    }
    fail_msg("reference %s not found (run from the repository root)", name);
    return NULL;
}

typedef struct ref_tensor {
    const float *data;
    int ndim;
    const int64_t *shape;
    size_t n;
} ref_tensor;

static ref_tensor get(const vitc_safetensors *st, const char *name) {
    ref_tensor t = {0};
    const char *nm, *dt;
    int i = vitc_safetensors_find(st, name);
    if (i < 0)
        fail_msg("reference tensor %s missing", name);
    assert_int_equal(vitc_safetensors_tensor(st, i, &nm, &dt, &t.ndim, &t.shape, &t.data), VITC_OK);
    t.n = 1;
    for (int d = 0; d < t.ndim; d++) t.n *= (size_t)t.shape[d];
    return t;
}

/* max|got - want| <= 1e-5 * max(1, max|want|), NaN where want is NaN. */
static void assert_close(const float *got, const ref_tensor *want, const char *what) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < want->n; i++)
        if (!isnan(want->data[i]) && fabs(want->data[i]) > mx) mx = fabs(want->data[i]);
    for (size_t i = 0; i < want->n; i++) {
        if (isnan(want->data[i]) != isnan(got[i]))
            fail_msg("%s: NaN mismatch at %zu (got %g, want %g)", what, i, got[i], want->data[i]);
        if (!isnan(want->data[i]) && fabs(got[i] - want->data[i]) > err)
            err = fabs(got[i] - want->data[i]);
    }
    if (err > 1e-5 * mx)
        fail_msg("%s: max error %g > %g", what, err, 1e-5 * mx);
}

static vitc_layer *make(vitc_layer_config cfg, const vitc_safetensors *st) {
    vitc_layer *l = NULL;
    if (vitc_layer_create(&cfg, &l) != VITC_OK)
        fail_msg("create: %s", vitc_last_error());
    if (st && vitc_layer_load_safetensors(l, st, "block.", 1) != VITC_OK)
        fail_msg("load: %s", vitc_last_error());
    return l;
}

/* Forward on the file's x, compared with the tensor named want. */
static void run_and_compare(vitc_layer *l, const vitc_safetensors *st, const char *want,
                            const char *what) {
    ref_tensor x = get(st, "x"), y = get(st, want);
    int ond;
    int64_t os[8];
    assert_int_equal(vitc_layer_output_shape(l, x.ndim, x.shape, &ond, os), VITC_OK);
    assert_int_equal(ond, y.ndim);
    for (int d = 0; d < ond; d++) assert_int_equal(os[d], y.shape[d]);
    float *out = malloc(y.n * sizeof(float));
    assert_non_null(out);
    if (vitc_layer_forward(l, x.data, x.ndim, x.shape, out) != VITC_OK)
        fail_msg("%s: forward: %s", what, vitc_last_error());
    assert_close(out, &y, what);
    free(out);
}

static void check_case(const char *file, vitc_layer_config cfg) {
    vitc_safetensors *st = load_ref(file);
    vitc_layer *l = make(cfg, st);
    vitc_layer_set_training(l, 0);
    run_and_compare(l, st, "y", file);
    /* A second run reuses the sized scratch and must give the same numbers. */
    run_and_compare(l, st, "y", file);
    vitc_layer_free(l);
    vitc_safetensors_free(st);
}

static vitc_layer_config cfg_of(vitc_layer_kind kind) { return vitc_layer_default_config(kind); }

static void expect_error(vitc_status got, vitc_status want, const char *needle) {
    if (got != want)
        fail_msg("status %d (%s), expected %d; message: %s", got, vitc_status_str(got), want,
                 vitc_last_error());
    if (needle) tu_assert_message_has(needle);
}

/* ---- parity with PyTorch ------------------------------------------------ */

static void test_attention_block(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_ATTENTION_BLOCK);
    c.in_channels = 3; c.patch_size = 4; c.embed_dim = 16; c.num_heads = 1;
    check_case("attention_block", c);
    c.patch_size = 2; c.embed_dim = 12; c.num_heads = 3;
    check_case("attention_block_heads", c);
}

static void test_conv_sa(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_CONV_SA_BLOCK);
    c.in_channels = 16;
    check_case("conv_sa", c);
}

static void test_self_attention_group(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_SELF_ATTENTION_GROUP);
    c.in_channels = 8;
    check_case("sa_group", c);
}

static void test_t2t(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_T2T_ATTENTION);
    c.in_channels = 10; c.embed_dim = 12; c.num_heads = 3; c.bias = 1;
    check_case("t2t", c);
    c = cfg_of(VITC_T2T_ATTENTION);
    c.in_channels = 49; c.embed_dim = 64; c.num_heads = 4;
    check_case("t2t_seed", c);
}

static void test_single_head(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_SINGLE_HEAD_ATTENTION);
    c.in_channels = 20; c.embed_dim = 7;
    check_case("single_head", c);
}

/* Training step (batch statistics, running stats updated as torch does),
 * then eval with the updated running statistics. */
static void batch_case(const char *file, vitc_layer_config c) {
    vitc_safetensors *st = load_ref(file);
    vitc_layer *l = make(c, st);
    assert_int_equal(vitc_layer_is_training(l), 1);
    run_and_compare(l, st, "y_train", file);
    for (int i = 0; i < vitc_layer_num_params(l); i++) {
        const char *name;
        float *data;
        char key[96];
        assert_int_equal(vitc_layer_param(l, i, &name, NULL, NULL, &data), VITC_OK);
        if (!strstr(name, "running"))
            continue;
        snprintf(key, sizeof key, "after.%s", name);
        ref_tensor want = get(st, key);
        assert_close(data, &want, key);
    }
    vitc_layer_set_training(l, 0);
    run_and_compare(l, st, "y_eval", file);
    vitc_layer_free(l);
    vitc_safetensors_free(st);
}

static void test_self_attention_batch(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 8;
    batch_case("sa_batch", c);
    c = cfg_of(VITC_SELF_ATTENTION_MULTIHEAD);
    c.in_channels = 12; c.num_heads = 3;
    batch_case("sa_multihead", c);
}

static vitc_tensor_view view(const ref_tensor *t) {
    vitc_tensor_view v;
    memset(&v, 0, sizeof v);
    v.data = t->data;
    v.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) v.shape[d] = t->shape[d];
    return v;
}

/* A 0/1 float mask from the file as the uint8 the API takes. */
static uint8_t *bool_mask(const ref_tensor *t) {
    uint8_t *m = malloc(t->n);
    assert_non_null(m);
    for (size_t i = 0; i < t->n; i++) m[i] = t->data[i] != 0.0f;
    return m;
}

static void test_mha(void **state) {
    (void)state;
    vitc_safetensors *st = load_ref("mha");
    vitc_layer_config c = cfg_of(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 16; c.num_heads = 4;
    vitc_layer *l = make(c, st);
    ref_tensor q = get(st, "q"), k = get(st, "k"), v = get(st, "v"), kpm = get(st, "kpm"),
               am = get(st, "am"), y = get(st, "y"), wa = get(st, "w_avg"), wh = get(st, "w_heads"),
               ys = get(st, "y_self");
    uint8_t *kb = bool_mask(&kpm);
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    a.query = view(&q); a.key = view(&k); a.value = view(&v);
    a.key_padding_mask = view(&kpm); a.key_padding_mask.data = kb;
    a.key_padding_mask_type = VITC_MASK_BOOL;
    a.attn_mask = view(&am); a.attn_mask_type = VITC_MASK_FLOAT;
    a.need_weights = 1; a.average_attn_weights = 1;
    int ond, wnd;
    int64_t os[8], ws[8];
    assert_int_equal(vitc_mha_output_shapes(l, &a, &ond, os, &wnd, ws), VITC_OK);
    assert_int_equal(wnd, 3);
    assert_int_equal(ws[0], 3); assert_int_equal(ws[1], 5); assert_int_equal(ws[2], 7);
    float *out = malloc(y.n * sizeof(float)), *w = malloc(wh.n * sizeof(float));
    assert_int_equal(vitc_mha_forward(l, &a, out, w), VITC_OK);
    assert_close(out, &y, "mha out");
    assert_close(w, &wa, "mha averaged weights");
    a.average_attn_weights = 0;
    assert_int_equal(vitc_mha_output_shapes(l, &a, &ond, os, &wnd, ws), VITC_OK);
    assert_int_equal(wnd, 4);
    assert_int_equal(ws[1], 4);
    assert_int_equal(vitc_mha_forward(l, &a, out, w), VITC_OK);
    assert_close(w, &wh, "mha per-head weights");
    /* Self-attention through the generic forward (query = key = value). */
    assert_int_equal(vitc_layer_forward(l, q.data, q.ndim, q.shape, out), VITC_OK);
    assert_close(out, &ys, "mha self-attention");
    free(out); free(w); free(kb);
    vitc_layer_free(l);
    vitc_safetensors_free(st);

    st = load_ref("mha_kv");
    c = cfg_of(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 8; c.num_heads = 2; c.bias = 0; c.kdim = 5; c.vdim = 6; c.batch_first = 1;
    l = make(c, st);
    q = get(st, "q"); k = get(st, "k"); v = get(st, "v"); am = get(st, "am");
    y = get(st, "y"); wa = get(st, "w_avg");
    uint8_t *ab = bool_mask(&am);
    memset(&a, 0, sizeof a);
    a.query = view(&q); a.key = view(&k); a.value = view(&v);
    a.attn_mask = view(&am); a.attn_mask.data = ab; a.attn_mask_type = VITC_MASK_BOOL;
    a.need_weights = 1; a.average_attn_weights = 1;
    out = malloc(y.n * sizeof(float));
    w = malloc(wa.n * sizeof(float));
    assert_int_equal(vitc_mha_forward(l, &a, out, w), VITC_OK);
    assert_close(out, &y, "mha kdim/vdim out");
    assert_close(w, &wa, "mha kdim/vdim weights");
    /* No self-attention form when kdim != embed_dim. */
    expect_error(vitc_layer_forward(l, q.data, q.ndim, q.shape, out), VITC_ERR_INVALID_ARG,
                 "kdim 5 != embed_dim 8");
    free(out); free(w); free(ab);
    vitc_layer_free(l);
    vitc_safetensors_free(st);
}

static void test_sdpa(void **state) {
    (void)state;
    vitc_safetensors *st = load_ref("sdpa");
    ref_tensor q = get(st, "q"), k = get(st, "k"), v = get(st, "v"), mb = get(st, "mask_bool"),
               mf = get(st, "mask_float");
    vitc_tensor_view vq = view(&q), vk = view(&k), vv = view(&v), vb = view(&mb), vf = view(&mf);
    ref_tensor y = get(st, "y"), yb = get(st, "y_bool"), yf = get(st, "y_float"), ysc = get(st, "y_scale");
    uint8_t *b = bool_mask(&mb);
    vb.data = b;
    float *out = malloc(y.n * sizeof(float));
    assert_int_equal(vitc_sdpa(&vq, &vk, &vv, NULL, VITC_MASK_NONE, 0.0f, out), VITC_OK);
    assert_close(out, &y, "sdpa");
    assert_int_equal(vitc_sdpa(&vq, &vk, &vv, &vb, VITC_MASK_BOOL, 0.0f, out), VITC_OK);
    assert_close(out, &yb, "sdpa bool mask [3,1,6]");
    assert_int_equal(vitc_sdpa(&vq, &vk, &vv, &vf, VITC_MASK_FLOAT, 0.0f, out), VITC_OK);
    assert_close(out, &yf, "sdpa float mask [5,6]");
    assert_int_equal(vitc_sdpa(&vq, &vk, &vv, NULL, VITC_MASK_NONE, 0.25f, out), VITC_OK);
    assert_close(out, &ysc, "sdpa scale 0.25");
    /* The documented scale rule: any value <= 0 is the default 1/sqrt(d);
     * a non-finite one is refused, not taken for the default (NaN <= 0 is
     * false, and so once was NaN > 0). */
    assert_int_equal(vitc_sdpa(&vq, &vk, &vv, NULL, VITC_MASK_NONE, -2.0f, out), VITC_OK);
    assert_close(out, &y, "sdpa scale -2 (default)");
    const float nonfinite[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++)
        expect_error(vitc_sdpa(&vq, &vk, &vv, NULL, VITC_MASK_NONE, nonfinite[i], out),
                     VITC_ERR_INVALID_ARG, "is not finite");
    /* Errors: d mismatch, mask that does not broadcast. */
    vitc_tensor_view bad = vk;
    bad.shape[3] = 3;
    expect_error(vitc_sdpa(&vq, &bad, &vv, NULL, VITC_MASK_NONE, 0.0f, out), VITC_ERR_SHAPE, "do not fit");
    bad = vf;
    bad.shape[0] = 4;
    expect_error(vitc_sdpa(&vq, &vk, &vv, &bad, VITC_MASK_FLOAT, 0.0f, out), VITC_ERR_SHAPE,
                 "does not broadcast to [2, 3, 5, 6]");
    free(out); free(b);
    vitc_safetensors_free(st);
}

static void test_softmax(void **state) {
    (void)state;
    vitc_safetensors *st = load_ref("softmax");
    ref_tensor x = get(st, "x"), y = get(st, "y"), yl = get(st, "y_last");
    float *out = malloc(x.n * sizeof(float));
    assert_int_equal(vitc_softmax(x.data, x.ndim, x.shape, 1, 0.5f, out), VITC_OK);
    assert_close(out, &y, "softmax dim 1, t 0.5");
    assert_int_equal(vitc_softmax(x.data, x.ndim, x.shape, -1, 3.0f, out), VITC_OK);
    assert_close(out, &yl, "softmax dim -1, t 3");
    for (size_t i = 0; i < x.n; i++) assert_true(isfinite(out[i]));
    expect_error(vitc_softmax(x.data, x.ndim, x.shape, 3, 1.0f, out), VITC_ERR_INVALID_ARG, "dim 3 out of range");
    expect_error(vitc_softmax(x.data, x.ndim, x.shape, -1, 0.0f, out), VITC_ERR_INVALID_ARG, "temperature");
    free(out);
    vitc_safetensors_free(st);
}

/* ---- errors ------------------------------------------------------------- */

static void test_bad_configs(void **state) {
    (void)state;
    vitc_layer *l = (vitc_layer *)&l; /* must be set to NULL on failure */
    vitc_layer_config c = cfg_of(VITC_ATTENTION_BLOCK);
    c.num_heads = 5;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "embed_dim 64 is not divisible by heads 5");
    assert_null(l);
    c = cfg_of(VITC_CONV_SA_BLOCK);
    c.in_channels = 7;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "in_channels 7 < 8");
    c = cfg_of(VITC_SELF_ATTENTION_MULTIHEAD);
    c.in_channels = 32; c.num_heads = 5;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "ni 32 is not divisible by nheads 5");
    c = cfg_of(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 10; c.num_heads = 3;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "not divisible by num_heads 3");
    c = cfg_of(VITC_T2T_ATTENTION);
    c.in_channels = 49; c.embed_dim = 64; c.num_heads = 0;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "out of range");
    c = cfg_of(VITC_SELF_ATTENTION_GROUP);
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "ni must be >= 1");
    c = cfg_of(VITC_SINGLE_HEAD_ATTENTION);
    c.in_channels = -3; c.embed_dim = 4;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "out of range");
    c = cfg_of(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 4; c.momentum = 2.0f;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "momentum");
    c.kind = (vitc_layer_kind)42;
    c.momentum = 0.1f;
    expect_error(vitc_layer_create(&c, &l), VITC_ERR_INVALID_ARG, "unknown layer kind 42");
    expect_error(vitc_layer_create(NULL, &l), VITC_ERR_INVALID_ARG, NULL);
}

static void test_bad_weights(void **state) {
    (void)state;
    vitc_safetensors *st = load_ref("sa_group");
    vitc_layer_config c = cfg_of(VITC_SELF_ATTENTION_GROUP);
    c.in_channels = 8;
    vitc_layer *l = make(c, st);
    /* The state_dict through vitc_layer_param, then broken in several ways. */
    int n = vitc_layer_num_params(l);
    const char *names[16];
    int ndims[16];
    const int64_t *shapes[16];
    const float *data[16];
    for (int i = 0; i < n; i++) {
        float *d;
        assert_int_equal(vitc_layer_param(l, i, &names[i], &ndims[i], &shapes[i], &d), VITC_OK);
        data[i] = d;
    }
    assert_string_equal(names[0], "norm.weight");
    assert_int_equal(vitc_layer_load(l, n, names, ndims, shapes, data, 1), VITC_OK);
    expect_error(vitc_layer_load(l, n - 1, names, ndims, shapes, data, 1), VITC_ERR_KEY,
                 "missing key \"proj.bias\" (expected shape [8])");
    int64_t wrong[2] = {8, 4};
    const int64_t *shapes2[16];
    memcpy(shapes2, shapes, sizeof shapes2);
    shapes2[2] = wrong; /* q.weight */
    expect_error(vitc_layer_load(l, n, names, ndims, shapes2, data, 1), VITC_ERR_SHAPE,
                 "key \"q.weight\" has shape [8, 4], expected [8, 8]");
    /* A failed load leaves the weights as they were. */
    ref_tensor qw = get(st, "block.q.weight");
    float *cur;
    assert_int_equal(vitc_layer_param(l, 2, NULL, NULL, NULL, &cur), VITC_OK);
    assert_memory_equal(cur, qw.data, qw.n * sizeof(float));
    names[n] = "extra";
    ndims[n] = 1;
    shapes[n] = shapes[0];
    data[n] = data[0];
    expect_error(vitc_layer_load(l, n + 1, names, ndims, shapes, data, 1), VITC_ERR_KEY,
                 "unexpected key \"extra\" (shape [8])");
    assert_int_equal(vitc_layer_load(l, n + 1, names, ndims, shapes, data, 0), VITC_OK);
    names[n] = "norm.num_batches_tracked"; /* ignored, as torch's BatchNorm counter */
    assert_int_equal(vitc_layer_load(l, n + 1, names, ndims, shapes, data, 1), VITC_OK);
    expect_error(vitc_layer_param(l, n, NULL, NULL, NULL, NULL), VITC_ERR_INVALID_ARG, "out of range");
    vitc_layer_free(l);

    /* The file lacks a ConvSA's keys; strict loading from a wrong file. */
    c = cfg_of(VITC_CONV_SA_BLOCK);
    c.in_channels = 8;
    assert_int_equal(vitc_layer_create(&c, &l), VITC_OK);
    expect_error(vitc_layer_load_safetensors(l, st, "block.", 1), VITC_ERR_KEY, "missing key \"gamma\"");
    vitc_layer_free(l);
    vitc_safetensors_free(st);
}

static void test_bad_inputs(void **state) {
    (void)state;
    float buf[4096] = {0}, out[4096];
    int ond;
    int64_t os[8];
    vitc_layer_config c = cfg_of(VITC_ATTENTION_BLOCK);
    c.embed_dim = 8;
    vitc_layer *l = make(c, NULL);
    int64_t s1[4] = {1, 3, 10, 8};
    expect_error(vitc_layer_forward(l, buf, 4, s1, out), VITC_ERR_SHAPE, "divisible by patch_size 4");
    int64_t s2[4] = {1, 4, 8, 8};
    expect_error(vitc_layer_output_shape(l, 4, s2, &ond, os), VITC_ERR_SHAPE,
                 "input has shape [1, 4, 8, 8], expected [B, 3, H, W]");
    int64_t s3[3] = {1, 3, 8};
    expect_error(vitc_layer_forward(l, buf, 3, s3, out), VITC_ERR_SHAPE, "expected [B, 3, H, W]");
    int64_t s4[4] = {0, 3, 8, 8};
    expect_error(vitc_layer_forward(l, buf, 4, s4, out), VITC_ERR_SHAPE, ">= 1");
    expect_error(vitc_layer_forward(l, NULL, 4, s4, out), VITC_ERR_INVALID_ARG, NULL);
    vitc_layer_free(l);

    c = cfg_of(VITC_SELF_ATTENTION_BATCH);
    c.in_channels = 4;
    l = make(c, NULL);
    int64_t one[4] = {1, 4, 1, 1};
    expect_error(vitc_layer_forward(l, buf, 4, one, out), VITC_ERR_SHAPE, "more than 1 value per channel");
    vitc_layer_set_training(l, 0);
    assert_int_equal(vitc_layer_forward(l, buf, 4, one, out), VITC_OK);
    vitc_layer_free(l);

    c = cfg_of(VITC_T2T_ATTENTION);
    c.in_channels = 6; c.embed_dim = 4;
    l = make(c, NULL);
    int64_t t1[3] = {2, 3, 5};
    expect_error(vitc_layer_forward(l, buf, 3, t1, out), VITC_ERR_SHAPE, "expected [B, N, 6]");
    vitc_layer_free(l);

    /* MHA: key/value that do not fit, masks of the wrong shape or type. */
    c = cfg_of(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 8; c.num_heads = 2;
    l = make(c, NULL);
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    a.query.data = buf; a.query.ndim = 3;
    a.query.shape[0] = 3; a.query.shape[1] = 2; a.query.shape[2] = 8;
    a.key = a.value = a.query;
    a.key.shape[0] = 4;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_SHAPE, "do not fit");
    a.key = a.query;
    uint8_t mask[64] = {0};
    a.attn_mask.data = mask; a.attn_mask.ndim = 2;
    a.attn_mask.shape[0] = 3; a.attn_mask.shape[1] = 4;
    a.attn_mask_type = VITC_MASK_BOOL;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_SHAPE,
                 "2-D attn_mask has shape [3, 4], expected [3, 3]");
    a.attn_mask.ndim = 3;
    a.attn_mask.shape[0] = 2; a.attn_mask.shape[1] = 3; a.attn_mask.shape[2] = 3;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_SHAPE,
                 "3-D attn_mask has shape [2, 3, 3], expected [4, 3, 3]");
    a.attn_mask.data = NULL;
    a.key_padding_mask.data = mask; a.key_padding_mask.ndim = 2;
    a.key_padding_mask.shape[0] = 3; a.key_padding_mask.shape[1] = 3;
    a.key_padding_mask_type = VITC_MASK_BOOL;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_SHAPE, "key_padding_mask has shape [3, 3]");
    a.key_padding_mask.shape[0] = 2;
    a.key_padding_mask_type = VITC_MASK_NONE;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_INVALID_ARG, "must be bool or float");
    a.key_padding_mask.data = NULL;
    a.need_weights = 1;
    expect_error(vitc_mha_forward(l, &a, out, NULL), VITC_ERR_INVALID_ARG, "weights is NULL");
    vitc_layer_free(l);

    /* Shapes whose sizes overflow are refused before any arithmetic on them. */
    c = cfg_of(VITC_MULTIHEAD_ATTENTION);
    c.embed_dim = 8; c.num_heads = 2;
    l = make(c, NULL);
    int64_t huge[3] = {(int64_t)1 << 30, (int64_t)1 << 30, 8};
    expect_error(vitc_layer_forward(l, buf, 3, huge, out), VITC_ERR_NOMEM, "too large");
    vitc_layer_free(l);
    c = cfg_of(VITC_T2T_ATTENTION);
    c.in_channels = 8; c.embed_dim = 8;
    l = make(c, NULL);
    expect_error(vitc_layer_forward(l, buf, 3, huge, out), VITC_ERR_NOMEM, "too large");
    vitc_layer_free(l);
    vitc_tensor_view hq = {buf, 3, {(int64_t)1 << 40, (int64_t)1 << 40, 8}};
    expect_error(vitc_sdpa(&hq, &hq, &hq, NULL, VITC_MASK_NONE, 0.0f, out), VITC_ERR_NOMEM, "too large");

    /* mha calls on a layer of another kind */
    c = cfg_of(VITC_CONV_SA_BLOCK);
    c.in_channels = 8;
    l = make(c, NULL);
    expect_error(vitc_mha_forward(l, &a, out, out), VITC_ERR_INVALID_ARG, "not a MultiheadAttention layer");
    vitc_layer_free(l);
}

/* reset_parameters: deterministic per seed, within torch's bounds. */
static void test_reset_parameters(void **state) {
    (void)state;
    vitc_layer_config c = cfg_of(VITC_CONV_SA_BLOCK);
    c.in_channels = 16;
    vitc_layer *a = make(c, NULL), *b = make(c, NULL);
    assert_int_equal(vitc_layer_reset_parameters(a, 7), VITC_OK);
    assert_int_equal(vitc_layer_reset_parameters(b, 7), VITC_OK);
    int differs = 0;
    for (int i = 0; i < vitc_layer_num_params(a); i++) {
        const char *name;
        int nd;
        const int64_t *shape;
        float *da, *db;
        vitc_layer_param(a, i, &name, &nd, &shape, &da);
        vitc_layer_param(b, i, NULL, NULL, NULL, &db);
        size_t n = 1;
        for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
        assert_memory_equal(da, db, n * sizeof(float));
        double bound = 1.0 / sqrt(16.0); /* fan_in of every 1x1 conv here */
        for (size_t j = 0; j < n; j++) {
            if (strcmp(name, "gamma") == 0)
                assert_true(da[j] == 0.0f);
            else
                assert_true(fabs(da[j]) <= bound);
        }
    }
    assert_int_equal(vitc_layer_reset_parameters(b, 8), VITC_OK);
    float *wa, *wb;
    vitc_layer_param(a, 1, NULL, NULL, NULL, &wa);
    vitc_layer_param(b, 1, NULL, NULL, NULL, &wb);
    for (int j = 0; j < 16; j++) differs |= wa[j] != wb[j];
    assert_true(differs);
    vitc_layer_free(a);
    vitc_layer_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_block),
        cmocka_unit_test(test_conv_sa),
        cmocka_unit_test(test_self_attention_group),
        cmocka_unit_test(test_self_attention_batch),
        cmocka_unit_test(test_t2t),
        cmocka_unit_test(test_single_head),
        cmocka_unit_test(test_mha),
        cmocka_unit_test(test_sdpa),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_bad_weights),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_reset_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
