/*
 * train.h — what the training code shares inside libvitc: a model's
 * parameters seen as one flat set (llm.c's ParameterTensors: parameters,
 * gradients and optimizer state in the same layout over separate arrays),
 * and a registry of live models so that an optimizer over a freed model is
 * an error, not a use-after-free.
 */
#ifndef VITC_TRAIN_H
#define VITC_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"
#include "../params.h"

/* One named tensor of a parameter set is a row of the one parameter table
 * (params.h): floats [offset, offset + numel) of both param and grad, its
 * torch name, and no_decay for what AdamW/SGD weight decay skips by default
 * (biases, norm weights, class token, position embedding). */
typedef vitc__param vitc__pseg;

typedef struct vitc__paramset {
    float *param;          /* [n] every trainable parameter, one allocation */
    float *grad;           /* [n] same layout; NULL until training allocates it */
    size_t n;
    const vitc__pseg *seg; /* [nseg] in state_dict order */
    int nseg;
    uint64_t owner_id;     /* vitc__handle_register() id of the model/layer */
} vitc__paramset;

/* Live-object registry (handle.c): register in create, unregister in free;
 * an optimizer keeps the id and checks it before touching the arrays. */
uint64_t vitc__handle_register(void);
void vitc__handle_unregister(uint64_t id);
int vitc__handle_alive(uint64_t id);

/* The flat parameter set of a model or layer (implemented with the unified
 * parameter table, src/params.c). with_grad allocates the gradient array
 * (zeroed) on first use; the set stays valid until the model is freed. */
typedef struct vitc_vit vitc_vit;
typedef struct vitc_layer vitc_layer;
vitc_status vitc__vit_paramset(vitc_vit *m, int with_grad, vitc__paramset *out);
vitc_status vitc__layer_paramset(vitc_layer *l, int with_grad, vitc__paramset *out);

#endif
