/* cpu.c — the CPU described once at run time (cpuid, else sysfs, else
 * defaults), the cache blocking of the GEMMs derived from it, the two
 * variables that force them (VITC_CACHE, VITC_BLOCKING), and
 * vitc_cpu_info() which prints it all. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu.h"
#include "gemm_ukernels.h"
#include "vitc.h"

/* What the blocks were measured with (a Zen 5 core, checked on this Zen 4):
 * used when nothing can be read. */
#define VITC__DEF_L1D (32 * 1024)
#define VITC__DEF_L2 (1024 * 1024)
#define VITC__DEF_L3 (8 * 1024 * 1024)
#define VITC__DEF_LINE 64

/* ---- the microarchitecture from family / model -------------------- */

typedef struct vitc__uarch_row {
    int family, model_lo, model_hi;
    const char *name;
    int datapath; /* for cores with AVX-512; VITC__DP_NONE otherwise */
} vitc__uarch_row;

/* Only what is known for sure; anything else is "unknown". AMD: the
 * family / model ranges of each generation. Zen 5's mobile parts (Strix
 * Point, Krackan) run AVX-512 on 256-bit units like Zen 4; its desktop,
 * server and Strix Halo parts have full-width units. */
static const vitc__uarch_row vitc__amd_rows[] = {
    {0x17, 0x00, 0x2f, "Zen / Zen+", VITC__DP_NONE},
    {0x17, 0x30, 0xff, "Zen 2", VITC__DP_NONE},
    {0x19, 0x00, 0x0f, "Zen 3", VITC__DP_NONE},
    {0x19, 0x10, 0x1f, "Zen 4", VITC__DP_256},
    {0x19, 0x20, 0x5f, "Zen 3", VITC__DP_NONE},
    {0x19, 0x60, 0x7f, "Zen 4", VITC__DP_256},
    {0x19, 0xa0, 0xaf, "Zen 4", VITC__DP_256},
    {0x1a, 0x00, 0x1f, "Zen 5", VITC__DP_512},
    {0x1a, 0x20, 0x2f, "Zen 5", VITC__DP_256},
    {0x1a, 0x40, 0x4f, "Zen 5", VITC__DP_512},
    {0x1a, 0x60, 0x6f, "Zen 5", VITC__DP_256},
    {0x1a, 0x70, 0x7f, "Zen 5", VITC__DP_512},
};

/* Intel family 6 by model. The AVX-512 cores here all have 512-bit units
 * (the client ones one FMA unit of them, the server ones one or two). */
static const vitc__uarch_row vitc__intel_rows[] = {
    {6, 0x4e, 0x4e, "Skylake", VITC__DP_NONE},
    {6, 0x5e, 0x5e, "Skylake", VITC__DP_NONE},
    {6, 0x8e, 0x8e, "Kaby / Coffee Lake", VITC__DP_NONE},
    {6, 0x9e, 0x9e, "Kaby / Coffee Lake", VITC__DP_NONE},
    {6, 0xa5, 0xa6, "Comet Lake", VITC__DP_NONE},
    {6, 0x55, 0x55, "Skylake-SP / Cascade Lake", VITC__DP_512},
    {6, 0x66, 0x66, "Cannon Lake", VITC__DP_512},
    {6, 0x6a, 0x6a, "Ice Lake-SP", VITC__DP_512},
    {6, 0x6c, 0x6c, "Ice Lake-D", VITC__DP_512},
    {6, 0x7d, 0x7e, "Ice Lake", VITC__DP_512},
    {6, 0x8c, 0x8d, "Tiger Lake", VITC__DP_512},
    {6, 0xa7, 0xa7, "Rocket Lake", VITC__DP_512},
    {6, 0x8f, 0x8f, "Sapphire Rapids", VITC__DP_512},
    {6, 0xcf, 0xcf, "Emerald Rapids", VITC__DP_512},
    {6, 0xad, 0xae, "Granite Rapids", VITC__DP_512},
    {6, 0x97, 0x9a, "Alder Lake", VITC__DP_NONE},
    {6, 0xb7, 0xb7, "Raptor Lake", VITC__DP_NONE},
    {6, 0xba, 0xba, "Raptor Lake", VITC__DP_NONE},
    {6, 0xbf, 0xbf, "Raptor Lake", VITC__DP_NONE},
    {6, 0xaa, 0xac, "Meteor Lake", VITC__DP_NONE},
    {6, 0xaf, 0xaf, "Sierra Forest", VITC__DP_NONE},
};

static const vitc__uarch_row *vitc__uarch_find(const vitc__uarch_row *rows, size_t n, int family,
                                               int model) {
    for (size_t i = 0; i < n; i++)
        if (rows[i].family == family && model >= rows[i].model_lo && model <= rows[i].model_hi)
            return &rows[i];
    return NULL;
}

static void vitc__uarch_of(vitc__cpu *c) {
    const vitc__uarch_row *r = NULL;
    if (!strcmp(c->vendor, "AuthenticAMD"))
        r = vitc__uarch_find(vitc__amd_rows, sizeof vitc__amd_rows / sizeof *r, c->family,
                             c->model);
    else if (!strcmp(c->vendor, "GenuineIntel"))
        r = vitc__uarch_find(vitc__intel_rows, sizeof vitc__intel_rows / sizeof *r, c->family,
                             c->model);
    c->uarch = r ? r->name : "unknown";
    /* 0x55 holds three generations, told apart by the stepping */
    if (r && c->family == 6 && c->model == 0x55)
        c->uarch = c->stepping >= 10 ? "Cooper Lake" : c->stepping >= 5 ? "Cascade Lake"
                                                                         : "Skylake-SP";
    if (!c->avx512)
        c->datapath = VITC__DP_NONE;
    else
        c->datapath = r && r->datapath != VITC__DP_NONE ? r->datapath : VITC__DP_UNKNOWN;
}

/* ---- caches --------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
/* One deterministic cache-parameters leaf (Intel's 4, AMD's 0x8000001D:
 * the same layout): the data / unified caches of levels 1 to 3. */
static int vitc__cache_leaf(unsigned leaf, vitc__cpu *c) {
    int found = 0;
    for (unsigned i = 0; i < 16; i++) {
        unsigned a, b, cx, d;
        __cpuid_count(leaf, i, a, b, cx, d);
        unsigned type = a & 31u, level = (a >> 5) & 7u;
        if (type == 0) break;
        if (type == 2) continue; /* instructions */
        int64_t line = (int64_t)(b & 0xfffu) + 1, parts = (int64_t)((b >> 12) & 0x3ffu) + 1;
        int64_t ways = (int64_t)(b >> 22) + 1, sets = (int64_t)cx + 1;
        int64_t size = ways * parts * line * sets;
        if (level == 1) c->l1d = size, c->line = line;
        else if (level == 2) c->l2 = size;
        else if (level == 3) c->l3 = size;
        found |= 1 << level;
    }
    return (found & 6) == 6; /* L1d and L2 at least */
}
#endif

/* "32K", "1024K", "32M" as sysfs writes sizes. */
static int64_t vitc__sysfs_int(const char *path, int with_unit) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = {0};
    char *ok = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!ok) return -1;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (end == buf || v <= 0) return -1;
    if (with_unit) {
        if (*end == 'K') v *= 1024;
        else if (*end == 'M') v *= 1024 * 1024;
        else if (*end == 'G') v *= 1024LL * 1024 * 1024;
    }
    return v;
}

static int vitc__cache_sysfs(vitc__cpu *c) {
    int found = 0;
    for (int i = 0; i < 8; i++) {
        char p[96], type[32] = {0};
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        FILE *f = fopen(p, "r");
        if (!f) break;
        char *ok = fgets(type, sizeof type, f);
        fclose(f);
        if (!ok || !strncmp(type, "Instruction", 11)) continue;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        int64_t level = vitc__sysfs_int(p, 0);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        int64_t size = vitc__sysfs_int(p, 1);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/coherency_line_size", i);
        int64_t line = vitc__sysfs_int(p, 0);
        if (level < 1 || level > 3 || size <= 0) continue;
        if (level == 1) c->l1d = size, c->line = line > 0 ? line : c->line;
        else if (level == 2) c->l2 = size;
        else c->l3 = size;
        found |= 1 << level;
    }
    return (found & 6) == 6;
}

/* ---- identification ------------------------------------------------- */

/* "amd-zen4-epyc-f25m17": vendor, uarch without spaces, the brand's first
 * word after the vendor's name, family and model in decimal. */
static void vitc__make_id(vitc__cpu *c) {
    const char *v = !strcmp(c->vendor, "AuthenticAMD")   ? "amd"
                    : !strcmp(c->vendor, "GenuineIntel") ? "intel"
                                                         : "cpu";
    char ua[32] = {0}, word[24] = {0};
    size_t n = 0;
    for (const char *s = c->uarch; *s && n + 1 < sizeof ua; s++)
        if (isalnum((unsigned char)*s)) ua[n++] = (char)tolower((unsigned char)*s);
    /* the brand's words: skip the vendor's and trademarks, keep the next */
    const char *s = c->brand;
    while (*s) {
        while (*s == ' ') s++;
        const char *e = s;
        while (*e && *e != ' ') e++;
        char w[24] = {0};
        size_t m = 0;
        for (const char *p = s; p < e && m + 1 < sizeof w; p++) {
            if (*p == '(') { /* (R), (TM) */
                while (p < e && *p != ')') p++;
                continue;
            }
            if (isalnum((unsigned char)*p)) w[m++] = (char)tolower((unsigned char)*p);
        }
        s = e;
        if (!m || !strcmp(w, "amd") || !strcmp(w, "intel") || !strcmp(w, "unknown")) continue;
        memcpy(word, w, sizeof word);
        break;
    }
    snprintf(c->id, sizeof c->id, "%s-%s%s%s-f%dm%d", v, ua[0] ? ua : "unknown", word[0] ? "-" : "",
             word, c->family, c->model);
}

static void vitc__cpu_detect(vitc__cpu *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->brand, sizeof c->brand, "unknown");
    int from_cpuid = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, cx, d, max_basic = __get_cpuid_max(0, NULL), max_ext = __get_cpuid_max(0x80000000u, NULL);
    if (max_basic >= 1) {
        unsigned r[3];
        __cpuid(0, a, r[0], r[2], r[1]); /* EBX EDX ECX spell the vendor */
        memcpy(c->vendor, r, 12);
        __cpuid(1, a, b, cx, d);
        int base_f = (int)((a >> 8) & 15u), base_m = (int)((a >> 4) & 15u);
        c->family = base_f == 15 ? base_f + (int)((a >> 20) & 255u) : base_f;
        c->model = base_f == 6 || base_f == 15 ? base_m | (int)((a >> 16) & 15u) << 4 : base_m;
        c->stepping = (int)(a & 15u);
    }
    if (max_basic >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        c->avx512 = (int)((b >> 16) & 1u);
        c->amx = ((d >> 24) & 1u) && ((d >> 22) & 1u) && ((d >> 25) & 1u);
    }
    if (max_ext >= 0x80000004u) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
        char br[49];
        memcpy(br, r, 48);
        br[48] = 0;
        char *s = br, *e;
        while (*s == ' ') s++;
        e = s + strlen(s);
        while (e > s && (e[-1] == ' ' || e[-1] == 0)) *--e = 0;
        if (*s) snprintf(c->brand, sizeof c->brand, "%s", s);
    }
    c->line = VITC__DEF_LINE;
    if (!strcmp(c->vendor, "AuthenticAMD") && max_ext >= 0x8000001du) {
        __cpuid(0x80000001u, a, b, cx, d);
        if ((cx >> 22) & 1u) from_cpuid = vitc__cache_leaf(0x8000001du, c); /* TOPOEXT */
    } else if (!strcmp(c->vendor, "GenuineIntel") && max_basic >= 4) {
        from_cpuid = vitc__cache_leaf(4, c);
    }
#endif
    c->cache_from = "cpuid";
    if (!from_cpuid) {
        c->l1d = c->l2 = c->l3 = 0;
        c->cache_from = vitc__cache_sysfs(c) ? "sysfs" : "defaults";
    }
    if (c->l1d <= 0) c->l1d = VITC__DEF_L1D;
    if (c->l2 <= 0) c->l2 = VITC__DEF_L2;
    if (c->l3 <= 0) c->l3 = VITC__DEF_L3;
    if (c->line <= 0) c->line = VITC__DEF_LINE;
    vitc__uarch_of(c);
    vitc__make_id(c);
}

/* ---- "l1d=48K,l2=2M" and "kc,mc,nc" --------------------------------- */

/* A size: digits, then K, M or G (binary) or nothing (bytes). */
static int vitc__parse_size(const char *s, size_t n, int64_t *out) {
    int64_t v = 0;
    size_t i = 0;
    for (; i < n && isdigit((unsigned char)s[i]); i++) {
        if (v > ((int64_t)1 << 40)) return 0;
        v = v * 10 + (s[i] - '0');
    }
    if (i == 0) return 0;
    if (i < n) {
        char u = (char)toupper((unsigned char)s[i++]);
        int shift = u == 'K' ? 10 : u == 'M' ? 20 : u == 'G' ? 30 : -1;
        if (shift < 0 || v > ((int64_t)1 << 40) >> shift) return 0; /* no overflow */
        v <<= shift;
        if (i < n && toupper((unsigned char)s[i]) == 'B') i++; /* "KB" */
        if (i < n && toupper((unsigned char)s[i]) == 'I') i++; /* "KiB" */
        if (i < n && toupper((unsigned char)s[i]) == 'B') i++;
    }
    if (i != n) return 0;
    *out = v;
    return 1;
}

/* Parses spec's comma-separated items into vals[nkeys] (-1: not given).
 * An item is key=size, or (positional, when allowed) a bare size. On a
 * bad item, writes why into err and returns 0. */
static int vitc__parse_spec(const char *spec, const char *const *keys, int nkeys,
                            int positional, int64_t *vals, char *err, size_t errlen) {
    for (int k = 0; k < nkeys; k++) vals[k] = -1;
    int pos = 0;
    const char *s = spec;
    while (*s) {
        const char *e = strchr(s, ',');
        if (!e) e = s + strlen(s);
        while (s < e && *s == ' ') s++;
        const char *eq = NULL;
        for (const char *p = s; p < e && !eq; p++)
            if (*p == '=') eq = p;
        int k = -1;
        const char *v = s;
        if (eq) {
            for (int j = 0; j < nkeys; j++)
                if ((size_t)(eq - s) == strlen(keys[j]) && !strncmp(s, keys[j], (size_t)(eq - s)))
                    k = j;
            if (k < 0) {
                snprintf(err, errlen, "unknown key \"%.*s\"", (int)(eq - s), s);
                return 0;
            }
            v = eq + 1;
        } else if (positional && pos < nkeys && e > s) {
            k = pos++;
        } else {
            snprintf(err, errlen, "\"%.*s\" is not key=value", (int)(e - s), s);
            return 0;
        }
        size_t vn = (size_t)(e - v);
        while (vn && v[vn - 1] == ' ') vn--;
        if (!vitc__parse_size(v, vn, &vals[k])) {
            snprintf(err, errlen, "bad size \"%.*s\" for %s (digits, then K, M or G)", (int)vn, v,
                     keys[k]);
            return 0;
        }
        s = *e ? e + 1 : e;
    }
    return 1;
}

static const char *const vitc__cache_keys[] = {"l1d", "l2", "l3", "line"};
static const char *const vitc__blk_keys[] = {"kc", "mc", "nc", "lp_mc", "lp_nb"};
#define VITC__NCACHE 4
#define VITC__NBLK 5

static vitc__cpu vitc__cpu_detected, vitc__cpu_cur;
static pthread_once_t vitc__cpu_once = PTHREAD_ONCE_INIT;
static int64_t vitc__blk_forced[VITC__NBLK]; /* -1: from the rules */
static char vitc__blk_from[192] = "the caches";

static void vitc__cache_set(const int64_t *v, const char *from) {
    vitc__cpu_cur = vitc__cpu_detected;
    int64_t *dst[VITC__NCACHE] = {&vitc__cpu_cur.l1d, &vitc__cpu_cur.l2, &vitc__cpu_cur.l3,
                                  &vitc__cpu_cur.line};
    int any = 0;
    for (int k = 0; k < VITC__NCACHE; k++)
        if (v && v[k] > 0) *dst[k] = v[k], any = 1;
    if (any) vitc__cpu_cur.cache_from = from;
}

static void vitc__blk_set(const int64_t *v, const char *spec, const char *how) {
    int any = 0;
    for (int k = 0; k < VITC__NBLK; k++) {
        vitc__blk_forced[k] = v && v[k] > 0 ? v[k] : -1;
        any |= vitc__blk_forced[k] > 0;
    }
    if (any)
        snprintf(vitc__blk_from, sizeof vitc__blk_from, "%s%s", how, spec);
    else
        snprintf(vitc__blk_from, sizeof vitc__blk_from, "the caches");
}

/* The environment's forcing: an unusable value is ignored (the environment
 * is not an API call that can fail), and said so where it is printed. */
static void vitc__cpu_init(void) {
    vitc__cpu_detect(&vitc__cpu_detected);
    int64_t v[VITC__NBLK];
    char err[96];
    const char *env = getenv("VITC_CACHE");
    if (env && *env && vitc__parse_spec(env, vitc__cache_keys, VITC__NCACHE, 0, v, err, sizeof err))
        vitc__cache_set(v, "VITC_CACHE");
    else
        vitc__cache_set(NULL, NULL);
    if (env && *env && strcmp(vitc__cpu_cur.cache_from, "VITC_CACHE"))
        vitc__cpu_cur.cache_from = "VITC_CACHE unusable: ignored";
    vitc__blk_set(NULL, "", "");
    env = getenv("VITC_BLOCKING");
    if (env && *env) {
        if (vitc__parse_spec(env, vitc__blk_keys, VITC__NBLK, 1, v, err, sizeof err))
            vitc__blk_set(v, env, "VITC_BLOCKING=");
        else
            snprintf(vitc__blk_from, sizeof vitc__blk_from,
                     "the caches (VITC_BLOCKING=%.40s ignored: %.96s)", env, err);
    }
}

const vitc__cpu *vitc__cpu_get(void) {
    pthread_once(&vitc__cpu_once, vitc__cpu_init);
    return &vitc__cpu_cur;
}

const char *vitc__blocking_from(void) {
    vitc__cpu_get();
    return vitc__blk_from;
}

vitc_status vitc__cache_force(const char *spec) {
    vitc__cpu_get();
    int64_t v[VITC__NCACHE];
    char err[96];
    if (spec && *spec && !vitc__parse_spec(spec, vitc__cache_keys, VITC__NCACHE, 0, v, err, sizeof err))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "cache sizes \"%s\": %s (expected e.g. l1d=48K,l2=2M,l3=105M,line=64)",
                         spec, err);
    vitc__cpu old = vitc__cpu_cur;
    vitc__cache_set(spec && *spec ? v : NULL, "forced");
    vitc_status st = vitc__tables_reblock();
    if (st != VITC_OK) vitc__cpu_cur = old; /* the tables kept the old blocks */
    return st;
}

vitc_status vitc__blocking_force(const char *spec) {
    vitc__cpu_get();
    int64_t v[VITC__NBLK];
    char err[96];
    if (spec && *spec && !vitc__parse_spec(spec, vitc__blk_keys, VITC__NBLK, 1, v, err, sizeof err))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "blocking \"%s\": %s (expected kc,mc,nc or kc=256,mc=96,nc=2048,"
                         "lp_mc=144,lp_nb=384K)", spec, err);
    int64_t old[VITC__NBLK];
    char old_from[sizeof vitc__blk_from];
    memcpy(old, vitc__blk_forced, sizeof old);
    memcpy(old_from, vitc__blk_from, sizeof old_from);
    vitc__blk_set(spec && *spec ? v : NULL, spec ? spec : "", "forced ");
    vitc_status st = vitc__tables_reblock();
    if (st != VITC_OK) { /* the tables kept the old blocks */
        memcpy(vitc__blk_forced, old, sizeof old);
        memcpy(vitc__blk_from, old_from, sizeof old_from);
    }
    return st;
}

/* ---- the rules -------------------------------------------------------- */

static int64_t vitc__round_down(int64_t v, int64_t m) { return v / m * m > m ? v / m * m : m; }

/* BLIS's rules with one measured departure, scaled from the blocks each
 * kernel was measured with on a 1 MB L2 (Zen 5; this Zen 4 has the same
 * L2), so that a 1 MB L2 gives them back exactly:
 *  - kc: BLIS keeps the kc x nr micro-panel of B in L1. A deep kc measured
 *    faster (C is read and written once per K block; at K = 768 the
 *    product is one block), the micro-panel streaming from L2 instead: so
 *    the micro-panel takes at most 1/8 of L2, a multiple of 64, never
 *    deeper than the kernel's own (kc_max) nor shallower than the L1 rule
 *    (the micro-panel in half of L1).
 *  - mc: the mc x kc block of A in the share of L2 the kernel's own block
 *    took of 1 MB (12 x 32: 72 x 1024 floats, 288 KB, 2/7 of L2; the rest
 *    holds B's micro-panels streaming through, the next one prefetched,
 *    and C's rows), a multiple of mr.
 *  - nc: the kc x nc panel of B in a quarter of L3 (shared by the cores),
 *    a multiple of nr, never wider than the kernel's own (nc_max).
 *  - bf16 / int8: weight strips of 3/8 of L2 (384 KB of 1 MB) per block,
 *    and 144 rows of A per MB of L2 (a multiple of 12). */
void vitc__blocking_rule(vitc__blocking *b, const vitc__cpu *cpu, int mr, int nr, int64_t kc_max,
                         int64_t mc_ref, int64_t nc_max) {
    const int64_t mb = 1024 * 1024;
    int64_t panel = (int64_t)nr * 4; /* bytes of B per k */
    int64_t kc = cpu->l2 / 8 / panel, kc_l1 = cpu->l1d / 2 / panel;
    if (kc < kc_l1) kc = kc_l1;
    kc = vitc__round_down(kc, 64);
    if (kc > kc_max) kc = kc_max;
    /* bytes of A: the measured block's, in proportion to L2 (double: no
     * overflow for any L2) */
    double a_bytes = (double)mc_ref * (double)kc_max * 4.0 * (double)cpu->l2 / (double)mb;
    int64_t mc = vitc__round_down((int64_t)(a_bytes / (double)(kc * 4)), mr);
    int64_t nc = vitc__round_down(cpu->l3 / 4 / (kc * 4), nr);
    if (nc > nc_max) nc = nc_max;
    b->kc = kc, b->mc = mc, b->nc = nc;
    b->lp_nb = cpu->l2 * 3 / 8;
    b->lp_mc = vitc__round_down(cpu->l2 * 144 / mb, 12);
}

void vitc__blocking_apply_forced(vitc__blocking *b, int mr, int nr) {
    vitc__cpu_get();
    const int64_t *f = vitc__blk_forced;
    if (f[0] > 0) b->kc = f[0];
    if (f[1] > 0) b->mc = vitc__round_down(f[1], mr);
    if (f[2] > 0) b->nc = vitc__round_down(f[2], nr);
    if (f[3] > 0) b->lp_mc = f[3];
    if (f[4] > 0) b->lp_nb = f[4];
}

/* ---- printed -------------------------------------------------------- */

static const char *vitc__dp_text(int dp) {
    switch (dp) {
    case VITC__DP_NONE: return "none";
    case VITC__DP_256: return "256";
    case VITC__DP_512: return "512";
    }
    return "unknown";
}

/* 32768 -> "32K", 1048576 -> "1M", else bytes. */
static const char *vitc__size_text(char *buf, size_t n, int64_t v) {
    if (v >= (1 << 20) && v % (1 << 20) == 0) snprintf(buf, n, "%lldM", (long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0) snprintf(buf, n, "%lldK", (long long)(v >> 10));
    else snprintf(buf, n, "%lld", (long long)v);
    return buf;
}

size_t vitc_cpu_info(char *buf, size_t len, int form) {
    const vitc__cpu *c = vitc__cpu_get();
    const vitc__kernels *t = vitc__kern();
    const vitc__gemm_kernel *g = t->gemm;
    char tmp[1024], s1[24], s2[24], s3[24], s4[24];
    int n;
    if (form == VITC_CPU_INFO_KEYS) {
        n = snprintf(tmp, sizeof tmp,
                     "id=%s\nvendor=%s\nbrand=%s\nfamily=%d\nmodel=%d\nstepping=%d\nuarch=%s\n"
                     "avx512=%d\ndatapath=%s\namx=%d\nl1d=%lld\nl2=%lld\nl3=%lld\nline=%lld\n"
                     "cache_from=%s\narch=%s\nkc=%lld\nmc=%lld\nnc=%lld\nlp_mc=%lld\nlp_nb=%lld\n"
                     "blocking_from=%s\n",
                     c->id, c->vendor, c->brand, c->family, c->model, c->stepping, c->uarch,
                     c->avx512, vitc__dp_text(c->datapath), c->amx, (long long)c->l1d,
                     (long long)c->l2, (long long)c->l3, (long long)c->line, c->cache_from,
                     t->name, (long long)g->kc, (long long)g->mc, (long long)g->nc,
                     (long long)t->lp_mc, (long long)t->lp_nb, vitc__blocking_from());
    } else {
        const char *dp = c->datapath == VITC__DP_NONE  ? "no AVX-512"
                         : c->datapath == VITC__DP_256 ? "AVX-512 on 256-bit units"
                         : c->datapath == VITC__DP_512 ? "AVX-512 on 512-bit units"
                                                       : "AVX-512 datapath unknown";
        n = snprintf(tmp, sizeof tmp,
                     "cpu: %s (%s family %d model %d stepping %d: %s, %s, %s) [%s]\n"
                     "caches: L1d %s, L2 %s, L3 %s, line %lld (%s); blocking (%s%s): fp32 kc %lld "
                     "mc %lld nc %lld, bf16/int8 mc %lld nb %s (from %s)\n",
                     c->brand, c->vendor[0] ? c->vendor : "?", c->family, c->model, c->stepping,
                     c->uarch, dp, c->amx ? "AMX" : "no AMX", c->id,
                     vitc__size_text(s1, sizeof s1, c->l1d), vitc__size_text(s2, sizeof s2, c->l2),
                     vitc__size_text(s3, sizeof s3, c->l3), (long long)c->line, c->cache_from,
                     t->name, strcmp(vitc_get_gemm_backend(), "builtin") ? ", fp32 unused: openblas" : "",
                     (long long)g->kc, (long long)g->mc, (long long)g->nc,
                     (long long)t->lp_mc, vitc__size_text(s4, sizeof s4, t->lp_nb),
                     vitc__blocking_from());
    }
    if (n < 0) n = 0;
    if (buf && len > 0) snprintf(buf, len, "%s", tmp);
    return (size_t)n;
}
