/*
 * gemm_ukernels.h — what the built-in GEMM driver (gemm.c) needs from the
 * per-ISA files (x86/gemm_avx512.c, x86/gemm_avx2.c). Private to those three files.
 *
 * Packed layouts (Goto/BLIS): an A panel is ceil(mc/MR) strips, each
 * [kc][MR] (column k of MR rows contiguous); a B panel is ceil(nc/NR) strips,
 * each [kc][NR]. Rows and columns past the matrix edge are packed as zeros,
 * so the microkernel always runs full MR x NR tiles and only the store is
 * clipped to mr x nr.
 */
#ifndef VITC_GEMM_UKERNELS_H
#define VITC_GEMM_UKERNELS_H

#include "kernels.h"

/* The epilogue of one output tile, applied on the first K block only:
 *   C = alpha * acc + beta * C + bias[j] + res[i, j]
 * and on later K blocks C += alpha * acc (first = 0). beta == 0 never reads C.
 * bias and res already point at the tile's first column / element.
 * gelu (only for a kernel with a gelu below, and only on the last K block):
 * then C = GELU(C) before the store, bitwise that kernel's gelu on the
 * stored tile. */
typedef struct vitc__gemm_epi {
    float alpha, beta;
    int first;
    const float *bias; /* [nr] or NULL */
    const float *res;  /* [mr, ldr] or NULL */
    int64_t ldr;
    int gelu;
    /* pf_lines 64-byte lines from pf to ask into L2 during the k loop,
     * spread over its steps (NULL, 0: none): a weight micro-panel read
     * soon, in shares over the strips that use the current one (gemm.c). */
    const char *pf;
    int64_t pf_lines;
    /* ls (only for a kernel with ls set, and only on the last K block):
     * then C = lres[i, j] + ls[j] * C, the product rounded first (no FMA),
     * bitwise vitc__scale_add on the stored tile. ls [nr], lres [mr, ldlr]
     * or NULL. A layer scale (DINOv2's) then costs no pass of its own. */
    const float *ls, *lres;
    int64_t ldlr;
} vitc__gemm_epi;

/* Lines of e->pf a kernel asks for each k step: all pfn over the kc steps
 * (a single strip's share is the whole next micro-panel, 2 kc lines). */
#define VITC_PF_STEP(pfn, kc) ((kc) > 0 ? ((pfn) + (kc) - 1) / (kc) : 0)

/* C[mr, nr] (row stride ldc) from packed pa [kc][MR] and pb [kc][NR]. */
typedef void (*vitc__gemm_ukr_fn)(int64_t kc, const float *pa, const float *pb, float *C,
                                  int64_t ldc, int64_t mr, int64_t nr, const vitc__gemm_epi *e);
/* Packs op(B)[k0:k0+kc, j0:j0+nc] into strips of NR (zero padded); op(B)(k,j)
 * is B[k*ldb + j], or B[j*ldb + k] when trans. */
typedef void (*vitc__gemm_packb_fn)(float *pb, const float *B, int64_t ldb, int trans, int64_t k0,
                                    int64_t kc, int64_t j0, int64_t nc);

/* Packs op(A)[i0:i0+mc, k0:k0+kc] into strips of MR (zero padded); op(A)(i,k)
 * is A[i*lda + k], or A[k*lda + i] when trans. With trans, asum (NULL or
 * [mc]) gets asum[r] += op(A)(i0 + r, k) for k ascending, from the values
 * being packed (gemm.c's vitc__gemm_tn_asum); NULL when not trans. */
typedef void (*vitc__gemm_packa_fn)(float *pa, const float *A, int64_t lda, int trans, int64_t i0,
                                    int64_t mc, int64_t k0, int64_t kc, float *asum);

/* The microkernel reading A and B in place: element (r, k) of the tile's A
 * at A[k * a_ks + r * a_rs] (a row-major A: a_ks = 1, a_rs = lda; a
 * transposed one: a_ks = lda, a_rs = 1), row k of B's nr columns at
 * B + k * b_ks (a packed strip: b_ks = NR). Rows from mr to MR are never
 * stored; the kernel reads row 0 for them and masks B's columns past nr, so
 * nothing past the matrices is touched. Same FMAs in the same order as ukr
 * on packed panels: the result is bitwise the packed one. */
typedef void (*vitc__gemm_ukr_st_fn)(int64_t kc, const float *A, int64_t a_ks, int64_t a_rs,
                                     const float *B, int64_t b_ks, float *C, int64_t ldc,
                                     int64_t mr, int64_t nr, const vitc__gemm_epi *e);

typedef struct vitc__gemm_kernel {
    int mr, nr;
    int64_t kc, mc, nc; /* cache blocks: kc and mc fit L1/L2, nc the B panel */
    vitc__gemm_ukr_fn ukr;
    vitc__gemm_packb_fn packb; /* NULL: the portable packer */
    vitc__gemm_packa_fn packa; /* NULL: the portable packer */
    /* NULL: A and B are always packed. Else A not transposed with K up to
     * direct_kc is read in place by ukr_st (a 12-row tile of a shallow A
     * sits in L1 anyway, and packing it cost ~1/3 of the FMA time). */
    vitc__gemm_ukr_st_fn ukr_st;
    int64_t direct_kc;
    /* NULL, or the in-place erf GELU (the arch's kernel-table gelu) that
     * ukr and ukr_st reproduce in registers when epi.gelu is set: fc1's
     * activation then costs no pass over the stored output. */
    void (*gelu)(float *x, int64_t n);
    int ls; /* ukr and ukr_st apply epi.ls */
} vitc__gemm_kernel;

extern const vitc__gemm_kernel vitc__gemm_kernel_avx512;
extern const vitc__gemm_kernel vitc__gemm_kernel_generic;
extern const vitc__gemm_kernel vitc__gemm_kernel_avx2;

/* Portable A packer (any MR), used by the ISA files for edges. */
void vitc__gemm_packa_generic(float *pa, int mr, const float *A, int64_t lda, int trans, int64_t i0,
                              int64_t mc, int64_t k0, int64_t kc, float *asum);
/* Portable B packer (any NR), used by the ISA files for edges. */
void vitc__gemm_packb_generic(float *pb, int nr, const float *B, int64_t ldb, int trans,
                              int64_t k0, int64_t kc, int64_t j0, int64_t nc);

/* The epilogue from a tile kept in memory, acc [mr, ldacc]: edge tiles. */
void vitc__gemm_epilogue_tile(float *C, int64_t ldc, const float *acc, int64_t ldacc, int64_t mr,
                              int64_t nr, const vitc__gemm_epi *e);

#endif
