/*
 * ops_layers_backward.c — backward of the norms and data moves of ops_layers.c and
 * ops.c that the attention layers train through: GroupNorm, BatchNorm2d
 * (batch or running statistics). (The patch scatter, vitc__unpatchify, sits
 * with the gather it mirrors in ops_layers.c.)
 *
 * For a group of n values normalised as xh = (x - mean) * rstd and scaled
 * per channel by w, with g = dy * w:
 *
 *   dx = rstd * (g - mean(g) - xh * mean(g * xh))   (statistics of the batch)
 *   dx = rstd * g                                   (statistics held fixed)
 *   dw += sum(dy * xh),  db += sum(dy)
 *
 * Sums run in double (a group spans up to B*HW values). The threaded
 * versions run the same per-group function over the pool; the _ref ones run
 * it in order on one thread, so the two agree bit for bit.
 */
#include <math.h>
#include <stdlib.h>

#include "ops_layers_backward.h"

/* ---- GroupNorm ------------------------------------------------------- */

typedef struct gn_bwd {
    float *dx, *dw, *db;
    const float *dy, *x, *w;
    double *stat; /* [B*G, 2] mean, rstd */
    int64_t B, C, HW, G;
    float eps;
} gn_bwd;

/* dx of groups [r0, r1) (r = b*G + g); records each group's statistics. */
static void gn_dx_groups(void *ctx, int64_t r0, int64_t r1, int tid) {
    const gn_bwd *t = ctx;
    int64_t cg = t->C / t->G, n = cg * t->HW;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t g = r % t->G;
        const float *x = t->x + r * n, *dy = t->dy + r * n; // [cg, HW]
        float *dx = t->dx + r * n;                          // [cg, HW]
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; i++) mean += x[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1.0 / sqrt(var / (double)n + t->eps);
        double sg = 0.0, sgx = 0.0;
        for (int64_t c = 0; c < cg; c++) {
            double wc = t->w[g * cg + c];
            for (int64_t i = c * t->HW; i < (c + 1) * t->HW; i++) {
                sg += dy[i] * wc;
                sgx += dy[i] * wc * (x[i] - mean) * rstd;
            }
        }
        sg /= (double)n;
        sgx /= (double)n;
        for (int64_t c = 0; c < cg; c++) {
            double wc = t->w[g * cg + c];
            for (int64_t i = c * t->HW; i < (c + 1) * t->HW; i++)
                dx[i] = (float)(rstd * (dy[i] * wc - sg - (x[i] - mean) * rstd * sgx));
        }
        t->stat[2 * r] = mean;
        t->stat[2 * r + 1] = rstd;
    }
}

/* dw, db of channels [c0, c1): a sum over the batch, so one task per channel. */
static void gn_dw_channels(void *ctx, int64_t c0, int64_t c1, int tid) {
    const gn_bwd *t = ctx;
    int64_t cg = t->C / t->G;
    (void)tid;
    for (int64_t c = c0; c < c1; c++) {
        double sw = 0.0, sb = 0.0;
        for (int64_t b = 0; b < t->B; b++) {
            const double *st = t->stat + 2 * (b * t->G + c / cg);
            const float *x = t->x + (b * t->C + c) * t->HW, *dy = t->dy + (b * t->C + c) * t->HW;
            for (int64_t i = 0; i < t->HW; i++) {
                sw += dy[i] * (x[i] - st[0]) * st[1];
                sb += dy[i];
            }
        }
        if (t->dw) t->dw[c] += (float)sw;
        if (t->db) t->db[c] += (float)sb;
    }
}

static void gn_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                        const float *w, int64_t B, int64_t C, int64_t HW, int64_t G, float eps,
                        int threaded) {
    if (B <= 0 || C <= 0 || HW <= 0 || G <= 0 || C % G != 0) return;
    double one[2];
    size_t n = (size_t)B * (size_t)G;
    double *stat = n == 1 ? one : malloc(n * 2 * sizeof(double));
    if (!stat) { /* no memory: one group at a time, statistics recomputed per channel pass */
        gn_bwd t = {dx, NULL, NULL, dy, x, w, one, 1, C, HW, G, eps};
        for (int64_t b = 0; b < B; b++) {
            t.dx = dx + b * C * HW;
            t.dy = dy + b * C * HW;
            t.x = x + b * C * HW;
            t.dw = dw;
            t.db = db;
            for (int64_t g = 0; g < G; g++) {
                gn_bwd u = t;
                u.dx += g * (C / G) * HW;
                u.dy += g * (C / G) * HW;
                u.x += g * (C / G) * HW;
                u.G = 1;
                u.C = C / G;
                u.w = w + g * (C / G);
                u.dw = dw ? dw + g * (C / G) : NULL;
                u.db = db ? db + g * (C / G) : NULL;
                gn_dx_groups(&u, 0, 1, 0);
                gn_dw_channels(&u, 0, u.C, 0);
            }
        }
        return;
    }
    gn_bwd t = {dx, dw, db, dy, x, w, stat, B, C, HW, G, eps};
    if (threaded) {
        vitc__parallel_range(B * G, gn_dx_groups, &t);
        if (dw || db) vitc__parallel_range(C, gn_dw_channels, &t);
    } else {
        gn_dx_groups(&t, 0, B * G, 0);
        if (dw || db) gn_dw_channels(&t, 0, C, 0);
    }
    if (stat != one) free(stat);
}

void vitc__groupnorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *w, int64_t B, int64_t C, int64_t HW, int64_t G,
                              float eps) {
    gn_backward(dx, dw, db, dy, x, w, B, C, HW, G, eps, 1);
}

void vitc__groupnorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *w, int64_t B, int64_t C,
                                  int64_t HW, int64_t G, float eps) {
    gn_backward(dx, dw, db, dy, x, w, B, C, HW, G, eps, 0);
}

/* ---- BatchNorm2d ----------------------------------------------------- */

typedef struct bn_bwd {
    float *dx, *dw, *db;
    const float *dy, *x, *mean, *var, *w;
    float eps;
    int training;
    int64_t B, C, HW;
} bn_bwd;

/* Everything of channels [c0, c1): each channel's values span the batch. */
static void bn_channels(void *ctx, int64_t c0, int64_t c1, int tid) {
    const bn_bwd *t = ctx;
    double n = (double)t->B * (double)t->HW;
    (void)tid;
    for (int64_t c = c0; c < c1; c++) {
        double m = t->mean[c], wc = t->w[c];
        /* The forward's own rounding of rstd (vitc__batchnorm_apply). */
        double rstd = 1.0f / sqrtf(t->var[c] + t->eps);
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t b = 0; b < t->B; b++) {
            const float *x = t->x + (b * t->C + c) * t->HW, *dy = t->dy + (b * t->C + c) * t->HW;
            for (int64_t i = 0; i < t->HW; i++) {
                sdy += dy[i];
                sdyx += dy[i] * (x[i] - m) * rstd;
            }
        }
        double kg = t->training ? wc * sdy / n : 0.0, kx = t->training ? wc * sdyx / n : 0.0;
        for (int64_t b = 0; b < t->B; b++) {
            const float *x = t->x + (b * t->C + c) * t->HW, *dy = t->dy + (b * t->C + c) * t->HW;
            float *dx = t->dx + (b * t->C + c) * t->HW;
            for (int64_t i = 0; i < t->HW; i++)
                dx[i] = (float)(rstd * (dy[i] * wc - kg - (x[i] - m) * rstd * kx));
        }
        if (t->dw) t->dw[c] += (float)sdyx;
        if (t->db) t->db[c] += (float)sdy;
    }
}

void vitc__batchnorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *var, const float *w, float eps,
                              int training, int64_t B, int64_t C, int64_t HW) {
    bn_bwd t = {dx, dw, db, dy, x, mean, var, w, eps, training, B, C, HW};
    vitc__parallel_range(C, bn_channels, &t);
}

void vitc__batchnorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *mean, const float *var,
                                  const float *w, float eps, int training, int64_t B, int64_t C,
                                  int64_t HW) {
    bn_bwd t = {dx, dw, db, dy, x, mean, var, w, eps, training, B, C, HW};
    bn_channels(&t, 0, C, 0);
}
