/*
 * gemm_lp.h — the low-precision (bf16, int8) linear layers: packed weights,
 * the microkernels' contract, and what dispatch.c picks from. Private to
 * gemm_lp.c, x86/gemm_lp_avx512.c and dispatch.c.
 *
 * Both precisions pack 32-bit words: bf16 holds two consecutive k of a row
 * (k even in the low half), int8 four (k = 4p + byte). A word of A times a
 * word of B is what one lane of vdpbf16ps / vpdpbusd consumes, so the
 * microkernel is the fp32 one (12 x 32, 24 zmm accumulators) with the FMA
 * replaced by the dot-product instruction.
 *
 *   A (activations, converted per call): strips of MR rows, [kg][MR] words
 *   B (weights, converted once):         strips of NR columns, [kg][NR] words
 *
 * kg = ceil(K / 2) (bf16, and int8 in int16 words: vitc__lp_kernel.i16) or
 * ceil(K / 4) (int8); k past K is packed as 0.
 */
#ifndef VITC_GEMM_LP_H
#define VITC_GEMM_LP_H

#include <math.h>
#include <string.h>

#include "kernels.h"

#define VITC_LP_MR 12
#define VITC_LP_NR 32

/* The epilogue of one tile (row i, column j of the tile):
 *   bf16: v = acc
 *   int8: v = (float)(acc - azp[i] * wsum[j]) * (ascale[i] * wscale[j])
 *   then v = v + bias[j], v = ls[j] * v, v = v + res[i * ldr + j], in this
 *   order, each rounded to float: the reference and the SIMD kernels give
 *   the same bits (and ls as vitc__scale_add's pass after would: DINOv2's
 *   layer scale, fused).
 *   With gelu (kernels with fused_gelu only), then GELU on the tile before
 *   the store: the operations of the path's vitc__gelu_avx512, so the same
 *   bits as GELU applied to the stored tile. */
typedef struct vitc__lp_epi {
    const float *bias;     /* [nr] or NULL */
    const float *ls;       /* [nr] or NULL: a layer scale */
    const float *res;      /* [mr, ldr] or NULL */
    int64_t ldr;
    const float *ascale;   /* int8: [mr] row scales of A */
    const int32_t *azp;    /* int8: [mr] row zero points of A */
    const float *wscale;   /* int8: [nr] per output channel */
    const int32_t *wsum;   /* int8: [nr] column sums of the int8 weights */
    int gelu; /* VITC__ACT_GELU / VITC__ACT_QUICK_GELU in registers (fused_gelu), 0 none */
    /* Kernels with takes_pf: pf_lines 64-byte lines from pf (the next
     * weight strip) asked into L2, one per step of the loop's middle, not
     * all before the tile (the driver's prefetches otherwise). */
    const char *pf;
    int64_t pf_lines;
} vitc__lp_epi;

/* The AVX2 kernels ask for the residual's rows and C's (the model's
 * stream: past L2 at batch 8) into L2 before a tile's passes, not met cold
 * in the epilogue, where they had stalled it (half its time); into L1
 * they were evicted again by the passes' strips. */
static inline void vitc__lp_pf_tile(const float *C, int64_t ldc, int64_t mr, int64_t nr,
                                    const vitc__lp_epi *e) {
    for (int64_t i = 0; i < mr; i++) {
        if (e->res) {
            __builtin_prefetch(e->res + i * e->ldr, 0, 2);
            if (nr > 16) __builtin_prefetch(e->res + i * e->ldr + 16, 0, 2);
        }
        __builtin_prefetch(C + i * ldc, 1, 2);
        if (nr > 16) __builtin_prefetch(C + i * ldc + 16, 1, 2);
    }
}

/* C[mr, nr] (row stride ldc) from pa [kg][MR] and pb [kg][NR] words. */
typedef void (*vitc__lp_ukr_fn)(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e);
/* One row x [K] of A into words dst[p * stride], p < kg (k past K is 0).
 * int8 also returns the row's scale and zero point (quantized per row).
 * bf16 reads *scale when it is not NULL and converts x[k] * *scale (float
 * product, then rounding): the bf16 attention normalises its probabilities
 * there (vitc__kernels.softmax_rows_exp2), not in a pass of its own. */
typedef void (*vitc__lp_row_fn)(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                float *scale, int32_t *zp);

/* Rows x[i * ldx], i < rows, converted: word p of row i to dst[p * ldd + i]
 * for i < w (rows <= w <= 16; rows past `rows` written as 0), p < kg. The
 * GEMM's A strips (w = ldd = MR) and attention_lp.c's K panels (w = 16,
 * ldd = NR, each half of a strip). int8 also writes scale[i], zp[i],
 * i < rows. The same words as row() with stride ldd, row by row. */
typedef void (*vitc__lp_strip_fn)(uint32_t *dst, int64_t ldd, int w, const float *x,
                                  int64_t ldx, int64_t rows, int64_t K, float *scale,
                                  int32_t *zp);
/* bf16: dst[c] = bf16(x0[c]) | bf16(x1[c]) << 16 (x1 NULL: high half 0),
 * c < n: two rows' values in one word each, the layout of attention_lp.c's
 * V panels (two consecutive keys per word), with no transpose. */
typedef void (*vitc__lp_pairs_fn)(uint32_t *dst, const float *x0, const float *x1, int64_t n);

/* bf16: C[mr, nr] = A B, no epilogue, from A row-major (word p of row i at
 * a[i * lda + p]; all MR rows are read, those past mr unused) and pb
 * [kg][NR]. The attention's operands (attention_lp.c): its rows are
 * converted in place (row with stride 1), with no transpose. */
typedef void (*vitc__lp_ukr_rm_fn)(int64_t kg, const uint32_t *a, int64_t lda,
                                   const uint32_t *pb, float *C, int64_t ldc, int64_t mr,
                                   int64_t nr);

/* The int8 attention's B panels (attention_lp.c), s8, symmetric, each
 * row (s8_rows) or column (s8_quads) on its own scale: scale = max|x| /
 * 127 (vitc__s8_params), q = vitc__s8(x, 1 / scale), sum = the sum of its q
 * (the epilogue's wsum).
 * s8_rows: rows x[i * ldx], i < rows <= 16, into words dst[p * ldd + i]
 *   (k = 4p + byte), i < 16 (rows past `rows` zero), p < ceil(K / 4):
 *   K's panels, a half strip of keys at a time.
 * s8_quads: columns c < n <= NR of the S rows x[j * ldx] into words
 *   dst[p * NR + c] (row 4p + byte), c < NR (columns past n zero),
 *   p < ceil(S / 4): V's panels, four keys a word. scale[c], sum[c], c < n. */
typedef void (*vitc__lp_s8_rows_fn)(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx,
                                    int64_t rows, int64_t K, float *scale, int32_t *sum);
typedef void (*vitc__lp_s8_quads_fn)(uint32_t *dst, const float *x, int64_t ldx, int64_t S,
                                     int64_t n, float *scale, int32_t *sum);

typedef struct vitc__lp_kernel {
    const char *name; /* "avx512-bf16", "reference", ... (vitc --version) */
    vitc__lp_ukr_fn ukr;
    vitc__lp_row_fn row;
    vitc__lp_strip_fn strip;   /* NULL: row() per row (vitc__lp_strip) */
    vitc__lp_ukr_rm_fn ukr_rm; /* bf16 kernels; NULL for int8 */
    vitc__lp_pairs_fn pairs;   /* bf16 kernels; NULL for int8 */
    /* 1: ukr applies epi.gelu in registers (AVX-512 kernels). Otherwise the
     * driver runs the arch's gelu over each stored tile: reloading a tile
     * right after its masked stores waited on them (no store forwarding
     * from masked stores), which made GELU ~16% of the int8 forward. */
    int fused_gelu;
    /* The driver's A strips: mr rows each (VITC_LP_MR, or 32 for AMX).
     * a_kpad 0: [kg][mr] words (strip()); else row-major [mr][lda] words,
     * lda = vitc__lp_a_ld(a_kpad, kg), words past kg and rows past M zero
     * (row() with stride 1): AMX's A tile reads 16 rows of a_kpad words. */
    int mr, a_kpad;
    /* Called by the driver on each thread around its share of the tiles
     * (AMX: load the tile config, release it); NULL for none. */
    void (*begin)(void);
    void (*end)(void);
    /* 1: ukr asks for epi.pf itself (AVX-512 kernels); else the driver does,
     * before each tile */
    int takes_pf;
    /* int8 kernels with a [kg][MR] A strip (mr == MR, a_kpad 0): the int8
     * attention's panels; NULL: the reference's. */
    vitc__lp_s8_rows_fn s8_rows;
    vitc__lp_s8_quads_fn s8_quads;
    /* strip() of rows whose values lie in [0, 1] (the int8 attention's P,
     * each row's largest 1): the fixed scale 1/255 and zero point 0,
     * q = vitc__q8(x, 255, 0), with no min / max pass; scale, zp unused. */
    vitc__lp_strip_fn strip_unit;
    /* int8 only. 1: words of two k (k = 2p + half), each an int16: the u8
     * activations zero-extended, the s8 weights sign-extended; kg =
     * ceil(K / 2). For vpmaddwd, the exact product of CPUs without VNNI
     * (widening in the loop instead ran below fp32's FMA rate on a Zen 3).
     * Weights packed so (vitc__pweight.i16) twice int8's memory, bf16's.
     * 0: four u8 / s8 k a word (vpdpbusd's). The same sums either way. */
    int i16;
    /* int8 only: the weights' largest magnitude this kernel sums exactly,
     * 0 for all of [-127, 127]. 64: vpmaddubsw's int16 pair sums hold
     * 255 * 64 * 2 (avx2-w7); its weights are packed on scale max|w| / 64,
     * so with half the steps (vitc__pweight.wmax). */
    int wmax;
} vitc__lp_kernel;

/* Words of precision p's kernel kn: k per word (2 or 4), and their count. */
static inline int vitc__lp_kw(const vitc__lp_kernel *kn, vitc_precision p) {
    return p == VITC_PRECISION_BF16 || kn->i16 ? 2 : 4;
}

/* Row stride (words) of a row-major A strip: kg rounded up to whole tile
 * rows of kpad words, plus one tile row when that stride would be a
 * multiple of 1 KB, so that the 16 rows a tile load reads do not all map
 * to the same few L1 sets (ViT-B's K = 3072: kg = 768 or 1536 words). */
static inline int64_t vitc__lp_a_ld(int kpad, int64_t kg) {
    int64_t ld = (kg + kpad - 1) / kpad * kpad;
    return (ld * 4) % 1024 == 0 ? ld + kpad : ld;
}

extern const vitc__lp_kernel vitc__lp_bf16_ref, vitc__lp_int8_ref;
extern const vitc__lp_kernel vitc__lp_bf16_avx512, vitc__lp_int8_avx512;
extern const vitc__lp_kernel vitc__lp_int8_avxvnni; /* row: NULL, the reference's */
/* int8 in int16 words (i16): the reference, and AVX2's vpmaddwd kernel
 * (x86/gemm_lp_madd_avx2.c) for CPUs with AVX2 and no VNNI */
extern const vitc__lp_kernel vitc__lp_int8p_ref, vitc__lp_int8_avx2;
/* int8 on AVX2 without VNNI with weights in [-64, 64] (wmax): vpmaddubsw,
 * vpdpbusd's words (x86/gemm_lp_madd_avx2.c) */
extern const vitc__lp_kernel vitc__lp_int8_avx2_w7;
/* The reference on avx2-w7's ranges (wmax 64, its attention panels too):
 * what avx2-w7 gives, bit for bit (tests) */
extern const vitc__lp_kernel vitc__lp_int8_ref7;
/* The reference's attention panels on [-qmax, qmax] (gemm_lp.c): what the
 * SIMD ones must give, bit for bit (tests). */
void vitc__s8_rows_qref(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx, int64_t rows,
                        int64_t K, float *scale, int32_t *sum, int qmax);
void vitc__s8_quads_qref(uint32_t *dst, const float *x, int64_t ldx, int64_t S, int64_t n,
                         float *scale, int32_t *sum, int qmax);
/* bf16 on AVX2 + FMA without AVX512-BF16: widened to fp32, the reference's
 * numbers (x86/gemm_lp_bf16_avx2.c) */
extern const vitc__lp_kernel vitc__lp_bf16_avx2;
/* AMX (x86/gemm_lp_amx.c): tdpbf16ps / tdpbusd on 32 x 32 blocks; only on CPUs
 * where vitc__amx_usable() (dispatch.c). The same kernel source on a C
 * emulation of the tile instructions (gemm_lp_amx_emul.c): runs anywhere,
 * never chosen by default, forced by VITC_LP_KERNEL=amx-emulated (tests). */
extern const vitc__lp_kernel vitc__lp_bf16_amx, vitc__lp_int8_amx;
extern const vitc__lp_kernel vitc__lp_bf16_amx_emul, vitc__lp_int8_amx_emul;

/* The epilogue of gemm_lp.h on sums stored in memory: acc [mr][lda] floats
 * (bf16) or int32 (int8), for the AMX kernels, which store their tiles.
 * _ref: the reference kernels' code (no GELU: the driver's pass after);
 * _avx512: the AVX-512 microkernels' code (GELU fused when e->gelu), the
 * same bits. */
void vitc__lp_epi_ref(vitc_precision p, const void *acc, int64_t lda, float *C, int64_t ldc,
                      int64_t mr, int64_t nr, const vitc__lp_epi *e);
void vitc__lp_epi_avx512(vitc_precision p, const void *acc, int64_t lda, float *C, int64_t ldc,
                         int64_t mr, int64_t nr, const vitc__lp_epi *e);
/* x86/gemm_lp_avx512.c's converters and row-major kernel, which the AMX
 * kernels share (AMX CPUs have AVX512-BF16 and VNNI). */
void vitc__row_bf16_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                           float *scale, int32_t *zp);
void vitc__row_int8_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                           float *scale, int32_t *zp);
void vitc__strip_bf16_avx512(uint32_t *dst, int64_t ldd, int w, const float *x, int64_t ldx,
                             int64_t rows, int64_t K, float *scale, int32_t *zp);
void vitc__strip_int8_avx512(uint32_t *dst, int64_t ldd, int w, const float *x, int64_t ldx,
                             int64_t rows, int64_t K, float *scale, int32_t *zp);
void vitc__ukr_bf16_rm_avx512(int64_t kg, const uint32_t *a, int64_t lda, const uint32_t *pb,
                              float *C, int64_t ldc, int64_t mr, int64_t nr);
void vitc__pairs_bf16_avx512(uint32_t *dst, const float *x0, const float *x1, int64_t n);

/* 1 when this process can run the AMX kernels: cpuid (AMX-TILE, -BF16,
 * -INT8, AVX512-BF16, -VNNI), XCR0 (XTILECFG, XTILEDATA) and, on Linux,
 * the kernel's permission for tile data (arch_prctl), asked once. Else 0
 * and *why (when not NULL) says which was missing. dispatch.c. */
int vitc__amx_usable(const char **why);

/* Force the low-precision kernel by name: "reference", "avx512",
 * "avx-vnni", "avx2", "amx", "amx-emulated"; NULL or "auto": cpuid's choice. The
 * environment's VITC_LP_KERNEL is read at the first kernel choice (an
 * unknown name or one this CPU cannot run: ignored, and
 * vitc_get_precision_paths says so). For tests. */
vitc_status vitc__lp_force(const char *name);

/* One tile product through the kernel file's tile macros, all tiles 16
 * rows x 64 bytes: c[16][16] (+)= a[16][16 words] b[16][16 words], int8
 * (tdpbusd) or bf16 (tdpbf16ps); c, a, b row-major, 64 bytes a row.
 * _amx: the instructions (only where vitc__amx_usable), _amx_emul: the
 * emulation: the tests compare them where the CPU has AMX. */
void vitc__amx_tile_dp_amx(int int8, void *c, const void *a, const void *b);
void vitc__amx_tile_dp_amx_emul(int int8, void *c, const void *a, const void *b);

/* gemm_lp_amx_emul.c: the tile instructions in C, one tile file per thread
 * (8 tiles of 16 rows x 64 bytes, and the config), per the SDM's
 * pseudo-code. A use that would fault on hardware (no config, a bad
 * config, operand shapes that do not fit) does nothing and is counted:
 * vitc__amx_emu_faults() (process-wide), which the tests require 0. */
void vitc__amx_emu_loadconfig(const void *cfg); /* 64 bytes */
void vitc__amx_emu_release(void);
void vitc__amx_emu_zero(int t);
void vitc__amx_emu_load(int t, const void *base, int64_t stride);
void vitc__amx_emu_store(int t, void *base, int64_t stride);
void vitc__amx_emu_dpbf16ps(int c, int a, int b);
void vitc__amx_emu_dpbusd(int c, int a, int b);
uint64_t vitc__amx_emu_faults(void);

/* kn's strip converter, or its row() (the reference's when NULL) row by row. */
void vitc__lp_strip(const vitc__lp_kernel *kn, vitc_precision p, uint32_t *dst, int64_t ldd,
                    int w, const float *x, int64_t ldx, int64_t rows, int64_t K, float *scale,
                    int32_t *zp);

/* This thread's grow-only scratch of at least bytes (64-byte aligned;
 * NULL when out of memory): vitc__linear_lp's converted activations, and
 * attention_lp.c's per-task buffers. Valid until the thread's next call. */
void *vitc__lp_get(size_t bytes);

/* The kernel of precision p that this CPU and the forced arch can run
 * (dispatch.c): AVX512-BF16 / AVX512-VNNI on the avx512 path when cpuid
 * has them, AVX-VNNI (int8) on the avx2 path, else the portable reference
 * (same numbers, slower). */
const vitc__lp_kernel *vitc__lp_kernel_for(vitc_precision p);

/* float -> bf16, round to nearest even, as vcvtne2ps2bf16 does: NaN stays
 * a quiet NaN; subnormal inputs become zero of the same sign. */
static inline uint16_t vitc__bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu))
        return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7F800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float vitc__bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The per-row int8 quantization both paths use: the row's range widened
 * to hold 0, scale = range / 255, zero point round(-min / scale), and
 * q = clamp(round(x * (1 / scale)) + zp, 0, 255), rounding to nearest even.
 * A row of zeros gets scale 1. */
static inline void vitc__q8_params(float mn, float mx, float *scale, float *inv, int32_t *zp) {
    if (mn > 0.0f) mn = 0.0f;
    if (mx < 0.0f) mx = 0.0f;
    float s = (mx - mn) / 255.0f;
    if (!(s > 0.0f) || !isfinite(s)) s = 1.0f; /* zeros, or NaN / inf in the row */
    float iv = 1.0f / s;
    float z = nearbyintf(-mn * iv);
    *scale = s;
    *inv = iv;
    /* NaN (a NaN minimum: NaN activations) gets 0; converting it is UB */
    *zp = !(z > 0.0f) ? 0 : z > 255.0f ? 255 : (int32_t)z;
}

/* One quantized element: round(x * inv) like cvtps2dq (an unrepresentable
 * or NaN result is INT32_MIN, "integer indefinite"), clamped to [-256, 511]
 * so adding zp cannot wrap, + zp, clamped to [0, 255]. */
static inline uint8_t vitc__q8(float x, float inv, int32_t zp) {
    float t = nearbyintf(x * inv);
    int32_t q = (t >= -2147483648.0f && t < 2147483648.0f) ? (int32_t)t : INT32_MIN;
    q = q < -256 ? -256 : q > 511 ? 511 : q;
    q += zp;
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

/* The int8 attention's symmetric quantization (s8_rows, s8_quads):
 * scale = amax / qmax (1 for a zero or non-finite range), its inverse, and
 * q = clamp(round(x * inv), -qmax, qmax), nearest even, an unrepresentable
 * or NaN product giving -qmax (cvtps2dq's "integer indefinite", clamped).
 * qmax is 127, or 64 for a kernel with wmax 64 (avx2-w7's panels). */
static inline void vitc__s8_params_q(float amax, int qmax, float *scale, float *inv) {
    float s = amax / (float)qmax;
    if (!(s > 0.0f) || !isfinite(s)) s = 1.0f;
    *scale = s;
    *inv = 1.0f / s;
}

static inline int32_t vitc__s8_q(float x, float inv, int qmax) {
    float t = nearbyintf(x * inv);
    int32_t q = (t >= -2147483648.0f && t < 2147483648.0f) ? (int32_t)t : INT32_MIN;
    return q < -qmax ? -qmax : q > qmax ? qmax : q;
}

static inline void vitc__s8_params(float amax, float *scale, float *inv) {
    vitc__s8_params_q(amax, 127, scale, inv);
}

static inline int32_t vitc__s8(float x, float inv) { return vitc__s8_q(x, inv, 127); }

/* The vector kernel of precision p the attention runs (attention_lp.c):
 * vitc__lp_kernel_for's, but for a kernel whose A layout is not the
 * [kg][MR] strip of four-byte words (AMX; AVX2's int16 words): AVX-512's,
 * which every AMX CPU has, else the reference. dispatch.c. */
const vitc__lp_kernel *vitc__lp_attention_kernel(vitc_precision p);

#endif
