/*
 * cpu.h — what the CPU is (vendor, model, caches, AVX-512 datapath, AMX),
 * read once at run time, and the cache blocking of the GEMMs derived from
 * it (BLIS's context). dispatch.c puts the blocking into the kernel tables;
 * the GEMMs read it from there.
 */
#ifndef VITC_CPU_H
#define VITC_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

/* How wide AVX-512's arithmetic is on this core. */
enum {
    VITC__DP_UNKNOWN = 0, /* AVX-512 on a core not in the tables */
    VITC__DP_NONE = 1,    /* no AVX-512 */
    VITC__DP_256 = 2,     /* AVX-512 split over 256-bit units (Zen 4, Zen 5 mobile) */
    VITC__DP_512 = 3,     /* full-width units (Intel server cores, Zen 5 desktop / server) */
};

typedef struct vitc__cpu {
    char vendor[16]; /* "AuthenticAMD", "GenuineIntel"; "" off x86 */
    char brand[64];  /* cpuid's brand string, trimmed; "unknown" without one */
    int family, model, stepping; /* displayed values (base + extended) */
    const char *uarch;           /* "Zen 4", "Sapphire Rapids", ... or "unknown" */
    int datapath;                /* VITC__DP_* */
    int avx512, amx;             /* cpuid says AVX-512F / AMX-TILE+BF16+INT8 */
    /* bytes: L1d and L2 of one core, L3 one instance (shared by its cores) */
    int64_t l1d, l2, l3, line;
    const char *cache_from; /* "cpuid", "sysfs", "defaults", "VITC_CACHE" */
    /* vendor-uarch-brand-f<family>m<model>, e.g. "amd-zen4-epyc-f25m17":
     * the name of this CPU's file in bench/results/ */
    char id[128];
} vitc__cpu;

/* The CPU as detected, with VITC_CACHE applied (or vitc__cache_force's
 * caches); filled once, never NULL. */
const vitc__cpu *vitc__cpu_get(void);

/* The cache blocks of the GEMMs. fp32 (gemm.c): kc x mc of op(A), kc x nc
 * of op(B), for a microkernel of mr x nr. bf16 / int8 (gemm_lp.c, whole K
 * per tile): lp_mc rows of A per block, lp_nb bytes of weight strips per
 * block. */
typedef struct vitc__blocking {
    int64_t kc, mc, nc, lp_mc, lp_nb;
} vitc__blocking;

/* The rules (cpu.c, docs/kernels.md "Blocking from the CPU") applied to
 * cpu for a microkernel of mr x nr whose own blocks (measured on a 1 MB
 * L2) are kc_max (the deepest K block), mc_ref, nc_max. */
void vitc__blocking_rule(vitc__blocking *b, const vitc__cpu *cpu, int mr, int nr, int64_t kc_max,
                         int64_t mc_ref, int64_t nc_max);
/* b with the values forced (VITC_BLOCKING or vitc__blocking_force) put in,
 * rounded to what the kernel needs (mc a multiple of mr, nc of nr). */
void vitc__blocking_apply_forced(vitc__blocking *b, int mr, int nr);
/* Where the blocking comes from: "the caches", or "VITC_BLOCKING=..." /
 * "forced ..." text when forced (valid until the next force). */
const char *vitc__blocking_from(void);

/* For tests and experiments, while no kernel runs. spec: VITC_CACHE's
 * ("l1d=48K,l2=2M,l3=105M,line=64": any subset; K, M, G = KiB, MiB, GiB) or
 * VITC_BLOCKING's ("kc,mc,nc" or "kc=256,mc=96,nc=2048,lp_mc=144,lp_nb=384K",
 * any subset, the rest from the rules); NULL or "" drops the forcing (the
 * environment too). A bad spec is VITC_ERR_INVALID_ARG and changes
 * nothing. The kernel tables are re-derived (dispatch.c): fp32 weights
 * packed before keep their kernel's blocks and are read row-major after. */
vitc_status vitc__cache_force(const char *spec);
vitc_status vitc__blocking_force(const char *spec);

/* dispatch.c: re-derive every table's blocking from vitc__cpu_get() and
 * the forced values. */
vitc_status vitc__tables_reblock(void);

#endif
