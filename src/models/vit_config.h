/* vitc.config, the JSON metadata key that describes a torchvision-style ViT
 * (architecture, mean/std, class names) in every file vitc writes. */
#ifndef VITC_VIT_CONFIG_H
#define VITC_VIT_CONFIG_H
#include "vitc.h"

/* A malloc'ed compact JSON string (free()), NULL when out of memory.
 * labels: num_classes names or NULL (a NULL entry is written as ""). */
char *vitc__vit_config_json(const vitc_vit_config *c, const char *const *labels);

/* The named torchvision / timm ViT preset (vit_b_16, vit_base_patch16_224,
 * ...) as a whole config into c: its structure, 3 channels, 1000 classes,
 * the family's mean/std, norm_eps 1e-6. 1 when name is a preset, else 0
 * (c untouched). vitc_vit_load's --arch table; vitc train uses it too. */
int vitc__vit_preset_config(const char *name, vitc_vit_config *c);
/* Preset i's name in table order (0, 1, ...), NULL past the last: for listings. */
const char *vitc__vit_preset_name(int i);

/* vitc.family, the metadata key beside vitc.config of a saved model whose
 * family options vitc.config cannot say (Hub families, CLIP, SigLIP): its
 * family, tokens, norms, activation, heads, position rule and image
 * processor as malloc'ed JSON in *out; NULL for torchvision's and timm's
 * (model.c; read back by file_config.c). */
vitc_status vitc__vit_family_json(const vitc_vit *m, char **out);

#endif
