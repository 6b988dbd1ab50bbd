/*
 * attention_impl.h — what the attention dispatcher (attention.c) shares with
 * its per-ISA kernels (attention_generic.c, x86/attention_avx2.c,
 * x86/attention_avx512.c, all instances of attention_tmpl.h).
 *
 * A call is cut into tasks of Br query rows of one (b, h); each task sweeps
 * the keys in blocks of Bc columns with an online softmax. Both sizes come
 * from the shapes only (never from the thread count), and every output row
 * is computed by one task with a fixed key order, so the result does not
 * depend on how tasks are spread over threads.
 */
#ifndef VITC_ATTENTION_IMPL_H
#define VITC_ATTENTION_IMPL_H

#include <stdint.h>

#include "kernels.h"

/* Packed K panels are this many key columns wide in every path (a multiple
 * of each ISA's S-microkernel width), so buffer sizes are path-independent. */
#define VITC_ATTN_PANEL 32
/* Dv is padded to this in the packed V and the O accumulator. */
#define VITC_ATTN_DV_ALIGN 16

typedef struct vitc__attn_plan {
    const vitc__sdpa_desc *d;
    int64_t Br;     /* query rows per task (the last task of a head may have fewer) */
    int64_t Bc;     /* key columns per online-softmax step; a multiple of 32 unless nkb == 1 */
    int64_t nqb;    /* query blocks per head: ceil(L / Br) */
    int64_t nkb;    /* key blocks per head: ceil(S / Bc) */
    int64_t Bcp;    /* Bc rounded up to VITC_ATTN_PANEL: S-tile row stride */
    int64_t Dvp;    /* Dv rounded up to VITC_ATTN_DV_ALIGN */
    int64_t kv_cols; /* key columns the packed K/V buffers hold: S padded (whole head) or Bcp */
    int whole_head; /* 1: K/V of a head stay packed for every task of that head on a thread */
    uint64_t gen;   /* unique per call: tags the packed K/V a thread may reuse */
    float qscale;   /* scale * log2(e), folded into Q while packing it */
} vitc__attn_plan;

/* One thread's working memory; views carved out of one grow-only buffer. */
typedef struct vitc__attn_ws {
    float *qp;   /* [Br, D]  query block, times qscale */
    float *st;   /* [Br, Bcp] scores, then probabilities, of one key block */
    float *ot;   /* [Br, Dvp] unnormalised output accumulator */
    float *mrow; /* [Br] running max (log2 domain) */
    float *lrow; /* [Br] running sum of exp2 */
    float *arow; /* [Br] per-block rescale factor */
    float *orow; /* [Br] the output's 1/l (NaN for a row without a finite score) */
    float *kt;   /* [kv_cols / NR][D][NR] K transposed in NR-column panels */
    float *vp;   /* [kv_cols, Dvp] V rows, zero padded; with Dv >= 256 on a whole-head
                    plan [Dv / panel][kv_cols][panel] column panels (attention_tmpl.h) */
    /* Which head's K/V kt/vp hold (whole_head plans): gen 0 = nothing. */
    uint64_t kv_gen;
    int64_t kv_b, kv_h, kv_done; /* kv_done: key blocks packed so far */
} vitc__attn_ws;

/* Bytes of scratch each thread holds for a call with this descriptor (for
 * benchmarks and memory budgets; 0 when the call needs none). */
size_t vitc__sdpa_scratch_bytes(const vitc__sdpa_desc *d);

/* Rows [l0, l1) of head (b, h). */
typedef void (*vitc__attn_rows_fn)(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b,
                                   int64_t h, int64_t l0, int64_t l1);

void vitc__attn_rows_generic(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b, int64_t h,
                             int64_t l0, int64_t l1);
void vitc__attn_rows_avx2(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b, int64_t h,
                          int64_t l0, int64_t l1);
void vitc__attn_rows_avx512(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b, int64_t h,
                            int64_t l0, int64_t l1);

/* The vitc__sdpa_desc.prec BF16 and INT8 paths (attention_lp.c) with the
 * GEMM kernel kn of that precision (NULL: the one this CPU runs; tests
 * pass the reference to compare bit for bit; an int8 kn takes [kg][MR] A
 * strips, not AMX's). S > 0 and the sizes already
 * checked. */
struct vitc__lp_kernel;
vitc_status vitc__sdpa_lp(const vitc__sdpa_desc *d, const struct vitc__lp_kernel *kn);

/* ---- backward --------------------------------------------------------- */

enum { VITC_ATTN_BWD_DKV = 1, VITC_ATTN_BWD_DQ = 2 };

/* Block sizes of the backward; like the forward's, functions of the shapes
 * only. One task walks key blocks of Bc (its dK, dV accumulate in scratch)
 * and, inside, query blocks of Br (dQ accumulates over key blocks). */
typedef struct vitc__attn_bwd_plan {
    const vitc__sdpa_bwd_desc *d;
    const vitc__sdpa_rel_grad *rg; /* NULL: no relative-position gradients */
    int64_t Bc;       /* keys per block: a multiple of every path's S-microkernel rows */
    int64_t Br;       /* query rows per block: a multiple of 32 (two AVX-512 vectors) */
    int64_t ldt;      /* row stride of the [Bc, Br] tiles: Br + 16, so the dQ product's
                         column walk does not land its lines in a few L1 sets */
    int64_t Dp, Dvp;  /* D, Dv rounded up to 16: the scratch's sizes (a path pads to its vectors) */
    int64_t rows_max; /* most query rows one task packs */
    int split;        /* 0: a task is a whole head; 1: key chunks, then query chunks */
    int64_t kchunk, qchunk; /* split: keys / query rows per task */
    float qscale;     /* scale * log2(e) */
} vitc__attn_bwd_plan;

/* A task's views into its scratch (vitc__attn_bwd_carve). Rows are those of
 * the task's query range, padded to Lp = rows rounded up to 32. */
typedef struct vitc__attn_bwd_ws {
    float *qt;   /* [Lp/BRG][D][BRG]  Q^T times scale*log2(e), in panels of
                    BRG = 2 vectors of rows (attention_bwd_tmpl.h) */
    float *dot;  /* [Lp/BRG][Dv][BRG] dO^T, the same panels */
    float *qr;   /* [Lp, Dp]  Q rows, zero padded */
    float *dor;  /* [Lp, Dvp] dO rows, zero padded */
    float *dq;   /* [Lp, Dp]  dQ accumulator, without the final scale */
    float *kr;   /* [Bc, Dp]  K rows of one key block, zero padded */
    float *dk;   /* [Bc, Dp]  dK accumulator of the key block */
    float *dv;   /* [Bc, Dvp] dV accumulator of the key block */
    float *pt;   /* [Bc, ldt] P^T tile */
    float *dst;  /* [Bc, ldt] dS^T tile */
    float *lse2; /* [Lp] lse * log2(e); +inf on padding rows, so their P is 0 */
    float *dd;   /* [Lp] D_i = rowsum(dO * O); 0 on padding rows */
    int64_t Lp;
} vitc__attn_bwd_ws;

/* Scratch floats for a task of rows query rows (0 on overflow), and the
 * views into buf. */
size_t vitc__attn_bwd_need(const vitc__attn_bwd_plan *p, int64_t rows);
void vitc__attn_bwd_carve(const vitc__attn_bwd_plan *p, int64_t rows, float *buf,
                          vitc__attn_bwd_ws *ws);
/* Bytes of scratch one thread holds for a backward call (0: none). */
size_t vitc__sdpa_backward_scratch_bytes(const vitc__sdpa_bwd_desc *d);

typedef void (*vitc__attn_bwd_fn)(const vitc__attn_bwd_plan *p, float *scratch, int64_t b,
                                  int64_t h, int64_t l0, int64_t l1, int64_t s0, int64_t s1,
                                  int what);
void vitc__attn_bwd_generic(const vitc__attn_bwd_plan *p, float *scratch, int64_t b, int64_t h,
                            int64_t l0, int64_t l1, int64_t s0, int64_t s1, int what);
void vitc__attn_bwd_avx2(const vitc__attn_bwd_plan *p, float *scratch, int64_t b, int64_t h,
                         int64_t l0, int64_t l1, int64_t s0, int64_t s1, int what);
void vitc__attn_bwd_avx512(const vitc__attn_bwd_plan *p, float *scratch, int64_t b, int64_t h,
                           int64_t l0, int64_t l1, int64_t s0, int64_t s1, int what);

#endif
