/* attention_avx2.c — the tiled attention kernels on AVX2+FMA (8 lanes):
 * S microkernel 6 rows x 16 keys, P V microkernel 6 rows x 16 channels
 * (12 ymm accumulators each, the shape of BLIS's Haswell sgemm). */
#include "../attention_impl.h"

#include <string.h>

#include "vmath_avx2.h"

#define MR_S 6
#define MR_PV 6
#define ATT_SMALL_DV 8
#define NV_PV 2

#include "attention_t8.h"

#define ATT_FN vitc__attn_rows_avx2
#include "../attention_tmpl.h"

#define ATB_FN vitc__attn_bwd_avx2
#include "../attention_bwd_tmpl.h"
