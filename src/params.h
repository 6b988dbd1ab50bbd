/*
 * params.h — the one parameter table of libvitc, shared by the attention
 * layers (src/layers) and the ViT (src/models): each row names a tensor by
 * its torch state_dict key, says how to initialise it, and places it at an
 * offset into ONE flat float array of the model. Gradients and optimizer
 * state (AdamW m, v) use the same offsets over arrays of the same length
 * (llm.c's ParameterTensors), so one row serves all of them.
 *
 * A row reaches the pointer forward reads through `slot`, an offsetof into
 * the owner's weight struct (for a ViT block row, the block's struct), so
 * binding the same table to the gradient array fills a gradient struct of
 * the same type.
 */
#ifndef VITC_PARAMS_H
#define VITC_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* How reset_parameters fills a tensor (torch's defaults per module). */
typedef enum vitc__init {
    VITC__INIT_ZERO,
    VITC__INIT_ONE,
    VITC__INIT_KAIMING,  /* nn.Linear / nn.Conv2d default: U(-1/sqrt(fan_in), +) */
    VITC__INIT_XAVIER,   /* xavier_uniform_: U(-sqrt(6/(fan_in+fan_out)), +) */
    VITC__INIT_NORMAL01, /* the NumPy seed: N(0, 1) * 0.1 */
    VITC__INIT_NORMAL,   /* normal_(std=init_std) */
    VITC__INIT_TRUNC     /* trunc_normal_(std=init_std, a=-2, b=2): bounds absolute, as torch */
} vitc__init;

typedef struct vitc__param {
    const char *name;  /* torch state_dict key, e.g. "encoder.layers.encoder_layer_0.ln_1.weight" */
    const char *alias; /* a second accepted spelling (diffusers), or NULL */
    size_t offset, numel; /* floats [offset, offset + numel) of the flat array */
    int ndim;
    int64_t shape[4];
    int no_decay; /* weight decay skips it by default: biases, norms, class token, positions */
    int buffer;   /* not trained (BatchNorm running statistics) */
    vitc__init init;
    double init_std;
    int64_t fan_in, fan_out;
    size_t slot; /* offsetof(owner struct, the float * forward reads it through) */
    int layer;   /* block index whose struct holds the slot; -1: the model's own struct */
    int role;    /* the owner's index of the tensor kind (e.g. VIT_L_QKV_W) */
} vitc__param;

/* numel of every row and 64-byte aligned offsets (SIMD rows load aligned);
 * *total: the flat array's length in floats. Overflow-checked. */
vitc_status vitc__params_layout(vitc__param *t, int n, size_t *total);

/* Point every row's slot at base + offset: model rows into obj, block rows
 * into blocks + layer * block_size (blocks may be NULL when no row has a
 * layer). */
void vitc__params_bind(const vitc__param *t, int n, float *base, void *obj, void *blocks,
                       size_t block_size);

/* Fill every row per its init from a splitmix64 stream
 * seeded with seed, in table order. */
void vitc__params_init(const vitc__param *t, int n, float *base, uint64_t seed);

/* "[2, 3]" of a row, for messages. */
const char *vitc__param_shape_str(const vitc__param *p, char *buf, size_t cap);

#endif
