/*
 * internal.h — what every file of libvitc shares and no user sees: error
 * reporting, checked size arithmetic, aligned allocation.
 */
#ifndef VITC_INTERNAL_H
#define VITC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vitc.h"

/* Record a message for vitc_last_error() and return status, so a failure
 * reads `return vitc__err(VITC_ERR_SHAPE, "q: expected [%d], got ...", ...)`. */
vitc_status vitc__err(vitc_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prepend context to the current message ("loading x.safetensors: ..."). */
vitc_status vitc__err_prefix(vitc_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define VITC_TRY(expr)                 \
    do {                               \
        vitc_status vitc__s = (expr);  \
        if (vitc__s != VITC_OK)        \
            return vitc__s;            \
    } while (0)

/* A Hugging Face image processor's slow (PIL) path (src/io/preprocess.c):
 * resize (exact size, or shortest edge s with long = int(s * long / short)),
 * resample 2 (bilinear) or 3 (bicubic) as PIL computes it in uint8, center
 * crop with floor offsets (zero padding where the crop is larger), rescale,
 * normalize. convert_rgb: do_convert_rgb, which composites alpha over white
 * when the image is decoded (vitc_vit_image_flags). */
typedef struct vitc__hf_proc {
    int present, convert_rgb;
    int do_resize, size_h, size_w, shortest, resample;
    int do_crop, crop_h, crop_w;
    int do_rescale, do_normalize;
    double rescale;
    float mean[3], std[3];
} vitc__hf_proc;
/* Output [oh, ow] and the resized [rh, rw] of a w x h image. */
vitc_status vitc__hf_output_size(const vitc__hf_proc *p, int w, int h, int *oh, int *ow, int *rh,
                                 int *rw);
/* out: [3, oh, ow]. */
vitc_status vitc__hf_preprocess(const vitc__hf_proc *p, const vitc_image *img, float *out);
/* out: [channels, oh, ow]; channels 1: the image's luminance (PIL's "L"). */
vitc_status vitc__hf_preprocess_channels(const vitc__hf_proc *p, const vitc_image *img,
                                         int channels, float *out);

/* vitc_safetensors_load with flags: VITC__ST_KEEP_I64 lists I64 tensors
 * (dtype "I64", data NULL) instead of refusing the file — Hub checkpoints
 * carry int64 position_ids buffers that a forward never reads. */
#define VITC__ST_KEEP_I64 1
/* VITC__ST_LAZY: the header only; each tensor's data is read into its
 * (untouched, so not resident) arena slot by vitc__safetensors_read, which
 * opens the file (checked to be the one parsed) and keeps it open until
 * vitc__safetensors_park or vitc__safetensors_read_rest. For loaders that convert
 * a tensor and give its pages back before reading the next (a model
 * loaded in bf16 / int8 peaks near the converted model, not the file). */
#define VITC__ST_LAZY 2
typedef struct vitc_safetensors vitc_safetensors;
vitc_status vitc__safetensors_load_flags(const char *path, int flags, vitc_safetensors **out);
/* Reads tensor i (a no-op when read already or not lazy). */
vitc_status vitc__safetensors_read(vitc_safetensors *st, int i);
/* The same for the tensor whose data starts at data (none: a no-op). */
vitc_status vitc__safetensors_read_at(vitc_safetensors *st, const float *data);
/* Reads every tensor still unread and closes the file. */
vitc_status vitc__safetensors_read_rest(vitc_safetensors *st);
/* Closes a lazy file's descriptor until its next read (a no-op otherwise). */
void vitc__safetensors_park(vitc_safetensors *st);

/* Overflow-checked size arithmetic: 1 on success, 0 on overflow. */
static inline int vitc__mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int vitc__add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
/* Element count of a shape; 0 on overflow or a negative dim (then *ok = 0). */
size_t vitc__numel(int ndim, const int64_t *shape, int *ok);
/* "[2, 3, 4]" into buf (for messages). */
const char *vitc__shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

/* 64-byte aligned allocation (for SIMD rows); free with vitc__free. */
void *vitc__alloc(size_t bytes);
void *vitc__calloc(size_t count, size_t size);
void vitc__free(void *p);

/* A grow-only scratch buffer owned by a layer or model: sized once for a
 * shape, reused by every later forward of that shape or smaller. */
typedef struct vitc__buf {
    float *p;
    size_t cap; /* floats */
} vitc__buf;
vitc_status vitc__buf_reserve(vitc__buf *b, size_t floats);
void vitc__buf_free(vitc__buf *b);

/* Containers and commas outside strings in JSON text: a bound on the number
 * of values jansson would build, to check before it builds them (its tree
 * costs up to ~80x the text). */
size_t vitc__json_items(const char *s, size_t len);

/* Files (src/io/file.c). Open path for reading without blocking: anything
 * but a regular file (FIFO, device, directory) is refused before a byte is
 * read, as is a file over max_bytes (0: no limit). *size: its size. */
vitc_status vitc__open_regular(const char *path, uint64_t max_bytes, FILE **out,
                               uint64_t *size);
/* The byte offset of the first invalid UTF-8 sequence in s[0..len) (an
 * overlong form, a surrogate, past U+10FFFF, a cut sequence), or -1
 * (src/text/tokenizer.c). */
int64_t vitc__utf8_invalid_at(const char *s, size_t len);
/* What a file of mode m is when it is not a regular file, for messages:
 * "a directory", "a FIFO", ..., "a symbolic link" (an lstat's mode). */
const char *vitc__file_kind(mode_t m);
/* JSON files (src/io/file.c): path's JSON object, read through
 * vitc__open_regular, refused over cap bytes (0: no limit) and over
 * max_items containers + commas (0: no limit) before jansson builds its
 * tree; what names the kind of file in the messages ("a Hub config.json").
 * Out of memory is reported as such (NOMEM), not as malformed JSON.
 * parse_capped: the same for text already in memory (label names it). */
struct json_t;
vitc_status vitc__json_load_capped(const char *path, uint64_t cap, size_t max_items,
                                   const char *what, struct json_t **out);
vitc_status vitc__json_parse_capped(const char *text, size_t len, const char *label,
                                    const char *what, size_t max_items, struct json_t **out);
/* Replace path with what write puts into f, never losing the old content:
 * temporary file beside it, fsync, rename, fsync of the directory; on error
 * only the temporary file is removed. An existing non-regular path is refused
 * and left alone. write returns VITC_OK or an error (set with vitc__err);
 * a stdio error on f is reported by vitc__write_file itself. */
typedef vitc_status (*vitc__write_fn)(FILE *f, void *ctx);
vitc_status vitc__write_file(const char *path, vitc__write_fn write, void *ctx);
/* Remove the temporaries that writers of target killed mid-write left
 * beside it (named with a pid no process has now); best effort, silent. */
void vitc__remove_stale_temps(const char *target);

#endif
