/* gemm.c — GEMM entry point and its reference kernel. */
#include <string.h>

#include "kernels.h"

void vitc__gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < K; p++) {
                float a = trans_a ? A[p * lda + i] : A[i * lda + p];
                float b = trans_b ? B[j * ldb + p] : B[p * ldb + j];
                acc += a * b;
            }
            C[i * ldc + j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
    }
}

const char *vitc_get_gemm_backend(void) { return "builtin"; }
vitc_status vitc_set_gemm_backend(const char *name) {
    if (name && strcmp(name, "builtin") != 0)
        return vitc__err(VITC_ERR_UNSUPPORTED, "gemm backend \"%s\" is not in this build", name);
    return VITC_OK;
}

void vitc__gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc) {
    vitc__gemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void vitc__linear(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W,
                  const float *bias, const float *residual, int64_t ldr, int64_t M, int64_t N,
                  int64_t K) {
    vitc__gemm(0, 1, M, N, K, 1.0f, x, ldx, W, K, 0.0f, y, ldy);
    for (int64_t i = 0; i < M; i++) {
        float *row = y + i * ldy;
        if (bias)
            for (int64_t j = 0; j < N; j++) row[j] += bias[j];
        if (residual)
            for (int64_t j = 0; j < N; j++) row[j] += residual[i * ldr + j];
    }
}
