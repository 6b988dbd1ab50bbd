/* vitc.config, the JSON metadata key that describes a torchvision-style ViT
 * (architecture, mean/std, class names) in every file vitc writes. */
#ifndef VITC_VIT_CONFIG_H
#define VITC_VIT_CONFIG_H
#include "vitc.h"

/* A malloc'ed compact JSON string (free()), NULL when out of memory.
 * labels: num_classes names or NULL (a NULL entry is written as ""). */
char *vitc__vit_config_json(const vitc_vit_config *c, const char *const *labels);

#endif
