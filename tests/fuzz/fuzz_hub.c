/*
 * fuzz_hub.c — libFuzzer target for the Hugging Face Hub directory loader
 * (src/models/load.c, hub.c and the families' configure): config.json,
 * preprocessor_config.json, a shard index and the safetensors headers.
 *
 * The input is up to five parts separated by NUL bytes (JSON text holds
 * none):
 *   config.json \0 preprocessor_config.json \0 header \0 index \0 header2
 * Each header is a safetensors header's JSON; the harness frames it (its
 * 8-byte length) and appends the data buffer its largest data_offsets end
 * asks for (up to 4 MiB, a fixed non-zero byte pattern, so the weights are
 * small finite numbers in F32, F16 and BF16 alike). Without an index the
 * header is model.safetensors; with one (a non-empty fourth part) the
 * headers are model-00001-of-00002.safetensors and
 * model-00002-of-00002.safetensors, the names the seeds' indexes use. An
 * empty preprocessor part writes no file (the family's defaults).
 *
 * The files go to a directory made once; vitc_vit_load reads it in fp32
 * and in int8. A model that loads runs a forward pass and its image
 * processor on a small image when their sizes are small; anything that
 * fails must fail with a message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "vitc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_DATA (4u << 20)

static char dir[64];
static const char *const files[] = {
    "config.json", "preprocessor_config.json", "model.safetensors",
    "model.safetensors.index.json", "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
};
#define N_FILES ((int)(sizeof files / sizeof *files))

static void file_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void put(const char *name, const void *bytes, size_t n) {
    char p[128];
    file_path(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0)
        abort(); /* the harness's own directory: never the input's fault */
}

/* The data buffer a header asks for: its largest data_offsets end. */
static size_t data_size(const char *h, size_t n) {
    json_t *root = json_loadb(h, n, 0, NULL);
    size_t end = 0;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        json_t *e = json_array_get(json_object_get(v, "data_offsets"), 1);
        if (json_is_integer(e) && json_integer_value(e) > 0 &&
            (uint64_t)json_integer_value(e) > end)
            end = (uint64_t)json_integer_value(e) > MAX_DATA ? MAX_DATA
                                                              : (size_t)json_integer_value(e);
    }
    json_decref(root);
    return end;
}

static void put_safetensors(const char *name, const char *h, size_t n) {
    size_t d = data_size(h, n);
    uint8_t *blob = malloc(8 + n + d + 1);
    if (!blob)
        abort();
    for (int i = 0; i < 8; i++)
        blob[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(blob + 8, h, n);
    memset(blob + 8 + n, 0x3c, d); /* 0.0115 in F32 and BF16, 1.06 in F16 */
    put(name, blob, 8 + n + d);
    free(blob);
}

static void remove_files(void) {
    char p[128];
    for (int i = 0; i < N_FILES; i++) {
        file_path(p, sizeof p, files[i]);
        unlink(p);
    }
}

static void remove_dir(void) {
    remove_files();
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%.40s/vitc_fuzz_hub_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        abort();
    atexit(remove_dir);
    return 0;
}

/* The loaded model's forward and image processor, where they are small. */
static void exercise(vitc_vit *m) {
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int64_t side = c->image_size, tokens = (side / c->patch_size) * (side / c->patch_size);
    int64_t floats = 0;
    if (tokens <= 256 && side * side * c->in_channels <= (1 << 16) &&
        vitc_vit_output_size(m, (int)side, (int)side, &floats) == VITC_OK && floats <= (1 << 20)) {
        float *x = calloc((size_t)(side * side * c->in_channels), sizeof *x);
        float *out = malloc((size_t)floats * sizeof *out + 1);
        if (!x || !out)
            abort();
        if (vitc_vit_forward(m, x, 1, (int)side, (int)side, out) != VITC_OK &&
            !vitc_last_error()[0])
            abort();
        free(x);
        free(out);
    }
    int H, W;
    uint8_t rgb[5 * 7 * 3];
    for (size_t i = 0; i < sizeof rgb; i++) rgb[i] = (uint8_t)(i * 37);
    vitc_image img = {7, 5, rgb};
    if (vitc_vit_has_processor(m) && vitc_vit_preprocess_size(m, 7, 5, &H, &W) == VITC_OK &&
        (int64_t)H * W * c->in_channels <= (1 << 20)) {
        float *out = malloc((size_t)H * (size_t)W * (size_t)c->in_channels * sizeof *out + 1);
        if (!out)
            abort();
        if (vitc_vit_preprocess(m, &img, out) != VITC_OK && !vitc_last_error()[0])
            abort();
        free(out);
    }
    for (int i = 0; i < c->num_classes && i < 4; i++)
        (void)vitc_vit_label(m, i);
    (void)vitc_vit_arch_name(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *part[5] = {0};
    size_t len[5] = {0};
    int n = 0;
    for (size_t at = 0; n < 5;) {
        const uint8_t *z = memchr(data + at, 0, size - at);
        part[n] = (const char *)data + at;
        len[n++] = z ? (size_t)(z - (data + at)) : size - at;
        if (!z)
            break;
        at = (size_t)(z - data) + 1;
    }
    remove_files();
    put("config.json", part[0], len[0]);
    if (len[1])
        put("preprocessor_config.json", part[1], len[1]);
    if (len[3]) {
        put("model.safetensors.index.json", part[3], len[3]);
        put_safetensors("model-00001-of-00002.safetensors", part[2] ? part[2] : "", len[2]);
        put_safetensors("model-00002-of-00002.safetensors", part[4] ? part[4] : "", len[4]);
    } else {
        put_safetensors("model.safetensors", part[2] ? part[2] : "", len[2]);
    }
    static const vitc_precision precs[2] = {VITC_PRECISION_FP32, VITC_PRECISION_INT8};
    for (int k = 0; k < 2; k++) {
        vitc_vit *m = NULL;
        if (vitc_vit_load_precision(dir, NULL, precs[k], &m) != VITC_OK) {
            if (m || !vitc_last_error()[0])
                abort();
            continue;
        }
        exercise(m);
        vitc_vit_free(m);
    }
    return 0;
}
