/* ops.c — softmax, norms, GELU, layout moves: reference kernels. */
#include <math.h>

#include "kernels.h"

void vitc__softmax_rows(float *x, int64_t rows, int64_t n, float inv_temperature) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            row[j] *= inv_temperature;
            if (row[j] > mx) mx = row[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
}

/* Mean and variance in double: a float running sum drifts on 4096-long rows. */
void vitc__layernorm(float *y, const float *x, const float *w, const float *b, int64_t M,
                     int64_t C, float eps) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * C;
        float *yr = y + i * C;
        double mean = 0.0, var = 0.0;
        for (int64_t c = 0; c < C; c++) mean += xr[c];
        mean /= (double)C;
        for (int64_t c = 0; c < C; c++) {
            double t = xr[c] - mean;
            var += t * t;
        }
        var /= (double)C;
        float rstd = (float)(1.0 / sqrt(var + eps));
        float m = (float)mean;
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rstd * w[c] + b[c];
    }
}

void vitc__groupnorm(float *y, const float *x, const float *w, const float *b, int64_t B,
                     int64_t C, int64_t HW, int64_t G, float eps) {
    int64_t cg = C / G;
    for (int64_t n = 0; n < B; n++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * cg) * HW;
            float *yg = y + (n * C + g * cg) * HW;
            int64_t cnt = cg * HW;
            double mean = 0.0, var = 0.0;
            for (int64_t i = 0; i < cnt; i++) mean += xg[i];
            mean /= (double)cnt;
            for (int64_t i = 0; i < cnt; i++) {
                double t = xg[i] - mean;
                var += t * t;
            }
            var /= (double)cnt;
            float rstd = (float)(1.0 / sqrt(var + eps));
            float m = (float)mean;
            for (int64_t c = 0; c < cg; c++) {
                float sc = rstd * w[g * cg + c], sh = b[g * cg + c];
                for (int64_t i = 0; i < HW; i++)
                    yg[c * HW + i] = (xg[c * HW + i] - m) * sc + sh;
            }
        }
    }
}

void vitc__gelu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void vitc__transpose_bc(float *y, const float *x, int64_t B, int64_t C, int64_t HW) {
    for (int64_t n = 0; n < B; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < HW; i++)
                y[(n * HW + i) * C + c] = x[(n * C + c) * HW + i];
}
