/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader. Not
 * built by make (its name does not start with test_). Build and run:
 *
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
 *     -Iinclude -Isrc src/status.c src/io/file.c src/io/safetensors.c tests/fuzz_safetensors.c \
 *     -ljansson -lm -o build/fuzz_safetensors
 *   mkdir -p build/fuzz-corpus && cp tests/reference/safetensors/mixed.safetensors build/fuzz-corpus/
 *   build/fuzz_safetensors -dict=tests/fuzz_safetensors.dict -max_total_time=60 \
 *     -max_len=4096 build/fuzz-corpus
 *
 * Each input is loaded from memory; what loads is read back whole and
 * written out again, so a header the reader accepts but describes wrongly
 * shows up as an out-of-bounds read or a writer failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vitc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vitc_safetensors *st = NULL;
    if (vitc_safetensors_load_memory(data, size, &st) != VITC_OK) {
        if (st || !vitc_last_error()[0])
            abort(); /* a failure must leave no object and say why */
        return 0;
    }
    int n = vitc_safetensors_count(st);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int *ndims = calloc((size_t)n + 1, sizeof *ndims);
    const int64_t **shapes = calloc((size_t)n + 1, sizeof *shapes);
    const float **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    volatile float sum = 0;
    for (int i = 0; i < n; i++) {
        if (vitc_safetensors_tensor(st, i, &names[i], NULL, &ndims[i], &shapes[i], &ptrs[i]))
            abort();
        size_t cnt = 1;
        for (int j = 0; j < ndims[i]; j++)
            cnt *= (size_t)shapes[i][j];
        for (size_t k = 0; k < cnt; k++)
            sum += ptrs[i][k];
        if (vitc_safetensors_find(st, names[i]) != i)
            abort();
    }
    (void)sum;
    int nm = vitc_safetensors_metadata_count(st);
    const char **mk = calloc((size_t)nm + 1, sizeof *mk), **mv = calloc((size_t)nm + 1, sizeof *mv);
    for (int i = 0; i < nm; i++)
        vitc_safetensors_metadata(st, i, &mk[i], &mv[i]);
    /* Accepted input must survive a round trip through the writer. */
    char path[64];
    snprintf(path, sizeof path, "/tmp/vitc_fuzz_%ld.safetensors", (long)getpid());
    if (vitc_safetensors_save(path, n, names, ndims, shapes, ptrs, nm, mk, mv) != VITC_OK)
        abort();
    vitc_safetensors *back = NULL;
    if (vitc_safetensors_load(path, &back) != VITC_OK || vitc_safetensors_count(back) != n)
        abort();
    vitc_safetensors_free(back);
    unlink(path);
    free(mk);
    free(mv);
    free(names);
    free(ndims);
    free(shapes);
    free(ptrs);
    vitc_safetensors_free(st);
    return 0;
}
