/*
 * cmd_attention_map.c — `vitc attention-map`: where a ViT looks, as a PNG.
 *
 * The picture has three parts side by side: the preprocessed image (what the
 * model saw: resized and center-cropped), the same image with the attention
 * heat map blended over it, and a colour scale labelled "high" and "low".
 * The map is the class token's row of the attention rollout (or of the last
 * layer's attention averaged over heads) over the patch grid, bilinearly
 * upsampled to pixels and min-max normalised, in viridis (perceptually
 * uniform, readable in grayscale and by colour-blind viewers).
 * A caption strip under the three parts names the model file, the method and
 * the image, so that a picture shown apart from its command still says what
 * it is.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plot.h"

static const char attention_map_usage[] =
    "usage: vitc attention-map --model M.safetensors --out OUT.png [options] IMAGE\n"
    "\n"
    "Write the attention of a Vision Transformer's class token over an image\n"
    "as a PNG: the image the model saw, the heat map blended over it, and a\n"
    "colour scale (viridis; yellow = high, dark blue = low), with a caption\n"
    "strip below naming the model file, the method and the image.\n"
    "\n"
    "options:\n"
    "  --model FILE     safetensors checkpoint (torchvision or timm names)\n"
    "  --arch NAME      architecture when the file has no vitc.config metadata\n"
    "  --method M       rollout: attention rollout over all layers (default)\n"
    "                   cls: the last layer's class-token attention, mean of heads\n"
    "  --crop C         center crop size, 1..4096 (default: the model's image size)\n"
    "  --resize R       shorter side before cropping, 0..16384 (default\n"
    "                   crop*256/224; 0: no resize)\n"
    "  --alpha A        heat map opacity, 0..1 (default 0.5)\n"
    "  --out FILE       the PNG to write\n"
    "  --raw FILE       also save the map over the patch grid, before\n"
    "                   normalisation, as float32 .npy [grid_h, grid_w]\n"
    "  --threads N      threads, 1..256 (default: all CPUs available)\n"
    CLI_PRECISION_HELP
    "  --quiet          no line on stderr naming what was written\n"
    "  -h, --help       this help\n";

/* viridis at 9 evenly spaced stops (matplotlib's map, as in R's viridis(9)). */
static const uint8_t viridis[9][3] = {
    {0x44, 0x01, 0x54}, {0x47, 0x2d, 0x7b}, {0x3b, 0x52, 0x8b}, {0x2c, 0x72, 0x8e},
    {0x21, 0x90, 0x8c}, {0x27, 0xad, 0x81}, {0x5d, 0xc8, 0x63}, {0xaa, 0xdc, 0x32},
    {0xfd, 0xe7, 0x25},
};

static void colormap(float t, float rgb[3]) {
    float x;
    int i;
    if (!(t >= 0.0f))
        t = 0.0f;
    if (t > 1.0f)
        t = 1.0f;
    x = t * 8.0f;
    i = (int)x;
    if (i > 7)
        i = 7;
    x -= (float)i;
    for (int c = 0; c < 3; c++)
        rgb[c] = (1.0f - x) * viridis[i][c] + x * viridis[i + 1][c];
}

typedef struct am_opts {
    const char *model, *arch, *method, *out, *raw, *image, *precision, *attn_precision;
    int crop, resize, threads, crop_set, resize_set, quiet;
    float alpha;
} am_opts;

static int am_parse(int argc, char **argv, am_opts *o) {
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o->arch, 0, 0, NULL},
        {"--method", NULL, CLI_STRING, &o->method, 0, 0, NULL},
        {"--out", NULL, CLI_STRING, &o->out, 0, 0, NULL},
        {"--raw", NULL, CLI_STRING, &o->raw, 0, 0, NULL},
        {"--alpha", NULL, CLI_FLOAT, &o->alpha, 0, 1, NULL},
        {"--crop", NULL, CLI_INT, &o->crop, 1, 4096, &o->crop_set},
        {"--resize", NULL, CLI_INT, &o->resize, 0, 16384, &o->resize_set},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o->precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o->attn_precision, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &o->quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 1, "image"};
    char *pos[1];
    int n_pos, rc;
    o->method = "rollout";
    o->alpha = 0.5f;
    rc = cli_parse_command("attention-map", &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(attention_map_usage, stdout);
        return -1;
    }
    if (rc != 0)
        return rc;
    o->image = n_pos ? pos[0] : NULL;
    if (!o->model)
        return cli_usage_error("attention-map", "--model is required");
    if (!o->out)
        return cli_usage_error("attention-map", "--out is required");
    if (!o->image)
        return cli_usage_error("attention-map", "no image given");
    static const char *const png[] = {".png"}, *const npy[] = {".npy"};
    if (cli_out_format("attention-map", "--out", o->out, "PNG", png, 1) < 0 ||
        (o->raw && cli_out_format("attention-map", "--raw", o->raw, "float32 .npy", npy, 1) < 0))
        return CLI_USAGE;
    if (strcmp(o->method, "rollout") && strcmp(o->method, "cls"))
        return cli_usage_error("attention-map", "--method is rollout or cls, not '%s'",
                               o->method);
    return 0;
}

/* The class token's attention over the patches, [gh * gw]. */
static int class_token_map(vitc_vit *m, const am_opts *o, const float *x, int N, float *map) {
    const vitc_vit_config *cfg = vitc_vit_get_config(m);
    int np = vitc_vit_num_prefix_tokens(m); /* class (+ distillation, registers) first */
    size_t nn = (size_t)N * N, count;
    float *buf;
    if (!strcmp(o->method, "rollout")) {
        count = nn;
    } else if (__builtin_mul_overflow((size_t)cfg->depth * (size_t)cfg->num_heads, nn, &count)) {
        return cli_error("the attention of %d layers over %d tokens is too large", cfg->depth, N);
    }
    buf = malloc(count * sizeof(float));
    if (!buf)
        return cli_error("out of memory for the attention of %d tokens", N);
    if (!strcmp(o->method, "rollout")) {
        if (vitc_vit_attention_maps(m, x, 1, o->crop, o->crop, NULL, buf) != VITC_OK) {
            free(buf);
            return cli_error("attention rollout: %s", vitc_last_error());
        }
        memcpy(map, buf + np, sizeof(float) * (size_t)(N - np));
    } else {
        const float *last;
        if (vitc_vit_attention_maps(m, x, 1, o->crop, o->crop, buf, NULL) != VITC_OK) {
            free(buf);
            return cli_error("attention maps: %s", vitc_last_error());
        }
        /* attn [depth, B=1, heads, N, N]: the last layer, row 0 (CLS) */
        last = buf + (size_t)(cfg->depth - 1) * cfg->num_heads * nn;
        for (int j = np; j < N; j++) {
            double s = 0.0;
            for (int hd = 0; hd < cfg->num_heads; hd++)
                s += last[(size_t)hd * nn + (size_t)j];
            map[j - np] = (float)(s / cfg->num_heads);
        }
    }
    free(buf);
    return 0;
}

/* Output pixel i of a map cell every `cell` pixels: the two cells of [0, n)
 * it reads (align_corners=False, clamped to the edge cells) and the weight
 * of *i1. */
static void map_tap(int i, int cell, int n, int *i0, int *i1, float *w1) {
    float s = (i + 0.5f) / (float)cell - 0.5f;
    if (s < 0)
        s = 0;
    if (s > n - 1)
        s = (float)(n - 1);
    *i0 = (int)s;
    *w1 = s - *i0;
    *i1 = *i0 + 1 < n ? *i0 + 1 : *i0;
}

/* The caption strip's height for font scale s: one text line with 5*s pixels
 * of margin above and below it (the documented size is panels + this). */
#define CAPTION_H(s) ((CANVAS_FONT_H + 10) * (s))

/* One line under the panels, in the panels' font scale when it fits, else
 * at scale 1; what still does not fit loses its end to "..." rather than
 * widen the picture, whose width stays that of the panels. */
static void caption(canvas *cv, const am_opts *o, int y, int s, int margin) {
    static const uint8_t black[3] = {0, 0, 0}, rule[3] = {190, 190, 190};
    char text[1024], model[256], image[256];
    canvas_base_name(o->model, model, sizeof model);
    canvas_base_name(o->image, image, sizeof image);
    snprintf(text, sizeof text, "%s | %s | %s", model,
             strcmp(o->method, "rollout") ? "cls: last layer, mean of heads"
                                          : "rollout: all layers",
             image);
    int room = cv->w - 2 * margin, ts = s, h = CAPTION_H(s);
    if (canvas_text_width(text, ts) > room)
        ts = 1;
    size_t n = strlen(text);
    while (n > 3 && canvas_text_width(text, ts) > room) {
        n--;
        memcpy(text + n - 3, "...", 4);
    }
    canvas_rect(cv, 0, y, cv->w, 1, rule);
    canvas_text(cv, margin, y + (h - CANVAS_FONT_H * ts + 1) / 2, text, ts, black);
}

/* Compose [image | image + heat map | scale] into a canvas. Crops under 224
 * pixels are shown enlarged by a whole factor z (pixels replicated) so that
 * the picture stays readable; the heat map is interpolated at that size. */
static int render(const am_opts *o, const uint8_t *img, const float *map, int gh, int gw,
                  int patch, canvas *cv) {
    const int z = o->crop >= 224 ? 1 : (224 + o->crop - 1) / o->crop > 8 ? 8
                                                              : (224 + o->crop - 1) / o->crop;
    const int S = o->crop * z;
    int s = S / 112 > 1 ? S / 112 : 1;              /* font scale */
    int gap = S / 32 > 4 ? S / 32 : 4;
    int bar_w = S / 16 > 10 ? S / 16 : 10;
    int text_w = 4 * 6 * s;
    int bar_x = 2 * S + 2 * gap, text_x = bar_x + bar_w + gap / 2 + 3 * s;
    int bar_y0, bar_y1; /* the scale spans rows [y0, y1) */
    static const uint8_t black[3] = {0, 0, 0};
    float lo = INFINITY, hi = -INFINITY;

    /* the height leaves room for both labels on tiny crops */
    const int cw = text_x + text_w + gap, ph = S < 40 * s ? 40 * s : S, ch = ph + CAPTION_H(s);
    bar_y0 = 4 * s;
    bar_y1 = ph - 4 * s;
    if (canvas_init(cv, cw, ch) != 0) /* white */
        return cli_error("out of memory for a %dx%d picture", cw, ch);
    for (int i = 0; i < gh * gw; i++) {
        if (map[i] < lo)
            lo = map[i];
        if (map[i] > hi)
            hi = map[i];
    }
    for (int y = 0; y < S; y++) {
        /* bilinear, align_corners=False, over the pixels the patches cover */
        int y0, y1, x0, x1;
        float fy, fx;
        map_tap(y, patch * z, gh, &y0, &y1, &fy);
        for (int x = 0; x < S; x++) {
            float v, t, rgb[3];
            const uint8_t *p = img + ((size_t)(y / z) * o->crop + x / z) * 3;
            uint8_t *a = cv->rgb + ((size_t)y * cv->w + x) * 3;
            uint8_t *b = cv->rgb + ((size_t)y * cv->w + x + S + gap) * 3;
            map_tap(x, patch * z, gw, &x0, &x1, &fx);
            v = (1 - fy) * ((1 - fx) * map[y0 * gw + x0] + fx * map[y0 * gw + x1]) +
                fy * ((1 - fx) * map[y1 * gw + x0] + fx * map[y1 * gw + x1]);
            t = hi > lo ? (v - lo) / (hi - lo) : 0.0f;
            colormap(t, rgb);
            for (int c = 0; c < 3; c++) {
                a[c] = p[c];
                b[c] = (uint8_t)lrintf((1.0f - o->alpha) * p[c] + o->alpha * rgb[c]);
            }
        }
    }
    /* the scale: high at the top, a black frame, ticks at both ends */
    for (int y = bar_y0; y < bar_y1; y++) {
        float rgb[3];
        uint8_t c8[3];
        colormap((float)(bar_y1 - 1 - y) / (float)(bar_y1 - bar_y0 - 1 > 0 ? bar_y1 - bar_y0 - 1 : 1),
                 rgb);
        for (int c = 0; c < 3; c++)
            c8[c] = (uint8_t)lrintf(rgb[c]);
        canvas_rect(cv, bar_x, y, bar_w, 1, c8);
    }
    canvas_rect(cv, bar_x - 1, bar_y0 - 1, bar_w + 2, 1, black);
    canvas_rect(cv, bar_x - 1, bar_y1, bar_w + 2, 1, black);
    canvas_rect(cv, bar_x - 1, bar_y0 - 1, 1, bar_y1 - bar_y0 + 2, black);
    canvas_rect(cv, bar_x + bar_w, bar_y0 - 1, 1, bar_y1 - bar_y0 + 2, black);
    canvas_rect(cv, bar_x + bar_w, bar_y0, gap / 2, s, black);
    canvas_rect(cv, bar_x + bar_w, bar_y1 - s, gap / 2, s, black);
    canvas_text(cv, text_x, bar_y0, "high", s, black);
    canvas_text(cv, text_x, bar_y1 - 7 * s, "low", s, black);
    caption(cv, o, ph, s, gap);
    return 0;
}

int cmd_attention_map(int argc, char **argv) {
    am_opts o;
    vitc_vit *m = NULL;
    const vitc_vit_config *cfg;
    cli_input in;
    float *x = NULL, *map = NULL; /* [channels, crop, crop], [gh * gw] */
    uint8_t *seen = NULL;         /* [crop, crop, 3] */
    canvas cv = {0, 0, NULL};
    int rc, gh, gw, N;
    size_t plane;

    memset(&o, 0, sizeof o);
    rc = am_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? CLI_OK : rc;
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, o.crop,
                               o.crop_set, o.resize, o.resize_set, 0};
    if ((rc = cli_open_model("attention-map", &mo, &m, &in)) != CLI_OK)
        goto done;
    cfg = vitc_vit_get_config(m);
    o.crop = in.crop;
    o.resize = in.resize;
    gh = gw = o.crop / cfg->patch_size;
    if (vitc_vit_num_prefix_tokens(m) < 1) {
        rc = cli_error("%s: the model has no class token to map attention from", o.model);
        goto done;
    }
    N = vitc_vit_num_prefix_tokens(m) + gh * gw;
    plane = (size_t)o.crop * o.crop;
    x = malloc(sizeof(float) * in.per_image);
    map = malloc(sizeof(float) * (size_t)(gh * gw));
    seen = malloc(3 * plane);
    if (!x || !map || !seen) {
        rc = cli_error("out of memory");
        goto done;
    }
    if (cli_load_input(o.image, cfg, &in, x) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    /* The uint8 image the model saw: undo the normalisation (exact after
     * rounding, since the crop was uint8 before it); a gray model's one
     * plane is shown as gray. */
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) {
            int k = in.channels == 1 ? 0 : c;
            float v = (x[k * plane + i] * cfg->std[k] + cfg->mean[k]) * 255.0f;
            seen[i * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : lrintf(v));
        }
    if ((rc = class_token_map(m, &o, x, N, map)) != 0)
        goto done;
    if (o.raw && vitc_save_npy(o.raw, map, 2, (const int64_t[2]){gh, gw}) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if ((rc = render(&o, seen, map, gh, gw, cfg->patch_size, &cv)) != 0)
        goto done;
    if (vitc_image_save_png(o.out, cv.rgb, cv.w, cv.h) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    /* success is otherwise silent: say where the picture went */
    if (!o.quiet) {
        fputs("vitc: wrote ", stderr);
        cli_put_escaped(stderr, o.out, SIZE_MAX);
        fprintf(stderr, " (%dx%d, %s attention", cv.w, cv.h, o.method);
        if (o.raw) {
            fputs("; the raw map in ", stderr);
            cli_put_escaped(stderr, o.raw, SIZE_MAX);
        }
        fputs(")\n", stderr);
    }
    rc = CLI_OK;
done:
    canvas_free(&cv);
    free(seen);
    free(map);
    free(x);
    vitc_vit_free(m);
    return rc;
}
