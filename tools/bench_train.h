/* bench_train.h — the training workloads of `vitc bench` (bench_train.c):
 * a Fashion-MNIST ViT step, a ViT-B/16 step at batch 8 (forward,
 * cross-entropy, backward, AdamW), fine-tuning steps of a DINOv2 or CLIP
 * Hub model with a new head, and the attention backward. */
#ifndef VITC_BENCH_TRAIN_H
#define VITC_BENCH_TRAIN_H

#include <stddef.h>

#include "vitc.h"

/* Builds workload `name` (quick: the tiny sizes of bench.py --quick) into
 * *state and sets its FLOP count; model: the Hub directory of the
 * finetune_* rows (NULL: skipped). 0, -1 (skipped, the reason in note) or a
 * CLI exit code (message printed). */
int bench_train_setup(const char *name, const char *model, int quick, void **state,
                      double *flops, char *note, size_t note_cap);
/* One timed unit: a training step, or one attention backward. */
vitc_status bench_train_run(void *state);
void bench_train_free(void *state);

#endif
