/*
 * cmd_eval.c — `vitc eval`: a model's accuracy on a test set, per class,
 * with the confusion matrix (as text, JSON, or a PNG).
 *
 * The counts are kept sparse (per-class totals and hits, and the nonzero
 * cells), never as a dense C x C matrix: a model of 100,000 classes would
 * need 80 GB for it. A dense matrix is made only to show it, up to
 * EVAL_DENSE_MAX classes.
 *
 * Labels come from the model file and paths from the data folder: both are
 * untrusted text, escaped (cli_escape) wherever they reach the terminal.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static const char eval_usage[] =
    "usage: vitc eval --model M.safetensors --data DIR|fashion-mnist [options]\n"
    "\n"
    "Accuracy, per-class accuracy and the confusion matrix of a classifier on\n"
    "Fashion-MNIST's test set, an IDX folder's t10k files, or an ImageFolder\n"
    "(DIR/val/<class>/... when DIR has val/, else DIR/<class>/...).\n"
    "Images get the model's eval transform (resize, center crop, normalize).\n"
    "\n"
    "options:\n"
    "  --model FILE     the model (a `vitc train` checkpoint or any ViT file)\n"
    "  --data D         fashion-mnist, an IDX folder or an ImageFolder\n"
    "  --subset N       the first N images only\n"
    "  --batch B        images per forward pass (default 256)\n"
    CLI_PRECISION_HELP
    "  --json           one JSON object: precision, attention_precision, accuracy,\n"
    "                   loss, per_class, confusion\n"
    "  --plot FILE      the confusion matrix as a PNG\n"
    "  --threads N      threads (default: all CPUs available)\n"
    "  --quiet          no progress on stderr\n"
    "  -h, --help       this help\n"
    "\n"
    "Rows of the confusion matrix are the true classes, columns the predicted.\n"
    "Unreadable images are skipped with a warning and counted.\n";

static const char *label_of(vitc_vit *m, vitc_dataset *ds, int i, char *buf, size_t cap) {
    const char *l = vitc_vit_label(m, i);
    if (!l)
        l = vitc_dataset_class_name(ds, i);
    if (!l) {
        snprintf(buf, cap, "%d", i);
        l = buf;
    }
    return l;
}

/* Axis names longer than this many characters end in "..." so that one long
 * class name cannot push the matrix off the picture. */
#define NAME_MAX_CHARS 16

static void short_label(vitc_vit *m, vitc_dataset *ds, int i, char *out, size_t cap) {
    char nb[16];
    const char *l = label_of(m, ds, i, nb, sizeof nb);
    size_t n = strlen(l);
    if (n <= NAME_MAX_CHARS || cap < NAME_MAX_CHARS + 1) {
        snprintf(out, cap, "%s", l);
        return;
    }
    memcpy(out, l, NAME_MAX_CHARS - 3);
    memcpy(out + NAME_MAX_CHARS - 3, "...", 4);
}

/* The font has no rotation: the text is drawn on a scratch canvas and copied
 * turned a quarter left, so it reads upward from (x, y_bottom). */
static void text_upward(canvas *cv, int x, int y_bottom, const char *text,
                        const uint8_t rgb[3]) {
    canvas t;
    int w = canvas_text_width(text, 1);
    if (w <= 0 || canvas_init(&t, w, CANVAS_FONT_H) != 0)
        return;
    canvas_text(&t, 0, 0, text, 1, rgb);
    for (int ty = 0; ty < t.h; ty++)
        for (int tx = 0; tx < t.w; tx++) {
            const uint8_t *p = t.rgb + ((size_t)ty * t.w + tx) * 3;
            if (p[0] != 255 || p[1] != 255 || p[2] != 255)
                canvas_rect(cv, x + ty, y_bottom - tx, 1, 1, p);
        }
    canvas_free(&t);
}

static void blend(const uint8_t to[3], double f, uint8_t out[3]) {
    for (int c = 0; c < 3; c++)
        out[c] = (uint8_t)(255 - f * (255 - to[c]) + 0.5);
}

/* The diagonal is shaded blue by the row's fraction (the class's accuracy);
 * the errors red by their count over the largest off-diagonal count, from a
 * floor of 0.25 so that a single error among hundreds of right answers is
 * not lost in white. Counts are written in the cells up to 20 classes. */
static int plot_confusion(const char *path, const char *model, vitc_vit *m, vitc_dataset *ds,
                          const int64_t *cm, int C, double acc) {
    static const uint8_t black[3] = {0, 0, 0}, white[3] = {255, 255, 255},
                         grid[3] = {200, 200, 200}, blue[3] = {8, 69, 148},
                         red[3] = {189, 0, 38}, zero[3] = {170, 170, 170};
    const double err_floor = 0.25;
    int cell = C <= 10 ? 44 : C <= 20 ? 32 : C <= 30 ? 24 : 12;
    int namew = 0;
    char buf[256], title[256], sub[128], nm[NAME_MAX_CHARS + 1];
    int64_t total = 0, max_err = 0;
    for (int t = 0; t < C; t++)
        for (int p = 0; p < C; p++) {
            total += cm[t * C + p];
            if (t != p && cm[t * C + p] > max_err)
                max_err = cm[t * C + p];
        }
    for (int i = 0; i < C; i++) {
        short_label(m, ds, i, nm, sizeof nm);
        int w = canvas_text_width(nm, 1);
        if (w > namew)
            namew = w;
    }
    char base[128];
    canvas_base_name(model, base, sizeof base);
    snprintf(title, sizeof title, "%s: accuracy %.2f%% on %lld images", base, 100 * acc,
             (long long)total);
    snprintf(sub, sizeof sub, "rows: true class, columns: predicted class");
    int left = namew + 16, top = 44, grid_w = C * cell, colh = namew + 8;
    int legend_y = top + grid_w + colh + 8, H = legend_y + 2 * 14 + 10;
    int W = left + grid_w + 20, tw = canvas_text_width(title, 1) + 16;
    if (tw > W)
        W = tw;
    if (canvas_text_width(sub, 1) + 16 > W)
        W = canvas_text_width(sub, 1) + 16;
    if (W < 8 + 60 + 8 + canvas_text_width("errors: 1 .. 0000000000", 1) + 8)
        W = 8 + 60 + 8 + canvas_text_width("errors: 1 .. 0000000000", 1) + 8;
    canvas cv;
    if (W > 8000 || H > 8000 || canvas_init(&cv, W, H) != 0)
        return cli_error("--plot: cannot allocate a %dx%d picture", W, H);
    canvas_text(&cv, 8, 8, title, 1, black);
    canvas_text(&cv, 8, 8 + 14, sub, 1, black);
    for (int t = 0; t < C; t++) {
        int64_t row = 0;
        for (int p = 0; p < C; p++) row += cm[t * C + p];
        short_label(m, ds, t, nm, sizeof nm);
        canvas_text(&cv, left - 8 - canvas_text_width(nm, 1), top + t * cell + cell / 2 - 3, nm,
                    1, black);
        for (int p = 0; p < C; p++) {
            int64_t n = cm[t * C + p];
            double f;
            uint8_t col[3];
            if (t == p) {
                f = row ? (double)n / row : 0;
                blend(blue, f, col);
            } else {
                f = n ? err_floor + (1 - err_floor) * (double)n / max_err : 0;
                blend(red, f, col);
            }
            int x = left + p * cell, y = top + t * cell;
            canvas_rect(&cv, x, y, cell, cell, col);
            canvas_rect(&cv, x, y, cell, 1, grid);
            canvas_rect(&cv, x, y, 1, cell, grid);
            if (C <= 20) {
                snprintf(buf, sizeof buf, "%lld", (long long)n);
                int w = canvas_text_width(buf, 1);
                if (w < cell - 2)
                    canvas_text(&cv, x + (cell - w) / 2, y + cell / 2 - 3, buf, 1,
                                f > 0.55 ? white : n ? black : zero);
            }
        }
    }
    canvas_rect(&cv, left, top + grid_w, grid_w + 1, 1, grid);
    canvas_rect(&cv, left + grid_w, top, 1, grid_w, grid);
    for (int p = 0; p < C; p++) {
        short_label(m, ds, p, nm, sizeof nm);
        text_upward(&cv, left + p * cell + cell / 2 - 3, top + grid_w + 6 + namew - 1, nm,
                    black);
    }
    /* the two scales: what each shade means */
    for (int k = 0; k < 2; k++) {
        int y = legend_y + k * 14;
        for (int i = 0; i < 60; i++) {
            uint8_t col[3];
            if (k == 0)
                blend(blue, i / 59.0, col);
            else
                blend(red, err_floor + (1 - err_floor) * i / 59.0, col);
            canvas_rect(&cv, 8 + i, y, 1, 9, col);
        }
        if (k == 0)
            snprintf(buf, sizeof buf, "correct: 0 .. 100%% of the row");
        else
            snprintf(buf, sizeof buf, "errors: 1 .. %lld", (long long)(max_err ? max_err : 1));
        canvas_text(&cv, 8 + 60 + 8, y + 1, buf, 1, black);
    }
    int rc = vitc_image_save_png(path, cv.rgb, cv.w, cv.h) == VITC_OK ? CLI_OK
                                                                      : cli_lib_error("--plot");
    canvas_free(&cv);
    return rc;
}

/* The confusion matrix is shown (text, JSON, PNG) up to this many classes
 * (8 MB dense); beyond, the text prints none and the JSON lists the nonzero
 * cells. The text prints it up to EVAL_TEXT_MAX classes (wider is not read). */
#define EVAL_DENSE_MAX 1000
#define EVAL_TEXT_MAX 100

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A JSON string of untrusted text: bytes that are not valid UTF-8 as
 * U+FFFD (jansson refuses them, and the field would be lost). */
static json_t *json_text(const char *s) {
    json_t *j = json_string(s);
    if (j)
        return j;
    char *fixed = cli_utf8_valid(s);
    j = fixed ? json_string(fixed) : NULL;
    free(fixed);
    return j ? j : json_string("?");
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *plot = NULL, *precision = NULL,
               *attn_precision = NULL;
    int json = 0, quiet = 0, threads = 0, batch = 256, subset = 0;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &model, 0, 0, NULL},
        {"--data", NULL, CLI_STRING, &data, 0, 0, NULL},
        {"--plot", NULL, CLI_STRING, &plot, 0, 0, NULL},
        {"--precision", NULL, CLI_STRING, &precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &attn_precision, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {"--quiet", NULL, CLI_FLAG, &quiet, 0, 0, NULL},
        {"--threads", NULL, CLI_INT, &threads, 1, 256, NULL},
        {"--batch", NULL, CLI_INT, &batch, 1, 65536, NULL},
        {"--subset", NULL, CLI_INT, &subset, 1, 1e9, NULL},
    };
    int r = topt_parse("eval", eval_usage, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                       NULL, NULL);
    if (r)
        return r < 0 ? CLI_OK : r;
    if (!model)
        return cli_usage_error("eval", "--model is required");
    if (!data)
        return cli_usage_error("eval", "--data is required");
    static const char *const png[] = {".png"};
    if (plot && cli_out_format("eval", "--plot", plot, "PNG", png, 1) < 0)
        return CLI_USAGE;
    if (threads)
        vitc_set_num_threads(threads);
    vitc_vit *m;
    int prec, prc = cli_parse_precision("eval", precision, &prec);
    if (prc != CLI_OK)
        return prc;
    if (cli_load_vit(model, NULL, prec, &m) != VITC_OK)
        return cli_lib_error("--model");
    prc = cli_require_head(model, m);
    if (prc == CLI_OK)
        prc = cli_set_precision("eval", m, NULL, attn_precision);
    if (prc != CLI_OK) {
        vitc_vit_free(m);
        return prc;
    }
    /* An ImageFolder is read with the model's class names as its class
     * list (when it has names), so that a val/ missing a class folder does
     * not shift the labels. */
    const vitc_vit_config *mc = vitc_vit_get_config(m);
    const char **names = calloc((size_t)mc->num_classes, sizeof *names);
    int n_names = names ? mc->num_classes : 0;
    for (int i = 0; i < n_names; i++)
        if (!(names[i] = vitc_vit_label(m, i)))
            n_names = 0;
    train_data d;
    int rc = train_data_open(data, 0, n_names, n_names ? names : NULL, &d);
    free(names);
    if (rc != CLI_OK) {
        vitc_vit_free(m);
        return rc;
    }
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int C = c->num_classes;
    int64_t *cm = NULL;
    eval_counts ec = {0};
    eval_result er = {0};
    if (rc == CLI_OK && (c->in_channels != 1 && c->in_channels != 3))
        rc = cli_error("the model takes %d channels; images give 1 or 3", c->in_channels);
    if (rc == CLI_OK && subset && vitc_dataset_truncate(d.eval, subset) != VITC_OK)
        rc = cli_lib_error("--subset");
    if (rc == CLI_OK)
        rc = train_evaluate(m, d.eval, batch, &er, &ec, quiet, "eval");
    if (rc == CLI_OK && C <= EVAL_DENSE_MAX && !(cm = eval_counts_dense(&ec)))
        rc = cli_error("out of memory");
    for (int64_t i = 0; rc == CLI_OK && i < er.skipped; i++)
        cli_warning("skipped unreadable image %s", vitc_dataset_skipped_path(d.eval, i));
    double acc = er.n ? (double)er.correct / er.n : 0;
    char nb[16];
    if (rc == CLI_OK && json) {
        json_t *o = json_object(), *pc = json_array(), *mat = cm ? json_array() : json_null();
        json_object_set_new(o, "model", json_text(model));
        json_object_set_new(o, "precision",
                            json_string(vitc_precision_name(vitc_vit_get_precision(m))));
        json_object_set_new(
            o, "attention_precision",
            json_string(vitc_precision_name(vitc_vit_get_attention_precision(m))));
        json_object_set_new(o, "images", json_integer(er.n));
        json_object_set_new(o, "skipped", json_integer(er.skipped));
        json_object_set_new(o, "accuracy", json_real(acc));
        json_object_set_new(o, "loss", isfinite(er.loss) ? json_real(er.loss) : json_null());
        for (int t = 0; t < C; t++) {
            json_t *e = json_object();
            if (cm) {
                json_t *jr = json_array();
                for (int p = 0; p < C; p++)
                    json_array_append_new(jr, json_integer(cm[(size_t)t * C + p]));
                json_array_append_new(mat, jr);
            }
            json_object_set_new(e, "index", json_integer(t));
            json_object_set_new(e, "label", json_text(label_of(m, d.eval, t, nb, sizeof nb)));
            json_object_set_new(e, "images", json_integer(ec.total[t]));
            json_object_set_new(e, "accuracy", ec.total[t]
                                                   ? json_real((double)ec.hit[t] / ec.total[t])
                                                   : json_null());
            json_array_append_new(pc, e);
        }
        json_object_set_new(o, "per_class", pc);
        json_object_set_new(o, "confusion", mat);
        if (!cm) { /* the nonzero cells, [true, predicted, count], in order */
            json_t *sp = json_array();
            int64_t *keys = malloc((ec.n ? ec.n : 1) * sizeof *keys);
            size_t k = 0;
            for (size_t i = 0; keys && i < ec.cap; i++)
                if (ec.key[i] >= 0)
                    keys[k++] = ec.key[i];
            if (keys)
                qsort(keys, k, sizeof *keys, cmp_i64);
            for (size_t i = 0; keys && i < k; i++) {
                size_t h = (size_t)((uint64_t)keys[i] * 0x9e3779b97f4a7c15ULL % ec.cap);
                while (ec.key[h] != keys[i]) h = (h + 1) % ec.cap;
                json_array_append_new(sp, json_pack("[I I I]", (json_int_t)(keys[i] / C),
                                                    (json_int_t)(keys[i] % C),
                                                    (json_int_t)ec.val[h]));
            }
            free(keys);
            json_object_set_new(o, "confusion_cells", sp);
        }
        char *t = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (t)
            printf("%s\n", t);
        free(t);
        json_decref(o);
    } else if (rc == CLI_OK) {
        printf("accuracy %.2f%% (%lld of %lld images), mean loss %.4f\n", 100 * acc,
               (long long)er.correct, (long long)er.n, er.loss);
        if (er.skipped)
            printf("skipped %lld unreadable images\n", (long long)er.skipped);
        printf("\nper class:\n");
        for (int t = 0; t < C; t++) {
            char shown[256];
            cli_escape(shown, sizeof shown, label_of(m, d.eval, t, nb, sizeof nb));
            printf("  %3d %-20s %7.2f%%  (%lld images)\n", t, shown,
                   ec.total[t] ? 100.0 * ec.hit[t] / ec.total[t] : 0.0, (long long)ec.total[t]);
        }
        if (C > EVAL_TEXT_MAX) {
            printf("\nconfusion matrix: not printed for %d classes (over %d); --json has it\n", C,
                   EVAL_TEXT_MAX);
        } else {
            printf("\nconfusion matrix (rows: true, columns: predicted):\n     ");
            for (int p = 0; p < C; p++) printf(" %6d", p);
            printf("\n");
            for (int t = 0; t < C; t++) {
                printf("  %3d", t);
                for (int p = 0; p < C; p++) printf(" %6lld", (long long)cm[(size_t)t * C + p]);
                printf("\n");
            }
        }
    }
    if (rc == CLI_OK && plot && !cm)
        rc = cli_error("--plot: the confusion matrix of %d classes is not drawn (at most %d)", C,
                       EVAL_DENSE_MAX);
    if (rc == CLI_OK && plot)
        rc = plot_confusion(plot, model, m, d.eval, cm, C, acc);
    free(cm);
    eval_counts_free(&ec);
    train_data_close(&d);
    vitc_vit_free(m);
    return rc;
}
