/* bench_peak.h — the CPU's peaks as `vitc bench` measures them
 * (bench_peak.c): fp32 FMA, bf16 dot products (vdpbf16ps; AMX tdpbf16ps
 * where present) and int8 dot products (vpdpbusd; AMX tdpbusd), each on one
 * core and on N threads at once. Measured rather than taken from a data
 * sheet: clocks under AVX-512 differ from the nominal ones, and in a VM the
 * host decides. */
#ifndef VITC_BENCH_PEAK_H
#define VITC_BENCH_PEAK_H

typedef enum { BENCH_PEAK_FP32, BENCH_PEAK_BF16, BENCH_PEAK_INT8, BENCH_PEAK_N } bench_peak_prec;

typedef struct bench_peak {
    /* The loop that gave `one` and `all` ("avx512", "avx512_bf16", "amx",
     * ...); NULL when not measured. */
    const char *isa;
    /* Why there is no loop for this precision on this CPU (then isa is NULL). */
    const char *why;
    double one, all; /* G(FL)OP/s: 1 core, `threads` threads at once; 0: not measured */
    /* With AMX: the vector loop's figures beside the tile's (isa "amx"). */
    const char *vec_isa;
    double vec_one, vec_all;
} bench_peak;

/* Measures precision p's peak (2 operations per multiply-add) on 1 and on
 * `threads` threads; fills *out. progress(what) is called before each
 * loop when not NULL. Never fails: a precision this CPU cannot run is left
 * with isa NULL and why set. */
void bench_peak_measure(bench_peak_prec p, int threads, void (*progress)(const char *what),
                        bench_peak *out);

/* "fp32", "bf16", "int8". */
const char *bench_peak_name(bench_peak_prec p);
/* "GFLOP/s" or "GOP/s" (int8). */
const char *bench_peak_unit(bench_peak_prec p);

#endif
