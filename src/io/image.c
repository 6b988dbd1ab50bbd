/*
 * image.c — PNG and JPEG in, PNG out, and torchvision's eval preprocessing.
 *
 * Images are untrusted input, so decoding goes through the reference
 * decoders (libpng, libjpeg-turbo) and the pixel count is checked against a
 * limit from the header alone, before any pixel buffer exists. The format is
 * chosen by magic bytes, never by file name.
 *
 * Colour conversion follows PIL's Image.convert("RGB"), the usual way Python
 * code feeds a classifier: alpha is dropped (not composited), gray is
 * replicated, palettes are expanded. VITC_IMAGE_ALPHA_WHITE composites alpha
 * over white instead, as transformers' do_convert_rgb does with PIL's
 * alpha_composite. The one deliberate difference is 16-bit input: PIL clips
 * 16-bit gray to 255 on convert("RGB"); we keep the high byte, as PIL does
 * for 16-bit RGB.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef VITC_HAVE_PNG
#include <png.h>
#include <setjmp.h>
#endif
#ifdef VITC_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

#include "internal.h"

#define VITC_IMAGE_DEFAULT_MAX_PIXELS 100000000LL
/* A compressed image larger than this is refused before reading it all in:
 * no real photo needs it, and it bounds what a hostile path can make us read. */
#define VITC_IMAGE_MAX_FILE_BYTES (1LL << 30)
/* Preprocessing's own buffers (the resize's intermediates for the crop's
 * window) are refused beyond this: docs/cli.md, section Images. */
#define VITC_IMAGE_MAX_RESIZE_BYTES ((size_t)1 << 30)

static __attribute__((unused)) vitc_status image_check_size(const char *path, int64_t w, int64_t h,
                                    int64_t max_pixels, size_t *bytes) {
    size_t n;
    if (max_pixels <= 0)
        max_pixels = VITC_IMAGE_DEFAULT_MAX_PIXELS;
    if (w <= 0 || h <= 0 || w > INT32_MAX || h > INT32_MAX)
        return vitc__err(VITC_ERR_FORMAT, "%s: invalid image size %lldx%lld", path,
                         (long long)w, (long long)h);
    /* w, h < 2^31 so the product fits in int64. */
    if (w * h > max_pixels)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: image of %lldx%lld pixels is over the limit of %lld pixels", path,
                         (long long)w, (long long)h, (long long)max_pixels);
    if (!vitc__mul_size((size_t)w, (size_t)h, &n) || !vitc__mul_size(n, 3, &n))
        return vitc__err(VITC_ERR_NOMEM, "%s: image size overflows", path);
    *bytes = n;
    return VITC_OK;
}

static vitc_status read_file(const char *path, unsigned char **data, size_t *len) {
    FILE *f;
    uint64_t size;
    unsigned char *buf;
    *data = NULL;
    *len = 0;
    VITC_TRY(vitc__open_regular(path, VITC_IMAGE_MAX_FILE_BYTES, &f, &size));
    if (size == 0) {
        fclose(f);
        return vitc__err(VITC_ERR_FORMAT, "%s: empty file", path);
    }
    buf = malloc((size_t)size);
    if (!buf) {
        fclose(f);
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory reading %llu bytes", path,
                         (unsigned long long)size);
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        fclose(f);
        return vitc__err(VITC_ERR_IO, "%s: read error", path);
    }
    fclose(f);
    *data = buf;
    *len = (size_t)size;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* PNG                                                                */
/* ------------------------------------------------------------------ */

#ifdef VITC_HAVE_PNG
/* Everything the libpng callbacks and the longjmp path need lives here, not
 * in locals: locals changed after setjmp are indeterminate after longjmp. */
typedef struct png_ctx {
    const char *path;
    const unsigned char *data;
    size_t len, pos;
    char msg[200];
    uint8_t *rgb;  /* the result, [h, w, 3] */
    uint8_t *row;  /* one decoded row, [w, channels] */
    uint8_t **rows; /* interlaced images: every decoded row */
    uint8_t *all;
    int flags;
    vitc_status status;
} png_ctx;

static void png_err_fn(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_warn_fn(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* benign by definition (bad CRC in an ancillary chunk, ...) */
}

static void png_read_mem(png_structp png, png_bytep out, size_t n) {
    png_ctx *c = png_get_io_ptr(png);
    if (n > c->len - c->pos)
        png_error(png, "file is truncated");
    memcpy(out, c->data + c->pos, n);
    c->pos += n;
}

/* PIL's ImagingAlphaComposite of (c, a) over opaque white, in its integer
 * arithmetic (7 fractional bits, rounded division by 255): its coefficients
 * reduce to a * 128 and (255 - a) * 128 when the background is opaque. */
static uint8_t alpha_on_white(unsigned c, unsigned a) {
    if (a == 0)
        return 255;
    uint32_t t = c * a * 128u + 255u * (255u - a) * 128u + (0x80u << 7);
    return (uint8_t)((((t >> 8) + t) >> 8) >> 7);
}

static void png_to_rgb(uint8_t *dst, const uint8_t *src, int w, int channels, int flags) {
    int white = (flags & VITC_IMAGE_ALPHA_WHITE) && (channels == 2 || channels == 4);
    for (int x = 0; x < w; x++) {
        const uint8_t *s = src + (size_t)x * channels;
        uint8_t *d = dst + (size_t)x * 3;
        if (channels <= 2) {
            d[0] = d[1] = d[2] = white ? alpha_on_white(s[0], s[1]) : s[0];
        } else if (white) {
            for (int c = 0; c < 3; c++) d[c] = alpha_on_white(s[c], s[3]);
        } else {
            d[0] = s[0];
            d[1] = s[1];
            d[2] = s[2];
        }
    }
}

/* Runs under setjmp; returns with c->status set, or longjmps out. */
static void png_decode(png_structp png, png_infop info, png_ctx *c, int64_t max_pixels,
                       vitc_image *out) {
    png_uint_32 w, h;
    int depth, ctype, interlace, passes, channels;
    size_t bytes = 0, rowbytes;

    png_set_read_fn(png, c, png_read_mem);
    /* libpng's own default refuses over 1e6 per side; our pixel limit is
     * the one that matters, so lift the per-side limit to it. */
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_read_info(png, info);
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    c->status = image_check_size(c->path, w, h, max_pixels, &bytes);
    if (c->status != VITC_OK)
        return;
    /* Palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha (then dropped). */
    png_set_expand(png);
    png_set_strip_16(png); /* the high byte, as PIL's 16-bit RGB unpacking */
    passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    channels = png_get_channels(png, info);
    rowbytes = png_get_rowbytes(png, info);
    if (channels < 1 || channels > 4 || png_get_bit_depth(png, info) != 8 ||
        rowbytes != (size_t)w * (size_t)channels) {
        c->status = vitc__err(VITC_ERR_FORMAT, "%s: unexpected PNG layout after expansion",
                              c->path);
        return;
    }
    c->rgb = malloc(bytes);
    if (!c->rgb) {
        c->status = vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %ux%u image", c->path,
                              (unsigned)w, (unsigned)h);
        return;
    }
    if (passes > 1) {
        /* Adam7 needs every row held until the last pass. */
        size_t all_bytes;
        if (!vitc__mul_size(rowbytes, h, &all_bytes) ||
            !(c->all = malloc(all_bytes)) || !(c->rows = malloc(sizeof *c->rows * h))) {
            c->status = vitc__err(VITC_ERR_NOMEM, "%s: out of memory for interlaced image",
                                  c->path);
            return;
        }
        for (png_uint_32 y = 0; y < h; y++)
            c->rows[y] = c->all + (size_t)y * rowbytes;
        png_read_image(png, c->rows);
        for (png_uint_32 y = 0; y < h; y++)
            png_to_rgb(c->rgb + (size_t)y * w * 3, c->rows[y], (int)w, channels, c->flags);
    } else {
        if (!(c->row = malloc(rowbytes))) {
            c->status = vitc__err(VITC_ERR_NOMEM, "%s: out of memory", c->path);
            return;
        }
        for (png_uint_32 y = 0; y < h; y++) {
            png_read_row(png, c->row, NULL);
            png_to_rgb(c->rgb + (size_t)y * w * 3, c->row, (int)w, channels, c->flags);
        }
    }
    /* The image data is complete; a bad trailer does not spoil it, as with PIL. */
    out->width = (int)w;
    out->height = (int)h;
    out->rgb = c->rgb;
    c->rgb = NULL;
    c->status = VITC_OK;
}

static vitc_status load_png(const char *path, const unsigned char *data, size_t len,
                            int64_t max_pixels, int flags, vitc_image *out) {
    png_ctx ctx;
    png_ctx *c = &ctx;
    png_structp png;
    png_infop info = NULL;
    vitc_status st;

    memset(&ctx, 0, sizeof ctx);
    ctx.path = path;
    ctx.data = data;
    ctx.len = len;
    ctx.flags = flags;
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_err_fn, png_warn_fn);
    if (!png)
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot create PNG decoder", path);
    info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot create PNG decoder", path);
    }
    if (setjmp(png_jmpbuf(png))) {
        c->status = vitc__err(VITC_ERR_FORMAT, "%s: corrupt PNG: %s", path, c->msg);
    } else {
        png_decode(png, info, c, max_pixels, out);
    }
    st = c->status;
    png_destroy_read_struct(&png, &info, NULL);
    free(c->rgb);
    free(c->row);
    free(c->rows);
    free(c->all);
    return st;
}
#endif /* VITC_HAVE_PNG */

/* ------------------------------------------------------------------ */
/* JPEG                                                               */
/* ------------------------------------------------------------------ */

#ifdef VITC_HAVE_TURBOJPEG
static vitc_status load_jpeg(const char *path, const unsigned char *data, size_t len,
                             int64_t max_pixels, vitc_image *out) {
    tjhandle tj;
    int w = 0, h = 0, subsamp = -1, cs = -1;
    size_t bytes = 0; /* set on every path that reads it; GCC 12 without libpng cannot see it */
    uint8_t *rgb;
    vitc_status st;

    if (len > (size_t)0xffffffffUL)
        return vitc__err(VITC_ERR_FORMAT, "%s: JPEG file too large", path);
    tj = tjInitDecompress();
    if (!tj)
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot create JPEG decoder: %s", path,
                         tjGetErrorStr2(NULL));
    if (tjDecompressHeader3(tj, data, (unsigned long)len, &w, &h, &subsamp, &cs) != 0) {
        st = vitc__err(VITC_ERR_FORMAT, "%s: corrupt JPEG: %s", path, tjGetErrorStr2(tj));
        tjDestroy(tj);
        return st;
    }
    if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
        tjDestroy(tj);
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "%s: CMYK JPEG images are not supported; convert it to RGB first",
                         path);
    }
    st = image_check_size(path, w, h, max_pixels, &bytes);
    if (st != VITC_OK) {
        tjDestroy(tj);
        return st;
    }
    rgb = malloc(bytes);
    if (!rgb) {
        tjDestroy(tj);
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %dx%d image", path, w, h);
    }
    /* Flags 0: accurate integer DCT and fancy upsampling, PIL's defaults. */
    if (tjDecompress2(tj, data, (unsigned long)len, rgb, w, 0, h, TJPF_RGB, 0) != 0) {
        const char *msg = tjGetErrorStr2(tj);
        /* Warnings (extraneous bytes, ...) leave a usable image and PIL accepts
         * them; a premature end leaves gray filler, which PIL refuses too. */
        if (tjGetErrorCode(tj) != TJERR_WARNING || strstr(msg, "Premature end")) {
            st = vitc__err(VITC_ERR_FORMAT, "%s: corrupt JPEG: %s", path, msg);
            free(rgb);
            tjDestroy(tj);
            return st;
        }
    }
    tjDestroy(tj);
    out->width = w;
    out->height = h;
    out->rgb = rgb;
    return VITC_OK;
}
#endif /* VITC_HAVE_TURBOJPEG */

/* The decoders see only bytes; `name` (a path, or "<memory>") prefixes the
 * messages. Shared by the file and the in-memory entry points. */
static vitc_status image_decode(const char *name, const unsigned char *data, size_t len,
                                int64_t max_pixels, int flags, vitc_image *out) {
    static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    /* Unused when built without libpng and libturbojpeg (flags without libpng:
     * JPEG has no alpha). */
    (void)max_pixels;
    (void)out;
    (void)flags;
    if (len >= 8 && !memcmp(data, png_magic, 8)) {
#ifdef VITC_HAVE_PNG
        return load_png(name, data, len, max_pixels, flags, out);
#else
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s: PNG support was not built in (libpng)", name);
#endif
    }
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
#ifdef VITC_HAVE_TURBOJPEG
        return load_jpeg(name, data, len, max_pixels, out);
#else
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s: JPEG support was not built in (libturbojpeg)",
                         name);
#endif
    }
    return vitc__err(VITC_ERR_FORMAT, "%s: not a PNG or JPEG image", name);
}

vitc_status vitc_image_load_flags(const char *path, int64_t max_pixels, int flags,
                                  vitc_image *out) {
    unsigned char *data;
    size_t len;
    vitc_status st;

    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load: out is NULL");
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load: path is NULL");
    if (flags & ~VITC_IMAGE_ALPHA_WHITE)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load: unknown flags 0x%x", flags);
    VITC_TRY(read_file(path, &data, &len));
    st = image_decode(path, data, len, max_pixels, flags, out);
    free(data);
    return st;
}

vitc_status vitc_image_load(const char *path, int64_t max_pixels, vitc_image *out) {
    return vitc_image_load_flags(path, max_pixels, 0, out);
}

vitc_status vitc_image_load_memory_flags(const void *bytes, size_t len, int64_t max_pixels,
                                         int flags, vitc_image *out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load_memory: out is NULL");
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!bytes && len)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load_memory: bytes is NULL");
    if (flags & ~VITC_IMAGE_ALPHA_WHITE)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_load_memory: unknown flags 0x%x",
                         flags);
    if (len == 0)
        return vitc__err(VITC_ERR_FORMAT, "<memory>: empty image");
    return image_decode("<memory>", bytes, len, max_pixels, flags, out);
}

vitc_status vitc_image_load_memory(const void *bytes, size_t len, int64_t max_pixels,
                                   vitc_image *out) {
    return vitc_image_load_memory_flags(bytes, len, max_pixels, 0, out);
}

void vitc_image_free(vitc_image *img) {
    if (!img)
        return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

/* ------------------------------------------------------------------ */
/* PNG writer                                                         */
/* ------------------------------------------------------------------ */

#ifdef VITC_HAVE_PNG
typedef struct png_wctx {
    const char *path;
    const uint8_t *rgb;
    int width, height;
    char msg[200];
} png_wctx;

static void png_werr_fn(png_structp png, png_const_charp msg) {
    png_wctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

/* Runs inside vitc__write_file, which owns f and reports stdio errors. */
static vitc_status png_write_to(FILE *f, void *p) {
    png_wctx *c = p;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, c, png_werr_fn, png_warn_fn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    vitc_status st = VITC_OK;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot create PNG encoder", c->path);
    }
    if (setjmp(png_jmpbuf(png))) {
        st = vitc__err(VITC_ERR_IO, "%s: writing PNG failed: %s", c->path, c->msg);
    } else {
        png_init_io(png, f);
        png_set_IHDR(png, info, (png_uint_32)c->width, (png_uint_32)c->height, 8,
                     PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                     PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < c->height; y++)
            png_write_row(png, (png_const_bytep)(c->rgb + (size_t)y * c->width * 3));
        png_write_end(png, info);
    }
    png_destroy_write_struct(&png, &info);
    return st;
}
#endif

vitc_status vitc_image_save_png(const char *path, const uint8_t *rgb, int width, int height) {
    if (!path || !rgb)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_save_png: NULL argument");
    if (width <= 0 || height <= 0 || width > 0x7fffffff / 3)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_save_png: invalid size %dx%d",
                         width, height);
#ifdef VITC_HAVE_PNG
    png_wctx ctx = {path, rgb, width, height, {0}};
    return vitc__write_file(path, png_write_to, &ctx);
#else
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: PNG support was not built in (libpng)", path);
#endif
}

/* ------------------------------------------------------------------ */
/* Preprocessing: torchvision's ImageClassification transform         */
/* ------------------------------------------------------------------ */

/*
 * One pass of torch's _upsample_bilinear2d_aa (antialiased bilinear,
 * align_corners=False) along one axis, float32 throughout with torch's order
 * of operations, so that after rounding to uint8 the result is torch's:
 * the filter widens with the downscale factor, taps outside the image are
 * dropped and the remaining weights renormalised.
 *
 * in: n_in samples along the axis, each `stride` floats apart, for `count`
 * independent lines `line_in` / `line_out` floats apart.
 */
typedef struct aa_taps {
    int64_t *xmin, *xsize;
    float *w; /* [n_out, ksize] */
    int ksize;
} aa_taps;

/* Taps for outputs [i0, i1) only: torch computes each output's weights from
 * its own index, so a window's taps equal the full resize's. Entry k is
 * output i0 + k. */
static vitc_status aa_taps_make(aa_taps *t, int64_t n_in, int64_t n_out, int64_t i0,
                                int64_t i1) {
    float scale = (float)n_in / (float)n_out;
    float support = (scale >= 1.0f) ? 1.0f * scale : 1.0f;
    float invscale = (scale >= 1.0f) ? (float)(1.0 / scale) : 1.0f;
    size_t n = (size_t)(i1 - i0), nw;
    t->ksize = (int)ceilf(support) * 2 + 1;
    t->xmin = malloc(sizeof *t->xmin * n);
    t->xsize = malloc(sizeof *t->xsize * n);
    if (!vitc__mul_size(n, (size_t)t->ksize, &nw) || !vitc__mul_size(nw, sizeof(float), &nw))
        nw = 0;
    t->w = nw ? malloc(nw) : NULL;
    if (!t->xmin || !t->xsize || !t->w)
        return vitc__err(VITC_ERR_NOMEM, "image resize: out of memory");
    for (int64_t i = i0; i < i1; i++) {
        /* Same mixed float/double expressions as torch's _compute_weights_aa. */
        float center = (float)(scale * (i + 0.5));
        float total = 0.0f;
        int64_t xmin = (int64_t)(center - support + 0.5);
        int64_t xmax = (int64_t)(center + support + 0.5);
        float *w = t->w + (size_t)(i - i0) * t->ksize;
        if (xmin < 0)
            xmin = 0;
        if (xmax > n_in)
            xmax = n_in;
        t->xmin[i - i0] = xmin;
        t->xsize[i - i0] = xmax - xmin;
        for (int64_t j = 0; j < xmax - xmin; j++) {
            float x = (float)(((float)(j + xmin) - center + 0.5) * invscale);
            float f;
            if (x < 0.0f)
                x = -x;
            f = x < 1.0f ? 1.0f - x : 0.0f;
            w[j] = f;
            total += f;
        }
        for (int64_t j = 0; j < xmax - xmin; j++)
            if (total != 0.0f)
                w[j] /= total;
    }
    return VITC_OK;
}

static void aa_taps_free(aa_taps *t) {
    free(t->xmin);
    free(t->xsize);
    free(t->w);
}

/* Both passes accumulate like torch's kernel, which is built with FMA
 * contraction: a product of two floats is exact in double, so the double
 * expression below is fmaf (but for a double-rounding case of probability
 * ~2^-29), and inline. The first pass reads the uint8 pixels directly. */
#define VITC_AA_PASS(NAME, T)                                                                  \
    static void NAME(float *out, const T *in, const aa_taps *t, int64_t n_out,                 \
                     size_t stride_in, size_t stride_out, size_t count, size_t line_in,        \
                     size_t line_out) {                                                        \
        for (size_t l = 0; l < count; l++) {                                                   \
            const T *src = in + l * line_in;                                                   \
            float *dst = out + l * line_out;                                                   \
            for (int64_t i = 0; i < n_out; i++) {                                              \
                const float *w = t->w + (size_t)i * t->ksize;                                  \
                const T *s = src + (size_t)t->xmin[i] * stride_in;                             \
                float acc = (float)s[0] * w[0];                                                \
                for (int64_t j = 1; j < t->xsize[i]; j++)                                      \
                    acc = (float)((double)s[(size_t)j * stride_in] * w[j] + acc);              \
                dst[(size_t)i * stride_out] = acc;                                             \
            }                                                                                  \
        }                                                                                      \
    }
VITC_AA_PASS(aa_pass_u8, uint8_t)
VITC_AA_PASS(aa_pass_f32, float)

/* torchvision's Resize([size]) output size: shorter side = size, longer side
 * = int(size * long / short) (truncated). */
static void resized_size(int h, int w, int size, int64_t *nh, int64_t *nw) {
    int shorter = w <= h ? w : h, longer = w <= h ? h : w;
    int64_t new_long = (int64_t)((double)((int64_t)size * longer) / (double)shorter);
    if (w <= h) {
        *nw = size;
        *nh = new_long;
    } else {
        *nh = size;
        *nw = new_long;
    }
}

/* Python's round(d / 2.0) for an integer d >= 0: half to even. */
static int64_t half_round_even(int64_t d) {
    int64_t k = d / 2;
    if (d % 2 == 0)
        return k;
    return (k % 2 == 0) ? k : k + 1;
}

/* Where the crop lies along one axis of an n-sample (resized) image.
 * torchvision's center_crop zero-pads where the crop is larger (the smaller
 * half before), then cuts at round((padded - crop) / 2). Samples [a0, a1) of
 * the image are the ones kept; sample a0 lands at crop position d0. */
typedef struct crop_axis {
    int64_t a0, a1, d0;
} crop_axis;

static crop_axis crop_axis_make(int64_t n, int crop) {
    int64_t pad = crop > n ? (crop - n) / 2 : 0, padded = crop > n ? crop : n;
    int64_t off = half_round_even(padded - crop) - pad; /* image sample at crop position 0 */
    crop_axis r;
    r.a0 = off > 0 ? off : 0;
    r.a1 = off + crop < n ? off + crop : n;
    r.d0 = r.a0 - off;
    return r;
}

/* torchvision's rgb_to_grayscale on a uint8 tensor: 0.2989 r + 0.587 g +
 * 0.114 b in float32, summed left to right, truncated to uint8. The
 * products come from tables (each rounded once from an exact double
 * product), so no compiler contraction can change the float32 result. */
static void rgb_to_gray(const uint8_t *rgb, size_t n, uint8_t *gray) {
    float lr[256], lg[256], lb[256];
    for (int v = 0; v < 256; v++) {
        lr[v] = (float)((double)0.2989f * v);
        lg[v] = (float)((double)0.587f * v);
        lb[v] = (float)((double)0.114f * v);
    }
    for (size_t i = 0; i < n; i++) {
        float l = lr[rgb[3 * i]] + lg[rgb[3 * i + 1]];
        l += lb[rgb[3 * i + 2]];
        gray[i] = (uint8_t)l;
    }
}

/*
 * Resize, crop and normalise in one pass over the crop's window. Only the
 * resized samples the crop keeps are computed (taps for those rows and
 * columns, the width pass only over the input rows those rows read), so the
 * memory is bounded by the window, not by the resized image: a 100000x1
 * image resized to 256 is 256 x 25.6M pixels, of which the crop needs
 * 224 x 224. Each kept sample is computed exactly as the full resize would
 * compute it (torch's taps depend on the output index alone).
 *
 * src: [h, w, ch] uint8; the resized image is [nh, nw, ch] (nh == h and
 * nw == w: no resize). out: [ch, crop, crop].
 */
static vitc_status crop_window(const uint8_t *src, int64_t h, int64_t w, int ch, int64_t nh,
                               int64_t nw, int crop, const float *mean, const float *std,
                               float *out) {
    const crop_axis ry = crop_axis_make(nh, crop), rx = crop_axis_make(nw, crop);
    const int resize_w = nw != w, resize_h = nh != h;
    const size_t cw = (size_t)(rx.a1 - rx.a0), row_len = cw * (size_t)ch;
    const size_t plane = (size_t)crop * (size_t)crop;
    aa_taps tw = {0}, th = {0};
    float *mid = NULL, *acc = NULL; /* [y_hi - y_lo, cw, ch], [cw, ch] */
    uint8_t *row = NULL;            /* [cw, ch] */
    int64_t y_lo = ry.a0, y_hi = ry.a1;
    size_t n_mid = 0, bytes = 0;
    vitc_status st = VITC_OK;

    if (resize_h) {
        if ((st = aa_taps_make(&th, h, nh, ry.a0, ry.a1)) != VITC_OK)
            goto done;
        y_lo = th.xmin[0];
        y_hi = 0;
        for (int64_t i = 0; i < ry.a1 - ry.a0; i++)
            if (th.xmin[i] + th.xsize[i] > y_hi)
                y_hi = th.xmin[i] + th.xsize[i];
        for (int64_t i = 0; i < ry.a1 - ry.a0; i++)
            th.xmin[i] -= y_lo; /* rows of mid, which starts at input row y_lo */
    }
    if (resize_w && (st = aa_taps_make(&tw, w, nw, rx.a0, rx.a1)) != VITC_OK)
        goto done;
    if (resize_w || resize_h) {
        /* The buffers the window needs (taps aside, which are smaller):
         * refused over the documented cap rather than attempted. */
        if (!vitc__mul_size((size_t)(y_hi - y_lo), row_len, &n_mid) ||
            !vitc__add_size(n_mid, row_len, &bytes) ||
            !vitc__mul_size(bytes, sizeof(float), &bytes) ||
            bytes > VITC_IMAGE_MAX_RESIZE_BYTES) {
            st = vitc__err(VITC_ERR_INVALID_ARG,
                           "image resize: %lldx%lld to %lldx%lld, crop %d needs over %d MiB of "
                           "intermediates (the limit)", (long long)w, (long long)h,
                           (long long)nw, (long long)nh, crop,
                           (int)(VITC_IMAGE_MAX_RESIZE_BYTES >> 20));
            goto done;
        }
        mid = malloc(sizeof(float) * n_mid);
        acc = malloc(sizeof(float) * row_len);
        row = malloc(row_len);
        if (!mid || !acc || !row) {
            st = vitc__err(VITC_ERR_NOMEM, "image resize: out of memory");
            goto done;
        }
        if (resize_w) {
            /* each (input row, channel) is a line of w samples ch apart */
            for (int c = 0; c < ch; c++)
                aa_pass_u8(mid + c, src + (size_t)y_lo * (size_t)w * ch + c, &tw, (int64_t)cw,
                           (size_t)ch, (size_t)ch, (size_t)(y_hi - y_lo), (size_t)w * ch, row_len);
        } else {
            for (int64_t y = y_lo; y < y_hi; y++)
                for (size_t k = 0; k < row_len; k++)
                    mid[(size_t)(y - y_lo) * row_len + k] =
                        (float)src[((size_t)y * (size_t)w + (size_t)rx.a0) * ch + k];
        }
    }
    /* The padding everywhere first (once the work is known to fit); the
     * window then overwrites its part. */
    for (int c = 0; c < ch; c++) {
        float pad_val = (0.0f / 255.0f - mean[c]) / std[c];
        for (size_t i = 0; i < plane; i++)
            out[plane * c + i] = pad_val;
    }
    for (int64_t r = ry.a0; r < ry.a1; r++) {
        const uint8_t *u;
        const int64_t dy = r - ry.a0 + ry.d0;
        if (!resize_w && !resize_h) {
            u = src + ((size_t)r * (size_t)w + (size_t)rx.a0) * ch;
        } else {
            const float *f;
            if (resize_h) {
                /* output row r: each (column, channel) of mid is a line of
                 * samples row_len apart */
                const int64_t i = r - ry.a0;
                aa_taps one = {th.xmin + i, th.xsize + i, th.w + (size_t)i * th.ksize, th.ksize};
                aa_pass_f32(acc, mid, &one, 1, row_len, 1, row_len, 1, 1);
                f = acc;
            } else {
                /* Only here is r a row of mid: with a vertical resize it is
                 * an output row, and mid + (r - y_lo) may lie outside it. */
                f = mid + (size_t)(r - y_lo) * row_len;
            }
            for (size_t k = 0; k < row_len; k++) {
                float v = nearbyintf(f[k]); /* torch.round: half to even */
                row[k] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
            }
            u = row;
        }
        /* ToTensor and Normalize in float32, in torch's order. */
        for (int c = 0; c < ch; c++) {
            float *o = out + plane * c + (size_t)dy * crop + (size_t)rx.d0;
            for (size_t x = 0; x < cw; x++)
                o[x] = ((float)u[x * ch + c] / 255.0f - mean[c]) / std[c];
        }
    }
done:
    aa_taps_free(&th);
    aa_taps_free(&tw);
    free(mid);
    free(acc);
    free(row);
    return st;
}

vitc_status vitc_image_preprocess_channels(const vitc_image *img, int resize, int crop,
                                           int channels, const float *mean, const float *std,
                                           float *out) {
    const uint8_t *px;
    uint8_t *gray = NULL; /* [h, w] */
    int64_t nh, nw;
    size_t n_px;
    vitc_status st;

    if (!img || !img->rgb || !mean || !std || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: NULL argument");
    if (img->width <= 0 || img->height <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: empty image");
    if (channels != 1 && channels != 3)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_image_preprocess: %d channels (images make 1: luminance, or "
                         "3: RGB)", channels);
    if (crop <= 0 || resize < 0 || crop > 65536 || resize > 65536)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_image_preprocess: crop %d / resize %d out of range (crop 1..65536, "
                         "resize 0..65536)", crop, resize);
    for (int c = 0; c < channels; c++)
        if (!(std[c] != 0.0f) || !isfinite(std[c]) || !isfinite(mean[c]))
            return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: invalid mean/std");
    nh = img->height;
    nw = img->width;
    if (resize > 0) {
        resized_size(img->height, img->width, resize, &nh, &nw);
        if (nh <= 0 || nw <= 0)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "vitc_image_preprocess: resizing %dx%d to shorter side %d leaves "
                             "an empty image", img->width, img->height, resize);
        if (nh > INT32_MAX || nw > INT32_MAX)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "vitc_image_preprocess: resizing %dx%d to shorter side %d makes "
                             "%lldx%lld, over %d pixels on a side", img->width, img->height,
                             resize, (long long)nw, (long long)nh, INT32_MAX);
    }
    px = img->rgb;
    if (channels == 1) {
        /* Grayscale before Resize, as a gray model's transform has it. */
        n_px = (size_t)img->width * (size_t)img->height;
        if (!(gray = malloc(n_px)))
            return vitc__err(VITC_ERR_NOMEM, "vitc_image_preprocess: out of memory for a %dx%d "
                             "gray image", img->width, img->height);
        rgb_to_gray(img->rgb, n_px, gray);
        px = gray;
    }
    st = crop_window(px, img->height, img->width, channels, nh, nw, crop, mean, std, out);
    free(gray);
    return st;
}

vitc_status vitc_image_preprocess(const vitc_image *img, int resize, int crop,
                                  const float mean[3], const float std[3], float *out) {
    return vitc_image_preprocess_channels(img, resize, crop, 3, mean, std, out);
}
