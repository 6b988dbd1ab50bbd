/*
 * gemm_lp_amx_emul.c — a C emulation of the AMX tile instructions, and
 * gemm_lp_amx_tmpl.h's kernels built on it ("amx-emulated"): the AMX
 * kernel source runs, and is tested, on CPUs without AMX (this project's
 * Zen 5 test machine has none). Portable C, no ISA flags; never chosen by
 * default dispatch, only by VITC_LP_KERNEL=amx-emulated / vitc__lp_force.
 *
 * The instructions follow the pseudo-code of Intel's SDM (LDTILECFG,
 * TILELOADD, TILESTORED, TILEZERO, TILERELEASE, TDPBUSD, TDPBF16PS):
 * - one tile file per thread (the pool's threads each load the config,
 *   as on hardware), palette 1: 8 tiles of at most 16 rows x 64 bytes;
 * - a load reads rows x colsb bytes of the config and zeroes the rest of
 *   the tile (bytes past colsb, rows past rows); a store writes rows x
 *   colsb; the products read colsb / 4 words of a row;
 * - tdpbusd: u8 x s8, four products and the accumulator added in 32 bits,
 *   wrapping (exact: the same sums as vpdpbusd);
 * - tdpbf16ps: for each row, the even and the odd bf16 of each pair go into
 *   two fp32 partial sums by FMA over the k of the tile (DAZ, FTZ, round
 *   to nearest even), then dst += (even + odd), DAZ/FTZ, RNE.
 * What would fault on hardware (#UD / #GP: no config, a bad config, tiles
 * that are not distinct or whose shapes do not fit) does nothing here and
 * is counted (vitc__amx_emu_faults): the library never aborts, the tests
 * require the count to stay 0.
 */
#include <math.h>
#include <stdalign.h>
#include <string.h>

#include "gemm_lp.h"

#define AMX_TILES 8
#define AMX_ROWS 16
#define AMX_COLSB 64

typedef struct {
    int configured;
    uint8_t rows[AMX_TILES];
    uint16_t colsb[AMX_TILES];
    alignas(64) uint8_t t[AMX_TILES][AMX_ROWS][AMX_COLSB];
} vitc__amx_file;

static _Thread_local vitc__amx_file vitc__amx_tf;
static uint64_t vitc__amx_nfaults;

uint64_t vitc__amx_emu_faults(void) { return __atomic_load_n(&vitc__amx_nfaults, __ATOMIC_RELAXED); }

static void vitc__amx_fault(void) { __atomic_fetch_add(&vitc__amx_nfaults, 1, __ATOMIC_RELAXED); }

/* This thread's file when configured and tile t exists and is configured
 * (rows and colsb not 0), else NULL (counted). */
static vitc__amx_file *vitc__amx_get(int t) {
    vitc__amx_file *f = &vitc__amx_tf;
    if (!f->configured || t < 0 || t >= AMX_TILES || !f->rows[t] || !f->colsb[t]) {
        vitc__amx_fault();
        return NULL;
    }
    return f;
}

void vitc__amx_emu_release(void) {
    memset(&vitc__amx_tf, 0, sizeof vitc__amx_tf); /* the init state: no config, tiles zero */
}

void vitc__amx_emu_loadconfig(const void *cfg) {
    const uint8_t *c = cfg; /* [64] */
    if (c[0] == 0) { /* palette 0: back to the init state */
        vitc__amx_emu_release();
        return;
    }
    int bad = c[0] != 1 || c[1] != 0; /* palette 1 only; start_row is the OS's, after a fault */
    for (int i = 2; i < 16; i++) bad |= c[i] != 0; /* reserved */
    uint8_t rows[16];
    uint16_t colsb[16];
    for (int i = 0; i < 16; i++) {
        colsb[i] = (uint16_t)(c[16 + 2 * i] | c[17 + 2 * i] << 8);
        rows[i] = c[48 + i];
        if (i >= AMX_TILES) bad |= rows[i] || colsb[i];
        else bad |= rows[i] > AMX_ROWS || colsb[i] > AMX_COLSB || !rows[i] != !colsb[i];
    }
    if (bad) {
        vitc__amx_fault(); /* #GP: the config is left as it was */
        return;
    }
    vitc__amx_file *f = &vitc__amx_tf;
    memset(f, 0, sizeof *f);
    f->configured = 1;
    memcpy(f->rows, rows, AMX_TILES);
    memcpy(f->colsb, colsb, AMX_TILES * sizeof colsb[0]);
}

void vitc__amx_emu_zero(int t) {
    vitc__amx_file *f = vitc__amx_get(t);
    if (f) memset(f->t[t], 0, sizeof f->t[t]);
}

void vitc__amx_emu_load(int t, const void *base, int64_t stride) {
    vitc__amx_file *f = vitc__amx_get(t);
    if (!f) return;
    memset(f->t[t], 0, sizeof f->t[t]);
    for (int r = 0; r < f->rows[t]; r++)
        memcpy(f->t[t][r], (const uint8_t *)base + r * stride, f->colsb[t]);
}

void vitc__amx_emu_store(int t, void *base, int64_t stride) {
    vitc__amx_file *f = vitc__amx_get(t);
    if (!f) return;
    for (int r = 0; r < f->rows[t]; r++) memcpy((uint8_t *)base + r * stride, f->t[t][r], f->colsb[t]);
}

/* The shapes the products require (else #UD): c, a, b distinct; a's rows
 * those of c; a's words per row b's rows; c's and b's rows equally wide. */
static vitc__amx_file *vitc__amx_dp_check(int c, int a, int b) {
    vitc__amx_file *f = vitc__amx_get(c);
    if (!f || !vitc__amx_get(a) || !vitc__amx_get(b)) return NULL;
    if (c == a || c == b || a == b || f->rows[c] != f->rows[a] ||
        f->colsb[a] / 4 != f->rows[b] || f->colsb[c] != f->colsb[b]) {
        vitc__amx_fault();
        return NULL;
    }
    return f;
}

static inline uint32_t vitc__amx_word(const uint8_t *row, int k) {
    uint32_t w;
    memcpy(&w, row + 4 * k, 4);
    return w;
}

void vitc__amx_emu_dpbusd(int c, int a, int b) {
    vitc__amx_file *f = vitc__amx_dp_check(c, a, b);
    if (!f) return;
    const int K = f->colsb[a] / 4, N = f->colsb[c] / 4;
    for (int m = 0; m < f->rows[c]; m++) {
        uint8_t *cr = f->t[c][m];
        for (int n = 0; n < N; n++) {
            uint32_t acc = vitc__amx_word(cr, n); /* 32-bit wrapping, as the hardware */
            for (int k = 0; k < K; k++) {
                uint32_t x = vitc__amx_word(f->t[a][m], k), y = vitc__amx_word(f->t[b][k], n);
                for (int q = 0; q < 4; q++)
                    acc += (uint32_t)((int32_t)(uint8_t)(x >> (8 * q)) *
                                      (int32_t)(int8_t)(uint8_t)(y >> (8 * q)));
            }
            memcpy(cr + 4 * n, &acc, 4);
        }
        memset(cr + 4 * N, 0, AMX_COLSB - 4 * (size_t)N); /* write_row_and_zero */
    }
    for (int m = f->rows[c]; m < AMX_ROWS; m++) memset(f->t[c][m], 0, AMX_COLSB);
}

/* fp32 with subnormals read as zero (DAZ), and results flushed (FTZ). */
static inline float vitc__amx_daz(float x) {
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}
static inline float vitc__amx_bf16(uint16_t h) { return vitc__amx_daz(vitc__bf16_to_f(h)); }

void vitc__amx_emu_dpbf16ps(int c, int a, int b) {
    vitc__amx_file *f = vitc__amx_dp_check(c, a, b);
    if (!f) return;
    const int K = f->colsb[a] / 4, N = f->colsb[c] / 4;
    for (int m = 0; m < f->rows[c]; m++) {
        uint8_t *cr = f->t[c][m];
        float even[AMX_COLSB / 4] = {0}, odd[AMX_COLSB / 4] = {0}; /* temp1 */
        for (int k = 0; k < K; k++) {
            uint32_t x = vitc__amx_word(f->t[a][m], k);
            float x0 = vitc__amx_bf16((uint16_t)x), x1 = vitc__amx_bf16((uint16_t)(x >> 16));
            for (int n = 0; n < N; n++) {
                uint32_t y = vitc__amx_word(f->t[b][k], n);
                /* FMA, one rounding (the product of two bf16 is exact in
                 * fp32 unless it underflows: fmaf keeps it exact) */
                even[n] = vitc__amx_daz(fmaf(x0, vitc__amx_bf16((uint16_t)y), even[n]));
                odd[n] = vitc__amx_daz(fmaf(x1, vitc__amx_bf16((uint16_t)(y >> 16)), odd[n]));
            }
        }
        for (int n = 0; n < N; n++) {
            float d;
            memcpy(&d, cr + 4 * n, 4);
            d = vitc__amx_daz(vitc__amx_daz(d) + vitc__amx_daz(even[n] + odd[n]));
            memcpy(cr + 4 * n, &d, 4);
        }
        memset(cr + 4 * N, 0, AMX_COLSB - 4 * (size_t)N);
    }
    for (int m = f->rows[c]; m < AMX_ROWS; m++) memset(f->t[c][m], 0, AMX_COLSB);
}

/* ---- the kernels on the emulation ---------------------------------------- */

#define AMX_CFG(p) vitc__amx_emu_loadconfig(p)
#define AMX_RELEASE() vitc__amx_emu_release()
#define AMX_ZERO(t) vitc__amx_emu_zero(t)
#define AMX_LOAD(t, base, stride) vitc__amx_emu_load(t, base, stride)
#define AMX_STORE(t, base, stride) vitc__amx_emu_store(t, base, stride)
#define AMX_DPBF16(c, a, b) vitc__amx_emu_dpbf16ps(c, a, b)
#define AMX_DPBUSD(c, a, b) vitc__amx_emu_dpbusd(c, a, b)
#define AMX_EPI vitc__lp_epi_ref
#define AMX_SFX amx_emul

#include "gemm_lp_amx_tmpl.h"

/* Portable: the reference's converters (row NULL: the driver's fallback),
 * its epilogue, and GELU after the tile (fused_gelu 0). */
const vitc__lp_kernel vitc__lp_bf16_amx_emul = {
    "amx-emulated", vitc__ukr_bf16_amx_emul, NULL, NULL, NULL, NULL, 0, AMX_MR, AMX_KW,
    vitc__amx_begin_amx_emul, vitc__amx_end_amx_emul, 0, NULL, NULL, NULL, 0, 0};
const vitc__lp_kernel vitc__lp_int8_amx_emul = {
    "amx-emulated", vitc__ukr_int8_amx_emul, NULL, NULL, NULL, NULL, 0, AMX_MR, AMX_KW,
    vitc__amx_begin_amx_emul, vitc__amx_end_amx_emul, 0, NULL, NULL, NULL, 0, 0};
