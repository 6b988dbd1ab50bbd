/*
 * gemm_lp_amx.c — the AMX microkernels of gemm_lp_amx_tmpl.h on the real
 * tile instructions. Built with -mamx-tile -mamx-bf16 -mamx-int8 (Makefile,
 * this file only); chosen by dispatch.c only where vitc__amx_usable() (a
 * Sapphire Rapids or later CPU, and the OS's permission for tile data).
 * The epilogue is the AVX-512 kernels' (AMX CPUs have AVX-512), GELU fused;
 * the activation converters and the attention's row-major kernel are the
 * AVX-512 ones (the same words and bits).
 */
#include <immintrin.h>

#include "../gemm_lp.h"

#define AMX_CFG(p) _tile_loadconfig(p)
#define AMX_RELEASE() _tile_release()
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define AMX_EPI vitc__lp_epi_avx512
#define AMX_SFX amx

#include "../gemm_lp_amx_tmpl.h"

const vitc__lp_kernel vitc__lp_bf16_amx = {
    "amx-bf16", vitc__ukr_bf16_amx, vitc__row_bf16_avx512, vitc__strip_bf16_avx512,
    vitc__ukr_bf16_rm_avx512, vitc__pairs_bf16_avx512, 1, AMX_MR, AMX_KW,
    vitc__amx_begin_amx, vitc__amx_end_amx, 0, NULL, NULL, NULL, 0, 0};
const vitc__lp_kernel vitc__lp_int8_amx = {
    "amx-int8", vitc__ukr_int8_amx, vitc__row_int8_avx512, vitc__strip_int8_avx512, NULL, NULL,
    1, AMX_MR, AMX_KW, vitc__amx_begin_amx, vitc__amx_end_amx, 0, NULL, NULL, NULL, 0, 0};
