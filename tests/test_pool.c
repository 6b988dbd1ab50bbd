/* test_pool.c — the thread pool: coverage, ownership, nesting, counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"

typedef struct {
    _Atomic int *hits; /* [n] */
    _Atomic int *owner; /* [n] tid + 1 */
    _Atomic int bad_tid;
    int nt;
} cover_ctx;

static void cover_task(void *c, int64_t i, int tid) {
    cover_ctx *cc = c;
    atomic_fetch_add(&cc->hits[i], 1);
    atomic_store(&cc->owner[i], tid + 1);
    if (tid < 0 || tid >= cc->nt) atomic_store(&cc->bad_tid, 1);
}

/* Every index exactly once, with the documented contiguous owner. */
static void check_cover(int64_t n, int nt) {
    vitc_set_num_threads(nt);
    assert_int_equal(vitc_get_num_threads(), nt);
    cover_ctx cc = {calloc((size_t)n + 1, sizeof(int)), calloc((size_t)n + 1, sizeof(int)), 0, nt};
    vitc__parallel_for(n, cover_task, &cc);
    int used = (int)(n < nt ? n : nt);
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(cc.hits[i], 1);
        /* owner of i: the t with n*t/used <= i < n*(t+1)/used (balanced split) */
        int64_t q = n / used, r = n % used;
        int t = 0;
        while (!(i >= q * t + (t < r ? t : r) && i < q * (t + 1) + (t + 1 < r ? t + 1 : r))) t++;
        assert_int_equal(cc.owner[i], t + 1);
    }
    assert_int_equal(cc.bad_tid, 0);
    free((void *)cc.hits);
    free((void *)cc.owner);
}

static void test_every_index_once(void **state) {
    int counts[] = {1, 2, 3, 4, 2, 1, 7, 2};
    int64_t sizes[] = {1, 2, 3, 5, 197, 1000, 4097};
    for (size_t a = 0; a < sizeof counts / sizeof *counts; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) check_cover(sizes[b], counts[a]);
    vitc__parallel_for(0, cover_task, NULL); /* n = 0: no call at all */
    vitc_set_num_threads(0);
}

/* vitc__parallel_for_dynamic: every index exactly once, valid tids, for
 * grains that do and do not divide n, grains larger than n, and inside a
 * pool task (serial there). */
static void check_dynamic(int64_t n, int64_t grain, int nt) {
    vitc_set_num_threads(nt);
    cover_ctx cc = {calloc((size_t)n + 1, sizeof(int)), calloc((size_t)n + 1, sizeof(int)), 0, nt};
    vitc__parallel_for_dynamic(n, grain, cover_task, &cc);
    for (int64_t i = 0; i < n; i++) assert_int_equal(cc.hits[i], 1);
    assert_int_equal(cc.bad_tid, 0);
    /* grain 1: the last thread took a suffix (from the back), the others
     * never an index after one of its own */
    int used = (int)(n < nt ? n : nt);
    if (grain == 1 && used > 1)
        for (int64_t i = 1; i < n; i++)
            if (cc.owner[i - 1] == used && cc.owner[i] != used)
                fail_msg("dynamic n=%lld on %d threads: index %lld (thread %d) after the back "
                         "thread's %lld", (long long)n, nt, (long long)i, cc.owner[i] - 1,
                         (long long)(i - 1));
    free((void *)cc.hits);
    free((void *)cc.owner);
}

static void dynamic_in_task(void *c, int64_t i, int tid) {
    (void)i, (void)tid;
    cover_ctx *cc = c;
    vitc__parallel_for_dynamic(7, 2, cover_task, cc);
}

static void test_dynamic_once(void **state) {
    int counts[] = {1, 2, 3, 7};
    int64_t sizes[] = {1, 2, 5, 60, 197};
    int64_t grains[] = {0, 1, 3, 5, 300};
    for (size_t a = 0; a < sizeof counts / sizeof *counts; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
                check_dynamic(sizes[b], grains[g], counts[a]);
    vitc__parallel_for_dynamic(0, 1, cover_task, NULL); /* n = 0: no call at all */
    /* Nested: each of 3 outer tasks covers 0..6 once more, on its own thread. */
    vitc_set_num_threads(2);
    cover_ctx cc = {calloc(8, sizeof(int)), calloc(8, sizeof(int)), 0, 2};
    vitc__parallel_for(3, dynamic_in_task, &cc);
    for (int64_t i = 0; i < 7; i++) assert_int_equal(cc.hits[i], 3);
    assert_int_equal(cc.bad_tid, 0);
    free((void *)cc.hits);
    free((void *)cc.owner);
    vitc_set_num_threads(0);
}

typedef struct {
    _Atomic int inner_calls;
    _Atomic int bad;
} nest_ctx;

static void inner_task(void *c, int64_t i, int tid) {
    nest_ctx *nc = c;
    (void)i;
    atomic_fetch_add(&nc->inner_calls, 1);
    if (!vitc__in_parallel()) atomic_store(&nc->bad, 1);
    (void)tid;
}

typedef struct {
    nest_ctx *nc;
} outer_ctx;

static void outer_task(void *c, int64_t i, int tid) {
    outer_ctx *oc = c;
    (void)i;
    vitc__parallel_for(10, inner_task, oc->nc);
    if (!vitc__in_parallel()) atomic_store(&oc->nc->bad, 1);
    (void)tid;
}

static void test_nesting_serial(void **state) {
    nest_ctx nc = {0, 0};
    outer_ctx oc = {&nc};
    vitc_set_num_threads(2);
    assert_int_equal(vitc__in_parallel(), 0);
    vitc__parallel_for(8, outer_task, &oc);
    assert_int_equal(vitc__in_parallel(), 0);
    assert_int_equal(nc.inner_calls, 80);
    assert_int_equal(nc.bad, 0);
    vitc_set_num_threads(0);
}

typedef struct {
    _Atomic int mismatch;
} range_nest_ctx;

static void nested_range(void *c, int64_t b, int64_t e, int tid) {
    int *expect = c;
    /* a nested region is one call over everything, with the outer tid */
    if (b != 0 || e != 5 || tid != *expect) *expect = -100;
}

static void outer_range(void *c, int64_t b, int64_t e, int tid) {
    range_nest_ctx *rc = c;
    for (int64_t i = b; i < e; i++) {
        int expect = tid;
        vitc__parallel_range(5, nested_range, &expect);
        if (expect != tid) atomic_store(&rc->mismatch, 1);
    }
}

static void test_nested_keeps_tid(void **state) {
    range_nest_ctx rc = {0};
    for (int nt = 1; nt <= 3; nt++) {
        vitc_set_num_threads(nt);
        vitc__parallel_range(17, outer_range, &rc);
        assert_int_equal(rc.mismatch, 0);
    }
    vitc_set_num_threads(0);
}

/* A float result computed per index does not depend on the thread count. */
typedef struct {
    float *out; /* [n] */
    int64_t n;
} sum_ctx;

static void sum_task(void *c, int64_t i, int tid) {
    sum_ctx *sc = c;
    (void)tid;
    float acc = 0.0f;
    for (int64_t j = 0; j < 1000; j++) acc += sinf((float)(i * 1000 + j) * 0.001f) * 1e-3f;
    sc->out[i] = acc;
}

static void test_identical_results(void **state) {
    int64_t n = 333;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    sum_ctx s1 = {a, n}, s2 = {b, n};
    vitc_set_num_threads(1);
    vitc__parallel_for(n, sum_task, &s1);
    vitc_set_num_threads(2);
    vitc__parallel_for(n, sum_task, &s2);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    free(a);
    free(b);
    vitc_set_num_threads(0);
}

/* Two user threads starting regions at once: serialised, both complete. */
static void *user_thread(void *arg) {
    int64_t n = 5000;
    for (int rep = 0; rep < 50; rep++) {
        cover_ctx cc = {calloc((size_t)n, sizeof(int)), calloc((size_t)n, sizeof(int)), 0, 64};
        vitc__parallel_for(n, cover_task, &cc);
        for (int64_t i = 0; i < n; i++)
            if (cc.hits[i] != 1) *(int *)arg = 1;
        free((void *)cc.hits);
        free((void *)cc.owner);
    }
    return NULL;
}

static void test_concurrent_callers(void **state) {
    vitc_set_num_threads(2);
    pthread_t t[3];
    int bad[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&t[i], NULL, user_thread, &bad[i]), 0);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(bad[i], 0);
    vitc_set_num_threads(0);
}

static void test_default_threads(void **state) {
    vitc_set_num_threads(0);
    int d = vitc_get_num_threads();
    assert_true(d >= 1);
    vitc_set_num_threads(3);
    assert_int_equal(vitc_get_num_threads(), 3);
    vitc_set_num_threads(-5);
    assert_int_equal(vitc_get_num_threads(), d);
}

static void empty_task(void *c, int64_t b, int64_t e, int tid) {
    (void)c, (void)b, (void)e, (void)tid;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Not a pass/fail timing gate (the machine is shared): prints the cost of
 * an empty region, and checks that many back-to-back regions complete. */
static void test_empty_region_cost(void **state) {
    vitc_set_num_threads(2);
    int reps = 20000;
    vitc__parallel_range(2, empty_task, NULL);
    double t0 = now_s();
    for (int i = 0; i < reps; i++) vitc__parallel_range(2, empty_task, NULL);
    double t1 = now_s();
    printf("# empty parallel region, 2 threads: %.2f us\n", (t1 - t0) / reps * 1e6);
    vitc_set_num_threads(0);
}

/* Regions started after the pool's exit-time shutdown (its destructor joins
 * the workers). Workers created for a later region used to see the shutdown
 * flag at their first idle sleep and quit while still counted, so the next
 * region waited forever for them. This destructor has a priority, so
 * the linker runs it after the pool's plain one; alarm() bounds it, and a
 * hang makes the binary exit with status 1 after cmocka's summary. */
static void late_hang(int sig) {
    static const char msg[] = "test_pool: a region after the pool's shutdown hung\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

__attribute__((destructor(101))) static void regions_after_shutdown(void) {
    signal(SIGALRM, late_hang);
    alarm(5);
    vitc_set_num_threads(2);
    for (int rep = 0; rep < 5; rep++) {
        _Atomic int hits[2] = {0, 0}, owner[2] = {0, 0};
        cover_ctx cc = {hits, owner, 0, 2};
        vitc__parallel_for(2, cover_task, &cc);
        if (hits[0] != 1 || hits[1] != 1) late_hang(0); /* (it runs serially now) */
        usleep(2000); /* the workers go idle and sleep, where they look at stop */
    }
    alarm(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_index_once),  cmocka_unit_test(test_nesting_serial),
        cmocka_unit_test(test_nested_keeps_tid),  cmocka_unit_test(test_identical_results),
        cmocka_unit_test(test_concurrent_callers), cmocka_unit_test(test_default_threads),
        cmocka_unit_test(test_empty_region_cost),  cmocka_unit_test(test_dynamic_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
