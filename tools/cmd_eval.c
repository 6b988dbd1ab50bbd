/*
 * cmd_eval.c — `vitc eval`: a model's accuracy on a test set, per class,
 * with the confusion matrix (as text, JSON, or a PNG).
 */
#include <jansson.h>
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

/* Cells shaded by the row's fraction (white to dark blue), counts written
 * in them, class names on both axes. */
static int plot_confusion(const char *path, vitc_vit *m, vitc_dataset *ds, const int64_t *cm,
                          int C, double acc) {
    int cell = C <= 10 ? 44 : C <= 30 ? 24 : 12, s = 1;
    int namew = 0;
    char buf[64], nb[16];
    for (int i = 0; i < C; i++) {
        int w = canvas_text_width(label_of(m, ds, i, nb, sizeof nb), s);
        if (w > namew)
            namew = w > 140 ? 140 : w;
    }
    int left = namew + 16, top = 40, W = left + C * cell + 20, H = top + C * cell + 40;
    canvas cv;
    if (W > 8000 || canvas_init(&cv, W, H) != 0)
        return cli_error("--plot: cannot allocate a %dx%d picture", W, H);
    const uint8_t black[3] = {0, 0, 0}, white[3] = {255, 255, 255}, grid[3] = {200, 200, 200};
    snprintf(buf, sizeof buf, "accuracy %.2f%%  (rows: true, columns: predicted)", 100 * acc);
    canvas_text(&cv, 8, 10, buf, s, black);
    for (int t = 0; t < C; t++) {
        int64_t row = 0;
        for (int p = 0; p < C; p++) row += cm[t * C + p];
        canvas_text(&cv, 8, top + t * cell + cell / 2 - 3, label_of(m, ds, t, nb, sizeof nb), s,
                    black);
        for (int p = 0; p < C; p++) {
            double f = row ? (double)cm[t * C + p] / row : 0;
            uint8_t col[3] = {(uint8_t)(255 - f * 225), (uint8_t)(255 - f * 180),
                              (uint8_t)(255 - f * 80)};
            int x = left + p * cell, y = top + t * cell;
            canvas_rect(&cv, x, y, cell, cell, col);
            canvas_rect(&cv, x, y, cell, 1, grid);
            canvas_rect(&cv, x, y, 1, cell, grid);
            if (cell >= 24) {
                snprintf(buf, sizeof buf, "%lld", (long long)cm[t * C + p]);
                int tw = canvas_text_width(buf, s);
                if (tw < cell - 2)
                    canvas_text(&cv, x + (cell - tw) / 2, y + cell / 2 - 3, buf, s,
                                f > 0.5 ? white : black);
            }
        }
    }
    for (int p = 0; p < C; p++) {
        snprintf(buf, sizeof buf, "%d", p);
        canvas_text(&cv, left + p * cell + cell / 2 - 3, top + C * cell + 6, buf, s, black);
    }
    canvas_text(&cv, left, top + C * cell + 22, "predicted class (index)", s, black);
    int rc = vitc_image_save_png(path, cv.rgb, cv.w, cv.h) == VITC_OK ? CLI_OK
                                                                      : cli_lib_error("--plot");
    canvas_free(&cv);
    return rc;
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
    int64_t *cm = calloc((size_t)C * C, sizeof *cm);
    eval_result er;
    if (!cm)
        rc = cli_error("out of memory");
    if (rc == CLI_OK && (c->in_channels != 1 && c->in_channels != 3))
        rc = cli_error("the model takes %d channels; images give 1 or 3", c->in_channels);
    if (rc == CLI_OK && subset && vitc_dataset_truncate(d.eval, subset) != VITC_OK)
        rc = cli_lib_error("--subset");
    if (rc == CLI_OK)
        rc = train_evaluate(m, d.eval, batch, &er, cm, quiet, "eval");
    for (int64_t i = 0; rc == CLI_OK && i < er.skipped; i++)
        fprintf(stderr, "vitc: warning: skipped unreadable image %s\n",
                vitc_dataset_skipped_path(d.eval, i));
    double acc = er.n ? (double)er.correct / er.n : 0;
    char nb[16];
    if (rc == CLI_OK && json) {
        json_t *o = json_object(), *pc = json_array(), *mat = json_array();
        json_object_set_new(o, "model", json_string(model));
        json_object_set_new(o, "precision",
                            json_string(vitc_precision_name(vitc_vit_get_precision(m))));
        json_object_set_new(
            o, "attention_precision",
            json_string(vitc_precision_name(vitc_vit_get_attention_precision(m))));
        json_object_set_new(o, "images", json_integer(er.n));
        json_object_set_new(o, "skipped", json_integer(er.skipped));
        json_object_set_new(o, "accuracy", json_real(acc));
        json_object_set_new(o, "loss", json_real(er.loss));
        for (int t = 0; t < C; t++) {
            int64_t row = 0;
            json_t *jr = json_array(), *e = json_object();
            for (int p = 0; p < C; p++) {
                row += cm[t * C + p];
                json_array_append_new(jr, json_integer(cm[t * C + p]));
            }
            json_object_set_new(e, "index", json_integer(t));
            json_object_set_new(e, "label", json_string(label_of(m, d.eval, t, nb, sizeof nb)));
            json_object_set_new(e, "images", json_integer(row));
            json_object_set_new(e, "accuracy", row ? json_real((double)cm[t * C + t] / row)
                                                   : json_null());
            json_array_append_new(pc, e);
            json_array_append_new(mat, jr);
        }
        json_object_set_new(o, "per_class", pc);
        json_object_set_new(o, "confusion", mat);
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
            int64_t row = 0;
            for (int p = 0; p < C; p++) row += cm[t * C + p];
            printf("  %3d %-20s %7.2f%%  (%lld images)\n", t, label_of(m, d.eval, t, nb, sizeof nb),
                   row ? 100.0 * cm[t * C + t] / row : 0.0, (long long)row);
        }
        printf("\nconfusion matrix (rows: true, columns: predicted):\n     ");
        for (int p = 0; p < C; p++) printf(" %6d", p);
        printf("\n");
        for (int t = 0; t < C; t++) {
            printf("  %3d", t);
            for (int p = 0; p < C; p++) printf(" %6lld", (long long)cm[t * C + p]);
            printf("\n");
        }
    }
    if (rc == CLI_OK && plot)
        rc = plot_confusion(plot, m, d.eval, cm, C, acc);
    free(cm);
    train_data_close(&d);
    vitc_vit_free(m);
    return rc;
}
