/* plot.h — the small RGB canvas (plot.c) the picture-writing commands
 * share: plot-log, eval --plot, demo-fashion and attention-map. */
#ifndef VITC_PLOT_H
#define VITC_PLOT_H

#include <stddef.h>
#include <stdint.h>

/* Each canvas function clips to the canvas: drawing off it is a no-op. */
typedef struct canvas {
    int w, h;
    uint8_t *rgb; /* [h, w, 3] */
} canvas;
int canvas_init(canvas *c, int w, int h);
void canvas_free(canvas *c);
void canvas_rect(canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]);
void canvas_line(canvas *c, double x0, double y0, double x1, double y1, const uint8_t rgb[3],
                 int thick);
/* canvas_line clipped to the rectangle (cx, cy, cw, ch) before it is
 * rasterised (a plot's panel); non-finite ends draw nothing. */
void canvas_line_in(canvas *c, double x0, double y0, double x1, double y1, const uint8_t rgb[3],
                    int thick, int cx, int cy, int cw, int ch);
/* Text with its top-left corner at (x, y); each font pixel scale x scale. */
void canvas_text(canvas *c, int x, int y, const char *text, int scale, const uint8_t rgb[3]);
int canvas_text_width(const char *text, int scale);
/* The last component of a path into out, for a caption: a model given as a
 * directory ("hf/vit/") is named by the directory, not by "". */
void canvas_base_name(const char *path, char *out, size_t cap);
#define CANVAS_FONT_H 7

#endif
