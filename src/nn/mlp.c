/*
 * mlp.c — the MLP's activations with their derivatives, and the MLP
 * fc2(act(fc1(x))) forward and backward.
 *
 *   erf GELU   y = x Phi(x)                       y' = Phi(x) + x phi(x)
 *   tanh GELU  y = 0.5 x (1 + t), t = tanh(u),    y' = 0.5 (1 + t)
 *              u = k (x + 0.044715 x^3)                + 0.5 x (1 - t^2) k (1 + 3 0.044715 x^2)
 *   quick GELU y = x s, s = sigmoid(1.702 x)      y' = s + 1.702 x s (1 - s)
 *   SwiGLU     y = silu(a) b, [a, b] = fc1's halves
 */
#include <math.h>
#include <string.h>

#include "nn.h"

int vitc__nn_act_kernel(int act) {
    return act == VITC__NN_QUICK_GELU  ? VITC__ACT_QUICK_GELU
           : act == VITC__NN_GELU_TANH ? VITC__ACT_TANH_GELU
                                       : VITC__ACT_GELU;
}

void vitc__nn_act_forward(int act, float *x, int64_t n) {
    if (act == VITC__NN_QUICK_GELU)
        vitc__quick_gelu(x, n);
    else if (act == VITC__NN_GELU_TANH)
        vitc__tanh_gelu(x, n);
    else
        vitc__gelu(x, n);
}

void vitc__nn_act_backward(int act, float *dx, const float *dy, const float *x, int64_t n) {
    if (act == VITC__NN_GELU_TANH) {
        const float kb = 0.7978845608028654f, kk = 0.044715f;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], t = tanhf(kb * (v + kk * v * v * v));
            float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kb * (1.0f + 3.0f * kk * v * v);
            dx[i] = dy[i] * d;
        }
    } else if (act == VITC__NN_QUICK_GELU) {
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], s = 1.0f / (1.0f + expf(-1.702f * v));
            dx[i] = dy[i] * (s + 1.702f * v * s * (1.0f - s));
        }
    } else {
        vitc__gelu_backward(dx, dy, x, n);
    }
}

void vitc__nn_swiglu_forward(float *out, const float *h, int64_t R, int64_t M) {
    int64_t h2 = M / 2;
    /* Row r's outputs land at or before its inputs: in place is safe. */
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < h2; j++) {
            float a0 = h[r * M + j], b0 = h[r * M + h2 + j];
            out[r * h2 + j] = a0 / (1.0f + expf(-a0)) * b0;
        }
}

/* Rows front to back: row r writes dh [2r, 2r + 2) M/2, so dout may be dh's
 * back half (row r at (R + r) M/2): no row overwrites a later row's input
 * and each element of its own is read before it is written. */
void vitc__nn_swiglu_backward(float *dh, const float *dout, const float *h, int64_t R, int64_t M) {
    int64_t h2 = M / 2;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < h2; j++) {
            float a0 = h[r * M + j], b0 = h[r * M + h2 + j], g = dout[r * h2 + j];
            float s = 1.0f / (1.0f + expf(-a0)), silu = a0 * s;
            dh[r * M + j] = g * b0 * (s + a0 * s * (1.0f - s));
            dh[r * M + h2 + j] = g * silu;
        }
}

void vitc__nn_mlp_forward(const vitc__nn_mlp *p, float *y, const float *x, const float *res,
                          int64_t R, float *hpre, float *hact) {
    int64_t C = p->C, M = p->M, M2 = p->swiglu ? M / 2 : M;
    vitc__linear(hpre, M, x, C, p->fc1_w, p->fc1_b, NULL, 0, R, M, C);
    if (p->swiglu) {
        vitc__nn_swiglu_forward(hact, hpre, R, M);
    } else {
        if (hact != hpre)
            memcpy(hact, hpre, (size_t)(R * M) * sizeof(float));
        vitc__nn_act_forward(p->act, hact, R * M);
    }
    vitc__linear(y, C, hact, M2, p->fc2_w, p->fc2_b, res, C, R, C, M2);
}

void vitc__nn_mlp_backward(const vitc__nn_mlp *p, const vitc__nn_mlp *g, float *dx, float beta,
                           const float *dy, const float *x, const float *hpre, const float *hact,
                           int64_t R, float *dh) {
    int64_t C = p->C, M = p->M, M2 = p->swiglu ? M / 2 : M;
    if (p->swiglu) {
        /* dL/d(silu(a) b) [R, M/2] in dh's back half (row r at (R + r) M/2); rows
         * expanded front to back: row r writes [2r, 2r + 2) M/2, never a later
         * row's input, and its own input only where it was just read. */
        float *dact = dh + R * M2;
        vitc__linear_backward(dact, M2, 0.0f, (float *)g->fc2_w, (float *)g->fc2_b, dy, C, hact,
                              M2, p->fc2_w, R, C, M2);
        vitc__nn_swiglu_backward(dh, dact, hpre, R, M);
    } else {
        vitc__linear_backward(dh, M, 0.0f, (float *)g->fc2_w, (float *)g->fc2_b, dy, C, hact, M,
                              p->fc2_w, R, C, M);
        vitc__nn_act_backward(p->act, dh, dh, hpre, R * M);
    }
    vitc__linear_backward(dx, C, beta, (float *)g->fc1_w, (float *)g->fc1_b, dh, M, x, C,
                          p->fc1_w, R, M, C);
}
