/*
 * sam_stats.c — the image side's LayerNorm statistics of SAM's two-layer
 * transformer without forming the image side. Once the final attention,
 * the upscaling and the second layer's attentions read K_1 and K_2 through
 * their LayerNorms (sam_decoder.c, sam_upscale.c), what is left of
 *   Y_0 = K_0 + S_0 V_0 + beta_0,  K_1 = LN_0(Y_0),  Y_1 = K_1 + S_1 V_1 + beta_1
 * is each row's mean and 1 / std of Y_0 and Y_1. Their sums and sums of
 * squares split into a part of the image alone (kept in the image's
 * cache), products of the token values with per-image packs, and
 * quadratic forms S_p G S_p^T with [H T, H T] matrices G of the prompt:
 * 67 M multiply-adds for one point instead of the two [HW, H T] x [H T, C]
 * products (117 M) and the passes over the [HW, C] maps they fed. A block
 * of rows at a time goes through all of it in one thread's L2: the
 * [H T, HW] products are never formed whole.
 *
 * Row p, a = K_0 + beta_0 (per image), gamma, b the first layer_norm4's
 * weight and bias, e = b + beta_1, V_i = vo_i [H T, C] (the values through
 * out_proj), S_i [H T, HW] (stored transposed, columns p):
 *   sum Y_0   = sum a + S_0 (V_0 1)
 *   sum Y_0^2 = |a|^2 + 2 S_0 . U + S_0 (V_0 V_0^T) S_0^T,  U = V_0 a_p: per
 *               head v_h Q0_h^T, Q0 = a W_o0 [HW, I] packed per image
 *   Z = K_1 + beta_1 = rho_0 (Y_0 - mu_0) gamma + e
 *   sum Z, |Z|^2 from the gamma- and gamma^2-weighted sums of Y_0 the same
 *               way (Q0' = (a gamma^2) W_o0; V_0 diag(gamma^2) V_0^T)
 *   sum Y_1   = sum Z + S_1 (V_1 1)
 *   sum Y_1^2 = |Z|^2 + 2 S_1 . (V_1 Z_p) + S_1 (V_1 V_1^T) S_1^T, with
 *               V_1 Z_p = rho_0 (v1_h Q1_h^T + (V_1 diag(gamma) V_0^T) S_0
 *               - mu_0 V_1 gamma) + V_1 e, Q1 = (a gamma) W_o1
 * The row sums are combined in double; the variance is E[y^2] - mean^2,
 * which the LayerNorms' outputs (mean near their bias's, spread near their
 * weight's) keep well away from cancellation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "sam_decoder_impl.h"

/* Per-row constants of the image in c->sfc: */
enum { SF_A, SF_A2, SF_GA, SF_G2A, SF_G2A2, SF_GEA, SF_N };

void vitc__sam_sf_cache(struct vitc__sam_dec_cache *c, const vitc__sam_dec *d, int64_t HW) {
    const sam_layer *L0 = &d->layers[0], *L1 = &d->layers[1];
    const int64_t C = d->C, H = d->heads, I0 = L0->i2t.I, I1 = L1->i2t.I;
    const int64_t Im = I0 > I1 ? I0 : I1;
    const float *g = L0->ln4.w, *b = L0->ln4.b, *beta0 = L0->i2t.o.b, *beta1 = L1->i2t.o.b;
    float *a = calloc((size_t)(HW * C), sizeof(float)); /* calloc: -Wmaybe-uninitialized */
    float *as = malloc((size_t)(HW * C) * sizeof(float));
    float *x = malloc((size_t)(HW * Im) * sizeof(float));
    float *t = malloc((size_t)(HW * (Im / H)) * sizeof(float));
    c->sfc = malloc((size_t)(SF_N * HW) * sizeof(double));
    int ok = a && as && x && t && c->sfc;
    for (int k = 0; ok && k < 3; k++) ok = (c->sf[k] = calloc((size_t)H, sizeof **c->sf)) != NULL;
    if (ok) {
        for (int64_t p = 0; p < HW; p++) {
            const float *k0 = c->K0 + p * C;
            float *ap = a + p * C;
            double s[SF_N] = {0};
            for (int64_t j = 0; j < C; j++) {
                ap[j] = k0[j] + beta0[j];
                const double v = ap[j], gj = g[j];
                s[SF_A] += v, s[SF_A2] += v * v, s[SF_GA] += gj * v, s[SF_G2A] += gj * gj * v;
                s[SF_G2A2] += gj * gj * v * v, s[SF_GEA] += gj * ((double)b[j] + beta1[j]) * v;
            }
            memcpy(c->sfc + SF_N * p, s, sizeof s);
        }
        /* Q0 = a W_o0 (out_proj's weight [C, I]), Q0' = (a gamma^2) W_o0,
         * Q1 = (a gamma) W_o1 */
        vitc__gemm(0, 0, HW, I0, C, 1.0f, a, C, L0->i2t.o.w, I0, 0.0f, x, I0);
        ok = vitc__sam_pack_slices(c->sf[0], x, HW, I0, H, 0, t);
        for (int64_t p = 0; p < HW; p++)
            for (int64_t j = 0; j < C; j++) as[p * C + j] = a[p * C + j] * g[j] * g[j];
        vitc__gemm(0, 0, HW, I0, C, 1.0f, as, C, L0->i2t.o.w, I0, 0.0f, x, I0);
        ok = ok && vitc__sam_pack_slices(c->sf[1], x, HW, I0, H, 0, t);
        for (int64_t p = 0; p < HW; p++)
            for (int64_t j = 0; j < C; j++) as[p * C + j] = a[p * C + j] * g[j];
        vitc__gemm(0, 0, HW, I1, C, 1.0f, as, C, L1->i2t.o.w, I1, 0.0f, x, I1);
        ok = ok && vitc__sam_pack_slices(c->sf[2], x, HW, I1, H, 0, t);
    }
    free(a), free(as), free(x), free(t);
    if (!ok) {
        for (int k = 0; k < 3; k++) vitc__sam_free_packs(c->sf[k], H), c->sf[k] = NULL;
        free(c->sfc);
        c->sfc = NULL;
    }
}

/* o1, o2 [m] = sum over j of S's row j times X1's, X2's row j (S [n, lds],
 * X1, X2 [n, ldx]), over m columns: a pass over S's rows with the sums in
 * L1; inner loops of a fixed 8 (which -O2 vectorises). */
#define SF_COLS 512
static void sf_colsum2(float *restrict o1, float *restrict o2, const float *restrict S,
                       int64_t lds, const float *restrict X1, const float *restrict X2,
                       int64_t ldx, int64_t n, int64_t m) {
    const int64_t m8 = m / 8 * 8;
    for (int64_t q = 0; q < m; q++) o1[q] = o2[q] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float *restrict s = S + j * lds;
        const float *restrict x1 = X1 + j * ldx, *restrict x2 = X2 + j * ldx;
        for (int64_t q = 0; q < m8; q += 8)
            for (int k = 0; k < 8; k++) {
                o1[q + k] += s[q + k] * x1[q + k];
                o2[q + k] += s[q + k] * x2[q + k];
            }
        for (int64_t q = m8; q < m; q++) o1[q] += s[q] * x1[q], o2[q] += s[q] * x2[q];
    }
}

typedef struct sf_ctx sf_ctx;
typedef struct sf_spec sf_spec;
/* A layer's rows [p0, p1) from their two column sums o1, o2 and R's
 * columns (R [n_vec, SF_COLS], column 0 row p0). */
typedef void (*sf_rows_fn)(const sf_ctx *k, int64_t p0, int64_t p1, const float *o1,
                           const float *o2, const float *R);
struct sf_ctx {
    const vitc__sam_dec *d;
    sam_run *r;
    const sf_spec *sp;
    const double *sfc;         /* the cache's [HW, SF_N] */
    const float *Ga, *Gb, *w;  /* [H T, H T] twice, [n_vec, H T]: one [2 H T + n_vec, H T] */
    const float *v;            /* [T, I] the token values (doubled when beta_a is 2) */
    float *scr;                /* per thread: X1, X2 [H T, SF_COLS], R [4, SF_COLS] */
    double sg, sg2, sge, se, se2; /* sum gamma, gamma^2, gamma e, e, e^2 */
    int64_t HT, HW, C, T, H, per;
    int64_t blk;               /* rows a block: SF_COLS cut to whole strips of the packs */
    int one;                   /* the three products one (see sf_layer) */
    _Atomic int failed;
};

/* One layer's statistics (sf_layer): its token vectors w (V times each of
 * vec[]), a copy of V with its columns scaled by sc, the two [H T, H T]
 * products Ga = Va Vb_a^T and Gb; per block of SF_COLS rows, the heads'
 * products with the packs into X1 (and X2), then X1 = Ga Sa + beta_a X1,
 * X2 = Gb Sb + beta_b X2, R = w S, the column sums and the rows. */
struct sf_spec {
    const float *V, *sc;        /* [H T, C], [C] */
    const float *vec[4];        /* [C] each, NULL: ones */
    int n_vec;
    /* Ga = (scaled ? V sc : V) Va^T, Gb likewise */
    int ga_scaled, gb_scaled;
    const float *ga_b, *gb_b;   /* [H T, C] */
    const float *Sa, *Sb, *S;   /* [H T, HW] */
    float beta_a, beta_b;       /* 0, 1 or 2 */
    const vitc__pweight *pk[2]; /* pk[1] NULL: X2 from Gb alone */
    int64_t I;
    sf_rows_fn rows;
};

/* Block i of SF_COLS rows, all in one thread's L2: the token values
 * through the packs' columns, the [H T, H T] products, the column sums,
 * then the layer's rows. The [H T, HW] products are never formed whole. */
static void sf_block(void *vc, int64_t i, int tid) {
    sf_ctx *k = vc;
    const sf_spec *sp = k->sp;
    const int64_t HT = k->HT, HW = k->HW, T = k->T, dh = sp->I / k->H, B = SF_COLS;
    const int64_t p0 = i * k->blk, p1 = p0 + k->blk < HW ? p0 + k->blk : HW, m = p1 - p0;
    float *X1 = k->scr + tid * k->per, *X2 = X1 + HT * B, *R = X2 + HT * B;
    float o1[SF_COLS], o2[SF_COLS];
    for (int j = 0; j < 2 && sp->pk[j]; j++)
        for (int64_t h = 0; h < k->H; h++) {
            vitc__pweight cols;
            if (!vitc__pweight_cols(&cols, &sp->pk[j][h], p0, m) ||
                vitc__linear_pw((j ? X2 : X1) + h * T * B, B, k->v + h * dh, sp->I, &cols,
                                cols.data, NULL, NULL, 0, T, m, dh, VITC__ACT_NONE) != VITC_OK) {
                k->failed = 1;
                return;
            }
        }
    if (k->one) {
        for (int64_t j = 0; j < sp->n_vec; j++) memset(R + j * B, 0, (size_t)m * sizeof(float));
        vitc__gemm(0, 0, 2 * HT + sp->n_vec, m, HT, 1.0f, k->Ga, HT, sp->S + p0, HW, 1.0f, X1, B);
    } else {
        vitc__gemm(0, 0, HT, m, HT, 1.0f, k->Ga, HT, sp->Sa + p0, HW, sp->beta_a, X1, B);
        if (sp->Sb == sp->S && sp->beta_b == 0.0f) /* X2 and R: one product */
            vitc__gemm(0, 0, HT + sp->n_vec, m, HT, 1.0f, k->Gb, HT, sp->S + p0, HW, 0.0f, X2, B);
        else {
            vitc__gemm(0, 0, HT, m, HT, 1.0f, k->Gb, HT, sp->Sb + p0, HW, sp->beta_b, X2, B);
            vitc__gemm(0, 0, sp->n_vec, m, HT, 1.0f, k->w, HT, sp->S + p0, HW, 0.0f, R, B);
        }
    }
    sf_colsum2(o1, o2, sp->S + p0, HW, X1, X2, B, HT, m);
    sp->rows(k, p0, p1, o1, o2, R);
}

static float rstd(double s1, double s2, int64_t C, float eps, float *mu) {
    const double m = s1 / (double)C;
    double var = s2 / (double)C - m * m;
    if (var < 0.0)
        var = 0.0;
    *mu = (float)m;
    return (float)(1.0 / sqrt(var + (double)eps));
}

/* Layer 0's mean and 1 / std for rows [p0, p1), and what layer 1 keeps
 * of them (sum Z, |Z|^2 in r->sf.z). o1, o2: S_0's column sums against
 * X1 = 2 U + G_0 S_0 and X2 = 2 U' + G_0' S_0. */
static void sf0_rows(const sf_ctx *k, int64_t p0, int64_t p1, const float *o1,
                     const float *o2, const float *Rb) {
    const int64_t HW = SF_COLS; /* R's row stride */
    for (int64_t p = p0; p < p1; p++) {
        const int64_t q = p - p0;
        const double *a = k->sfc + SF_N * p;
        const float *R = Rb + q;
        float muf;
        const float rhof = rstd(a[SF_A] + R[0], a[SF_A2] + o1[q], k->C, k->d->eps_dec, &muf);
        k->r->f.st[2 * p] = muf, k->r->f.st[2 * p + 1] = rhof;
        const double m0 = muf, r0 = rhof;
        const double gy = a[SF_GA] + R[HW], g2y = a[SF_G2A] + R[2 * HW];
        const double g2y2 = a[SF_G2A2] + o2[q], gey = a[SF_GEA] + R[3 * HW];
        /* sum gamma^2 (Y_0 - mu_0)^2 */
        const double c2 = g2y2 - 2.0 * m0 * g2y + m0 * m0 * k->sg2;
        k->r->sf.z[2 * p] = r0 * (gy - m0 * k->sg) + k->se;
        k->r->sf.z[2 * p + 1] = r0 * r0 * c2 + 2.0 * r0 * (gey - m0 * k->sge) + k->se2;
    }
}

/* Layer 1's mean and 1 / std for rows [p0, p1). o1, o2: S_1's column sums
 * against X1 = W + M S_0 (the part of V_1 Z_p that rho_0 scales) and X2 =
 * G_1 S_1. */
static void sf1_rows(const sf_ctx *k, int64_t p0, int64_t p1, const float *o1,
                     const float *o2, const float *Rb) {
    const int64_t HW = SF_COLS; /* R's row stride */
    float *st1 = k->r->f.st + 2 * k->HW;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t q = p - p0;
        const double m0 = k->r->f.st[2 * p], r0 = k->r->f.st[2 * p + 1];
        const float *R = Rb + q;
        /* S_1 . (V_1 Z_p) */
        const double sw = r0 * (o1[q] - m0 * R[HW]) + R[2 * HW];
        const double *z = k->r->sf.z + 2 * p;
        st1[2 * p + 1] = rstd(z[0] + R[0], z[1] + 2.0 * sw + o2[q], k->C, k->d->eps_dec,
                              &st1[2 * p]);
    }
}

static void sf_init(sf_ctx *k, const vitc__sam_dec *d, sam_run *r) {
    const double *sm = d->sf_s;
    *k = (sf_ctx){.d = d, .r = r, .sfc = r->c0->sfc, .HT = r->f.HT, .HW = r->HW, .C = d->C,
                  .sg = sm[0], .sg2 = sm[1], .sge = sm[2], .se = sm[3], .se2 = sm[4]};
}

/* w [n, HT] = x [n, C] V^T (x_i NULL: ones), xs [n, C] scratch: one
 * product (as n x H T dot products in double they ran a tenth of a
 * millisecond on one thread while the other waited). */
static void tok_vecs(float *w, float *xs, const float *V, const float *const *x, int n,
                     int64_t HT, int64_t C) {
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < C; j++) xs[i * C + j] = x[i] ? x[i][j] : 1.0f;
    vitc__gemm(0, 1, n, HT, C, 1.0f, xs, C, V, C, 0.0f, w, HT);
}

static vitc_status sf_layer(const vitc__sam_dec *d, sam_run *r, const sf_spec *sp) {
    const int64_t HT = r->f.HT, HW = r->HW, C = d->C, H = d->heads, T = HT / H;
    const int nt = vitc__num_threads();
    const int64_t per = (2 * HT + 4) * SF_COLS;
    float *Vs = malloc((size_t)(HT * C + 2 * HT * HT + 4 * HT + 4 * C + nt * per) *
                       sizeof(float));
    if (!Vs)
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's statistics");
    float *Ga = Vs + HT * C, *Gb = Ga + HT * HT, *w = Gb + HT * HT, *xs = w + 4 * HT;
    tok_vecs(w, xs, sp->V, sp->vec, sp->n_vec, HT, C);
    for (int64_t i = 0; i < HT; i++)
        for (int64_t j = 0; j < C; j++) Vs[i * C + j] = sp->V[i * C + j] * sp->sc[j];
    vitc__gemm(0, 1, HT, HT, C, 1.0f, sp->ga_scaled ? Vs : sp->V, C, sp->ga_b, C, 0.0f, Ga, HT);
    vitc__gemm(0, 1, HT, HT, C, 1.0f, sp->gb_scaled ? Vs : sp->V, C, sp->gb_b, C, 0.0f, Gb, HT);
    sf_ctx k;
    sf_init(&k, d, r);
    /* beta 2 on both: the values doubled (exactly) make 2 U, and the three
     * products, one right operand, run as one (Ga, Gb and w are one
     * [2 H T + n_vec, H T] matrix, X1, X2 and R one output): bitwise the
     * three */
    k.one = sp->Sa == sp->S && sp->Sb == sp->S && sp->pk[1] && sp->beta_a == 2.0f &&
            sp->beta_b == 2.0f;
    k.v = r->tv;
    if (k.one) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < sp->I; j++) Vs[t * sp->I + j] = 2.0f * r->tv[t * sp->I + j];
        k.v = Vs; /* Vs is free again: Ga and Gb are made */
    }
    k.sp = sp, k.Ga = Ga, k.Gb = Gb, k.w = w, k.T = T, k.H = H, k.per = per;
    k.scr = xs + 4 * C;
    /* a block starts on a strip of the packs (vitc__pweight_cols) */
    const int64_t nr = vitc__pweight_col_step(&sp->pk[0][0]);
    k.blk = nr > 0 ? SF_COLS / nr * nr : 0;
    if (k.blk < 1) {
        free(Vs);
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM statistics: the packs' strips are wider "
                         "than a block");
    }
    sam_tasks((HW + k.blk - 1) / k.blk, sf_block, &k);
    free(Vs);
    return k.failed ? vitc__err(VITC_ERR_INVALID_ARG, "SAM statistics: a GEMM refused its "
                                "arguments")
                    : VITC_OK;
}

/* Layer 0: vectors 1, gamma, gamma^2, gamma e; X1 = 2 U + V0 V0^T S0, X2
 * = 2 U' + V0 diag(gamma^2) V0^T S0. */
vitc_status vitc__sam_sf_layer0(const vitc__sam_dec *d, sam_run *r) {
    const sam_layer *L0 = &d->layers[0];
    const int64_t C = d->C;
    const float *g = L0->ln4.w, *g2 = d->sf_v, *ge = d->sf_v + C;
    const sf_spec sp = {.V = r->vo, .sc = g2, .vec = {NULL, g, g2, ge}, .n_vec = 4,
                        .ga_scaled = 0, .gb_scaled = 1, .ga_b = r->vo, .gb_b = r->vo,
                        .Sa = r->f.S, .Sb = r->f.S, .S = r->f.S, .beta_a = 2.0f, .beta_b = 2.0f,
                        .pk = {r->c0->sf[0], r->c0->sf[1]}, .I = L0->i2t.I, .rows = sf0_rows};
    return sf_layer(d, r, &sp);
}

/* Layer 1: vectors 1, gamma, e; X1 = W + V1 diag(gamma) V0^T S0, X2 =
 * V1 V1^T S1. */
vitc_status vitc__sam_sf_layer1(const vitc__sam_dec *d, sam_run *r) {
    const sam_layer *L0 = &d->layers[0], *L1 = &d->layers[1];
    const int64_t C = d->C, HW = r->HW;
    const float *S1 = r->f.S + HW * r->f.HT, *e = d->sf_v + 2 * C;
    const sf_spec sp = {.V = r->vo, .sc = L0->ln4.w, .vec = {NULL, L0->ln4.w, e}, .n_vec = 3,
                        .ga_scaled = 1, .gb_scaled = 0, .ga_b = r->f.V0, .gb_b = r->vo,
                        .Sa = r->f.S, .Sb = S1, .S = S1, .beta_a = 1.0f, .beta_b = 0.0f,
                        .pk = {r->c0->sf[2], NULL}, .I = L1->i2t.I, .rows = sf1_rows};
    return sf_layer(d, r, &sp);
}
