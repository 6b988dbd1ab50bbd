/*
 * image.c — libFuzzer target for the PNG and JPEG decoders and the
 * preprocessing after them: torchvision's transform through the public API,
 * and a Hub model's image processor (PIL's resize) through its internal
 * entry points, each windowed under the same budget.
 *
 * `make fuzz` runs it with -malloc_limit_mb/-rss_limit_mb, so an image whose
 * header is small but whose decoding or preprocessing asks for gigabytes is a
 * finding, not just an out-of-memory error: every bound has to hold before
 * the allocation.
 */
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "vitc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 16 megapixels: far above the seeds, far below what the limit would let a
 * decoded image alone take. */
#define FUZZ_MAX_PIXELS (1 << 24)

static void preprocess(const vitc_image *img, int resize, int crop, int channels) {
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    float *out = malloc(sizeof(float) * (size_t)channels * (size_t)crop * (size_t)crop);
    if (!out)
        abort();
    if (vitc_image_preprocess_channels(img, resize, crop, channels, mean, std, out) != VITC_OK &&
        !vitc_last_error()[0])
        abort();
    free(out);
}

/* A Hub processor: shortest edge (DINOv2/CLIP) with a crop, or a fixed size
 * without one (ViT), bilinear or bicubic. */
static void preprocess_hf(const vitc_image *img, int shortest, int crop, int resample) {
    vitc__hf_proc p = {0};
    p.present = p.do_resize = p.do_rescale = p.do_normalize = 1;
    p.rescale = 1.0 / 255.0;
    p.resample = resample;
    if (shortest)
        p.shortest = shortest;
    else
        p.size_h = p.size_w = 48;
    p.do_crop = crop > 0;
    p.crop_h = p.crop_w = crop;
    for (int c = 0; c < 3; c++) p.mean[c] = 0.5f, p.std[c] = 0.5f;
    int oh, ow, rh, rw;
    if (vitc__hf_output_size(&p, img->width, img->height, &oh, &ow, &rh, &rw) != VITC_OK) {
        if (!vitc_last_error()[0])
            abort();
        return;
    }
    float *out = malloc(sizeof(float) * 3 * (size_t)oh * (size_t)ow);
    if (!out)
        abort();
    if (vitc__hf_preprocess(&p, img, out) != VITC_OK && !vitc_last_error()[0])
        abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vitc_image img;
    /* Both conversions of alpha, chosen by the input's length. */
    int flags = size & 1 ? VITC_IMAGE_ALPHA_WHITE : 0;
    if (vitc_image_load_memory_flags(data, size, FUZZ_MAX_PIXELS, flags, &img) != VITC_OK) {
        if (img.rgb || !vitc_last_error()[0])
            abort(); /* a failure must leave no image and say why */
        return 0;
    }
    if (img.width <= 0 || img.height <= 0 || (int64_t)img.width * img.height > FUZZ_MAX_PIXELS)
        abort();
    /* Reading every pixel lets ASan check the buffer is as large as stated. */
    volatile unsigned sum = 0;
    for (size_t i = 0; i < (size_t)img.width * img.height * 3; i++)
        sum += img.rgb[i];
    (void)sum;
    preprocess(&img, 256, 224, 3); /* the CLI's default for a 224 model */
    preprocess(&img, 0, 33, 3);    /* crop (and pad) only */
    preprocess(&img, 40, 32, 1);   /* a gray model: luminance first */
    preprocess_hf(&img, 224, 224, 3); /* CLIP */
    preprocess_hf(&img, 64, 70, 2);   /* a crop larger than the resize: padding */
    preprocess_hf(&img, 0, 0, 3);     /* ViT: 48x48, no crop */
    vitc_image_free(&img);
    return 0;
}
