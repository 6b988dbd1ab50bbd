/*
 * test_attention_lp.c — the bf16 and int8 attention (vitc__sdpa_desc.prec,
 * attention_lp.c): on every path this CPU has, the kernel it runs against
 * the same attention with the portable reference microkernels (the same
 * bits, probabilities included); against a float64 softmax(q k^T s + m) v
 * within the bound the rounded operands allow; and in a ViT through
 * vitc_vit_set_attention_precision.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_impl.h"
#include "kernels/cpu.h"
#include "kernels/gemm_lp.h"
#include "testutil.h"


static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float frand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / 8388608.0 - 1.0);
}
static float *rnd(size_t n, float amp) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = amp * frand();
    return p;
}

typedef struct {
    int64_t B, H, L, S, D, Dv;
    int mask, probs;
} acase;

/* Edges in every dimension: odd D and S (a half-filled bf16 pair), S and
 * Dv past one 32-wide strip, L past one 12-row tile and one 192-row task;
 * ViT-B/16's head (197 tokens, d = 64). */
static const acase cases[] = {
    {1, 1, 1, 1, 1, 1, 0, 0},     {1, 2, 13, 45, 7, 9, 1, 1},   {2, 3, 197, 197, 64, 64, 0, 0},
    {1, 1, 40, 300, 33, 70, 1, 0}, {1, 2, 200, 65, 16, 33, 0, 1}, {2, 1, 5, 2, 2, 31, 1, 1},
};

typedef struct {
    float *q, *k, *v, *mask, *o, *probs;
    vitc__sdpa_desc d;
} adata;

static void make(const acase *c, adata *a) {
    size_t BH = (size_t)(c->B * c->H);
    a->q = rnd(BH * c->L * c->D, 1.0f);
    a->k = rnd(BH * c->S * c->D, 1.0f);
    a->v = rnd(BH * c->S * c->Dv, 1.0f);
    a->mask = NULL;
    if (c->mask) { /* a random additive mask with some keys disallowed */
        a->mask = rnd(BH * c->L * c->S, 2.0f);
        for (size_t i = 0; i < BH * c->L * c->S; i++)
            if (a->mask[i] > 1.6f) a->mask[i] = -INFINITY;
        for (int64_t j = 0; j < c->S; j++) a->mask[j] = -INFINITY; /* a fully masked row */
    }
    a->o = calloc(BH * c->L * c->Dv, sizeof(float));
    a->probs = c->probs ? calloc(BH * c->L * c->S, sizeof(float)) : NULL;
    a->d = (vitc__sdpa_desc){
        .B = c->B, .H = c->H, .L = c->L, .S = c->S, .D = c->D, .Dv = c->Dv,
        .q = a->q, .q_sb = c->H * c->L * c->D, .q_sh = c->L * c->D, .q_sr = c->D,
        .k = a->k, .k_sb = c->H * c->S * c->D, .k_sh = c->S * c->D, .k_sr = c->D,
        .v = a->v, .v_sb = c->H * c->S * c->Dv, .v_sh = c->S * c->Dv, .v_sr = c->Dv,
        .o = a->o, .o_sb = c->H * c->L * c->Dv, .o_sh = c->L * c->Dv, .o_sr = c->Dv,
        .scale = 1.0f / sqrtf((float)c->D),
        .mask = a->mask, .m_sb = c->H * c->L * c->S, .m_sh = c->L * c->S, .m_sr = c->S,
        .probs = a->probs, .p_sb = c->H * c->L * c->S, .p_sh = c->L * c->S, .p_sr = c->S,
        .prec = VITC_PRECISION_BF16,
    };
}

static void drop(adata *a) {
    free(a->q), free(a->k), free(a->v), free(a->mask), free(a->o), free(a->probs);
}

/* The kernel this CPU runs (through vitc__sdpa) and the reference
 * microkernels give the same bits, on every path, in both precisions. */
static void test_same_bits_as_reference(void **state) {
    (void)state;
    for (int p = 0; p < 2 * TU_NARCH; p++) {
        if (vitc_set_arch(tu_arch_best(p / 2)) != VITC_OK) continue;
        const int i8 = p & 1;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const acase *c = &cases[ci];
            adata a;
            make(c, &a);
            if (i8) a.d.prec = VITC_PRECISION_INT8;
            size_t no = (size_t)(c->B * c->H * c->L * c->Dv), np = (size_t)(c->B * c->H * c->L * c->S);
            assert_int_equal(vitc__sdpa(&a.d), VITC_OK);
            float *o1 = malloc(no * 4), *p1 = malloc(np * 4);
            memcpy(o1, a.o, no * 4);
            if (a.probs) memcpy(p1, a.probs, np * 4);
            memset(a.o, 0, no * 4);
            /* avx2-w7's panels lie in [-64, 64]: the reference on that range */
            const vitc__lp_kernel *ref =
                !i8 ? &vitc__lp_bf16_ref
                : vitc__lp_attention_kernel(VITC_PRECISION_INT8)->wmax ? &vitc__lp_int8_ref7
                                                                       : &vitc__lp_int8_ref;
            assert_int_equal(vitc__sdpa_lp(&a.d, ref), VITC_OK);
            if (memcmp(o1, a.o, no * 4))
                fail_msg("%s case %zu: %s attention differs from the reference",
                         tu_arch_best(p / 2), ci, i8 ? "int8" : "bf16");
            if (a.probs && memcmp(p1, a.probs, np * 4))
                fail_msg("%s case %zu: %s probabilities differ from the reference",
                         tu_arch_best(p / 2), ci, i8 ? "int8" : "bf16");
            free(o1), free(p1);
            drop(&a);
        }
    }
    vitc_set_arch(NULL);
}

/* The largest |x_i| (amax) and the range with 0 (lo, hi) of n floats. */
static void span(const float *x, int64_t n, double *amax, double *lo, double *hi) {
    *amax = *lo = *hi = 0.0;
    for (int64_t i = 0; i < n; i++) {
        *amax = fmax(*amax, fabs(x[i]));
        *lo = fmin(*lo, x[i]), *hi = fmax(*hi, x[i]);
    }
}

/* Against float64 on the unrounded inputs, per row, with the scores'
 * error at most delta, which moves each probability by a factor within
 * e^(+-2 delta) (g = 2 (e^(2 delta) - 1) with a margin of 2):
 * bf16: delta = scale 2^-8 max_j sum_c |q_c k_jc| (q and k each rounded by
 *   2^-9; fp32 sums far below); P and v rounded add 2^-8 relative:
 *   |o - o64| <= (g + 2^-7) sum_j p_j |v_j|.
 * int8: q's row on steps of sq = its range / 255, key j's on sk_j =
 *   max|k_j| / 127 (64 on avx2-w7), each value within half a step: delta = scale max_j
 *   sum_c (|q_c| sk_j + |k_jc| sq + sq sk_j / 2) / 2; P on steps of 1/255
 *   of its largest (1) before the division by the sum (>= sum64 e^-2delta),
 *   v's channel c on sv_c = max|v_c| / 127 (64):
 *   |o - o64| <= 2 (g sum_j p_j |v_j| + S e max|v_c| + (1 + g + S e) sv_c / 2),
 *   e = 1 / (510 sum64 e^-2delta).
 * Probabilities returned within g p + 2^-20 (they are not quantized). It
 * must also differ from fp32. A fully masked row is 0 (NaN when the
 * weights are returned), as in fp32. */
static void vs_f64(vitc_precision pr) {
    const int i8 = pr == VITC_PRECISION_INT8;
    /* 127, or 64 where the kernel's panels lie in [-64, 64] (avx2-w7) */
    const int w = vitc__lp_attention_kernel(VITC_PRECISION_INT8)->wmax;
    const double kq = w ? w : 127.0;
    double worst = 0.0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const acase *c = &cases[ci];
        adata a;
        make(c, &a);
        a.d.prec = pr;
        assert_int_equal(vitc__sdpa(&a.d), VITC_OK);
        vitc__sdpa_desc f = a.d;
        float *o32 = calloc((size_t)(c->B * c->H * c->L * c->Dv), sizeof(float));
        f.o = o32, f.probs = NULL, f.prec = VITC_PRECISION_FP32;
        assert_int_equal(vitc__sdpa(&f), VITC_OK);
        int differs = 0;
        double *s = malloc((size_t)c->S * sizeof *s), *pr = malloc((size_t)c->S * sizeof *pr);
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->H; h++)
                for (int64_t l = 0; l < c->L; l++) {
                    const float *q = a.q + b * a.d.q_sb + h * a.d.q_sh + l * c->D;
                    const float *m = a.mask ? a.mask + b * a.d.m_sb + h * a.d.m_sh + l * c->S : NULL;
                    double mx = -INFINITY, delta = 0.0, sum = 0.0, qa, qlo, qhi;
                    span(q, c->D, &qa, &qlo, &qhi);
                    const double sq = (qhi - qlo) / 255.0;
                    for (int64_t j = 0; j < c->S; j++) {
                        const float *k = a.k + b * a.d.k_sb + h * a.d.k_sh + j * c->D;
                        double acc = 0.0, mag = 0.0, ka, klo, khi, e8 = 0.0;
                        span(k, c->D, &ka, &klo, &khi);
                        for (int64_t x = 0; x < c->D; x++) {
                            acc += (double)q[x] * k[x];
                            mag += fabs((double)q[x] * k[x]);
                            e8 += fabs((double)q[x]) * ka / kq + fabs((double)k[x]) * sq +
                                  sq * ka / (2.0 * kq);
                        }
                        s[j] = acc * a.d.scale + (m ? m[j] : 0.0);
                        delta = fmax(delta, i8 ? (e8 / 2.0 + 1e-6 * mag) * a.d.scale
                                               : mag * a.d.scale / 256.0);
                        mx = fmax(mx, s[j]);
                    }
                    const float *o = a.o + b * a.d.o_sb + h * a.d.o_sh + l * c->Dv;
                    if (mx == -INFINITY) { /* fully masked: torch 2.x's 0, NaN with weights */
                        for (int64_t x = 0; x < c->Dv; x++)
                            assert_true(c->probs ? isnan(o[x]) : o[x] == 0.0f);
                        continue;
                    }
                    for (int64_t j = 0; j < c->S; j++) sum += pr[j] = exp(s[j] - mx);
                    double g = 2.0 * expm1(2.0 * delta);
                    double e = 1.0 / (510.0 * sum * exp(-2.0 * delta));
                    for (int64_t x = 0; x < c->Dv; x++) {
                        double ref = 0.0, mag = 0.0, vmax = 0.0;
                        for (int64_t j = 0; j < c->S; j++) {
                            double v = a.v[b * a.d.v_sb + h * a.d.v_sh + j * c->Dv + x];
                            ref += pr[j] / sum * v;
                            mag += pr[j] / sum * fabs(v);
                            vmax = fmax(vmax, fabs(v));
                        }
                        double se = (double)c->S * e;
                        double err = fabs(o[x] - ref),
                               tol = i8 ? 2.0 * (g * mag + se * vmax +
                                                 (1.0 + g + se) * vmax / (2.0 * kq)) + 1e-6
                                        : (g + 1.0 / 128) * mag + 1e-6;
                        worst = fmax(worst, err / tol);
                        if (!(err <= tol))
                            fail_msg("%s case %zu (b %lld h %lld l %lld c %lld): %g vs %g, bound %g",
                                     i8 ? "int8" : "bf16", ci,
                                     (long long)b, (long long)h, (long long)l, (long long)x,
                                     (double)o[x], ref, tol);
                        differs |= o[x] != o32[b * a.d.o_sb + h * a.d.o_sh + l * c->Dv + x];
                    }
                    if (a.probs) {
                        const float *p = a.probs + b * a.d.p_sb + h * a.d.p_sh + l * c->S;
                        for (int64_t j = 0; j < c->S; j++) {
                            double want = pr[j] / sum;
                            assert_true(fabs(p[j] - want) <= g * want + 1.0 / (1 << 20));
                        }
                    }
                }
        if (c->S * c->D > 8) assert_true(differs);
        free(s), free(pr), free(o32);
        drop(&a);
    }
    printf("# %s attention: worst error %.3f of the bound\n", i8 ? "int8" : "bf16", worst);
}

static void test_vs_f64_bf16(void **state) {
    (void)state;
    vs_f64(VITC_PRECISION_BF16);
}

static void test_vs_f64_int8(void **state) {
    (void)state;
    vs_f64(VITC_PRECISION_INT8);
}

/* Under weights of precision w, the default attention is `want`, with the
 * same logits as `want` set explicitly. */
static void auto_is_explicit(vitc_vit *m, const float *x, vitc_precision w, vitc_precision want) {
    float t[80], h[80];
    assert_int_equal(vitc_vit_set_attention_precision_auto(m), VITC_OK);
    assert_int_equal(vitc_vit_set_precision(m, w), VITC_OK);
    assert_int_equal(vitc_vit_get_attention_precision(m), want);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, t), VITC_OK);
    assert_int_equal(vitc_vit_set_attention_precision(m, want), VITC_OK);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, h), VITC_OK);
    assert_memory_equal(t, h, sizeof h);
}

/* A ViT's bf16 / int8 attention: the option is separate from the weights'
 * precision, changes the logits a little, and training forwards ignore it. */
static void test_vit_attention_precision(void **state) {
    (void)state;
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 32, c.patch_size = 4, c.hidden_dim = 64, c.depth = 2, c.num_heads = 2;
    c.mlp_dim = 96, c.num_classes = 40;
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_create(&c, 3, &m), VITC_OK);
    int hi = vitc_vit_find_param(m, "heads.head.weight");
    float *w;
    assert_int_equal(vitc_vit_param(m, hi, NULL, NULL, NULL, &w, NULL), VITC_OK);
    for (int k = 0; k < 40 * 64; k++) w[k] = 0.3f * frand(); /* vitc_vit_create zeroes it */
    float *x = rnd(2 * 3 * 32 * 32, 1.0f), f[80], g[80], t[80];
    assert_int_equal(vitc_vit_get_attention_precision(m), VITC_PRECISION_FP32);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, f), VITC_OK);
    assert_int_equal(vitc_vit_set_attention_precision(m, (vitc_precision)3), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_attention_precision(NULL, VITC_PRECISION_BF16),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_attention_precision(m, VITC_PRECISION_BF16), VITC_OK);
    assert_int_equal(vitc_vit_get_attention_precision(m), VITC_PRECISION_BF16);
    assert_int_equal(vitc_vit_get_precision(m), VITC_PRECISION_FP32);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, g), VITC_OK);
    double num = 0, den = 0;
    for (int k = 0; k < 80; k++) num += (g[k] - f[k]) * (double)(g[k] - f[k]), den += f[k] * (double)f[k];
    printf("# ViT with bf16 attention: relative logits error %.4g\n", sqrt(num / den));
    assert_true(num > 0 && sqrt(num / den) < 0.01);
    assert_int_equal(vitc_vit_set_attention_precision(m, VITC_PRECISION_INT8), VITC_OK);
    assert_int_equal(vitc_vit_get_attention_precision(m), VITC_PRECISION_INT8);
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, g), VITC_OK);
    num = den = 0;
    for (int k = 0; k < 80; k++) num += (g[k] - f[k]) * (double)(g[k] - f[k]), den += f[k] * (double)f[k];
    printf("# ViT with int8 attention: relative logits error %.4g\n", sqrt(num / den));
    assert_true(num > 0 && sqrt(num / den) < 0.03);
    vitc_vit_set_training(m, 1); /* dropout is 0: the training forward is the fp32 one */
    assert_int_equal(vitc_vit_forward(m, x, 2, 32, 32, t), VITC_OK);
    vitc_vit_set_training(m, 0);
    for (int k = 0; k < 80; k++) assert_true(fabsf(t[k] - f[k]) <= 1e-5f * (1 + fabsf(f[k])));
    /* Unset, it follows the weights: under bf16 weights bf16 where this CPU
     * runs it faster (AMD: bf16; Intel: fp32), under int8 weights int8
     * there (else as bf16's), the same logits as set explicitly; fp32 under
     * fp32; a value set stays. */
    const vitc_precision lp_attn =
        vitc__attention_pays(VITC_PRECISION_BF16) ? VITC_PRECISION_BF16 : VITC_PRECISION_FP32;
    const vitc_precision i8_attn =
        vitc__attention_pays(VITC_PRECISION_INT8) ? VITC_PRECISION_INT8 : lp_attn;
    if (!strcmp(vitc__cpu_get()->vendor, "GenuineIntel")) {
        assert_int_equal(lp_attn, VITC_PRECISION_FP32);
        assert_int_equal(i8_attn, VITC_PRECISION_FP32);
    } else if (!strcmp(vitc__cpu_get()->vendor, "AuthenticAMD") &&
               strstr(vitc_get_precision_paths(), "bf16: avx512-bf16")) {
        assert_int_equal(lp_attn, VITC_PRECISION_BF16);
        assert_int_equal(i8_attn, VITC_PRECISION_INT8);
    }
    assert_int_equal(vitc_vit_set_attention_precision_auto(NULL), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_attention_precision_auto(m), VITC_OK);
    assert_int_equal(vitc_vit_get_attention_precision(m), VITC_PRECISION_FP32);
    auto_is_explicit(m, x, VITC_PRECISION_BF16, lp_attn);
    auto_is_explicit(m, x, VITC_PRECISION_INT8, i8_attn);
    assert_int_equal(vitc_vit_set_attention_precision(m, VITC_PRECISION_FP32), VITC_OK);
    assert_int_equal(vitc_vit_set_precision(m, VITC_PRECISION_INT8), VITC_OK);
    assert_int_equal(vitc_vit_get_attention_precision(m), VITC_PRECISION_FP32);
    free(x);
    vitc_vit_free(m);
}

int main(void) {
    printf("# %s\n", vitc_get_precision_paths());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_reference),
        cmocka_unit_test(test_vs_f64_bf16),
        cmocka_unit_test(test_vs_f64_int8),
        cmocka_unit_test(test_vit_attention_precision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
