/*
 * vit_config.c — libFuzzer target for the vitc.config metadata the ViT
 * loader reads (vitc__ckpt_metadata and the checks after it in
 * src/models/file_config.c).
 *
 * The input is the config's JSON text. The harness wraps it as the
 * "vitc.config" metadata of a safetensors blob whose tensors are those of a
 * tiny torchvision ViT (hidden 8, 2 heads, 1 block, 8x8 images in 4x4
 * patches, 3 classes), so a config that agrees with the tensors loads and
 * runs a forward pass, and everything else must fail with a message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "models/vit_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const vitc_vit_config tiny = {
    .image_size = 8, .patch_size = 4, .in_channels = 3, .hidden_dim = 8, .depth = 1,
    .num_heads = 2, .mlp_dim = 16, .num_classes = 3,
};

/* The header without metadata, and the zero-filled data after it. */
static json_t *tensors;
static size_t data_bytes;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    vitc_vit *m = vitc__vit_alloc(); /* torchvision's family options */
    size_t off = 0;
    char name[160];
    if (!m)
        abort();
    m->cfg = tiny;
    m->naming = VIT_NAMES_TORCHVISION;
    if (vitc__vit_table_build(m) != VITC_OK)
        abort();
    tensors = json_object();
    for (int i = 0; i < m->n_entries; i++) {
        const vitc__param *e = &m->table[i];
        json_t *shape = json_array();
        for (int k = 0; k < e->ndim; k++)
            json_array_append_new(shape, json_integer(e->shape[k]));
        json_object_set_new(tensors, vitc__vit_entry_name(m, e, name, sizeof name),
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + e->numel * 4)));
        off += e->numel * 4;
    }
    data_bytes = off;
    vitc_vit_free(m);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Metadata values are JSON strings without NUL (the safetensors reader
     * refuses "\u0000"): text that is not such a string cannot be a config. */
    if (memchr(data, 0, size))
        return 0;
    json_t *text = json_stringn((const char *)data, size);
    if (!text)
        return 0;
    json_t *header = json_deep_copy(tensors);
    json_object_set_new(header, "__metadata__", json_pack("{s:o}", "vitc.config", text));
    char *h = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    if (!h)
        abort();
    size_t hlen = strlen(h), total = 8 + hlen + data_bytes;
    uint8_t *blob = calloc(1, total);
    if (!blob)
        abort();
    for (int i = 0; i < 8; i++)
        blob[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(blob + 8, h, hlen);
    free(h);

    vitc_safetensors *st = NULL;
    vitc_vit *m = NULL;
    if (vitc_safetensors_load_memory(blob, total, &st) != VITC_OK)
        abort(); /* the wrapper is always a valid file */
    free(blob);
    if (vitc_vit_from_safetensors(st, NULL, &m) != VITC_OK) {
        if (m || !vitc_last_error()[0])
            abort();
        vitc_safetensors_free(st);
        return 0;
    }
    const vitc_vit_config *c = vitc_vit_get_config(m);
    if (c->hidden_dim != tiny.hidden_dim || c->in_channels != tiny.in_channels ||
        c->num_classes != tiny.num_classes)
        abort(); /* the tensors fix these; a config saying otherwise must fail */
    /* A forward pass uses num_heads, norm_eps, mean and std from the config. */
    float images[3 * 8 * 8] = {0}, logits[3];
    if (vitc_vit_forward(m, images, 1, 8, 8, logits) != VITC_OK && !vitc_last_error()[0])
        abort();
    for (int i = 0; i < c->num_classes; i++)
        (void)vitc_vit_label(m, i);
    vitc_vit_free(m);
    vitc_safetensors_free(st);
    return 0;
}
