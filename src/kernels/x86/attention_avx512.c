/* attention_avx512.c — the tiled attention kernels on AVX-512 (16 lanes):
 * S microkernel 12 rows x 32 keys (24 zmm accumulators), P V microkernel
 * 6 rows x 64 channels (24 accumulators), or 12 rows x 32 on V packed in
 * panels when Dv >= 256. Compiled with -mavx512f etc.;
 * only called after cpuid said yes. The caller has set FTZ/DAZ, which the
 * exponential relies on to return exactly 0 below 2^-126. */
#include "../attention_impl.h"

#include <string.h>

#include "vmath_avx512.h"

#define MR_S 12
#define MR_PV 6
#define ATT_SMALL_DV 16
#define NV_PV 4

#include "attention_t8.h"

#define ATT_FN vitc__attn_rows_avx512
#include "../attention_tmpl.h"

#define ATB_FN vitc__attn_bwd_avx512
#include "../attention_bwd_tmpl.h"
