/*
 * image.c — PNG and JPEG in, PNG out (preprocessing: preprocess.c).
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
    const uint16_t *gray16; /* [height, width] instead of rgb: a 16-bit gray PNG */
    uint8_t *row;           /* [width * 2] one gray16 row, big-endian as PNG stores it */
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
        png_set_IHDR(png, info, (png_uint_32)c->width, (png_uint_32)c->height,
                     c->gray16 ? 16 : 8, c->gray16 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB,
                     PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < c->height; y++) {
            if (!c->gray16) {
                png_write_row(png, (png_const_bytep)(c->rgb + (size_t)y * c->width * 3));
                continue;
            }
            const uint16_t *g = c->gray16 + (size_t)y * (size_t)c->width;
            for (int x = 0; x < c->width; x++) {
                c->row[2 * x] = (uint8_t)(g[x] >> 8);
                c->row[2 * x + 1] = (uint8_t)(g[x] & 0xff);
            }
            png_write_row(png, (png_const_bytep)c->row);
        }
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
    png_wctx ctx = {path, rgb, width, height, {0}, NULL, NULL};
    return vitc__write_file(path, png_write_to, &ctx);
#else
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: PNG support was not built in (libpng)", path);
#endif
}

vitc_status vitc_image_save_png16(const char *path, const uint16_t *gray, int width, int height) {
    if (!path || !gray)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_save_png16: NULL argument");
    if (width <= 0 || height <= 0 || width > 0x7fffffff / 2)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_save_png16: invalid size %dx%d",
                         width, height);
#ifdef VITC_HAVE_PNG
    png_wctx ctx = {path, NULL, width, height, {0}, gray, malloc((size_t)width * 2)};
    if (!ctx.row)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for a %d-pixel row", path, width);
    vitc_status s = vitc__write_file(path, png_write_to, &ctx);
    free(ctx.row);
    return s;
#else
    return vitc__err(VITC_ERR_UNSUPPORTED, "%s: PNG support was not built in (libpng)", path);
#endif
}
