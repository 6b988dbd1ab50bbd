/*
 * kernels.h — the compute seam of libvitc. Layers and models call only these;
 * each has a plain reference version (kept forever, the ground truth for the
 * fast ones) and SIMD versions chosen at run time (VITC_ARCH forces a path).
 *
 * Argument order: outputs, then inputs, then sizes. Row-major float32.
 */
#ifndef VITC_KERNELS_H
#define VITC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

/* ---- thread pool (pool.c) ---------------------------------------- */

/* fn(ctx, i, tid) for every i in [0, n), spread over the pool's threads
 * (tid < vitc__num_threads()). A call made from inside a pool task runs
 * serially on the calling thread, so kernels may nest freely. */
typedef void (*vitc__task_fn)(void *ctx, int64_t i, int tid);
void vitc__parallel_for(int64_t n, vitc__task_fn fn, void *ctx);
/* Wakes the pool's sleeping workers ahead of a region: a caller about to
 * run regions after a serial stretch longer than the workers' spin (a
 * prompt after Python's part) lets their wake-up (~0.1 ms on a VM) overlap
 * its serial work. Returns at once; nothing if none sleeps. */
void vitc__pool_prewake(void);
int vitc__num_threads(void);
int vitc__in_parallel(void); /* 1 inside a pool task */
/* Same partition, one call per thread: fn(ctx, begin, end, tid) gets thread
 * tid's contiguous share [begin, end) of [0, n) (nested: all of it). */
typedef void (*vitc__range_fn)(void *ctx, int64_t begin, int64_t end, int tid);
void vitc__parallel_range(int64_t n, vitc__range_fn fn, void *ctx);
/* fn(ctx, i, tid) for every i in [0, n) like vitc__parallel_for, but the
 * threads claim grain consecutive indices at a time from a counter as they
 * come free, so a thread that starts late (waking, or its core taken)
 * leaves its share to the others. Which thread runs an index depends on
 * timing: fn must compute each index the same way on any thread. */
void vitc__parallel_for_dynamic(int64_t n, int64_t grain, vitc__task_fn fn, void *ctx);
/* The GEMMs' chunks of columns (or rows), claimed from a counter as
 * threads come free: [vitc__chunk_at(c, i), vitc__chunk_at(c, i + 1)) for
 * i < n. Guided at the end: a chunk is at most the share of what is left
 * that gives each of nparts threads two more (rounded up to a multiple of
 * unit), so the last ones are small and the threads finish together; whole
 * chunks had left one thread idle for up to a chunk at the end of each
 * product (ViT-B at batch 8: 1% of the int8 forward's thread time, 1% of
 * fp32's at batch 1). Past VITC_CHUNKS_MAX chunks (hundreds of threads):
 * whole chunks to the end. */
#define VITC_CHUNKS_MAX 256
typedef struct vitc__chunks {
    int64_t total, chunk, n;
    int guided;
    int64_t bound[VITC_CHUNKS_MAX + 1];
} vitc__chunks;
void vitc__chunks_init(vitc__chunks *c, int64_t total, int64_t chunk, int64_t unit, int nparts);
static inline int64_t vitc__chunk_at(const vitc__chunks *c, int64_t i) {
    if (c->guided) return c->bound[i];
    return i * c->chunk < c->total ? i * c->chunk : c->total;
}
/* Operands packed cooperatively inside a region (the GEMMs' shared op(A)):
 * units (strips) claimed from one counter in the order the threads consume
 * them; pack(ctx, s) packs unit s and returns its block (< VITC_COOP_BLOCKS).
 * vitc__coop_need(co, b, n) returns once block b has n units packed,
 * packing unclaimed units of any block meanwhile rather than wait for a
 * unit another thread is packing (all are needed). Which thread packs a
 * unit depends on timing; the bytes must not. */
#define VITC_COOP_BLOCKS 128
typedef struct vitc__coop {
    _Atomic int64_t next; /* the next unclaimed unit */
    int64_t total;
    int64_t (*pack)(void *ctx, int64_t s);
    void *ctx;
    _Atomic int done[VITC_COOP_BLOCKS]; /* units packed, per block */
} vitc__coop;
void vitc__coop_init(vitc__coop *co, int64_t total, int64_t nblocks,
                     int64_t (*pack)(void *ctx, int64_t s), void *ctx);
void vitc__coop_need(vitc__coop *co, int64_t block, int64_t n);
/* VITC_POOL_STATS=1 (pool.c): per kind of region, where threads wait,
 * printed at exit. A kernel that waits for another thread inside a region
 * times it (vitc__pool_cpu_ns, only when vitc__pool_stats()) and reports
 * it (vitc__pool_note_wait) so that it counts as idle, not work. */
int vitc__pool_stats(void);
int64_t vitc__pool_cpu_ns(void);
void vitc__pool_note_wait(int64_t cpu_ns);

/* ---- run-time dispatch (dispatch.c) ------------------------------ */

/* Every CPU path, in the order of its enum value: X(ID, "name") gives
 * VITC_ARCH_ID and the name VITC_ARCH, vitc_set_arch and vitc_get_arch use.
 * Each build knows them all (a name is never "unknown" on another target);
 * those whose folder was not built (src/kernels/README.md) are never
 * chosen: vitc__cpu_has says no. */
#define VITC_ARCH_LIST(X) X(GENERIC, "generic") X(AVX2, "avx2") X(AVX512, "avx512")

#define VITC__ARCH_ENUM(id, name) VITC_ARCH_##id,
typedef enum vitc__arch { VITC_ARCH_LIST(VITC__ARCH_ENUM) VITC_ARCH_COUNT } vitc__arch;
#undef VITC__ARCH_ENUM
vitc__arch vitc__get_arch(void);
int vitc__cpu_has(vitc__arch a);
/* The name of path a ("generic", ...), NULL outside [0, VITC_ARCH_COUNT). */
const char *vitc__arch_name(int a);

struct vitc__attn_plan;
struct vitc__attn_ws;
struct vitc__attn_bwd_plan;
struct vitc__gemm_kernel;

/* AdamW's per-tensor constants (src/train/optim.c): p = p * shrink -
 * step_size * m / (sqrt(v) / bc2_sqrt + eps), in double. */
typedef struct vitc__adamw_coef {
    double shrink, step_size, b1, b2, eps, bc2_sqrt;
} vitc__adamw_coef;
/* One AdamW update of n elements (vmax NULL unless amsgrad), torch's float32
 * AdamW computed in double per element; the SIMD versions perform the same
 * IEEE operations in the same order, so they are bitwise the reference. */
void vitc__adamw_ref(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                     const vitc__adamw_coef *c);
void vitc__adamw_avx512(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                        const vitc__adamw_coef *c);
void vitc__adamw_avx2(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                      const vitc__adamw_coef *c);

/* The kernels of one CPU path (BLIS's context, stb's setup_*): one table
 * per path in dispatch.c, chosen by vitc__kern() from the arch in use
 * (cpuid, VITC_ARCH, vitc_set_arch). A dispatcher reads the table once per
 * call and passes it down, so one call never mixes paths. Same contracts as
 * the kernels.h functions of the same name. Every table starts as the
 * generic one, the plain reference kernels (vitc__kernels_init_ref); a
 * path's setup then overrides what it has, so no slot is ever empty. */
/* Which low-precision GEMM kernels a path may pick (dispatch.c). */
enum { VITC__LP_FAMILY_NONE = 0, VITC__LP_FAMILY_AVX512 = 1, VITC__LP_FAMILY_AVXVNNI = 2 };
typedef struct vitc__kernels {
    vitc__arch arch;
    const char *name;
    /* Properties of the path, set by its setup. With OpenBLAS in the
     * build, the default GEMM backend is the built-in one where this is 1
     * (it measured faster there), OpenBLAS elsewhere. */
    int gemm_builtin_default;
    /* 1: this path's gelu and quick_gelu are the arithmetic of the
     * low-precision microkernels' in-register ones, so they may fuse them
     * bitwise. */
    int lp_fused_gelu;
    int lp_family; /* VITC__LP_FAMILY_* */
    void (*softmax_rows)(float *x, int64_t rows, int64_t n, float inv_temperature);
    /* The bf16 attention's softmax, unnormalised: x = 2^(x s - max_j x_j s),
     * inv[r] = 1 / the row's sum (s carries log2 e); see ops_tmpl.h. */
    void (*softmax_rows_exp2)(float *x, int64_t rows, int64_t n, float s, float *inv);
    /* softmax(scale x) down each of the L columns of x [n, ld], a lane a
     * column: many short softmaxes side by side (vitc__softmax_cols). */
    void (*softmax_cols)(float *x, int64_t n, int64_t L, int64_t ld, float scale);
    /* stats: NULL or [M, 2], each row's mean and 1 / sqrt(var + eps); y
     * NULL (with stats): the stats alone */
    void (*layernorm)(float *y, const float *x, const float *w, const float *b, int64_t M,
                      int64_t C, float eps, float *stats);
    void (*softmax_rows_backward)(float *dx, const float *y, const float *dy, int64_t rows,
                                  int64_t n, float inv_temperature);
    void (*gelu)(float *x, int64_t n);
    void (*gelu_to)(float *y, const float *x, int64_t n); /* out of place, y may be x */
    /* OpenAI CLIP's quick-GELU, x * sigmoid(1.702 x), in place */
    void (*quick_gelu)(float *x, int64_t n);
    /* SigLIP's tanh-GELU, in place */
    void (*tanh_gelu)(float *x, int64_t n);
    /* y = r + g * y (r NULL: g * y), two roundings as torch's x + ls(y):
     * DINOv2's layer scale and its residual */
    void (*scale_add)(float *y, const float *g, const float *r, int64_t n);
    /* GroupNorm helpers: o[0], o[1] = sum of (x - shift) and of its square,
     * in double; y = (x - mean) * sc + sh. */
    void (*row_stats)(const float *x, int64_t n, double shift, double *o);
    /* y[m ldy + r] = x_r . w_m (x [rows, ldx], w [n, K]): many short dot
     * products, rows side by side (vitc__dot_rows). */
    void (*dot_rows)(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                     int64_t n, int64_t K, int64_t rows);
    void (*row_norm)(float *y, const float *x, int64_t n, float mean, float sc, float sh);
    /* Attention forward rows [l0, l1) of head (b, h) (attention_impl.h). */
    void (*attn_rows)(const struct vitc__attn_plan *p, struct vitc__attn_ws *ws, int64_t b,
                      int64_t h, int64_t l0, int64_t l1);
    /* Attention backward of one head over keys [s0, s1) and query rows
     * [l0, l1); what: VITC_ATTN_BWD_DKV and/or VITC_ATTN_BWD_DQ. */
    void (*attn_bwd)(const struct vitc__attn_bwd_plan *p, float *scratch, int64_t b, int64_t h,
                     int64_t l0, int64_t l1, int64_t s0, int64_t s1, int what);
    /* Backward row ops (ops_backward.c): dx = dy * gelu'(x); one LayerNorm
     * row's dx += given its mean and rstd. */
    void (*gelu_backward)(float *dx, const float *dy, const float *x, int64_t n);
    void (*layernorm_backward_row)(float *dx, const float *dy, const float *x, const float *w,
                                   int64_t C, float mean, float rstd);
    /* Column sums over rows in order, columns [j0, j1): a bias gradient
     * db += sum_i dy[i]; LayerNorm's dw += sum_i dy (x - mean) rstd and
     * db += sum_i dy (stats [M][2] = mean, rstd). */
    void (*colsum)(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0, int64_t j1);
    void (*layernorm_backward_cols)(float *dw, float *db, const float *dy, const float *x,
                                    const float *stats, int64_t M, int64_t C, int64_t j0,
                                    int64_t j1);
    void (*adamw)(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                  const vitc__adamw_coef *c);
    /* The built-in GEMM's microkernel and blocking (gemm_ukernels.h): the
     * path's kernel with its kc, mc, nc derived from this CPU's caches
     * (cpu.c), or forced (VITC_BLOCKING, VITC_CACHE). */
    const struct vitc__gemm_kernel *gemm;
    /* The bf16 / int8 GEMM's blocks (gemm_lp.c), from the same rules: rows
     * of A per block, bytes of weight strips per block. */
    int64_t lp_mc, lp_nb;
    /* The CPU the blocks were derived from (cpu.h: caches, model,
     * datapath), read once. */
    const struct vitc__cpu *cpu;
} vitc__kernels;

/* The table of the arch in use; never NULL. */
const vitc__kernels *vitc__kern(void);
/* Fills t with the generic path's reference kernels (dispatch.c). */
void vitc__kernels_init_ref(vitc__kernels *t);
#if defined(VITC_KERNELS_X86)
/* The x86 paths' overrides (x86/setup_x86.c), over a reference table. */
void vitc__kernels_setup_avx2(vitc__kernels *t);
void vitc__kernels_setup_avx512(vitc__kernels *t);
#endif

/* ---- GEMM (gemm.c) ----------------------------------------------- */

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.
 * A is [M,K] (lda) or, transposed, [K,M]; B is [K,N] (ldb) or [N,K].
 * beta == 0 ignores C's old contents (NaN included). Threads over the pool
 * unless called from inside a pool task. */
void vitc__gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc);
/* Reference: the triple loop, float accumulation. */
void vitc__gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc);
/* C[M,N] = A^T B + beta C (A [K, M], B [K, N]) and asum[i] += sum_k A[k][i]
 * (k ascending, as a loop over A's rows adds them: bitwise), the column
 * sums taken from the GEMM's own packing of A. Returns 0 and does nothing
 * when it cannot (OpenBLAS backend, an empty product): then the caller
 * runs its own GEMM and sums. */
int vitc__gemm_tn_asum(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                       float *asum);
/* Whether the built-in GEMM may read a shallow A unpacked (the kernel's
 * direct_kc, default on). Bitwise the same either way; tests compare. */
void vitc__gemm_set_direct(int on);

/* y[M,N] = x[M,K] @ W[N,K]^T + bias[N] (nn.Linear; bias may be NULL).
 * residual (may be NULL) [M,N] with row stride ldr is added in the epilogue.
 * y has row stride ldy, x row stride ldx. */
void vitc__linear(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W,
                  const float *bias, const float *residual, int64_t ldr, int64_t M, int64_t N,
                  int64_t K);

/* y = x W^T + bias and act = GELU(y) (erf), both kept: the training
 * forward of an MLP's fc1, GELU applied to each tile while it is in L1. */
void vitc__linear_act(float *y, int64_t ldy, float *act, int64_t ld_act, const float *x,
                      int64_t ldx, const float *W, const float *bias, int64_t M, int64_t N,
                      int64_t K);
/* ---- packed weights (gemm.c, gemm_lp.c) --------------------------- */

/* A Linear's weight W [N, K] converted once for y = x W^T:
 *   FP32: op(B) = W^T in the built-in GEMM's panels for kern: KC block pc
 *         (k from pc) at data + pc * npad floats, its ceil(N/NR) strips
 *         [kc][NR] one after another. Used while kern is the arch's kernel
 *         and the backend is builtin; otherwise the row-major W is used.
 *   BF16 / INT8: gemm_lp.h's word strips [kg][32], the only copy needed. */
typedef struct vitc__pweight {
    vitc_precision prec;
    const struct vitc__gemm_kernel *kern; /* FP32: the kernel of the panels */
    int64_t N, K, npad, kg;
    void *data;
    float *wscale; /* INT8: [npad] per output channel */
    int32_t *wsum; /* INT8: [npad] sums of each channel's int8 weights */
    int i16;       /* INT8: words of two int16 k (gemm_lp.h), packed for such a kernel */
    int wmax;      /* INT8: the weights' range [-wmax, wmax] (127, or 64: gemm_lp.h) */
} vitc__pweight;

/* Packs W [N, K] for precision p (FP32: for the current arch's kernel).
 * pw is overwritten (free it first). */
vitc_status vitc__pweight_pack(vitc__pweight *pw, const float *W, int64_t N, int64_t K,
                               vitc_precision p);
void vitc__pweight_free(vitc__pweight *pw);
/* v: a view of columns [j0, j0 + n) of FP32 pack pw (output columns, rows
 * of W), sharing its memory (never freed): 1, or 0 when pw cannot be cut
 * so (not FP32, K over its kernel's KC block, j0 not a multiple of its
 * NR). */
int vitc__pweight_cols(vitc__pweight *v, const vitc__pweight *pw, int64_t j0, int64_t n);
/* The multiple of which j0 must be (its kernel's strip width), 0 when pw
 * is not an FP32 pack. */
int64_t vitc__pweight_col_step(const vitc__pweight *pw);
/* W [N, K] row-major back from the packed copy: exact for FP32, the
 * converted values (bf16, or int8 times its scale) otherwise. */
void vitc__pweight_unpack(const vitc__pweight *pw, float *W);

/* The kernel fp32 panels are packed for now (the arch's built-in GEMM
 * microkernel), or NULL when the backend is OpenBLAS (panels unused). */
const struct vitc__gemm_kernel *vitc__gemm_pack_kernel(void);

/* The activation vitc__linear_pw applies after the bias and residual. */
enum { VITC__ACT_NONE = 0, VITC__ACT_GELU = 1, VITC__ACT_QUICK_GELU = 2, VITC__ACT_TANH_GELU = 3 };
struct vitc__kernels;
/* The path's in-place row function of a VITC__ACT_* (NULL for none). */
void (*vitc__act_fn(const struct vitc__kernels *kt, int act))(float *x, int64_t n);

/* y[M,N] = x[M,K] W^T + bias + residual, then the activation act
 * (VITC__ACT_*: erf GELU, quick-GELU, tanh-GELU) in place, fused into the
 * tiles' epilogue where the GEMM allows (the built-in fp32 GEMM: all three;
 * BF16 / INT8: erf GELU, the others a pass after). pw may be NULL or FP32
 * packed for another kernel: W (row-major [N, K]) is used then; W may be
 * NULL only with a BF16 / INT8 pw. */
vitc_status vitc__linear_pw(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const vitc__pweight *pw, const float *W, const float *bias,
                            const float *residual, int64_t ldr, int64_t M, int64_t N, int64_t K,
                            int act);
/* A LayerNorm in front of a linear layer: y [M, K] = LayerNorm(x [M, K])
 * over rows of K (w, b [K]), y then the layer's input. */
typedef struct vitc__ln_pre {
    float *y;
    const float *x, *w, *b;
    float eps;
    /* 1: nothing reads y after the layer (inference): a GEMM normalising
     * strips as it converts them may keep them in a scratch of its own
     * and leave y unwritten (vitc__ln_strip) */
    int y_unused;
} vitc__ln_pre;
/* Floats of the stack scratch a strip's LayerNorm goes to when ln->y is
 * unused: a strip of 12 rows of 1,024 (ViT-L) fits, 48 KB. Writing the
 * rows to y instead cost a read for ownership and a write-back of every
 * line from memory at batch 8 (y a layer's [1576, 768] rows, 4.8 MB). */
#define VITC_LN_STRIP 12288
/* LayerNorm of rows [i, i + mr) of ln->x (rows of K): into tmp (rows of K)
 * and returned, when ln->y is unused and they fit in VITC_LN_STRIP floats;
 * else into ln->y, and ln->y's rows returned. */
float *vitc__ln_strip(const vitc__ln_pre *ln, int64_t i, int64_t mr, int64_t K, float *tmp);
/* vitc__linear_pw(out, ldo, ln->y, K, ..., NULL, 0, M, N, K, act) after
 * vitc__layernorm(ln->y, ln->x, ...): the same numbers (ln->y written too).
 * Threads splitting the built-in fp32 GEMM's columns normalise rows as they
 * pack them, in the GEMM's region (no serial pass, no region of its own:
 * at 197 x 768 the LayerNorm cost more as a region than serially). */
vitc_status vitc__linear_pw_ln(float *out, int64_t ldo, const vitc__ln_pre *ln,
                               const vitc__pweight *pw, const float *W, const float *bias,
                               int64_t M, int64_t N, int64_t K, int act);
/* y = residual + scale * (x W^T + bias) (residual may be NULL): a layer
 * scale (DINOv2's ls1 / ls2) applied in the fp32 GEMM's epilogue, on each
 * block of rows while it is in cache (the same numbers as the product, then
 * vitc__scale_add); after the bf16 / int8 GEMM, or OpenBLAS's, a pass. */
vitc_status vitc__linear_pw_scaled(float *y, int64_t ldy, const float *x, int64_t ldx,
                                   const vitc__pweight *pw, const float *W, const float *bias,
                                   const float *scale, const float *residual, int64_t ldr,
                                   int64_t M, int64_t N, int64_t K);
/* 1 where attention in precision p (BF16, INT8) is faster than fp32's on
 * this CPU (dispatch.c): the attention precision of bf16 / int8 models
 * unless one is set. */
int vitc__attention_pays(vitc_precision p);
/* The BF16 / INT8 GEMM (gemm_lp.c), the same contract; ls [N] or NULL: a
 * layer scale, y = residual + ls * (x W^T + bias); act a VITC__ACT_*
 * applied to each finished tile. ln non-NULL: x is ln->y (ldx K),
 * LayerNorm(ln->x) computed by the threads converting A, strip by strip
 * (ln->y written too). */
vitc_status vitc__linear_lp(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const vitc__pweight *pw, const float *bias, const float *ls,
                            const float *residual, int64_t ldr, int64_t M, int act,
                            const vitc__ln_pre *ln);
void vitc__pweight_unpack_lp(const vitc__pweight *pw, float *W);
/* Packs a BF16 / INT8 weight (gemm_lp.c). */
vitc_status vitc__pweight_pack_lp(vitc__pweight *pw, const float *W, int64_t N, int64_t K,
                                  vitc_precision p);

/* ---- attention core (attention.c) -------------------------------- */

/* softmax(scale * q k^T + mask) v for every (b, h), from strided views.
 * Element (b, h, row, c) of q sits at q[b*q_sb + h*q_sh + row*q_sr + c]
 * (the last dim contiguous), and likewise for k, v, o, mask, probs.
 * A stride of 0 broadcasts (masks). mask is additive (-inf = not allowed);
 * a row with every score -inf yields NaN (torch 1.13's softmax does).
 * probs, when not NULL, receives the softmax [B,H,L,S]; otherwise the kernel
 * never materialises the L x S scores (tiled online softmax). */
typedef struct vitc__sdpa_desc {
    int64_t B, H, L, S, D, Dv;
    const float *q; int64_t q_sb, q_sh, q_sr;    /* [B,H,L,D] */
    const float *k; int64_t k_sb, k_sh, k_sr;    /* [B,H,S,D] */
    const float *v; int64_t v_sb, v_sh, v_sr;    /* [B,H,S,Dv] */
    float *o; int64_t o_sb, o_sh, o_sr;          /* [B,H,L,Dv] */
    float scale;
    const float *mask; int64_t m_sb, m_sh, m_sr; /* [B,H,L,S] additive, may be NULL */
    float *probs; int64_t p_sb, p_sh, p_sr;      /* [B,H,L,S] out, may be NULL */
    /* [B,H,L] out, may be NULL: the natural-log log-sum-exp of each row's
     * scaled, masked scores (what the backward needs to recompute P);
     * -inf for a fully masked row. Row l of head (b, h) at
     * lse[b*lse_sb + h*lse_sh + l]. */
    float *lse; int64_t lse_sb, lse_sh;
    /* The operands of q k^T and P v (attention_lp.c; inference: ignored,
     * fp32 run, when lse is asked for): FP32; BF16, with fp32 sums; INT8,
     * q and P per row as u8 (the GEMM's activations), k per key and v per
     * channel as s8 (symmetric), int32 sums. The softmax stays fp32. */
    vitc_precision prec;
    /* Decomposed relative positions (SAM's ViT-det attention), may be NULL
     * (then rel_w is ignored): the keys are a kh x kw grid in row-major
     * order (S == kh * kw), and the score of row l, key j gets
     * rel_h[l][j / kw] + rel_w[l][j % kw] added after the scale, before
     * the mask. Added tile by tile inside the kernel: no L x S buffer. The
     * bf16 path does not take it (the fp32 kernel runs instead). */
    const float *rel_h; int64_t rh_sb, rh_sh, rh_sr; /* [B,H,L,kh] */
    const float *rel_w; int64_t rw_sb, rw_sh, rw_sr; /* [B,H,L,kw] */
    int64_t kh, kw;
} vitc__sdpa_desc;

/* Dispatching entry point: threads over B x H x query blocks. */
vitc_status vitc__sdpa(const vitc__sdpa_desc *d);
/* Reference: rows [l0, l1) of head (b, h), two-pass softmax in float. */
void vitc__sdpa_ref_rows(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t l0, int64_t l1);

/* The gradient of o = softmax(scale q k^T + mask) v for q, k and v, given
 * dout = dL/do and the forward's o and lse (f.o, f.lse must be set; f.probs
 * is ignored). dq, dk, dv are overwritten (not accumulated). They must not
 * overlap each other or any input; a head's outputs are its own (no stride
 * 0 over b or h). The L x S scores are never stored: each tile is
 * recomputed from q, k and lse (FlashAttention-2). A fully masked row gives
 * what torch 1.13 autograd gives: NaN in its dq row and in all of its
 * head's dk and dv. */
typedef struct vitc__sdpa_bwd_desc {
    vitc__sdpa_desc f;                         /* forward views incl. o, lse, mask, scale */
    const float *dout; int64_t do_sb, do_sh, do_sr; /* [B,H,L,Dv] */
    float *dq; int64_t dq_sb, dq_sh, dq_sr;    /* [B,H,L,D] */
    float *dk; int64_t dk_sb, dk_sh, dk_sr;    /* [B,H,S,D] */
    float *dv; int64_t dv_sb, dv_sh, dv_sr;    /* [B,H,S,Dv] */
} vitc__sdpa_bwd_desc;

/* The gradients of the forward's rel_h and rel_w (vitc__sdpa_desc),
 * overwritten; each may be NULL (not wanted). drel_h[l][a] sums dS[l][j]
 * over the keys j of grid row a (dS = dL/d score), drel_w over those of
 * column a. Apart from vitc__sdpa_bwd_desc so its users' initialisers stay
 * as they are. */
typedef struct vitc__sdpa_rel_grad {
    float *drel_h; int64_t drh_sb, drh_sh, drh_sr; /* [B,H,L,kh] */
    float *drel_w; int64_t drw_sb, drw_sh, drw_sr; /* [B,H,L,kw] */
} vitc__sdpa_rel_grad;

/* Dispatching entry point: threads over heads (or, for fewer than 8 heads,
 * over key blocks and then query blocks); bitwise the same result for any
 * thread count. */
vitc_status vitc__sdpa_backward(const vitc__sdpa_bwd_desc *d);
/* The same with the relative-position gradients (rg may be NULL). */
vitc_status vitc__sdpa_backward_rel(const vitc__sdpa_bwd_desc *d, const vitc__sdpa_rel_grad *rg);
/* Reference: every head, plain loops in float, no scratch. */
void vitc__sdpa_backward_ref(const vitc__sdpa_bwd_desc *d);
void vitc__sdpa_backward_ref_rel(const vitc__sdpa_bwd_desc *d, const vitc__sdpa_rel_grad *rg);

/* ---- elementwise and norms (ops.c) ------------------------------- */

/* In-place numerically stable softmax over rows of n: x /= temperature first. */
void vitc__softmax_rows(float *x, int64_t rows, int64_t n, float inv_temperature);
/* In-place softmax(scale x) down each column of x [n, L] (row stride ld),
 * the columns in vectors side by side: for many softmaxes over a few
 * values each (the kernel's row softmax spends two horizontal reductions
 * and masked tails on every row). Over the pool unless small or inside a
 * pool task. */
void vitc__softmax_cols(float *x, int64_t n, int64_t L, int64_t ld, float scale);
/* vitc__softmax_rows(x, rows, n, 1) for short rows: rows of n up to
 * VITC_SOFTMAX_SHORT run as columns of transposed blocks
 * (vitc__softmax_cols' kernel), longer ones as rows. Within a few ulp of
 * softmax_rows. */
#define VITC_SOFTMAX_SHORT 16
void vitc__softmax_rows_short(float *x, int64_t rows, int64_t n);
/* y[m * ldy + r] = dot(x[r * ldx ..], w[m * K ..]) over K, for rows r and
 * n vectors w: short dot products (a few dozen long) by the thousand, which
 * one at a time spend more on their horizontal sums than on the products.
 * Runs on the calling thread (a task's own rows). Each path sums in its own
 * order: within a few ulp of float64 per product. */
void vitc__dot_rows(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t n,
                    int64_t K, int64_t rows);
/* LayerNorm over the last dim C of [M, C]. */
void vitc__layernorm(float *y, const float *x, const float *w, const float *b, int64_t M,
                     int64_t C, float eps);
/* The same, and stats [M, 2]: each row's mean and 1 / sqrt(var + eps), as
 * it normalised by them (for an algebra that goes on through the
 * LayerNorm: SAM's folded upscaling). y NULL: the stats alone. */
void vitc__layernorm_stats(float *y, const float *x, const float *w, const float *b, int64_t M,
                           int64_t C, float eps, float *stats);
/* GroupNorm(G, C) of [B, C, HW]; w, b [C]. */
void vitc__groupnorm(float *y, const float *x, const float *w, const float *b, int64_t B,
                     int64_t C, int64_t HW, int64_t G, float eps);
/* The same, written as tokens y [B, HW, C] (the attention layers' input
 * layout) in one pass. 0: not done (no memory for the statistics). */
int vitc__groupnorm_tokens(float *y, const float *x, const float *w, const float *b, int64_t B,
                           int64_t C, int64_t HW, int64_t G, float eps);
/* Exact-erf GELU, in place. */
void vitc__gelu(float *x, int64_t n);
/* quick-GELU x * sigmoid(1.702 x) (OpenAI CLIP), in place, threaded. */
void vitc__quick_gelu(float *x, int64_t n);
void vitc__quick_gelu_ref(float *x, int64_t n);
void vitc__quick_gelu_avx2(float *x, int64_t n);
void vitc__quick_gelu_avx512(float *x, int64_t n);
/* tanh-GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (SigLIP's
 * gelu_pytorch_tanh), in place, threaded. The reference is torch's float
 * formula; the vector paths compute the same function as
 * x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))) (1 + tanh u = 2 / (1 + e^-2u)),
 * which has no cancellation for negative x. */
void vitc__tanh_gelu(float *x, int64_t n);
void vitc__tanh_gelu_ref(float *x, int64_t n);
void vitc__tanh_gelu_avx2(float *x, int64_t n);
void vitc__tanh_gelu_avx512(float *x, int64_t n);
/* y [M, N] (row stride ldy) = r + g * y per row, g [N], r [M, N] (row
 * stride ldr) or NULL; rows across threads. The same numbers on every path. */
void vitc__scale_add(float *y, int64_t ldy, const float *g, const float *r, int64_t ldr, int64_t M,
                     int64_t N);
void vitc__scale_add_ref(float *y, const float *g, const float *r, int64_t n);
void vitc__scale_add_avx2(float *y, const float *g, const float *r, int64_t n);
void vitc__scale_add_avx512(float *y, const float *g, const float *r, int64_t n);
/* The gradient of y = softmax(x * inv_temperature) over rows of n:
 * dx = inv_temperature * y o (dy - rowsum(dy o y)). dx may be dy (in place),
 * not y. Threads over rows; the same bits for any thread count. */
void vitc__softmax_rows_backward(float *dx, const float *y, const float *dy, int64_t rows,
                                 int64_t n, float inv_temperature);
void vitc__softmax_rows_backward_ref(float *dx, const float *y, const float *dy, int64_t rows,
                                     int64_t n, float inv_temperature);
/* The plain reference versions of the three above (the fast ones dispatch
 * by arch and thread over rows; these stay for tests). */
void vitc__softmax_rows_ref(float *x, int64_t rows, int64_t n, float inv_temperature);
void vitc__softmax_rows_exp2_ref(float *x, int64_t rows, int64_t n, float s, float *inv);
void vitc__softmax_cols_ref(float *x, int64_t n, int64_t L, int64_t ld, float scale);
void vitc__layernorm_ref(float *y, const float *x, const float *w, const float *b, int64_t M,
                         int64_t C, float eps, float *stats);
void vitc__gelu_ref(float *x, int64_t n);
void vitc__groupnorm_ref(float *y, const float *x, const float *w, const float *b, int64_t B,
                         int64_t C, int64_t HW, int64_t G, float eps);

/* ---- backward (ops_backward.c) ----------------------------------- */
/* Each accumulates parameter gradients (+=, like torch) and says how it
 * treats the input gradient. */

/* nn.Linear y[M,N] = x[M,K] W[N,K]^T + b: dx[M,K] = dy W (beta 0: overwrite,
 * 1: add), dW[N,K] += dy^T x, db[N] += column sums of dy (db may be NULL,
 * dx may be NULL when the input needs none). Row strides ld*. */
void vitc__linear_backward(float *dx, int64_t lddx, float dx_beta, float *dW, float *db,
                           const float *dy, int64_t lddy, const float *x, int64_t ldx,
                           const float *W, int64_t M, int64_t N, int64_t K);
void vitc__linear_backward_ref(float *dx, int64_t lddx, float dx_beta, float *dW, float *db,
                               const float *dy, int64_t lddy, const float *x, int64_t ldx,
                               const float *W, int64_t M, int64_t N, int64_t K);
/* db[j] += sum_i dy[i][j] for j < N, rows in order (bitwise the plain
 * loop), columns split over threads. */
void vitc__colsum(float *db, const float *dy, int64_t lddy, int64_t M, int64_t N);
/* LayerNorm over C of x [M, C]: dx[M,C] += dx of y = (x - mean) * rstd * w + b,
 * dw, db [C] +=. Mean and rstd are recomputed from x (as the forward does,
 * in double) into stats [2M] (scratch). */
void vitc__layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *w, int64_t M, int64_t C, float eps, float *stats);
/* The same with dx = res + that gradient (res [M, C] may be dx: the
 * above); a residual stream's gradient without a separate copy. */
void vitc__layernorm_backward_res(float *dx, const float *res, float *dw, float *db,
                                  const float *dy, const float *x, const float *w, int64_t M,
                                  int64_t C, float eps, float *stats);
void vitc__layernorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *w, int64_t M, int64_t C, float eps);
/* GELU (erf): dx[n] = dy * gelu'(x), overwritten (dx may be dy). */
void vitc__gelu_backward(float *dx, const float *dy, const float *x, int64_t n);
void vitc__gelu_backward_ref(float *dx, const float *dy, const float *x, int64_t n);

#endif
