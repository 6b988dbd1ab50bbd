/*
 * cmd_similar.c — `vitc similar`: the images of a folder nearest to a query
 * image by cosine similarity of their embeddings.
 *
 * The folder is embedded once and cached in the user's cache directory (or
 * --cache DIR), never beside the images: a folder may be read-only, shared
 * or a system package's. One file per (folder, model, precision), named by a
 * hash of those so that switching models keeps each cache: the L2-normalised
 * embeddings [n, C] and, as metadata, the full key — the folder's real path,
 * the model's content (a hash of each weights file's header and of its JSON
 * files, with their sizes and times, so replaced weights or a changed
 * processor are a different key wherever the model lies), the precisions,
 * the pooling, and every image's name, size and modification time. A key
 * that differs (a change, or a hash collision) re-embeds the folder.
 *
 * File names are bytes, not text: in the key and the cache they are hex
 * (jansson takes only UTF-8, and a name it refused used to be dropped,
 * shifting every later name by one); on output, text escapes control
 * characters and JSON writes invalid UTF-8 as U+FFFD.
 *
 * The cache is written only into a directory of this user that no one else
 * can write, through a temporary file renamed over the cache's name: a link
 * planted under that name is replaced, never followed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
    "DIR; it is rebuilt when an image's name, size or time changes, or the model's\n"
    "content. QUERY_IMAGE itself, when it is one of DIR's images, is left out of\n"
    "the results.\n"
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

/* Bytes as lowercase hex: a file name in the key or the cache, whatever its
 * encoding. */
static json_t *json_hex(const char *s) {
    size_t n = strlen(s);
    char *h = malloc(2 * n + 1);
    if (!h)
        return NULL;
    for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", (unsigned char)s[i]);
    h[2 * n] = 0;
    json_t *j = json_string(h);
    free(h);
    return j;
}

/* json_hex's inverse: a new string, or NULL (not hex, a NUL byte, no memory). */
static char *unhex(const char *h) {
    size_t n = h ? strlen(h) : 1;
    if (n % 2)
        return NULL;
    char *s = malloc(n / 2 + 1);
    for (size_t i = 0; s && i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1 || !v || !strchr("0123456789abcdef", h[2 * i]) ||
            !strchr("0123456789abcdef", h[2 * i + 1])) {
            free(s);
            return NULL;
        }
        s[i] = (char)v;
    }
    if (s)
        s[n / 2] = 0;
    return s;
}

/* The cache's names are ["hex", ...], one string per row: more JSON values
 * than rows, or more text than rows hex-encoded paths can fill, is not a
 * cache vitc wrote, refused before jansson builds a tree of it (whose
 * nodes cost up to ~80x the text). */
static int names_plausible(const char *t, int64_t rows) {
    size_t len = strlen(t), items = 0;
    if ((uint64_t)len > (uint64_t)rows * (2 * PATH_MAX + 3) + 2)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (t[i] == '"') {
            for (i++; i < len && t[i] != '"'; i++)
                i += t[i] == '\\';
        } else {
            items += t[i] == '[' || t[i] == '{' || t[i] == ',';
        }
    }
    return (int64_t)items <= rows + 1;
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
        json_t *e = json_pack("[o I I]", json_hex((*names)[i]), (json_int_t)sb.st_size,
                              (json_int_t)ns);
        if (!e || json_array_append_new(sig, e) != 0)
            return cli_error("out of memory");
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

/* 64-bit FNV-1a over n bytes, continuing from h. Identifies content in a
 * key that is compared whole; it is not a defence against a forger, who
 * could as well write the cache. */
#define FNV_BASIS 1469598103934665603ULL
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

/* What the key hashes of a file: a .safetensors file's header (8 bytes and
 * the JSON, where every tensor's name, dtype, shape and offsets are) and
 * SIMILAR_HASH_SAMPLES blocks of its data spread evenly (weights retrained
 * in place keep the header), any other file whole, up to this. The rest of
 * a weights file is covered by its size and time: reading gigabytes of
 * weights on every query would cost more than the embeddings save. */
#define SIMILAR_HASH_MAX_BYTES (64LL << 20)
#define SIMILAR_HASH_SAMPLES 64
#define SIMILAR_HASH_BLOCK 4096

/* [size, mtime_ns, "content hash"] of path, or null when it cannot be read. */
static json_t *content_sig(const char *path) {
    FILE *f;
    int64_t size;
    if (vitc_open_read(path, INT64_MAX, &f, &size) != VITC_OK)
        return json_null();
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return json_null();
    }
    int64_t want = size < SIMILAR_HASH_MAX_BYTES ? size : SIMILAR_HASH_MAX_BYTES;
    size_t pl = strlen(path);
    unsigned char buf[65536];
    uint64_t h = FNV_BASIS;
    int weights = pl > 12 && !strcmp(path + pl - 12, ".safetensors");
    if (weights) {
        unsigned char n8[8];
        if (fread(n8, 1, 8, f) == 8) {
            uint64_t hl = 0;
            for (int i = 7; i >= 0; i--) hl = hl << 8 | n8[i];
            h = fnv1a(h, n8, 8);
            want = hl < (uint64_t)want - 8 ? (int64_t)hl : want - 8;
        } else {
            want = 0;
        }
    }
    while (want > 0) {
        size_t got = fread(buf, 1, want < (int64_t)sizeof buf ? (size_t)want : sizeof buf, f);
        if (got == 0)
            break;
        h = fnv1a(h, buf, got);
        want -= (int64_t)got;
    }
    /* the data: blocks at evenly spaced offsets of what follows the header */
    long long data0 = weights ? (long long)ftello(f) : size, span = size - data0;
    for (int i = 0; weights && span > 0 && i < SIMILAR_HASH_SAMPLES; i++) {
        long long at = data0 + span / SIMILAR_HASH_SAMPLES * i;
        size_t got;
        if (fseeko(f, (off_t)at, SEEK_SET) != 0 ||
            (got = fread(buf, 1, SIMILAR_HASH_BLOCK, f)) == 0)
            break;
        h = fnv1a(h, buf, got);
    }
    fclose(f);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    long long ns = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    return json_pack("[I I s]", (json_int_t)sb.st_size, (json_int_t)ns, hex);
}

static int is_model_file(const char *n) {
    size_t l = strlen(n);
    return (l > 12 && !strcmp(n + l - 12, ".safetensors")) || (l > 5 && !strcmp(n + l - 5, ".json"));
}

/* The model's identity by content, not by path: a checkpoint file's, or
 * every .safetensors and .json file of a Hub directory (weights and
 * shards, config, preprocessor, index), by name. */
static json_t *model_sig(const char *path) {
    struct stat sb;
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        int files = 0;
        while (d && (e = readdir(d)) && files < 4200) {
            char p[4096];
            json_t *k;
            if (!is_model_file(e->d_name) ||
                (size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= sizeof p ||
                !(k = json_hex(e->d_name)))
                continue;
            json_object_set_new(o, json_string_value(k), content_sig(p));
            json_decref(k);
            files++;
        }
        if (d)
            closedir(d);
    } else {
        json_object_set_new(o, "file", content_sig(path));
    }
    return o;
}

/* A private directory of this user: no link, its own, writable by no one
 * else; the cache is written only into one. */
static int private_dir(const char *dir) {
    struct stat sb;
    return lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
           !(sb.st_mode & (S_IWGRP | S_IWOTH));
}

/* Writes the cache: a temporary file of a name no one else can make (the
 * directory is private), renamed over cache: rename replaces a link planted
 * under cache's name instead of writing through it. NULL, or why not. */
static const char *save_cache(const char *dir, const char *cache, const char *key,
                              const char *names_text, const float *emb, int64_t rows,
                              int64_t dim) {
    char tmp[4200];
    if (!private_dir(dir))
        return "the cache folder is a link, someone else's, or writable by others";
    snprintf(tmp, sizeof tmp, "%s/.similar-tmp%ld", dir, (long)getpid());
    if (unlink(tmp) != 0 && errno != ENOENT)
        return strerror(errno);
    const char *tn[1] = {"embeddings"}, *mk[2] = {"vitc.similar", "vitc.similar.names"};
    const char *mv[2] = {key, names_text};
    int nd[1] = {2};
    int64_t shape[2] = {rows, dim};
    const int64_t *sh[1] = {shape};
    const float *dp[1] = {emb};
    if (vitc_safetensors_save(tmp, 1, tn, nd, sh, dp, 2, mk, mv) != VITC_OK)
        return vitc_last_error();
    struct stat sb;
    if (lstat(tmp, &sb) != 0 || !S_ISREG(sb.st_mode) || rename(tmp, cache) != 0) {
        const char *why = strerror(errno ? errno : EEXIST);
        unlink(tmp);
        return why;
    }
    return NULL;
}

static void free_names(char **v, int64_t n) {
    for (int64_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

/* The cached embeddings when the cache's signature is key: [*rows, dim],
 * with their images' names (bytes) in *names. NULL when absent or stale. */
static float *load_cache(const char *path, const char *key, int64_t dim, int64_t *rows,
                         char ***names) {
    vitc_safetensors *st;
    float *out = NULL;
    struct stat sb;
    /* a link is not the cache vitc wrote (it writes none), and reading
     * through one could block on a FIFO or read a stranger's file */
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        vitc_safetensors_load(path, &st) != VITC_OK)
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
        json_t *arr = names_plausible(nm, shape[0]) ? json_loads(nm, 0, &jerr) : NULL;
        int64_t n = json_is_array(arr) ? (int64_t)json_array_size(arr) : -1, got = 0;
        char **v = n == shape[0] ? calloc((size_t)(n ? n : 1), sizeof *v) : NULL;
        for (; v && got < n; got++)
            if (!(v[got] = unhex(json_string_value(json_array_get(arr, (size_t)got)))))
                break;
        if (v && got == n && (out = malloc((size_t)(n * dim) * sizeof(float) + 1))) {
            memcpy(out, data, (size_t)(n * dim) * sizeof(float));
            *rows = n;
            *names = v;
        } else {
            free_names(v, got);
        }
        json_decref(arr);
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
    char **names = NULL, **row_names = NULL, cache[4096] = "", dir[4000] = "", *key = NULL;
    char *names_text = NULL;
    int n = 0, failed = 0;
    int64_t dim = 0, rows = 0, n_row_names = 0;
    float *emb = NULL, *batch = NULL, *q = NULL;
    cli_ranked *rank = NULL;
    json_t *sig = json_array();
    cli_input in;
    int use_cache = !o.no_cache;
    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, 0, 0, 0, 0, 1};
    if (!sig) {
        rc = cli_error("out of memory");
        goto out;
    }
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
        char *ri = realpath(o.index, NULL), *id = NULL;
        /* the model by content, the precision too: its embeddings differ */
        json_t *k = json_pack(
            "{s o s o s s s s s s s i}", "index", json_hex(ri ? ri : o.index), "model",
            model_sig(o.model), "pool", "default", "precision",
            vitc_precision_name(vitc_vit_get_precision(m)), "attention_precision",
            vitc_precision_name(vitc_vit_get_attention_precision(m)), "dim", (int)dim);
        free(ri);
        /* the file name hashes what picks the cache; the images' signature
         * is only checked, so that an edited folder overwrites its own file */
        if (k && (id = json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS))) {
            char why[4400];
            if (use_cache && cache_folder(o.cache_dir, dir, sizeof dir, why, sizeof why) != 0) {
                /* paths from the environment and the command line: escaped */
                cli_warning("no index cache (%s); embedding %s every time", why, o.index);
                use_cache = 0;
            }
            if (use_cache)
                snprintf(cache, sizeof cache, "%s/similar-%016llx.safetensors", dir,
                         (unsigned long long)fnv1a(FNV_BASIS, id, strlen(id)));
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
        emb = load_cache(cache, key, dim, &rows, &row_names);
    n_row_names = rows;
    if (!emb) { /* embed the folder */
        json_t *done_names = json_array();
        if (!done_names || !(emb = malloc((size_t)(n ? n : 1) * (size_t)dim * sizeof(float))) ||
            !(row_names = calloc((size_t)(n ? n : 1), sizeof *row_names)) ||
            !(batch = malloc((size_t)o.batch * in.per_image * sizeof(float)))) {
            json_decref(done_names);
            rc = cli_error("out of memory for %d embeddings", n);
            goto out;
        }
        n_row_names = n;
        int next = 0;
        cli_progress pr;
        cli_progress_start(&pr, "similar: indexing", n, o.quiet);
        while (next < n) {
            int nb = 0;
            while (nb < o.batch && next < n) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", o.index, names[next]);
                json_t *h = NULL;
                if (cli_load_input(path, cfg, &in, batch + in.per_image * (size_t)nb) != VITC_OK) {
                    cli_progress_clear(&pr);
                    cli_error("%s", vitc_last_error());
                    failed++;
                } else if (!(h = json_hex(names[next])) ||
                           json_array_append_new(done_names, h) != 0 ||
                           !(row_names[rows + nb] = strdup(names[next]))) {
                    json_decref(done_names);
                    rc = cli_error("out of memory");
                    goto out;
                } else {
                    nb++;
                }
                next++;
            }
            if (nb && vitc_vit_embed(m, batch, nb, in.height, in.width, VITC_POOL_DEFAULT,
                                     emb + rows * dim) != VITC_OK) {
                json_decref(done_names);
                rc = cli_error("forward pass: %s", vitc_last_error());
                goto out;
            }
            rows += nb;
            cli_progress_update(&pr, next);
        }
        cli_progress_clear(&pr);
        cli_l2_normalize(emb, (size_t)rows, (size_t)dim);
        names_text = json_dumps(done_names, JSON_COMPACT);
        json_decref(done_names);
        const char *why = NULL;
        if (use_cache && (!names_text ? (why = "out of memory") != NULL
                                      : (why = save_cache(dir, cache, key, names_text, emb, rows,
                                                          dim)) != NULL)) {
            cli_warning("the index cache could not be written: %s", why);
        }
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
            char path[4096];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", o.index, row_names[r]);
            if (stat(path, &sb) == 0 && sb.st_dev == qsb.st_dev && sb.st_ino == qsb.st_ino)
                continue;
        }
        double s = 0.0;
        for (int64_t i = 0; i < dim; i++) s += (double)qe[i] * emb[r * dim + i];
        rank[kept].score = (float)s;
        rank[kept++].index = (int)r;
    }
    qsort(rank, (size_t)kept, sizeof *rank, cli_ranked_cmp);
    for (int64_t r = 0; r < kept && r < o.topk; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o.index, row_names[rank[r].index]);
        if (o.json) {
            /* a non-finite score is null, as classify prints it */
            fputs("{\"image\": ", stdout);
            cli_json_string(stdout, path);
            fputs(", \"score\": ", stdout);
            cli_json_number(stdout, (double)rank[r].score);
            fputs("}\n", stdout);
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
    free_names(row_names, n_row_names);
    free(key);
    free(names_text);
    free(emb);
    free(batch);
    free(q);
    free(rank);
    json_decref(sig);
    vitc_vit_free(m);
    return rc;
}
