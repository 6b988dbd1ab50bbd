/* attention_avx512.c — the tiled attention kernel on AVX-512 (16 lanes):
 * S microkernel 12 rows x 32 keys (24 zmm accumulators), P V microkernel
 * 6 rows x 64 channels (24 accumulators). Compiled with -mavx512f etc.;
 * only called after cpuid said yes. The caller has set FTZ/DAZ, which the
 * exponential relies on to return exactly 0 below 2^-126. */
#include "attention_impl.h"

/* Not an x86 target: dispatch never picks this path; the symbol stays so
 * the dispatcher links. */
#if !defined(__x86_64__) && !defined(__i386__)
void vitc__attn_rows_avx512(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b, int64_t h,
                            int64_t l0, int64_t l1) {
    vitc__attn_rows_generic(p, ws, b, h, l0, l1);
}
#else

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define VT __m512
#define VW 16
#define MR_S 12
#define MR_PV 6
#define ATT_SMALL_DV 16
#define NV_PV 4

#define v_zero() _mm512_setzero_ps()
#define v_set1(x) _mm512_set1_ps(x)
#define v_load(p) _mm512_load_ps(p)
#define v_store(p, x) _mm512_store_ps(p, x)
#define v_loadu(p) _mm512_loadu_ps(p)
#define v_storeu(p, x) _mm512_storeu_ps(p, x)
#define v_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define v_mul(a, b) _mm512_mul_ps(a, b)
#define v_add(a, b) _mm512_add_ps(a, b)
#define v_sub(a, b) _mm512_sub_ps(a, b)
#define v_max(a, b) _mm512_max_ps(a, b)
#define v_lanes(n) ((__mmask16)((1u << (n)) - 1u))
#define v_loadu_n(p, n) _mm512_maskz_loadu_ps(v_lanes(n), p)
#define v_storeu_n(p, x, n) _mm512_mask_storeu_ps(p, v_lanes(n), x)
#define v_tail(x, n, f) _mm512_mask_blend_ps(v_lanes(n), _mm512_set1_ps(f), x)
#define v_hmax(x) _mm512_reduce_max_ps(x)
#define v_hsum(x) _mm512_reduce_add_ps(x)
#define v_exp2(x) att_exp2_avx512(x)
#define s_exp2(x) exp2f(x)

/* 2^x = 2^n * 2^f, n = round(x), f in [-1/2, 1/2], 2^f by Cephes' exp2f
 * polynomial (about 2 ulp). The clamp at -127 makes vscalefps produce a
 * denormal that FTZ flushes to 0, so masked keys weigh exactly 0; max(lo, x)
 * returns x when x is NaN, so NaN still propagates. */
static inline __m512 att_exp2_avx512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#include "attention_t8.h"

#define ATT_FN vitc__attn_rows_avx512
#include "attention_tmpl.h"

#endif
