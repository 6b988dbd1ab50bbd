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
 *
 * An index directory (index.h: the shards of `vitc embed --files-from`) is
 * read as it is, never cached or rebuilt: it names its model, and a query
 * by another model is refused.
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

#include "cache.h"
#include "cli.h"
#include "cli_text.h"
#include "index.h"

#define SIMILAR_MAX_FILES 1000000

static const char similar_usage[] =
    "usage: vitc similar --model M --index DIR [options] QUERY_IMAGE\n"
    "       vitc similar --model M --index DIR --text \"a dog on a beach\" [options]\n"
    "\n"
    "List the images of DIR (PNG/JPEG, not recursive) nearest to QUERY_IMAGE by\n"
    "cosine similarity of the model's default embedding (see vitc embed). DIR is\n"
    "embedded once and cached in $XDG_CACHE_HOME/vitc/similar/ (else\n"
    "~/.cache/vitc/similar/), one file per folder, model and precision, never in\n"
    "DIR; it is rebuilt when an image's name, size or time changes, or the model's\n"
    "content. QUERY_IMAGE itself, when it is one of DIR's images, is left out of\n"
    "the results. With --text, a CLIP or SigLIP checkpoint with both towers ranks\n"
    "the images by the cosine of their embeddings with the text's (text search;\n"
    "the same cached index).\n"
    "\n"
    "DIR may instead be an index directory that vitc embed --files-from LIST\n"
    "--out DIR wrote (it holds index.json): its shards are read as one index,\n"
    "and the query is embedded with the index's precision, pooling and crop.\n"
    "\n"
    "options:\n"
    "  --model M      checkpoint file or Hugging Face Hub directory\n"
    "  --arch NAME    architecture of a file without vitc.config metadata\n"
    "  --index DIR    the folder of images, or an index directory\n"
    "  --text T       search by the text T instead of a query image\n"
    "  --topk K       results, 1.. (default 5)\n"
    "  --batch B      images per forward pass, 1..4096 (default 8)\n"
    "  --threads N    threads, 1..256\n"
    "  --precision P  fp32, bf16 or int8 arithmetic of the weight GEMMs (default\n"
    "                 fp32; a change rebuilds the cache)\n"
    "  --attention-precision A\n"
    "                 fp32, bf16 or int8 operands of the attention's q k^T and P v\n"
    "                 (default fp32; a change rebuilds the cache)\n"
    "  --cache DIR    keep the index cache in DIR (created if missing)\n"
    "  --no-cache     embed the folder every time; write no cache\n"
    "  --json         one JSON object per result: {\"image\", \"score\"}\n"
    "  --quiet        no progress on stderr\n"
    "  -h, --help     this help\n";

typedef struct similar_opts {
    const char *model, *arch, *index, *precision, *attn_precision, *cache_dir, *text;
    int topk, batch, threads, json, quiet, no_cache;
    char *query;
} similar_opts;

static int is_image_name(const char *n) {
    const char *dot = strrchr(n, '.');
    return n[0] != '.' && dot &&
           (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
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
        json_t *e = json_pack("[o I I]", cache_json_hex((*names)[i]), (json_int_t)sb.st_size,
                              (json_int_t)ns);
        if (!e || json_array_append_new(sig, e) != 0)
            return cli_error("out of memory");
    }
    return CLI_OK;
}

/* The index cache: the embeddings, the key and the images' names. */
static const char *similar_save(const char *dir, const char *cache, const char *key,
                                const char *names_text, const float *emb, int64_t rows,
                                int64_t dim) {
    const char *mk[2] = {"vitc.similar", "vitc.similar.names"}, *mv[2] = {key, names_text};
    return cache_save(dir, cache, "similar", "embeddings", emb, rows, dim, 2, mk, mv);
}

static void free_names(char **v, int64_t n) {
    for (int64_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

/* The cached embeddings when the cache's signature is key: [*rows, dim],
 * with their images' names (bytes) in *names. NULL when absent or stale. */
static float *load_cache(const char *path, const char *key, int64_t dim, int64_t *rows,
                         char ***names) {
    float *out = NULL;
    const float *data;
    int64_t shape0;
    vitc_safetensors *st =
        cache_open(path, "vitc.similar", key, "embeddings", dim, &data, &shape0);
    const char *nm = st ? vitc_safetensors_get_metadata(st, "vitc.similar.names") : NULL;
    if (nm) {
        json_error_t jerr;
        json_t *arr = names_plausible(nm, shape0) ? json_loads(nm, 0, &jerr) : NULL;
        int64_t n = json_is_array(arr) ? (int64_t)json_array_size(arr) : -1, got = 0;
        char **v = n == shape0 ? calloc((size_t)(n ? n : 1), sizeof *v) : NULL;
        for (; v && got < n; got++)
            if (!(v[got] = cache_unhex(json_string_value(json_array_get(arr, (size_t)got)))))
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

/* A row's image: dir/name for a folder's, the path as listed (dir NULL)
 * for an index directory's. */
static void similar_row_path(char *buf, size_t cap, const char *dir, const char *name) {
    if (dir)
        snprintf(buf, cap, "%s/%s", dir, name);
    else
        snprintf(buf, cap, "%s", name);
}

/* The query (image or text) against emb [rows, dim], L2-normalised: the
 * topk rows printed, the query itself left out. CLI_OK or reported. */
static int similar_rank(const similar_opts *o, vitc_vit *m, const vitc_vit_config *cfg,
                        const cli_input *in, vitc_pool pool, const float *emb, int64_t rows,
                        int64_t dim, char *const *row_names, const char *dir) {
    int rc;
    float *q = NULL; /* [per_image + dim]: the query's pixels, then its embedding */
    cli_ranked *rank = NULL;
    /* The query. */
    if (!(q = malloc(in->per_image * sizeof(float) + (size_t)dim * sizeof(float)))) {
        rc = cli_error("out of memory");
        goto done;
    }
    float *qe = q + in->per_image;
    if (o->text ? vitc_vit_text_dim(m) != dim ||
                     vitc_vit_encode_text(m, (const char *const *)&o->text, 1, qe) != VITC_OK
               : cli_load_input(o->query, cfg, in, q) != VITC_OK ||
                     vitc_vit_embed(m, q, 1, in->height, in->width, pool, qe) !=
                         VITC_OK) {
        rc = o->text && vitc_vit_text_dim(m) != dim
                 ? cli_error("%s: the text embedding has %d floats, the image embedding %lld",
                             o->model, vitc_vit_text_dim(m), (long long)dim)
                 : cli_error("%s", vitc_last_error());
        goto done;
    }
    cli_l2_normalize(qe, 1, (size_t)dim);
    if (!(rank = malloc((size_t)(rows ? rows : 1) * sizeof *rank))) {
        rc = cli_error("out of memory");
        goto done;
    }
    /* The query, when it is one of the folder's files (by device and inode,
     * whatever path names it), would always rank itself first. */
    struct stat qsb;
    int have_q = o->query && stat(o->query, &qsb) == 0;
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (have_q) {
            char path[4096];
            struct stat sb;
            similar_row_path(path, sizeof path, dir, row_names[r]);
            if (stat(path, &sb) == 0 && sb.st_dev == qsb.st_dev && sb.st_ino == qsb.st_ino)
                continue;
        }
        double s = 0.0;
        for (int64_t i = 0; i < dim; i++) s += (double)qe[i] * emb[r * dim + i];
        rank[kept].score = (float)s;
        rank[kept++].index = (int)r;
    }
    qsort(rank, (size_t)kept, sizeof *rank, cli_ranked_cmp);
    for (int64_t r = 0; r < kept && r < o->topk; r++) {
        char path[4096];
        similar_row_path(path, sizeof path, dir, row_names[rank[r].index]);
        if (o->json) {
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
    rc = fflush(stdout) != 0 ? cli_error("cannot write the output") : CLI_OK;
done:
    free(q);
    free(rank);
    return rc;
}

/* --index DIR made by `vitc embed --files-from LIST --out DIR`: its shards
 * as one index, the query embedded as they were (the index's precisions,
 * pooling and preprocessing) by the model that made them. */
static int similar_index(const similar_opts *o) {
    index_data d;
    vitc_vit *m = NULL;
    cli_input in;
    json_t *id = NULL;
    int rc = index_load(o->index, &d);
    if (rc != CLI_OK)
        return rc;
    const char *prec = json_string_value(json_object_get(d.key, "precision"));
    const char *attn = json_string_value(json_object_get(d.key, "attention_precision"));
    const char *pool_name = json_string_value(json_object_get(d.key, "pool"));
    int crop = (int)json_integer_value(json_object_get(d.key, "crop"));
    int resize = (int)json_integer_value(json_object_get(d.key, "resize"));
    static const char *const pools[] = {"default", "cls", "mean"};
    int pool = -1;
    for (int i = 0; pool_name && i < 3; i++)
        if (!strcmp(pool_name, pools[i]))
            pool = i;
    if (!prec || !attn || pool < 0 || crop < -1 || crop > 16384 || resize < -1 ||
        resize > 16384) {
        rc = cli_error("--index %s: %s/%s is damaged (its precision, pooling or crop)", o->index,
                       o->index, INDEX_MANIFEST);
        goto done;
    }
    /* a query at another precision would rank against embeddings it is not
     * comparable with bit for bit: the index's settings, or a refusal */
    if ((o->precision && strcmp(o->precision, prec)) ||
        (o->attn_precision && strcmp(o->attn_precision, "auto") &&
         strcmp(o->attn_precision, attn))) { /* auto: the index's, as without the option */
        rc = cli_error("--index %s was embedded at --precision %s --attention-precision %s; "
                       "drop the option or rebuild the index", o->index, prec, attn);
        goto done;
    }
    const cli_model_opts mo = {o->model, o->arch, prec, attn, crop, crop >= 0,
                               resize, resize >= 0, 1};
    if ((rc = cli_open_model("similar", &mo, &m, &in)) != CLI_OK ||
        (o->text && (rc = cli_text_model(o->model, m)) != CLI_OK))
        goto done;
    if (!(id = index_model_id(o->model)) || !json_equal(id, json_object_get(d.key, "model"))) {
        rc = cli_error("--index %s was made by another model than %s (%s/%s names the model "
                       "by its files' sizes and contents); give that model", o->index, o->model,
                       o->index, INDEX_MANIFEST);
        goto done;
    }
    int64_t dim;
    if (vitc_vit_embed_size(m, (vitc_pool)pool, in.height, in.width, &dim) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (dim != d.dim) {
        rc = cli_error("--index %s holds embeddings of %lld floats, %s gives %lld", o->index,
                       (long long)d.dim, o->model, (long long)dim);
        goto done;
    }
    cli_l2_normalize(d.emb, (size_t)d.rows, (size_t)d.dim);
    rc = similar_rank(o, m, vitc_vit_get_config(m), &in, (vitc_pool)pool, d.emb, d.rows, d.dim,
                      d.paths, NULL);
done:
    json_decref(id);
    index_data_free(&d);
    vitc_vit_free(m);
    return rc;
}

int cmd_similar(int argc, char **argv) {
    similar_opts o = {0};
    o.topk = 5;
    o.batch = 8;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o.model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o.arch, 0, 0, NULL},
        {"--index", NULL, CLI_STRING, &o.index, 0, 0, NULL},
        {"--text", NULL, CLI_STRING, &o.text, 0, 0, NULL},
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
    if (!o.model || !o.index || n_pos != !o.text)
        return cli_usage_error("similar", o.text ? "--model and --index are required; --text "
                                                   "stands for the query image"
                                                 : "--model, --index and one query image are "
                                                   "required");
    if (o.text && (rc = cli_check_text("--text", o.text)) != CLI_OK)
        return rc;
    if (o.no_cache && o.cache_dir)
        return cli_usage_error("similar", "--cache and --no-cache exclude each other");
    o.query = o.text ? NULL : pos[0];
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    if (index_is_dir(o.index))
        return similar_index(&o);

    vitc_vit *m = NULL;
    char **names = NULL, **row_names = NULL, cache[4096] = "", dir[4000] = "", *key = NULL;
    char *names_text = NULL;
    int n = 0, failed = 0;
    int64_t dim = 0, rows = 0, n_row_names = 0;
    float *emb = NULL, *batch = NULL;
    json_t *sig = json_array();
    cli_input in;
    int use_cache = !o.no_cache;
    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, 0, 0, 0, 0, 1};
    if (!sig) {
        rc = cli_error("out of memory");
        goto out;
    }
    if ((rc = cli_open_model("similar", &mo, &m, &in)) != CLI_OK ||
        (o.text && (rc = cli_text_model(o.model, m)) != CLI_OK))
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
            "{s o s o s s s s s s s i}", "index", cache_json_hex(ri ? ri : o.index), "model",
            cache_model_sig(o.model, 0), "pool", "default", "precision",
            vitc_precision_name(vitc_vit_get_precision(m)), "attention_precision",
            vitc_precision_name(vitc_vit_get_attention_precision(m)), "dim", (int)dim);
        free(ri);
        /* the file name hashes what picks the cache; the images' signature
         * is only checked, so that an edited folder overwrites its own file */
        if (k && (id = json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS))) {
            char why[4400];
            if (use_cache && cache_folder(o.cache_dir, "similar", dir, sizeof dir, why, sizeof why) != 0) {
                /* paths from the environment and the command line: escaped */
                cli_warning("no index cache (%s); embedding %s every time", why, o.index);
                use_cache = 0;
            }
            if (use_cache)
                snprintf(cache, sizeof cache, "%s/similar-%016llx.safetensors", dir,
                         (unsigned long long)cache_fnv1a(CACHE_FNV_BASIS, id, strlen(id)));
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
                } else if (!(h = cache_json_hex(names[next])) ||
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
                                      : (why = similar_save(dir, cache, key, names_text, emb, rows, dim)) != NULL)) {
            cli_warning("the index cache could not be written: %s", why);
        }
    }
    rc = similar_rank(&o, m, cfg, &in, VITC_POOL_DEFAULT, emb, rows, dim, row_names, o.index);
    if (rc == CLI_OK && failed)
        rc = CLI_FAIL;
out:
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free_names(row_names, n_row_names);
    free(key);
    free(names_text);
    free(emb);
    free(batch);
    json_decref(sig);
    vitc_vit_free(m);
    return rc;
}
