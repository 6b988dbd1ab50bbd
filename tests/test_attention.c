/*
 * test_attention.c — the fused attention kernel (vitc__sdpa) on every path
 * this CPU supports, against an independent float64 softmax(q k^T s + m) v.
 *
 * Data is "|V| <= 1 style": q, k, v uniform in [-1, 1], so the tolerance is
 * max|got - ref| <= 1e-5 * max(1, |ref|) per element. The worst error seen
 * per group is printed, so a regression toward the bound is visible.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "kernels/kernels.h"

#include "testutil.h"
#include "attn_testutil.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* Under valgrind (50x slower, and without AVX-512) the largest cases are
 * thinned out; every code path and tail shape still runs. */
static int quick(void) { return RUNNING_ON_VALGRIND || getenv("VALGRIND") != NULL; }


/* ---- data --------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

enum layout { SEPARATE, FUSED_QKV };
enum maskkind {
    MASK_LS = ATU_MASK_LS, MASK_B1LS = ATU_MASK_B1LS, MASK_KEYPAD = ATU_MASK_KEYPAD,
    MASK_INF = ATU_MASK_COUNT, MASK_UNDERFLOW, NO_MASK
};

typedef struct tcase {
    int64_t B, H, L, S, D, Dv;
    enum layout layout;
    float scale_mul; /* 1: 1/sqrt(D); 100: logits x100 */
    enum maskkind mask;
    int probs;
} tcase;

/* Buffers of one case plus the descriptor that views them. */
typedef struct tdata {
    tcase c;
    vitc__sdpa_desc d;
    float *qkv, *q, *k, *v, *o, *mask, *probs, *lse;
    size_t o_n, p_n;
} tdata;

static void tdata_make(tdata *t, const tcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    vitc__sdpa_desc *d = &t->d;
    int64_t B = c->B, H = c->H, L = c->L, S = c->S, D = c->D, Dv = c->Dv;
    d->B = B, d->H = H, d->L = L, d->S = S, d->D = D, d->Dv = Dv;
    d->scale = c->scale_mul / sqrtf((float)D);
    int fused = c->layout == FUSED_QKV;
    atu_make_qkv(d, fused, &t->qkv, &t->q, &t->k, &t->v, &rng_state);
    /* O as [B, N, H, d] in the fused layout (as timm reads it), else [B, H, N, d]. */
    t->o_n = (size_t)(B * H * L * Dv);
    t->o = tu_falloc(t->o_n);
    d->o = t->o;
    atu_strides(fused, L, H, Dv, &d->o_sb, &d->o_sh, &d->o_sr);
    switch (c->mask) {
    case NO_MASK: break;
    case MASK_LS:
    case MASK_B1LS:
    case MASK_KEYPAD:
        t->mask = atu_make_mask(d, (enum atu_mask)c->mask, &rng_state);
        break;
    case MASK_INF: /* [B, H, L, S], 40% -inf, every 5th row fully masked */
        t->mask = tu_falloc((size_t)(B * H * L * S));
        for (int64_t i = 0; i < B * H * L; i++)
            for (int64_t j = 0; j < S; j++)
                t->mask[i * S + j] = (i % 5 == 2 || tu_urand(&rng_state) < -0.2f) ? -INFINITY : tu_urand(&rng_state);
        d->mask = t->mask, d->m_sb = H * L * S, d->m_sh = L * S, d->m_sr = S;
        break;
    case MASK_UNDERFLOW: /* one key per row at 0, the others 90..200 below */
        t->mask = tu_falloc((size_t)(L * S));
        for (int64_t l = 0; l < L; l++)
            for (int64_t j = 0; j < S; j++)
                t->mask[l * S + j] = j == (l * 7) % S ? 0.0f : -145.0f + 55.0f * tu_urand(&rng_state);
        d->mask = t->mask, d->m_sr = S;
        break;
    }
    if (c->probs) {
        t->p_n = (size_t)(B * H * L * S);
        t->probs = tu_falloc(t->p_n);
        d->probs = t->probs, d->p_sb = H * L * S, d->p_sh = L * S, d->p_sr = S;
    }
}

static void tdata_free(tdata *t) {
    free(t->qkv), free(t->q), free(t->k), free(t->v), free(t->o), free(t->mask), free(t->probs);
    free(t->lse);
}

/* Asks for the per-row log-sum-exp too ([B,H,L], as the backward reads it). */
static void tdata_want_lse(tdata *t) {
    vitc__sdpa_desc *d = &t->d;
    t->lse = tu_falloc((size_t)(d->B * d->H * d->L));
    d->lse = t->lse, d->lse_sb = d->H * d->L, d->lse_sh = d->L;
}

/* ---- float64 reference -------------------------------------------- */

/* ref_o [B,H,L,Dv], ref_p [B,H,L,S] and ref_lse [B,H,L] (both may be NULL)
 * in the natural layout. */
static void reference(const vitc__sdpa_desc *d, double *ref_o, double *ref_p, double *ref_lse) {
    double *s = malloc((size_t)(d->S ? d->S : 1) * sizeof(double));
    assert_non_null(s);
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t l = 0; l < d->L; l++) {
                const float *q = d->q + b * d->q_sb + h * d->q_sh + l * d->q_sr;
                double mx = -INFINITY;
                for (int64_t j = 0; j < d->S; j++) {
                    const float *k = d->k + b * d->k_sb + h * d->k_sh + j * d->k_sr;
                    double acc = 0.0;
                    for (int64_t c = 0; c < d->D; c++) acc += (double)q[c] * (double)k[c];
                    acc *= (double)d->scale;
                    if (d->mask) acc += d->mask[b * d->m_sb + h * d->m_sh + l * d->m_sr + j];
                    s[j] = acc;
                    if (acc > mx) mx = acc;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < d->S; j++) sum += (s[j] = exp(s[j] - mx));
                size_t row = (size_t)((b * d->H + h) * d->L + l);
                if (ref_lse) ref_lse[row] = mx == -INFINITY ? -INFINITY : mx + log(sum);
                double *o = ref_o + row * (size_t)d->Dv;
                for (int64_t c = 0; c < d->Dv; c++) o[c] = 0.0;
                /* mx = -inf: NaN weights (softmax); the output too when the
                 * weights are returned, else 0 (torch 2.x's SDPA) */
                if (mx == -INFINITY && !d->probs) continue;
                for (int64_t j = 0; j < d->S; j++) {
                    const float *v = d->v + b * d->v_sb + h * d->v_sh + j * d->v_sr;
                    double p = s[j] / sum;
                    if (ref_p) ref_p[row * (size_t)d->S + (size_t)j] = p;
                    for (int64_t c = 0; c < d->Dv; c++) o[c] += p * v[c];
                }
            }
    free(s);
}

/* Max over elements of |got - ref| / max(1, |ref|); NaN where exactly the
 * reference is NaN is a match, anything else NaN is an infinite error. */
static double compare(const vitc__sdpa_desc *d, const double *ref_o, const double *ref_p,
                      const double *ref_lse) {
    double worst = 0.0;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t l = 0; l < d->L; l++) {
                size_t row = (size_t)((b * d->H + h) * d->L + l);
                const float *o = d->o + b * d->o_sb + h * d->o_sh + l * d->o_sr;
                for (int64_t c = 0; c < d->Dv; c++) {
                    double r = ref_o[row * (size_t)d->Dv + (size_t)c], g = o[c];
                    double e = isnan(r) ? (isnan(g) ? 0.0 : INFINITY)
                                        : (isnan(g) ? INFINITY : fabs(g - r) / fmax(1.0, fabs(r)));
                    if (e > worst) worst = e;
                }
                if (ref_lse) {
                    double r = ref_lse[row], g = d->lse[b * d->lse_sb + h * d->lse_sh + l];
                    double e = r == g ? 0.0 : isnan(g) ? INFINITY : fabs(g - r) / fmax(1.0, fabs(r));
                    if (e > worst) worst = e;
                }
                if (!ref_p) continue;
                const float *p = d->probs + b * d->p_sb + h * d->p_sh + l * d->p_sr;
                for (int64_t j = 0; j < d->S; j++) {
                    double r = ref_p[row * (size_t)d->S + (size_t)j], g = p[j];
                    double e = isnan(r) ? (isnan(g) ? 0.0 : INFINITY)
                                        : (isnan(g) ? INFINITY : fabs(g - r));
                    if (e > worst) worst = e;
                }
            }
    return worst;
}

static double worst_seen[TU_NARCH];

/* Runs case c on every supported path (and once through the plain float
 * reference kernel), asserting the tolerance on o, probs and the per-row
 * log-sum-exp; the worst error goes to worst_seen. */
static void run_case(const tcase *c, double tol) {
    tdata t;
    tdata_make(&t, c);
    size_t rows = (size_t)(c->B * c->H * c->L);
    double *ref_o = malloc((rows * (size_t)c->Dv + 1) * sizeof(double));
    double *ref_p = c->probs ? malloc((rows * (size_t)c->S + 1) * sizeof(double)) : NULL;
    double *ref_lse = malloc((rows + 1) * sizeof(double));
    assert_non_null(ref_o);
    assert_non_null(ref_lse);
    tdata_want_lse(&t);
    reference(&t.d, ref_o, ref_p, ref_lse);
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        for (size_t i = 0; i < t.o_n; i++) t.o[i] = 12345.0f; /* every element must be written */
        for (size_t i = 0; i < t.p_n; i++) t.probs[i] = 12345.0f;
        for (size_t i = 0; i < rows; i++) t.lse[i] = 12345.0f;
        assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
        double e = compare(&t.d, ref_o, ref_p, ref_lse);
        if (e > worst_seen[a]) worst_seen[a] = e;
        if (!(e <= tol))
            fail_msg("%s: B%lld H%lld L%lld S%lld D%lld Dv%lld layout %d x%g mask %d probs %d: "
                     "error %.3g > %.3g",
                     tu_arch(a), (long long)c->B, (long long)c->H, (long long)c->L,
                     (long long)c->S, (long long)c->D, (long long)c->Dv, c->layout,
                     (double)c->scale_mul, c->mask, c->probs, e, tol);
    }
    /* The reference kernel, row by row, must meet the same bound. */
    if (rows * (size_t)c->S * (size_t)(c->D + c->Dv) < 50000000u) {
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->H; h++) vitc__sdpa_ref_rows(&t.d, b, h, 0, c->L);
        double e = compare(&t.d, ref_o, ref_p, ref_lse);
        if (!(e <= tol)) fail_msg("reference kernel: error %.3g > %.3g", e, tol);
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    free(ref_o);
    free(ref_p);
    free(ref_lse);
    tdata_free(&t);
}

static void print_worst(const char *what) {
    printf("    %-22s worst error:", what);
    for (int a = 0; a < TU_NARCH; a++)
        if (vitc__cpu_has((vitc__arch)a)) printf(" %s %.2e", tu_arch(a), worst_seen[a]);
    printf("\n");
    memset(worst_seen, 0, sizeof worst_seen);
}

static const double TOL = 1e-5;

/* ---- tests -------------------------------------------------------- */

static void test_self_sizes(void **state) {
    (void)state;
    static const int64_t Ns[] = {1, 16, 17, 31, 33, 197, 255, 256, 257, 1023};
    static const int64_t ds[] = {8, 32, 40, 64, 80, 128};
    for (size_t i = 0; i < sizeof Ns / sizeof *Ns; i++)
        for (size_t j = 0; j < sizeof ds / sizeof *ds; j++) {
            int64_t N = Ns[i];
            if (quick() && N >= 1023 && ds[j] != 8) continue;
            /* Small N also with B=3, H=12 (several heads, batch strides). */
            tcase c = {N <= 33 ? 3 : 1, N <= 33 ? 12 : 1, N, N, ds[j], ds[j], SEPARATE, 1, NO_MASK,
                       0};
            run_case(&c, TOL);
        }
    print_worst("self N x d");
}

static void test_long(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 1, 4097, 4097, 8, 8, SEPARATE, 1, NO_MASK, 0},
        {1, 2, 65, 4097, 64, 64, SEPARATE, 1, NO_MASK, 0},    /* many key blocks */
        {1, 1, 4097, 33, 40, 40, SEPARATE, 1, NO_MASK, 0},    /* many query blocks */
        {1, 1, 1024, 1024, 64, 64, SEPARATE, 1, NO_MASK, 0},  /* Br 192 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
        if (!quick() || cs[i].H * cs[i].L * cs[i].S * cs[i].D < 40000000) run_case(&cs[i], TOL);
    print_worst("long N");
}

static void test_cross_and_dv(void **state) {
    (void)state;
    const tcase cs[] = {
        {8, 1, 64, 64, 8, 64, SEPARATE, 1, NO_MASK, 0},     /* ConvSABlock: d = C/8, Dv = C */
        {2, 1, 300, 300, 8, 64, SEPARATE, 1, NO_MASK, 0},
        {3, 12, 17, 33, 64, 32, SEPARATE, 1, NO_MASK, 0},   /* cross, Dv < D */
        {1, 3, 257, 31, 40, 80, SEPARATE, 1, NO_MASK, 0},
        {3, 1, 33, 1023, 80, 40, SEPARATE, 1, NO_MASK, 0},
        {1, 1, 300, 300, 512, 512, SEPARATE, 1, NO_MASK, 0}, /* SD VAE: d = 512 */
        /* Dv >= 256 packs V in column panels: a last row group under 12
         * rows, a part key block, Dv != D, an odd panel count */
        {1, 1, 301, 529, 256, 256, SEPARATE, 1, NO_MASK, 0},
        {2, 2, 37, 300, 64, 288, SEPARATE, 1, NO_MASK, 0},
        {2, 2, 5, 7, 1, 3, SEPARATE, 1, NO_MASK, 0},
        {1, 1, 9, 300, 24, 8, SEPARATE, 1, NO_MASK, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], TOL);
    print_worst("cross / Dv != D");
}

static void test_fused_qkv(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 12, 197, 197, 64, 64, FUSED_QKV, 1, NO_MASK, 0}, /* ViT-B/16 */
        {3, 12, 17, 17, 40, 40, FUSED_QKV, 1, NO_MASK, 0},
        {3, 1, 257, 257, 80, 80, FUSED_QKV, 1, NO_MASK, 0},
        {1, 4, 513, 513, 8, 8, FUSED_QKV, 1, NO_MASK, 0},
        {1, 1, 290, 290, 256, 256, FUSED_QKV, 1, NO_MASK, 0}, /* V panels from qkv rows */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], TOL);
    print_worst("fused qkv layout");
}

static void test_masks(void **state) {
    (void)state;
    const tcase cs[] = {
        {3, 12, 33, 31, 32, 32, SEPARATE, 1, MASK_LS, 0},
        {3, 2, 65, 300, 64, 64, SEPARATE, 1, MASK_B1LS, 0},
        {3, 2, 17, 513, 40, 40, SEPARATE, 1, MASK_KEYPAD, 0},
        {3, 12, 33, 33, 64, 64, SEPARATE, 1, MASK_INF, 0},
        {1, 2, 40, 700, 16, 24, SEPARATE, 1, MASK_INF, 0},    /* -inf across key blocks */
        {2, 3, 50, 257, 64, 64, SEPARATE, 1, MASK_UNDERFLOW, 0},
        {1, 1, 197, 197, 8, 8, SEPARATE, 1, MASK_UNDERFLOW, 0},
        {1, 2, 40, 700, 32, 256, SEPARATE, 1, MASK_INF, 0},   /* V panels, -inf rows */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], TOL);
    print_worst("masks");
}

static void test_probs(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 12, 197, 197, 64, 64, FUSED_QKV, 1, NO_MASK, 1},
        {3, 2, 33, 300, 40, 80, SEPARATE, 1, NO_MASK, 1},
        {3, 12, 33, 33, 64, 64, SEPARATE, 1, MASK_INF, 1},
        {1, 2, 40, 700, 16, 24, SEPARATE, 1, MASK_INF, 1},
        {2, 1, 100, 600, 8, 8, SEPARATE, 100, NO_MASK, 1},
        {1, 1, 61, 300, 256, 256, SEPARATE, 1, MASK_KEYPAD, 1}, /* V panels */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], TOL);
    print_worst("probs output");
}

/* Logits x100: the max subtraction must keep exp finite. The float32 dot
 * products themselves are off by ~|logit| * 1e-7 here, which no kernel can
 * avoid, so the bound is the one the plain float kernel also meets. */
static void test_large_logits(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 2, 197, 197, 64, 64, SEPARATE, 100, NO_MASK, 0},
        {1, 1, 300, 600, 8, 64, SEPARATE, 100, NO_MASK, 0},
        {1, 1, 100, 1000, 128, 128, SEPARATE, 100, NO_MASK, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i], 1e-4);
    print_worst("logits x100");
}

/* Constructed inputs with a known exact answer. */
static void check_structured(int kind, int64_t L, int64_t S, int64_t D, int64_t Dv) {
    tcase c = {2, 3, L, S, D, Dv, SEPARATE, 1, NO_MASK, 0};
    tdata t;
    tdata_make(&t, &c);
    int64_t BH = 6;
    if (kind == 0) /* V = ones: softmax rows sum to 1 */
        for (size_t i = 0; i < (size_t)(BH * S * Dv); i++) t.v[i] = 1.0f;
    if (kind == 1) /* all keys equal: uniform weights, O = mean of V */
        for (int64_t i = 0; i < BH; i++)
            for (int64_t j = 1; j < S; j++) memcpy(t.k + (i * S + j) * D, t.k + i * S * D, (size_t)D * 4);
    if (kind == 2) { /* q = 1, key j* = 8 * 1, others random: one-hot on j* */
        for (size_t i = 0; i < (size_t)(BH * L * D); i++) t.q[i] = 1.0f;
        for (int64_t i = 0; i < BH; i++)
            for (int64_t c2 = 0; c2 < D; c2++) t.k[(i * S + (S / 2)) * D + c2] = 8.0f;
        t.d.scale = 8.0f; /* winner by >= 8*8*D*(1-... ) logits: the rest underflow */
    }
    if (kind == 3) { /* q = 1, every key -8 * 1: equal scores thousands below 0, O = mean of V;
                      * a row max that took the S tile's zero padding (0) would
                      * underflow every exp and give NaN */
        for (size_t i = 0; i < (size_t)(BH * L * D); i++) t.q[i] = 1.0f;
        for (size_t i = 0; i < (size_t)(BH * S * D); i++) t.k[i] = -8.0f;
        t.d.scale = 8.0f;
    }
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
        double worst = 0;
        for (int64_t i = 0; i < BH; i++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t c2 = 0; c2 < Dv; c2++) {
                    double want;
                    if (kind == 0) want = 1.0;
                    else if (kind == 1 || kind == 3) {
                        want = 0;
                        for (int64_t j = 0; j < S; j++) want += t.v[(i * S + j) * Dv + c2];
                        want /= (double)S;
                    } else
                        want = t.v[(i * S + S / 2) * Dv + c2];
                    double e = fabs(t.o[(i * L + l) * Dv + c2] - want);
                    if (!(e <= worst)) worst = e;
                }
        if (!(worst <= 2e-6))
            fail_msg("%s: structured case %d (L%lld S%lld D%lld Dv%lld) error %.3g", tu_arch(a),
                     kind, (long long)L, (long long)S, (long long)D, (long long)Dv, worst);
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    tdata_free(&t);
}

static void test_structured(void **state) {
    (void)state;
    for (int kind = 0; kind < 4; kind++) {
        check_structured(kind, 33, 257, 64, 64);
        check_structured(kind, 197, 197, 40, 80);
        check_structured(kind, 17, 1000, 8, 8);
    }
}

/* Each output row has one owner and a fixed key order: 1 and 2 threads
 * must agree bit for bit, on every path. */
static void test_threads_bitwise(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 12, 197, 197, 64, 64, FUSED_QKV, 1, NO_MASK, 0},
        {2, 3, 600, 700, 40, 24, SEPARATE, 1, MASK_B1LS, 1},
        {1, 1, 1100, 300, 8, 64, SEPARATE, 1, NO_MASK, 0},
        /* one head of long rows: its last query blocks split finer at 2
         * threads (the run's tail), V in column panels (Dv >= 256) */
        {1, 1, 1100, 300, 256, 256, SEPARATE, 1, NO_MASK, 0},
    };
    int saved = vitc_get_num_threads();
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        tdata t;
        tdata_make(&t, &cs[i]);
        float *o1 = tu_falloc(t.o_n), *p1 = tu_falloc(t.p_n);
        for (int a = 0; a < TU_NARCH; a++) {
            if (!vitc__cpu_has((vitc__arch)a)) continue;
            assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
            vitc_set_num_threads(1);
            assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
            memcpy(o1, t.o, t.o_n * 4);
            if (t.p_n) memcpy(p1, t.probs, t.p_n * 4);
            vitc_set_num_threads(2);
            memset(t.o, 0, t.o_n * 4);
            assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
            assert_memory_equal(o1, t.o, t.o_n * 4);
            if (t.p_n) assert_memory_equal(p1, t.probs, t.p_n * 4);
        }
        free(o1);
        free(p1);
        tdata_free(&t);
    }
    vitc_set_num_threads(saved);
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
}

static void test_mxcsr_restored(void **state) {
    (void)state;
#if defined(__x86_64__)
    tcase c = {1, 2, 40, 300, 64, 64, SEPARATE, 1, NO_MASK, 0};
    tdata t;
    tdata_make(&t, &c);
    unsigned int before = _mm_getcsr();
    const unsigned int modes[2] = {before & ~0x8040u, before | 0x8040u};
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        for (int m = 0; m < 2; m++) {
            _mm_setcsr(modes[m]);
            if (_mm_getcsr() != modes[m]) { /* valgrind keeps FTZ/DAZ off */
                _mm_setcsr(before);
                continue;
            }
            assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
            unsigned int after = _mm_getcsr();
            _mm_setcsr(before);
            /* Exception flags (low 6 bits) may be raised; control bits may not move. */
            assert_int_equal(after & ~0x3fu, modes[m] & ~0x3fu);
        }
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    tdata_free(&t);
#else
    skip();
#endif
}

static void test_bad_input(void **state) {
    (void)state;
    assert_int_equal(vitc__sdpa(NULL), VITC_ERR_INVALID_ARG);
    vitc__sdpa_desc d;
    memset(&d, 0, sizeof d);
    d.B = 1, d.H = 1, d.L = -1, d.S = 4, d.D = 4, d.Dv = 4;
    assert_int_equal(vitc__sdpa(&d), VITC_ERR_INVALID_ARG);
    d.S = (int64_t)1 << 40; /* absurd sizes are refused, not overflowed */
    assert_int_equal(vitc__sdpa(&d), VITC_ERR_INVALID_ARG);
    d.S = 4;
    d.L = 4; /* NULL data with work to do */
    assert_int_equal(vitc__sdpa(&d), VITC_ERR_INVALID_ARG);
    d.L = 0; /* nothing to do */
    assert_int_equal(vitc__sdpa(&d), VITC_OK);
    /* No keys: an empty weighted sum is 0 (torch: softmax of [L,0] @ [0,Dv]). */
    float q[8], o[8];
    for (int i = 0; i < 8; i++) q[i] = 1.0f, o[i] = NAN;
    float lse[2] = {0.0f, 0.0f};
    d.L = 2, d.S = 0, d.q = q, d.k = q, d.v = q, d.o = o, d.q_sr = 4, d.o_sr = 4, d.scale = 1;
    d.lse = lse; /* and log(sum of nothing) = -inf */
    assert_int_equal(vitc__sdpa(&d), VITC_OK);
    for (int i = 0; i < 8; i++) assert_true(o[i] == 0.0f);
    assert_true(lse[0] == -INFINITY && lse[1] == -INFINITY);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_sizes),     cmocka_unit_test(test_long),
        cmocka_unit_test(test_cross_and_dv),   cmocka_unit_test(test_fused_qkv),
        cmocka_unit_test(test_masks),          cmocka_unit_test(test_probs),
        cmocka_unit_test(test_large_logits),   cmocka_unit_test(test_structured),
        cmocka_unit_test(test_threads_bitwise), cmocka_unit_test(test_mxcsr_restored),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
