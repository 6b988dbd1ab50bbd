/*
 * cmd_plot_log.c — `vitc plot-log`: training curves from a `vitc train
 * --log` file, as a PNG of two panels: loss (every step, faint, and the
 * epoch means) and accuracy per epoch (training and test/val).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static const char plot_usage[] =
    "usage: vitc plot-log FILE.jsonl --out curves.png\n"
    "\n"
    "Plot the loss and accuracy curves of a `vitc train --log` file: left, the\n"
    "loss of every step (grey) with each epoch's training loss (blue) and test\n"
    "or validation loss (orange); right, accuracy per epoch, training (blue)\n"
    "and test/val (orange).\n"
    "\n"
    "options:\n"
    "  --out FILE       the PNG to write (required)\n"
    "  --title TEXT     a title above the panels\n"
    "  -h, --help       this help\n";

/* A `vitc train --log` record is one line of about 200 bytes; a longer
 * line is not one, and is skipped (counted) without being held in memory
 * or parsed: a multi-gigabyte line costs 64 KiB, not its JSON tree. */
#define PLOT_MAX_LINE (64 << 10)

/* The next line of f into buf[PLOT_MAX_LINE + 1] (its newline dropped):
 * its length, -1 at the end, -2 for a line over PLOT_MAX_LINE (read past). */
static long plot_line(FILE *f, char *buf) {
    long n = 0;
    int c, over = 0;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (n < PLOT_MAX_LINE)
            buf[n++] = (char)c;
        else
            over = 1;
    }
    if (c == EOF && n == 0 && !over)
        return -1;
    buf[n] = '\0';
    return over ? -2 : n;
}

typedef struct series {
    double *x, *y;
    int n, cap;
} series;

static int series_add(series *s, double x, double y) {
    if (!isfinite(x) || !isfinite(y))
        return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

typedef struct panel {
    int x, y, w, h;
    double x0, x1, y0, y1;
} panel;

static double px(const panel *p, double x) { return p->x + (x - p->x0) / (p->x1 - p->x0) * p->w; }
static double py(const panel *p, double y) {
    return p->y + p->h - (y - p->y0) / (p->y1 - p->y0) * p->h;
}

/* A "nice" tick step for a range (1, 2 or 5 times a power of ten). */
static double nice_step(double range, int ticks) {
    double raw = range / ticks, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void draw_axes(canvas *c, const panel *p, const char *title, const char *xlabel,
                      int percent) {
    const uint8_t black[3] = {0, 0, 0}, grid[3] = {225, 225, 225};
    char buf[32];
    double st = nice_step(p->y1 - p->y0, 5);
    for (double v = ceil(p->y0 / st) * st; v <= p->y1 + 1e-9; v += st) {
        int y = (int)lround(py(p, v));
        canvas_rect(c, p->x, y, p->w, 1, grid);
        if (percent)
            snprintf(buf, sizeof buf, "%g%%", round(v * 1000) / 10);
        else
            snprintf(buf, sizeof buf, "%g", round(v * 1000) / 1000);
        canvas_text(c, p->x - 6 - canvas_text_width(buf, 1), y - 3, buf, 1, black);
    }
    double sx = nice_step(p->x1 - p->x0, 6);
    if (sx < 1)
        sx = 1;
    for (double v = ceil(p->x0 / sx) * sx; v <= p->x1 + 1e-9; v += sx) {
        int x = (int)lround(px(p, v));
        canvas_rect(c, x, p->y + p->h, 1, 4, black);
        snprintf(buf, sizeof buf, "%g", v);
        canvas_text(c, x - canvas_text_width(buf, 1) / 2, p->y + p->h + 8, buf, 1, black);
    }
    canvas_rect(c, p->x, p->y, 1, p->h, black);
    canvas_rect(c, p->x, p->y + p->h, p->w, 1, black);
    canvas_text(c, p->x, p->y - 16, title, 1, black);
    canvas_text(c, p->x + p->w / 2 - canvas_text_width(xlabel, 1) / 2, p->y + p->h + 22, xlabel,
                1, black);
}

static void draw_series(canvas *c, const panel *p, const series *s, const uint8_t col[3],
                        int thick, int dots) {
    for (int i = 0; i < s->n; i++) {
        /* segments clipped to the panel: a value far off it (a loss of
         * 1e300) once drew 100,000 squares per segment, and rounded
         * coordinates past int's range */
        if (i)
            canvas_line_in(c, px(p, s->x[i - 1]), py(p, s->y[i - 1]), px(p, s->x[i]),
                           py(p, s->y[i]), col, thick, p->x, p->y, p->w, p->h);
        double x = px(p, s->x[i]), y = py(p, s->y[i]);
        if (dots && x >= p->x && x <= p->x + p->w && y >= p->y && y <= p->y + p->h)
            canvas_rect(c, (int)lround(x) - 2, (int)lround(y) - 2, 5, 5, col);
    }
}

static void legend(canvas *c, int x, int y, const char *text, const uint8_t col[3]) {
    const uint8_t black[3] = {0, 0, 0};
    canvas_rect(c, x, y + 2, 14, 3, col);
    canvas_text(c, x + 18, y, text, 1, black);
}

int cmd_plot_log(int argc, char **argv) {
    const char *out = NULL, *title = NULL;
    const cli_opt opts[] = {
        {"--out", NULL, CLI_STRING, &out, 0, 0, NULL},
        {"--title", NULL, CLI_STRING, &title, 0, 0, NULL},
    };
    const char *path = NULL;
    int r = topt_parse("plot-log", plot_usage, opts, 2, argc, argv, "log file", &path);
    if (r)
        return r < 0 ? CLI_OK : r;
    if (!out)
        return cli_usage_error("plot-log", "--out is required");
    static const char *const png[] = {".png"};
    if (cli_out_format("plot-log", "--out", out, "PNG", png, 1) < 0)
        return CLI_USAGE;
    FILE *f;
    if (vitc_open_read(path, (int64_t)1 << 32, &f, NULL) != VITC_OK)
        return cli_lib_error("plot-log");
    series steps = {0}, tl = {0}, el = {0}, ta = {0}, ea = {0};
    char *line = malloc(PLOT_MAX_LINE + 1);
    long len;
    int64_t lineno = 0, bad = 0, spe = 0, longl = 0;
    int rc = CLI_OK;
    /* Steps are placed on the epoch axis: step / (steps per epoch), learned
     * from the epoch records' step counts. First pass: read everything. */
    series raw_steps = {0};
    if (!line)
        rc = cli_error("out of memory reading %s", path);
    while (rc == CLI_OK && (len = plot_line(f, line)) != -1) {
        lineno++;
        json_error_t jerr;
        json_t *o = len >= 0 ? json_loadb(line, (size_t)len, 0, &jerr) : NULL;
        longl += len == -2;
        if (!o && len >= 0 && json_error_code(&jerr) == json_error_out_of_memory) {
            rc = cli_error("%s: out of memory parsing line %lld (%ld bytes)", path,
                           (long long)lineno, len);
            break;
        }
        if (!o || !json_is_object(o)) {
            bad++;
            json_decref(o);
            continue;
        }
        const char *type = json_string_value(json_object_get(o, "type"));
        json_t *ep = json_object_get(o, "epoch"), *st = json_object_get(o, "step");
        double e = json_is_number(ep) ? json_number_value(ep) : NAN;
        double s = json_is_number(st) ? json_number_value(st) : NAN;
        int err = 0;
        if (type && !strcmp(type, "step")) {
            json_t *l = json_object_get(o, "loss");
            if (json_is_number(l))
                err |= series_add(&raw_steps, s, json_number_value(l));
        } else if (type && !strcmp(type, "epoch")) {
            if (isfinite(s) && isfinite(e) && e > 0 && !spe)
                spe = (int64_t)llround(s / e);
            json_t *v;
            if ((v = json_object_get(o, "train_loss")) && json_is_number(v))
                err |= series_add(&tl, e, json_number_value(v));
            if ((v = json_object_get(o, "train_acc")) && json_is_number(v))
                err |= series_add(&ta, e, json_number_value(v));
            if ((v = json_object_get(o, "eval_loss")) && json_is_number(v))
                err |= series_add(&el, e, json_number_value(v));
            if ((v = json_object_get(o, "eval_acc")) && json_is_number(v))
                err |= series_add(&ea, e, json_number_value(v));
        } else {
            bad++;
        }
        json_decref(o);
        if (err)
            rc = cli_error("out of memory reading %s", path);
    }
    free(line);
    fclose(f);
    if (rc == CLI_OK && !raw_steps.n && !tl.n)
        rc = cli_error("%s: no step or epoch records (%lld lines; is it a `vitc train --log` file?)",
                       path, (long long)lineno);
    /* A resumed run may log a step twice (the part redone after a kill): the
     * later record wins, drawn in step order. */
    for (int i = 0; rc == CLI_OK && i < raw_steps.n; i++) {
        double x = spe ? raw_steps.x[i] / spe : raw_steps.x[i];
        if (steps.n && x <= steps.x[steps.n - 1]) {
            while (steps.n && steps.x[steps.n - 1] >= x) steps.n--;
        }
        if (series_add(&steps, x, raw_steps.y[i]) != 0)
            rc = cli_error("out of memory");
    }
    canvas cv = {0, 0, NULL};
    if (rc == CLI_OK && canvas_init(&cv, 900, 380) != 0)
        rc = cli_error("out of memory for the picture");
    if (rc == CLI_OK) {
        const uint8_t grey[3] = {175, 185, 200}, blue[3] = {31, 119, 180},
                      orange[3] = {230, 110, 20}, black[3] = {0, 0, 0};
        double xmax = 1, lmax = 0, amin = 1, amax = 0;
        series *all[4] = {&steps, &tl, &el, NULL};
        for (int k = 0; all[k]; k++)
            for (int i = 0; i < all[k]->n; i++) {
                if (all[k]->x[i] > xmax) xmax = all[k]->x[i];
                if (all[k]->y[i] > lmax) lmax = all[k]->y[i];
            }
        series *acc[3] = {&ta, &ea, NULL};
        for (int k = 0; acc[k]; k++)
            for (int i = 0; i < acc[k]->n; i++) {
                if (acc[k]->x[i] > xmax) xmax = acc[k]->x[i];
                if (acc[k]->y[i] < amin) amin = acc[k]->y[i];
                if (acc[k]->y[i] > amax) amax = acc[k]->y[i];
            }
        if (amax < amin) amin = 0, amax = 1;
        double pad = (amax - amin) * 0.1 + 0.005;
        panel lp = {70, 60, 340, 260, 0, xmax, 0, lmax > 0 ? lmax * 1.05 : 1};
        panel ap = {530, 60, 340, 260, 0, xmax, fmax(0, amin - pad), fmin(1, amax + pad)};
        if (ap.y1 <= ap.y0) ap.y0 = 0, ap.y1 = 1;
        if (!isfinite(lp.y1)) /* 1.05 x a loss near DBL_MAX */
            lp.y1 = lmax;
        if (title)
            canvas_text(&cv, 70, 8, title, 2, black);
        draw_axes(&cv, &lp, "loss", "epoch", 0);
        draw_axes(&cv, &ap, "accuracy", "epoch", 1);
        draw_series(&cv, &lp, &steps, grey, 1, 0);
        draw_series(&cv, &lp, &tl, blue, 2, 1);
        draw_series(&cv, &lp, &el, orange, 2, 1);
        draw_series(&cv, &ap, &ta, blue, 2, 1);
        draw_series(&cv, &ap, &ea, orange, 2, 1);
        legend(&cv, lp.x + lp.w - 150, lp.y + 6, "step loss", grey);
        legend(&cv, lp.x + lp.w - 150, lp.y + 20, "train (epoch)", blue);
        legend(&cv, lp.x + lp.w - 150, lp.y + 34, "test/val", orange);
        legend(&cv, ap.x + ap.w - 110, ap.y + ap.h - 40, "train", blue);
        legend(&cv, ap.x + ap.w - 110, ap.y + ap.h - 26, "test/val", orange);
        if (ea.n) {
            char buf[64];
            snprintf(buf, sizeof buf, "final test/val %.2f%%", 100 * ea.y[ea.n - 1]);
            canvas_text(&cv, ap.x + 8, ap.y + 6, buf, 1, black);
        }
        if (vitc_image_save_png(out, cv.rgb, cv.w, cv.h) != VITC_OK)
            rc = cli_lib_error("--out");
    }
    if (longl && rc == CLI_OK)
        cli_warning("%s: %lld lines over %d bytes skipped (a training record is one short line)",
                    path, (long long)longl, PLOT_MAX_LINE);
    if (bad && rc == CLI_OK)
        cli_warning("%s: %lld lines were not training records", path, (long long)bad);
    canvas_free(&cv);
    series *fr[6] = {&steps, &tl, &el, &ta, &ea, &raw_steps};
    for (int k = 0; k < 6; k++) free(fr[k]->x), free(fr[k]->y);
    return rc;
}
