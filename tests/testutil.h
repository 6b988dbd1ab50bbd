/*
 * testutil.h — helpers the C tests share (static inline, one copy per test):
 * the xorshift64 random streams, float buffers, a scratch directory, whole
 * files, and the check of vitc_last_error(). Include after <cmocka.h>.
 */
#ifndef VITC_TESTUTIL_H
#define VITC_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "vitc.h"

/* ---- CPU paths ----------------------------------------------------- */

/* Every CPU path the library knows (kernels.h's VITC_ARCH_LIST), in enum
 * order: tu_arch(a) for a < TU_NARCH is the name vitc_set_arch takes. It
 * refuses those this build or CPU lacks (vitc__cpu_has(a) says which). */
#define TU_NARCH ((int)VITC_ARCH_COUNT)
static inline const char *tu_arch(int a) { return vitc__arch_name(a); }
/* The same names, best path first (i = 0: the last of the list). */
static inline const char *tu_arch_best(int i) { return tu_arch(TU_NARCH - 1 - i); }

/* ---- random numbers: xorshift64 on a caller-owned state ------------ */

static inline uint64_t tu_xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in [-1, 1) on a grid of 2^-23 (the top 24 bits). */
static inline float tu_urand(uint64_t *s) {
    return (float)((double)(tu_xorshift64(s) >> 40) / (double)(1ull << 23) - 1.0);
}

/* Uniform in [0, 1), 53 bits. */
static inline double tu_drand(uint64_t *s) {
    return (double)(tu_xorshift64(s) >> 11) / 9007199254740992.0;
}

/* ---- float buffers ------------------------------------------------- */

static inline float *tu_falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    return p;
}

/* x[i] = tu_urand(s) * mul. */
static inline void tu_fill(uint64_t *s, float *x, size_t n, float mul) {
    for (size_t i = 0; i < n; i++) x[i] = tu_urand(s) * mul;
}

/* ---- a scratch directory ------------------------------------------- */

static char tu_tmpdir[256];

/* Makes tu_tmpdir from a mkdtemp template ("/tmp/name_XXXXXX"); 0 or -1,
 * as a cmocka setup returns. */
static inline int tu_make_tmpdir(const char *templ) {
    snprintf(tu_tmpdir, sizeof tu_tmpdir, "%s", templ);
    return mkdtemp(tu_tmpdir) ? 0 : -1;
}

/* Removes dir and everything below it. (Not inlined into itself: GCC then
 * sees a path of 856 bytes for the 600 of p.) */
static __attribute__((unused, noinline)) void tu_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[600];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                if (unlink(p) != 0)
                    tu_rm_tree(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* tu_tmpdir/name; the last eight results stay valid. */
static inline char *tu_tmp_path(const char *name) {
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", tu_tmpdir, name);
    return p[k];
}

/* Entries of tu_tmpdir other than . and .. (to see that no temporary file
 * is left). */
static inline int tu_dir_entries(void) {
    DIR *d = opendir(tu_tmpdir);
    int n = 0;
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* A cmocka group teardown: tu_tmpdir and everything in it removed. */
static inline int tu_teardown_tmpdir(void **state) {
    (void)state;
    tu_rm_tree(tu_tmpdir);
    return 0;
}

/* ---- whole files --------------------------------------------------- */

/* The bytes of path (malloc'd, *len of them); fails the test when it
 * cannot be read. */
static inline unsigned char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s (run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(n >= 0);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* n bytes of data as the whole of path (created or truncated). */
static inline void tu_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot create %s", path);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* ---- reference files (tensors PyTorch wrote) ----------------------- */

/* *st loaded from path: 0, or -1 (as a cmocka setup returns) with the
 * reason on stderr under the test's name who. */
static inline int tu_ref_load(const char *who, const char *path, vitc_safetensors **st) {
    if (vitc_safetensors_load(path, st) == VITC_OK)
        return 0;
    fprintf(stderr, "%s: %s (run from the repository root)\n", who, vitc_last_error());
    return -1;
}

/* The set-up of a test over a reference file: 2 threads, tu_tmpdir from
 * templ ("/tmp/name_XXXXXX"), *st loaded from path (tu_ref_load). */
static inline int tu_ref_setup(const char *who, const char *templ, const char *path,
                               vitc_safetensors **st) {
    vitc_set_num_threads(2);
    if (tu_make_tmpdir(templ) != 0) {
        fprintf(stderr, "%s: cannot make %s\n", who, templ);
        return -1;
    }
    return tu_ref_load(who, path, st);
}

static inline int64_t tu_numel(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int k = 0; k < nd; k++)
        n *= shape[k];
    return n;
}

/* The float data of tensor name in st, its dims into *nd and *shape;
 * fails the test when st has no such tensor. */
static inline const float *tu_tensor(const vitc_safetensors *st, const char *name, int *nd,
                                     const int64_t **shape) {
    int i = vitc_safetensors_find(st, name);
    if (i < 0)
        fail_msg("reference tensor %s not found", name);
    const char *nm, *dt;
    const float *data;
    assert_int_equal(vitc_safetensors_tensor(st, i, &nm, &dt, nd, shape, &data), VITC_OK);
    return data;
}

/* ---- errors ------------------------------------------------------- */

/* Fails unless vitc_last_error() contains needle. */
static inline void tu_assert_message_has(const char *needle) {
    if (!strstr(vitc_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", vitc_last_error(), needle);
}

#endif /* VITC_TESTUTIL_H */
