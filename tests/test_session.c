/*
 * test_session.c — one model, several threads: each thread runs its own
 * vitc_session on one shared vitc_vit, mixing entry points (run, forward,
 * embed with every pool, forward_features, attention maps), batch sizes and
 * image sizes (position resampling), and every result must be bit-equal to
 * the same call run serially; in fp32, bf16 and int8 (these run on every
 * CPU: the portable reference where the instructions are missing). Then the
 * model API must still give the same numbers, a session on stale weights
 * must fail or fall back as vitc.h says, and one outliving its model must
 * be refused. `make tsan` runs this file under ThreadSanitizer.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vitc.h"

#define NTHREADS 4
#define NITER 100

/* 3 channels, 32x32, patch 4: 64 patches at the native size, 2 blocks. */
static vitc_vit_config small_config(void) {
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 32;
    c.patch_size = 4;
    c.in_channels = 3;
    c.hidden_dim = 32;
    c.depth = 2;
    c.num_heads = 4;
    c.mlp_dim = 64;
    c.num_classes = 10;
    return c;
}

typedef enum { K_RUN, K_FORWARD, K_EMBED, K_FEATURES, K_MAPS, K_COUNT } call_kind;

/* One call and its serial result. */
typedef struct {
    call_kind kind;
    vitc_pool pool;
    int B, H, W;
    float *images; /* [B, 3, H, W] */
    size_t n_out, n_out2;
    float *ref, *ref2; /* ref2: the rollout of K_MAPS */
} call;

#define NCALLS 10
static call calls[NCALLS];

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static size_t out_floats(const vitc_vit *m, const call *c, size_t *second) {
    const vitc_vit_config *cfg = vitc_vit_get_config(m);
    int64_t P = (int64_t)(c->H / cfg->patch_size) * (c->W / cfg->patch_size);
    int64_t N = P + vitc_vit_num_prefix_tokens(m), per = 0;
    *second = 0;
    switch (c->kind) {
    case K_RUN: assert_int_equal(vitc_vit_output_size(m, c->H, c->W, &per), VITC_OK); break;
    case K_FORWARD: per = cfg->num_classes; break;
    case K_EMBED: assert_int_equal(vitc_vit_embed_size(m, c->pool, c->H, c->W, &per), VITC_OK); break;
    case K_FEATURES: per = N * cfg->hidden_dim; break;
    default:
        *second = (size_t)(c->B * N * N);
        return (size_t)(cfg->depth * c->B * cfg->num_heads * N * N);
    }
    return (size_t)(c->B * per);
}

static void make_calls(const vitc_vit *m) {
    static const int sizes[][2] = {{32, 32}, {24, 40}, {48, 32}, {16, 16}, {40, 40}};
    static const call_kind kinds[NCALLS] = {K_RUN, K_FORWARD, K_EMBED, K_EMBED, K_EMBED,
                                            K_FEATURES, K_MAPS, K_RUN, K_EMBED, K_MAPS};
    static const vitc_pool pools[NCALLS] = {0, 0, VITC_POOL_CLS, VITC_POOL_MEAN,
                                            VITC_POOL_TOKENS, 0, 0, 0, VITC_POOL_DEFAULT, 0};
    uint64_t seed = 12345;
    for (int i = 0; i < NCALLS; i++) {
        call *c = &calls[i];
        c->kind = kinds[i];
        c->pool = pools[i];
        c->B = 1 + i % 3;
        c->H = sizes[i % 5][0];
        c->W = sizes[i % 5][1];
        size_t n = (size_t)c->B * 3 * (size_t)(c->H * c->W);
        c->images = malloc(n * sizeof(float));
        assert_non_null(c->images);
        for (size_t k = 0; k < n; k++)
            c->images[k] = (float)((double)lcg(&seed) / 2147483648.0 * 4.0 - 2.0);
        c->n_out = out_floats(m, c, &c->n_out2);
        c->ref = calloc(c->n_out, sizeof(float));
        c->ref2 = c->n_out2 ? calloc(c->n_out2, sizeof(float)) : NULL;
        assert_non_null(c->ref);
    }
}

static void free_calls(void) {
    for (int i = 0; i < NCALLS; i++) {
        free(calls[i].images);
        free(calls[i].ref);
        free(calls[i].ref2);
    }
    memset(calls, 0, sizeof calls);
}

/* Call c on s (or, s NULL, the model API on m) into out / out2. */
static vitc_status do_call(vitc_session *s, vitc_vit *m, const call *c, float *out, float *out2) {
    switch (c->kind) {
    case K_RUN:
        return s ? vitc_session_run(s, c->images, c->B, c->H, c->W, out)
                 : vitc_vit_run(m, c->images, c->B, c->H, c->W, out);
    case K_FORWARD:
        return s ? vitc_session_forward(s, c->images, c->B, c->H, c->W, out)
                 : vitc_vit_forward(m, c->images, c->B, c->H, c->W, out);
    case K_EMBED:
        return s ? vitc_session_embed(s, c->images, c->B, c->H, c->W, c->pool, out)
                 : vitc_vit_embed(m, c->images, c->B, c->H, c->W, c->pool, out);
    case K_FEATURES:
        return s ? vitc_session_forward_features(s, c->images, c->B, c->H, c->W, out)
                 : vitc_vit_forward_features(m, c->images, c->B, c->H, c->W, out);
    default:
        return s ? vitc_session_attention_maps(s, c->images, c->B, c->H, c->W, out, out2)
                 : vitc_vit_attention_maps(m, c->images, c->B, c->H, c->W, out, out2);
    }
}

/* The serial results, from one session; the model API gives the same. */
static void serial_refs(vitc_vit *m) {
    vitc_session *s;
    assert_int_equal(vitc_session_create(m, &s), VITC_OK);
    for (int i = 0; i < NCALLS; i++) {
        call *c = &calls[i];
        if (do_call(s, m, c, c->ref, c->ref2) != VITC_OK)
            fail_msg("call %d: %s", i, vitc_last_error());
    }
    vitc_session_free(s);
}

static void check_model_api(vitc_vit *m) {
    for (int i = 0; i < NCALLS; i++) {
        const call *c = &calls[i];
        float *o = malloc(c->n_out * sizeof(float));
        float *o2 = c->n_out2 ? malloc(c->n_out2 * sizeof(float)) : NULL;
        assert_non_null(o);
        if (do_call(NULL, m, c, o, o2) != VITC_OK)
            fail_msg("model API call %d: %s", i, vitc_last_error());
        if (memcmp(o, c->ref, c->n_out * sizeof(float)) != 0 ||
            (o2 && memcmp(o2, c->ref2, c->n_out2 * sizeof(float)) != 0))
            fail_msg("model API call %d (kind %d, B %d, %dx%d) differs from the session's", i,
                     (int)c->kind, c->B, c->H, c->W);
        free(o);
        free(o2);
    }
}

typedef struct {
    const vitc_vit *m;
    int t;
    int bad, failed; /* results that differ; calls that failed */
    char msg[256];
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    vitc_session *s;
    if (vitc_session_create(w->m, &s) != VITC_OK) {
        w->failed = NITER;
        return NULL;
    }
    for (int it = 0; it < NITER; it++) {
        const call *c = &calls[(it * 7 + w->t * 3) % NCALLS];
        float *o = malloc(c->n_out * sizeof(float));
        float *o2 = c->n_out2 ? malloc(c->n_out2 * sizeof(float)) : NULL;
        if (!o || (c->n_out2 && !o2)) {
            w->failed++;
        } else if (do_call(s, NULL, c, o, o2) != VITC_OK) {
            if (!w->failed++)
                snprintf(w->msg, sizeof w->msg, "%s", vitc_last_error());
        } else if (memcmp(o, c->ref, c->n_out * sizeof(float)) != 0 ||
                   (o2 && memcmp(o2, c->ref2, c->n_out2 * sizeof(float)) != 0)) {
            w->bad++;
        }
        free(o);
        free(o2);
    }
    vitc_session_free(s);
    return NULL;
}

static void run_threads(const vitc_vit *m, const char *what) {
    pthread_t th[NTHREADS];
    worker w[NTHREADS];
    memset(w, 0, sizeof w);
    for (int t = 0; t < NTHREADS; t++) {
        w[t].m = m;
        w[t].t = t;
        assert_int_equal(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < NTHREADS; t++)
        if (w[t].bad || w[t].failed)
            fail_msg("%s: thread %d: %d of %d results differ from the serial ones, %d calls "
                     "failed (%s)", what, t, w[t].bad, NITER, w[t].failed, w[t].msg);
}

static void test_threads_fp32(void **state) {
    (void)state;
    vitc_vit_config cfg = small_config();
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&cfg, 7, &m), VITC_OK);
    make_calls(m);
    serial_refs(m);
    check_model_api(m);
    run_threads(m, "fp32");
    /* One pool thread: every user thread runs its kernels inline at once
     * (per-thread scratch). The serial references again at that count:
     * the built-in GEMM's bits do not depend on it, OpenBLAS's do (its
     * sgemm is called per panel, and the panels change with the count). */
    int nt = vitc_get_num_threads();
    vitc_set_num_threads(1);
    serial_refs(m);
    run_threads(m, "fp32, inline");
    vitc_set_num_threads(nt);
    serial_refs(m);
    check_model_api(m); /* the model API still works after the sessions */
    free_calls();
    vitc_vit_free(m);
}

static void threads_lp(vitc_precision p, uint64_t seed) {
    vitc_vit_config cfg = small_config();
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&cfg, seed, &m), VITC_OK);
    assert_int_equal(vitc_vit_set_precision(m, p), VITC_OK);
    if (p == VITC_PRECISION_BF16)
        assert_int_equal(vitc_vit_set_attention_precision(m, VITC_PRECISION_BF16), VITC_OK);
    make_calls(m);
    serial_refs(m);
    check_model_api(m);
    run_threads(m, vitc_precision_name(p));
    free_calls();
    vitc_vit_free(m);
}

static void test_threads_bf16(void **state) {
    (void)state;
    print_message("low precision on %s\n", vitc_get_precision_paths());
    threads_lp(VITC_PRECISION_BF16, 11);
}

static void test_threads_int8(void **state) {
    (void)state;
    threads_lp(VITC_PRECISION_INT8, 17);
}

/* Weights changed behind the packs: bf16 sessions refuse until
 * vitc_vit_prepare; fp32 runs the resident row-major weights, same numbers. */
static void test_stale_weights(void **state) {
    (void)state;
    vitc_vit_config cfg = small_config();
    for (int bf16 = 0; bf16 < 2; bf16++) {
        vitc_vit *m;
        assert_int_equal(vitc_vit_create(&cfg, 3, &m), VITC_OK);
        if (bf16)
            assert_int_equal(vitc_vit_set_precision(m, VITC_PRECISION_BF16), VITC_OK);
        make_calls(m);
        /* A created fp32 model packs at its first vitc_vit_* forward or here;
         * until then sessions read the row-major weights. */
        assert_int_equal(vitc_vit_prepare(m), VITC_OK);
        assert_true(vitc_vit_is_prepared(m));
        serial_refs(m);
        float *data;
        assert_int_equal(vitc_vit_param(m, 0, NULL, NULL, NULL, &data, NULL), VITC_OK);
        vitc_session *s;
        assert_int_equal(vitc_session_create(m, &s), VITC_OK);
        const call *c = &calls[1];
        float *o = malloc(c->n_out * sizeof(float));
        assert_non_null(o);
        vitc_status st = do_call(s, NULL, c, o, NULL);
        assert_false(vitc_vit_is_prepared(m));
        if (bf16) {
            assert_int_equal(st, VITC_ERR_INVALID_ARG);
            assert_non_null(strstr(vitc_last_error(), "vitc_vit_prepare"));
            assert_int_equal(vitc_vit_prepare(m), VITC_OK);
            assert_true(vitc_vit_is_prepared(m));
            assert_int_equal(do_call(s, NULL, c, o, NULL), VITC_OK);
        } else {
            assert_int_equal(st, VITC_OK);
            assert_memory_equal(o, c->ref, c->n_out * sizeof(float));
            assert_int_equal(vitc_vit_prepare(m), VITC_OK);
            assert_true(vitc_vit_is_prepared(m));
            assert_int_equal(do_call(s, NULL, c, o, NULL), VITC_OK);
        }
        /* Unpacked and packed again (bf16: the unpacked values are the
         * rounded ones, which round to themselves) give the same numbers. */
        assert_memory_equal(o, c->ref, c->n_out * sizeof(float));
        free(o);
        vitc_session_free(s);
        free_calls();
        vitc_vit_free(m);
    }
}

/* The GEMM backend changed after packing: the panels belong to the other
 * kernel and the row-major pages were given back, so a session refuses
 * until vitc_vit_prepare, then gives the model API's numbers. */
static void test_backend_switch(void **state) {
    (void)state;
    char prev[32];
    snprintf(prev, sizeof prev, "%s", vitc_get_gemm_backend());
    const char *other = strcmp(prev, "builtin") == 0 ? "openblas" : "builtin";
    vitc_vit_config cfg = small_config();
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&cfg, 13, &m), VITC_OK);
    assert_int_equal(vitc_vit_prepare(m), VITC_OK);
    if (vitc_set_gemm_backend(other) != VITC_OK) {
        vitc_vit_free(m);
        skip(); /* a build without OpenBLAS */
    }
    make_calls(m);
    const call *c = &calls[0];
    vitc_session *s;
    assert_int_equal(vitc_session_create(m, &s), VITC_OK);
    float *o = malloc(c->n_out * sizeof(float));
    assert_non_null(o);
    vitc_status st = do_call(s, NULL, c, o, NULL);
    if (strcmp(other, "openblas") == 0) { /* builtin fp32 panels, pages released */
        assert_int_equal(st, VITC_ERR_INVALID_ARG);
        assert_non_null(strstr(vitc_last_error(), "vitc_vit_prepare"));
    }
    assert_int_equal(vitc_vit_prepare(m), VITC_OK);
    assert_int_equal(do_call(s, NULL, c, o, NULL), VITC_OK);
    assert_int_equal(do_call(NULL, m, c, c->ref, NULL), VITC_OK);
    assert_memory_equal(o, c->ref, c->n_out * sizeof(float));
    assert_int_equal(vitc_set_gemm_backend(prev), VITC_OK);
    free(o);
    vitc_session_free(s);
    free_calls();
    vitc_vit_free(m);
}

/* Training stays on the model API; leaving it packs for sessions. */
static void test_training_then_sessions(void **state) {
    (void)state;
    vitc_vit_config cfg = small_config();
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&cfg, 5, &m), VITC_OK);
    assert_int_equal(vitc_vit_set_precision(m, VITC_PRECISION_BF16), VITC_OK);
    make_calls(m);
    vitc_vit_set_training(m, 1);
    const call *c = &calls[1];
    float *o = malloc(c->n_out * sizeof(float));
    assert_non_null(o);
    assert_int_equal(vitc_vit_forward(m, c->images, c->B, c->H, c->W, o), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, o), VITC_OK);
    vitc_vit_set_training(m, 0);
    assert_true(vitc_vit_is_prepared(m));
    serial_refs(m);
    check_model_api(m);
    free(o);
    free_calls();
    vitc_vit_free(m);
}

static void test_session_outlives_model(void **state) {
    (void)state;
    vitc_vit_config cfg = small_config();
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&cfg, 9, &m), VITC_OK);
    vitc_session *s;
    assert_int_equal(vitc_session_create(m, &s), VITC_OK);
    float img[3 * 32 * 32] = {0}, out[10];
    assert_int_equal(vitc_session_forward(s, img, 1, 32, 32, out), VITC_OK);
    vitc_vit_free(m);
    assert_int_equal(vitc_session_forward(s, img, 1, 32, 32, out), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "freed"));
    vitc_session_free(s);
    assert_int_equal(vitc_session_create(NULL, &s), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_session_run(NULL, img, 1, 32, 32, out), VITC_ERR_INVALID_ARG);
    vitc_session_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_fp32),
        cmocka_unit_test(test_threads_bf16),
        cmocka_unit_test(test_threads_int8),
        cmocka_unit_test(test_stale_weights),
        cmocka_unit_test(test_backend_switch),
        cmocka_unit_test(test_training_then_sessions),
        cmocka_unit_test(test_session_outlives_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
