/*
 * gemm_lp.c — bf16 and int8 Linear layers: weight packing (once), the
 * per-call conversion of the activations, the threaded driver, and the
 * portable reference microkernels (the ground truth of x86/gemm_lp_avx512.c:
 * the same numbers, bit for bit). Layouts and the epilogue: gemm_lp.h.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_lp.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR

/* ---- reference microkernels ------------------------------------------- */

/* Subnormal results flushed to zero (sign kept), as vdpbf16ps does. */
static inline float vitc__ftz(float x) {
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}

/* bf16 operand as vdpbf16ps reads it: subnormals are zero. */
static inline float vitc__bf16_daz(uint16_t h) {
    return (h & 0x7F80u) ? vitc__bf16_to_f(h) : copysignf(0.0f, vitc__bf16_to_f(h));
}

static void vitc__lp_store(float *C, int64_t ldc, int64_t i, int64_t j, float v,
                           const vitc__lp_epi *e) {
    if (e->bias) v = v + e->bias[j];
    if (e->ls) v = e->ls[j] * v;
    if (e->res) v = v + e->res[i * e->ldr + j];
    C[i * ldc + j] = v;
}

/* int8: the sum of row i, column j dequantized (gemm_lp.h's epilogue). */
static inline float vitc__lp_dq(int32_t acc, int64_t i, int64_t j, const vitc__lp_epi *e) {
    float v = (float)(acc - e->azp[i] * e->wsum[j]);
    return v * (e->ascale[i] * e->wscale[j]);
}

void vitc__lp_epi_ref(vitc_precision p, const void *acc, int64_t lda, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    const float *af = acc;   /* [mr][lda] bf16 */
    const int32_t *ai = acc; /* [mr][lda] int8 */
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            vitc__lp_store(C, ldc, i, j,
                           p == VITC_PRECISION_INT8 ? vitc__lp_dq(ai[i * lda + j], i, j, e)
                                                    : af[i * lda + j],
                           e);
}

/* vdpbf16ps per lane: acc += hi(a) * hi(b), rounded, then += lo(a) * lo(b),
 * rounded (each product of two bf16 is exact in fp32). */
/* One output's sum over kg word pairs, A's words a_step apart (packed: MR;
 * row-major: 1), B's a packed column. */
static float vitc__bf16_dot_ref(int64_t kg, const uint32_t *a, int64_t a_step, const uint32_t *b) {
    float acc = 0.0f;
    for (int64_t p = 0; p < kg; p++) {
        uint32_t x = a[p * a_step], y = b[p * NR];
        acc = vitc__ftz(acc + vitc__bf16_daz((uint16_t)(x >> 16)) *
                                  vitc__bf16_daz((uint16_t)(y >> 16)));
        acc = vitc__ftz(acc + vitc__bf16_daz((uint16_t)x) * vitc__bf16_daz((uint16_t)y));
    }
    return acc;
}

static void vitc__ukr_bf16_ref(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                               int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            vitc__lp_store(C, ldc, i, j, vitc__bf16_dot_ref(kg, pa + i, MR, pb + j), e);
}

/* The same sums from row-major A. */
static void vitc__ukr_bf16_rm_ref(int64_t kg, const uint32_t *a, int64_t lda, const uint32_t *pb,
                                  float *C, int64_t ldc, int64_t mr, int64_t nr) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            C[i * ldc + j] = vitc__bf16_dot_ref(kg, a + i * lda, 1, pb + j);
}

static void vitc__row_bf16_ref(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                               float *scale, int32_t *zp) {
    (void)zp;
    const float s = scale ? *scale : 1.0f; /* x * 1 is x, bit for bit */
    for (int64_t p = 0; 2 * p < K; p++) {
        uint32_t lo = vitc__bf16_rne(x[2 * p] * s);
        uint32_t hi = 2 * p + 1 < K ? vitc__bf16_rne(x[2 * p + 1] * s) : 0;
        dst[p * stride] = lo | hi << 16;
    }
}

/* Value q of a word of kw k (kw 4: bytes, vpdpbusd's words; 2: int16, the
 * i16 layout), as an unsigned (A) or signed (B) integer. */
static inline int32_t vitc__lane(uint32_t w, int q, int kw, int is_signed) {
    uint32_t v = w >> (32 / kw * q);
    if (kw == 4) return is_signed ? (int32_t)(int8_t)(uint8_t)v : (int32_t)(uint8_t)v;
    return (int32_t)(int16_t)(uint16_t)v; /* A's are 0..255: the same either way */
}

/* vpdpbusd per lane (or vpmaddwd for int16 words): the u8 x s8 products
 * summed into int32 (exact: K <= 33000 is checked at packing). */
static inline void vitc__ukr_int8_kw(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                     int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e,
                                     int kw) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            int32_t acc = 0;
            for (int64_t p = 0; p < kg; p++) {
                uint32_t a = pa[p * MR + i], b = pb[p * NR + j];
                for (int q = 0; q < kw; q++)
                    acc += vitc__lane(a, q, kw, 0) * vitc__lane(b, q, kw, 1);
            }
            vitc__lp_store(C, ldc, i, j, vitc__lp_dq(acc, i, j, e), e);
        }
}

static void vitc__ukr_int8_ref(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                               int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    vitc__ukr_int8_kw(kg, pa, pb, C, ldc, mr, nr, e, 4);
}

static void vitc__ukr_int8p_ref(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    vitc__ukr_int8_kw(kg, pa, pb, C, ldc, mr, nr, e, 2);
}

/* One row quantized (per row, gemm_lp.h) into words of kw values. */
static inline void vitc__row_int8_kw(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                     float *scale, int32_t *zp, int kw) {
    float mn = x[0], mx = x[0], inv;
    for (int64_t k = 1; k < K; k++) {
        mn = x[k] < mn ? x[k] : mn;
        mx = x[k] > mx ? x[k] : mx;
    }
    vitc__q8_params(mn, mx, scale, &inv, zp);
    for (int64_t p = 0; kw * p < K; p++) {
        uint32_t w = 0;
        for (int q = 0; q < kw && kw * p + q < K; q++)
            w |= (uint32_t)vitc__q8(x[kw * p + q], inv, *zp) << (32 / kw * q);
        dst[p * stride] = w;
    }
}

static void vitc__row_int8_ref(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                               float *scale, int32_t *zp) {
    vitc__row_int8_kw(dst, stride, x, K, scale, zp, 4);
}

static void vitc__row_int8p_ref(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                float *scale, int32_t *zp) {
    vitc__row_int8_kw(dst, stride, x, K, scale, zp, 2);
}

static void vitc__pairs_bf16_ref(uint32_t *dst, const float *x0, const float *x1, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        dst[c] = vitc__bf16_rne(x0[c]) | (x1 ? (uint32_t)vitc__bf16_rne(x1[c]) << 16 : 0u);
}

void vitc__s8_rows_qref(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx, int64_t rows,
                        int64_t K, float *scale, int32_t *sum, int qmax) {
    for (int64_t i = 0; i < 16; i++) {
        if (i >= rows) {
            for (int64_t p = 0; 4 * p < K; p++) dst[p * ldd + i] = 0;
            continue;
        }
        const float *xi = x + i * ldx; /* [K] */
        float amax = 0.0f, inv;
        for (int64_t k = 0; k < K; k++) amax = fabsf(xi[k]) > amax ? fabsf(xi[k]) : amax;
        vitc__s8_params_q(amax, qmax, &scale[i], &inv);
        int32_t t = 0;
        for (int64_t p = 0; 4 * p < K; p++) {
            uint32_t w = 0;
            for (int q = 0; q < 4 && 4 * p + q < K; q++) {
                int32_t v = vitc__s8_q(xi[4 * p + q], inv, qmax);
                t += v;
                w |= (uint32_t)(uint8_t)(int8_t)v << (8 * q);
            }
            dst[p * ldd + i] = w;
        }
        sum[i] = t;
    }
}

void vitc__s8_quads_qref(uint32_t *dst, const float *x, int64_t ldx, int64_t S, int64_t n,
                         float *scale, int32_t *sum, int qmax) {
    for (int64_t c = 0; c < NR; c++) {
        if (c >= n) {
            for (int64_t p = 0; 4 * p < S; p++) dst[p * NR + c] = 0;
            continue;
        }
        float amax = 0.0f, inv;
        for (int64_t j = 0; j < S; j++) {
            float a = fabsf(x[j * ldx + c]);
            amax = a > amax ? a : amax;
        }
        vitc__s8_params_q(amax, qmax, &scale[c], &inv);
        int32_t t = 0;
        for (int64_t p = 0; 4 * p < S; p++) {
            uint32_t w = 0;
            for (int q = 0; q < 4 && 4 * p + q < S; q++) {
                int32_t v = vitc__s8_q(x[(4 * p + q) * ldx + c], inv, qmax);
                t += v;
                w |= (uint32_t)(uint8_t)(int8_t)v << (8 * q);
            }
            dst[p * NR + c] = w;
        }
        sum[c] = t;
    }
}

static void vitc__s8_rows_ref(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx,
                              int64_t rows, int64_t K, float *scale, int32_t *sum) {
    vitc__s8_rows_qref(dst, ldd, x, ldx, rows, K, scale, sum, 127);
}

static void vitc__s8_quads_ref(uint32_t *dst, const float *x, int64_t ldx, int64_t S, int64_t n,
                               float *scale, int32_t *sum) {
    vitc__s8_quads_qref(dst, x, ldx, S, n, scale, sum, 127);
}

static void vitc__strip_unit_ref(uint32_t *dst, int64_t ldd, int w, const float *x, int64_t ldx,
                                 int64_t rows, int64_t K, float *scale, int32_t *zp) {
    (void)scale, (void)zp;
    for (int64_t i = 0; i < w; i++)
        for (int64_t p = 0; 4 * p < K; p++) {
            uint32_t word = 0;
            for (int q = 0; i < rows && q < 4 && 4 * p + q < K; q++)
                word |= (uint32_t)vitc__q8(x[i * ldx + 4 * p + q], 255.0f, 0) << (8 * q);
            dst[p * ldd + i] = word;
        }
}

const vitc__lp_kernel vitc__lp_bf16_ref = {"reference", vitc__ukr_bf16_ref, vitc__row_bf16_ref,
                                           NULL, vitc__ukr_bf16_rm_ref, vitc__pairs_bf16_ref, 0,
                                           MR, 0, NULL, NULL, 0, NULL, NULL, NULL, 0, 0};
const vitc__lp_kernel vitc__lp_int8_ref = {"reference", vitc__ukr_int8_ref, vitc__row_int8_ref, NULL,
                                           NULL, NULL, 0, MR, 0, NULL, NULL, 0,
                                           vitc__s8_rows_ref, vitc__s8_quads_ref,
                                           vitc__strip_unit_ref, 0, 0};
static void vitc__s8_rows_ref7(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx,
                               int64_t rows, int64_t K, float *scale, int32_t *sum) {
    vitc__s8_rows_qref(dst, ldd, x, ldx, rows, K, scale, sum, 64);
}

static void vitc__s8_quads_ref7(uint32_t *dst, const float *x, int64_t ldx, int64_t S, int64_t n,
                                float *scale, int32_t *sum) {
    vitc__s8_quads_qref(dst, x, ldx, S, n, scale, sum, 64);
}

/* avx2-w7's numbers, its weights and its attention panels in [-64, 64]:
 * the reference it is checked against */
const vitc__lp_kernel vitc__lp_int8_ref7 = {"reference", vitc__ukr_int8_ref, vitc__row_int8_ref,
                                            NULL, NULL, NULL, 0, MR, 0, NULL, NULL, 0,
                                            vitc__s8_rows_ref7, vitc__s8_quads_ref7,
                                            vitc__strip_unit_ref, 0, 64};
/* i16: not for the attention (its panels are vpdpbusd's words) */
const vitc__lp_kernel vitc__lp_int8p_ref = {"reference", vitc__ukr_int8p_ref, vitc__row_int8p_ref,
                                            NULL, NULL, NULL, 0, MR, 0, NULL, NULL, 0,
                                            NULL, NULL, NULL, 1, 0};

void vitc__lp_strip(const vitc__lp_kernel *kn, vitc_precision p, uint32_t *dst, int64_t ldd,
                    int w, const float *x, int64_t ldx, int64_t rows, int64_t K, float *scale,
                    int32_t *zp) {
    if (kn->strip) {
        kn->strip(dst, ldd, w, x, ldx, rows, K, scale, zp);
        return;
    }
    vitc__lp_row_fn row = kn->row                  ? kn->row
                          : p == VITC_PRECISION_BF16 ? vitc__row_bf16_ref
                          : kn->i16                  ? vitc__row_int8p_ref
                                                     : vitc__row_int8_ref;
    const int kw = vitc__lp_kw(kn, p);
    int64_t kg = (K + kw - 1) / kw;
    for (int64_t i = 0; i < w; i++) {
        if (i < rows)
            row(dst + i, ldd, x + i * ldx, K, scale ? scale + i : NULL, zp ? zp + i : NULL);
        else
            for (int64_t q = 0; q < kg; q++) dst[q * ldd + i] = 0;
    }
}

/* ---- weights ----------------------------------------------------------- */

vitc_status vitc__pweight_pack_lp(vitc__pweight *pw, const float *W, int64_t N, int64_t K,
                                  vitc_precision p) {
    if (p != VITC_PRECISION_BF16 && p != VITC_PRECISION_INT8)
        return vitc__err(VITC_ERR_INVALID_ARG, "unknown precision %d", (int)p);
    /* the layout of the kernel that will run it (int8: int16 words or not) */
    const vitc__lp_kernel *kn = vitc__lp_kernel_for(p);
    const int g = vitc__lp_kw(kn, p), i16 = p == VITC_PRECISION_INT8 && kn->i16;
    const int wmax = kn->wmax ? kn->wmax : 127;
    const float fmax = (float)wmax;
    /* |sum| and |zp * wsum| are each at most K * 255 * 127; their
     * difference (the epilogue) must fit int32: K <= 33000. */
    if (p == VITC_PRECISION_INT8 && K > 33000)
        return vitc__err(VITC_ERR_UNSUPPORTED, "int8 linear: K = %lld could overflow int32 sums",
                         (long long)K);
    int64_t kg = (K + g - 1) / g;
    size_t npad = (size_t)((N + NR - 1) / NR * NR), n;
    if (N > INT64_MAX - NR || !vitc__mul_size(npad, (size_t)kg, &n) ||
        !vitc__mul_size(n, sizeof(uint32_t), &n))
        return vitc__err(VITC_ERR_NOMEM, "pack weight [%lld, %lld]: size overflows",
                         (long long)N, (long long)K);
    uint32_t *d = vitc__alloc(n);
    float *ws = NULL;
    int32_t *wsum = NULL;
    if (p == VITC_PRECISION_INT8) {
        ws = vitc__alloc(npad * sizeof(float));
        wsum = vitc__alloc(npad * sizeof(int32_t));
    }
    if (!d || (p == VITC_PRECISION_INT8 && (!ws || !wsum))) {
        vitc__free(d);
        vitc__free(ws);
        vitc__free(wsum);
        return vitc__err(VITC_ERR_NOMEM, "pack weight [%lld, %lld]: out of memory",
                         (long long)N, (long long)K);
    }
    memset(d, 0, n);
    /* bf16: the kernel's strip converter, 16 output channels (half a B
     * strip) at a time: the reference's words, without its scalar rounding
     * (it had been a tenth of a bf16 model's load) */
    if (p == VITC_PRECISION_BF16) {
        for (int64_t j = 0; j < N; j += 16)
            vitc__lp_strip(kn, p, d + (j / NR) * kg * NR + j % NR, NR, 16, W + j * K, K,
                           N - j < 16 ? N - j : 16, K, NULL, NULL);
    }
    for (int64_t j = 0; p == VITC_PRECISION_INT8 && j < (int64_t)npad; j++) {
        uint32_t *col = d + (j / NR) * kg * NR + j % NR; /* word p at col[p * NR] */
        if (j >= N) {
            if (ws) ws[j] = 0.0f, wsum[j] = 0;
            continue;
        }
        const float *w = W + j * K; /* [K] */
        /* Symmetric per output channel: scale = max|w| / wmax, q in
         * [-wmax, wmax] (127, or the kernel's narrower range) */
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fabsf(w[k]) > amax ? fabsf(w[k]) : amax;
        float s = amax / fmax;
        if (!(s > 0.0f) || !isfinite(s)) s = 1.0f;
        int32_t sum = 0;
        for (int64_t pp = 0; pp < kg; pp++) {
            uint32_t word = 0;
            for (int q = 0; q < g && g * pp + q < K; q++) {
                float t = nearbyintf(w[g * pp + q] / s);
                int32_t v = t > fmax ? wmax : t < -fmax ? -wmax : t == t ? (int32_t)t : 0;
                sum += v;
                word |= i16 ? (uint32_t)(uint16_t)(int16_t)v << (16 * q)
                            : (uint32_t)(uint8_t)(int8_t)v << (8 * q);
            }
            col[pp * NR] = word;
        }
        ws[j] = s;
        wsum[j] = sum;
    }
    *pw = (vitc__pweight){.prec = p, .N = N, .K = K, .npad = (int64_t)npad, .kg = kg, .data = d,
                          .wscale = ws, .wsum = wsum, .i16 = i16,
                          .wmax = p == VITC_PRECISION_INT8 ? wmax : 0};
    return VITC_OK;
}

void vitc__pweight_unpack_lp(const vitc__pweight *pw, float *W) {
    int64_t N = pw->N, K = pw->K, kg = pw->kg;
    const uint32_t *d = pw->data;
    for (int64_t j = 0; j < N; j++) {
        const uint32_t *col = d + (j / NR) * kg * NR + j % NR;
        float *w = W + j * K;
        for (int64_t p = 0; p < kg; p++) {
            uint32_t word = col[p * NR];
            if (pw->prec == VITC_PRECISION_BF16) {
                w[2 * p] = vitc__bf16_to_f((uint16_t)word);
                if (2 * p + 1 < K) w[2 * p + 1] = vitc__bf16_to_f((uint16_t)(word >> 16));
            } else if (pw->i16) {
                for (int q = 0; q < 2 && 2 * p + q < K; q++)
                    w[2 * p + q] = (float)(int16_t)(uint16_t)(word >> (16 * q)) * pw->wscale[j];
            } else {
                for (int q = 0; q < 4 && 4 * p + q < K; q++)
                    w[4 * p + q] = (float)(int8_t)(uint8_t)(word >> (8 * q)) * pw->wscale[j];
            }
        }
    }
}

/* ---- per-call scratch: the converted activations ------------------------ */

/* Grow-only, one per calling thread (freed when it ends), like gemm.c's. */
static pthread_key_t vitc__lp_key;
static pthread_once_t vitc__lp_once = PTHREAD_ONCE_INIT;
static int vitc__lp_key_ok;
typedef struct { void *p; size_t cap; } vitc__lp_scratch;

static void vitc__lp_scratch_free(void *s) {
    vitc__lp_scratch *sc = s;
    vitc__free(sc->p);
    free(sc);
}
static void vitc__lp_init(void) {
    vitc__lp_key_ok = pthread_key_create(&vitc__lp_key, vitc__lp_scratch_free) == 0;
}
void *vitc__lp_get(size_t bytes) {
    pthread_once(&vitc__lp_once, vitc__lp_init);
    if (!vitc__lp_key_ok) return NULL;
    vitc__lp_scratch *sc = pthread_getspecific(vitc__lp_key);
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc))) return NULL;
        if (pthread_setspecific(vitc__lp_key, sc) != 0) {
            free(sc);
            return NULL;
        }
    }
    if (sc->cap < bytes) {
        void *p = vitc__alloc(bytes);
        if (!p) return NULL;
        vitc__free(sc->p);
        sc->p = p;
        sc->cap = bytes;
    }
    return sc->p;
}

/* ---- the driver --------------------------------------------------------- */

typedef struct vitc__lp_job {
    const vitc__lp_kernel *kn;
    const vitc__pweight *pw;
    const float *x; int64_t ldx; /* [M, K] */
    float *y; int64_t ldy;       /* [M, N] */
    const float *bias;           /* [N] or NULL */
    const float *ls;             /* [N] or NULL: layer scale, before the residual */
    const float *res; int64_t ldr;
    const vitc__ln_pre *ln;      /* x = LayerNorm(ln->x), computed strip by strip, or NULL */
    int64_t M;
    int64_t smr, sa; /* A strip: rows (kn->mr), words */
    uint32_t *pa;  /* [ceil(M/smr)][kg][smr] or [ceil(M/smr)][smr][lda] converted A */
    float *ascale; /* [M] int8 */
    int32_t *azp;  /* [M] int8 */
    void (*gelu)(float *x, int64_t n); /* the activation after each tile, unless fused */
    int fused_gelu;                    /* VITC__ACT_*: the microkernel applies it itself */
    int by_cols, nparts;
    int64_t mcs;        /* A strips per cache block (the table's lp_mc rows) */
    int64_t nb;         /* B strips per L2 block (vitc__lp_nb) */
    vitc__coop *coop;   /* non-NULL: A converted inside the GEMM's region */
    _Atomic int64_t *next_chunk; /* non-NULL: column chunks claimed as threads come free */
    vitc__chunks chunks;         /* of column strips */
} vitc__lp_job;

/* Strip t of A: its rows (normalised first, with ln) converted, rows past M
 * zero. Returns its cache block (the coop's unit and block). */
static int64_t vitc__lp_pack_strip(void *ctx, int64_t t) {
    const vitc__lp_job *g = ctx;
    const int64_t smr = g->smr, i0 = t * smr, kg = g->pw->kg;
    int64_t mr = g->M - i0 < smr ? g->M - i0 : smr;
    float *sc = g->ascale ? g->ascale + i0 : NULL;
    int32_t *zp = g->azp ? g->azp + i0 : NULL;
    uint32_t *dst = g->pa + t * g->sa;
    const vitc__ln_pre *ln = g->ln; /* the rows' LayerNorm, while they are in L1 */
    const float *x = g->x + i0 * g->ldx; /* [mr, K], row stride ldx */
    int64_t ldx = g->ldx;
    _Alignas(64) float tmp[VITC_LN_STRIP]; /* whole lines: the vector loads split none */
    if (ln) {
        x = vitc__ln_strip(ln, i0, mr, g->pw->K, tmp);
        ldx = g->pw->K;
    }
    if (!g->kn->a_kpad) {
        vitc__lp_strip(g->kn, g->pw->prec, dst, smr, (int)smr, x, ldx, mr, g->pw->K, sc, zp);
        return t / g->mcs;
    }
    /* row-major (AMX): row i at dst[i * lda], zeros past kg and past mr */
    int bf = g->pw->prec == VITC_PRECISION_BF16;
    vitc__lp_row_fn row = g->kn->row ? g->kn->row : bf ? vitc__row_bf16_ref : vitc__row_int8_ref;
    const int64_t lda = vitc__lp_a_ld(g->kn->a_kpad, kg);
    for (int64_t i = 0; i < smr; i++) {
        uint32_t *d = dst + i * lda; /* [lda] */
        int64_t from = 0;
        if (i < mr) {
            row(d, 1, x + i * ldx, g->pw->K, sc ? sc + i : NULL, zp ? zp + i : NULL);
            from = kg;
        }
        memset(d + from, 0, (size_t)(lda - from) * sizeof *d);
    }
    return t / g->mcs;
}

static void vitc__lp_pack_task(void *ctx, int64_t t, int tid) {
    (void)tid;
    vitc__lp_pack_strip(ctx, t);
}

/* Cache blocking: a block of B strips (at most the table's lp_nb bytes,
 * 384 KB on a 1 MB L2) stays in L2 while every A block (lp_mc rows, 144 on
 * a 1 MB L2) of the thread passes over it, and each A block stays there
 * while the block's B strips pass. Without the B blocking a 3072-wide
 * weight (2.4 MB in int8) streamed from L3 once per A block: batch 8 ran
 * at 40% of batch 1's speed. Both come from the CPU's caches (cpu.c). */
static int64_t vitc__lp_nb(int64_t lp_nb, int64_t kg) { /* B strips per L2 block */
    int64_t nb = lp_nb / (kg * NR * 4);
    return nb < 1 ? 1 : nb;
}

/* Column strips [c0, c1) x row strips [r0, r1), blocked for the caches;
 * jnext: the first column strip of this thread's next chunk, or -1. */
static void vitc__lp_block(const vitc__lp_job *g, int64_t c0, int64_t c1, int64_t r0, int64_t r1,
                           int64_t jnext) {
    const vitc__pweight *pw = g->pw;
    const int64_t N = pw->N, kg = pw->kg, smr = g->smr, mc = g->mcs;
    const uint32_t *pb0 = pw->data;
    /* The chunk's strips in equal L2 blocks of at most g->nb: 9 strips as
     * 5 + 4, not 8 + 1 (a block of one strip passes over all of A for it). */
    const int64_t nblk = (c1 - c0 + g->nb - 1) / g->nb;
    const int64_t nb = nblk > 1 ? (c1 - c0 + nblk - 1) / nblk : g->nb;
    for (int64_t jb = c0; jb < c1; jb += nb) {
    int64_t je = jb + nb < c1 ? jb + nb : c1;
    for (int64_t ib = r0; ib < r1; ib += mc) {
        int64_t ie = ib + mc < r1 ? ib + mc : r1;
        if (g->coop) /* the block's strips converted (by whichever thread) */
            vitc__coop_need(g->coop, ib / mc, ie - ib); /* (coop: r0 = 0, r1 = every strip) */
        for (int64_t js = jb; js < je; js++) {
            int64_t j = js * NR, nr = N - j < NR ? N - j : NR;
            /* The first A block reads each weight strip from memory: the
             * next strip (the next chunk's, when this one ends: most often
             * this thread's too) asked into L2 meanwhile, a share per A
             * strip, rather than the first tile of each strip stalling on
             * it. Later A blocks find the strips in L2. */
            int64_t jn = js + 1 < c1 ? js + 1 : jnext;
            const char *next = ib == r0 && jn >= 0 ? (const char *)(pb0 + jn * kg * NR) : NULL;
            const int64_t lines = kg * NR * 4 / 64, share = (lines + (ie - ib) - 1) / (ie - ib);
            for (int64_t is = ib; is < ie; is++) {
                int64_t i = is * smr, mr = g->M - i < smr ? g->M - i : smr;
                int64_t l0 = (is - ib) * share, l1 = l0 + share < lines ? l0 + share : lines;
                if (next && !g->kn->takes_pf)
                    for (int64_t l = l0; l < l1; l++) __builtin_prefetch(next + l * 64, 0, 2);
                vitc__lp_epi ep = {
                    .bias = g->bias ? g->bias + j : NULL, .ls = g->ls ? g->ls + j : NULL,
                    .res = g->res ? g->res + i * g->ldr + j : NULL, .ldr = g->ldr,
                    .ascale = g->ascale ? g->ascale + i : NULL, .azp = g->azp ? g->azp + i : NULL,
                    .wscale = pw->wscale ? pw->wscale + j : NULL,
                    .wsum = pw->wsum ? pw->wsum + j : NULL,
                    .gelu = g->fused_gelu,
                    .pf = next && g->kn->takes_pf && l1 > l0 ? next + l0 * 64 : NULL,
                    .pf_lines = next && g->kn->takes_pf && l1 > l0 ? l1 - l0 : 0,
                };
                float *C = g->y + i * g->ldy + j;
                g->kn->ukr(kg, g->pa + is * g->sa, pb0 + js * kg * NR, C, g->ldy, mr, nr, &ep);
                if (g->gelu && !g->fused_gelu) /* the tile is final and still in L1 */
                    for (int64_t rr = 0; rr < mr; rr++) g->gelu(C + rr * g->ldy, nr);
            }
        }
    }
    }
}

static void vitc__lp_task(void *ctx, int64_t t, int tid) {
    const vitc__lp_job *g = ctx;
    (void)tid;
    const int64_t cs = (g->pw->N + NR - 1) / NR, rs = (g->M + g->smr - 1) / g->smr;
    if (g->kn->begin) g->kn->begin(); /* this thread's AMX tile config */
    if (g->next_chunk) {
        /* Whichever thread is free takes the next chunk of columns (as the
         * fp32 GEMM does): a thread slowed down leaves its share to the
         * other instead of making it wait at the end. A tile's sums do not
         * depend on the chunk or thread that computes it. */
        int64_t c = atomic_fetch_add_explicit(g->next_chunk, 1, memory_order_relaxed);
        const vitc__chunks *ch = &g->chunks;
        while (c < ch->n) { /* the next claimed ahead, for the prefetch */
            int64_t n = atomic_fetch_add_explicit(g->next_chunk, 1, memory_order_relaxed);
            vitc__lp_block(g, vitc__chunk_at(ch, c), vitc__chunk_at(ch, c + 1), 0, rs,
                           n < ch->n ? vitc__chunk_at(ch, n) : -1);
            c = n;
        }
    } else {
        int64_t units = g->by_cols ? cs : rs, q = units / g->nparts, r = units % g->nparts;
        int64_t b = q * t + (t < r ? t : r), e = b + q + (t < r ? 1 : 0);
        if (g->by_cols)
            vitc__lp_block(g, b, e, 0, rs, -1);
        else
            vitc__lp_block(g, 0, cs, b, e, -1);
    }
    if (g->kn->end) g->kn->end();
}

/* Column chunks per thread: finer balances better; coarser re-reads A less
 * when it spans several cache blocks (batch 8: A is 1.2 MB in int8). */
/* A-strips per thread from which threads split rows rather than columns */
#define VITC_LP_ROW_STRIPS 12
#define VITC_LP_CHUNKS_FEW 12
#define VITC_LP_CHUNKS_MANY 4

vitc_status vitc__linear_lp(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const vitc__pweight *pw, const float *bias, const float *ls,
                            const float *residual, int64_t ldr, int64_t M, int act,
                            const vitc__ln_pre *ln) {
    if (!y || !x || !pw || !pw->data)
        return vitc__err(VITC_ERR_INVALID_ARG, "linear (%s): NULL argument",
                         pw ? vitc_precision_name(pw->prec) : "?");
    if (M <= 0) return VITC_OK;
    if (ln && ldx != pw->K)
        return vitc__err(VITC_ERR_INVALID_ARG, "linear (%s): LayerNorm input with row stride %lld, not K = %lld",
                         vitc_precision_name(pw->prec), (long long)ldx, (long long)pw->K);
    const vitc__lp_kernel *kn = vitc__lp_kernel_for(pw->prec);
    /* int8 weights packed for the other word layout, or over the range the
     * kernel sums exactly (the kernel forced or the arch changed since):
     * that layout's reference, the same numbers */
    if (pw->prec == VITC_PRECISION_INT8 &&
        (!kn->i16 != !pw->i16 || (kn->wmax && kn->wmax < pw->wmax)))
        kn = pw->i16 ? &vitc__lp_int8p_ref : &vitc__lp_int8_ref;
    const int64_t smr = kn->mr, kg = pw->kg, rs = (M + smr - 1) / smr;
    const int64_t lda = kn->a_kpad ? vitc__lp_a_ld(kn->a_kpad, kg) : kg; /* words a row */
    size_t words, bytes, extra = 0;
    int ok = vitc__mul_size((size_t)rs * (size_t)smr, (size_t)lda, &words) &&
             vitc__mul_size(words, sizeof(uint32_t), &bytes);
    if (pw->prec == VITC_PRECISION_INT8)
        ok = ok && vitc__mul_size((size_t)M, 8, &extra) && vitc__add_size(bytes, extra, &bytes);
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "linear (%s) of %lld rows: size overflows",
                         vitc_precision_name(pw->prec), (long long)M);
    uint32_t *pa = vitc__lp_get(bytes);
    if (!pa)
        return vitc__err(VITC_ERR_NOMEM, "linear (%s) of %lld rows: out of memory",
                         vitc_precision_name(pw->prec), (long long)M);
    vitc__lp_job g = {.kn = kn, .pw = pw, .x = x, .ldx = ldx, .y = y, .ldy = ldy, .bias = bias,
                      .ls = ls, .res = residual, .ldr = ldr, .ln = ln, .M = M, .smr = smr,
                      .sa = smr * lda,
                      .pa = pa, .gelu = vitc__act_fn(vitc__kern(), act), .nparts = 1};
    const vitc__kernels *kt = vitc__kern(); /* one blocking for the call */
    /* lp_mc rows are sized for rows of 768 bf16 (1.5 KB). Longer rows (fc2's
     * K = 3072) keep the A block's bytes rather than its rows, and the
     * weight strips get the L2 that frees: 144 rows of 6 KB beside one
     * 192 KB strip re-read the whole of A from L3 once per strip at batch 8
     * (bf16 fc2 85% of peak; 36 rows and four strips: 89%, int8 +2%). */
    int64_t mc_rows = kt->lp_mc, nb_bytes = kt->lp_nb, a_budget = kt->lp_mc * 1536;
    if (mc_rows * lda * 4 > a_budget) {
        mc_rows = a_budget / (lda * 4);
        nb_bytes = 2 * kt->lp_nb;
    }
    g.mcs = mc_rows / smr > 0 ? mc_rows / smr : 1;
    g.nb = vitc__lp_nb(nb_bytes, kg);
    /* the SIMD kernels' in-register GELU and quick-GELU are bitwise the
     * path's row functions only where the table says so (avx512: the same
     * vitc__v_gelu / vitc__v_quick_gelu); tanh-GELU runs on each tile */
    g.fused_gelu = (act == VITC__ACT_GELU || act == VITC__ACT_QUICK_GELU) && kn->fused_gelu &&
                           vitc__kern()->lp_fused_gelu
                       ? act
                       : 0;
    if (pw->prec == VITC_PRECISION_INT8) {
        g.ascale = (float *)(pa + words);
        g.azp = (int32_t *)(g.ascale + M);
    }
    int nt = vitc__in_parallel() ? 1 : vitc__num_threads();
    double flops = 2.0 * (double)M * (double)pw->N * (double)pw->K;
    if (flops < 400000.0) nt = 1;
    /* Split the weight's column strips when each thread gets two or more
     * (each then streams only its share of the weights), else the rows.
     * But rows when each thread gets VITC_LP_ROW_STRIPS strips or more: a
     * thread then converts, multiplies and writes its own rows (those of
     * the products before and after it too), where with columns each
     * thread reads every strip the others converted and rows they wrote.
     * ViT-B/16 int8 and bf16 at batch 8 ran as fast split either way where
     * the VM's two vCPUs sat close, and 5-12% faster by rows where they sat
     * far apart (docs/bench.md, "Reading the numbers"); batch 1 (17 strips)
     * keeps the columns, 5% faster there. */
    int64_t cs = (pw->N + NR - 1) / NR, mblocks = (rs + g.mcs - 1) / g.mcs;
    g.by_cols = (cs >= 2 * (int64_t)nt || cs >= rs) && rs < VITC_LP_ROW_STRIPS * (int64_t)nt;
    int64_t units = g.by_cols ? cs : rs;
    g.nparts = nt > units ? (int)units : nt;
    if (g.nparts <= 1) {
        g.nparts = 1;
        for (int64_t t = 0; t < rs; t++) vitc__lp_pack_strip(&g, t);
        vitc__lp_task(&g, 0, 0);
        return VITC_OK;
    }
    /* Threads splitting the columns all read every strip of A: they convert
     * it inside the GEMM's region, as they first need each block (no region
     * of its own, no serial LayerNorm before it). Splitting rows, a thread's
     * own strips only: converted in a region first. */
    vitc__coop coop; /* lives until the region below returns */
    _Atomic int64_t next_chunk;
    if (g.by_cols && mblocks <= VITC_COOP_BLOCKS) {
        vitc__coop_init(&coop, rs, mblocks, vitc__lp_pack_strip, &g);
        g.coop = &coop;
    } else {
        vitc__parallel_for(rs, vitc__lp_pack_task, &g);
    }
    if (g.by_cols) {
        int64_t per_thread = mblocks <= 2 ? VITC_LP_CHUNKS_FEW : VITC_LP_CHUNKS_MANY;
        int64_t chunk = (cs + per_thread * g.nparts - 1) / (per_thread * g.nparts);
        /* Whole L2 blocks of B strips per chunk where the chunks still
         * share evenly among the threads. Else the chunk stays (vitc__lp_block
         * cuts it into equal blocks): bf16 qkv at batch 8 (72 strips, blocks
         * of 8) made 9 chunks of 8, and one thread idled through the ninth
         * (84% of peak against fc1's 91%). */
        int64_t nb = g.nb, whole = chunk / nb * nb;
        if (chunk > nb && ((cs + whole - 1) / whole) % g.nparts == 0) chunk = whole;
        vitc__chunks_init(&g.chunks, cs, chunk, 1, g.nparts); /* guided at the end */
        atomic_init(&next_chunk, 0);
        g.next_chunk = &next_chunk;
    }
    vitc__parallel_for(g.nparts, vitc__lp_task, &g);
    return VITC_OK;
}
