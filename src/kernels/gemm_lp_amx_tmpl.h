/*
 * gemm_lp_amx_tmpl.h — the AMX microkernels (bf16 tdpbf16ps, int8 tdpbusd:
 * u8 activations x s8 weights), written against a few tile macros so that
 * one source runs two ways (issue 11):
 *   x86/gemm_lp_amx.c   the macros are the intrinsics (-mamx-*), chosen at
 *                       run time where cpuid, XCR0 and Linux allow AMX;
 *   gemm_lp_amx_emul.c  the macros call a C emulation of the instructions,
 *                       so that this machine (no AMX) runs and tests this
 *                       very code.
 * The includer defines, before including:
 *   AMX_CFG(p) AMX_RELEASE() AMX_ZERO(t) AMX_LOAD(t, base, stride)
 *   AMX_STORE(t, base, stride) AMX_DPBF16(c, a, b) AMX_DPBUSD(c, a, b)
 *     (tile numbers are constants: the instructions encode them);
 *   AMX_EPI   the epilogue on the stored sums (vitc__lp_epi_ref / _avx512);
 *   AMX_SFX   the suffix of the names defined here (amx / amx_emul).
 *
 * The operands. C = A B^T, A the activations (M x K), B the packed weights.
 * tdp* c, a, b: c[m][n] += sum over k of a[m][k] b[k][n], a word (a pair
 * of bf16 or four u8 / s8: the packed layouts of gemm_lp.h) being one k:
 *   A tile: 16 rows x 16 words, each row 16 consecutive words of a row of
 *           A: the driver packs A strips row-major (a_kpad = 16), 32 rows a
 *           strip, rows past kg zero;
 *   B tile: 16 rows (k) x 16 words (columns): 16 consecutive words p of a
 *           packed weight strip [kg][32], row stride 128 bytes: each strip
 *           is two B tiles side by side, so the weights keep the AVX-512
 *           kernels' packing (one format on disk and in memory);
 *   C tile: 16 x 16 fp32 or int32.
 * The other way round (C^T = W A^T, weights as the A operand and the
 * activations as B with tdpbsud) would need a second weight layout; the
 * activations are converted on every call anyway, so their row-major
 * packing costs nothing more.
 *
 * The block: 32 rows x 32 columns from 2 A tiles x 2 B tiles into 4
 * accumulators (the 8 tiles of palette 1; every tile 16 rows x 64 bytes,
 * one config for both precisions): 4 loads per 4 products, each product
 * 16 x 16 x 16 words. Strips of 16 rows or fewer (the last of M, batch 1's
 * tokens) skip the second A tile. The accumulators are stored to a 4 KB
 * buffer on the stack and finished there by the shared epilogue code.
 *
 * K tail: the A strip is zero past kg; B's rows past kg belong to the next
 * strip (or lie past the weights), so the last partial tile of B is copied
 * to a zeroed buffer first (0 x 0 adds nothing: the sums are those over kg
 * words; bf16 may turn a -0 sum into +0).
 *
 * Numbers: int8 sums are exact, so the int8 results are the reference's
 * and the VNNI kernels' bit for bit. tdpbf16ps sums differently from
 * vdpbf16ps: per tile, the even and the odd bf16 of the 16 pairs go into
 * two fp32 partial sums (each rounded, FTZ), which are then added to each
 * other and to the accumulator; the AVX-512 kernels add odd, then even,
 * pair by pair into one sum. Same products, another order of the fp32
 * additions: within the fp32 reordering bound (tests/test_precision.c).
 */
#include <stdalign.h>
#include <string.h>

#include "gemm_lp.h"

#define AMX_NAME2(a, b) a##_##b
#define AMX_NAME1(a, b) AMX_NAME2(a, b)
#define AMX_NAME(a) AMX_NAME1(a, AMX_SFX)

/* tiles: C00 C01 C10 C11 (rows 0-15 / 16-31 x columns 0-15 / 16-31), A0 A1, B0 B1 */
#define TC00 0
#define TC01 1
#define TC10 2
#define TC11 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

#define AMX_NR VITC_LP_NR /* columns of a B strip */
#define AMX_MR 32         /* rows of an A strip */
#define AMX_KW 16         /* words of k in one tile row */

/* The tile config (palette 1): byte 0 palette, 1 start row, 16.. colsb of
 * tiles 0-15 (u16), 48.. rows (u8); every tile 16 x 64 bytes. */
static const alignas(64) uint8_t AMX_NAME(vitc__amx_cfg)[64] = {
    1, 0, [16] = 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
    [48] = 16, 16, 16, 16, 16, 16, 16, 16};

static void AMX_NAME(vitc__amx_begin)(void) { AMX_CFG(AMX_NAME(vitc__amx_cfg)); }
static void AMX_NAME(vitc__amx_end)(void) { AMX_RELEASE(); }

/* One tdp* of the precision. */
#define AMX_DP(int8, c, a, b)                                                       \
    do {                                                                            \
        if (int8) AMX_DPBUSD(c, a, b);                                              \
        else AMX_DPBF16(c, a, b);                                                   \
    } while (0)

/* Sums over k words [0, kw) (kw a multiple of 16): A rows at a (stride lda
 * words), B rows at b (stride bs words); two = rows 16-31 too. */
__attribute__((always_inline)) static inline void
AMX_NAME(vitc__amx_sums)(const int int8, const int two, int64_t kw, const uint32_t *a,
                         int64_t lda, const uint32_t *b, int64_t bs) {
    for (int64_t p = 0; p < kw; p += AMX_KW) {
        AMX_LOAD(TB0, b + p * bs, bs * 4);
        AMX_LOAD(TB1, b + p * bs + 16, bs * 4);
        AMX_LOAD(TA0, a + p, lda * 4);
        AMX_DP(int8, TC00, TA0, TB0);
        AMX_DP(int8, TC01, TA0, TB1);
        if (two) {
            AMX_LOAD(TA1, a + 16 * lda + p, lda * 4);
            AMX_DP(int8, TC10, TA1, TB0);
            AMX_DP(int8, TC11, TA1, TB1);
        }
    }
}

__attribute__((always_inline)) static inline void
AMX_NAME(vitc__amx_block)(const int int8, const int two, int64_t kg, const uint32_t *pa,
                          const uint32_t *pb, float *C, int64_t ldc, int64_t mr, int64_t nr,
                          const vitc__lp_epi *e) {
    const int64_t lda = vitc__lp_a_ld(AMX_KW, kg), kfull = kg / AMX_KW * AMX_KW;
    /* the block's output rows, asked for now so that their misses overlap
     * the sums (the AVX-512 kernels' reason) */
    for (int64_t i = 0; i < mr; i++) {
        __builtin_prefetch(C + i * ldc, 1);
        if (e->res) __builtin_prefetch(e->res + i * e->ldr);
    }
    AMX_ZERO(TC00);
    AMX_ZERO(TC01);
    if (two) {
        AMX_ZERO(TC10);
        AMX_ZERO(TC11);
    }
    AMX_NAME(vitc__amx_sums)(int8, two, kfull, pa, lda, pb, AMX_NR);
    if (kfull < kg) {
        alignas(64) uint32_t bt[AMX_KW * AMX_NR]; /* [16][32] the last B rows, zero past kg */
        memset(bt, 0, sizeof bt);
        memcpy(bt, pb + kfull * AMX_NR, (size_t)(kg - kfull) * AMX_NR * sizeof *bt);
        /* the intrinsics' tileloadd asm takes only the address: without
         * this the compiler may drop or sink the writes to bt */
        __asm__ volatile("" ::: "memory");
        AMX_NAME(vitc__amx_sums)(int8, two, AMX_KW, pa + kfull, lda, bt, AMX_NR);
    }
    /* [32][32] fp32 or int32 sums; rows 16-31 only with two */
    alignas(64) uint32_t acc[AMX_MR * AMX_NR];
    AMX_STORE(TC00, acc, AMX_NR * 4);
    AMX_STORE(TC01, acc + 16, AMX_NR * 4);
    if (two) {
        AMX_STORE(TC10, acc + 16 * AMX_NR, AMX_NR * 4);
        AMX_STORE(TC11, acc + 16 * AMX_NR + 16, AMX_NR * 4);
    }
    AMX_EPI(int8 ? VITC_PRECISION_INT8 : VITC_PRECISION_BF16, acc, AMX_NR, C, ldc, mr, nr, e);
}

/* The vitc__lp_ukr_fn of each precision: pa a row-major strip of 32 rows
 * ([32][lda] words), pb a packed weight strip ([kg][32] words). */
static void AMX_NAME(vitc__ukr_bf16)(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                     int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    if (mr > 16) AMX_NAME(vitc__amx_block)(0, 1, kg, pa, pb, C, ldc, mr, nr, e);
    else AMX_NAME(vitc__amx_block)(0, 0, kg, pa, pb, C, ldc, mr, nr, e);
}

static void AMX_NAME(vitc__ukr_int8)(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                     int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    if (mr > 16) AMX_NAME(vitc__amx_block)(1, 1, kg, pa, pb, C, ldc, mr, nr, e);
    else AMX_NAME(vitc__amx_block)(1, 0, kg, pa, pb, C, ldc, mr, nr, e);
}

/* One 16 x 16 x 16-word product through the same macros (gemm_lp.h). */
void AMX_NAME(vitc__amx_tile_dp)(int int8, void *c, const void *a, const void *b) {
    AMX_NAME(vitc__amx_begin)();
    AMX_LOAD(TC00, c, 64);
    AMX_LOAD(TA0, a, 64);
    AMX_LOAD(TB0, b, 64);
    AMX_DP(int8, TC00, TA0, TB0);
    AMX_STORE(TC00, c, 64);
    AMX_NAME(vitc__amx_end)();
}
