/*
 * test_relpos_attention.c — the fused attention with decomposed relative
 * positions (vitc__sdpa_desc.rel_h / rel_w, SAM's ViT-det attention) on
 * every path this CPU supports, against a float64 softmax that builds the
 * whole [L, S] bias explicitly from q and the position tables:
 *   bias[l][j] = q_l . Rh[lh - jh + kh - 1] + q_l . Rw[lw - jw + kw - 1]
 * with (lh, lw) and (jh, jw) the grid positions of query l and key j.
 * Tolerance as test_attention.c: max|got - ref| <= 1e-5 * max(1, |ref|).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/kernels.h"
#include "kernels/attention_impl.h"
#include "nn/relpos.h"

#include "testutil.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* Under valgrind (50x slower) the 64 x 64 token case is skipped. */
static int quick(void) { return RUNNING_ON_VALGRIND || getenv("VALGRIND") != NULL; }

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

typedef struct rcase {
    int64_t B, H, gh, gw, D; /* query grid == key grid gh x gw; Dv == D */
    int mask;                /* 1: an additive [L, S] mask (broadcast over b, h) too */
} rcase;

typedef struct rdata {
    vitc__sdpa_desc d;
    float *q, *k, *v, *o, *lse, *mask; /* [B,H,L,D] x3, [B,H,L,D], [B,H,L], [L,S] */
    float *th, *tw;                    /* [H, 2gh-1, D], [H, 2gw-1, D] position tables */
    float *rh, *rw;                    /* [B,H,L,gh], [B,H,L,gw] */
} rdata;

/* rel_h / rel_w as the model computes them (float, q unscaled). */
static void rel_tables(rdata *t, const rcase *c) {
    const int64_t L = c->gh * c->gw, D = c->D;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t l = 0; l < L; l++) {
                const float *ql = t->q + ((b * c->H + h) * L + l) * D;
                int64_t lh = l / c->gw, lw = l % c->gw;
                float *rh = t->rh + ((b * c->H + h) * L + l) * c->gh;
                float *rw = t->rw + ((b * c->H + h) * L + l) * c->gw;
                for (int64_t a = 0; a < c->gh; a++) {
                    const float *r = t->th + (h * (2 * c->gh - 1) + lh - a + c->gh - 1) * D;
                    float s = 0.0f;
                    for (int64_t x = 0; x < D; x++) s += ql[x] * r[x];
                    rh[a] = s;
                }
                for (int64_t a = 0; a < c->gw; a++) {
                    const float *r = t->tw + (h * (2 * c->gw - 1) + lw - a + c->gw - 1) * D;
                    float s = 0.0f;
                    for (int64_t x = 0; x < D; x++) s += ql[x] * r[x];
                    rw[a] = s;
                }
            }
}

static void rdata_make(rdata *t, const rcase *c) {
    memset(t, 0, sizeof *t);
    const int64_t B = c->B, H = c->H, L = c->gh * c->gw, D = c->D;
    const size_t n = (size_t)(B * H * L * D);
    t->q = tu_falloc(n), t->k = tu_falloc(n), t->v = tu_falloc(n), t->o = tu_falloc(n);
    t->lse = tu_falloc((size_t)(B * H * L));
    tu_fill(&rng_state, t->q, n, 1.0f);
    tu_fill(&rng_state, t->k, n, 1.0f);
    tu_fill(&rng_state, t->v, n, 1.0f);
    /* Tables of SAM's trained size: a bias of a few units, like the scores. */
    size_t nth = (size_t)(H * (2 * c->gh - 1) * D), ntw = (size_t)(H * (2 * c->gw - 1) * D);
    t->th = tu_falloc(nth), t->tw = tu_falloc(ntw);
    tu_fill(&rng_state, t->th, nth, 0.5f);
    tu_fill(&rng_state, t->tw, ntw, 0.5f);
    t->rh = tu_falloc((size_t)(B * H * L * c->gh));
    t->rw = tu_falloc((size_t)(B * H * L * c->gw));
    rel_tables(t, c);
    vitc__sdpa_desc *d = &t->d;
    d->B = B, d->H = H, d->L = L, d->S = L, d->D = D, d->Dv = D;
    d->q = t->q, d->q_sb = H * L * D, d->q_sh = L * D, d->q_sr = D;
    d->k = t->k, d->k_sb = H * L * D, d->k_sh = L * D, d->k_sr = D;
    d->v = t->v, d->v_sb = H * L * D, d->v_sh = L * D, d->v_sr = D;
    d->o = t->o, d->o_sb = H * L * D, d->o_sh = L * D, d->o_sr = D;
    d->scale = 1.0f / sqrtf((float)D);
    d->lse = t->lse, d->lse_sb = H * L, d->lse_sh = L;
    d->rel_h = t->rh, d->rh_sb = H * L * c->gh, d->rh_sh = L * c->gh, d->rh_sr = c->gh;
    d->rel_w = t->rw, d->rw_sb = H * L * c->gw, d->rw_sh = L * c->gw, d->rw_sr = c->gw;
    d->kh = c->gh, d->kw = c->gw;
    if (c->mask) {
        t->mask = tu_falloc((size_t)(L * L));
        tu_fill(&rng_state, t->mask, (size_t)(L * L), 2.0f);
        for (int64_t l = 0; l < L; l++) t->mask[l * L + (l * 7) % L] = -INFINITY;
        d->mask = t->mask, d->m_sr = L;
    }
}

static void rdata_free(rdata *t) {
    free(t->q), free(t->k), free(t->v), free(t->o), free(t->lse), free(t->mask);
    free(t->th), free(t->tw), free(t->rh), free(t->rw);
}

/* float64: the full bias from the tables, then softmax(scale q k^T + bias + mask) v. */
static void reference(const rdata *t, const rcase *c, double *ref_o, double *ref_lse) {
    const int64_t L = c->gh * c->gw, D = c->D;
    double *sc = malloc((size_t)L * sizeof(double));
    assert_non_null(sc);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++) {
            const float *q = t->q + (b * c->H + h) * L * D, *k = t->k + (b * c->H + h) * L * D;
            const float *v = t->v + (b * c->H + h) * L * D;
            for (int64_t l = 0; l < L; l++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < L; j++) {
                    const float *rh = t->th + (h * (2 * c->gh - 1) + l / c->gw - j / c->gw + c->gh - 1) * D;
                    const float *rw = t->tw + (h * (2 * c->gw - 1) + l % c->gw - j % c->gw + c->gw - 1) * D;
                    double s = 0, bh = 0, bw = 0;
                    for (int64_t x = 0; x < D; x++) {
                        s += (double)q[l * D + x] * k[j * D + x];
                        bh += (double)q[l * D + x] * rh[x];
                        bw += (double)q[l * D + x] * rw[x];
                    }
                    sc[j] = s * (double)t->d.scale + bh + bw + (t->mask ? t->mask[l * L + j] : 0.0);
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0;
                double *o = ref_o + ((b * c->H + h) * L + l) * D;
                for (int64_t x = 0; x < D; x++) o[x] = 0;
                for (int64_t j = 0; j < L; j++) {
                    double e = exp(sc[j] - mx);
                    sum += e;
                    for (int64_t x = 0; x < D; x++) o[x] += e * v[j * D + x];
                }
                for (int64_t x = 0; x < D; x++) o[x] /= sum;
                ref_lse[(b * c->H + h) * L + l] = mx + log(sum);
            }
        }
    free(sc);
}

static double rel_err(const float *got, const double *ref, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (fabs(ref[i]) > 1 ? fabs(ref[i]) : 1);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

static const double TOL = 1e-5;

static void run_case(const rcase *c) {
    rdata t;
    rdata_make(&t, c);
    const int64_t L = c->gh * c->gw;
    const size_t no = (size_t)(c->B * c->H * L * c->D), nl = (size_t)(c->B * c->H * L);
    double *ref_o = malloc(no * sizeof(double)), *ref_lse = malloc(nl * sizeof(double));
    assert_non_null(ref_o);
    assert_non_null(ref_lse);
    reference(&t, c, ref_o, ref_lse);
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        for (size_t i = 0; i < no; i++) t.o[i] = 12345.0f;
        for (size_t i = 0; i < nl; i++) t.lse[i] = 12345.0f;
        assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
        double eo = rel_err(t.o, ref_o, no), el = rel_err(t.lse, ref_lse, nl);
        if (!(eo <= TOL && el <= TOL))
            fail_msg("%s: B%lld H%lld grid %lldx%lld D%lld mask %d: o error %.3g, lse error %.3g",
                     tu_arch(a), (long long)c->B, (long long)c->H, (long long)c->gh,
                     (long long)c->gw, (long long)c->D, c->mask, eo, el);
        /* The probs path (two passes, each adding the bias): the same o,
         * and its rows are distributions whose log-sum-exp is the lse's. */
        float *probs = tu_falloc(nl * (size_t)L);
        t.d.probs = probs, t.d.p_sb = c->H * L * L, t.d.p_sh = L * L, t.d.p_sr = L;
        assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
        eo = rel_err(t.o, ref_o, no);
        if (!(eo <= TOL)) fail_msg("%s probs path: o error %.3g", tu_arch(a), eo);
        for (size_t r = 0; r < nl; r++) {
            double sum = 0;
            for (int64_t j = 0; j < L; j++) sum += probs[r * (size_t)L + (size_t)j];
            assert_true(fabs(sum - 1.0) < 1e-5);
        }
        t.d.probs = NULL;
        free(probs);
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    /* The plain reference kernel, the same bound. */
    for (size_t i = 0; i < no; i++) t.o[i] = 12345.0f;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++) vitc__sdpa_ref_rows(&t.d, b, h, 0, L);
    double e = rel_err(t.o, ref_o, no);
    if (!(e <= TOL)) fail_msg("reference kernel: error %.3g", e);
    /* A bias that matters: without it the output must differ. */
    const float *rh = t.d.rel_h;
    t.d.rel_h = NULL;
    assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
    assert_true(rel_err(t.o, ref_o, no) > 1e-3);
    t.d.rel_h = rh;
    free(ref_o);
    free(ref_lse);
    rdata_free(&t);
}

/* ---- backward ---------------------------------------------------- */

static const double TOL_BWD = 1e-4; /* as test_attention_backward.c */

/* max|got - ref| / max(1, max|ref|) over a whole gradient. */
static double grad_err(const float *got, const double *ref, size_t n) {
    double scale = 1, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / scale;
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* float64 gradients of o for q, k, v (rel_h, rel_w held fixed: they are
 * inputs of their own) and for rel_h, rel_w, from the explicit [L, S]
 * scores: dS = P o (dO V^T - rowsum(dO o O)). */
static void reference_bwd(const rdata *t, const rcase *c, const float *dout, double *dq,
                          double *dk, double *dv, double *drh, double *drw) {
    const int64_t L = c->gh * c->gw, D = c->D, gh = c->gh, gw = c->gw;
    double *p = malloc((size_t)L * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
    assert_non_null(p);
    assert_non_null(o);
    const double sc = t->d.scale;
    memset(dk, 0, (size_t)(c->B * c->H * L * D) * sizeof(double));
    memset(dv, 0, (size_t)(c->B * c->H * L * D) * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++) {
            const int64_t hd = (b * c->H + h) * L;
            const float *q = t->q + hd * D, *k = t->k + hd * D, *v = t->v + hd * D;
            const float *rh = t->rh + hd * gh, *rw = t->rw + hd * gw;
            for (int64_t l = 0; l < L; l++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < L; j++) {
                    double s = 0;
                    for (int64_t x = 0; x < D; x++) s += (double)q[l * D + x] * k[j * D + x];
                    p[j] = s * sc + rh[l * gh + j / gw] + rw[l * gw + j % gw] +
                           (t->mask ? t->mask[l * L + j] : 0.0);
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < L; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t x = 0; x < D; x++) o[x] = 0;
                for (int64_t j = 0; j < L; j++) {
                    p[j] /= sum;
                    for (int64_t x = 0; x < D; x++) o[x] += p[j] * v[j * D + x];
                }
                const float *dol = dout + (hd + l) * D;
                double Dl = 0;
                for (int64_t x = 0; x < D; x++) Dl += dol[x] * o[x];
                double *dql = dq + (hd + l) * D;
                double *dhl = drh + (hd + l) * gh, *dwl = drw + (hd + l) * gw;
                for (int64_t x = 0; x < D; x++) dql[x] = 0;
                for (int64_t a = 0; a < gh; a++) dhl[a] = 0;
                for (int64_t a = 0; a < gw; a++) dwl[a] = 0;
                for (int64_t j = 0; j < L; j++) {
                    double dp = 0;
                    for (int64_t x = 0; x < D; x++) {
                        dp += (double)dol[x] * v[j * D + x];
                        dv[(hd + j) * D + x] += p[j] * dol[x];
                    }
                    double ds = p[j] * (dp - Dl);
                    dhl[j / gw] += ds;
                    dwl[j % gw] += ds;
                    for (int64_t x = 0; x < D; x++) {
                        dql[x] += sc * ds * k[j * D + x];
                        dk[(hd + j) * D + x] += sc * ds * q[l * D + x];
                    }
                }
            }
        }
    free(p);
    free(o);
}

static void run_bwd_case(const rcase *c) {
    rdata t;
    rdata_make(&t, c);
    const int64_t B = c->B, H = c->H, L = c->gh * c->gw, D = c->D;
    const size_t n = (size_t)(B * H * L * D), nh = (size_t)(B * H * L * c->gh),
                 nw = (size_t)(B * H * L * c->gw);
    float *dout = tu_falloc(n), *dq = tu_falloc(n), *dk = tu_falloc(n), *dv = tu_falloc(n);
    float *drh = tu_falloc(nh), *drw = tu_falloc(nw);
    tu_fill(&rng_state, dout, n, 1.0f);
    double *rq = malloc(n * sizeof(double)), *rk = malloc(n * sizeof(double));
    double *rv = malloc(n * sizeof(double)), *rh = malloc(nh * sizeof(double));
    double *rw = malloc(nw * sizeof(double));
    assert_true(rq && rk && rv && rh && rw);
    reference_bwd(&t, c, dout, rq, rk, rv, rh, rw);
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = t.d;
    bd.dout = dout, bd.do_sb = H * L * D, bd.do_sh = L * D, bd.do_sr = D;
    bd.dq = dq, bd.dq_sb = H * L * D, bd.dq_sh = L * D, bd.dq_sr = D;
    bd.dk = dk, bd.dk_sb = H * L * D, bd.dk_sh = L * D, bd.dk_sr = D;
    bd.dv = dv, bd.dv_sb = H * L * D, bd.dv_sh = L * D, bd.dv_sr = D;
    vitc__sdpa_rel_grad rg = {drh, H * L * c->gh, L * c->gh, c->gh, drw, H * L * c->gw, L * c->gw, c->gw};
    for (int a = -1; a < TU_NARCH; a++) { /* -1: the reference kernel */
        if (a >= 0 && !vitc__cpu_has((vitc__arch)a)) continue;
        if (a >= 0) assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        assert_int_equal(vitc__sdpa(&t.d), VITC_OK); /* o and lse of this path */
        for (size_t i = 0; i < n; i++) dq[i] = dk[i] = dv[i] = 12345.0f;
        for (size_t i = 0; i < nh; i++) drh[i] = 12345.0f;
        for (size_t i = 0; i < nw; i++) drw[i] = 12345.0f;
        if (a < 0) vitc__sdpa_backward_ref_rel(&bd, &rg);
        else assert_int_equal(vitc__sdpa_backward_rel(&bd, &rg), VITC_OK);
        double e[5] = {grad_err(dq, rq, n), grad_err(dk, rk, n), grad_err(dv, rv, n),
                       grad_err(drh, rh, nh), grad_err(drw, rw, nw)};
        for (int x = 0; x < 5; x++)
            if (!(e[x] <= TOL_BWD))
                fail_msg("%s: B%lld H%lld grid %lldx%lld D%lld mask %d: d%s error %.3g",
                         a < 0 ? "reference" : tu_arch(a), (long long)B, (long long)H,
                         (long long)c->gh, (long long)c->gw, (long long)D, c->mask,
                         (const char *[]){"q", "k", "v", "rel_h", "rel_w"}[x], e[x]);
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    free(dout), free(dq), free(dk), free(dv), free(drh), free(drw);
    free(rq), free(rk), free(rv), free(rh), free(rw);
    rdata_free(&t);
}

/* Whole heads per task (8+ heads) and the split plan (key chunks, then
 * query chunks: fewer heads), grids over several key and query blocks. */
static void test_backward(void **state) {
    (void)state;
    static const rcase cases[] = {
        {1, 1, 4, 4, 16, 0},   {2, 4, 5, 7, 32, 0},  {1, 2, 14, 14, 64, 0},
        {1, 1, 17, 15, 32, 1}, {2, 4, 6, 6, 16, 1},  {1, 1, 20, 20, 48, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_bwd_case(&cases[i]);
}

/* ---- the terms from q and the tables (src/nn/relpos.c) -------------- */

/* torch F.interpolate(mode="linear", align_corners=False) values, and the
 * backward as the adjoint: <R x, y> == <x, R^T y>. */
static void test_resample(void **state) {
    (void)state;
    const float up_in[3] = {0, 1, 2}, up_want[5] = {0.0f, 0.4f, 1.0f, 1.6f, 2.0f};
    const float dn_in[7] = {0, 1, 2, 3, 5, 8, 13}, dn_want[3] = {0.6666666f, 3.0f, 9.666665f};
    float out[7];
    assert_int_equal(vitc__nn_relpos_resample(out, up_in, 3, 5, 1), VITC_OK);
    for (int i = 0; i < 5; i++) assert_true(fabsf(out[i] - up_want[i]) < 1e-6f);
    assert_int_equal(vitc__nn_relpos_resample(out, dn_in, 7, 3, 1), VITC_OK);
    for (int i = 0; i < 3; i++) assert_true(fabsf(out[i] - dn_want[i]) < 1e-5f);
    const int64_t T = 27, n = 13, D = 5; /* SAM-B's 27-row tables resampled to a 7 x 7 window */
    float x[27 * 5], y[13 * 5], rx[13 * 5], rty[27 * 5];
    tu_fill(&rng_state, x, (size_t)(T * D), 1.0f);
    tu_fill(&rng_state, y, (size_t)(n * D), 1.0f);
    memset(rty, 0, sizeof rty);
    assert_int_equal(vitc__nn_relpos_resample(rx, x, T, n, D), VITC_OK);
    assert_int_equal(vitc__nn_relpos_resample_backward(rty, y, T, n, D), VITC_OK);
    double a = 0, b = 0;
    for (int64_t i = 0; i < n * D; i++) a += (double)rx[i] * y[i];
    for (int64_t i = 0; i < T * D; i++) b += (double)x[i] * rty[i];
    assert_true(fabs(a - b) < 1e-4 * (1 + fabs(a)));
    assert_int_equal(vitc__nn_relpos_resample(rx, x, 0, n, D), VITC_ERR_INVALID_ARG);
}

/* The whole chain: relpos forward -> fused attention -> its backward ->
 * relpos backward, against float64: o, and the gradients for q (directly
 * and through the terms), k, v and the two tables (shared by the heads). */
static void run_chain_case(const rcase *c) {
    rdata t;
    rdata_make(&t, c);
    const int64_t B = c->B, H = c->H, L = c->gh * c->gw, D = c->D, gh = c->gh, gw = c->gw;
    const int64_t Th = 2 * gh - 1, Tw = 2 * gw - 1;
    for (int64_t h = 1; h < H; h++) { /* one table for every head, as SAM */
        memcpy(t.th + h * Th * D, t.th, (size_t)(Th * D) * sizeof(float));
        memcpy(t.tw + h * Tw * D, t.tw, (size_t)(Tw * D) * sizeof(float));
    }
    rel_tables(&t, c);
    const size_t n = (size_t)(B * H * L * D), nh = (size_t)(B * H * L * gh),
                 nw = (size_t)(B * H * L * gw);
    float *rh = tu_falloc(nh), *rw = tu_falloc(nw);
    vitc__nn_relpos rp = {B, H, gh, gw, D, t.q, H * L * D, L * D, D, t.th, t.tw,
                          rh, H * L * gh, L * gh, gh, rw, H * L * gw, L * gw, gw};
    assert_int_equal(vitc__nn_relpos_forward(&rp), VITC_OK);
    for (size_t i = 0; i < nh; i++) assert_true(fabsf(rh[i] - t.rh[i]) <= 1e-5f * (1 + fabsf(t.rh[i])));
    for (size_t i = 0; i < nw; i++) assert_true(fabsf(rw[i] - t.rw[i]) <= 1e-5f * (1 + fabsf(t.rw[i])));
    vitc__nn_relpos_view(&rp, &t.d);
    assert_int_equal(vitc__sdpa(&t.d), VITC_OK);

    float *dout = tu_falloc(n), *dq = tu_falloc(n), *dk = tu_falloc(n), *dv = tu_falloc(n);
    float *drh = tu_falloc(nh), *drw = tu_falloc(nw);
    float *dth = tu_falloc((size_t)(Th * D)), *dtw = tu_falloc((size_t)(Tw * D));
    memset(dth, 0, (size_t)(Th * D) * sizeof(float));
    memset(dtw, 0, (size_t)(Tw * D) * sizeof(float));
    tu_fill(&rng_state, dout, n, 1.0f);
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = t.d;
    bd.dout = dout, bd.do_sb = H * L * D, bd.do_sh = L * D, bd.do_sr = D;
    bd.dq = dq, bd.dq_sb = H * L * D, bd.dq_sh = L * D, bd.dq_sr = D;
    bd.dk = dk, bd.dk_sb = H * L * D, bd.dk_sh = L * D, bd.dk_sr = D;
    bd.dv = dv, bd.dv_sb = H * L * D, bd.dv_sh = L * D, bd.dv_sr = D;
    vitc__sdpa_rel_grad rg = {drh, H * L * gh, L * gh, gh, drw, H * L * gw, L * gw, gw};
    assert_int_equal(vitc__sdpa_backward_rel(&bd, &rg), VITC_OK);
    assert_int_equal(vitc__nn_relpos_backward(&rp, drh, drw, dq, H * L * D, L * D, D, dth, dtw),
                     VITC_OK);

    double *rq = malloc(n * sizeof(double)), *rk = malloc(n * sizeof(double));
    double *rv = malloc(n * sizeof(double)), *rrh = malloc(nh * sizeof(double));
    double *rrw = malloc(nw * sizeof(double));
    double *rth = calloc((size_t)(Th * D), sizeof(double)), *rtw = calloc((size_t)(Tw * D), sizeof(double));
    assert_true(rq && rk && rv && rrh && rrw && rth && rtw);
    reference_bwd(&t, c, dout, rq, rk, rv, rrh, rrw);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t l = 0; l < L; l++) {
            const int64_t lh = l / gw, lw = l % gw, r = bh * L + l;
            for (int64_t a = 0; a < gh; a++)
                for (int64_t x = 0; x < D; x++) {
                    rq[r * D + x] += rrh[r * gh + a] * t.th[(lh - a + gh - 1) * D + x];
                    rth[(lh - a + gh - 1) * D + x] += rrh[r * gh + a] * t.q[r * D + x];
                }
            for (int64_t a = 0; a < gw; a++)
                for (int64_t x = 0; x < D; x++) {
                    rq[r * D + x] += rrw[r * gw + a] * t.tw[(lw - a + gw - 1) * D + x];
                    rtw[(lw - a + gw - 1) * D + x] += rrw[r * gw + a] * t.q[r * D + x];
                }
        }
    double e[5] = {grad_err(dq, rq, n), grad_err(dk, rk, n), grad_err(dv, rv, n),
                   grad_err(dth, rth, (size_t)(Th * D)), grad_err(dtw, rtw, (size_t)(Tw * D))};
    for (int x = 0; x < 5; x++)
        if (!(e[x] <= TOL_BWD))
            fail_msg("chain B%lld H%lld grid %lldx%lld D%lld: d%s error %.3g", (long long)B,
                     (long long)H, (long long)gh, (long long)gw, (long long)D,
                     (const char *[]){"q", "k", "v", "tab_h", "tab_w"}[x], e[x]);
    free(rh), free(rw), free(dout), free(dq), free(dk), free(dv), free(drh), free(drw);
    free(dth), free(dtw), free(rq), free(rk), free(rv), free(rrh), free(rrw), free(rth), free(rtw);
    rdata_free(&t);
}

static void test_chain(void **state) {
    (void)state;
    static const rcase cases[] = {{2, 3, 5, 6, 16, 0}, {1, 2, 14, 14, 64, 0}, {2, 1, 8, 8, 32, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_chain_case(&cases[i]);
}

/* ---- transformers' SamVisionAttention (tests/reference/gen_relpos.py) -- */

static const float *ref_get(const vitc_safetensors *st, const char *name, size_t want_n) {
    const char *nm, *dt;
    int ndim, i = vitc_safetensors_find(st, name);
    const int64_t *shape;
    const float *data;
    if (i < 0) fail_msg("reference tensor %s missing", name);
    assert_int_equal(vitc_safetensors_tensor(st, i, &nm, &dt, &ndim, &shape, &data), VITC_OK);
    size_t n = 1;
    for (int x = 0; x < ndim; x++) n *= (size_t)shape[x];
    if (want_n && n != want_n) fail_msg("%s: %zu values, expected %zu", name, n, want_n);
    return data;
}

/* max|got - want| <= tol * max(1, max|want|). */
static void ref_close(const float *got, const float *want, size_t n, double tol, const char *what) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > mx) mx = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = e;
    }
    printf("    %-28s max error %.3g (scale %.3g)\n", what, err, mx);
    if (!(err <= tol * mx)) fail_msg("%s: max error %g > %g", what, err, tol * mx);
}

/* y[m][0:N] = x[m][0:K] w^T (+ b): the test's own plain product. */
static void ref_linear(float *y, const float *x, const float *w, const float *b, int64_t M,
                       int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = b ? b[n] : 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * w[n * K + k];
            y[m * N + n] = (float)s;
        }
}

/* dx[m][0:K] = dy[m][0:N] w [N, K]. */
static void ref_linear_dx(float *dx, const float *dy, const float *w, int64_t M, int64_t N,
                          int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += (double)dy[m * N + n] * w[n * K + k];
            dx[m * K + k] = (float)s;
        }
}

/* The layer from the kernels: qkv linear, relpos terms (tables resampled
 * to the grid), fused attention read in place from the qkv rows, proj;
 * then the whole backward down to x and the stored tables. */
static void run_sam_case(const char *name, int64_t heads) {
    char path[512];
    vitc_safetensors *st = NULL;
    const char *dirs[] = {"tests/reference/relpos", "../tests/reference/relpos"};
    for (int i = 0; i < 2 && !st; i++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dirs[i], name);
        if (access(path, R_OK) == 0 && vitc_safetensors_load(path, &st) != VITC_OK)
            fail_msg("%s: %s", path, vitc_last_error());
    }
    if (!st) fail_msg("reference %s not found (run from the repository root)", name);
    const char *nm, *dt;
    int ndim;
    const int64_t *xs, *ts;
    const float *x;
    assert_int_equal(vitc_safetensors_tensor(st, vitc_safetensors_find(st, "x"), &nm, &dt, &ndim,
                                             &xs, &x), VITC_OK);
    const float *tab_h;
    assert_int_equal(vitc_safetensors_tensor(st, vitc_safetensors_find(st, "attn.rel_pos_h"), &nm,
                                             &dt, &ndim, &ts, &tab_h), VITC_OK);
    const int64_t B = xs[0], gh = xs[1], gw = xs[2], C = xs[3], N = gh * gw, H = heads,
                  D = C / H, T = ts[0], M = B * N;
    const float *tab_w = ref_get(st, "attn.rel_pos_w", (size_t)(T * D));
    const float *wqkv = ref_get(st, "attn.qkv.weight", (size_t)(3 * C * C));
    const float *bqkv = ref_get(st, "attn.qkv.bias", (size_t)(3 * C));
    const float *wp = ref_get(st, "attn.proj.weight", (size_t)(C * C));
    const float *bp = ref_get(st, "attn.proj.bias", (size_t)C);

    float *qkv = tu_falloc((size_t)(M * 3 * C)), *o = tu_falloc((size_t)(M * C));
    float *y = tu_falloc((size_t)(M * C)), *lse = tu_falloc((size_t)(B * H * N));
    float *rth = tu_falloc((size_t)((2 * gh - 1) * D)), *rtw = tu_falloc((size_t)((2 * gw - 1) * D));
    float *rh = tu_falloc((size_t)(B * H * N * gh)), *rw = tu_falloc((size_t)(B * H * N * gw));
    ref_linear(qkv, x, wqkv, bqkv, M, 3 * C, C);
    assert_int_equal(vitc__nn_relpos_resample(rth, tab_h, T, 2 * gh - 1, D), VITC_OK);
    assert_int_equal(vitc__nn_relpos_resample(rtw, tab_w, T, 2 * gw - 1, D), VITC_OK);
    /* qkv rows are [3, H, D] (the reshape SamVisionAttention makes) */
    vitc__nn_relpos rp = {B, H, gh, gw, D, qkv, N * 3 * C, D, 3 * C, rth, rtw,
                          rh, H * N * gh, N * gh, gh, rw, H * N * gw, N * gw, gw};
    assert_int_equal(vitc__nn_relpos_forward(&rp), VITC_OK);
    vitc__sdpa_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.B = B, sd.H = H, sd.L = N, sd.S = N, sd.D = D, sd.Dv = D;
    sd.q = qkv, sd.k = qkv + C, sd.v = qkv + 2 * C;
    sd.q_sb = sd.k_sb = sd.v_sb = N * 3 * C;
    sd.q_sh = sd.k_sh = sd.v_sh = D;
    sd.q_sr = sd.k_sr = sd.v_sr = 3 * C;
    sd.o = o, sd.o_sb = N * C, sd.o_sh = D, sd.o_sr = C;
    sd.scale = 1.0f / sqrtf((float)D);
    sd.lse = lse, sd.lse_sb = H * N, sd.lse_sh = N;
    vitc__nn_relpos_view(&rp, &sd);
    assert_int_equal(vitc__sdpa(&sd), VITC_OK);
    ref_linear(y, o, wp, bp, M, C, C);
    ref_close(y, ref_get(st, "y", (size_t)(M * C)), (size_t)(M * C), 1e-5, "SamVisionAttention y");

    /* backward of sum(y * dy) */
    const float *dy = ref_get(st, "dy", (size_t)(M * C));
    float *dO = tu_falloc((size_t)(M * C)), *dqkv = tu_falloc((size_t)(M * 3 * C));
    float *drh = tu_falloc((size_t)(B * H * N * gh)), *drw = tu_falloc((size_t)(B * H * N * gw));
    float *dth = tu_falloc((size_t)((2 * gh - 1) * D)), *dtw = tu_falloc((size_t)((2 * gw - 1) * D));
    float *dTh = tu_falloc((size_t)(T * D)), *dTw = tu_falloc((size_t)(T * D));
    float *dx = tu_falloc((size_t)(M * C));
    memset(dth, 0, (size_t)((2 * gh - 1) * D) * sizeof(float));
    memset(dtw, 0, (size_t)((2 * gw - 1) * D) * sizeof(float));
    memset(dTh, 0, (size_t)(T * D) * sizeof(float));
    memset(dTw, 0, (size_t)(T * D) * sizeof(float));
    ref_linear_dx(dO, dy, wp, M, C, C);
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = sd;
    bd.dout = dO, bd.do_sb = N * C, bd.do_sh = D, bd.do_sr = C;
    bd.dq = dqkv, bd.dk = dqkv + C, bd.dv = dqkv + 2 * C;
    bd.dq_sb = bd.dk_sb = bd.dv_sb = N * 3 * C;
    bd.dq_sh = bd.dk_sh = bd.dv_sh = D;
    bd.dq_sr = bd.dk_sr = bd.dv_sr = 3 * C;
    vitc__sdpa_rel_grad rg = {drh, H * N * gh, N * gh, gh, drw, H * N * gw, N * gw, gw};
    assert_int_equal(vitc__sdpa_backward_rel(&bd, &rg), VITC_OK);
    assert_int_equal(vitc__nn_relpos_backward(&rp, drh, drw, dqkv, N * 3 * C, D, 3 * C, dth, dtw),
                     VITC_OK);
    assert_int_equal(vitc__nn_relpos_resample_backward(dTh, dth, T, 2 * gh - 1, D), VITC_OK);
    assert_int_equal(vitc__nn_relpos_resample_backward(dTw, dtw, T, 2 * gw - 1, D), VITC_OK);
    ref_linear_dx(dx, dqkv, wqkv, M, 3 * C, C);
    ref_close(dx, ref_get(st, "dx", (size_t)(M * C)), (size_t)(M * C), 1e-4, "dx (float64 autograd)");
    ref_close(dTh, ref_get(st, "d_rel_pos_h", (size_t)(T * D)), (size_t)(T * D), 1e-4, "d rel_pos_h");
    ref_close(dTw, ref_get(st, "d_rel_pos_w", (size_t)(T * D)), (size_t)(T * D), 1e-4, "d rel_pos_w");

    free(qkv), free(o), free(y), free(lse), free(rth), free(rtw), free(rh), free(rw);
    free(dO), free(dqkv), free(drh), free(drw), free(dth), free(dtw), free(dTh), free(dTw), free(dx);
    vitc_safetensors_free(st);
}

static void test_sam_attention(void **state) {
    (void)state;
    run_sam_case("sam_window", 2);    /* 7 x 7 on its own 13-row tables */
    run_sam_case("sam_resampled", 4); /* 5 x 6: tables resampled to 9 and 11 rows */
}

static void test_small_grids(void **state) {
    (void)state;
    static const rcase cases[] = {
        {1, 1, 4, 4, 16, 0},  {2, 3, 5, 5, 32, 0}, {1, 2, 7, 7, 64, 0},
        {1, 4, 8, 8, 16, 0},  {1, 1, 3, 9, 24, 0}, {2, 2, 6, 4, 48, 0},
        {1, 2, 4, 4, 8, 0}, /* Dv under a vector: the small-Dv paths */
        {1, 1, 10, 12, 40, 0}, {1, 3, 6, 6, 32, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* SAM's windows: 14 x 14 = 196 keys, a batch of windows. */
static void test_windows(void **state) {
    (void)state;
    static const rcase cases[] = {{4, 2, 14, 14, 64, 0}, {1, 4, 14, 14, 16, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* More keys than one key block (256): blocks start mid grid row. */
static void test_multi_block(void **state) {
    (void)state;
    static const rcase cases[] = {{1, 2, 20, 20, 64, 0}, {1, 1, 17, 31, 32, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* SAM-B's global blocks: 64 x 64 tokens, 12 heads of 64. The kernel's
 * scratch is per thread and O(rows of a task x key block + a head's K/V),
 * the same with the relative positions as without, far from the 64 MiB of
 * one head's L x S scores. */
static void test_scratch_is_linear(void **state) {
    (void)state;
    vitc__sdpa_desc d;
    memset(&d, 0, sizeof d);
    const int64_t N = 64 * 64, H = 12, D = 64;
    d.B = 1, d.H = H, d.L = N, d.S = N, d.D = D, d.Dv = D, d.scale = 0.125f;
    size_t plain = vitc__sdpa_scratch_bytes(&d);
    static float dummy[1];
    d.rel_h = dummy, d.rel_w = dummy, d.kh = 64, d.kw = 64;
    size_t rel = vitc__sdpa_scratch_bytes(&d);
    printf("    scratch per thread at N=4096: %zu bytes (L x S scores: %zu)\n", rel,
           (size_t)(N * N) * sizeof(float));
    assert_true(rel == plain);
    assert_true(rel < (size_t)(N * N) * sizeof(float) / 8);
}

/* Peak resident memory (KiB). */
static long peak_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* The forward and backward at 64 x 64 tokens (one head of SAM-B's global
 * blocks, d 64) raise the process's peak memory by about the per-thread
 * scratch, not by the 64 MiB of one head's L x S scores. Runs first, while
 * the peak is still that of the inputs. */
static void test_peak_memory(void **state) {
    (void)state;
    if (quick()) return;
    rcase c = {1, 1, 64, 64, 64, 0};
    rdata t;
    rdata_make(&t, &c); /* inputs written, so resident */
    const int64_t L = 64 * 64, D = 64;
    const size_t n = (size_t)(L * D);
    float *dout = tu_falloc(n), *dq = tu_falloc(n), *dk = tu_falloc(n), *dv = tu_falloc(n);
    float *drh = tu_falloc((size_t)(L * 64)), *drw = tu_falloc((size_t)(L * 64));
    tu_fill(&rng_state, dout, n, 1.0f);
    memset(dq, 0, n * 4), memset(dk, 0, n * 4), memset(dv, 0, n * 4);
    memset(drh, 0, (size_t)(L * 64) * 4), memset(drw, 0, (size_t)(L * 64) * 4);
    memset(t.o, 0, n * 4), memset(t.lse, 0, (size_t)L * 4);
    /* Scratch is per thread (the backward's O(L d) per task): two threads,
     * whatever the machine, so the bound holds everywhere. */
    int saved = vitc_get_num_threads();
    vitc_set_num_threads(2);
    long before = peak_rss_kib();
    assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = t.d;
    bd.dout = dout, bd.do_sr = D, bd.dq = dq, bd.dq_sr = D, bd.dk = dk, bd.dk_sr = D;
    bd.dv = dv, bd.dv_sr = D;
    vitc__sdpa_rel_grad rg = {drh, 0, 0, 64, drw, 0, 0, 64};
    assert_int_equal(vitc__sdpa_backward_rel(&bd, &rg), VITC_OK);
    long grown = peak_rss_kib() - before;
    vitc_set_num_threads(saved);
    printf("    peak memory growth at N=4096: %ld KiB (one L x S: %lld KiB)\n", grown,
           (long long)(L * L * 4 / 1024));
    assert_true(grown < 16 * 1024);
    free(dout), free(dq), free(dk), free(dv), free(drh), free(drw);
    rdata_free(&t);
}

/* Bitwise the same for 1 and 2 threads, forward and backward (the bias
 * gradients are summed by one task per query row, keys ascending). */
static void test_threads_bitwise(void **state) {
    (void)state;
    static const rcase cases[] = {{1, 2, 20, 20, 32, 0}, {2, 8, 6, 7, 16, 1}};
    int saved = vitc_get_num_threads();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rcase *c = &cases[i];
        rdata t;
        rdata_make(&t, c);
        const int64_t L = c->gh * c->gw, D = c->D, H = c->H;
        const size_t n = (size_t)(c->B * H * L * D), nh = (size_t)(c->B * H * L * c->gh);
        float *dout = tu_falloc(n), *dvb = tu_falloc(n), *g[2][4]; /* dv: not compared */
        tu_fill(&rng_state, dout, n, 1.0f);
        for (int r = 0; r < 2; r++) {
            g[r][0] = tu_falloc(n), g[r][1] = tu_falloc(n), g[r][2] = tu_falloc(nh);
            g[r][3] = tu_falloc(n); /* o */
            vitc_set_num_threads(r + 1);
            t.d.o = g[r][3];
            assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
            vitc__sdpa_bwd_desc bd;
            memset(&bd, 0, sizeof bd);
            bd.f = t.d;
            bd.dout = dout, bd.do_sb = H * L * D, bd.do_sh = L * D, bd.do_sr = D;
            bd.dq = g[r][0], bd.dq_sb = H * L * D, bd.dq_sh = L * D, bd.dq_sr = D;
            bd.dk = g[r][1], bd.dk_sb = H * L * D, bd.dk_sh = L * D, bd.dk_sr = D;
            bd.dv = dvb, bd.dv_sb = H * L * D, bd.dv_sh = L * D, bd.dv_sr = D;
            vitc__sdpa_rel_grad rg = {g[r][2], H * L * c->gh, L * c->gh, c->gh, NULL, 0, 0, 0};
            assert_int_equal(vitc__sdpa_backward_rel(&bd, &rg), VITC_OK);
        }
        assert_memory_equal(g[0][3], g[1][3], n * 4);
        assert_memory_equal(g[0][0], g[1][0], n * 4);
        assert_memory_equal(g[0][1], g[1][1], n * 4);
        assert_memory_equal(g[0][2], g[1][2], nh * 4);
        for (int r = 0; r < 2; r++)
            for (int x = 0; x < 4; x++) free(g[r][x]);
        free(dout), free(dvb);
        t.d.o = t.o;
        rdata_free(&t);
    }
    vitc_set_num_threads(saved);
}

static void test_bad_input(void **state) {
    (void)state;
    rcase c = {1, 1, 4, 4, 16, 0};
    rdata t;
    rdata_make(&t, &c);
    t.d.kw = 5; /* 4 x 5 != 16 keys */
    assert_int_equal(vitc__sdpa(&t.d), VITC_ERR_INVALID_ARG);
    t.d.kw = 4, t.d.rel_w = NULL;
    assert_int_equal(vitc__sdpa(&t.d), VITC_ERR_INVALID_ARG);
    t.d.rel_w = t.rw;
    assert_int_equal(vitc__sdpa(&t.d), VITC_OK);
    rdata_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_memory),    cmocka_unit_test(test_small_grids),
        cmocka_unit_test(test_windows),        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_multi_block),    cmocka_unit_test(test_scratch_is_linear),
        cmocka_unit_test(test_backward),       cmocka_unit_test(test_resample),
        cmocka_unit_test(test_chain),          cmocka_unit_test(test_sam_attention),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
