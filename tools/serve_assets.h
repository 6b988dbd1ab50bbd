/* serve_assets.h — the web page's files built into `vitc` (web/embed.c
 * writes the table into the build folder from web/). */
#ifndef VITC_SERVE_ASSETS_H
#define VITC_SERVE_ASSETS_H

#include <stddef.h>

typedef struct serve_asset {
    const char *path; /* URL path: "/" + the file's base name */
    const char *type; /* Content-Type */
    const unsigned char *data;
    size_t len;
    const char *etag; /* quoted, as the header carries it */
} serve_asset;

extern const serve_asset serve_assets[];
extern const int serve_n_assets;

#endif
