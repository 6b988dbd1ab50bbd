/*
 * index.c — the embedding index directory (index.h): the list, the shards
 * and the manifest, written atomically and read back whole.
 *
 * Everything a reader trusts is checked against what the writer would have
 * made: shard file names are computed, never taken from the manifest (a
 * manifest naming "../x" reads nothing outside DIR); each shard carries a
 * hash of its embeddings, so a flipped byte is a damaged shard, not a
 * silently wrong ranking.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "cache.h"
#include "cli.h"
#include "index.h"

/* a list of 100 million paths is far below this; a larger file is not a list */
#define INDEX_LIST_MAX_BYTES (16LL << 30)
#define INDEX_MANIFEST_MAX_BYTES (64LL << 20)

void index_free_paths(char **paths, int64_t n) {
    for (int64_t i = 0; paths && i < n; i++) free(paths[i]);
    free(paths);
}

int index_read_list(const char *path, char ***paths, int *n) {
    FILE *f;
    int64_t size;
    *paths = NULL;
    *n = 0;
    if (vitc_open_read(path, INDEX_LIST_MAX_BYTES, &f, &size) != VITC_OK)
        return cli_error("--files-from %s: %s", path, vitc_last_error());
    char *buf = malloc((size_t)size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)size) {
        free(buf);
        return cli_error("--files-from %s: %s", path, buf ? "read error" : "out of memory");
    }
    buf[got] = 0;
    if (memchr(buf, 0, got)) {
        free(buf);
        return cli_error("--files-from %s: a NUL byte (not a list of paths, one a line)", path);
    }
    int cap = 0, oom = 0;
    for (char *p = buf; p < buf + got && !oom;) {
        char *e = memchr(p, '\n', (size_t)(buf + got - p));
        size_t step = e ? (size_t)(e - p) + 1 : (size_t)(buf + got - p), len = step - !!e;
        if (len && p[len - 1] == '\r')
            len--;
        if (len) { /* blank lines (a list's last, one made by hand) are not paths */
            if (*n >= INDEX_MAX_LIST) {
                free(buf);
                return cli_error("--files-from %s: more than %d paths", path, INDEX_MAX_LIST);
            }
            if (*n == cap) {
                char **g = realloc(*paths, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *g);
                if (!g)
                    oom = 1;
                else
                    *paths = g;
            }
            if (!oom && !((*paths)[*n] = strndup(p, len)))
                oom = 1;
            *n += !oom;
        }
        p += step;
    }
    free(buf);
    if (oom)
        return cli_error("--files-from %s: out of memory", path);
    if (*n == 0)
        return cli_error("--files-from %s: no paths (one image a line)", path);
    return CLI_OK;
}

void index_list_hash(char *const *paths, int n, char hex[17]) {
    uint64_t h = CACHE_FNV_BASIS;
    for (int i = 0; i < n; i++) h = cache_fnv1a(h, paths[i], strlen(paths[i]) + 1);
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

void index_share(int n, int r, int k, int *first, int *count) {
    /* contiguous, so that the shards in rank order are LIST in order */
    int64_t a = (int64_t)n * r / k, b = (int64_t)n * (r + 1) / k;
    *first = (int)a;
    *count = (int)(b - a);
}

void index_shard_name(char *buf, size_t cap, int r, int k) {
    snprintf(buf, cap, "shard-%05d-of-%05d.safetensors", r, k);
}

json_t *index_model_id(const char *model) {
    json_t *sig = cache_model_sig(model, 0), *v;
    const char *name;
    json_object_foreach(sig, name, v) {
        if (json_is_array(v) && json_array_size(v) == 3)
            json_array_remove(v, 1); /* [size, mtime_ns, hash] -> [size, hash] */
    }
    return sig;
}

static uint64_t data_hash(const float *emb /* [rows, dim] */, int64_t rows, int64_t dim) {
    return cache_fnv1a(CACHE_FNV_BASIS, emb, (size_t)(rows * dim) * sizeof(float));
}

/* The shard body: place (when given) and the hash match, the tensor is
 * [*rows, dim] (dim < 0: any, set), the paths one per row (decoded into
 * *paths when paths is not NULL). 0, or -1 with why. */
static int shard_body(vitc_safetensors *st, const char *place, int64_t *dim, int64_t *rows,
                      const float **data, char ***paths, char *why, size_t cap) {
    const char *pl = vitc_safetensors_get_metadata(st, "vitc.index.shard");
    const char *pt = vitc_safetensors_get_metadata(st, "vitc.index.paths");
    const char *hs = vitc_safetensors_get_metadata(st, "vitc.index.fnv1a64");
    int i = vitc_safetensors_find(st, "embeddings"), nd;
    const char *name, *dt;
    const int64_t *shape;
    if (!pl || !pt || !hs || i < 0 ||
        vitc_safetensors_tensor(st, i, &name, &dt, &nd, &shape, data) != VITC_OK || nd != 2)
        return snprintf(why, cap, "its embeddings, paths or hash are missing"), -1;
    if (place && strcmp(pl, place))
        return snprintf(why, cap, "it holds another part of the list (%s, not %s)", pl, place), -1;
    if (*dim >= 0 && shape[1] != *dim)
        return snprintf(why, cap, "its embeddings have %lld floats, not %lld",
                        (long long)shape[1], (long long)*dim), -1;
    *dim = shape[1];
    *rows = shape[0];
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)data_hash(*data, *rows, *dim));
    if (strcmp(hex, hs))
        return snprintf(why, cap, "its embeddings do not match their hash (changed or torn)"), -1;
    json_error_t jerr;
    json_t *arr = json_loads(pt, 0, &jerr);
    int ok = json_is_array(arr) && (int64_t)json_array_size(arr) == *rows;
    if (ok && paths) {
        char **v = calloc((size_t)(*rows ? *rows : 1), sizeof *v);
        int64_t got = 0;
        for (; v && got < *rows; got++)
            if (!(v[got] = cache_unhex(json_string_value(json_array_get(arr, (size_t)got)))))
                break;
        if ((ok = v && got == *rows))
            *paths = v;
        else
            index_free_paths(v, got);
    }
    json_decref(arr);
    if (!ok)
        return snprintf(why, cap, "its paths are not one hex string per row"), -1;
    return 0;
}

int index_shard_state(const char *path, const char *key, const char *place, int64_t dim,
                      int64_t *rows, char *why, size_t why_cap) {
    struct stat sb;
    vitc_safetensors *st;
    const float *data;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return INDEX_SHARD_ABSENT;
        snprintf(why, why_cap, "%s", strerror(errno));
        return INDEX_SHARD_FOREIGN;
    }
    if (!S_ISREG(sb.st_mode))
        return snprintf(why, why_cap, "not a regular file"), INDEX_SHARD_FOREIGN;
    if (vitc_safetensors_load(path, &st) != VITC_OK)
        return snprintf(why, why_cap, "%s", vitc_last_error()), INDEX_SHARD_DAMAGED;
    const char *k = vitc_safetensors_get_metadata(st, "vitc.index");
    int state = INDEX_SHARD_DONE;
    if (!k) {
        snprintf(why, why_cap, "a safetensors file that is no vitc index shard");
        state = INDEX_SHARD_FOREIGN;
    } else if (strcmp(k, key)) {
        snprintf(why, why_cap, "a shard of another model, list or options (its key differs)");
        state = INDEX_SHARD_FOREIGN;
    } else if (shard_body(st, place, &dim, rows, &data, NULL, why, why_cap) != 0) {
        state = INDEX_SHARD_DAMAGED;
    }
    vitc_safetensors_free(st);
    return state;
}

const char *index_save_shard(const char *path, const char *key, const char *place,
                             const float *emb /* [rows, dim] */, int64_t rows, int64_t dim,
                             const char *const *paths, int failed) {
    json_t *arr = json_array();
    for (int64_t r = 0; arr && r < rows; r++)
        if (json_array_append_new(arr, cache_json_hex(paths[r])) != 0) {
            json_decref(arr);
            arr = NULL;
        }
    char *pt = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    if (!pt)
        return "out of memory";
    char hex[17], nf[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)data_hash(emb, rows, dim));
    snprintf(nf, sizeof nf, "%d", failed);
    const char *mk[5] = {"vitc.index", "vitc.index.shard", "vitc.index.paths",
                         "vitc.index.fnv1a64", "vitc.index.failed"};
    const char *mv[5] = {key, place, pt, hex, nf};
    const char *tn[1] = {"embeddings"};
    int nd[1] = {2};
    int64_t shape[2] = {rows, dim};
    const int64_t *sh[1] = {shape};
    float dummy = 0.0f; /* no rows: a valid pointer to zero bytes */
    const float *dp[1] = {rows ? emb : &dummy};
    vitc_status s = vitc_safetensors_save(path, 1, tn, nd, sh, dp, 5, mk, mv);
    free(pt);
    return s == VITC_OK ? NULL : vitc_last_error();
}

void index_sweep_temps(const char *dir, const char *name) {
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t len = strlen(name);
    while (d && (e = readdir(d))) {
        /* the library's temporary names: NAME.tmpPID.N */
        if (strncmp(e->d_name, name, len) || strncmp(e->d_name + len, ".tmp", 4))
            continue;
        char p[4200];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < sizeof p)
            unlink(p);
    }
    if (d)
        closedir(d);
}

int index_other_shards(const char *dir, int k, char *name, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        int r, kk, end = 0;
        if (sscanf(e->d_name, "shard-%5d-of-%5d.safetensors%n", &r, &kk, &end) == 2 &&
            end > 0 && e->d_name[end] == 0 && kk != k) {
            snprintf(name, cap, "%s", e->d_name);
            found = 1;
        }
    }
    if (d)
        closedir(d);
    return found;
}

int index_save_manifest(const char *dir, const char *key, int k, int n_entries,
                        const long long *rows, const long long *bytes) {
    json_error_t jerr;
    json_t *kobj = json_loads(key, 0, &jerr), *shards = json_array();
    long long total = 0;
    for (int r = 0; shards && r < k; r++) {
        char name[64];
        int first, count;
        index_shard_name(name, sizeof name, r, k);
        index_share(n_entries, r, k, &first, &count);
        json_array_append_new(shards, json_pack("{s s s i s i s i s I s I}", "file", name, "rank",
                                                r, "first", first, "entries", count, "rows",
                                                (json_int_t)rows[r], "bytes",
                                                (json_int_t)bytes[r]));
        total += rows[r];
    }
    json_t *m = kobj && shards
                    ? json_pack("{s s s i s O s i s I s O}", "format", INDEX_FORMAT, "version",
                                INDEX_VERSION, "key", kobj, "entries", n_entries, "rows",
                                (json_int_t)total, "shards", shards)
                    : NULL;
    char *text = m ? json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(m);
    json_decref(kobj);
    json_decref(shards);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_MANIFEST);
    if (!text)
        return cli_error("%s: out of memory", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps' NUL: the file ends with a newline instead */
    int rc = vitc_save_bytes(path, text, len + 1) == VITC_OK ? CLI_OK
                                                             : cli_error("%s", vitc_last_error());
    free(text);
    return rc;
}

int index_is_dir(const char *dir) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_MANIFEST);
    return lstat(path, &sb) == 0;
}

/* dir's manifest, checked for its format; NULL with why. */
static json_t *load_manifest(const char *dir, char *why, size_t cap) {
    char path[4200];
    FILE *f;
    int64_t size;
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_MANIFEST);
    if (vitc_open_read(path, INDEX_MANIFEST_MAX_BYTES, &f, &size) != VITC_OK)
        return snprintf(why, cap, "%s", vitc_last_error()), NULL;
    json_error_t jerr;
    json_t *m = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!m)
        return snprintf(why, cap, "%s: not JSON (line %d: %s)", path, jerr.line, jerr.text), NULL;
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (!fmt || strcmp(fmt, INDEX_FORMAT) ||
        json_integer_value(json_object_get(m, "version")) != INDEX_VERSION ||
        !json_is_object(json_object_get(m, "key"))) {
        json_decref(m);
        return snprintf(why, cap, "%s: not a version-%d vitc embedding index manifest", path,
                        INDEX_VERSION), NULL;
    }
    return m;
}

char *index_manifest_key(const char *dir, char *why, size_t why_cap) {
    json_t *m = load_manifest(dir, why, why_cap);
    char *k = m ? json_dumps(json_object_get(m, "key"), JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (m && !k)
        snprintf(why, why_cap, "out of memory");
    json_decref(m);
    return k;
}

void index_data_free(index_data *d) {
    json_decref(d->key);
    free(d->key_str);
    free(d->emb);
    index_free_paths(d->paths, d->rows);
    memset(d, 0, sizeof *d);
}

int index_load(const char *dir, index_data *d) {
    char why[4400];
    memset(d, 0, sizeof *d);
    json_t *m = load_manifest(dir, why, sizeof why);
    if (!m)
        return cli_error("--index %s: %s", dir, why);
    json_t *shards = json_object_get(m, "shards");
    d->key = json_incref(json_object_get(m, "key"));
    d->key_str = json_dumps(d->key, JSON_COMPACT | JSON_SORT_KEYS);
    json_int_t k = json_integer_value(json_object_get(d->key, "shards"));
    json_int_t n = json_integer_value(json_object_get(m, "entries"));
    json_int_t total = json_integer_value(json_object_get(m, "rows"));
    d->dim = json_integer_value(json_object_get(d->key, "dim"));
    int rc = CLI_OK;
    if (!d->key_str || k < 1 || k > INDEX_MAX_SHARDS || !json_is_array(shards) ||
        (json_int_t)json_array_size(shards) != k || n < 0 || n > INDEX_MAX_LIST ||
        total < 0 || total > n || d->dim < 1 || d->dim > (1 << 24)) {
        rc = cli_error("--index %s: %s/%s is damaged (its shards, sizes or key do not add up)",
                       dir, dir, INDEX_MANIFEST);
        goto done;
    }
    if (!(d->emb = malloc((size_t)(total ? total : 1) * (size_t)d->dim * sizeof(float))) ||
        !(d->paths = calloc((size_t)(total ? total : 1), sizeof *d->paths))) {
        rc = cli_error("--index %s: out of memory for %lld embeddings", dir, (long long)total);
        goto done;
    }
    for (int r = 0; r < (int)k && rc == CLI_OK; r++) {
        json_t *s = json_array_get(shards, (size_t)r);
        char name[64], path[4200], place[128];
        int first, count;
        index_shard_name(name, sizeof name, r, (int)k);
        index_share((int)n, r, (int)k, &first, &count);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        snprintf(place, sizeof place, "{\"entries\":%d,\"first\":%d,\"rank\":%d}", count, first, r);
        json_int_t rows = json_integer_value(json_object_get(s, "rows"));
        json_int_t bytes = json_integer_value(json_object_get(s, "bytes"));
        const char *file = json_string_value(json_object_get(s, "file"));
        struct stat sb;
        vitc_safetensors *st = NULL;
        const float *data;
        int64_t got = 0, dim = d->dim;
        char **paths = NULL;
        const char *k2;
        if (!file || strcmp(file, name) || rows < 0 || rows > total - d->rows)
            rc = cli_error("--index %s: %s/%s is damaged (its entry for shard %d)", dir, dir,
                           INDEX_MANIFEST, r);
        else if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            rc = cli_error("%s: missing (%s lists it): rerun the vitc embed that made %s",
                           path, INDEX_MANIFEST, dir);
        else if ((long long)sb.st_size != (long long)bytes)
            rc = cli_error("%s: damaged: %lld bytes, %s says %lld; delete it and rerun the "
                           "vitc embed that made %s", path, (long long)sb.st_size,
                           INDEX_MANIFEST, (long long)bytes, dir);
        else if (vitc_safetensors_load(path, &st) != VITC_OK)
            rc = cli_error("%s: damaged (%s); delete it and rerun the vitc embed that made %s",
                           path, vitc_last_error(), dir);
        else if (!(k2 = vitc_safetensors_get_metadata(st, "vitc.index")) || strcmp(k2, d->key_str))
            rc = cli_error("%s: made by another model, list or options than %s/%s says; "
                           "one index holds one model's embeddings", path, dir, INDEX_MANIFEST);
        else if (shard_body(st, place, &dim, &got, &data, &paths, why, sizeof why) != 0)
            rc = cli_error("%s: damaged: %s", path, why);
        else if (got != rows) {
            rc = cli_error("%s: damaged: %lld rows, %s says %lld", path, (long long)got,
                           INDEX_MANIFEST, (long long)rows);
            index_free_paths(paths, got);
        } else {
            memcpy(d->emb + d->rows * d->dim, data, (size_t)(got * d->dim) * sizeof(float));
            memcpy(d->paths + d->rows, paths, (size_t)got * sizeof *paths);
            free(paths); /* the strings are d->paths' now */
            d->rows += got;
        }
        vitc_safetensors_free(st);
    }
done:
    json_decref(m);
    if (rc != CLI_OK)
        index_data_free(d);
    return rc;
}
