/* attention_generic.c — the tiled attention kernels in portable C: the same
 * algorithm and blocking as the SIMD paths with a one-lane "vector", for
 * machines without AVX2 (and as a readable twin of the fast paths). */
#include <string.h>

#include "attention_impl.h"
#include "vmath_generic.h"

#define MR_S 4
#define MR_PV 4
#define ATT_SMALL_DV 0
#define NV_PV 4

#define ATT_FN vitc__attn_rows_generic
#include "attention_tmpl.h"

#define ATB_FN vitc__attn_bwd_generic
#include "attention_bwd_tmpl.h"
