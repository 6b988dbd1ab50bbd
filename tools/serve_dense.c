/* serve_dense.c — `vitc serve` with a SAM or Depth Anything model:
 * POST /v1/segment (with a small LRU of image embeddings, so that clicks
 * on one image run only the mask decoder), POST /v1/depth, and /v1/info
 * for such a model. The other endpoints answer 400 naming the problem.
 * Requests run one at a time: the models' forwards use every thread. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#ifdef VITC_HAVE_MHD

#ifdef VITC_HAVE_PNG
#include <png.h>
#endif

/* As cmd_segment.c: bounds the decoded image and the prompt. */
#define DENSE_MAX_PIXELS (25 * 1000 * 1000)
#define DENSE_MAX_POINTS 1000
/* Embeddings kept: a few images, so that clicks on the page's image and a
 * second tab's do not evict each other, yet bounded memory. */
#define DENSE_CACHE_ENTRIES 4
#define DENSE_CACHE_MAX_BYTES ((size_t)256 << 20)

typedef struct dense_entry {
    uint64_t key; /* FNV-1a of the image's encoded bytes */
    vitc_sam_image *emb;
    /* the encoded bytes themselves: a hit compares them, so that images
     * made to collide on the hash never get each other's masks */
    unsigned char *src;
    size_t src_len;
    size_t bytes; /* the embedding's and src's */
    uint64_t used;
} dense_entry;

static struct {
    pthread_mutex_t mu; /* one request at a time, and the cache */
    dense_entry cache[DENSE_CACHE_ENTRIES];
    uint64_t clock;
} D = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0};

/* config.json's "model_type": "sam" or "depth_anything" names a dense
 * model; anything else (or no config.json) is left to cli_open_model. */
int serve_dense_open(serve_state *s, const char *path, const char *precision, int *dense) {
    *dense = 0;
    size_t len = strlen(path) + sizeof "/config.json";
    char *cp = malloc(len);
    if (!cp)
        return cli_error("out of memory");
    snprintf(cp, len, "%s/config.json", path);
    json_t *cfg = json_load_file(cp, 0, NULL);
    free(cp);
    json_t *t = json_object_get(cfg, "model_type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    int sam = !strcmp(type, "sam"), depth = !strcmp(type, "depth_anything");
    t = json_object_get(cfg, "depth_estimation_type");
    s->depth_metric = json_is_string(t) && !strcmp(json_string_value(t), "metric");
    json_decref(cfg);
    if (!sam && !depth)
        return CLI_OK;
    *dense = 1;
    int prec, rc = cli_parse_precision("serve", precision, &prec);
    if (rc != CLI_OK)
        return rc;
    /* src/models/depth.c loads fp32 weights only: a lower precision
     * accepted here would be a claim the server does not keep */
    if (depth && prec > VITC_PRECISION_FP32)
        return cli_usage_error("serve",
                               "--precision %s: a Depth Anything model runs in fp32 only (the "
                               "library has no lower-precision load for it): leave it out",
                               precision);
    if (sam ? vitc_sam_load_precision(path, precision, &s->sam) != VITC_OK
            : vitc_depth_load(path, &s->depth) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    /* the name the responses carry: the path's last component */
    const char *base = path, *p;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    for (p = path; p < path + n; p++)
        if (*p == '/' && p + 1 < path + n)
            base = p + 1;
    if (!(s->model_name = strndup(base, (size_t)(path + n - base))))
        return cli_error("out of memory");
    return CLI_OK;
}

void serve_dense_free(serve_state *s) {
    pthread_mutex_lock(&D.mu);
    for (int i = 0; i < DENSE_CACHE_ENTRIES; i++) {
        vitc_sam_image_free(D.cache[i].emb);
        free(D.cache[i].src);
    }
    memset(D.cache, 0, sizeof D.cache);
    pthread_mutex_unlock(&D.mu);
    vitc_sam_free(s->sam);
    vitc_depth_free(s->depth);
    s->sam = NULL;
    s->depth = NULL;
}

/* ------------------------------------------------------------------ */
/* Encoding                                                            */
/* ------------------------------------------------------------------ */

#ifdef VITC_HAVE_PNG
static void png_to_file(png_structp png, png_bytep data, png_size_t len) {
    FILE *f = png_get_io_ptr(png);
    if (fwrite(data, 1, len, f) != len)
        png_error(png, "write failed");
}
static void png_flush_nop(png_structp png) { (void)png; }

/* A grayscale PNG (depth 8 or 16; rows of width samples, 16-bit ones in
 * the host's order) into a memory buffer: 0 or -1. */
static int png_memory(const void *pixels, int width, int height, int depth, unsigned char **out,
                      size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = open_memstream((char **)out, len);
    if (!f)
        return -1;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    unsigned char *row = malloc((size_t)width * (size_t)(depth / 8));
    volatile int ok = 0;
    if (png && info && row && !setjmp(png_jmpbuf(png))) {
        png_set_write_fn(png, f, png_to_file, png_flush_nop);
        png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, depth,
                     PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                     PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < height; y++) {
            if (depth == 8) {
                png_write_row(png, (png_const_bytep)pixels + (size_t)y * width);
                continue;
            }
            const uint16_t *src = (const uint16_t *)pixels + (size_t)y * width;
            for (int x = 0; x < width; x++) { /* PNG: big-endian samples */
                row[2 * x] = (unsigned char)(src[x] >> 8);
                row[2 * x + 1] = (unsigned char)(src[x] & 255);
            }
            png_write_row(png, row);
        }
        png_write_end(png, NULL);
        ok = 1;
    }
    if (png)
        png_destroy_write_struct(&png, info ? &info : NULL);
    free(row);
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}
#endif

/* ------------------------------------------------------------------ */
/* Requests                                                            */
/* ------------------------------------------------------------------ */

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* "input" (a data: URL or bare base64) or a raw body into the image's
 * encoded bytes (*bytes malloc'd, or pointing into body when *owned is 0). */
static int input_bytes(json_t *root, const char *body, size_t len, const serve_raw *raw,
                       unsigned char **bytes, size_t *n, int *owned, serve_reply *r) {
    *owned = 0;
    if (raw) {
        *bytes = (unsigned char *)body;
        *n = len;
        return 0;
    }
    json_t *in = json_object_get(root, "input");
    if (!json_is_string(in)) {
        serve_fail(r, 400, "\"input\" must be one image: a data: URL or base64 of a PNG or JPEG");
        return -1;
    }
    const char *str = json_string_value(in);
    size_t sl = json_string_length(in);
    if (sl > 5 && !strncmp(str, "data:", 5)) {
        const char *comma = memchr(str, ',', sl);
        if (!comma || comma - str < 12 || strncmp(comma - 7, ";base64", 7) != 0) {
            serve_fail(r, 400, "\"input\": a data: URL must be base64 (data:image/png;base64,...)");
            return -1;
        }
        sl -= (size_t)(comma + 1 - str);
        str = comma + 1;
    }
    char err[256];
    if (serve_base64_decode(str, sl, bytes, n, err, sizeof err) != 0) {
        serve_fail(r, 400, "\"input\": %s", err);
        return -1;
    }
    *owned = 1;
    return 0;
}

static int decode_image(const unsigned char *bytes, size_t n, vitc_image *img, serve_reply *r) {
    if (vitc_image_load_memory(bytes, n, DENSE_MAX_PIXELS, img) != VITC_OK) {
        serve_fail(r, 400, "\"input\": %s", vitc_last_error());
        return -1;
    }
    return 0;
}

/* The cached embedding of key (and of the image src when not NULL), or
 * NULL; marks it used. */
static vitc_sam_image *cache_get(uint64_t key, const unsigned char *src, size_t n) {
    for (int i = 0; i < DENSE_CACHE_ENTRIES; i++)
        if (D.cache[i].emb && D.cache[i].key == key &&
            (!src || (D.cache[i].src_len == n && !memcmp(D.cache[i].src, src, n)))) {
            D.cache[i].used = ++D.clock;
            return D.cache[i].emb;
        }
    return NULL;
}

/* Keeps emb (0), or -1: out of memory for src's copy, emb still the
 * caller's. */
static int cache_put(uint64_t key, vitc_sam_image *emb, size_t bytes, const unsigned char *src,
                     size_t n) {
    unsigned char *copy = malloc(n ? n : 1);
    if (!copy)
        return -1;
    memcpy(copy, src, n);
    bytes += n;
    size_t total = bytes;
    for (int i = 0; i < DENSE_CACHE_ENTRIES; i++) total += D.cache[i].emb ? D.cache[i].bytes : 0;
    for (;;) {
        int lru = -1, empty = -1, count = 0;
        for (int i = 0; i < DENSE_CACHE_ENTRIES; i++) {
            if (!D.cache[i].emb) {
                empty = i;
                continue;
            }
            count++;
            if (lru < 0 || D.cache[i].used < D.cache[lru].used)
                lru = i;
        }
        if (empty >= 0 && (total <= DENSE_CACHE_MAX_BYTES || count == 0)) {
            D.cache[empty] = (dense_entry){key, emb, copy, n, bytes, ++D.clock};
            return 0;
        }
        total -= D.cache[lru].bytes;
        vitc_sam_image_free(D.cache[lru].emb);
        free(D.cache[lru].src);
        memset(&D.cache[lru], 0, sizeof D.cache[lru]);
    }
}

/* A JSON array of numbers into v (at most max): its length, or -1. */
static int numbers(json_t *a, float *v, int max) {
    if (!json_is_array(a) || (int)json_array_size(a) > max)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_number(x))
            return -1;
        v[i] = (float)json_number_value(x);
    }
    return (int)json_array_size(a);
}

static void segment(serve_state *s, json_t *root, const char *body, size_t len,
                    const serve_raw *raw, serve_reply *r) {
    float *points = NULL; /* [n_points, 2] x, y */
    int *labels = NULL;   /* [n_points] */
    unsigned char *bytes = NULL, *png = NULL;
    int owned = 0, n_points = 0, cached = 0, logits = 0, multimask = 0;
    float box[4];         /* x0, y0, x1, y1 */
    vitc_sam_result res;
    memset(&res, 0, sizeof res);
    vitc_image img = {0};

    json_t *pts = json_object_get(root, "points"), *lab = json_object_get(root, "labels");
    json_t *bx = json_object_get(root, "box"), *mm = json_object_get(root, "multimask");
    json_t *fmt = json_object_get(root, "format"), *iid = json_object_get(root, "image_id");
    if (fmt && !(json_is_string(fmt) && (!strcmp(json_string_value(fmt), "png") ||
                                         !strcmp(json_string_value(fmt), "logits")))) {
        serve_fail(r, 400,
                   "\"format\" must be \"png\" (masks as 0/255 PNGs) or \"logits\" (float32)");
        return;
    }
    logits = fmt && !strcmp(json_string_value(fmt), "logits");
    if (mm && !json_is_boolean(mm)) {
        serve_fail(r, 400, "\"multimask\" must be true or false");
        return;
    }
    multimask = json_is_true(mm);
    if (pts) {
        if (!json_is_array(pts) || json_array_size(pts) > DENSE_MAX_POINTS) {
            serve_fail(r, 400, "\"points\" must be an array of at most %d [x, y] pairs",
                       DENSE_MAX_POINTS);
            return;
        }
        n_points = (int)json_array_size(pts);
        if (!json_is_array(lab) || (int)json_array_size(lab) != n_points) {
            serve_fail(r, 400, "\"labels\" must be an array with one label (1 foreground, 0 "
                               "background) per point: %d points",
                       n_points);
            return;
        }
        points = malloc(2 * (size_t)(n_points ? n_points : 1) * sizeof *points);
        labels = malloc((size_t)(n_points ? n_points : 1) * sizeof *labels);
        if (!points || !labels) {
            serve_fail(r, 500, "out of memory");
            goto out;
        }
        for (int i = 0; i < n_points; i++) {
            json_t *l = json_array_get(lab, (size_t)i);
            if (numbers(json_array_get(pts, (size_t)i), points + 2 * i, 2) != 2) {
                serve_fail(r, 400,
                           "\"points\"[%d] must be [x, y], two numbers in the image's pixels", i);
                goto out;
            }
            if (!json_is_integer(l) || (json_integer_value(l) != 0 && json_integer_value(l) != 1)) {
                serve_fail(r, 400, "\"labels\"[%d] must be 1 (foreground) or 0 (background)", i);
                goto out;
            }
            labels[i] = (int)json_integer_value(l);
        }
    } else if (lab) {
        serve_fail(r, 400, "\"labels\" without \"points\": give one label per point");
        return;
    }
    if (bx && numbers(bx, box, 4) != 4) {
        serve_fail(r, 400, "\"box\" must be [x0, y0, x1, y1], four numbers in the image's pixels");
        goto out;
    }
    if (!n_points && !bx) {
        /* as `vitc segment`: without a prompt the decoder's mask means nothing */
        serve_fail(r, 400, "no prompt: give \"points\" (with \"labels\") or a \"box\"");
        goto out;
    }

    pthread_mutex_lock(&D.mu);
    uint64_t key = 0;
    vitc_sam_image *emb = NULL, *own = NULL;
    int W = 0, H = 0;
    if (!raw && iid && !json_object_get(root, "input")) {
        const char *idv = json_is_string(iid) ? json_string_value(iid) : "";
        char *end = NULL;
        key = strtoull(idv, &end, 16);
        if (strlen(idv) != 16 || *end || !(emb = cache_get(key, NULL, 0))) {
            pthread_mutex_unlock(&D.mu);
            serve_fail(r, 400, "\"image_id\" names no cached image (the cache keeps %d): send the "
                               "image as \"input\" again",
                       DENSE_CACHE_ENTRIES);
            goto out;
        }
        cached = 1;
    } else {
        size_t n;
        if (input_bytes(root, body, len, raw, &bytes, &n, &owned, r) != 0) {
            pthread_mutex_unlock(&D.mu);
            goto out;
        }
        key = fnv1a(bytes, n);
        if ((emb = cache_get(key, bytes, n))) {
            cached = 1;
        } else {
            if (decode_image(bytes, n, &img, r) != 0) {
                pthread_mutex_unlock(&D.mu);
                goto out;
            }
            if (vitc_sam_set_image(s->sam, &img, &emb) != VITC_OK) {
                pthread_mutex_unlock(&D.mu);
                serve_fail(r, 400, "%s", vitc_last_error());
                goto out;
            }
            int64_t es[3];
            vitc_sam_embedding_shape(s->sam, es);
            if (cache_put(key, emb, (size_t)(es[0] * es[1] * es[2]) * sizeof(float), bytes, n))
                own = emb; /* not kept: freed after this prompt */
        }
    }
    vitc_sam_prompt p = {.n_points = n_points,
                         .points = n_points ? points : NULL,
                         .labels = n_points ? labels : NULL,
                         .box = bx ? box : NULL,
                         .mask = NULL,
                         .multimask = multimask};
    /* emb stays cached while D.mu is held: the decoder runs under it */
    vitc_status st = vitc_sam_predict(s->sam, emb, &p, &res);
    pthread_mutex_unlock(&D.mu);
    vitc_sam_image_free(own);
    if (st != VITC_OK) {
        serve_fail(r, 400, "%s", vitc_last_error());
        goto out;
    }
    W = res.width;
    H = res.height;
    const size_t plane = (size_t)W * H;
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    fprintf(f, "{\"object\": \"segmentation\", \"model\": ");
    cli_json_string(f, s->model_name);
    fprintf(f, ", \"width\": %d, \"height\": %d, \"image_id\": \"%016llx\", \"cached\": %s",
            W, H, (unsigned long long)key, cached ? "true" : "false");
    if (logits) {
        fprintf(f, ", \"format\": \"logits\", \"shape\": [%d, %d, %d], \"iou\": [", res.n_masks,
                H, W);
        for (int k = 0; k < res.n_masks; k++)
            fprintf(f, "%s%.9g", k ? ", " : "", (double)res.iou[k]);
        fputs("], \"logits\": \"", f);
        serve_put_base64_floats(f, res.masks, (size_t)res.n_masks * plane);
        fputs("\"}\n", f);
    } else {
#ifdef VITC_HAVE_PNG
        unsigned char *m8 = malloc(plane ? plane : 1); /* [H, W] 0 or 255 */
        fputs(", \"format\": \"png\", \"masks\": [", f);
        for (int k = 0; m8 && k < res.n_masks; k++) {
            for (size_t i = 0; i < plane; i++) m8[i] = res.masks[k * plane + i] > 0.0f ? 255 : 0;
            size_t pl;
            if (png_memory(m8, W, H, 8, &png, &pl) != 0)
                break;
            fprintf(f, "%s{\"iou\": %.9g, \"png\": \"", k ? ", " : "", (double)res.iou[k]);
            serve_put_base64(f, png, pl);
            fputs("\"}", f);
            free(png);
            png = NULL;
        }
        fputs("]}\n", f);
        if (!m8 || png) {
            fclose(f);
            free(m8);
            serve_fail(r, 500, "out of memory");
            goto out;
        }
        free(m8);
#else
        fclose(f);
        serve_fail(r, 400, "this build has no PNG support: ask for \"format\": \"logits\"");
        goto out;
#endif
    }
    if (fclose(f) != 0)
        serve_fail(r, 500, "out of memory");
out:
    if (r->status != 200) {
        free(r->body);
        r->body = NULL;
        r->len = 0;
    }
    vitc_sam_result_free(&res);
    vitc_image_free(&img);
    if (owned)
        free(bytes);
    free(png);
    free(points);
    free(labels);
}

static void depth(serve_state *s, json_t *root, const char *body, size_t len,
                  const serve_raw *raw, serve_reply *r) {
    unsigned char *bytes = NULL, *png = NULL;
    uint16_t *g16 = NULL; /* [H, W] min..max as 0..65535 */
    float *d = NULL;      /* [H, W] */
    int owned = 0, as_png = 1;
    vitc_image img = {0};
    json_t *fmt = json_object_get(root, "format");
    if (fmt) {
        if (!json_is_string(fmt) || (strcmp(json_string_value(fmt), "png16") != 0 &&
                                     strcmp(json_string_value(fmt), "float32") != 0)) {
            serve_fail(r, 400,
                       "\"format\" must be \"png16\" (a 16-bit PNG, min..max as 0..65535) or "
                       "\"float32\" ([height, width] little-endian)");
            return;
        }
        as_png = !strcmp(json_string_value(fmt), "png16");
    }
#ifndef VITC_HAVE_PNG
    if (as_png) {
        serve_fail(r, 400, "this build has no PNG support: ask for \"format\": \"float32\"");
        return;
    }
#endif
    size_t n;
    if (input_bytes(root, body, len, raw, &bytes, &n, &owned, r) != 0 ||
        decode_image(bytes, n, &img, r) != 0)
        goto out;
    pthread_mutex_lock(&D.mu);
    vitc_status st = vitc_depth_predict(s->depth, &img, &d);
    pthread_mutex_unlock(&D.mu);
    if (st != VITC_OK) {
        serve_fail(r, 400, "%s", vitc_last_error());
        goto out;
    }
    const size_t np = (size_t)img.width * img.height;
    float lo = d[0], hi = d[0];
    for (size_t i = 1; i < np; i++) {
        lo = d[i] < lo ? d[i] : lo;
        hi = d[i] > hi ? d[i] : hi;
    }
    size_t pl = 0;
#ifdef VITC_HAVE_PNG
    if (as_png) {
        /* as cmd_depth.c's --raw FILE.png */
        if (!(g16 = malloc(np * sizeof *g16))) {
            serve_fail(r, 500, "out of memory");
            goto out;
        }
        double span = hi > lo ? (double)hi - lo : 1.0;
        for (size_t i = 0; i < np; i++)
            g16[i] = (uint16_t)lrint(((double)d[i] - lo) / span * 65535.0);
        if (png_memory(g16, img.width, img.height, 16, &png, &pl) != 0) {
            serve_fail(r, 500, "out of memory");
            goto out;
        }
    }
#endif
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    fputs("{\"object\": \"depth\", \"model\": ", f);
    cli_json_string(f, s->model_name);
    fprintf(f,
            ", \"width\": %d, \"height\": %d, \"min\": %.9g, \"max\": %.9g, \"metric\": %s, "
            "\"format\": \"%s\", \"depth\": \"",
            img.width, img.height, (double)lo, (double)hi, s->depth_metric ? "true" : "false",
            as_png ? "png16" : "float32");
    if (as_png)
        serve_put_base64(f, png, pl);
    else
        serve_put_base64_floats(f, d, np);
    fputs("\"}\n", f);
    if (fclose(f) != 0) {
        free(r->body);
        r->body = NULL;
        serve_fail(r, 500, "out of memory");
    }
out:
    vitc_image_free(&img);
    if (owned)
        free(bytes);
    free(png);
    free(g16);
    free(d);
}

static void info(serve_state *s, serve_reply *r) {
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        return;
    }
    fputs("{\"object\": \"model\", \"model\": ", f);
    cli_json_string(f, s->model_name);
    if (s->sam) {
        int64_t es[3];
        vitc_sam_embedding_shape(s->sam, es);
        fprintf(f,
                ", \"family\": \"sam\", \"arch\": null, \"image_size\": [%d, %d], "
                "\"embedding_shape\": [%lld, %lld, %lld]",
                vitc_sam_input_size(s->sam), vitc_sam_input_size(s->sam), (long long)es[0],
                (long long)es[1], (long long)es[2]);
    } else {
        fprintf(f, ", \"family\": \"depth_anything\", \"arch\": null, \"metric\": %s",
                s->depth_metric ? "true" : "false");
    }
    fprintf(f,
            ", \"has_head\": false, \"has_labels\": false, \"has_text\": false, "
            "\"class_token\": false, \"capabilities\": {\"embeddings\": false, \"classify\": "
            "false, \"zero_shot\": false, \"attention\": false, \"segment\": %s, \"depth\": %s}",
            s->sam ? "true" : "false", s->depth ? "true" : "false");
    fprintf(f,
            ", \"limits\": {\"max_body_bytes\": %zu, \"max_points\": %d, \"max_pixels\": %d, "
            "\"cached_images\": %d}}\n",
            s->max_body, DENSE_MAX_POINTS, DENSE_MAX_PIXELS, DENSE_CACHE_ENTRIES);
    if (fclose(f) != 0) {
        free(r->body);
        r->body = NULL;
        serve_fail(r, 500, "out of memory");
    }
}

void serve_dense_handle(serve_state *s, int endpoint, const char *body, size_t len,
                        const serve_raw *raw, serve_reply *r) {
    memset(r, 0, sizeof *r);
    r->status = 200;
    if (endpoint == SERVE_EP_INFO) {
        info(s, r);
        return;
    }
    int want = s->sam ? SERVE_EP_SEGMENT : SERVE_EP_DEPTH;
    if (endpoint != want) {
        serve_fail(r, 400, "the loaded model is a %s: it answers only %s (and GET /v1/info)",
                   s->sam ? "Segment Anything model" : "Depth Anything model",
                   s->sam ? "POST /v1/segment" : "POST /v1/depth");
        return;
    }
    json_t *root;
    json_error_t je;
    if (raw)
        root = json_object();
    else
        root = json_loadb(body, len, 0, &je);
    if (!root) {
        if (raw)
            serve_fail(r, 500, "out of memory");
        else
            serve_fail(r, 400, "malformed JSON: %s (line %d, column %d)", je.text, je.line,
                       je.column);
        return;
    }
    if (!json_is_object(root))
        serve_fail(r, 400, "the body must be a JSON object with \"input\"");
    else if (s->sam)
        segment(s, root, body, len, raw, r);
    else
        depth(s, root, body, len, raw, r);
    json_decref(root);
}

#endif
