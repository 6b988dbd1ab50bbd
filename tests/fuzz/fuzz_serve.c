/*
 * fuzz_serve.c — libFuzzer target for `vitc serve`'s request path without
 * HTTP or a model (serve_parse_request, tools/serve_parse.c): the JSON
 * body, its inputs, base64 and data: URL decoding, the image decoders and
 * the preprocessing; or a raw image body with its query-string options.
 *
 * The first byte picks the path and what a loaded model would fix: bit 0
 * a raw body (then the input is "TOP_K\0FORMAT\0IMAGE"), bit 1
 * /v1/classify, bit 2 a text tower, bit 3 a gray model, bits 4-5 the
 * crop. The rest is the body.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* As image.c: far above the seeds, far below what -malloc_limit_mb lets a
 * decoded image take. */
#define FUZZ_MAX_PIXELS (1 << 24)

static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};

/* A string of the raw input up to its NUL (NULL when empty), advancing. */
static const char *take(const char **p, const char *end, char *buf, size_t cap) {
    const char *z = memchr(*p, 0, (size_t)(end - *p));
    size_t n = z ? (size_t)(z - *p) : (size_t)(end - *p);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, *p, n);
    buf[n] = 0;
    *p = z ? z + 1 : end;
    return n ? buf : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int mode = data[0];
    static const int crops[4] = {16, 32, 33, 48};
    serve_parse_cfg c;
    memset(&c, 0, sizeof c);
    c.in.crop = crops[(mode >> 4) & 3];
    c.in.resize = c.in.crop + 4;
    c.in.channels = mode & 8 ? 1 : 3;
    c.in.height = c.in.width = c.in.crop;
    c.in.per_image = (size_t)c.in.channels * (size_t)c.in.crop * (size_t)c.in.crop;
    c.mean = mean;
    c.std = stdv;
    c.num_classes = 10;
    c.has_text = (mode & 4) != 0;
    c.max_queue = 8;
    c.max_pixels = FUZZ_MAX_PIXELS;
    int endpoint = mode & 2 ? SERVE_EP_CLASSIFY : SERVE_EP_EMBEDDINGS;

    /* A copy of its own size: ASan sees a read past the body. */
    const char *body = (const char *)data + 1, *end = (const char *)data + size;
    serve_raw raw = {NULL, NULL};
    char top_k[32], fmt[32];
    if (mode & 1) {
        raw.top_k = take(&body, end, top_k, sizeof top_k);
        raw.encoding_format = take(&body, end, fmt, sizeof fmt);
    }
    size_t len = (size_t)(end - body);
    char *copy = malloc(len ? len : 1);
    if (!copy)
        abort();
    memcpy(copy, body, len);

    serve_parsed p;
    serve_reply r;
    memset(&r, 0, sizeof r);
    if (serve_parse_request(&c, endpoint, copy, len, mode & 1 ? &raw : NULL, &p, &r) != 0) {
        /* a refusal is a 400 (or 500 out of memory) that says why */
        if ((r.status != 400 && r.status != 500) || !r.msg || !r.msg[0] || p.pixels || p.root)
            abort();
    } else {
        if (p.n < 1 || p.n > c.max_queue || p.top_k < 1 || p.top_k > c.num_classes)
            abort();
        for (int i = 0; i < p.n; i++) {
            if (!p.pixels[i] == !p.texts[i])
                abort(); /* each input is an image or a text, never both */
            /* reading every value lets ASan check the buffer's size */
            volatile float sum = 0;
            for (size_t j = 0; p.pixels[i] && j < c.in.per_image; j++) sum += p.pixels[i][j];
            (void)sum;
            if (p.texts[i] && (!c.has_text || endpoint != SERVE_EP_EMBEDDINGS))
                abort();
        }
        serve_parsed_free(&p);
    }
    free(copy);
    return 0;
}
