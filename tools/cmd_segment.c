/*
 * cmd_segment.c — `vitc segment`: Segment Anything's masks for points and
 * boxes on one image, or every object of it (--everything).
 *
 * The image is encoded once (vitc_sam_set_image) and each prompt runs the
 * decoder alone. Several --box give one prediction per box, each with all
 * the points, as segment-anything's batched predictor does. --everything
 * is SamAutomaticMaskGenerator without crops: a grid of single-point
 * prompts, each mask kept when its predicted IoU and its stability score
 * pass, then box NMS. Its candidates keep only their boxes and scores; the
 * masks that survive NMS are predicted again to be drawn, so memory does
 * not grow with the number of prompts.
 *
 * The picture is the image with each mask's pixels blended in a colour,
 * the points as dots (green foreground, red background) and the boxes as
 * rectangles.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* A prompt's at most (the library's limit, docs/segment.md). */
#define SEG_MAX_POINTS 1000
#define SEG_MAX_BOXES 256
/* Masks are float logits at the image's size, three per prompt: the
 * image is bounded so that they stay under a gigabyte. */
#define SEG_MAX_PIXELS (25 * 1000 * 1000)
/* Below this on a side there is nothing to point at. */
#define SEG_MIN_SIDE 8

static const char segment_usage[] =
    "usage: vitc segment --model DIR (--point X,Y[,L])... (--box X0,Y0,X1,Y1)...\n"
    "                    [--multimask] --out MASK.png [options] IMAGE\n"
    "       vitc segment --model DIR --everything --out MASKS.png [options] IMAGE\n"
    "\n"
    "Segment Anything on a PNG or JPEG image: the masks of the object a prompt\n"
    "points at, drawn over the image (each mask in its colour, points as dots,\n"
    "green foreground and red background, boxes as rectangles). Coordinates are\n"
    "the image's pixels, x right and y down. The image is encoded once; each\n"
    "--box is its own prediction (with all the points), one --box or none is\n"
    "one prediction. See docs/segment.md.\n"
    "\n"
    "options:\n"
    "  --model DIR        a transformers SamModel directory (config.json and\n"
    "                     model.safetensors)\n"
    "  --point X,Y[,L]    a point; L 1 foreground (default) or 0 background\n"
    "                     (repeat for more, up to 1000)\n"
    "  --box X0,Y0,X1,Y1  a box, corners inside the image, X0 < X1 and Y0 < Y1\n"
    "                     (repeat for one prediction per box, up to 256)\n"
    "  --multimask        the three multimask outputs of each prediction (default:\n"
    "                     the single mask)\n"
    "  --mask-input F     a previous prediction's low-resolution logits, float32\n"
    "                     .npy [256, 256] (the model's low-resolution size)\n"
    "  --everything       masks of everything: a grid of point prompts, filtered by\n"
    "                     predicted IoU and stability, then box NMS\n"
    "  --points-per-side N  the grid's side with --everything, 1..64 (default 16;\n"
    "                     segment-anything's is 32, four times the work)\n"
    "  --pred-iou-thresh T  keep masks whose predicted IoU is above T (default 0.88)\n"
    "  --stability-thresh T keep masks whose stability score is at least T\n"
    "                     (default 0.95; offset 1.0 around the 0 threshold)\n"
    "  --nms-thresh T     box IoU above which the lower-scored mask goes (default 0.7)\n"
    "  --out FILE         the PNG to write (the image's size)\n"
    "  --raw FILE         also the masks' logits at the image's size, float32 .npy\n"
    "                     [masks, H, W] (> 0: in the mask)\n"
    "  --json             print {\"image\": PATH, \"iou\": [...]} on one line; with\n"
    "                     --everything {\"image\": PATH, \"masks\": [{\"bbox\": [x, y,\n"
    "                     w, h], \"area\": A, \"predicted_iou\": P, \"stability_score\":\n"
    "                     S, \"point_coords\": [x, y]}, ...]}\n"
    "  --precision P      the image encoder's weight GEMMs: fp32 (default), bf16 or\n"
    "                     int8 (docs/segment.md, \"Precision\")\n"
    "  --alpha A          mask opacity, 0..1 (default 0.5)\n"
    "  --threads N        threads, 1..256 (default: all CPUs available)\n"
    "  --quiet            no line on stderr naming what was written\n"
    "  -h, --help         this help\n"
    "\n"
    "Exit status: 0 ok, 1 when the image, a prompt or the model could not be\n"
    "used, 2 for a usage error. Nothing is written on an error.\n";

typedef struct seg_opts {
    const char *model, *out, *raw, *mask_input, *image, *precision;
    int multimask, everything, json, quiet, threads, pps;
    float alpha;
    double iou_thr, stab_thr, nms_thr;
    float *points; /* [n_points, 2] */
    int *labels;   /* [n_points] */
    int n_points;
    float *boxes; /* [n_boxes, 4] */
    int n_boxes;
} seg_opts;

/* "a,b[,c...]": exactly n (or n_alt) finite numbers. */
static int parse_numbers(const char *s, double *v, int n, int n_alt) {
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    int k = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (k == (n > n_alt ? n : n_alt) || cli_parse_double(t, -1e9, 1e9, &v[k]) != 0)
            return -1;
        k++;
    }
    /* strtok_r skips empty fields: "1,,2" must not pass as "1,2" */
    int commas = 0;
    for (const char *c = s; *c; c++) commas += *c == ',';
    return (k == n || k == n_alt) && commas == k - 1 ? k : -1;
}

/* --point and --box may repeat: taken out of argv before the common parser
 * (which keeps one value per option) sees the rest. */
static int take_prompts(int argc, char **argv, seg_opts *o, int *n_rest, char **rest) {
    int n = 0;
    o->points = malloc((size_t)argc * 2 * sizeof(float));
    o->labels = malloc((size_t)argc * sizeof(int));
    o->boxes = malloc((size_t)argc * 4 * sizeof(float));
    if (!o->points || !o->labels || !o->boxes)
        return cli_error("out of memory");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        int is_point = 0, is_box = 0;
        if (i > 0 && !strcmp(a, "--")) {
            while (i < argc) rest[n++] = argv[i++];
            break;
        }
        if (i > 0 && (!strcmp(a, "--point") || !strncmp(a, "--point=", 8)))
            is_point = 1;
        else if (i > 0 && (!strcmp(a, "--box") || !strncmp(a, "--box=", 6)))
            is_box = 1;
        if (!is_point && !is_box) {
            rest[n++] = argv[i];
            continue;
        }
        const char *name = is_point ? "--point" : "--box";
        if (strchr(a, '='))
            val = strchr(a, '=') + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return cli_usage_error("segment", "%s needs a value", name);
        double v[4];
        if (is_point) {
            int k = parse_numbers(val, v, 2, 3);
            if (k < 0)
                return cli_usage_error("segment", "--point '%s': give X,Y or X,Y,L (numbers)",
                                       val);
            if (k == 3 && v[2] != 0 && v[2] != 1)
                return cli_usage_error("segment",
                                       "--point '%s': label %g; use 1 (foreground) or 0 "
                                       "(background)",
                                       val, v[2]);
            if (o->n_points == SEG_MAX_POINTS)
                return cli_usage_error("segment", "more than %d --point; give at most %d",
                                       SEG_MAX_POINTS, SEG_MAX_POINTS);
            o->points[2 * o->n_points] = (float)v[0];
            o->points[2 * o->n_points + 1] = (float)v[1];
            o->labels[o->n_points++] = k == 3 ? (int)v[2] : 1;
        } else {
            if (parse_numbers(val, v, 4, 4) < 0)
                return cli_usage_error("segment", "--box '%s': give X0,Y0,X1,Y1 (numbers)", val);
            if (o->n_boxes == SEG_MAX_BOXES)
                return cli_usage_error("segment", "more than %d --box; give at most %d",
                                       SEG_MAX_BOXES, SEG_MAX_BOXES);
            for (int c = 0; c < 4; c++) o->boxes[4 * o->n_boxes + c] = (float)v[c];
            o->n_boxes++;
        }
    }
    *n_rest = n;
    return 0;
}

static int seg_parse(int argc, char **argv, seg_opts *o) {
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    int n_rest = 0, n_pos = 0, rc;
    if (!rest || !pos) {
        free(rest), free(pos);
        return cli_error("out of memory");
    }
    if ((rc = take_prompts(argc, argv, o, &n_rest, rest)) != 0)
        goto done;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--out", NULL, CLI_STRING, &o->out, 0, 0, NULL},
        {"--raw", NULL, CLI_STRING, &o->raw, 0, 0, NULL},
        {"--mask-input", NULL, CLI_STRING, &o->mask_input, 0, 0, NULL},
        {"--multimask", NULL, CLI_FLAG, &o->multimask, 0, 0, NULL},
        {"--everything", NULL, CLI_FLAG, &o->everything, 0, 0, NULL},
        {"--points-per-side", NULL, CLI_INT, &o->pps, 1, 64, NULL},
        {"--pred-iou-thresh", NULL, CLI_DOUBLE, &o->iou_thr, -1e9, 1e9, NULL},
        {"--stability-thresh", NULL, CLI_DOUBLE, &o->stab_thr, 0, 1, NULL},
        {"--nms-thresh", NULL, CLI_DOUBLE, &o->nms_thr, 0, 1, NULL},
        {"--json", NULL, CLI_FLAG, &o->json, 0, 0, NULL},
        {"--precision", NULL, CLI_STRING, &o->precision, 0, 0, NULL},
        {"--alpha", NULL, CLI_FLOAT, &o->alpha, 0, 1, NULL},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--quiet", "-q", CLI_FLAG, &o->quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 1, "image"};
    rc = cli_parse_command("segment", &spec, n_rest, rest, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(segment_usage, stdout);
        rc = -1;
        goto done;
    }
    if (rc != 0)
        goto done;
    o->image = n_pos ? pos[0] : NULL;
    static const char *const png[] = {".png"}, *const npy[] = {".npy"};
    if (!o->model)
        rc = cli_usage_error("segment", "--model is required");
    else if (!o->out)
        rc = cli_usage_error("segment", "--out is required");
    else if (!o->image)
        rc = cli_usage_error("segment", "no image given");
    else if (cli_out_format("segment", "--out", o->out, "PNG", png, 1) < 0 ||
             (o->raw && cli_out_format("segment", "--raw", o->raw, "float32 .npy", npy, 1) < 0))
        rc = CLI_USAGE;
    else if (o->everything && (o->n_points || o->n_boxes || o->mask_input || o->multimask ||
                               o->raw))
        rc = cli_usage_error("segment", "--everything makes its own prompts: it takes no "
                                        "--point, --box, --mask-input, --multimask or --raw");
    else if (!o->everything && !o->n_points && !o->n_boxes && !o->mask_input)
        rc = cli_usage_error("segment", "no prompt: give --point X,Y, --box X0,Y0,X1,Y1 or "
                                        "--everything");
    else if (o->precision && vitc_precision_parse(o->precision) < 0)
        rc = cli_usage_error("segment", "--precision must be fp32, bf16 or int8, not \"%s\"",
                             o->precision);
done:
    free(rest);
    free(pos);
    return rc;
}

/* ------------------------------------------------------------------ */
/* --mask-input: a float32 .npy of the low-resolution size              */
/* ------------------------------------------------------------------ */

/* path's [lh, lw] (or [1, lh, lw]) little-endian float32 C-order array. */
static int read_mask_npy(const char *path, int lh, int lw, float *out) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return cli_error("--mask-input %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cli_error("--mask-input %s: not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return cli_error("--mask-input %s: %s", path, strerror(errno));
    }
    unsigned char pre[10];
    char hdr[4096];
    int rc = CLI_OK;
    size_t hl = 0;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) || pre[6] != 1 ||
        (hl = (size_t)pre[8] | (size_t)pre[9] << 8) >= sizeof hdr || fread(hdr, 1, hl, f) != hl) {
        rc = cli_error("--mask-input %s: not a .npy file (version 1.0)", path);
        goto done;
    }
    hdr[hl] = '\0';
    if (!strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False")) {
        rc = cli_error("--mask-input %s: not a C-order float32 array; save it with "
                       "np.save(path, a.astype(np.float32))", path);
        goto done;
    }
    const char *sh = strstr(hdr, "'shape': (");
    long d[3];
    int nd = 0;
    for (const char *c = sh ? sh + 10 : NULL; c && *c && *c != ')' && nd < 3;) {
        char *e;
        errno = 0;
        d[nd] = strtol(c, &e, 10);
        if (e == c || errno)
            break;
        nd++;
        c = e;
        while (*c == ',' || *c == ' ') c++;
    }
    int ok = (nd == 2 && d[0] == lh && d[1] == lw) ||
             (nd == 3 && d[0] == 1 && d[1] == lh && d[2] == lw);
    if (!ok) {
        rc = cli_error("--mask-input %s: expected a float32 array [%d, %d] (a previous "
                       "prediction's low-resolution logits), got shape (%.60s",
                       path, lh, lw, sh ? sh + 10 : "?)");
        goto done;
    }
    size_t n = (size_t)lh * lw;
    if (fread(out, sizeof(float), n, f) != n || fgetc(f) != EOF) {
        rc = cli_error("--mask-input %s: the data is not %zu floats", path, n);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i])) {
            rc = cli_error("--mask-input %s: value %zu is not finite", path, i);
            goto done;
        }
done:
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The picture                                                        */
/* ------------------------------------------------------------------ */

/* Distinct colours: hues a golden-ratio step apart, full saturation. */
static void mask_colour(int i, uint8_t rgb[3]) {
    static const uint8_t first[4][3] = {{30, 144, 255}, {255, 160, 0}, {200, 0, 200},
                                        {0, 200, 200}};
    if (i < 4) {
        memcpy(rgb, first[i], 3);
        return;
    }
    double h = fmod(0.13 + i * 0.618033988749895, 1.0) * 6.0, f = h - floor(h);
    double v[6][3] = {{1, f, 0}, {1 - f, 1, 0}, {0, 1, f}, {0, 1 - f, 1}, {f, 0, 1}, {1, 0, 1 - f}};
    for (int c = 0; c < 3; c++) rgb[c] = (uint8_t)lrint(40 + 215 * v[(int)h % 6][c]);
}

static void blend_mask(uint8_t *pic, const float *logits, const uint8_t *bits, size_t n,
                       const uint8_t rgb[3], float alpha) {
    for (size_t i = 0; i < n; i++)
        if (logits ? logits[i] > 0.0f : bits[i])
            for (int c = 0; c < 3; c++)
                pic[3 * i + c] = (uint8_t)lrintf((1.0f - alpha) * pic[3 * i + c] + alpha * rgb[c]);
}

static void fill_rect(uint8_t *pic, int W, int H, int x0, int y0, int x1, int y1,
                      const uint8_t rgb[3]) {
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > W) x1 = W;
    if (y1 > H) y1 = H;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) memcpy(pic + 3 * ((size_t)y * W + x), rgb, 3);
}

static void draw_box(uint8_t *pic, int W, int H, const float *b, int t) {
    static const uint8_t col[3] = {255, 255, 0}, edge[3] = {0, 0, 0};
    int x0 = (int)lrintf(b[0]), y0 = (int)lrintf(b[1]), x1 = (int)lrintf(b[2]),
        y1 = (int)lrintf(b[3]);
    /* a dark line under a bright one: visible on any image */
    for (int pass = 0; pass < 2; pass++) {
        int e = pass ? 0 : 1;
        const uint8_t *c = pass ? col : edge;
        fill_rect(pic, W, H, x0 - t - e, y0 - t - e, x1 + t + e, y0 + e, c);
        fill_rect(pic, W, H, x0 - t - e, y1 - e, x1 + t + e, y1 + t + e, c);
        fill_rect(pic, W, H, x0 - t - e, y0 - t - e, x0 + e, y1 + t + e, c);
        fill_rect(pic, W, H, x1 - e, y0 - t - e, x1 + t + e, y1 + t + e, c);
    }
}

static void draw_dot(uint8_t *pic, int W, int H, float px, float py, int r, int fg) {
    static const uint8_t green[3] = {0, 200, 0}, red[3] = {230, 0, 0}, white[3] = {255, 255, 255};
    int cx = (int)floorf(px), cy = (int)floorf(py), R = r + (r > 3 ? 2 : 1);
    for (int y = cy - R; y <= cy + R; y++)
        for (int x = cx - R; x <= cx + R; x++) {
            if (x < 0 || y < 0 || x >= W || y >= H)
                continue;
            int d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
            if (d2 <= R * R)
                memcpy(pic + 3 * ((size_t)y * W + x), d2 <= r * r ? (fg ? green : red) : white,
                       3);
        }
}

/* ------------------------------------------------------------------ */
/* --everything                                                       */
/* ------------------------------------------------------------------ */

typedef struct seg_cand {
    int point, mask;   /* grid point, which of its three masks */
    float iou, stab;
    int box[4];        /* x0, y0, x1, y1 inclusive (batched_mask_to_box) */
    int64_t area;
} seg_cand;

static int cand_cmp(const void *a, const void *b) {
    const seg_cand *x = a, *y = b;
    if (x->iou != y->iou)
        return x->iou > y->iou ? -1 : 1;
    return (x->point * 4 + x->mask) - (y->point * 4 + y->mask);
}

/* torchvision's box_iou (areas without the +1). */
static double box_iou(const int *a, const int *b) {
    double ix = fmin(a[2], b[2]) - fmax(a[0], b[0]), iy = fmin(a[3], b[3]) - fmax(a[1], b[1]);
    double inter = (ix > 0 ? ix : 0) * (iy > 0 ? iy : 0);
    double ua = (double)(a[2] - a[0]) * (a[3] - a[1]) + (double)(b[2] - b[0]) * (b[3] - b[1]);
    return inter / (ua - inter);
}

/* The grid of segment-anything's build_point_grid, in the image's pixels. */
static void grid_point(int n, int i, int W, int H, float *xy) {
    double off = 1.0 / (2 * n), step = n > 1 ? (1.0 - 2 * off) / (n - 1) : 0.0;
    xy[0] = (float)((off + step * (i % n)) * W);
    xy[1] = (float)((off + step * (i / n)) * H);
}

static int everything(const seg_opts *o, const vitc_sam *m, const vitc_sam_image *e,
                      const vitc_image *img, uint8_t *pic) {
    const int W = img->width, H = img->height, n_pts = o->pps * o->pps;
    const size_t plane = (size_t)W * H;
    seg_cand *cand = NULL;
    int n_cand = 0, cap = 0, rc = CLI_OK;
    for (int i = 0; i < n_pts && rc == CLI_OK; i++) {
        float xy[2];
        int label = 1;
        grid_point(o->pps, i, W, H, xy);
        vitc_sam_prompt p = {.n_points = 1, .points = xy, .labels = &label, .multimask = 1};
        vitc_sam_result r;
        if (vitc_sam_predict(m, e, &p, &r) != VITC_OK) {
            rc = cli_error("%s", vitc_last_error());
            break;
        }
        for (int k = 0; k < r.n_masks; k++) {
            if (!(r.iou[k] > o->iou_thr))
                continue;
            const float *lg = r.masks + (size_t)k * plane;
            int64_t inter = 0, uni = 0, area = 0;
            int bx[4] = {W, H, -1, -1};
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    float v = lg[(size_t)y * W + x];
                    inter += v > 1.0f;
                    uni += v > -1.0f;
                    if (v > 0.0f) {
                        area++;
                        if (x < bx[0]) bx[0] = x;
                        if (x > bx[2]) bx[2] = x;
                        if (y < bx[1]) bx[1] = y;
                        if (y > bx[3]) bx[3] = y;
                    }
                }
            float stab = uni ? (float)inter / (float)uni : NAN;
            if (!(stab >= o->stab_thr))
                continue;
            if (!area)
                bx[0] = bx[1] = bx[2] = bx[3] = 0;
            if (n_cand == cap) {
                cap = cap ? 2 * cap : 64;
                void *a = realloc(cand, (size_t)cap * sizeof *cand);
                if (!a) {
                    rc = cli_error("out of memory");
                    break;
                }
                cand = a;
            }
            seg_cand c = {i, k, r.iou[k], stab, {bx[0], bx[1], bx[2], bx[3]}, area};
            cand[n_cand++] = c;
        }
        vitc_sam_result_free(&r);
    }
    /* batched_nms with one category: by score, IoU above the threshold
     * suppressed. */
    int n_keep = 0;
    if (rc == CLI_OK && n_cand) {
        qsort(cand, (size_t)n_cand, sizeof *cand, cand_cmp);
        for (int i = 0; i < n_cand; i++) {
            int keep = 1;
            for (int j = 0; j < n_keep && keep; j++)
                keep = !(box_iou(cand[i].box, cand[j].box) > o->nms_thr);
            if (keep)
                cand[n_keep++] = cand[i];
        }
    }
    /* Drawn lowest score first, so the best masks lie on top. */
    for (int i = n_keep - 1; i >= 0 && rc == CLI_OK; i--) {
        float xy[2];
        int label = 1;
        grid_point(o->pps, cand[i].point, W, H, xy);
        vitc_sam_prompt p = {.n_points = 1, .points = xy, .labels = &label, .multimask = 1};
        vitc_sam_result r;
        if (vitc_sam_predict(m, e, &p, &r) != VITC_OK) {
            rc = cli_error("%s", vitc_last_error());
            break;
        }
        uint8_t col[3];
        mask_colour(i, col);
        blend_mask(pic, r.masks + (size_t)cand[i].mask * plane, NULL, plane, col, o->alpha);
        vitc_sam_result_free(&r);
    }
    if (rc == CLI_OK && o->json) {
        fputs("{\"image\": ", stdout);
        cli_json_string(stdout, o->image);
        fputs(", \"masks\": [", stdout);
        for (int i = 0; i < n_keep; i++) {
            const seg_cand *c = &cand[i];
            float xy[2];
            grid_point(o->pps, c->point, W, H, xy);
            printf("%s{\"bbox\": [%d, %d, %d, %d], \"area\": %lld, \"predicted_iou\": ",
                   i ? ", " : "", c->box[0], c->box[1], c->box[2] - c->box[0],
                   c->box[3] - c->box[1], (long long)c->area);
            cli_json_number(stdout, c->iou);
            fputs(", \"stability_score\": ", stdout);
            cli_json_number(stdout, c->stab);
            fputs(", \"point_coords\": [", stdout);
            cli_json_number(stdout, xy[0]);
            fputs(", ", stdout);
            cli_json_number(stdout, xy[1]);
            fputs("]}", stdout);
        }
        fputs("]}\n", stdout);
    }
    if (rc == CLI_OK && !o->quiet)
        fprintf(stderr, "vitc: %d mask%s of %d candidates from %d points\n", n_keep,
                n_keep == 1 ? "" : "s", n_cand, n_pts);
    free(cand);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The command                                                        */
/* ------------------------------------------------------------------ */

/* An output path the writer will refuse (a directory, FIFO or device
 * there, no such directory) is reported before any work, so that one
 * output is never written while the other cannot be. *existed: a regular
 * file is there now. */
static int check_target(const char *opt, const char *path, int *existed) {
    struct stat sb;
    *existed = 0;
    if (lstat(path, &sb) == 0) {
        if (!S_ISREG(sb.st_mode))
            return cli_error("%s %s: a folder, FIFO or device is there; name a file", opt,
                             path);
        *existed = 1;
        return CLI_OK;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir)
        return cli_error("%s %s: path too long", opt, path);
    memcpy(dir, path, n);
    strcpy(dir + n, n ? "" : ".");
    if (slash && n == 0)
        strcpy(dir, "/");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cli_error("%s %s: the folder %s does not exist", opt, path, dir);
    return CLI_OK;
}

int cmd_segment(int argc, char **argv) {
    seg_opts o;
    memset(&o, 0, sizeof o);
    o.alpha = 0.5f, o.pps = 16, o.iou_thr = 0.88, o.stab_thr = 0.95, o.nms_thr = 0.7;
    vitc_sam *m = NULL;
    vitc_sam_image *e = NULL;
    vitc_image img = {0, 0, NULL};
    float *mask_in = NULL, *all = NULL; /* [lh, lw], [n_pred * n_masks, H, W] */
    uint8_t *pic = NULL;
    float *ious = NULL;
    int rc = seg_parse(argc, argv, &o);
    if (rc != 0) {
        rc = rc < 0 ? CLI_OK : rc;
        goto done;
    }
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    int out_existed, raw_existed = 1;
    if ((rc = check_target("--out", o.out, &out_existed)) != CLI_OK ||
        (o.raw && (rc = check_target("--raw", o.raw, &raw_existed)) != CLI_OK))
        goto done;
    if (vitc_image_load(o.image, SEG_MAX_PIXELS, &img) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    const int W = img.width, H = img.height;
    if (W < SEG_MIN_SIDE || H < SEG_MIN_SIDE) {
        rc = cli_error("%s: a %dx%d image; segment takes images of at least %dx%d pixels",
                       o.image, W, H, SEG_MIN_SIDE, SEG_MIN_SIDE);
        goto done;
    }
    /* The prompts against the image before the model is read: a wrong
     * coordinate costs nothing. */
    for (int i = 0; i < o.n_points; i++) {
        const float *q = o.points + 2 * i;
        if (q[0] < 0 || q[1] < 0 || q[0] > W || q[1] > H) {
            rc = cli_error("--point %g,%g is outside the %dx%d image (x in [0, %d], y in [0, "
                           "%d])",
                           (double)q[0], (double)q[1], W, H, W, H);
            goto done;
        }
    }
    for (int i = 0; i < o.n_boxes; i++) {
        const float *b = o.boxes + 4 * i;
        if (b[0] < 0 || b[1] < 0 || b[2] > W || b[3] > H) {
            rc = cli_error("--box %g,%g,%g,%g is outside the %dx%d image", (double)b[0],
                           (double)b[1], (double)b[2], (double)b[3], W, H);
            goto done;
        }
        if (!(b[2] > b[0]) || !(b[3] > b[1])) {
            rc = cli_error("--box %g,%g,%g,%g has no area: give X0 < X1 and Y0 < Y1",
                           (double)b[0], (double)b[1], (double)b[2], (double)b[3]);
            goto done;
        }
    }
    if (vitc_sam_load_precision(o.model, o.precision, &m) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    int64_t es[3];
    vitc_sam_embedding_shape(m, es);
    const int lh = (int)(4 * es[1]), lw = (int)(4 * es[2]);
    if (o.mask_input) {
        if (!(mask_in = malloc((size_t)lh * lw * sizeof(float)))) {
            rc = cli_error("out of memory");
            goto done;
        }
        if ((rc = read_mask_npy(o.mask_input, lh, lw, mask_in)) != CLI_OK)
            goto done;
    }
    if (vitc_sam_set_image(m, &img, &e) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    const size_t plane = (size_t)W * H;
    if (!(pic = malloc(3 * plane))) {
        rc = cli_error("out of memory for a %dx%d picture", W, H);
        goto done;
    }
    memcpy(pic, img.rgb, 3 * plane);
    int n_total = 0;
    if (o.everything) {
        if ((rc = everything(&o, m, e, &img, pic)) != CLI_OK)
            goto done;
    } else {
        const int n_pred = o.n_boxes ? o.n_boxes : 1, per = o.multimask ? 3 : 1;
        all = malloc((size_t)n_pred * per * plane * sizeof(float));
        ious = malloc((size_t)n_pred * per * sizeof(float));
        if (!all || !ious) {
            rc = cli_error("out of memory for %d masks of %dx%d", n_pred * per, W, H);
            goto done;
        }
        for (int b = 0; b < n_pred; b++) {
            vitc_sam_prompt p = {.n_points = o.n_points,
                                 .points = o.n_points ? o.points : NULL,
                                 .labels = o.n_points ? o.labels : NULL,
                                 .box = o.n_boxes ? o.boxes + 4 * b : NULL,
                                 .mask = mask_in,
                                 .multimask = o.multimask};
            vitc_sam_result r;
            if (vitc_sam_predict(m, e, &p, &r) != VITC_OK) {
                rc = cli_error("%s", vitc_last_error());
                goto done;
            }
            memcpy(all + (size_t)n_total * plane, r.masks,
                   (size_t)r.n_masks * plane * sizeof(float));
            for (int k = 0; k < r.n_masks; k++) ious[n_total + k] = r.iou[k];
            n_total += r.n_masks;
            vitc_sam_result_free(&r);
        }
        for (int k = 0; k < n_total; k++) {
            uint8_t col[3];
            mask_colour(k, col);
            blend_mask(pic, all + (size_t)k * plane, NULL, plane, col, o.alpha);
        }
        const int t = (W > H ? W : H) / 300 + 1;
        for (int b = 0; b < o.n_boxes; b++) draw_box(pic, W, H, o.boxes + 4 * b, t);
        for (int i = 0; i < o.n_points; i++)
            draw_dot(pic, W, H, o.points[2 * i], o.points[2 * i + 1], 2 * t + 2, o.labels[i]);
    }
    if (o.raw &&
        vitc_save_npy(o.raw, all, 3, (const int64_t[3]){n_total, H, W}) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (vitc_image_save_png(o.out, pic, W, H) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        if (o.raw && !raw_existed)
            remove(o.raw); /* nothing new left behind on an error */
        goto done;
    }
    if (o.json && !o.everything) {
        fputs("{\"image\": ", stdout);
        cli_json_string(stdout, o.image);
        fputs(", \"iou\": [", stdout);
        for (int k = 0; k < n_total; k++) {
            fputs(k ? ", " : "", stdout);
            cli_json_number(stdout, ious[k]);
        }
        fputs("]}\n", stdout);
    }
    if (!o.quiet) {
        fputs("vitc: wrote ", stderr);
        cli_put_escaped(stderr, o.out, SIZE_MAX);
        fprintf(stderr, " (%dx%d", W, H);
        if (!o.everything)
            fprintf(stderr, ", %d mask%s", n_total, n_total == 1 ? "" : "s");
        if (o.raw) {
            fputs("; the logits in ", stderr);
            cli_put_escaped(stderr, o.raw, SIZE_MAX);
        }
        fputs(")\n", stderr);
    }
    rc = CLI_OK;
done:
    free(o.points);
    free(o.labels);
    free(o.boxes);
    free(mask_in);
    free(all);
    free(ious);
    free(pic);
    vitc_sam_image_free(e);
    vitc_sam_free(m);
    vitc_image_free(&img);
    return rc;
}
