/*
 * cmd_depth.c — `vitc depth`: a depth map of an image with Depth Anything.
 *
 * The picture is the depth at the image's own size in inferno (perceptually
 * uniform, readable in grayscale), near bright and far dark, with a colour
 * bar beside it labelled "near" and "far" and the values at its ends. A
 * relative model's output grows towards the camera (it is inverse depth,
 * disparity-like), a metric model's grows away from it: the colours follow
 * nearness either way, the labels give the values as the model gave them.
 * Everything is computed before anything is written, so an error leaves
 * no file behind; each file goes through the library's atomic writers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "plot.h"

static const char depth_usage[] =
    "usage: vitc depth --model DIR --out OUT.png [options] IMAGE\n"
    "\n"
    "Estimate the depth of every pixel of an image with a Depth Anything\n"
    "(V1 or V2) model directory (transformers' DepthAnythingForDepthEstimation:\n"
    "config.json, model.safetensors, preprocessor_config.json), as the\n"
    "transformers depth-estimation pipeline does, and write it as a picture:\n"
    "the map in inferno (near = bright, far = dark) with a colour bar\n"
    "labelled near and far and the values at its ends.\n"
    "\n"
    "options:\n"
    "  --model DIR      the Depth Anything directory\n"
    "  --out FILE       the picture to write (PNG)\n"
    "  --raw FILE       also the depth at the image's size: FILE.npy float32\n"
    "                   [height, width], or FILE.png a 16-bit grayscale PNG\n"
    "                   (min..max scaled to 0..65535)\n"
    "  --json           print {\"image\", \"width\", \"height\", \"min\", \"max\"}, one line\n"
    "  --threads N      threads, 1..256 (default: all CPUs available)\n"
    "  --quiet          no line on stderr naming what was written\n"
    "  -h, --help       this help\n"
    "\n"
    "One of --out, --raw or --json is needed.\n";

/* inferno at 9 evenly spaced stops (matplotlib's map, as in R's inferno(9)). */
static const uint8_t inferno[9][3] = {
    {0x00, 0x00, 0x04}, {0x1b, 0x0c, 0x42}, {0x4b, 0x0c, 0x6b}, {0x78, 0x1c, 0x6d},
    {0xa5, 0x2c, 0x60}, {0xcf, 0x44, 0x46}, {0xed, 0x69, 0x25}, {0xfb, 0x9a, 0x06},
    {0xfc, 0xff, 0xa4},
};

static void colormap(float t, uint8_t rgb[3]) {
    if (!(t >= 0.0f))
        t = 0.0f;
    if (t > 1.0f)
        t = 1.0f;
    float x = t * 8.0f;
    int i = (int)x > 7 ? 7 : (int)x;
    x -= (float)i;
    for (int c = 0; c < 3; c++)
        rgb[c] = (uint8_t)lrintf((1.0f - x) * inferno[i][c] + x * inferno[i + 1][c]);
}

typedef struct depth_opts {
    const char *model, *out, *raw, *image;
    int threads, json, quiet, raw_png;
} depth_opts;

static int depth_parse(int argc, char **argv, depth_opts *o) {
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--out", NULL, CLI_STRING, &o->out, 0, 0, NULL},
        {"--raw", NULL, CLI_STRING, &o->raw, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &o->json, 0, 0, NULL},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--quiet", "-q", CLI_FLAG, &o->quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 1, "image"};
    char *pos[1];
    int n_pos;
    int rc = cli_parse_command("depth", &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(depth_usage, stdout);
        return -1;
    }
    if (rc != 0)
        return rc;
    o->image = n_pos ? pos[0] : NULL;
    if (!o->model)
        return cli_usage_error("depth", "--model is required");
    if (!o->out && !o->raw && !o->json)
        return cli_usage_error("depth", "nothing to write: give --out, --raw or --json");
    if (!o->image)
        return cli_usage_error("depth", "no image given");
    static const char *const png[] = {".png"}, *const raw[] = {".npy", ".png"};
    if (o->out && cli_out_format("depth", "--out", o->out, "PNG", png, 1) < 0)
        return CLI_USAGE;
    if (o->raw) {
        int k = cli_out_format("depth", "--raw", o->raw, "float32 .npy or 16-bit .png", raw, 2);
        if (k < 0)
            return CLI_USAGE;
        o->raw_png = k == 1;
    }
    return 0;
}

/* The picture: the map (near bright) and, to its right, the colour bar
 * with "near" / "far" and the values at its ends. */
static int render(const float *d, int w, int h, float lo, float hi, int metric_like,
                  canvas *cv) {
    static const uint8_t black[3] = {0, 0, 0};
    int side = w < h ? w : h;
    int s = side / 256 > 1 ? side / 256 : 1; /* font scale */
    int gap = 6 * s, bar_w = 12 * s;
    char near_v[32], far_v[32];
    float near = metric_like ? lo : hi, far = metric_like ? hi : lo;
    snprintf(near_v, sizeof near_v, "%.4g", (double)near);
    snprintf(far_v, sizeof far_v, "%.4g", (double)far);
    int tw = canvas_text_width(near_v, s), tf = canvas_text_width(far_v, s);
    int text_w = tw > tf ? tw : tf;
    if (text_w < canvas_text_width("near", s))
        text_w = canvas_text_width("near", s);
    /* the labels sit above and below the bar, as wide as the widest */
    int bar_x = w + gap, strip = text_w > bar_w ? text_w : bar_w;
    int cw = bar_x + strip + gap, ph = h < 48 * s ? 48 * s : h;
    if (canvas_init(cv, cw, ph) != 0) /* white */
        return cli_error("out of memory for a %dx%d picture", cw, ph);
    float span = hi > lo ? hi - lo : 1.0f;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float v = d[(size_t)y * (size_t)w + (size_t)x];
            float t = (v - lo) / span; /* 1 at the largest value */
            colormap(metric_like ? 1.0f - t : t, cv->rgb + ((size_t)y * (size_t)cw + x) * 3);
        }
    int lh = CANVAS_FONT_H * s + 2 * s; /* a label's line */
    int y0 = 2 * s + 2 * lh, y1 = ph - 2 * s - 2 * lh; /* two lines above the bar, two below */
    if (y1 <= y0)
        y1 = y0 + 1;
    for (int y = y0; y < y1; y++) {
        uint8_t c8[3];
        colormap((float)(y1 - 1 - y) / (float)(y1 - y0 - 1 > 0 ? y1 - y0 - 1 : 1), c8);
        canvas_rect(cv, bar_x, y, bar_w, 1, c8);
    }
    canvas_rect(cv, bar_x - 1, y0 - 1, bar_w + 2, 1, black);
    canvas_rect(cv, bar_x - 1, y1, bar_w + 2, 1, black);
    canvas_rect(cv, bar_x - 1, y0 - 1, 1, y1 - y0 + 2, black);
    canvas_rect(cv, bar_x + bar_w, y0 - 1, 1, y1 - y0 + 2, black);
    canvas_text(cv, bar_x, 2 * s, "near", s, black);
    canvas_text(cv, bar_x, 2 * s + lh, near_v, s, black);
    canvas_text(cv, bar_x, y1 + 2 * s + 2, "far", s, black);
    canvas_text(cv, bar_x, y1 + 2 * s + 2 + lh, far_v, s, black);
    return 0;
}

int cmd_depth(int argc, char **argv) {
    depth_opts o;
    vitc_depth *m = NULL;
    vitc_image img = {0, 0, NULL};
    float *d = NULL;
    uint16_t *g16 = NULL;
    canvas cv = {0, 0, NULL};
    int rc;

    memset(&o, 0, sizeof o);
    rc = depth_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? CLI_OK : rc;
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    if (vitc_depth_load(o.model, &m) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (vitc_image_load(o.image, 0, &img) != VITC_OK ||
        vitc_depth_predict(m, &img, &d) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    size_t n = (size_t)img.width * (size_t)img.height;
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < lo)
            lo = d[i];
        if (d[i] > hi)
            hi = d[i];
    }
    if (!isfinite(lo) || !isfinite(hi)) {
        rc = cli_error("%s: the model's depth is not finite (NaN or infinity)", o.image);
        goto done;
    }
    /* A relative model's values grow with nearness (inverse depth), a
     * metric model's with distance: which one it is, config.json says
     * (the library has read and checked it already). */
    int metric_like = 0;
    {
        size_t len = strlen(o.model) + sizeof "/config.json";
        char *path = malloc(len);
        json_t *cfg = path ? json_load_file((snprintf(path, len, "%s/config.json", o.model), path),
                                            0, NULL)
                           : NULL;
        json_t *t = json_object_get(cfg, "depth_estimation_type");
        metric_like = json_is_string(t) && !strcmp(json_string_value(t), "metric");
        json_decref(cfg);
        free(path);
    }
    if (o.out && (rc = render(d, img.width, img.height, lo, hi, metric_like, &cv)) != 0)
        goto done;
    if (o.raw_png) {
        if (!(g16 = malloc(n * sizeof *g16))) {
            rc = cli_error("out of memory for a %dx%d 16-bit map", img.width, img.height);
            goto done;
        }
        double span = hi > lo ? (double)hi - lo : 1.0;
        for (size_t i = 0; i < n; i++)
            g16[i] = (uint16_t)lrint(((double)d[i] - lo) / span * 65535.0);
    }
    const int64_t shape[2] = {img.height, img.width};
    if (o.raw && (o.raw_png ? vitc_image_save_png16(o.raw, g16, img.width, img.height)
                            : vitc_save_npy(o.raw, d, 2, shape)) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (o.out && vitc_image_save_png(o.out, cv.rgb, cv.w, cv.h) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (o.json) {
        fputs("{\"image\": ", stdout);
        cli_json_string(stdout, o.image);
        printf(", \"width\": %d, \"height\": %d, \"min\": ", img.width, img.height);
        cli_json_number(stdout, lo);
        fputs(", \"max\": ", stdout);
        cli_json_number(stdout, hi);
        fputs("}\n", stdout);
    }
    if (!o.quiet && (o.out || o.raw)) {
        fputs("vitc: wrote ", stderr);
        cli_put_escaped(stderr, o.out ? o.out : o.raw, SIZE_MAX);
        if (o.out)
            fprintf(stderr, " (%dx%d, depth %.4g..%.4g", cv.w, cv.h, (double)lo, (double)hi);
        if (o.out && o.raw) {
            fputs("; the raw depth in ", stderr);
            cli_put_escaped(stderr, o.raw, SIZE_MAX);
        }
        fputs(o.out ? ")\n" : "\n", stderr);
    }
    rc = CLI_OK;
done:
    canvas_free(&cv);
    free(g16);
    free(d);
    vitc_image_free(&img);
    vitc_depth_free(m);
    return rc;
}
