/*
 * sam_upscale.c — SAM's mask decoder after the two-way transformer: the
 * two transposed convolutions with their LayerNorm2d and GELUs, and the
 * hypernetwork rows' products, a block of input pixels at a time; the
 * first convolution read through the transformer's LayerNorms when the
 * prompt allows (upf_* in sam_decoder_impl.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "sam_decoder_impl.h"

/* Input pixels per task: its z1 and z2 (3 C floats a pixel, 384 KiB at
 * C = 256) stay in a core's L2. */
#define UP_PIX 128

/* The upscaling and the hypernetwork product fused: each input pixel of
 * the [G, G, C] map alone makes its 4 x 4 block of the low-resolution
 * masks (the transposed convolutions tile without overlap, LayerNorm2d
 * and GELU are per pixel), so a task takes a block of pixels through both
 * GEMMs (packed weights), the LayerNorm, the GELUs and the dot products
 * with the hypernetwork rows while it is in cache: the [2G, 2G, C/4] and
 * [4G, 4G, C/8] maps are never formed, and no weight is packed per call. */

typedef struct up_ctx {
    const vitc__sam_dec *d;
    const float *x;     /* [G, G, C] */
    const float *hyper; /* [n, C/8] */
    float *low;         /* [n, 4G, 4G] */
    /* per thread: z1 [4 UP_PIX, C/4], z2 [16 UP_PIX, C/8], folded X
     * [UP_PIX, Kf] and rho [L + 1, UP_PIX], the dots [n, 16 UP_PIX] */
    float *scr;
    int64_t n, G, per;
    const sam_run *r;      /* r->f.on: up1 folded */
    const float *P0;       /* [G G, C] */
    const vitc__pweight *bw; /* r->f.Bt packed */
    _Atomic int failed;
} up_ctx;

/* The folded up1 of pixels p0.. p0 + P into z1 [P, C]: with L layers'
 * image -> token probabilities S_i, layer_norm4 means mu_i and scales r_i
 * and rho_i = prod_{j >= i} r_j per pixel, the transformer's image output
 * through up1 is, LayerNorm by LayerNorm unrolled,
 *   rho_0 P0 + sum_i (rho_i S_i) A_i + sum_k rho_k u_k - sum_i rho_i mu_i h_i + u_L
 * (P0, u, h: the image cache's and the decoder's upf_*; A_i = vo_i M_i):
 * one product over L H T + 2 L columns instead of C, the image-sized part
 * of up1 (K0 M_0) made once per image. */
static vitc_status up1_folded(const up_ctx *c, float *z1, float *X, float *rho, int64_t p0,
                              int64_t P) {
    const vitc__sam_dec *d = c->d;
    const sam_run *r = c->r;
    const int64_t L = d->n_layers, C = d->C, HW = r->HW, HT = r->f.HT, Kf = r->f.Kf;
    for (int64_t p = 0; p < P; p++) rho[L * UP_PIX + p] = 1.0f;
    for (int64_t i = L - 1; i >= 0; i--)
        for (int64_t p = 0; p < P; p++)
            rho[i * UP_PIX + p] = rho[(i + 1) * UP_PIX + p] * r->f.st[2 * (i * HW + p0 + p) + 1];
    for (int64_t i = 0; i < L; i++) {
        const float *S = r->f.S + i * HW * HT, *ri = rho + i * UP_PIX;
        if (r->f.St >> i & 1) { /* [HT, HW] */
            for (int64_t j = 0; j < HT; j++)
                for (int64_t p = 0; p < P; p++) X[p * Kf + i * HT + j] = ri[p] * S[j * HW + p0 + p];
        } else {
            for (int64_t p = 0; p < P; p++)
                for (int64_t j = 0; j < HT; j++)
                    X[p * Kf + i * HT + j] = ri[p] * S[(p0 + p) * HT + j];
        }
        for (int64_t p = 0; p < P; p++) {
            X[p * Kf + L * HT + i] = ri[p];
            X[p * Kf + L * HT + L + i] = ri[p] * r->f.st[2 * (i * HW + p0 + p)];
        }
    }
    VITC_TRY(vitc__linear_pw(z1, C, X, Kf, c->bw, r->f.Bt, d->upf_u + L * C, NULL, 0, P, C, Kf,
                             VITC__ACT_NONE));
    for (int64_t p = 0; p < P; p++) axpy_row(z1 + p * C, rho[p], c->P0 + (p0 + p) * C, C);
    return VITC_OK;
}

static void up_row(void *vc, int64_t blk, int tid) {
    up_ctx *c = vc;
    const vitc__sam_dec *d = c->d;
    const int64_t G = c->G, C = d->C, C4 = C / 4, C8 = C / 8, lo = 4 * G;
    const int64_t p0 = blk * UP_PIX, P = G * G - p0 < UP_PIX ? G * G - p0 : UP_PIX;
    float *z1 = c->scr + tid * c->per; /* [P, 2, 2, C/4]: (pixel, tap) rows */
    float *z2 = z1 + 4 * UP_PIX * C4;  /* [P, 2, 2, 2, 2, C/8] */
    float *X = z2 + 16 * UP_PIX * C8;  /* folded: [P, Kf] */
    if (c->r->f.on
            ? up1_folded(c, z1, X, X + UP_PIX * c->r->f.Kf, p0, P) != VITC_OK
            : vitc__linear_pw(z1, 4 * C4, c->x + p0 * C, C, &d->up1_pw, d->up1.w, d->up1_b4,
                              NULL, 0, P, 4 * C4, C, VITC__ACT_NONE) != VITC_OK) {
        c->failed = 1;
        return;
    }
    vitc__layernorm(z1, z1, d->up_ln.w, d->up_ln.b, 4 * P, C4, 1e-6f);
    vitc__gelu(z1, 4 * P * C4);
    if (vitc__linear_pw(z2, 4 * C8, z1, C4, &d->up2_pw, d->up2.w, d->up2_b4, NULL, 0, 4 * P,
                        4 * C8, C4, VITC__ACT_GELU) != VITC_OK) {
        c->failed = 1;
        return;
    }
    /* The masks' dot products (n of C/8 per z2 row), rows side by side
     * (a GEMM of N = n here cost more in packing z2 than in products),
     * then into their pixels. */
    float *dots = X + UP_PIX * (c->r->f.on ? c->r->f.Kf + d->n_layers + 1 : 0); /* [n, 16 P] */
    vitc__dot_rows(dots, 16 * P, z2, C8, c->hyper, c->n, C8, 16 * P);
    /* A pixel's 16 z2 rows are (tap i1 j1, tap i2 j2): its 4 x 4 block's
     * (Y, X) = (2 i1 + i2, 2 j1 + j2) is row 4 (2 i1 + j1) + 2 i2 + j2. */
    static const int8_t at[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
    for (int64_t p = 0; p < P; p++) {
        const int64_t iy = (p0 + p) / G, ix = (p0 + p) % G;
        for (int64_t m = 0; m < c->n; m++) {
            float *o = c->low + (m * lo + 4 * iy) * lo + 4 * ix;
            const float *v = dots + m * 16 * P + 16 * p;
            for (int k = 0; k < 16; k++) o[k / 4 * lo + k % 4] = v[at[k]];
        }
    }
}

/* low [n, 4G, 4G] = hyper [n, C/8] . upscale(x [G, G, C]) per pixel. */
vitc_status vitc__sam_upscale(const vitc__sam_dec *d, const sam_run *r, const float *x,
                                 const float *hyper, int64_t n, float *low) {
    const int64_t G = d->grid, C = d->C;
    const int64_t per = UP_PIX * (4 * (C / 4) + 16 * (C / 8) + 16 * n +
                                  (r->f.on ? r->f.Kf + d->n_layers + 1 : 0));
    const int nt = vitc__num_threads();
    up_ctx c = {.d = d, .x = x, .hyper = hyper, .low = low, .n = n, .G = G, .per = per,
                .r = r, .P0 = r->c0 ? r->c0->P0 : NULL};
    vitc__pweight bw = {0};
    if (r->f.on) {
        VITC_TRY(vitc__pweight_pack(&bw, r->f.Bt, C, r->f.Kf, VITC_PRECISION_FP32));
        c.bw = &bw;
    }
    c.scr = malloc((size_t)(nt * per) * sizeof(float));
    if (!c.scr) {
        vitc__pweight_free(&bw);
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's upscaling (%d threads)", nt);
    }
    /* rows claimed as threads come free: a core taken by another process
     * leaves its rows to the other threads */
    vitc__parallel_for_dynamic((G * G + UP_PIX - 1) / UP_PIX, 1, up_row, &c);
    free(c.scr);
    vitc__pweight_free(&bw);
    if (c.failed)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM upscaling: a GEMM refused its arguments");
    return VITC_OK;
}
