/* dispatch.c — which kernel path runs: cpuid, VITC_ARCH, vitc_set_arch,
 * and the one kernel table per path that the dispatchers read. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "attention_impl.h"
#include "cpu.h"
#include "gemm_lp.h"
#include "gemm_ukernels.h"
#include "ops_simd.h"
#include "../nn/dense.h"

/* -1 until decided; then the arch in use. Read and written atomically:
 * kernels ask from any thread, and the first ones may race to decide (they
 * reach the same answer). */
static int vitc__arch_cur = -1;

/* Whether this build has path a's kernels: its arch folder was compiled
 * (the Makefile then defines VITC_KERNELS_<FOLDER>). */
static int vitc__arch_built(vitc__arch a) {
    switch (a) {
    case VITC_ARCH_GENERIC: return 1;
#if defined(VITC_KERNELS_X86)
    case VITC_ARCH_AVX2:
    case VITC_ARCH_AVX512: return 1;
#endif
    default: return 0;
    }
}

/* Whether this build has path a and this CPU can run it. */
int vitc__cpu_has(vitc__arch a) {
    if (!vitc__arch_built(a)) return 0;
    if (a == VITC_ARCH_GENERIC) return 1;
#if defined(VITC_KERNELS_X86) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    switch (a) {
    case VITC_ARCH_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case VITC_ARCH_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    default: break;
    }
#endif
    return 0;
}

/* The best path this CPU runs: the list is in order of preference, last first. */
static vitc__arch vitc__best(void) {
    for (int a = VITC_ARCH_COUNT - 1; a > 0; a--)
        if (vitc__cpu_has((vitc__arch)a)) return (vitc__arch)a;
    return VITC_ARCH_GENERIC;
}

#define VITC__ARCH_NAME(id, name) name,
static const char *const vitc__arch_names[VITC_ARCH_COUNT] = {VITC_ARCH_LIST(VITC__ARCH_NAME)};
#undef VITC__ARCH_NAME
/* ", generic, avx2, avx512": the names for error messages (from + 2). */
#define VITC__ARCH_NAME(id, name) ", " name
static const char vitc__arch_names_text[] = VITC_ARCH_LIST(VITC__ARCH_NAME);
#undef VITC__ARCH_NAME

const char *vitc__arch_name(int a) {
    return a >= 0 && a < VITC_ARCH_COUNT ? vitc__arch_names[a] : NULL;
}

/* The index of name in names[n], or -1: VITC_ARCH's and VITC_LP_KERNEL's
 * (and their setters') names. */
static int vitc__name_index(const char *const *names, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static int vitc__parse_arch(const char *name, vitc__arch *out) {
    int i = vitc__name_index(vitc__arch_names, VITC_ARCH_COUNT, name);
    if (i < 0) return 0;
    *out = (vitc__arch)i;
    return 1;
}

vitc__arch vitc__get_arch(void) {
    int a = __atomic_load_n(&vitc__arch_cur, __ATOMIC_ACQUIRE);
    if (a < 0) {
        /* An unknown or unsupported VITC_ARCH falls back to the best path:
         * the environment is not an API call that can fail. */
        const char *env = getenv("VITC_ARCH");
        vitc__arch e;
        if (env && *env && strcmp(env, "auto") != 0 && vitc__parse_arch(env, &e) && vitc__cpu_has(e))
            a = (int)e;
        else
            a = (int)vitc__best();
        int expect = -1;
        if (!__atomic_compare_exchange_n(&vitc__arch_cur, &expect, a, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            a = expect;
    }
    return (vitc__arch)a;
}

const char *vitc_get_arch(void) { return vitc__arch_names[vitc__get_arch()]; }

vitc_status vitc_set_arch(const char *name) {
    vitc__arch a;
    if (!name || !*name || strcmp(name, "auto") == 0) {
        __atomic_store_n(&vitc__arch_cur, (int)vitc__best(), __ATOMIC_RELEASE);
        return VITC_OK;
    }
    if (!vitc__parse_arch(name, &a))
        return vitc__err(VITC_ERR_INVALID_ARG, "unknown arch \"%s\" (expected one of %s or auto)",
                         name, vitc__arch_names_text + 2);
    if (!vitc__arch_built(a))
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "this build has no %s path (its kernels are for another target; "
                         "use generic or auto)", name);
    if (!vitc__cpu_has(a))
        return vitc__err(VITC_ERR_UNSUPPORTED, "this CPU cannot run the %s path", name);
    __atomic_store_n(&vitc__arch_cur, (int)a, __ATOMIC_RELEASE);
    return VITC_OK;
}

/* ---- the kernel tables ------------------------------------------- */

/* The generic path: the plain references. Every other table starts as a
 * copy of it (BLIS's reference context), so a kernel a path lacks is the
 * reference, never a NULL. */
void vitc__kernels_init_ref(vitc__kernels *t) {
    *t = (vitc__kernels){
        .arch = VITC_ARCH_GENERIC, .name = "generic",
        .softmax_rows = vitc__softmax_rows_ref,
        .softmax_rows_exp2 = vitc__softmax_rows_exp2_ref,
        .softmax_cols = vitc__softmax_cols_ref, .softmax_rows_backward = vitc__softmax_rows_backward_ref,
        .layernorm = vitc__layernorm_ref,
        .gelu = vitc__gelu_ref, .gelu_to = vitc__gelu_to_ref, .quick_gelu = vitc__quick_gelu_ref,
        .tanh_gelu = vitc__tanh_gelu_ref, .scale_add = vitc__scale_add_ref,
        .row_stats = vitc__row_stats_ref, .row_norm = vitc__row_norm_ref,
        .dot_rows = vitc__dot_rows_ref,
        .gelu_backward = vitc__gelu_backward_ref,
        .layernorm_backward_row = vitc__layernorm_backward_row_ref,
        .colsum = vitc__colsum_ref, .layernorm_backward_cols = vitc__layernorm_backward_cols_ref,
        .adamw = vitc__adamw_ref,
        .attn_rows = vitc__attn_rows_generic, .attn_bwd = vitc__attn_bwd_generic,
        .gemm = &vitc__gemm_kernel_generic,
    };
}

/* Indexed by vitc__arch, filled once, then read only: choosing a path is
 * choosing an index, so a forced path (vitc_set_arch) takes effect at the
 * next call and a call in flight keeps the table it read. A path this
 * build lacks keeps the reference table (vitc__cpu_has never picks it). */
static vitc__kernels vitc__tables[VITC_ARCH_COUNT];
static pthread_once_t vitc__tables_once = PTHREAD_ONCE_INIT;

/* Each path's GEMM kernel as its setup gave it (its measured blocks), and
 * copies of it with the blocking of this CPU: one generation per distinct
 * blocking. A new blocking (vitc__cache_force, vitc__blocking_force) takes
 * fresh copies rather than rewrite the old ones, which fp32 weights packed
 * before (vitc__pweight's kern) still describe. */
#define VITC__BLOCK_GENS 64
static const vitc__gemm_kernel *vitc__gemm_base[VITC_ARCH_COUNT];
static vitc__gemm_kernel vitc__gemm_blocked[VITC__BLOCK_GENS][VITC_ARCH_COUNT];
static int vitc__block_gen = -1;
static pthread_mutex_t vitc__block_mu = PTHREAD_MUTEX_INITIALIZER;

static vitc_status vitc__reblock_locked(void) {
    const vitc__cpu *cpu = vitc__cpu_get();
    vitc__blocking b[VITC_ARCH_COUNT];
    for (int a = 0; a < VITC_ARCH_COUNT; a++) {
        const vitc__gemm_kernel *k = vitc__gemm_base[a];
        vitc__blocking_rule(&b[a], cpu, k->mr, k->nr, k->kc, k->mc, k->nc);
        vitc__blocking_apply_forced(&b[a], k->mr, k->nr);
    }
    /* A generation with these blocks already (a blocking forced back, as
     * tests do) is taken again: the slots bound the distinct blockings. */
    int gen = -1;
    for (int g = 0; g <= vitc__block_gen && gen < 0; g++) {
        int same = 1;
        for (int a = 0; a < VITC_ARCH_COUNT; a++) {
            const vitc__gemm_kernel *c = &vitc__gemm_blocked[g][a];
            same &= c->kc == b[a].kc && c->mc == b[a].mc && c->nc == b[a].nc;
        }
        if (same) gen = g;
    }
    if (gen < 0) {
        if (vitc__block_gen + 1 >= VITC__BLOCK_GENS)
            return vitc__err(VITC_ERR_UNSUPPORTED,
                             "%d different blockings were used in this process, the most it "
                             "keeps; start a new process to try more",
                             VITC__BLOCK_GENS);
        gen = ++vitc__block_gen;
        for (int a = 0; a < VITC_ARCH_COUNT; a++) {
            vitc__gemm_kernel *c = &vitc__gemm_blocked[gen][a];
            *c = *vitc__gemm_base[a];
            c->kc = b[a].kc, c->mc = b[a].mc, c->nc = b[a].nc;
        }
    }
    for (int a = 0; a < VITC_ARCH_COUNT; a++) {
        __atomic_store_n(&vitc__tables[a].gemm, &vitc__gemm_blocked[gen][a], __ATOMIC_RELEASE);
        vitc__tables[a].lp_mc = b[a].lp_mc;
        vitc__tables[a].lp_nb = b[a].lp_nb;
        vitc__tables[a].cpu = cpu;
    }
    return VITC_OK;
}

static void vitc__tables_init(void) {
    for (int a = 0; a < VITC_ARCH_COUNT; a++) {
        vitc__kernels_init_ref(&vitc__tables[a]);
        vitc__tables[a].arch = (vitc__arch)a;
        vitc__tables[a].name = vitc__arch_names[a];
    }
#if defined(VITC_KERNELS_X86)
    vitc__kernels_setup_avx2(&vitc__tables[VITC_ARCH_AVX2]);
    vitc__kernels_setup_avx512(&vitc__tables[VITC_ARCH_AVX512]);
#endif
    for (int a = 0; a < VITC_ARCH_COUNT; a++) vitc__gemm_base[a] = vitc__tables[a].gemm;
    pthread_mutex_lock(&vitc__block_mu);
    vitc__reblock_locked(); /* the first generation: cannot fail */
    pthread_mutex_unlock(&vitc__block_mu);
}

vitc_status vitc__tables_reblock(void) {
    pthread_once(&vitc__tables_once, vitc__tables_init);
    pthread_mutex_lock(&vitc__block_mu);
    vitc_status st = vitc__reblock_locked();
    pthread_mutex_unlock(&vitc__block_mu);
    return st;
}

const vitc__kernels *vitc__kern(void) {
    pthread_once(&vitc__tables_once, vitc__tables_init);
    return &vitc__tables[vitc__get_arch()];
}

/* ---- low-precision GEMM kernels ---------------------------------- */

/* The x86 kernels exist only where src/kernels/x86/ was built; elsewhere
 * (and in a generic-only build on x86) these are NULL and never chosen. */
#if defined(VITC_KERNELS_X86)
#define VITC__X86_LP(k) (&(k))
#else
#define VITC__X86_LP(k) ((const vitc__lp_kernel *)NULL)
#endif

/* AVX512-BF16 and AVX512-VNNI on top of the avx512 path's own features. */
static int vitc__cpu_has_lp(vitc_precision p) {
#if defined(VITC_KERNELS_X86) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (!vitc__cpu_has(VITC_ARCH_AVX512)) return 0;
    return p == VITC_PRECISION_BF16 ? __builtin_cpu_supports("avx512bf16")
                                    : __builtin_cpu_supports("avx512vnni");
#else
    (void)p;
    return 0;
#endif
}

/* AVX-VNNI (vpdpbusd on ymm): cpuid leaf 7, subleaf 1, EAX bit 4 (GCC 12's
 * __builtin_cpu_supports does not know it). */
static int vitc__cpu_has_avxvnni(void) {
#if defined(VITC_KERNELS_X86) && (defined(__x86_64__) || defined(__i386__))
    unsigned a, b, c, d;
    return vitc__cpu_has(VITC_ARCH_AVX2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           ((a >> 4) & 1u);
#else
    return 0;
#endif
}

/* ---- AMX ------------------------------------------------------------- */

static pthread_once_t vitc__amx_once = PTHREAD_ONCE_INIT;
static int vitc__amx_ok;
static const char *vitc__amx_why = "not an x86-64 build (src/kernels/x86/)";

/* Once per process: cpuid leaf 7 EDX bits 24 (AMX-TILE), 22 (AMX-BF16), 25
 * (AMX-INT8); the AVX-512 features the AMX kernels' epilogue and
 * converters use; XCR0 bits 17 and 18 (the OS saves tile config and
 * data); then Linux's permission to use tile data (8 KB more per thread
 * to save: asked for, not granted by default): arch_prctl(
 * ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18). */
static void vitc__amx_probe(void) {
#if defined(VITC_KERNELS_X86) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1u)) {
        vitc__amx_why = "no AMX-TILE in cpuid";
        return;
    }
    if (!((d >> 22) & 1u) || !((d >> 25) & 1u)) {
        vitc__amx_why = "no AMX-BF16 / AMX-INT8 in cpuid";
        return;
    }
    if (!vitc__cpu_has_lp(VITC_PRECISION_BF16) || !vitc__cpu_has_lp(VITC_PRECISION_INT8)) {
        vitc__amx_why = "no AVX512-BF16 / VNNI beside it";
        return;
    }
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) {
        vitc__amx_why = "no OSXSAVE";
        return;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if (((lo >> 17) & 3u) != 3u) {
        vitc__amx_why = "the OS does not enable tile state (XCR0)";
        return;
    }
#if defined(__linux__)
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        vitc__amx_why = "Linux refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM)";
        return;
    }
#endif
    vitc__amx_ok = 1;
    vitc__amx_why = NULL;
#endif
}

int vitc__amx_usable(const char **why) {
    pthread_once(&vitc__amx_once, vitc__amx_probe);
    if (why) *why = vitc__amx_why;
    return vitc__amx_ok;
}

/* ---- which low-precision kernel ---------------------------------------- */

/* A kernel forced by name (BLIS-style, for tests and comparisons): -1 until
 * VITC_LP_KERNEL is read, then an index of vitc__lp_names (0: none). */
static const char *const vitc__lp_names[] = {"auto", "reference", "avx512", "avx-vnni", "amx",
                                             "amx-emulated", "avx2", "avx2-w7"};
#define VITC__LP_NNAMES (int)(sizeof vitc__lp_names / sizeof vitc__lp_names[0])
static int vitc__lp_forced = -1;
static char vitc__lp_env_bad[32]; /* an unknown VITC_LP_KERNEL, for precision_paths */
static pthread_once_t vitc__lp_env_once = PTHREAD_ONCE_INIT;

static int vitc__lp_parse(const char *name) {
    if (!name || !*name) return 0;
    return vitc__name_index(vitc__lp_names, VITC__LP_NNAMES, name);
}

static void vitc__lp_env(void) {
    const char *env = getenv("VITC_LP_KERNEL");
    int i = vitc__lp_parse(env);
    if (i < 0) snprintf(vitc__lp_env_bad, sizeof vitc__lp_env_bad, "%s", env);
    int expect = -1; /* vitc__lp_force may have been first */
    __atomic_compare_exchange_n(&vitc__lp_forced, &expect, i < 0 ? 0 : i, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

static int vitc__lp_forced_index(void) {
    int i = __atomic_load_n(&vitc__lp_forced, __ATOMIC_ACQUIRE);
    if (i < 0) {
        pthread_once(&vitc__lp_env_once, vitc__lp_env);
        i = __atomic_load_n(&vitc__lp_forced, __ATOMIC_ACQUIRE);
    }
    return i;
}

vitc_status vitc__lp_force(const char *name) {
    int i = name && strcmp(name, "auto") ? vitc__lp_parse(name) : 0;
    if (i < 0)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "unknown low-precision kernel \"%s\" (expected reference, avx512, "
                         "avx-vnni, avx2, avx2-w7, amx, amx-emulated or auto)", name);
    pthread_once(&vitc__lp_env_once, vitc__lp_env); /* so that a later first read cannot undo it */
    __atomic_store_n(&vitc__lp_forced, i, __ATOMIC_RELEASE);
    return VITC_OK;
}

/* The forced kernel of precision p when this CPU can run it, else NULL. */
static const vitc__lp_kernel *vitc__lp_forced_kernel(vitc_precision p, int i) {
    int bf = p == VITC_PRECISION_BF16;
    switch (i) {
    case 1: return bf ? &vitc__lp_bf16_ref : &vitc__lp_int8_ref;
    case 2:
        return vitc__cpu_has_lp(p) ? (bf ? VITC__X86_LP(vitc__lp_bf16_avx512)
                                         : VITC__X86_LP(vitc__lp_int8_avx512))
                                   : NULL;
    case 3: return !bf && vitc__cpu_has_avxvnni() ? VITC__X86_LP(vitc__lp_int8_avxvnni) : NULL;
    case 4:
        return vitc__amx_usable(NULL) ? (bf ? VITC__X86_LP(vitc__lp_bf16_amx)
                                            : VITC__X86_LP(vitc__lp_int8_amx))
                                      : NULL;
    case 5: return bf ? &vitc__lp_bf16_amx_emul : &vitc__lp_int8_amx_emul;
    case 6:
    case 7: /* avx2-w7: bf16's is avx2's */
        return !vitc__cpu_has(VITC_ARCH_AVX2) ? NULL
               : bf                           ? VITC__X86_LP(vitc__lp_bf16_avx2)
               : i == 6                       ? VITC__X86_LP(vitc__lp_int8_avx2)
                                              : VITC__X86_LP(vitc__lp_int8_avx2_w7);
    }
    return NULL;
}

/* A forced kernel when this CPU can run it; else a path of the AVX-512
 * family (its table's lp_family) takes AMX where usable, then AVX512-BF16 /
 * AVX512-VNNI, one of the AVX-VNNI family (the avx2 path) AVX-VNNI (int8)
 * or else AVX2's vpmaddwd (int8) and FMA on widened bf16 (bf16), and
 * otherwise the reference. The AVX-512 and AMX kernels only on the avx512 path and
 * AVX-VNNI's on the avx2 path, so VITC_ARCH=avx2|generic
 * (and vitc_set_arch) select the others: the tests run every one this CPU
 * has, and the reference. */
const vitc__lp_kernel *vitc__lp_kernel_for(vitc_precision p) {
    const vitc__lp_kernel *f = vitc__lp_forced_kernel(p, vitc__lp_forced_index());
    if (f) return f;
    int fam = vitc__kern()->lp_family;
    int fast = fam == VITC__LP_FAMILY_AVX512 && vitc__cpu_has_lp(p);
    /* fast is 0 where the x86 kernels are not built: no NULL comes back */
    if (fast && vitc__amx_usable(NULL))
        return p == VITC_PRECISION_BF16 ? VITC__X86_LP(vitc__lp_bf16_amx)
                                        : VITC__X86_LP(vitc__lp_int8_amx);
    if (p == VITC_PRECISION_BF16)
        return fast                            ? VITC__X86_LP(vitc__lp_bf16_avx512)
               : fam == VITC__LP_FAMILY_AVXVNNI ? VITC__X86_LP(vitc__lp_bf16_avx2)
                                               : &vitc__lp_bf16_ref;
    /* Without VNNI, vpmaddwd on 8-bit weights: int8's numbers on every CPU.
     * VITC_LP_KERNEL=avx2-w7 trades a bit of weight for 1.2x there
     * (ONNX Runtime's reduce_range; docs/precision.md): opted into, as its
     * numbers are another quantization's (SAM's masks moved). */
    if (!fast && fam == VITC__LP_FAMILY_AVXVNNI)
        return vitc__cpu_has_avxvnni() ? VITC__X86_LP(vitc__lp_int8_avxvnni)
                                       : VITC__X86_LP(vitc__lp_int8_avx2);
    return fast ? VITC__X86_LP(vitc__lp_int8_avx512) : &vitc__lp_int8_ref;
}

/* Whether the attention in precision p (attention_lp.c, whose microkernels
 * are the vector vdpbf16ps / vpdpbusd whichever kernel runs the GEMMs)
 * beats fp32's here: the default of bf16 and int8 models. AMD's Zen 4 runs
 * vdpbf16ps at twice its fp32 FMA rate; Intel's cores at half of it (an
 * Emerald Rapids, 2 threads: 119 against 265 GFLOP/s), where ViT-B/16's
 * attention at batch 8 took 140 ms in bf16 and 84-91 ms in fp32 (an AMX
 * attention would be the way there). int8 is kept to the same CPUs: it
 * has not been timed on an Intel core. Without AVX512-BF16 / VNNI it would
 * be the scalar reference. */
int vitc__attention_pays(vitc_precision p) {
    if (p == VITC_PRECISION_INT8 &&
        vitc__lp_attention_kernel(p) == VITC__X86_LP(vitc__lp_int8_avx2_w7))
        return 1;
    return (p == VITC_PRECISION_BF16 || p == VITC_PRECISION_INT8) && vitc__cpu_has_lp(p) &&
           strcmp(vitc__cpu_get()->vendor, "GenuineIntel") != 0;
}

const vitc__lp_kernel *vitc__lp_attention_kernel(vitc_precision p) {
    const vitc__lp_kernel *k = vitc__lp_kernel_for(p);
    /* AMX's CPUs all have AVX512-VNNI; AVX2's int16 words (no VNNI) the
     * reference; avx2-w7 has panels of its own, on its weights' range */
    if (p == VITC_PRECISION_INT8 &&
        (k->mr != VITC_LP_MR || k->a_kpad || k->i16 || (k->wmax && !k->s8_rows))) {
        const vitc__lp_kernel *v = VITC__X86_LP(vitc__lp_int8_avx512);
        return v && vitc__cpu_has_lp(p) ? v : &vitc__lp_int8_ref;
    }
    return k;
}

static const char *vitc__lp_desc(const vitc__lp_kernel *k, int forced) {
    if (k == VITC__X86_LP(vitc__lp_bf16_avx512)) return "avx512-bf16 (vdpbf16ps)";
    if (k == VITC__X86_LP(vitc__lp_int8_avx512)) return "avx512-vnni (vpdpbusd)";
    if (k == VITC__X86_LP(vitc__lp_int8_avxvnni)) return "avx-vnni (vpdpbusd ymm)";
    if (k == VITC__X86_LP(vitc__lp_int8_avx2)) return "avx2 (vpmaddwd on int16 words, no VNNI)";
    if (k == VITC__X86_LP(vitc__lp_int8_avx2_w7))
        return "avx2-w7 (vpmaddubsw, weights in [-64, 64], no VNNI)";
    if (k == VITC__X86_LP(vitc__lp_bf16_avx2))
        return "avx2 (bf16 widened for vfmadd231ps, no AVX512-BF16)";
    if (k == VITC__X86_LP(vitc__lp_bf16_amx)) return "amx-bf16 (tdpbf16ps)";
    if (k == VITC__X86_LP(vitc__lp_int8_amx)) return "amx-int8 (tdpbusd)";
    if (k == &vitc__lp_bf16_amx_emul || k == &vitc__lp_int8_amx_emul)
        return "amx-emulated (tile instructions in C, slow)";
    if (forced) return "reference";
    return k == &vitc__lp_bf16_ref ? "reference (no AVX512-BF16 on this path)"
                                   : "reference (no VNNI on this path)";
}

/* Built per call into this thread's buffer (the choice can change: arch,
 * forced kernel). */
const char *vitc_get_precision_paths(void) {
    static _Thread_local char buf[384];
    const vitc__lp_kernel *b = vitc__lp_kernel_for(VITC_PRECISION_BF16);
    const vitc__lp_kernel *i = vitc__lp_kernel_for(VITC_PRECISION_INT8);
    int fi = vitc__lp_forced_index();
    int fb = vitc__lp_forced_kernel(VITC_PRECISION_BF16, fi) != NULL;
    int f8 = vitc__lp_forced_kernel(VITC_PRECISION_INT8, fi) != NULL;
    int n = snprintf(buf, sizeof buf, "bf16: %s, int8: %s", vitc__lp_desc(b, fb),
                     vitc__lp_desc(i, f8));
    const char *why = NULL;
    if (n > 0 && (size_t)n < sizeof buf) {
        if (fi > 0)
            n += snprintf(buf + n, sizeof buf - (size_t)n, "; VITC_LP_KERNEL=%s%s",
                          vitc__lp_names[fi],
                          fb && f8   ? ""
                          : fb || f8 ? (fb ? " (int8: this CPU cannot run it)"
                                           : " (bf16: this CPU cannot run it)")
                                     : " ignored (this CPU cannot run it)");
        else if (vitc__lp_env_bad[0])
            n += snprintf(buf + n, sizeof buf - (size_t)n, "; VITC_LP_KERNEL=%s unknown: ignored",
                          vitc__lp_env_bad);
    }
    if (n > 0 && (size_t)n < sizeof buf && vitc__kern()->lp_family == VITC__LP_FAMILY_AVX512 &&
        !vitc__amx_usable(&why))
        n += snprintf(buf + n, sizeof buf - (size_t)n, "; AMX: not used (%s)", why);
    /* the dense layers' (src/nn/dense.c) only choice: said when forced */
    if (n > 0 && (size_t)n < sizeof buf && !strcmp(vitc__nn_dense_path(), "ref"))
        snprintf(buf + n, sizeof buf - (size_t)n, "; dense layers: reference (VITC_DENSE=ref)");
    return buf;
}

const char *vitc_precision_name(vitc_precision p) {
    switch (p) {
    case VITC_PRECISION_FP32: return "fp32";
    case VITC_PRECISION_BF16: return "bf16";
    case VITC_PRECISION_INT8: return "int8";
    }
    return NULL;
}

int vitc_precision_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "fp32")) return VITC_PRECISION_FP32;
    if (!strcmp(name, "bf16")) return VITC_PRECISION_BF16;
    if (!strcmp(name, "int8")) return VITC_PRECISION_INT8;
    return -1;
}
