/*
 * ops_layers.c — the small data moves the attention layers need around the
 * kernels of kernels.h: patch extraction for a stride = kernel conv,
 * BatchNorm statistics, a per-channel affine map, and the "back to channels
 * first, then add the input" epilogue. Reference C, clear first.
 */
#include <math.h>

#include "ops_layers.h"

void vitc__patchify(float *cols, const float *x, int64_t B, int64_t C, int64_t H, int64_t W,
                    int64_t p) {
    int64_t nh = H / p, nw = W / p, K = C * p * p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < nh; i++)
            for (int64_t j = 0; j < nw; j++) {
                float *row = cols + ((b * nh + i) * nw + j) * K;
                for (int64_t c = 0; c < C; c++)
                    for (int64_t ki = 0; ki < p; ki++) {
                        const float *src = x + ((b * C + c) * H + i * p + ki) * W + j * p;
                        float *dst = row + (c * p + ki) * p;
                        for (int64_t kj = 0; kj < p; kj++) dst[kj] = src[kj];
                    }
            }
}

/* Two passes in double: the statistics of a whole batch of images run over
 * B*HW values per channel (64*256 in the seed), too many for a float sum. */
void vitc__channel_stats(float *mean, float *var, const float *x, int64_t B, int64_t C,
                         int64_t HW) {
    double cnt = (double)B * (double)HW;
    for (int64_t c = 0; c < C; c++) {
        double s = 0.0;
        for (int64_t b = 0; b < B; b++) {
            const float *xc = x + (b * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) s += xc[i];
        }
        double m = s / cnt, v = 0.0;
        for (int64_t b = 0; b < B; b++) {
            const float *xc = x + (b * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) {
                double t = xc[i] - m;
                v += t * t;
            }
        }
        mean[c] = (float)m;
        var[c] = (float)(v / cnt);
    }
}

void vitc__batchnorm_apply(float *y, const float *x, const float *mean, const float *var,
                           const float *w, const float *bias, float eps, int64_t B, int64_t C,
                           int64_t HW) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            /* torch's CPU kernel folds the norm into one multiply-add the same way. */
            float inv = 1.0f / sqrtf(var[c] + eps);
            float sc = w[c] * inv, sh = bias[c] - mean[c] * sc;
            const float *xc = x + (b * C + c) * HW;
            float *yc = y + (b * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) yc[i] = xc[i] * sc + sh;
        }
}

void vitc__transpose_add(float *out, const float *y, const float *x, float alpha, int64_t B,
                         int64_t C, int64_t N) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            const float *yb = y + b * N * C + c;
            const float *xc = x + (b * C + c) * N;
            float *oc = out + (b * C + c) * N;
            for (int64_t n = 0; n < N; n++) oc[n] = alpha * yb[n * C] + xc[n];
        }
}
