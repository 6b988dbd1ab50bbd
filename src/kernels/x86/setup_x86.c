/*
 * setup_x86.c — the avx2 and avx512 paths' kernel tables: each is handed a
 * copy of the generic table (dispatch.c) and overrides the kernels it has
 * its own version of. Compiled without ISA flags: it only takes addresses.
 */
#include "../attention_impl.h"
#include "../gemm_ukernels.h"
#include "../ops_simd.h"

void vitc__kernels_setup_avx2(vitc__kernels *t) {
    t->softmax_rows = vitc__softmax_rows_avx2;
    t->softmax_rows_exp2 = vitc__softmax_rows_exp2_avx2;
    t->softmax_cols = vitc__softmax_cols_avx2;
    t->softmax_rows_backward = vitc__softmax_rows_backward_avx2;
    t->layernorm = vitc__layernorm_avx2;
    t->gelu = vitc__gelu_avx2;
    t->gelu_to = vitc__gelu_to_avx2;
    t->quick_gelu = vitc__quick_gelu_avx2;
    t->tanh_gelu = vitc__tanh_gelu_avx2;
    /* the AVX2 int8 kernels' epilogue GELU is gelu_to's and quick_gelu's */
    t->lp_fused_gelu = 1;
    t->scale_add = vitc__scale_add_avx2;
    t->row_stats = vitc__row_stats_avx2;
    t->dot_rows = vitc__dot_rows_avx2;
    t->row_norm = vitc__row_norm_avx2;
    t->gelu_backward = vitc__gelu_backward_avx2;
    t->layernorm_backward_row = vitc__layernorm_backward_row_avx2;
    t->colsum = vitc__colsum_avx2;
    t->layernorm_backward_cols = vitc__layernorm_backward_cols_avx2;
    t->adamw = vitc__adamw_avx2;
    t->attn_rows = vitc__attn_rows_avx2;
    t->attn_bwd = vitc__attn_bwd_avx2;
    t->gemm = &vitc__gemm_kernel_avx2;
    /* the built-in GEMM here too: on a Zen 3 (AVX2, no AVX-512) ViT-B/16
     * fp32 ran 1.3x (batch 1) and 1.2x (batch 8) faster than on OpenBLAS */
    t->gemm_builtin_default = 1;
    t->lp_family = VITC__LP_FAMILY_AVXVNNI;
}

void vitc__kernels_setup_avx512(vitc__kernels *t) {
    t->softmax_rows = vitc__softmax_rows_avx512;
    t->softmax_rows_exp2 = vitc__softmax_rows_exp2_avx512;
    t->softmax_cols = vitc__softmax_cols_avx512;
    t->softmax_rows_backward = vitc__softmax_rows_backward_avx512;
    t->layernorm = vitc__layernorm_avx512;
    t->gelu = vitc__gelu_avx512;
    t->gelu_to = vitc__gelu_to_avx512;
    t->quick_gelu = vitc__quick_gelu_avx512;
    t->tanh_gelu = vitc__tanh_gelu_avx512;
    t->scale_add = vitc__scale_add_avx512;
    t->row_stats = vitc__row_stats_avx512;
    t->dot_rows = vitc__dot_rows_avx512;
    t->row_norm = vitc__row_norm_avx512;
    t->gelu_backward = vitc__gelu_backward_avx512;
    t->layernorm_backward_row = vitc__layernorm_backward_row_avx512;
    t->colsum = vitc__colsum_avx512;
    t->layernorm_backward_cols = vitc__layernorm_backward_cols_avx512;
    t->adamw = vitc__adamw_avx512;
    t->attn_rows = vitc__attn_rows_avx512;
    t->attn_bwd = vitc__attn_bwd_avx512;
    t->gemm = &vitc__gemm_kernel_avx512;
    /* the built-in GEMM measured faster than OpenBLAS here (gemm.c) */
    t->gemm_builtin_default = 1;
    t->lp_fused_gelu = 1;
    t->lp_family = VITC__LP_FAMILY_AVX512;
}
