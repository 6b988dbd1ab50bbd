/*
 * test_attention_backward.c — the fused attention backward
 * (vitc__sdpa_backward) on every path this CPU supports, and its scalar
 * reference, against an independent float64 computation of the gradients
 * of o = softmax(scale q k^T + mask) v: the L x S softmax is materialised in
 * double and differentiated the way autograd does (dS = P o (dP - rowsum(P o dP))).
 * Also: 1 vs 2 threads bitwise, finite differences, the NaN pattern of a
 * fully masked row (torch 2.x's: zero), O(N) scratch, bad descriptors.
 *
 * q, k, v, dout uniform in [-1, 1]; the bound is
 * max|got - ref| <= 1e-4 * max(1, |ref|) per element (the issue's), and the
 * worst error per group is printed so a drift toward it shows.
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

#include "kernels/attention_impl.h"
#include "kernels/kernels.h"

#include "testutil.h"
#include "attn_testutil.h"


static uint64_t rng_state = 0x2545f4914f6cdd1dull;

enum layout { SEPARATE, FUSED_QKV };
enum maskkind {
    MASK_LS = ATU_MASK_LS, MASK_B1LS = ATU_MASK_B1LS, MASK_KEYPAD = ATU_MASK_KEYPAD,
    MASK_HOLES = ATU_MASK_COUNT, MASK_FULLROW, NO_MASK
};

typedef struct tcase {
    int64_t B, H, L, S, D, Dv;
    enum layout layout;
    enum maskkind mask;
} tcase;

typedef struct tdata {
    tcase c;
    vitc__sdpa_bwd_desc d;
    float *qkv, *q, *k, *v, *o, *lse, *mask, *dout, *dq, *dk, *dv;
    size_t nq, nk, nv; /* elements of dq, dk, dv (natural [B,H,*,*] layout) */
} tdata;

static void tdata_make(tdata *t, const tcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    vitc__sdpa_desc *f = &t->d.f;
    int64_t B = c->B, H = c->H, L = c->L, S = c->S, D = c->D, Dv = c->Dv;
    f->B = B, f->H = H, f->L = L, f->S = S, f->D = D, f->Dv = Dv;
    f->scale = 1.0f / sqrtf((float)(D ? D : 1));
    atu_make_qkv(f, c->layout == FUSED_QKV, &t->qkv, &t->q, &t->k, &t->v, &rng_state);
    /* o, dout and the gradients: [B, N, H, d] in the fused layout (strided
     * rows), [B, H, N, d] otherwise. */
    int fused = c->layout == FUSED_QKV;
    t->o = tu_falloc((size_t)(B * H * L * Dv));
    t->dout = tu_falloc((size_t)(B * H * L * Dv));
    tu_fill(&rng_state, t->dout, (size_t)(B * H * L * Dv), 1.0f);
    t->lse = tu_falloc((size_t)(B * H * L));
    t->nq = (size_t)(B * H * L * D), t->nk = (size_t)(B * H * S * D), t->nv = (size_t)(B * H * S * Dv);
    t->dq = tu_falloc(t->nq), t->dk = tu_falloc(t->nk), t->dv = tu_falloc(t->nv);
    vitc__sdpa_bwd_desc *d = &t->d;
    f->o = t->o, d->dout = t->dout, d->dq = t->dq, d->dk = t->dk, d->dv = t->dv;
    atu_strides(fused, L, H, Dv, &f->o_sb, &f->o_sh, &f->o_sr);
    atu_strides(fused, L, H, Dv, &d->do_sb, &d->do_sh, &d->do_sr);
    atu_strides(fused, L, H, D, &d->dq_sb, &d->dq_sh, &d->dq_sr);
    atu_strides(fused, S, H, D, &d->dk_sb, &d->dk_sh, &d->dk_sr);
    atu_strides(fused, S, H, Dv, &d->dv_sb, &d->dv_sh, &d->dv_sr);
    f->lse = t->lse, f->lse_sb = H * L, f->lse_sh = L;
    switch (c->mask) {
    case NO_MASK: break;
    case MASK_LS:
    case MASK_B1LS:
    case MASK_KEYPAD:
        t->mask = atu_make_mask(f, (enum atu_mask)c->mask, &rng_state);
        break;
    case MASK_HOLES:   /* [B, H, L, S]: 40% -inf, each row keeps key (7 l) mod S */
    case MASK_FULLROW: /* and row 2 of head (0, 0) fully masked */
        t->mask = tu_falloc((size_t)(B * H * L * S));
        for (int64_t i = 0; i < B * H * L; i++)
            for (int64_t j = 0; j < S; j++) {
                int hole = tu_urand(&rng_state) < -0.2f && j != (i % L * 7) % S;
                if (c->mask == MASK_FULLROW && i == 2) hole = 1;
                t->mask[i * S + j] = hole ? -INFINITY : tu_urand(&rng_state);
            }
        f->mask = t->mask, f->m_sb = H * L * S, f->m_sh = L * S, f->m_sr = S;
        break;
    }
    assert_int_equal(vitc__sdpa(f), VITC_OK); /* o and lse, as a training forward leaves them */
}

static void tdata_free(tdata *t) {
    free(t->qkv), free(t->q), free(t->k), free(t->v), free(t->o), free(t->lse), free(t->mask);
    free(t->dout), free(t->dq), free(t->dk), free(t->dv);
}

/* ---- float64 reference: the softmax materialised, autograd's formulas ---- */

typedef struct ref {
    double *dq, *dk, *dv; /* [B,H,L,D], [B,H,S,D], [B,H,S,Dv] */
} ref;

static double at(const float *x, int64_t sb, int64_t sh, int64_t sr, int64_t b, int64_t h,
                 int64_t r, int64_t c) {
    return x[b * sb + h * sh + r * sr + c];
}

static void reference(const vitc__sdpa_bwd_desc *bd, ref *R) {
    const vitc__sdpa_desc *d = &bd->f;
    int64_t L = d->L, S = d->S, D = d->D, Dv = d->Dv;
    R->dq = calloc((size_t)(d->B * d->H * L * D) + 1, sizeof(double));
    R->dk = calloc((size_t)(d->B * d->H * S * D) + 1, sizeof(double));
    R->dv = calloc((size_t)(d->B * d->H * S * Dv) + 1, sizeof(double));
    double *P = malloc((size_t)(L * S + 1) * sizeof(double));
    double *dP = malloc((size_t)(L * S + 1) * sizeof(double));
    assert_true(R->dq && R->dk && R->dv && P && dP);
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++) {
            size_t bh = (size_t)(b * d->H + h);
            double *dq = R->dq + bh * (size_t)(L * D), *dk = R->dk + bh * (size_t)(S * D);
            double *dv = R->dv + bh * (size_t)(S * Dv);
            for (int64_t l = 0; l < L; l++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    double s = 0.0;
                    for (int64_t c = 0; c < D; c++)
                        s += at(d->q, d->q_sb, d->q_sh, d->q_sr, b, h, l, c) *
                             at(d->k, d->k_sb, d->k_sh, d->k_sr, b, h, j, c);
                    s *= (double)d->scale;
                    if (d->mask) s += at(d->mask, d->m_sb, d->m_sh, d->m_sr, b, h, l, j);
                    P[l * S + j] = s;
                    if (s > mx) mx = s;
                }
                /* no allowed key: the row's output is a constant 0 (torch 2.x's
                 * SDPA), so nothing flows back through it */
                if (mx == -INFINITY) continue;
                for (int64_t j = 0; j < S; j++) sum += (P[l * S + j] = exp(P[l * S + j] - mx));
                for (int64_t j = 0; j < S; j++) P[l * S + j] /= sum;
                double rs = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    double x = 0.0;
                    for (int64_t c = 0; c < Dv; c++)
                        x += at(bd->dout, bd->do_sb, bd->do_sh, bd->do_sr, b, h, l, c) *
                             at(d->v, d->v_sb, d->v_sh, d->v_sr, b, h, j, c);
                    dP[l * S + j] = x;
                    rs += P[l * S + j] * x;
                }
                for (int64_t j = 0; j < S; j++) {
                    double p = P[l * S + j], ds = p * (dP[l * S + j] - rs) * (double)d->scale;
                    for (int64_t c = 0; c < Dv; c++)
                        dv[j * Dv + c] += p * at(bd->dout, bd->do_sb, bd->do_sh, bd->do_sr, b, h, l, c);
                    for (int64_t c = 0; c < D; c++) {
                        dq[l * D + c] += ds * at(d->k, d->k_sb, d->k_sh, d->k_sr, b, h, j, c);
                        dk[j * D + c] += ds * at(d->q, d->q_sb, d->q_sh, d->q_sr, b, h, l, c);
                    }
                }
            }
        }
    free(P);
    free(dP);
}

static void ref_free(ref *R) { free(R->dq), free(R->dk), free(R->dv); }

/* Worst |got - ref| / max(1, |ref|) over one gradient; NaN must match NaN. */
static double cmp_grad(const float *g, int64_t sb, int64_t sh, int64_t sr, const double *r,
                       int64_t B, int64_t H, int64_t n, int64_t w) {
    double worst = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < w; c++) {
                    double x = g[b * sb + h * sh + i * sr + c], y = r[((b * H + h) * n + i) * w + c];
                    double e = isnan(y) ? (isnan(x) ? 0.0 : INFINITY)
                                        : (isnan(x) ? INFINITY : fabs(x - y) / fmax(1.0, fabs(y)));
                    if (e > worst) worst = e;
                }
    return worst;
}

static double compare(const vitc__sdpa_bwd_desc *bd, const ref *R) {
    const vitc__sdpa_desc *d = &bd->f;
    double e = cmp_grad(bd->dq, bd->dq_sb, bd->dq_sh, bd->dq_sr, R->dq, d->B, d->H, d->L, d->D);
    e = fmax(e, cmp_grad(bd->dk, bd->dk_sb, bd->dk_sh, bd->dk_sr, R->dk, d->B, d->H, d->S, d->D));
    return fmax(e, cmp_grad(bd->dv, bd->dv_sb, bd->dv_sh, bd->dv_sr, R->dv, d->B, d->H, d->S, d->Dv));
}

static void poison(tdata *t) { /* every gradient element must be written */
    for (size_t i = 0; i < t->nq; i++) t->dq[i] = 12345.0f;
    for (size_t i = 0; i < t->nk; i++) t->dk[i] = 12345.0f;
    for (size_t i = 0; i < t->nv; i++) t->dv[i] = 12345.0f;
}

static double worst_seen[TU_NARCH + 1]; /* each path, then the reference kernel */
static const double TOL = 1e-4;

static void run_case(const tcase *c) {
    tdata t;
    tdata_make(&t, c);
    ref R;
    reference(&t.d, &R);
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        poison(&t);
        assert_int_equal(vitc__sdpa_backward(&t.d), VITC_OK);
        double e = compare(&t.d, &R);
        if (e > worst_seen[a]) worst_seen[a] = e;
        if (!(e <= TOL))
            fail_msg("%s: B%lld H%lld L%lld S%lld D%lld Dv%lld layout %d mask %d: error %.3g",
                     tu_arch(a), (long long)c->B, (long long)c->H, (long long)c->L,
                     (long long)c->S, (long long)c->D, (long long)c->Dv, c->layout, c->mask, e);
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    if (c->B * c->H * c->L * c->S * (c->D + c->Dv) < 20000000) {
        poison(&t);
        vitc__sdpa_backward_ref(&t.d);
        double e = compare(&t.d, &R);
        if (e > worst_seen[TU_NARCH]) worst_seen[TU_NARCH] = e;
        if (!(e <= TOL)) fail_msg("reference kernel: error %.3g", e);
    }
    ref_free(&R);
    tdata_free(&t);
}

static void print_worst(const char *what) {
    printf("    %-22s worst error:", what);
    for (int a = 0; a < TU_NARCH; a++)
        if (vitc__cpu_has((vitc__arch)a)) printf(" %s %.2e", tu_arch(a), worst_seen[a]);
    printf(" ref %.2e\n", worst_seen[TU_NARCH]);
    memset(worst_seen, 0, sizeof worst_seen);
}

/* ---- tests -------------------------------------------------------- */

static void test_self_sizes(void **state) {
    (void)state;
    static const int64_t Ns[] = {1, 2, 17, 33, 97, 197, 257};
    static const int64_t ds[] = {8, 40, 64};
    for (size_t i = 0; i < sizeof Ns / sizeof *Ns; i++)
        for (size_t j = 0; j < sizeof ds / sizeof *ds; j++) {
            int64_t N = Ns[i];
            /* Small N also with B=3, H=12: many heads, batch strides. */
            tcase c = {N <= 33 ? 3 : 1, N <= 33 ? 12 : 1, N, N, ds[j], ds[j], SEPARATE, NO_MASK};
            run_case(&c);
        }
    print_worst("self N x d");
}

static void test_cross_and_dv(void **state) {
    (void)state;
    const tcase cs[] = {
        {3, 12, 17, 33, 64, 32, SEPARATE, NO_MASK}, /* L != S, Dv < D */
        {1, 3, 257, 31, 40, 80, SEPARATE, NO_MASK},
        {3, 1, 33, 500, 80, 40, SEPARATE, NO_MASK},
        {2, 2, 5, 7, 1, 3, SEPARATE, NO_MASK},
        {1, 1, 9, 300, 24, 8, SEPARATE, NO_MASK},
        {8, 1, 64, 64, 8, 64, SEPARATE, NO_MASK}, /* ConvSABlock: d = C/8, Dv = C */
        {1, 1, 1, 1, 16, 16, SEPARATE, NO_MASK},  /* one token */
        {2, 4, 1, 130, 16, 16, SEPARATE, NO_MASK}, /* one query, several key blocks */
        {1, 1, 200, 100, 144, 36, SEPARATE, NO_MASK},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i]);
    print_worst("cross / Dv != D");
}

/* Fewer than 8 heads with more than one block: key chunks, then query
 * chunks (the split plan). */
static void test_split(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 1, 500, 400, 64, 64, SEPARATE, NO_MASK},
        {1, 2, 300, 700, 40, 24, SEPARATE, MASK_HOLES},
        {3, 1, 130, 97, 32, 32, SEPARATE, MASK_LS},
        {1, 1, 700, 33, 16, 16, SEPARATE, NO_MASK},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i]);
    print_worst("split heads");
}

static void test_fused_qkv(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 12, 197, 197, 64, 64, FUSED_QKV, NO_MASK}, /* a ViT-B/16 layer */
        {3, 4, 17, 17, 40, 40, FUSED_QKV, NO_MASK},
        {2, 1, 150, 150, 24, 24, FUSED_QKV, MASK_KEYPAD},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i]);
    print_worst("fused qkv layout");
}

static void test_masks(void **state) {
    (void)state;
    const tcase cs[] = {
        {3, 12, 33, 31, 32, 32, SEPARATE, MASK_LS},
        {3, 2, 65, 300, 64, 64, SEPARATE, MASK_B1LS},
        {3, 2, 17, 213, 40, 40, SEPARATE, MASK_KEYPAD},
        {3, 12, 33, 33, 64, 64, SEPARATE, MASK_HOLES},
        {1, 8, 40, 300, 16, 24, SEPARATE, MASK_HOLES},
        {2, 4, 20, 30, 16, 16, SEPARATE, MASK_FULLROW},
        {1, 1, 200, 150, 16, 16, SEPARATE, MASK_FULLROW},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) run_case(&cs[i]);
    print_worst("masks");
}

/* torch 2.x autograd through scaled_dot_product_attention with a fully
 * masked row: that row's output is a constant 0, so its dq row is 0 and it
 * adds nothing to dk and dv; nothing is NaN. (The float64 comparison checks
 * the same; this states it.) */
static void test_fully_masked_row(void **state) {
    (void)state;
    tcase c = {2, 2, 20, 30, 16, 16, SEPARATE, MASK_FULLROW};
    tdata t;
    tdata_make(&t, &c);
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        assert_int_equal(vitc__sdpa_backward(&t.d), VITC_OK);
        for (size_t i = 0; i < t.nq; i++) { /* head (0, 0) is first; row 2 of it */
            assert_false(isnan(t.dq[i]));
            if (i / 16 == 2) assert_true(t.dq[i] == 0.0f);
        }
        for (size_t i = 0; i < t.nk; i++) assert_false(isnan(t.dk[i]));
        for (size_t i = 0; i < t.nv; i++) assert_false(isnan(t.dv[i]));
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    tdata_free(&t);
}

/* Every sum has one owner and a fixed order: 1 and 2 threads agree bit for
 * bit on every path, for whole-head and split plans. */
static void test_threads_bitwise(void **state) {
    (void)state;
    const tcase cs[] = {
        {1, 12, 197, 197, 64, 64, FUSED_QKV, NO_MASK},
        {1, 1, 500, 400, 40, 24, SEPARATE, MASK_B1LS},
        {2, 3, 300, 200, 64, 64, SEPARATE, NO_MASK},
    };
    int saved = vitc_get_num_threads();
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        tdata t;
        tdata_make(&t, &cs[i]);
        float *g1 = tu_falloc(t.nq + t.nk + t.nv);
        for (int a = 0; a < TU_NARCH; a++) {
            if (!vitc__cpu_has((vitc__arch)a)) continue;
            assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
            vitc_set_num_threads(1);
            assert_int_equal(vitc__sdpa_backward(&t.d), VITC_OK);
            memcpy(g1, t.dq, t.nq * 4);
            memcpy(g1 + t.nq, t.dk, t.nk * 4);
            memcpy(g1 + t.nq + t.nk, t.dv, t.nv * 4);
            vitc_set_num_threads(2);
            poison(&t);
            assert_int_equal(vitc__sdpa_backward(&t.d), VITC_OK);
            assert_memory_equal(g1, t.dq, t.nq * 4);
            assert_memory_equal(g1 + t.nq, t.dk, t.nk * 4);
            assert_memory_equal(g1 + t.nq + t.nk, t.dv, t.nv * 4);
        }
        free(g1);
        tdata_free(&t);
    }
    vitc_set_num_threads(saved);
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
}

/* sum(dout o o) as a function of one input element, by central differences
 * through the forward kernel, against the backward's gradient. */
static double fd_loss(tdata *t) {
    assert_int_equal(vitc__sdpa(&t->d.f), VITC_OK);
    double s = 0.0;
    for (size_t i = 0; i < (size_t)(t->c.B * t->c.H * t->c.L * t->c.Dv); i++)
        s += (double)t->dout[i] * t->o[i];
    return s;
}

static void test_finite_differences(void **state) {
    (void)state;
    tcase c = {1, 2, 5, 7, 3, 4, SEPARATE, MASK_LS};
    tdata t;
    tdata_make(&t, &c);
    for (int a = 0; a < TU_NARCH; a++) {
        if (!vitc__cpu_has((vitc__arch)a)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(a)), VITC_OK);
        assert_int_equal(vitc__sdpa(&t.d.f), VITC_OK);
        assert_int_equal(vitc__sdpa_backward(&t.d), VITC_OK);
        float *xs[3] = {t.q, t.k, t.v}, *gs[3] = {t.dq, t.dk, t.dv};
        size_t ns[3] = {t.nq, t.nk, t.nv};
        for (int which = 0; which < 3; which++)
            for (size_t i = 0; i < ns[which]; i += 3) {
                float keep = xs[which][i];
                const float eps = 1e-2f;
                xs[which][i] = keep + eps;
                double up = fd_loss(&t);
                xs[which][i] = keep - eps;
                double dn = fd_loss(&t);
                xs[which][i] = keep;
                double fd = (up - dn) / (2.0 * eps), g = gs[which][i];
                if (!(fabs(fd - g) <= 2e-3 * fmax(1.0, fabs(fd))))
                    fail_msg("%s: d%c[%zu]: backward %.6g, finite difference %.6g", tu_arch(a),
                             "qkv"[which], i, g, fd);
            }
    }
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    tdata_free(&t);
}

/* Scratch grows with N, not N^2, and stays within the budget at
 * [1,8,4096,64] (per thread; two threads hold two). */
static void test_scratch_linear(void **state) {
    (void)state;
    vitc__sdpa_bwd_desc d;
    memset(&d, 0, sizeof d);
    d.f.B = 1, d.f.H = 8, d.f.L = d.f.S = 4096, d.f.D = d.f.Dv = 64;
    size_t a = vitc__sdpa_backward_scratch_bytes(&d);
    d.f.L = d.f.S = 8192;
    size_t b = vitc__sdpa_backward_scratch_bytes(&d);
    printf("    scratch per thread: %.2f MB at N = 4096, %.2f MB at N = 8192\n", a / 1e6, b / 1e6);
    assert_true(a > 0 && 2 * a <= (size_t)32 << 20);
    assert_true((double)b < 2.2 * (double)a);
}

static void test_edges_and_bad_input(void **state) {
    (void)state;
    assert_int_equal(vitc__sdpa_backward(NULL), VITC_ERR_INVALID_ARG);
    vitc__sdpa_bwd_desc d;
    memset(&d, 0, sizeof d);
    d.f.B = 1, d.f.H = 1, d.f.L = -1, d.f.S = 4, d.f.D = 4, d.f.Dv = 4;
    assert_int_equal(vitc__sdpa_backward(&d), VITC_ERR_INVALID_ARG);
    d.f.L = (int64_t)1 << 40;
    assert_int_equal(vitc__sdpa_backward(&d), VITC_ERR_INVALID_ARG);
    d.f.L = 2; /* NULL everything with work to do */
    assert_int_equal(vitc__sdpa_backward(&d), VITC_ERR_INVALID_ARG);
    float x[8], g[3][8];
    for (int i = 0; i < 8; i++) x[i] = 1.0f, g[0][i] = g[1][i] = g[2][i] = NAN;
    d.dq = g[0], d.dk = g[1], d.dv = g[2];
    d.dq_sr = d.dk_sr = d.dv_sr = 4;
    /* Without the forward's lse (or o) the backward cannot run. */
    d.f.o = x;
    d.f.q = d.f.k = d.f.v = d.dout = x;
    d.f.q_sr = d.f.k_sr = d.f.v_sr = d.f.o_sr = d.do_sr = 4;
    d.f.S = 2;
    assert_int_equal(vitc__sdpa_backward(&d), VITC_ERR_INVALID_ARG);
    /* No keys: dq is 0 (q had no influence); no queries: dk and dv are 0. */
    d.f.S = 0;
    assert_int_equal(vitc__sdpa_backward(&d), VITC_OK);
    for (int i = 0; i < 8; i++) assert_true(g[0][i] == 0.0f);
    d.f.L = 0, d.f.S = 2;
    assert_int_equal(vitc__sdpa_backward(&d), VITC_OK);
    for (int i = 0; i < 8; i++) assert_true(g[1][i] == 0.0f && g[2][i] == 0.0f);
}

/* The public pair a training step uses: vitc_sdpa_lse's out equals
 * vitc_sdpa's, and vitc_sdpa_backward_lse from its out and lse gives
 * vitc_sdpa_backward's gradients bitwise (with a mask too); NULL out or lse
 * is refused. */
static void test_public_saved_forward(void **state) {
    (void)state;
    const int64_t B = 2, H = 3, L = 37, S = 29, D = 24;
    size_t nq = (size_t)(B * H * L * D), nk = (size_t)(B * H * S * D);
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float));
    float *v = malloc(nk * sizeof(float)), *dout = malloc(nq * sizeof(float));
    float *o1 = malloc(nq * sizeof(float)), *o2 = malloc(nq * sizeof(float));
    float *lse = malloc((size_t)(B * H * L) * sizeof(float)), *mask = malloc((size_t)(L * S) * sizeof(float));
    float *g1[3], *g2[3];
    for (int i = 0; i < 3; i++) {
        g1[i] = malloc((i ? nk : nq) * sizeof(float));
        g2[i] = malloc((i ? nk : nq) * sizeof(float));
    }
    for (size_t i = 0; i < nq; i++) q[i] = (float)(2 * tu_drand(&rng_state) - 1), dout[i] = (float)(2 * tu_drand(&rng_state) - 1);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(2 * tu_drand(&rng_state) - 1), v[i] = (float)(2 * tu_drand(&rng_state) - 1);
    for (int64_t i = 0; i < L * S; i++) mask[i] = (float)(3 * tu_drand(&rng_state) - 1.5);
    vitc_tensor_view tq = {q, 4, {B, H, L, D}}, tk = {k, 4, {B, H, S, D}}, tv = {v, 4, {B, H, S, D}};
    vitc_tensor_view tm = {mask, 2, {L, S}};
    for (int masked = 0; masked < 2; masked++) {
        const vitc_tensor_view *m = masked ? &tm : NULL;
        vitc_mask_type mt = masked ? VITC_MASK_FLOAT : VITC_MASK_NONE;
        assert_int_equal(vitc_sdpa(&tq, &tk, &tv, m, mt, 0.0f, o1), VITC_OK);
        assert_int_equal(vitc_sdpa_lse(&tq, &tk, &tv, m, mt, 0.0f, o2, lse), VITC_OK);
        assert_memory_equal(o1, o2, nq * sizeof(float));
        assert_int_equal(vitc_sdpa_backward(&tq, &tk, &tv, m, mt, 0.0f, dout, g1[0], g1[1], g1[2]),
                         VITC_OK);
        assert_int_equal(vitc_sdpa_backward_lse(&tq, &tk, &tv, m, mt, 0.0f, o2, lse, dout, g2[0],
                                                g2[1], g2[2]),
                         VITC_OK);
        for (int i = 0; i < 3; i++) assert_memory_equal(g1[i], g2[i], (i ? nk : nq) * sizeof(float));
    }
    assert_int_equal(vitc_sdpa_lse(&tq, &tk, &tv, NULL, VITC_MASK_NONE, 0.0f, o2, NULL),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_sdpa_backward_lse(&tq, &tk, &tv, NULL, VITC_MASK_NONE, 0.0f, NULL, lse,
                                            dout, g2[0], g2[1], g2[2]),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_sdpa_backward_lse(&tq, &tk, &tv, NULL, VITC_MASK_NONE, 0.0f, o2, NULL,
                                            dout, g2[0], g2[1], g2[2]),
                     VITC_ERR_INVALID_ARG);
    free(q), free(k), free(v), free(dout), free(o1), free(o2), free(lse), free(mask);
    for (int i = 0; i < 3; i++) free(g1[i]), free(g2[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_public_saved_forward),
        cmocka_unit_test(test_self_sizes),       cmocka_unit_test(test_cross_and_dv),
        cmocka_unit_test(test_split),            cmocka_unit_test(test_fused_qkv),
        cmocka_unit_test(test_masks),            cmocka_unit_test(test_fully_masked_row),
        cmocka_unit_test(test_threads_bitwise),  cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_scratch_linear),   cmocka_unit_test(test_edges_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
