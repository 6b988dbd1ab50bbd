/*
 * cmd_similar.c — `vitc similar`: the images of a folder nearest to a query
 * image by cosine similarity of their embeddings.
 *
 * The folder is embedded once and cached in the user's cache directory (or
 * --cache DIR), never beside the images: a folder may be read-only, shared
 * or a system package's. One file per (folder, model, precision), named by a
 * hash of those so that switching models keeps each cache: the L2-normalised
 * embeddings [n, C] and, as metadata, the full key — the folder's real path,
 * the model's path, size and time, the precisions, the pooling, and every
 * image's name, size and modification time. A key that differs (a change, or
 * a hash collision) re-embeds the folder.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"

#define SIMILAR_MAX_FILES 1000000

static const char similar_usage[] =
    "usage: vitc similar --model M --index DIR [options] QUERY_IMAGE\n"
    "\n"
    "List the images of DIR (PNG/JPEG, not recursive) nearest to QUERY_IMAGE by\n"
    "cosine similarity of the model's default embedding (see vitc embed). DIR is\n"
    "embedded once and cached in $XDG_CACHE_HOME/vitc/similar/ (else\n"
    "~/.cache/vitc/similar/), one file per folder, model and precision, never in\n"
    "DIR; it is rebuilt when an image's name, size or time changes. QUERY_IMAGE\n"
    "itself, when it is one of DIR's images, is left out of the results.\n"
    "\n"
    "options:\n"
    "  --model M      checkpoint file or Hugging Face Hub directory\n"
    "  --arch NAME    architecture of a file without vitc.config metadata\n"
    "  --index DIR    the folder of images\n"
    "  --topk K       results, 1.. (default 5)\n"
    "  --batch B      images per forward pass, 1..4096 (default 8)\n"
    "  --threads N    threads, 1..256\n"
    "  --precision P  fp32, bf16 or int8 arithmetic of the weight GEMMs (default\n"
    "                 fp32; a change rebuilds the cache)\n"
    "  --attention-precision A\n"
    "                 fp32 or bf16 operands of the attention's q k^T and P v\n"
    "                 (default fp32; a change rebuilds the cache)\n"
    "  --cache DIR    keep the index cache in DIR (created if missing)\n"
    "  --no-cache     embed the folder every time; write no cache\n"
    "  --json         one JSON object per result: {\"image\", \"score\"}\n"
    "  --quiet        no progress on stderr\n"
    "  -h, --help     this help\n";

typedef struct similar_opts {
    const char *model, *arch, *index, *precision, *attn_precision, *cache_dir;
    int topk, batch, threads, json, quiet, no_cache;
    char *query;
} similar_opts;

static int is_image_name(const char *n) {
    const char *dot = strrchr(n, '.');
    return n[0] != '.' && dot &&
           (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The folder's images (sorted) and their signature: [[name, size, mtime_ns], ...]. */
static int list_images(const char *dir, char ***names, int *n, json_t *sig) {
    DIR *d = opendir(dir);
    if (!d)
        return cli_error("%s: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    *names = NULL;
    *n = 0;
    while ((e = readdir(d))) {
        if (!is_image_name(e->d_name))
            continue;
        if (*n >= SIMILAR_MAX_FILES) {
            closedir(d);
            return cli_error("%s: more than %d images", dir, SIMILAR_MAX_FILES);
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **g = realloc(*names, (size_t)cap * sizeof *g);
            if (!g) {
                closedir(d);
                return cli_error("out of memory");
            }
            *names = g;
        }
        if (!((*names)[(*n)++] = strdup(e->d_name))) {
            closedir(d);
            return cli_error("out of memory");
        }
    }
    closedir(d);
    qsort(*names, (size_t)*n, sizeof **names, cmp_str);
    for (int i = 0; i < *n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, (*names)[i]);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue; /* not a file: embedding it reports the error */
        long long ns = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
        json_array_append_new(sig, json_pack("[s I I]", (*names)[i], (json_int_t)sb.st_size,
                                             (json_int_t)ns));
    }
    return CLI_OK;
}

/* Create path and its missing parents, 0700 each (a cache may hold what the
 * user's images look like). 0 when it is a directory at the end. */
static int mkdir_p(const char *path) {
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    return stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode) ? 0 : -1;
}

/* dir created (0700) if missing and writable; errno says why not. */
static int usable_dir(const char *dir) {
    errno = 0;
    return mkdir_p(dir) == 0 && access(dir, W_OK | X_OK) == 0;
}

/* The cache folder into dir: --cache, else $XDG_CACHE_HOME/vitc/similar, else
 * $HOME/.cache/vitc/similar (relative XDG values are ignored, as the XDG spec
 * says). 0, or -1 with why in why (no cache is then kept). */
static int cache_folder(const char *given, char *dir, size_t cap, char *why, size_t why_cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const char *tried = NULL;
    int err = 0;
    if (given) {
        snprintf(dir, cap, "%s", given);
        if (usable_dir(dir))
            return 0;
        snprintf(why, why_cap, "--cache %s: %s", given, strerror(errno ? errno : ENOTDIR));
        return -1;
    }
    if (xdg && xdg[0] == '/') {
        snprintf(dir, cap, "%s/vitc/similar", xdg);
        if (usable_dir(dir))
            return 0;
        tried = "$XDG_CACHE_HOME", err = errno ? errno : ENOTDIR;
    }
    if (home && home[0] == '/') {
        snprintf(dir, cap, "%s/.cache/vitc/similar", home);
        if (usable_dir(dir))
            return 0;
        tried = "$HOME/.cache", err = errno ? errno : ENOTDIR;
    }
    if (tried)
        snprintf(why, why_cap, "%s: %s", tried, strerror(err));
    else
        snprintf(why, why_cap, "neither $XDG_CACHE_HOME nor $HOME is set");
    return -1;
}

/* 64-bit FNV-1a: a file name for a key, not a defence (the key is checked). */
static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* [size, mtime_ns] of path, or null: a model rewritten in place must not
 * match its old embeddings. */
static json_t *file_sig(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return json_null();
    long long ns = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    return json_pack("[I I]", (json_int_t)sb.st_size, (json_int_t)ns);
}

/* The model's identity: a checkpoint file's size and time, or a Hub
 * directory's config and weight files' (the directory's own time does not
 * change when a file in it is rewritten in place). */
static json_t *model_sig(const char *path) {
    struct stat sb;
    json_t *o = json_object();
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        static const char *const files[] = {"config.json", "model.safetensors",
                                            "preprocessor_config.json"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, files[i]);
            json_object_set_new(o, files[i], file_sig(p));
        }
    } else {
        json_object_set_new(o, "file", file_sig(path));
    }
    return o;
}

/* The cached embeddings when the cache's signature is key: *emb [*rows, dim]. */
static float *load_cache(const char *path, const char *key, int64_t dim, int64_t *rows,
                         json_t **names) {
    vitc_safetensors *st;
    float *out = NULL;
    if (vitc_safetensors_load(path, &st) != VITC_OK)
        return NULL;
    const char *k = vitc_safetensors_get_metadata(st, "vitc.similar");
    const char *nm = vitc_safetensors_get_metadata(st, "vitc.similar.names");
    int i = vitc_safetensors_find(st, "embeddings");
    const char *name, *dt;
    int nd;
    const int64_t *shape;
    const float *data;
    if (k && nm && !strcmp(k, key) && i >= 0 &&
        vitc_safetensors_tensor(st, i, &name, &dt, &nd, &shape, &data) == VITC_OK && nd == 2 &&
        shape[1] == dim) {
        json_error_t jerr;
        *names = json_loads(nm, 0, &jerr);
        if (json_is_array(*names) && (int64_t)json_array_size(*names) == shape[0] &&
            (out = malloc((size_t)(shape[0] * dim) * sizeof(float) + 1))) {
            memcpy(out, data, (size_t)(shape[0] * dim) * sizeof(float));
            *rows = shape[0];
        } else {
            json_decref(*names);
            *names = NULL;
        }
    }
    vitc_safetensors_free(st);
    return out;
}

int cmd_similar(int argc, char **argv) {
    similar_opts o = {0};
    o.topk = 5;
    o.batch = 8;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o.model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o.arch, 0, 0, NULL},
        {"--index", NULL, CLI_STRING, &o.index, 0, 0, NULL},
        {"--topk", NULL, CLI_INT, &o.topk, 1, 1000000000, NULL},
        {"--batch", NULL, CLI_INT, &o.batch, 1, 4096, NULL},
        {"--threads", NULL, CLI_INT, &o.threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o.precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o.attn_precision, 0, 0, NULL},
        {"--cache", NULL, CLI_STRING, &o.cache_dir, 0, 0, NULL},
        {"--no-cache", NULL, CLI_FLAG, &o.no_cache, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &o.json, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &o.quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 1, "image"};
    char *pos[1];
    int n_pos, rc = cli_parse_command("similar", &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(similar_usage, stdout);
        return CLI_OK;
    }
    if (rc != 0)
        return rc;
    if (!o.model || !o.index || n_pos != 1)
        return cli_usage_error("similar", "--model, --index and one query image are required");
    if (o.no_cache && o.cache_dir)
        return cli_usage_error("similar", "--cache and --no-cache exclude each other");
    o.query = pos[0];
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);

    vitc_vit *m = NULL;
    char **names = NULL, cache[4096] = "", *key = NULL, *names_text = NULL;
    int n = 0, failed = 0;
    int64_t dim = 0, rows = 0;
    float *emb = NULL, *batch = NULL, *q = NULL;
    cli_ranked *rank = NULL;
    json_t *sig = json_array(), *done_names = NULL;
    cli_input in;
    int use_cache = !o.no_cache;
    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, 0, 0, 0, 0, 1};
    if ((rc = cli_open_model("similar", &mo, &m, &in)) != CLI_OK)
        goto out;
    const vitc_vit_config *cfg = vitc_vit_get_config(m);
    if (vitc_vit_embed_size(m, VITC_POOL_DEFAULT, in.height, in.width, &dim) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto out;
    }
    if ((rc = list_images(o.index, &names, &n, sig)) != CLI_OK)
        goto out;
    {
        char *rp = realpath(o.model, NULL), *ri = realpath(o.index, NULL), *id = NULL;
        /* the precision is part of the key: its embeddings differ from fp32's */
        json_t *k = json_pack(
            "{s s s s s o s s s s s s s i}", "index", ri ? ri : o.index, "model", rp ? rp : o.model,
            "model_files", model_sig(o.model), "pool", "default", "precision",
            vitc_precision_name(vitc_vit_get_precision(m)), "attention_precision",
            vitc_precision_name(vitc_vit_get_attention_precision(m)), "dim", (int)dim);
        free(rp);
        free(ri);
        /* the file name hashes what picks the cache; the images' signature
         * is only checked, so that an edited folder overwrites its own file */
        if (k && (id = json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS))) {
            char dir[4000], why[4400];
            if (use_cache && cache_folder(o.cache_dir, dir, sizeof dir, why, sizeof why) != 0) {
                /* paths from the environment and the command line: escaped */
                char ewhy[4400], eidx[1024];
                cli_escape(ewhy, sizeof ewhy, why);
                cli_escape(eidx, sizeof eidx, o.index);
                fprintf(stderr, "vitc: warning: no index cache (%s); embedding %s every time\n",
                        ewhy, eidx);
                use_cache = 0;
            }
            if (use_cache)
                snprintf(cache, sizeof cache, "%s/similar-%016llx.safetensors", dir,
                         (unsigned long long)fnv1a(id));
            json_object_set(k, "files", sig);
            key = json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS);
        }
        free(id);
        json_decref(k);
    }
    if (!key) {
        rc = cli_error("out of memory");
        goto out;
    }
    if (use_cache)
        emb = load_cache(cache, key, dim, &rows, &done_names);
    if (!emb) { /* embed the folder */
        done_names = json_array();
        if (!(emb = malloc((size_t)(n ? n : 1) * (size_t)dim * sizeof(float))) ||
            !(batch = malloc((size_t)o.batch * in.per_image * sizeof(float)))) {
            rc = cli_error("out of memory for %d embeddings", n);
            goto out;
        }
        int next = 0;
        cli_progress pr;
        cli_progress_start(&pr, "similar: indexing", n, o.quiet);
        while (next < n) {
            int nb = 0;
            while (nb < o.batch && next < n) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", o.index, names[next]);
                if (cli_load_input(path, cfg, &in, batch + in.per_image * (size_t)nb) != VITC_OK) {
                    cli_progress_clear(&pr);
                    cli_error("%s", vitc_last_error());
                    failed++;
                } else {
                    json_array_append_new(done_names, json_string(names[next]));
                    nb++;
                }
                next++;
            }
            if (nb && vitc_vit_embed(m, batch, nb, in.height, in.width, VITC_POOL_DEFAULT,
                                     emb + rows * dim) != VITC_OK) {
                rc = cli_error("forward pass: %s", vitc_last_error());
                goto out;
            }
            rows += nb;
            cli_progress_update(&pr, next);
        }
        cli_progress_clear(&pr);
        cli_l2_normalize(emb, (size_t)rows, (size_t)dim);
        names_text = json_dumps(done_names, JSON_COMPACT);
        const char *tn[1] = {"embeddings"}, *mk[2] = {"vitc.similar", "vitc.similar.names"};
        const char *mv[2] = {key, names_text};
        int nd[1] = {2};
        int64_t shape[2] = {rows, dim};
        const int64_t *sh[1] = {shape};
        const float *dp[1] = {emb};
        if (use_cache &&
            (!names_text || vitc_safetensors_save(cache, 1, tn, nd, sh, dp, 2, mk, mv) != VITC_OK))
            fprintf(stderr, "vitc: warning: the index cache could not be written: %s\n",
                    names_text ? vitc_last_error() : "out of memory");
    }
    /* The query. */
    if (!(q = malloc(in.per_image * sizeof(float) + (size_t)dim * sizeof(float)))) {
        rc = cli_error("out of memory");
        goto out;
    }
    float *qe = q + in.per_image;
    if (cli_load_input(o.query, cfg, &in, q) != VITC_OK ||
        vitc_vit_embed(m, q, 1, in.height, in.width, VITC_POOL_DEFAULT, qe) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto out;
    }
    cli_l2_normalize(qe, 1, (size_t)dim);
    if (!(rank = malloc((size_t)(rows ? rows : 1) * sizeof *rank))) {
        rc = cli_error("out of memory");
        goto out;
    }
    /* The query, when it is one of the folder's files (by device and inode,
     * whatever path names it), would always rank itself first. */
    struct stat qsb;
    int have_q = stat(o.query, &qsb) == 0;
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (have_q) {
            const char *nm = json_string_value(json_array_get(done_names, (size_t)r));
            char path[4096];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", o.index, nm ? nm : "");
            if (nm && stat(path, &sb) == 0 && sb.st_dev == qsb.st_dev && sb.st_ino == qsb.st_ino)
                continue;
        }
        double s = 0.0;
        for (int64_t i = 0; i < dim; i++) s += (double)qe[i] * emb[r * dim + i];
        rank[kept].score = (float)s;
        rank[kept++].index = (int)r;
    }
    qsort(rank, (size_t)kept, sizeof *rank, cli_ranked_cmp);
    for (int64_t r = 0; r < kept && r < o.topk; r++) {
        const char *nm = json_string_value(json_array_get(done_names, (size_t)rank[r].index));
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o.index, nm ? nm : "?");
        if (o.json) {
            json_t *j = json_pack("{s s s f}", "image", path, "score", (double)rank[r].score);
            char *t = json_dumps(j, JSON_COMPACT);
            if (t)
                puts(t);
            free(t);
            json_decref(j);
        } else {
            printf("%.6f  ", (double)rank[r].score);
            cli_put_escaped(stdout, path, SIZE_MAX);
            putchar('\n');
        }
    }
    rc = fflush(stdout) != 0 ? cli_error("cannot write the output") : failed ? CLI_FAIL : CLI_OK;
out:
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(key);
    free(names_text);
    free(emb);
    free(batch);
    free(q);
    free(rank);
    json_decref(sig);
    json_decref(done_names);
    vitc_vit_free(m);
    return rc;
}
