/*
 * attention_common_tmpl.h — the pieces the forward (attention_tmpl.h) and
 * backward (attention_bwd_tmpl.h) attention templates share, written once
 * over the vector vocabulary of vmath_*.h. Included by both templates; the
 * guard keeps it to one copy per translation unit (one ISA). Uses MR_S,
 * MR_PV and NV_PV from the including file.
 */
#ifndef VITC_ATTENTION_COMMON_TMPL_H
#define VITC_ATTENTION_COMMON_TMPL_H

#ifndef ATT_UNROLL
#define ATT_UNROLL _Pragma("GCC unroll 16")
#endif

static const float att_log2e = 1.44269504088896340736f;

#define ATT_PW (2 * VW) /* panel width: keys (forward K^T) or query rows (backward) */

/* Rows [0, n) of src (row stride lds, wdt columns) into panels of ATT_PW
 * rows, dst [Lp / ATT_PW][wdt][ATT_PW]: element (r, c) at (r / ATT_PW) wdt
 * ATT_PW + c ATT_PW + r % ATT_PW; rows n..Lp are zero, so no NaN leaks from
 * them. A microkernel then reads one panel as a contiguous block. (Plain
 * [wdt][Lp] rows would put the lines it reads 4 Lp bytes apart, a multiple
 * of 4 KB for long rows: all in one L1 set.) */
static void att_pack_panels(const float *src, int64_t lds, int64_t n, int64_t wdt, int64_t Lp,
                            float *dst) {
    for (int64_t p0 = 0; p0 < Lp; p0 += ATT_PW) {
        float *panel = dst + p0 * wdt; /* [wdt][ATT_PW] */
        const int64_t rows = n - p0 >= ATT_PW ? ATT_PW : (n > p0 ? n - p0 : 0);
        /* A part panel is zeroed first in whole vectors: its zero rows
         * one float at a time, strided, cost more than the transpose (a
         * ViT head's last panel has 5 keys of 32). */
        if (rows < ATT_PW)
            for (int64_t i = 0; i < wdt * ATT_PW; i += VW) v_storeu(panel + i, v_zero());
        int64_t rr = 0;
#ifdef ATT_HAVE_T8
        /* 8 x 8 register transposes: a scalar transpose costs as much as
         * the math at ViT sizes. */
        for (; rr + 8 <= rows; rr += 8) {
            const float *sr = src + (p0 + rr) * lds;
            int64_t c = 0;
            for (; c + 8 <= wdt; c += 8) att_transpose8(sr + c, lds, panel + c * ATT_PW + rr, ATT_PW);
            for (; c < wdt; c++)
                for (int64_t i = 0; i < 8; i++) panel[c * ATT_PW + rr + i] = sr[i * lds + c];
        }
#endif
        for (; rr < rows; rr++)
            for (int64_t c = 0; c < wdt; c++) panel[c * ATT_PW + rr] = src[(p0 + rr) * lds + c];
    }
}

/* Asks for rows [0, n) of a head (ld apart, w floats each) to be brought
 * into L2. A task prefetches the same head of the next image: the heads
 * of one image share their rows' cache lines, so the next image's are the
 * ones that come from memory, and they are needed H tasks later (the
 * hardware prefetcher does not follow a head's short strided rows). Only
 * while an image's rows (all heads: floats, summed over tensors) fit in
 * a fraction of L2, or they would evict each other before their turn. */
#define ATT_PREFETCH_MAX_FLOATS ((int64_t)32 << 10)
static inline void att_prefetch_rows(const float *p, int64_t ld, int64_t n, int64_t w) {
    for (int64_t r = 0; r < n; r++) {
        const float *row = p + r * ld;
        for (int64_t c = 0; c < w; c += 16) __builtin_prefetch(row + c, 0, 2);
        __builtin_prefetch(row + w - 1, 0, 2);
        /* Prefetches are no side effect to C11's loop rules: without this
         * empty statement GCC deletes the loop as doing nothing. */
        __asm__ __volatile__("" : : "r"(row));
    }
}

/* dst[0:n] = src[0:n] and dst[n:np] = 0 (np >= n, a multiple of VW):
 * one row of a head padded to whole vectors, in vector moves rather than
 * libc calls that cost more than the copy at 24 floats. */
static inline void att_copy_pad(float *dst, const float *src, int64_t n, int64_t np) {
    int64_t c = 0;
    for (; c + VW <= n; c += VW) v_storeu(dst + c, v_loadu(src + c));
    for (; c < np; c += VW) v_storeu(dst + c, n > c ? v_loadu_n(src + c, (int)(n - c)) : v_zero());
}

/* dst[0:n] = src[0:n], nothing past n written. */
static inline void att_copy(float *dst, const float *src, int64_t n) {
    int64_t c = 0;
    for (; c + VW <= n; c += VW) v_storeu(dst + c, v_loadu(src + c));
    if (c < n) v_storeu_n(dst + c, v_loadu_n(src + c, (int)(n - c)), (int)(n - c));
}

/* The two register tiles every attention product runs, forward and
 * backward; the callers differ only in how they start and what they do with
 * the sums, so those stay with them. Always inlined with constant mr, nv
 * and half, the accumulator arrays stay in registers.
 *
 * att_tile2: a0[r] (and a1[r] unless half) = sum_{c < K} a[r lda + c] *
 * b[c ldb + 0:VW] (VW:2VW), r < mr <= MR_S: MR_S rows of scalars broadcast
 * against two vectors of a panel row (MR_S x 2 VW). */
static inline __attribute__((always_inline)) void att_tile2(int mr, int half, int64_t K,
                                                            const float *a, /* [mr, lda] */
                                                            int64_t lda,
                                                            const float *b, /* [K, ldb] */
                                                            int64_t ldb, VT *a0, /* [MR_S] */
                                                            VT *a1 /* [MR_S] */) {
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mr) {
            a0[r] = v_zero();
            a1[r] = v_zero();
        }
    for (int64_t c = 0; c < K; c++) {
        VT b0 = v_load(b + c * ldb);
        VT b1 = half ? b0 : v_load(b + c * ldb + VW);
        ATT_UNROLL
        for (int r = 0; r < MR_S; r++)
            if (r < mr) {
                VT x = v_set1(a[r * lda + c]);
                a0[r] = v_fma(x, b0, a0[r]);
                if (!half) a1[r] = v_fma(x, b1, a1[r]);
            }
    }
}

/* att_tile_rv: acc[r][x] += sum_{k < nk} a[r ars + k aks] b[k ldb + x VW],
 * r < mr <= MR_PV, x < nv <= NV_PV: MR_PV rows of scalars broadcast against
 * nv vectors of b's rows (b need not be aligned: P V reads the caller's V). */
static inline __attribute__((always_inline)) void att_tile_rv(int mr, int nv, int64_t nk,
                                                              const float *a, int64_t ars,
                                                              int64_t aks,
                                                              const float *b, /* [nk, ldb] */
                                                              int64_t ldb,
                                                              VT acc[MR_PV][NV_PV]) {
    for (int64_t k = 0; k < nk; k++) {
        VT bv[NV_PV];
        ATT_UNROLL
        for (int x = 0; x < NV_PV; x++)
            if (x < nv) bv[x] = v_loadu(b + k * ldb + x * VW);
        ATT_UNROLL
        for (int r = 0; r < MR_PV; r++)
            if (r < mr) {
                VT s = v_set1(a[r * ars + k * aks]);
                ATT_UNROLL
                for (int x = 0; x < NV_PV; x++)
                    if (x < nv) acc[r][x] = v_fma(s, bv[x], acc[r][x]);
            }
    }
}

/* The rows of the next microkernel call with left rows to go: mr, but the
 * last two calls share fewer than 2 mr rows evenly (a 50-token head on 6
 * rows: 6 x 7 + 4 + 4, not 6 x 8 + 2, whose 2-row call kept too few
 * accumulators to hide the FMA latency). Each output's sum is the same
 * however rows are grouped: the same bits. */
static inline int64_t att_rows(int64_t left, int64_t mr) {
    return left <= mr ? left : left < 2 * mr ? (left + 1) / 2 : mr;
}

/* ATT_MRS_CASES(C): C(1) ... C(MR_S), the cases of a switch that turns a
 * run-time row count of an MR_S-row microkernel into a compile-time one. */
#if MR_S > 6
#define ATT_MRS_CASES(C) C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12)
#elif MR_S > 4
#define ATT_MRS_CASES(C) C(1) C(2) C(3) C(4) C(5) C(6)
#else
#define ATT_MRS_CASES(C) C(1) C(2) C(3) C(4)
#endif

/* ATT_MR_NV_SWITCH(CALL): the body of a *_rows dispatcher of an
 * MR_PV x NV_PV microkernel, switching the run-time (mr, nv) onto the
 * compile-time CALL(m, n) (a macro of the including function). The nv that
 * is < NV_PV happens once per row group at the right edge of the columns. */
#if NV_PV == 4
#define ATT_NV_SWITCH(CALL, m)        \
    switch (nv) {                     \
    case 1: CALL(m, 1); break;        \
    case 2: CALL(m, 2); break;        \
    case 3: CALL(m, 3); break;        \
    default: CALL(m, 4); break;       \
    }
#elif NV_PV == 2
#define ATT_NV_SWITCH(CALL, m)        \
    switch (nv) {                     \
    case 1: CALL(m, 1); break;        \
    default: CALL(m, 2); break;       \
    }
#else
#define ATT_NV_SWITCH(CALL, m) CALL(m, NV_PV);
#endif
#define ATT_MR_CASE(CALL, m) case m: ATT_NV_SWITCH(CALL, m) break;
#if MR_PV >= 2
#define ATT_MR_CASE2(CALL) ATT_MR_CASE(CALL, 2)
#else
#define ATT_MR_CASE2(CALL)
#endif
#if MR_PV >= 3
#define ATT_MR_CASE3(CALL) ATT_MR_CASE(CALL, 3)
#else
#define ATT_MR_CASE3(CALL)
#endif
#if MR_PV >= 4
#define ATT_MR_CASE4(CALL) ATT_MR_CASE(CALL, 4)
#else
#define ATT_MR_CASE4(CALL)
#endif
#if MR_PV >= 5
#define ATT_MR_CASE5(CALL) ATT_MR_CASE(CALL, 5)
#else
#define ATT_MR_CASE5(CALL)
#endif
#if MR_PV >= 6
#define ATT_MR_CASE6(CALL) ATT_MR_CASE(CALL, 6)
#else
#define ATT_MR_CASE6(CALL)
#endif
#define ATT_MR_NV_SWITCH(CALL)                                                         \
    switch (mr) {                                                                      \
        ATT_MR_CASE(CALL, 1)                                                           \
        ATT_MR_CASE2(CALL) ATT_MR_CASE3(CALL) ATT_MR_CASE4(CALL) ATT_MR_CASE5(CALL)    \
        ATT_MR_CASE6(CALL)                                                             \
    default: break;                                                                    \
    }

#endif /* VITC_ATTENTION_COMMON_TMPL_H */
