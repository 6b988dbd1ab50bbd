/*
 * optim.h — the optimizer core over a flat parameter set, for the model
 * and layer front ends and the tests (public API in vitc.h).
 */
#ifndef VITC_OPTIM_H
#define VITC_OPTIM_H

#include "train.h"

/* An optimizer over ps (copied; its arrays stay the model's). ps->grad
 * must be allocated and ps->owner_id alive. */
vitc_status vitc__optimizer_create(const vitc__paramset *ps, const vitc_optim_config *cfg,
                                   vitc_optimizer **out);
/* The parameter set o updates (its tensors' offsets into the flat arrays:
 * the layout of its state arrays). */
const vitc__paramset *vitc__optimizer_paramset(const vitc_optimizer *o);
/* clip_grad_norm_ over every gradient of ps (see vitc.h). */
vitc_status vitc__clip_grad_norm(const vitc__paramset *ps, float max_norm, float *total_norm);

#endif
