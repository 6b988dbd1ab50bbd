/* test_cpu_blocking.c — the CPU read at run time (against sysfs), the
 * blocking rules, VITC_BLOCKING / VITC_CACHE's parsing, and every GEMM
 * (fp32, bf16, int8) under forced blockings against the reference kernel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/gemm_lp.h"
#include "kernels/gemm_ukernels.h"
#include "kernels/kernels.h"

#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *rnd(size_t n, float mul) {
    float *p = tu_falloc(n);
    tu_fill(&rng, p, n, mul);
    return p;
}

/* A sysfs cache size of cpu0 (level, "Data" or "Unified"), or -1. */
static int64_t sysfs_cache(int level) {
    for (int i = 0; i < 8; i++) {
        char p[96], type[32] = {0}, size[32] = {0};
        int lv = 0;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(p, "r");
        if (!f) return -1;
        if (fscanf(f, "%d", &lv) != 1) lv = 0;
        fclose(f);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!(f = fopen(p, "r"))) continue;
        if (!fgets(type, sizeof type, f)) type[0] = 0;
        fclose(f);
        if (lv != level || !strncmp(type, "Instruction", 11)) continue;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(p, "r"))) continue;
        if (!fgets(size, sizeof size, f)) size[0] = 0;
        fclose(f);
        char *end;
        long long v = strtoll(size, &end, 10);
        return *end == 'K' ? v * 1024 : *end == 'M' ? v * 1024 * 1024 : v;
    }
    return -1;
}

/* The caches cpuid gave agree with what Linux says (an independent
 * reading), the identity is well formed, and vitc_cpu_info writes what it
 * says it does. */
static void test_detect(void **state) {
    (void)state;
    const vitc__cpu *c = vitc__cpu_get();
    printf("# %s\n", c->id);
    assert_true(c->l1d >= 4096 && c->l2 >= c->l1d && c->l3 > 0);
    assert_true(c->line >= 16 && c->line <= 512 && (c->line & (c->line - 1)) == 0);
    assert_non_null(c->uarch);
    assert_true(strlen(c->id) > 6 && strstr(c->id, "-f") != NULL);
    if (!getenv("VITC_CACHE") && !strcmp(c->cache_from, "cpuid")) {
        int64_t l1 = sysfs_cache(1), l2 = sysfs_cache(2);
        if (l1 > 0) assert_int_equal(c->l1d, l1);
        if (l2 > 0) assert_int_equal(c->l2, l2);
    }
    if (!c->avx512) assert_int_equal(c->datapath, VITC__DP_NONE);
    /* family 25 model 0x10-0x1f is Zen 4 with its 256-bit units */
    if (!strcmp(c->vendor, "AuthenticAMD") && c->family == 25 && c->model >= 0x10 &&
        c->model <= 0x1f) {
        assert_string_equal(c->uarch, "Zen 4");
        if (c->avx512) assert_int_equal(c->datapath, VITC__DP_256);
    }

    char keys[2048], small[16];
    size_t n = vitc_cpu_info(keys, sizeof keys, VITC_CPU_INFO_KEYS);
    assert_int_equal(n, strlen(keys));
    char want[160];
    snprintf(want, sizeof want, "id=%s\n", c->id);
    assert_non_null(strstr(keys, want));
    snprintf(want, sizeof want, "\nkc=%lld\n", (long long)vitc__kern()->gemm->kc);
    assert_non_null(strstr(keys, want));
    assert_int_equal(vitc_cpu_info(small, sizeof small, VITC_CPU_INFO_KEYS), n);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_true(vitc_cpu_info(NULL, 0, VITC_CPU_INFO_TEXT) > 0);
}

typedef struct {
    int mr, nr;
    int64_t kc, mc, nc; /* the kernel's own (measured on a 1 MB L2) */
} kern_blocks;

static vitc__blocking rule(const vitc__cpu *c, kern_blocks k) {
    vitc__blocking b;
    vitc__blocking_rule(&b, c, k.mr, k.nr, k.kc, k.mc, k.nc);
    return b;
}

/* A 1 MB L2 gives back the blocks measured on it; other caches give what
 * the rules say (worked out by hand here). */
static void test_rules(void **state) {
    (void)state;
    const kern_blocks avx512 = {12, 32, 1024, 72, 1024}, avx2 = {6, 16, 1024, 72, 2048},
                      generic = {6, 8, 512, 96, 1024};
    vitc__cpu zen4 = {.l1d = 32 << 10, .l2 = 1 << 20, .l3 = 32 << 20, .line = 64};
    vitc__blocking b = rule(&zen4, avx512);
    assert_true(b.kc == 1024 && b.mc == 72 && b.nc == 1024 && b.lp_mc == 144 &&
                b.lp_nb == 384 * 1024);
    b = rule(&zen4, avx2);
    assert_true(b.kc == 1024 && b.mc == 72 && b.nc == 2048);
    b = rule(&zen4, generic);
    assert_true(b.kc == 512 && b.mc == 96 && b.nc == 1024);
    /* Sapphire Rapids: 48 KB L1d, 2 MB L2. kc stays the kernel's deepest;
     * A's block doubles with L2 (576 KB: 144 rows of 1024). */
    vitc__cpu spr = {.l1d = 48 << 10, .l2 = 2 << 20, .l3 = 105 << 20, .line = 64};
    b = rule(&spr, avx512);
    assert_true(b.kc == 1024 && b.mc == 144 && b.nc == 1024 && b.lp_mc == 288 &&
                b.lp_nb == 768 * 1024);
    /* Zen 3: 512 KB L2: the 32-float micro-panel in 64 KB: kc 512; A's
     * block 144 KB: 72 rows of 512. A small L3 narrows B's panel. */
    vitc__cpu zen3 = {.l1d = 32 << 10, .l2 = 512 << 10, .l3 = 4 << 20, .line = 64};
    b = rule(&zen3, avx512);
    assert_true(b.kc == 512 && b.mc == 72 && b.nc == 512 && b.lp_mc == 72 &&
                b.lp_nb == 192 * 1024);
    /* a tiny L2: kc not below the L1 rule (half of L1) */
    vitc__cpu tiny = {.l1d = 64 << 10, .l2 = 128 << 10, .l3 = 1 << 20, .line = 64};
    b = rule(&tiny, avx512);
    assert_int_equal(b.kc, 256);
    assert_true(b.mc >= 12 && b.mc % 12 == 0 && b.nc >= 32 && b.nc % 32 == 0);

    /* This machine's tables hold the rules' values for its caches. */
    const vitc__cpu *c = vitc__cpu_get();
    if (!getenv("VITC_BLOCKING") && !strcmp(vitc__blocking_from(), "the caches")) {
        for (int a = 0; a < TU_NARCH; a++) {
            if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
            const vitc__gemm_kernel *g = vitc__kern()->gemm;
            kern_blocks k = g->mr == 12 ? avx512 : g->nr == 16 ? avx2 : generic;
            b = rule(c, k);
            assert_true(g->kc == b.kc && g->mc == b.mc && g->nc == b.nc);
            assert_true(vitc__kern()->lp_mc == b.lp_mc && vitc__kern()->lp_nb == b.lp_nb);
        }
        vitc_set_arch(NULL);
    }
}

/* The forcing's syntax: bad specs are refused with a message and change
 * nothing; good ones reach the tables, rounded to what the kernel needs. */
static void test_force_parse(void **state) {
    (void)state;
    const vitc__gemm_kernel *before = vitc__kern()->gemm;
    const char *bad[] = {"kc=abc", "1,2,3,4,5,6", "foo=1", "kc=12Q", "kc=", ",", "kc=1=2",
                         "kc=99999999999G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(vitc__blocking_force(bad[i]), VITC_ERR_INVALID_ARG);
        assert_true(strlen(vitc_last_error()) > 10);
        assert_ptr_equal(vitc__kern()->gemm, before);
    }
    assert_int_equal(vitc__cache_force("l2=two"), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc__cache_force("kc=1"), VITC_ERR_INVALID_ARG);

    assert_int_equal(vitc__blocking_force("200, 50, 100"), VITC_OK);
    const vitc__gemm_kernel *g = vitc__kern()->gemm;
    assert_int_equal(g->kc, 200);
    assert_int_equal(g->mc, 50 / g->mr * g->mr > g->mr ? 50 / g->mr * g->mr : g->mr);
    assert_int_equal(g->nc % g->nr, 0);
    assert_true(strstr(vitc__blocking_from(), "200, 50, 100") != NULL);
    assert_int_equal(vitc__blocking_force("lp_mc=24,lp_nb=64K"), VITC_OK);
    assert_int_equal(vitc__kern()->lp_mc, 24);
    assert_int_equal(vitc__kern()->lp_nb, 64 * 1024);

    assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
    assert_int_equal(vitc__cache_force("l1d=48K,l2=2M,l3=105MiB"), VITC_OK);
    const vitc__cpu *c = vitc__cpu_get();
    assert_int_equal(c->l1d, 48 * 1024);
    assert_int_equal(c->l2, 2 * 1024 * 1024);
    assert_int_equal(c->l3, 105 * 1024 * 1024);
    assert_string_equal(c->cache_from, "forced");
    if (vitc__kern()->gemm->mr == 12 && vitc__kern()->gemm->nr == 32) /* avx512 */
        assert_int_equal(vitc__kern()->gemm->mc, 144);
    assert_int_equal(vitc__kern()->lp_mc, 288);
    assert_int_equal(vitc__cache_force(NULL), VITC_OK);
    assert_string_not_equal(vitc__cpu_get()->cache_from, "forced");
    assert_string_equal(vitc__blocking_from(), "the caches");
}

/* |y - exact| <= bound for a float32 product of depth K, from float64. */
static void check_gemm(const char *what, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       const float *A, const float *B, const float *C0, float beta, const float *C) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int64_t p = 0; p < K; p++) {
                double a = ta ? A[p * M + i] : A[i * K + p], b = tb ? B[j * K + p] : B[p * N + j];
                acc += a * b, mag += fabs(a * b);
            }
            acc += beta * (double)C0[i * N + j], mag += fabs(beta * (double)C0[i * N + j]);
            double bound = (double)(K + 2) * 0x1p-23 * mag + 1e-30;
            if (fabs(C[i * N + j] - acc) > bound)
                fail_msg("%s %s%s %lldx%lldx%lld: C[%lld,%lld] = %.9g, float64 %.9g, bound %.3g",
                         what, ta ? "T" : "N", tb ? "T" : "N", (long long)M, (long long)N,
                         (long long)K, (long long)i, (long long)j, C[i * N + j], acc, bound);
        }
}

static const char *const blockings[] = {
    NULL, /* the rules' */
    "kc=64,mc=24,nc=64",
    "100,36,96",
    "kc=256,mc=12,nc=32",
    "kc=1000,mc=200,nc=3000",
    "kc=1024,mc=1,nc=1", /* mc and nc rounded up to one strip */
};
#define NBLOCKINGS (sizeof blockings / sizeof *blockings)

static const struct {
    int ta, tb;
    int64_t M, N, K;
} gshapes[] = {
    {0, 1, 197, 100, 300},  /* a linear layer (A read in place under direct_kc) */
    {0, 0, 70, 130, 1100},  /* several K blocks */
    {1, 0, 40, 48, 1500},   /* a weight gradient (KC_DEEP) */
    {1, 1, 33, 65, 77},
    {0, 1, 300, 40, 700},   /* rows split over threads */
};

/* vitc__gemm on every path this CPU has, 1 and 2 threads, under each
 * blocking, against float64; and a Linear from fp32 panels packed under
 * that blocking gives the row-major Linear's bits. */
static void test_gemm_fp32_forced(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof gshapes / sizeof *gshapes; s++) {
        int ta = gshapes[s].ta, tb = gshapes[s].tb;
        int64_t M = gshapes[s].M, N = gshapes[s].N, K = gshapes[s].K;
        float *A = rnd((size_t)(M * K), 1.0f), *B = rnd((size_t)(K * N), 1.0f);
        float *C0 = rnd((size_t)(M * N), 1.0f), *C = tu_falloc((size_t)(M * N));
        float *y0 = tu_falloc((size_t)(M * N)), *y1 = tu_falloc((size_t)(M * N));
        float *bias = rnd((size_t)N, 0.5f);
        for (size_t f = 0; f < NBLOCKINGS; f++) {
            assert_int_equal(vitc__blocking_force(blockings[f]), VITC_OK);
            for (int a = 0; a < TU_NARCH; a++) {
                if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
                assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
                for (int nt = 1; nt <= 2; nt++) {
                    vitc_set_num_threads(nt);
                    char what[96];
                    snprintf(what, sizeof what, "%s %dt blocking %s", tu_arch(a), nt,
                             blockings[f] ? blockings[f] : "(rules)");
                    memcpy(C, C0, (size_t)(M * N) * 4);
                    vitc__gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.5f, C, N);
                    check_gemm(what, ta, tb, M, N, K, A, B, C0, 0.5f, C);
                }
                if (!ta && tb) { /* y = x W^T: packed panels under this blocking */
                    vitc__pweight pw;
                    assert_int_equal(vitc__pweight_pack(&pw, B, N, K, VITC_PRECISION_FP32),
                                     VITC_OK);
                    assert_ptr_equal(pw.kern, vitc__kern()->gemm);
                    assert_int_equal(vitc__linear_pw(y0, N, A, K, NULL, B, bias, NULL, 0, M, N, K,
                                                     VITC__ACT_GELU),
                                     VITC_OK);
                    assert_int_equal(vitc__linear_pw(y1, N, A, K, &pw, B, bias, NULL, 0, M, N, K,
                                                     VITC__ACT_GELU),
                                     VITC_OK);
                    if (memcmp(y0, y1, (size_t)(M * N) * 4))
                        fail_msg("%s blocking %s: packed Linear differs from row-major",
                                 tu_arch(a), blockings[f] ? blockings[f] : "(rules)");
                    vitc__pweight_free(&pw);
                }
            }
        }
        free(A), free(B), free(C0), free(C), free(y0), free(y1), free(bias);
    }
    vitc_set_num_threads(0);
    vitc_set_arch(NULL);
    vitc_set_gemm_backend(NULL);
    assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
}

/* mc and nc only group rows and columns: with kc unchanged the fp32 GEMM
 * gives the same bits as under the rules' blocking (kc changes where C's
 * partial sums are rounded, so it is left alone here). */
static void test_gemm_fp32_mc_nc_same_bits(void **state) {
    (void)state;
    int64_t M = 150, N = 200, K = 900;
    float *A = rnd((size_t)(M * K), 1.0f), *B = rnd((size_t)(K * N), 1.0f);
    float *c0 = tu_falloc((size_t)(M * N)), *c1 = tu_falloc((size_t)(M * N));
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
        assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
        int64_t kc = vitc__kern()->gemm->kc;
        vitc__gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, c0, N);
        const char *mcnc[] = {"mc=12,nc=32", "mc=36,nc=64", "mc=240,nc=4096"};
        for (int i = 0; i < 3; i++) {
            char spec[64];
            snprintf(spec, sizeof spec, "kc=%lld,%s", (long long)kc, mcnc[i]);
            assert_int_equal(vitc__blocking_force(spec), VITC_OK);
            vitc__gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, c1, N);
            if (memcmp(c0, c1, (size_t)(M * N) * 4))
                fail_msg("%s: blocking %s changed the fp32 GEMM's bits", tu_arch(a), spec);
        }
    }
    vitc_set_arch(NULL);
    vitc_set_gemm_backend(NULL);
    assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
    free(A), free(B), free(c0), free(c1);
}

/* bf16 / int8: the whole K in each tile, so any blocking gives the
 * reference kernel's bits (VITC_ARCH=generic runs it); AMX's bf16 adds the
 * same products in another order, so it is skipped here (test_precision
 * checks it within its bound). */
static void test_gemm_lp_forced(void **state) {
    (void)state;
    const vitc_precision precs[] = {VITC_PRECISION_BF16, VITC_PRECISION_INT8};
    const char *lp_blockings[] = {NULL, "lp_mc=12,lp_nb=1", "lp_mc=36,lp_nb=20K",
                                  "lp_mc=600,lp_nb=4M"};
    const int64_t shapes[][3] = {{197, 130, 768}, {40, 300, 200}, {400, 64, 96}};
    for (int p = 0; p < 2; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *x = rnd((size_t)(M * K), 2.0f), *W = rnd((size_t)(N * K), 0.1f);
            float *b = rnd((size_t)N, 0.5f), *r = rnd((size_t)(M * N), 1.0f);
            float *y0 = tu_falloc((size_t)(M * N)), *y1 = tu_falloc((size_t)(M * N));
            vitc__pweight pw;
            assert_int_equal(vitc__pweight_pack(&pw, W, N, K, precs[p]), VITC_OK);
            assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
            assert_int_equal(vitc_set_arch("generic"), VITC_OK);
            vitc_set_num_threads(1);
            assert_int_equal(vitc__linear_pw(y0, N, x, K, &pw, NULL, b, r, N, M, N, K, 0), VITC_OK);
            for (size_t f = 0; f < sizeof lp_blockings / sizeof *lp_blockings; f++) {
                assert_int_equal(vitc__blocking_force(lp_blockings[f]), VITC_OK);
                for (int a = 0; a < TU_NARCH; a++) {
                    if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
                    const vitc__lp_kernel *k = vitc__lp_kernel_for(precs[p]);
                    int amx_bf16 = precs[p] == VITC_PRECISION_BF16 && k == &vitc__lp_bf16_amx_emul;
#if defined(VITC_KERNELS_X86)
                    amx_bf16 |= precs[p] == VITC_PRECISION_BF16 && k == &vitc__lp_bf16_amx;
#endif
                    if (amx_bf16) continue;
                    for (int nt = 1; nt <= 2; nt++) {
                        vitc_set_num_threads(nt);
                        assert_int_equal(
                            vitc__linear_pw(y1, N, x, K, &pw, NULL, b, r, N, M, N, K, 0), VITC_OK);
                        if (memcmp(y0, y1, (size_t)(M * N) * 4))
                            fail_msg("%s on %s (%s), %d threads, blocking %s, %lldx%lldx%lld: "
                                     "differs from the reference kernel",
                                     vitc_precision_name(precs[p]), tu_arch(a),
                                     vitc_get_precision_paths(), nt,
                                     lp_blockings[f] ? lp_blockings[f] : "(rules)", (long long)M,
                                     (long long)N, (long long)K);
                    }
                }
            }
            vitc__pweight_free(&pw);
            free(x), free(W), free(b), free(r), free(y0), free(y1);
        }
    vitc_set_num_threads(0);
    vitc_set_arch(NULL);
    assert_int_equal(vitc__blocking_force(NULL), VITC_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_force_parse),
        cmocka_unit_test(test_gemm_fp32_forced),
        cmocka_unit_test(test_gemm_fp32_mc_nc_same_bits),
        cmocka_unit_test(test_gemm_lp_forced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
