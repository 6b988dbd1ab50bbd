/*
 * gemm.c — GEMM: the reference loop, the backend switch (OpenBLAS or the
 * built-in blocked GEMM), the built-in driver with its portable microkernel,
 * and nn.Linear on top.
 *
 * Built-in GEMM (Goto/BLIS): for each NC-wide panel of op(B) and KC-deep
 * slice of K, pack the B panel once; for each MC-tall block of op(A), pack it;
 * then run the MR x NR register-blocked microkernel over the block. The
 * microkernel comes from the arch chosen at run time (x86/gemm_avx512.c 12x32,
 * x86/gemm_avx2.c 6x16, the portable 6x8 here); the bias / residual epilogue is
 * applied per tile while it is still in registers.
 *
 * Threads: the output is cut by columns when there are enough (chunks
 * taken from a counter as threads come free), else by rows (one contiguous
 * panel per pool thread), each computed serially with its own packing
 * buffers; an operand every thread needs whole is packed once, shared.
 * OpenBLAS is told to use one thread once, and is called per panel the
 * same way (fixed panels), so it never runs threads inside ours.
 */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_ukernels.h"

#ifdef VITC_HAVE_OPENBLAS
#include <cblas.h>
#endif

void vitc__gemm_ref(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < K; p++) {
                float a = trans_a ? A[p * lda + i] : A[i * lda + p];
                float b = trans_b ? B[j * ldb + p] : B[p * ldb + j];
                acc += a * b;
            }
            C[i * ldc + j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
    }
}

/* ---- backend choice ------------------------------------------------ */

enum { VITC_GEMM_BUILTIN = 0, VITC_GEMM_OPENBLAS = 1 };
static int vitc__gemm_backend = -1; /* -1: not yet read from VITC_GEMM */

/* The default ("auto") is decided per call from the kernel path (its
 * table's gemm_builtin_default). On the
 * AVX-512 path the built-in GEMM is used: at ViT-B shapes it measured
 * 0.93-0.99x OpenBLAS 0.3.21's own best kernels on one thread (0.69x at
 * 197x768x3072), 1.5-1.9x OpenBLAS when OPENBLAS_CORETYPE pins it to older
 * kernels (this project's machines set Haswell), and it is bitwise
 * identical for any thread count. On the AVX2 path too (a whole ViT-B/16
 * forward 1.2-1.3x OpenBLAS's on a Zen 3). On the generic path OpenBLAS
 * is used when the build has it. docs/kernels-gemm.md has the numbers. */
#define VITC_GEMM_AUTO (-2)
static int vitc__backend(void) {
    int b = __atomic_load_n(&vitc__gemm_backend, __ATOMIC_RELAXED);
    if (b == -1) {
        /* Unknown values mean the default: the environment cannot fail. */
        const char *env = getenv("VITC_GEMM");
        b = VITC_GEMM_AUTO;
        if (env && strcmp(env, "builtin") == 0)
            b = VITC_GEMM_BUILTIN;
#ifdef VITC_HAVE_OPENBLAS
        if (env && strcmp(env, "openblas") == 0)
            b = VITC_GEMM_OPENBLAS;
#endif
        __atomic_store_n(&vitc__gemm_backend, b, __ATOMIC_RELAXED);
    }
    if (b == VITC_GEMM_AUTO) {
#ifdef VITC_HAVE_OPENBLAS
        b = vitc__kern()->gemm_builtin_default ? VITC_GEMM_BUILTIN : VITC_GEMM_OPENBLAS;
#else
        b = VITC_GEMM_BUILTIN;
#endif
    }
    return b;
}

const char *vitc_get_gemm_backend(void) {
    return vitc__backend() == VITC_GEMM_OPENBLAS ? "openblas" : "builtin";
}

vitc_status vitc_set_gemm_backend(const char *name) {
    if (!name || !*name || strcmp(name, "auto") == 0) {
        __atomic_store_n(&vitc__gemm_backend, -1, __ATOMIC_RELAXED);
        vitc__backend();
        return VITC_OK;
    }
    if (strcmp(name, "builtin") == 0) {
        __atomic_store_n(&vitc__gemm_backend, VITC_GEMM_BUILTIN, __ATOMIC_RELAXED);
        return VITC_OK;
    }
    if (strcmp(name, "openblas") == 0) {
#ifdef VITC_HAVE_OPENBLAS
        __atomic_store_n(&vitc__gemm_backend, VITC_GEMM_OPENBLAS, __ATOMIC_RELAXED);
        return VITC_OK;
#else
        return vitc__err(VITC_ERR_UNSUPPORTED, "gemm backend \"openblas\" is not in this build");
#endif
    }
    return vitc__err(VITC_ERR_INVALID_ARG,
                     "unknown gemm backend \"%s\" (expected builtin, openblas or auto)", name);
}

/* ---- per-thread packing buffers ------------------------------------ */

/* Grow-only and owned by the thread (a key destructor frees it when the
 * thread ends), so concurrent user threads never share one. */
typedef struct {
    float *p[2];    /* [0]: this thread's packing; [1]: op(B) packed for all threads */
    size_t cap[2]; /* floats */
} vitc__scratch;

static pthread_key_t vitc__scratch_key;
static pthread_once_t vitc__scratch_once = PTHREAD_ONCE_INIT;
static int vitc__scratch_ok;

static void vitc__scratch_free(void *s) {
    vitc__scratch *sc = s;
    vitc__free(sc->p[0]);
    vitc__free(sc->p[1]);
    free(sc);
}

static void vitc__scratch_init(void) {
    vitc__scratch_ok = pthread_key_create(&vitc__scratch_key, vitc__scratch_free) == 0;
}

/* Buffer which (0 or 1) of this thread, NULL when memory is short: the
 * caller then falls back to something slower. */
static float *vitc__get_scratch_n(int which, size_t floats) {
    pthread_once(&vitc__scratch_once, vitc__scratch_init);
    if (!vitc__scratch_ok) return NULL;
    vitc__scratch *sc = pthread_getspecific(vitc__scratch_key);
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (!sc) return NULL;
        if (pthread_setspecific(vitc__scratch_key, sc) != 0) {
            free(sc);
            return NULL;
        }
    }
    if (sc->cap[which] < floats) {
        float *p = vitc__alloc(floats * sizeof(float));
        if (!p) return NULL;
        vitc__free(sc->p[which]);
        sc->p[which] = p;
        sc->cap[which] = floats;
    }
    return sc->p[which];
}

static float *vitc__get_scratch(size_t floats) { return vitc__get_scratch_n(0, floats); }

/* ---- packing ------------------------------------------------------- */

/* op(A)[i0:i0+mc, k0:k0+kc] into strips [kc][mr]; op(A)(i,k) is
 * A[i*lda + k], or A[k*lda + i] when trans. */
void vitc__gemm_packa_generic(float *pa, int mr, const float *A, int64_t lda, int trans, int64_t i0,
                              int64_t mc, int64_t k0, int64_t kc, float *asum) {
    for (int64_t s = 0; s < mc; s += mr) {
        int64_t rows = mc - s < mr ? mc - s : mr;
        float *dst = pa + s * kc; /* strip s/mr: [kc][mr] */
        if (trans) {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + (k0 + k) * lda + i0 + s;
                int64_t r = 0;
                for (; r < rows; r++) dst[k * mr + r] = src[r];
                for (; r < mr; r++) dst[k * mr + r] = 0.0f;
                if (asum)
                    for (r = 0; r < rows; r++) asum[s + r] += src[r];
            }
        } else {
            for (int64_t r = 0; r < rows; r++) {
                const float *src = A + (i0 + s + r) * lda + k0;
                for (int64_t k = 0; k < kc; k++) dst[k * mr + r] = src[k];
            }
            for (int64_t r = rows; r < mr; r++)
                for (int64_t k = 0; k < kc; k++) dst[k * mr + r] = 0.0f;
        }
    }
}

void vitc__gemm_packb_generic(float *pb, int nr, const float *B, int64_t ldb, int trans,
                              int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
    for (int64_t s = 0; s < nc; s += nr) {
        int64_t cols = nc - s < nr ? nc - s : nr;
        float *dst = pb + s * kc; /* strip s/nr: [kc][nr] */
        if (!trans) {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (k0 + k) * ldb + j0 + s;
                int64_t c = 0;
                for (; c < cols; c++) dst[k * nr + c] = src[c];
                for (; c < nr; c++) dst[k * nr + c] = 0.0f;
            }
        } else {
            for (int64_t c = 0; c < cols; c++) {
                const float *src = B + (j0 + s + c) * ldb + k0;
                for (int64_t k = 0; k < kc; k++) dst[k * nr + c] = src[k];
            }
            for (int64_t c = cols; c < nr; c++)
                for (int64_t k = 0; k < kc; k++) dst[k * nr + c] = 0.0f;
        }
    }
}

/* ---- portable microkernel: 6 x 8 ----------------------------------- */

/* The epilogue on a tile kept in memory (edges of every arch, and the
 * portable kernel): acc [MR x NR] row-major with row stride ldacc. */
void vitc__gemm_epilogue_tile(float *C, int64_t ldc, const float *acc, int64_t ldacc,
                                int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    for (int64_t i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        const float *a = acc + i * ldacc;
        if (!e->first) {
            for (int64_t j = 0; j < nr; j++) c[j] += e->alpha * a[j];
            continue;
        }
        const float *r = e->res ? e->res + i * e->ldr : NULL;
        for (int64_t j = 0; j < nr; j++) {
            float v = e->alpha * a[j];
            if (e->beta != 0.0f) v += e->beta * c[j];
            if (e->bias) v += e->bias[j];
            if (r) v += r[j];
            c[j] = v;
        }
    }
}

#define VITC_G_MR 6
#define VITC_G_NR 8

#if defined(__GNUC__)
/* GCC/Clang vector extensions: portable C that still becomes SIMD on any
 * target (SSE2 on baseline x86-64, NEON on arm64). */
typedef float vitc__v4 __attribute__((vector_size(16)));

static inline vitc__v4 vitc__ld4(const float *p) {
    vitc__v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void vitc__ukr_generic(int64_t kc, const float *pa, const float *pb, float *C, int64_t ldc,
                              int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    vitc__v4 acc[VITC_G_MR][2];
    for (int i = 0; i < VITC_G_MR; i++) acc[i][0] = acc[i][1] = (vitc__v4){0, 0, 0, 0};
    for (int64_t k = 0; k < kc; k++) {
        vitc__v4 b0 = vitc__ld4(pb + k * VITC_G_NR), b1 = vitc__ld4(pb + k * VITC_G_NR + 4);
        const float *a = pa + k * VITC_G_MR;
        for (int i = 0; i < VITC_G_MR; i++) {
            vitc__v4 ai = {a[i], a[i], a[i], a[i]};
            acc[i][0] += ai * b0;
            acc[i][1] += ai * b1;
        }
    }
    float tile[VITC_G_MR * VITC_G_NR];
    memcpy(tile, acc, sizeof tile);
    vitc__gemm_epilogue_tile(C, ldc, tile, VITC_G_NR, mr, nr, e);
}
#else
static void vitc__ukr_generic(int64_t kc, const float *pa, const float *pb, float *C, int64_t ldc,
                              int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    float acc[VITC_G_MR * VITC_G_NR] = {0};
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < VITC_G_MR; i++)
            for (int j = 0; j < VITC_G_NR; j++)
                acc[i * VITC_G_NR + j] += pa[k * VITC_G_MR + i] * pb[k * VITC_G_NR + j];
    vitc__gemm_epilogue_tile(C, ldc, acc, VITC_G_NR, mr, nr, e);
}
#endif

/* The blocks as measured on a 1 MB L2: dispatch.c's tables hold a copy
 * with the blocks the CPU's caches give (cpu.c's rules), which the driver
 * reads through vitc__kern()->gemm. */
const vitc__gemm_kernel vitc__gemm_kernel_generic = {
    VITC_G_MR, VITC_G_NR, 512, 96, 1024, vitc__ukr_generic, NULL, NULL, NULL, 0, NULL, 0,
};

static const vitc__gemm_kernel *vitc__pick_kernel(void) { return vitc__kern()->gemm; }

/* ---- the problem, and its serial built-in solve ---------------------- */

typedef struct vitc__gemm_job {
    int ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A; int64_t lda; /* op(A) [M,K] */
    const float *B; int64_t ldb; /* op(B) [K,N] */
    float *C; int64_t ldc;       /* [M,N] */
    const float *bias;           /* [N] or NULL */
    /* [M] or NULL, with ta: asum[i] += sum_k op(A)(i, k), by the A packer
     * from the values it packs (each row of op(A) is summed by exactly one
     * thread: the one whose panel starts at column 0), k ascending: a bias
     * gradient's column sums of dY without a pass of their own. */
    float *asum;
    const float *res; int64_t ldr; /* [M,N] or NULL */
    const vitc__gemm_kernel *kern;
    /* op(B) already packed for kern (vitc__pweight, fp32): KC block pc at
     * pbw + pc * npad, its NR strips [kc][NR] one after another. */
    const float *pbw;
    int64_t npad;
    /* op(A) already packed for kern (threads splitting columns share it):
     * KC block pc at paw + pc * mpad, MR strips [kc][MR] one after another;
     * asum is then done too. */
    const float *paw;
    int64_t mpad;
    /* Non-NULL: paw is not packed yet; the threads pack it as they go
     * (vitc__pa_need). */
    vitc__coop *coop;
    /* Non-NULL: op(A) is ln->y (lda K), LayerNorm(ln->x) still to compute:
     * by the packers of a shared op(A) in one K block, else a pass first
     * (vitc__gemm_run). */
    const vitc__ln_pre *ln;
    void (*gelu)(float *x, int64_t n); /* the activation (elementwise, in place: erf, quick or
                                        * tanh GELU) on C after the last K block, or NULL */
    int gelu_ukr; /* gelu is kern->gelu and runs in the microkernel's epilogue */
    int ls_ukr;   /* the layer scale runs in the microkernel's epilogue (kern->ls) */
    /* Layer scale (NULL: none): after the last K block, before gelu,
     * C = sres + scale * C per row by scale_add (scale [N], sres [M, ldsr]
     * or NULL); res is then NULL, the residual being added here. */
    const float *scale, *sres;
    int64_t ldsr;
    void (*scale_add)(float *y, const float *g, const float *r, int64_t n);
    void (*gelu_to)(float *y, const float *x, int64_t n); /* act = GELU(C), with act */
    /* Also after the last K block, on the tile still in L1 (NULL: none):
     * act [M, ld_act] = gelu(C), C kept (training keeps GELU's input). */
    float *act;
    int64_t ld_act;
    int64_t kc;   /* K block of this product: the kernel's, or KC_DEEP */
    int by_cols;  /* threads split columns (else rows) */
    int64_t unit; /* split granularity: NR or MR (or 16 for OpenBLAS) */
    int nparts;
    /* Non-NULL: threads of the built-in GEMM take chunks of chunk columns
     * (by_cols, a multiple of NR) or rows (a multiple of MR) from this
     * counter, nchunks in all, instead of one fixed panel each
     * (vitc__gemm_task). */
    _Atomic int64_t *next_chunk;
    vitc__chunks chunks; /* of columns or rows */
} vitc__gemm_job;

/* C (and the epilogue) when K == 0 or alpha == 0: no product to add. */
static void vitc__scale_only(const vitc__gemm_job *g, int64_t i0, int64_t i1, int64_t j0,
                             int64_t j1) {
    for (int64_t i = i0; i < i1; i++) {
        float *c = g->C + i * g->ldc;
        for (int64_t j = j0; j < j1; j++) {
            float v = g->beta == 0.0f ? 0.0f : g->beta * c[j];
            if (g->bias) v += g->bias[j];
            if (g->res) v += g->res[i * g->ldr + j];
            c[j] = v;
        }
    }
}

/* Largest MR and NR of any kernel: sizes the stack fallback below. */
#define VITC_MAX_MR 16
#define VITC_MAX_NR 64
#define VITC_SMALL_KC 64

/* Reading operands in place (the kernel's ukr_st) can be switched off;
 * tests compare both ways (vitc__gemm_set_direct). */
static int vitc__gemm_direct_on = 1;
void vitc__gemm_set_direct(int on) { __atomic_store_n(&vitc__gemm_direct_on, on != 0, __ATOMIC_RELAXED); }

/* One MR x NR tile at (i, j) of K block pc: from packed panels (ukr: a, b
 * strips of MR and NR) or, when st, from A and B with their strides
 * (ukr_st). */
static inline void vitc__tile(const vitc__gemm_job *g, int st, int64_t kc, const float *a,
                              int64_t a_ks, int64_t a_rs, const float *b, int64_t b_ks,
                              int64_t pc, int64_t i, int64_t j, int64_t mr, int64_t nr,
                              const float *pf, int64_t pf_lines) {
    const vitc__gemm_kernel *kn = g->kern;
    vitc__gemm_epi e = {g->alpha, g->beta, pc == 0, g->bias ? g->bias + j : NULL,
                        g->res ? g->res + i * g->ldr + j : NULL, g->ldr,
                        g->gelu_ukr && pc + kc >= g->K, (const char *)pf, pf_lines,
                        NULL, NULL, g->ldsr};
    if (g->ls_ukr && pc + kc >= g->K) {
        e.ls = g->scale + j;
        e.lres = g->sres ? g->sres + i * g->ldsr + j : NULL;
    }
    float *C = g->C + i * g->ldc + j;
    if (st)
        kn->ukr_st(kc, a, a_ks, a_rs, b, b_ks, C, g->ldc, mr, nr, &e);
    else
        kn->ukr(kc, a, b, C, g->ldc, mr, nr, &e);
}

/* The layer scale (and its residual), then GELU, on rows [i, i + mc) x
 * columns [j, j + nc) of C once they are final, while the MC-row block is
 * still in cache: in place, or into act. Whole block rows per call rather
 * than per tile: the vector GELU's setup cost as much as 32 columns of it.
 * Elementwise, so the same numbers as passes after the GEMM. */
static void vitc__gelu_block(const vitc__gemm_job *g, int64_t i, int64_t mc, int64_t j,
                             int64_t nc, int scale) {
    for (int64_t r = i; r < i + mc; r++) {
        float *c = g->C + r * g->ldc + j;
        if (g->scale && scale)
            g->scale_add(c, g->scale + j, g->sres ? g->sres + r * g->ldsr + j : NULL, nc);
        if (g->act)
            g->gelu_to(g->act + r * g->ld_act + j, c, nc);
        else if (g->gelu)
            g->gelu(c, nc);
    }
}

/* op(A) shared by threads splitting columns, packed by those threads
 * inside the GEMM's own region rather than in a region before it (which
 * cost a second start and end wait per product, and split 197 rows into
 * 72-row blocks 2:1): vitc__coop's units are MR-row strips of one K block,
 * claimed in the order every thread consumes them (K block, then MC block);
 * block (pc, ic) is coop block kb * nic + ic / MC. */
static int64_t vitc__pa_strip(void *ctx, int64_t s) {
    const vitc__gemm_job *g = ctx;
    const vitc__gemm_kernel *kn = g->kern;
    int64_t nsp = (g->M + kn->mr - 1) / kn->mr, nic = g->mpad / kn->mc;
    int64_t kb = s / nsp, i = s % nsp * kn->mr, pc = kb * g->kc;
    int64_t kc = g->K - pc < g->kc ? g->K - pc : g->kc, mr = g->M - i < kn->mr ? g->M - i : kn->mr;
    float *dst = (float *)g->paw + pc * g->mpad + i * kc; /* strip i / MR of its block */
    const vitc__ln_pre *ln = g->ln; /* only with one K block: kb is 0 */
    const float *A = g->A; /* op(A)'s rows from i: A's row i0 */
    int64_t lda = g->lda, i0 = i;
    _Alignas(64) float tmp[VITC_LN_STRIP]; /* whole lines: the vector loads split none */
    if (ln) {
        A = vitc__ln_strip(ln, i, mr, g->K, tmp);
        lda = g->K, i0 = 0;
    }
    if (kn->packa)
        kn->packa(dst, A, lda, g->ta, i0, mr, pc, kc, NULL);
    else
        vitc__gemm_packa_generic(dst, kn->mr, A, lda, g->ta, i0, mr, pc, kc, NULL);
    return kb * nic + i / kn->mc;
}

/* Returns once block (pc, ic) of the shared op(A) is packed. */
static void vitc__pa_need(const vitc__gemm_job *g, int64_t pc, int64_t ic) {
    const vitc__gemm_kernel *kn = g->kern;
    int64_t last = g->M < ic + kn->mc ? g->M : ic + kn->mc;
    int64_t strips = (last + kn->mr - 1) / kn->mr - ic / kn->mr;
    vitc__coop_need(g->coop, pc / g->kc * (g->mpad / kn->mc) + ic / kn->mc, strips);
}

/* Strip s's share of the pf_all lines of the micro-panel read next, split
 * over the block's strips that use the current one (mc rows of MR): lines
 * [*off, *off + returned) from its start (0: none left for this strip). */
static inline int64_t vitc__pf_share(int64_t pf_all, int64_t mc, int MR, int64_t s, int64_t *off) {
    const int64_t ns = (mc + MR - 1) / MR, share = (pf_all + ns - 1) / ns;
    *off = s * share;
    return pf_all - *off < share ? pf_all - *off : share;
}

#define VITC_ONE_BLOCK_MAX 4
/* jnext: where this thread's next chunk of columns starts (-1: none or
 * unknown), for the prefetch of prepacked weights past j1. */
static void vitc__builtin_block(const vitc__gemm_job *g, int64_t i0, int64_t i1, int64_t j0,
                                int64_t j1, int64_t jnext) {
    const vitc__gemm_kernel *kn = g->kern;
    const int MR = kn->mr, NR = kn->nr;
    int64_t m = i1 - i0, n = j1 - j0;
    /* Prepacked B needs no panel buffer, so no NC blocking: one panel of
     * every column, each MC block of A packed once rather than once per NC
     * panel (3 times for a ViT-B qkv or fc1 on one thread). The B
     * micro-panels stream from L3 either way. */
    int64_t KC = g->kc, MC = kn->mc, NC = g->pbw && n > 0 ? n : kn->nc;
    /* A short M over prepacked weights (batch 1: 197 rows) in one block:
     * each weight micro-panel is read once, from memory, and used by all
     * the strips while in L1, with A's 600 KB in L2. */
    if (g->pbw && m <= VITC_ONE_BLOCK_MAX * MC) MC = (m + MR - 1) / MR * MR;
    /* Smaller blocks for smaller problems: no packing of padding. */
    int64_t kc_max = g->K < KC ? g->K : KC;
    int64_t mc_max = (m < MC ? (m + MR - 1) / MR * MR : MC);
    int64_t nc_max = (n < NC ? (n + NR - 1) / NR * NR : NC);
    const float *pbw = g->pbw; /* prepacked panels: no B buffer */
    int on = kn->ukr_st && __atomic_load_n(&vitc__gemm_direct_on, __ATOMIC_RELAXED);
    /* A shallow, untransposed A is read in place. (Reading a weight
     * gradient's dY^T and X in place instead of packing them measured 4-8%
     * slower on a Fashion-MNIST step: they come from memory, and the
     * packers prefetch.) */
    int da = on && !g->ta && g->K <= kn->direct_kc;
    const float *paw = da ? NULL : g->paw; /* op(A) prepacked, shared: no A buffer */
    int64_t pa_len = da || paw ? 0 : (mc_max * kc_max + 15) & ~(int64_t)15; /* keeps pb 64-byte aligned */
    float *pa = vitc__get_scratch((size_t)(pa_len + (pbw ? 0 : nc_max * kc_max)) + 1);
    _Alignas(64) float small[VITC_SMALL_KC * (VITC_MAX_MR + VITC_MAX_NR)];
    if (!pa) {
        /* Out of memory: one tile at a time from the stack, still exact
         * (prepacked panels have another KC: pack from op(B) instead). */
        KC = VITC_SMALL_KC, MC = MR, NC = NR;
        pbw = NULL; /* op(B) row-major is always kept beside its panels */
        if (g->coop && paw) /* A is read below: its rows packed (and normalised) first */
            for (int64_t pc = 0; pc < g->K; pc += g->kc)
                for (int64_t ic = 0; ic < g->M; ic += kn->mc) vitc__pa_need(g, pc, ic);
        /* Shared op(A) panels have another KC too. (Packing A again here
         * leaves asum alone: it was summed with them.) */
        paw = NULL;
        pa = small;
        pa_len = VITC_SMALL_KC * VITC_MAX_MR;
        da = 0;
    }
    float *pb = pa + pa_len;
    for (int64_t jc = j0; jc < j1; jc += NC) {
        int64_t nc = j1 - jc < NC ? j1 - jc : NC;
        for (int64_t pc = 0; pc < g->K; pc += KC) {
            int64_t kc = g->K - pc < KC ? g->K - pc : KC;
            if (pbw)
                pb = (float *)pbw + pc * g->npad + jc * kc;
            else if (kn->packb)
                kn->packb(pb, g->B, g->ldb, g->tb, pc, kc, jc, nc);
            else
                vitc__gemm_packb_generic(pb, NR, g->B, g->ldb, g->tb, pc, kc, jc, nc);
            if (da) {
                /* As below, the MC-row block of A (now in place) is reused
                 * across the B micro-panels, one at a time in L1. Prepacked
                 * weights stream from memory under few rows (7 tokens
                 * against an image's 4096 keys, a batch-1 token product):
                 * the first block's strips ask for the micro-panel d ahead
                 * into L2, a share each, d panels making 8 KB or more (a
                 * K of 16 is 2 KB a panel: the tile's FMAs then take less
                 * time than a miss to memory). */
                const int64_t pf_all = pbw ? kc * NR * (int64_t)sizeof(float) / 64 : 0;
                const int64_t pf_d = pf_all ? (128 + pf_all - 1) / pf_all : 0;
                for (int64_t ic = i0; ic < i1; ic += MC) {
                    int64_t mc = i1 - ic < MC ? i1 - ic : MC;
                    for (int64_t jr = 0; jr < nc; jr += NR) {
                        const float *next = ic == i0 && pf_all && jr + pf_d * NR < nc
                                                ? pb + (jr + pf_d * NR) * kc
                                                : NULL;
                        for (int64_t ir = 0, s = 0; ir < mc; ir += MR, s++) {
                            int64_t off, pfn = vitc__pf_share(pf_all, mc, MR, s, &off);
                            vitc__tile(g, 1, kc, g->A + (ic + ir) * g->lda + pc, 1, g->lda,
                                       pb + jr * kc, NR, pc, ic + ir, jc + jr,
                                       mc - ir < MR ? mc - ir : MR, nc - jr < NR ? nc - jr : NR,
                                       next && pfn > 0 ? next + off * 16 : NULL,
                                       next && pfn > 0 ? pfn : 0);
                        }
                    }
                    if (((g->gelu && !g->gelu_ukr) || (g->scale && !g->ls_ukr)) &&
                        pc + kc >= g->K)
                        vitc__gelu_block(g, ic, mc, jc, nc, !g->ls_ukr);
                }
                continue;
            }
            for (int64_t ic = i0; ic < i1; ic += MC) {
                int64_t mc = i1 - ic < MC ? i1 - ic : MC;
                /* Rows of op(A) are summed by the thread whose panel holds
                 * column 0, once (its first NC panel). */
                float *asum = g->asum && jc == 0 && !g->paw ? g->asum + ic : NULL;
                if (paw && g->coop) /* the kernel's MC-row blocks this block spans */
                    for (int64_t b = ic; b < ic + mc; b += kn->mc) vitc__pa_need(g, pc, b);
                if (paw)
                    pa = (float *)paw + pc * g->mpad + ic * kc;
                else if (kn->packa)
                    kn->packa(pa, g->A, g->lda, g->ta, ic, mc, pc, kc, asum);
                else
                    vitc__gemm_packa_generic(pa, MR, g->A, g->lda, g->ta, ic, mc, pc, kc, asum);
                /* Prepacked weights come from memory the first time an MC
                 * block reads them (a batch-1 product has only that one):
                 * the strips that use micro-panel jr ask for jr + 1 into
                 * L2 meanwhile, a share each, rather than the first strip
                 * of jr + 1 stalling on it. */
                int64_t pf_all = pbw ? kc * NR * (int64_t)sizeof(float) / 64 : 0;
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int64_t nr = nc - jr < NR ? nc - jr : NR;
                    /* The micro-panel read next (pf_all: prepacked, one
                     * panel of every column): after the panel's last, the
                     * next K block's first (fc2 at batch 1 is 32-column
                     * chunks of 12 K blocks), else the first of this
                     * thread's next chunk. */
                    const float *next = NULL;
                    if (pf_all && jr + NR < nc)
                        next = pb + (jr + NR) * kc;
                    else if (pf_all && pc + KC < g->K)
                        next = pbw + (pc + KC) * g->npad +
                               jc * (g->K - pc - KC < KC ? g->K - pc - KC : KC);
                    else if (pf_all && jnext >= 0)
                        next = pbw + jnext * kc_max;
                    for (int64_t ir = 0, s = 0; ir < mc; ir += MR, s++) {
                        int64_t mr = mc - ir < MR ? mc - ir : MR;
                        int64_t off, pfn = vitc__pf_share(pf_all, mc, MR, s, &off);
                        vitc__tile(g, 0, kc, pa + ir * kc, 0, 0, pb + jr * kc, 0, pc, ic + ir,
                                   jc + jr, mr, nr, next && pfn > 0 ? next + off * 16 : NULL,
                                   next && pfn > 0 ? pfn : 0);
                    }
                }
                if (((g->gelu && !g->gelu_ukr) || (g->scale && !g->ls_ukr)) &&
                    pc + kc >= g->K)
                    vitc__gelu_block(g, ic, mc, jc, nc, !g->ls_ukr);
            }
        }
    }
}

#ifdef VITC_HAVE_OPENBLAS
static pthread_once_t vitc__blas_once = PTHREAD_ONCE_INIT;
static void vitc__blas_init(void) { openblas_set_num_threads(1); }

static void vitc__blas_block(const vitc__gemm_job *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const float *A = g->ta ? g->A + i0 : g->A + i0 * g->lda;
    const float *B = g->tb ? g->B + j0 * g->ldb : g->B + j0;
    float *C = g->C + i0 * g->ldc + j0;
    int64_t m = i1 - i0, n = j1 - j0;
    float beta = g->beta;
    if (g->bias || g->res) {
        /* The epilogue goes in first as C's old value (beta = 1): one pass,
         * and a residual that aliases C is read before it is overwritten. */
        for (int64_t i = 0; i < m; i++) {
            float *c = C + i * g->ldc;
            const float *r = g->res ? g->res + (i0 + i) * g->ldr + j0 : NULL;
            for (int64_t j = 0; j < n; j++) {
                float v = beta == 0.0f ? 0.0f : beta * c[j];
                if (g->bias) v += g->bias[j0 + j];
                if (r) v += r[j];
                c[j] = v;
            }
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)g->K, g->alpha, A, (blasint)g->lda, B,
                (blasint)g->ldb, beta, C, (blasint)g->ldc);
}
#endif

/* Thread t's panel [i0,i1) x [j0,j1): contiguous, cut at multiples of unit. */
static void vitc__part(const vitc__gemm_job *g, int64_t t, int64_t *i0, int64_t *i1, int64_t *j0,
                       int64_t *j1) {
    int64_t total = g->by_cols ? g->N : g->M;
    int64_t units = (total + g->unit - 1) / g->unit;
    int64_t q = units / g->nparts, r = units % g->nparts;
    int64_t b = (q * t + (t < r ? t : r)) * g->unit;
    int64_t e = b + (q + (t < r ? 1 : 0)) * g->unit;
    if (e > total) e = total;
    if (b > total) b = total;
    *i0 = 0, *i1 = g->M, *j0 = 0, *j1 = g->N;
    if (g->by_cols)
        *j0 = b, *j1 = e;
    else
        *i0 = b, *i1 = e;
}

static void vitc__gemm_task(void *ctx, int64_t t, int tid) {
    vitc__gemm_job *g = ctx;
    (void)tid;
    if (g->next_chunk) {
        /* Whichever thread is free takes the next chunk: a thread that
         * starts late (a worker waking up, or one whose core another
         * process took) leaves its share to the others instead of making
         * them wait at the end. A tile's FMAs do not depend on the chunk or
         * thread that computes it, so the bits do not either. */
        /* The next chunk is claimed before this one runs, so that the
         * weights' prefetch can run ahead into it. */
        const vitc__chunks *ch = &g->chunks;
        int64_t c = atomic_fetch_add_explicit(g->next_chunk, 1, memory_order_relaxed);
        while (c < ch->n) {
            int64_t n = atomic_fetch_add_explicit(g->next_chunk, 1, memory_order_relaxed);
            int64_t b0 = vitc__chunk_at(ch, c), b1 = vitc__chunk_at(ch, c + 1);
            if (g->by_cols)
                vitc__builtin_block(g, 0, g->M, b0, b1, n < ch->n ? vitc__chunk_at(ch, n) : -1);
            else
                vitc__builtin_block(g, b0, b1, 0, g->N, -1);
            c = n;
        }
        return;
    }
    int64_t i0, i1, j0, j1;
    vitc__part(g, t, &i0, &i1, &j0, &j1);
    if (i0 >= i1 || j0 >= j1) return;
    if (g->K <= 0 || g->alpha == 0.0f) {
        vitc__scale_only(g, i0, i1, j0, j1);
        if (g->gelu || g->scale) vitc__gelu_block(g, i0, i1 - i0, j0, j1 - j0, 1);
        return;
    }
#ifdef VITC_HAVE_OPENBLAS
    if (!g->kern) {
        vitc__blas_block(g, i0, i1, j0, j1);
        return;
    }
#endif
    vitc__builtin_block(g, i0, i1, j0, j1, -1);
}

/* op(B) packed once for all threads (vitc__gemm_run): KC block pc at
 * pb + pc * npad, strips of NR columns; tasks of PB_COLS columns of one K
 * block. */
#define VITC_PB_COLS 128
typedef struct {
    const vitc__gemm_job *g;
    float *pb;
    int64_t npad, nchunks;
} vitc__pb_job;

static void vitc__pb_task(void *ctx, int64_t t, int tid) {
    const vitc__pb_job *p = ctx;
    const vitc__gemm_job *g = p->g;
    const vitc__gemm_kernel *kn = g->kern;
    (void)tid;
    int64_t pc = t / p->nchunks * g->kc, j = t % p->nchunks * VITC_PB_COLS;
    int64_t kc = g->K - pc < g->kc ? g->K - pc : g->kc;
    int64_t nc = g->N - j < VITC_PB_COLS ? g->N - j : VITC_PB_COLS;
    float *dst = p->pb + pc * p->npad + j * kc;
    if (kn->packb)
        kn->packb(dst, g->B, g->ldb, g->tb, pc, kc, j, nc);
    else
        vitc__gemm_packb_generic(dst, kn->nr, g->B, g->ldb, g->tb, pc, kc, j, nc);
}

/* op(A) packed once for all threads splitting columns: task t packs the
 * MR-row strip from t MR for every K block in order (so asum, if any, adds
 * k ascending), block pc at pa + pc * mpad. Strips, not MC blocks: a
 * weight gradient of 96 rows is 3 blocks of 36 but 16 strips, which two
 * threads share evenly. */
typedef struct {
    const vitc__gemm_job *g;
    float *pa;
    int64_t mpad;
} vitc__pa_job;

static void vitc__pa_task(void *ctx, int64_t t, int tid) {
    const vitc__pa_job *p = ctx;
    const vitc__gemm_job *g = p->g;
    const vitc__gemm_kernel *kn = g->kern;
    (void)tid;
    int64_t ic = t * kn->mr, mc = g->M - ic < kn->mr ? g->M - ic : kn->mr;
    float *asum = g->asum ? g->asum + ic : NULL;
    for (int64_t pc = 0; pc < g->K; pc += g->kc) {
        int64_t kc = g->K - pc < g->kc ? g->K - pc : g->kc;
        float *dst = p->pa + pc * p->mpad + ic * kc;
        if (kn->packa)
            kn->packa(dst, g->A, g->lda, g->ta, ic, mc, pc, kc, asum);
        else
            vitc__gemm_packa_generic(dst, kn->mr, g->A, g->lda, g->ta, ic, mc, pc, kc, asum);
    }
}

#define VITC_KC_DEEP 256
#define VITC_CHUNKS_PER 4
#define VITC_CHUNKS_SHARED 12

/* Below this many flops a parallel region costs more than it saves. */
#define VITC_GEMM_PAR_FLOPS 400000.0
/* Below this many elements of op(B) its repeated packing costs less than
 * a parallel region to share it. */
#define VITC_SHARED_B_MIN 32768

/* g's LayerNorm as a pass of its own (threaded as vitc__layernorm sees
 * fit), when the packers do not do it. */
static void vitc__ln_pass(vitc__gemm_job *g) {
    const vitc__ln_pre *ln = g->ln;
    if (ln) vitc__layernorm(ln->y, ln->x, ln->w, ln->b, g->M, g->K, ln->eps);
    g->ln = NULL;
}

static void vitc__gemm_run(vitc__gemm_job *g, int builtin) {
    if (g->M <= 0 || g->N <= 0) {
        vitc__ln_pass(g); /* its output is the caller's too */
        return;
    }
    g->kern = NULL;
#ifdef VITC_HAVE_OPENBLAS
    /* CBLAS takes int sizes: anything larger goes to the built-in GEMM. */
    if (g->M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        builtin = 1;
    if (!builtin) pthread_once(&vitc__blas_once, vitc__blas_init);
#else
    builtin = 1;
#endif
    if (builtin) {
        g->kern = vitc__pick_kernel();
        g->kc = g->kern->kc;
        /* The activation in registers when the kernel reproduces it (the
         * layer scale, and training's act = GELU(C), need C first). */
        g->gelu_ukr = g->gelu && g->gelu == g->kern->gelu && !g->scale && !g->act;
        /* the layer scale too where the kernel has it and nothing follows
         * it: DINOv2's proj and fc2 outputs had been a pass over each block
         * (1% of the batch-1 forward) */
        g->ls_ukr = g->scale && g->kern->ls && !g->gelu && !g->act;
        /* A small weight gradient (A transposed, K the batch rows, deep,
         * C at most a few blocks): smaller K blocks keep its B micro-panel
         * in L1 (C is tiny and re-read once per block): 4-5% faster at the
         * Fashion-MNIST ViT's 288 x 96 x 6400, while ViT-B's 2304 x 768 x
         * 1576 lost 15% with them. Never for prepacked weights: their
         * blocks are the kernel's. */
        if (g->ta && !g->pbw && g->K >= 4 * VITC_KC_DEEP && g->M <= 4 * g->kern->mc &&
            g->N <= 8 * g->kern->nr && g->kern->kc > VITC_KC_DEEP)
            g->kc = VITC_KC_DEEP;
    }
    int mr = g->kern ? g->kern->mr : 16, nr = g->kern ? g->kern->nr : 16;
    int nt = vitc__in_parallel() ? 1 : vitc__num_threads();
    double flops = 2.0 * (double)g->M * (double)g->N * (double)(g->K > 0 ? g->K : 1);
    if (flops < VITC_GEMM_PAR_FLOPS) nt = 1;
    /* Each thread packs all of the operand it does not split: splitting
     * columns repeats op(A)'s packing (M x K) in every thread, splitting rows
     * repeats op(B)'s (N x K). Repeat the smaller one, as long as each
     * thread still gets at least two tiles of the dimension it splits. */
    int64_t col_units = (g->N + nr - 1) / nr, row_units = (g->M + mr - 1) / mr;
    if (g->N >= g->M)
        g->by_cols = col_units >= 2 * (int64_t)nt || col_units >= row_units;
    else
        g->by_cols = !(row_units >= 2 * (int64_t)nt || row_units >= col_units);
    g->unit = g->by_cols ? nr : mr;
    int64_t units = g->by_cols ? col_units : row_units;
    if (nt > units) nt = (int)units;
    g->nparts = nt < 1 ? 1 : nt;
    if (g->nparts == 1) {
        vitc__ln_pass(g);
        vitc__gemm_task(g, 0, 0);
        return;
    }
    /* Threads splitting rows would each pack all of op(B) (N x K, every
     * K block), threads splitting columns all of op(A): pack it once,
     * shared, in parallel (a copy: the same panels, so the same bits), and
     * let the threads read it as prepacked panels. The buffer is the
     * calling thread's; the workers only read it. (A read in place, K up
     * to the kernel's direct_kc, needs no packing.) */
    vitc__coop coop; /* lives until the region below returns */
    int a_direct = g->kern && g->kern->ukr_st && !g->ta && g->K <= g->kern->direct_kc &&
                   __atomic_load_n(&vitc__gemm_direct_on, __ATOMIC_RELAXED);
    if (g->kern && g->by_cols && !a_direct && g->K > 0 && g->alpha != 0.0f &&
        g->M * g->K >= VITC_SHARED_B_MIN) {
        const vitc__gemm_kernel *kn = g->kern;
        int64_t mpad = (g->M + kn->mc - 1) / kn->mc * kn->mc;
        int64_t nic = mpad / kn->mc, nkc = (g->K + g->kc - 1) / g->kc;
        float *pa = vitc__get_scratch_n(1, (size_t)(mpad * g->K));
        /* Packed inside the GEMM's region, unless asum needs each row
         * summed by one owner, k ascending, or the blocks are too many. */
        if (pa && !g->asum && kn->mc % kn->mr == 0 && nic * nkc <= VITC_COOP_BLOCKS &&
            (!g->ln || nkc == 1)) {
            g->coop = &coop;
            vitc__coop_init(&coop, (g->M + kn->mr - 1) / kn->mr * nkc, nic * nkc, vitc__pa_strip,
                            g);
        } else if (pa) {
            vitc__ln_pass(g);
            vitc__pa_job pj = {g, pa, mpad};
            vitc__parallel_for((g->M + kn->mr - 1) / kn->mr, vitc__pa_task, &pj);
        }
        if (pa) {
            g->paw = pa;
            g->mpad = mpad;
        }
    }
    if (g->kern && !g->by_cols && !g->pbw && g->K > 0 && g->alpha != 0.0f &&
        g->N * g->K >= VITC_SHARED_B_MIN) {
        int64_t npad = (g->N + nr - 1) / nr * nr;
        float *pb = vitc__get_scratch_n(1, (size_t)(npad * g->K));
        if (pb) {
            vitc__pb_job pj = {g, pb, npad, (g->N + VITC_PB_COLS - 1) / VITC_PB_COLS};
            vitc__parallel_for((g->K + g->kc - 1) / g->kc * pj.nchunks, vitc__pb_task,
                               &pj);
            g->pbw = pb;
            g->npad = npad;
        }
    }
    if (!g->coop) vitc__ln_pass(g); /* else the packers normalise */
    /* Columns in chunks taken as threads come free, about VITC_CHUNKS_PER
     * per thread: finer balances better, coarser re-reads op(A) less. With
     * op(A) shared (packed once) a chunk costs no packing: finer still,
     * VITC_CHUNKS_SHARED per thread (a ViT-B qkv at batch 1: 96 columns,
     * ~0.1 ms, against 288 and up to 0.17 ms idle at the end). (Not with
     * asum: the thread whose panel holds column 0 sums the rows.) */
    _Atomic int64_t next_chunk;
    if (g->kern && g->by_cols && g->K > 0 && g->alpha != 0.0f && !g->asum) {
        int64_t cp = (g->paw ? VITC_CHUNKS_SHARED : VITC_CHUNKS_PER) * g->nparts;
        int64_t per = (units + cp - 1) / cp;
        if (per * g->unit > g->kern->nc) per = g->kern->nc / g->unit;
        vitc__chunks_init(&g->chunks, g->N, (per < 1 ? 1 : per) * g->unit, g->unit, g->nparts);
        atomic_init(&next_chunk, 0);
        g->next_chunk = &next_chunk;
    } else if (g->kern && !g->by_cols && g->pbw && g->K > 0 && g->alpha != 0.0f && !g->asum &&
               row_units >= 4 * (int64_t)g->nparts * (g->kern->mc / mr)) {
        /* Rows likewise, in MC-row chunks (op(B) packed, op(A) packed per
         * chunk: no row is packed twice): a batch-8 out_proj or fc2, whose
         * fixed halves left one thread waiting whenever the other was
         * slowed. */
        vitc__chunks_init(&g->chunks, g->M, g->kern->mc, g->kern->mc, g->nparts); /* whole */
        atomic_init(&next_chunk, 0);
        g->next_chunk = &next_chunk;
    }
    vitc__parallel_for(g->nparts, vitc__gemm_task, g);
}

void vitc__gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                int64_t ldc) {
    vitc__gemm_job g = {.ta = trans_a, .tb = trans_b, .M = M, .N = N, .K = K, .alpha = alpha,
                        .beta = beta, .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = ldc,
                        .nparts = 1};
    vitc__gemm_run(&g, vitc__backend() == VITC_GEMM_BUILTIN);
}

int vitc__gemm_tn_asum(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                       float *asum) {
    /* Only the built-in GEMM packs A, and only a product with work does. */
    if (vitc__backend() != VITC_GEMM_BUILTIN || M <= 0 || N <= 0 || K <= 0) return 0;
    vitc__gemm_job g = {.ta = 1, .tb = 0, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = beta,
                        .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = ldc,
                        .asum = asum, .nparts = 1};
    vitc__gemm_run(&g, 1);
    return 1;
}

void vitc__linear(float *y, int64_t ldy, const float *x, int64_t ldx, const float *W,
                  const float *bias, const float *residual, int64_t ldr, int64_t M, int64_t N,
                  int64_t K) {
    vitc__gemm_job g = {.ta = 0, .tb = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .A = x,
                        .lda = ldx, .B = W, .ldb = K, .C = y, .ldc = ldy, .bias = bias,
                        .res = residual, .ldr = ldr, .nparts = 1};
    vitc__gemm_run(&g, vitc__backend() == VITC_GEMM_BUILTIN);
}

/* act = GELU(C) after an OpenBLAS product (no epilogue of ours). */
static void vitc__act_rows(const float *C, int64_t ldc, int64_t M, int64_t N, float *act,
                           int64_t ld_act) {
    if (ldc == N && ld_act == N) { /* one threaded pass */
        memcpy(act, C, (size_t)(M * N) * sizeof(float));
        vitc__gelu(act, M * N);
        return;
    }
    for (int64_t i = 0; i < M; i++) {
        memcpy(act + i * ld_act, C + i * ldc, (size_t)N * sizeof(float));
        vitc__gelu(act + i * ld_act, N);
    }
}

void vitc__linear_act(float *y, int64_t ldy, float *act, int64_t ld_act, const float *x,
                      int64_t ldx, const float *W, const float *bias, int64_t M, int64_t N,
                      int64_t K) {
    vitc__gemm_job g = {.ta = 0, .tb = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .A = x,
                        .lda = ldx, .B = W, .ldb = K, .C = y, .ldc = ldy, .bias = bias,
                        .nparts = 1};
    int builtin = vitc__backend() == VITC_GEMM_BUILTIN;
    if (builtin) {
        g.act = act, g.ld_act = ld_act, g.gelu = vitc__kern()->gelu;
        g.gelu_to = vitc__kern()->gelu_to;
    }
    vitc__gemm_run(&g, builtin);
    if (!g.kern) vitc__act_rows(y, ldy, M, N, act, ld_act);
}

/* ---- packed weights ------------------------------------------------ */

void vitc__pweight_free(vitc__pweight *pw) {
    if (!pw) return;
    vitc__free(pw->data);
    vitc__free(pw->wscale);
    vitc__free(pw->wsum);
    memset(pw, 0, sizeof *pw);
}

const vitc__gemm_kernel *vitc__gemm_pack_kernel(void) {
    return vitc__backend() == VITC_GEMM_BUILTIN ? vitc__pick_kernel() : NULL;
}

void vitc__pweight_unpack(const vitc__pweight *pw, float *W) {
    if (!pw || !pw->data || !W) return;
    int64_t N = pw->N, K = pw->K;
    if (pw->prec != VITC_PRECISION_FP32) {
        vitc__pweight_unpack_lp(pw, W);
        return;
    }
    const int64_t NR = pw->kern->nr, KC = pw->kern->kc;
    const float *d = pw->data;
    for (int64_t pc = 0; pc < K; pc += KC) {
        int64_t kc = K - pc < KC ? K - pc : KC;
        for (int64_t j = 0; j < N; j++) {
            const float *src = d + pc * pw->npad + (j / NR) * NR * kc + j % NR; /* [kc] step NR */
            for (int64_t k = 0; k < kc; k++) W[j * K + pc + k] = src[k * NR];
        }
    }
}

vitc_status vitc__pweight_pack(vitc__pweight *pw, const float *W, int64_t N, int64_t K,
                               vitc_precision p) {
    if (!pw || !W || N < 1 || K < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "pack weight: NULL or empty [%lld, %lld]",
                         (long long)N, (long long)K);
    memset(pw, 0, sizeof *pw);
    if (p != VITC_PRECISION_FP32) return vitc__pweight_pack_lp(pw, W, N, K, p);
    const vitc__gemm_kernel *kn = vitc__pick_kernel();
    int64_t NR = kn->nr, KC = kn->kc;
    size_t npad = 0, n;
    if (N <= INT64_MAX - NR) npad = (size_t)((N + NR - 1) / NR * NR);
    if (!npad || !vitc__mul_size(npad, (size_t)K, &n) || !vitc__mul_size(n, sizeof(float), &n))
        return vitc__err(VITC_ERR_NOMEM, "pack weight [%lld, %lld]: size overflows",
                         (long long)N, (long long)K);
    float *d = vitc__alloc(n);
    if (!d)
        return vitc__err(VITC_ERR_NOMEM, "pack weight [%lld, %lld]: out of memory", (long long)N,
                         (long long)K);
    /* The same packers the GEMM runs per call: the panels hold the same
     * numbers, so the product is bitwise the unpacked one. */
    for (int64_t pc = 0; pc < K; pc += KC) {
        int64_t kc = K - pc < KC ? K - pc : KC;
        float *dst = d + pc * (int64_t)npad;
        if (kn->packb)
            kn->packb(dst, W, K, 1, pc, kc, 0, N);
        else
            vitc__gemm_packb_generic(dst, (int)NR, W, K, 1, pc, kc, 0, N);
    }
    *pw = (vitc__pweight){.prec = p, .kern = kn, .N = N, .K = K, .npad = (int64_t)npad,
                          .data = d};
    return VITC_OK;
}

int64_t vitc__pweight_col_step(const vitc__pweight *pw) {
    return pw && pw->prec == VITC_PRECISION_FP32 && pw->kern ? pw->kern->nr : 0;
}

int vitc__pweight_cols(vitc__pweight *v, const vitc__pweight *pw, int64_t j0, int64_t n) {
    const vitc__gemm_kernel *kn = pw ? pw->kern : NULL;
    if (!pw || !pw->data || pw->prec != VITC_PRECISION_FP32 || !kn || pw->K > kn->kc ||
        j0 < 0 || n < 1 || j0 % kn->nr != 0 || j0 > pw->N - n)
        return 0;
    *v = *pw;
    v->N = n;
    v->npad = (n + kn->nr - 1) / kn->nr * kn->nr;
    v->data = (float *)pw->data + j0 * pw->K; /* strip j0 / NR of the one K block */
    return 1;
}

/* act's in-place row function in table kt (vitc__linear_pw's epilogue). */
void (*vitc__act_fn(const vitc__kernels *kt, int act))(float *x, int64_t n) {
    switch (act) {
    case VITC__ACT_GELU: return kt->gelu;
    case VITC__ACT_QUICK_GELU: return kt->quick_gelu;
    case VITC__ACT_TANH_GELU: return kt->tanh_gelu;
    default: return NULL;
    }
}

/* act over y [M, N] (row stride ldy) as a pass of its own, threaded. */
static void vitc__act_pass(int act, float *y, int64_t ldy, int64_t M, int64_t N) {
    void (*f)(float *x, int64_t n) = act == VITC__ACT_GELU         ? vitc__gelu
                                     : act == VITC__ACT_QUICK_GELU ? vitc__quick_gelu
                                     : act == VITC__ACT_TANH_GELU  ? vitc__tanh_gelu
                                                                   : NULL;
    if (!f)
        return;
    if (ldy == N)
        f(y, M * N);
    else
        for (int64_t i = 0; i < M; i++) f(y + i * ldy, N);
}

/* vitc__linear_pw with an optional layer scale (vitc__linear_pw_scaled). */
static vitc_status vitc__linear_any(float *y, int64_t ldy, const float *x, int64_t ldx,
                                   const vitc__pweight *pw, const float *W, const float *bias,
                                   const float *scale, const float *residual, int64_t ldr,
                                   int64_t M, int64_t N, int64_t K, int act,
                                   const vitc__ln_pre *ln) {
    if (pw && pw->data && pw->prec != VITC_PRECISION_FP32) {
        if (pw->N != N || pw->K != K)
            return vitc__err(VITC_ERR_SHAPE, "packed weight [%lld, %lld] used as [%lld, %lld]",
                             (long long)pw->N, (long long)pw->K, (long long)N, (long long)K);
        /* the layer scale in the tiles' epilogue (gemm_lp.h), as the
         * pass after had it: DINOv2's at batch 8 had been two passes over
         * [2056, 768] a block */
        return vitc__linear_lp(y, ldy, x, ldx, pw, bias, scale, residual, ldr, M, act, ln);
    }
    if (!W) return vitc__err(VITC_ERR_INVALID_ARG, "linear: no weights");
    vitc__gemm_job g = {.ta = 0, .tb = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .A = x,
                        .lda = ldx, .B = W, .ldb = K, .C = y, .ldc = ldy, .bias = bias,
                        .res = scale ? NULL : residual, .ldr = ldr, .nparts = 1, .ln = ln};
    int builtin = vitc__backend() == VITC_GEMM_BUILTIN;
    if (builtin) {
        const vitc__kernels *kt = vitc__kern();
        if (pw && pw->data && pw->kern == kt->gemm && pw->N == N && pw->K == K) {
            g.pbw = pw->data;
            g.npad = pw->npad;
        }
        g.gelu = vitc__act_fn(kt, act);
        if (scale)
            g.scale = scale, g.sres = residual, g.ldsr = ldr, g.scale_add = kt->scale_add;
    }
    vitc__gemm_run(&g, builtin);
    if (scale && !g.scale) /* OpenBLAS: no epilogue of ours */
        vitc__scale_add(y, ldy, scale, residual, ldr, M, N);
    if (!g.gelu)
        vitc__act_pass(act, y, ldy, M, N);
    return VITC_OK;
}

vitc_status vitc__linear_pw(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const vitc__pweight *pw, const float *W, const float *bias,
                            const float *residual, int64_t ldr, int64_t M, int64_t N, int64_t K,
                            int act) {
    return vitc__linear_any(y, ldy, x, ldx, pw, W, bias, NULL, residual, ldr, M, N, K, act, NULL);
}

vitc_status vitc__linear_pw_ln(float *out, int64_t ldo, const vitc__ln_pre *ln,
                               const vitc__pweight *pw, const float *W, const float *bias,
                               int64_t M, int64_t N, int64_t K, int act) {
    return vitc__linear_any(out, ldo, ln->y, K, pw, W, bias, NULL, NULL, 0, M, N, K, act, ln);
}

vitc_status vitc__linear_pw_scaled(float *y, int64_t ldy, const float *x, int64_t ldx,
                                   const vitc__pweight *pw, const float *W, const float *bias,
                                   const float *scale, const float *residual, int64_t ldr,
                                   int64_t M, int64_t N, int64_t K) {
    return vitc__linear_any(y, ldy, x, ldx, pw, W, bias, scale, residual, ldr, M, N, K,
                            VITC__ACT_NONE, NULL);
}
