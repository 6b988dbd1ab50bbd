/*
 * cmd_demo_fashion.c — `vitc demo-fashion`: the shipped Fashion-MNIST model
 * at work. It classifies the first test images and draws them as a grid
 * with their true and predicted labels, prints the accuracy over the whole
 * test set, and writes attention maps (through `vitc attention-map`) of a
 * few test images. `make demo` runs it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train.h"

static const char demo_usage[] =
    "usage: vitc demo-fashion [--model M] [--data fashion-mnist] [--out-dir DIR]\n"
    "\n"
    "Classify Fashion-MNIST test images with a model trained by `vitc train`\n"
    "(default models/fashion-vit.safetensors): DIR/grid.png shows the first\n"
    "--count test images with their true and predicted labels (green: right,\n"
    "red: wrong); the whole test set's accuracy goes to stdout; DIR/attention-K.png\n"
    "are attention maps (rollout) of --maps test images.\n"
    "\n"
    "options:\n"
    "  --model FILE     the model (default models/fashion-vit.safetensors)\n"
    "  --data D         fashion-mnist (default) or a folder of IDX files\n"
    "  --out-dir DIR    where the pictures go (default demo-out)\n"
    "  --count N        images in the grid (default 24)\n"
    "  --maps N         attention maps (default 4)\n"
    "  --threads N      threads (default: all CPUs available)\n"
    "  -h, --help       this help\n";

#define CELL_IMG 4 /* pixels per image pixel in the grid */

int cmd_demo_fashion(int argc, char **argv) {
    const char *model = "models/fashion-vit.safetensors", *data = "fashion-mnist",
               *dir = "demo-out";
    int count = 24, maps = 4, threads = 0;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &model, 0, 0, NULL},
        {"--data", NULL, CLI_STRING, &data, 0, 0, NULL},
        {"--out-dir", NULL, CLI_STRING, &dir, 0, 0, NULL},
        {"--count", NULL, CLI_INT, &count, 1, 200, NULL},
        {"--maps", NULL, CLI_INT, &maps, 0, 50, NULL},
        {"--threads", NULL, CLI_INT, &threads, 1, 256, NULL},
    };
    int r = topt_parse("demo-fashion", demo_usage, opts, (int)(sizeof opts / sizeof opts[0]),
                       argc, argv, NULL, NULL);
    if (r)
        return r < 0 ? CLI_OK : r;
    if (threads)
        vitc_set_num_threads(threads);
    if (strlen(dir) > 3000)
        return cli_error("--out-dir: path too long");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return cli_error("--out-dir %s: %s", dir, strerror(errno));
    vitc_vit *m;
    if (vitc_vit_load(model, NULL, &m) != VITC_OK)
        return cli_lib_error("--model");
    train_data d;
    int rc = train_data_open(data, 0, 0, NULL, &d);
    if (rc != CLI_OK) {
        vitc_vit_free(m);
        return rc;
    }
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int S = c->image_size, side = vitc_dataset_image_side(d.eval), C = c->num_classes;
    int64_t n = vitc_dataset_size(d.eval);
    if (count > n)
        count = (int)n;
    if (maps > n)
        maps = (int)n;
    float *x = malloc((size_t)count * c->in_channels * S * S * sizeof *x);
    float *raw = malloc((size_t)count * side * side * sizeof *raw);
    float *logits = malloc((size_t)count * C * sizeof *logits);
    int64_t *idx = malloc((size_t)count * sizeof *idx), *lab = malloc((size_t)count * sizeof *lab);
    canvas cv = {0, 0, NULL};
    int nv, cols = count < 8 ? count : 8, rows = (count + cols - 1) / cols;
    int cw = side * CELL_IMG + 12, ch = side * CELL_IMG + 34;
    if (!x || !raw || !logits || !idx || !lab || side < 1 ||
        canvas_init(&cv, cols * cw + 12, rows * ch + 44) != 0) {
        rc = side < 1 ? cli_error("demo-fashion wants an IDX data set (Fashion-MNIST)")
                      : cli_error("out of memory");
        goto done;
    }
    for (int k = 0; k < count; k++) idx[k] = k;
    vitc_batch_opts o = train_batch_opts(c);
    vitc_batch_opts ro = vitc_batch_default_opts(side, 1); /* the pixels, for drawing */
    if (vitc_dataset_load_batch(d.eval, idx, count, &o, x, lab, &nv) != VITC_OK ||
        vitc_dataset_load_batch(d.eval, idx, count, &ro, raw, lab, &nv) != VITC_OK) {
        rc = cli_lib_error("test images");
        goto done;
    }
    if (vitc_vit_forward(m, x, count, S, S, logits) != VITC_OK) {
        rc = cli_lib_error("forward");
        goto done;
    }
    eval_result er;
    if ((rc = train_evaluate(m, d.eval, 256, &er, NULL, 0, "test set")) != CLI_OK)
        goto done;
    double acc = er.n ? (double)er.correct / er.n : 0;
    printf("%s: test accuracy %.2f%% (%lld of %lld Fashion-MNIST test images)\n", model,
           100 * acc, (long long)er.correct, (long long)er.n);
    const uint8_t black[3] = {0, 0, 0}, green[3] = {0, 130, 50}, red[3] = {200, 30, 30};
    int right = 0;
    for (int k = 0; k < count; k++) {
        int best = train_argmax(logits + (size_t)k * C, C);
        right += best == lab[k];
        int x0 = 6 + (k % cols) * cw, y0 = 36 + (k / cols) * ch;
        for (int y = 0; y < side; y++)
            for (int xx = 0; xx < side; xx++) {
                float v = raw[(size_t)k * side * side + y * side + xx];
                uint8_t g = (uint8_t)(255 - (v < 0 ? 0 : v > 1 ? 255 : v * 255 + 0.5f));
                uint8_t px[3] = {g, g, g};
                canvas_rect(&cv, x0 + xx * CELL_IMG, y0 + y * CELL_IMG, CELL_IMG, CELL_IMG, px);
            }
        const char *tl = vitc_vit_label(m, (int)lab[k]), *pl = vitc_vit_label(m, best);
        char tb[16], pb[16];
        if (!tl)
            snprintf(tb, sizeof tb, "%lld", (long long)lab[k]), tl = tb;
        if (!pl)
            snprintf(pb, sizeof pb, "%d", best), pl = pb;
        canvas_text(&cv, x0, y0 + side * CELL_IMG + 4, tl, 1, black);
        canvas_text(&cv, x0, y0 + side * CELL_IMG + 15, pl, 1, best == lab[k] ? green : red);
    }
    char title[160];
    snprintf(title, sizeof title,
             "first %d test images: %d right  |  whole test set: %.2f%%  (black: true, "
             "green/red: predicted)", count, right, 100 * acc);
    canvas_text(&cv, 6, 12, title, 1, black);
    char path[4096];
    snprintf(path, sizeof path, "%s/grid.png", dir);
    if (vitc_image_save_png(path, cv.rgb, cv.w, cv.h) != VITC_OK) {
        rc = cli_lib_error("grid");
        goto done;
    }
    printf("%s: %d of the first %d test images right\n", path, right, count);
    /* Attention maps: each test image as a PNG, through `vitc attention-map`
     * (its preprocessing with --resize 0 is the identity on 28x28). */
    for (int k = 0; k < maps && rc == CLI_OK; k++) {
        char img[4096], out[4096];
        uint8_t *rgb = malloc((size_t)side * side * 3);
        if (!rgb) {
            rc = cli_error("out of memory");
            break;
        }
        for (int i = 0; i < side * side; i++) {
            float v = raw[(size_t)k * side * side + i];
            rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] =
                (uint8_t)(v < 0 ? 0 : v > 1 ? 255 : v * 255 + 0.5f);
        }
        snprintf(img, sizeof img, "%s/test-%d.png", dir, k);
        snprintf(out, sizeof out, "%s/attention-%d.png", dir, k);
        vitc_status s = vitc_image_save_png(img, rgb, side, side);
        free(rgb);
        if (s != VITC_OK) {
            rc = cli_lib_error("test image");
            break;
        }
        char *av[] = {"attention-map", "--model", (char *)model, "--resize", "0", "--out", out,
                      img, NULL};
        if ((rc = cmd_attention_map(8, av)) == CLI_OK)
            printf("%s: attention rollout of test image %d (%s)\n", out, k,
                   vitc_vit_label(m, (int)lab[k]) ? vitc_vit_label(m, (int)lab[k]) : "?");
    }
done:
    canvas_free(&cv);
    free(x), free(raw), free(logits), free(idx), free(lab);
    train_data_close(&d);
    vitc_vit_free(m);
    return rc;
}
