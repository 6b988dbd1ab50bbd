/*
 * cache.c — the embedding caches of `vitc similar` and `vitc zero-shot`
 * (cache.h): where they live, the model's key by content, and the write
 * that never follows a link.
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

uint64_t cache_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

json_t *cache_json_hex(const char *s) {
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

char *cache_unhex(const char *h) {
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

/* Relative XDG values are ignored, as the XDG spec says. */
int cache_folder(const char *given, const char *sub, char *dir, size_t cap, char *why,
                 size_t why_cap) {
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
        snprintf(dir, cap, "%s/vitc/%s", xdg, sub);
        if (usable_dir(dir))
            return 0;
        tried = "$XDG_CACHE_HOME", err = errno ? errno : ENOTDIR;
    }
    if (home && home[0] == '/') {
        snprintf(dir, cap, "%s/.cache/vitc/%s", home, sub);
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

/* What the key hashes of a file: a .safetensors file's header (8 bytes and
 * the JSON, where every tensor's name, dtype, shape and offsets are) and
 * CACHE_HASH_SAMPLES blocks of its data spread evenly (weights retrained
 * in place keep the header), any other file whole, up to this. The rest of
 * a weights file is covered by its size and time: reading gigabytes of
 * weights on every query would cost more than the embeddings save. */
#define CACHE_HASH_MAX_BYTES (64LL << 20)
#define CACHE_HASH_SAMPLES 64
#define CACHE_HASH_BLOCK 4096

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
    int64_t want = size < CACHE_HASH_MAX_BYTES ? size : CACHE_HASH_MAX_BYTES;
    size_t pl = strlen(path);
    unsigned char buf[65536];
    uint64_t h = CACHE_FNV_BASIS;
    int weights = pl > 12 && !strcmp(path + pl - 12, ".safetensors");
    if (weights) {
        unsigned char n8[8];
        if (fread(n8, 1, 8, f) == 8) {
            uint64_t hl = 0;
            for (int i = 7; i >= 0; i--) hl = hl << 8 | n8[i];
            h = cache_fnv1a(h, n8, 8);
            want = hl < (uint64_t)want - 8 ? (int64_t)hl : want - 8;
        } else {
            want = 0;
        }
    }
    while (want > 0) {
        size_t got = fread(buf, 1, want < (int64_t)sizeof buf ? (size_t)want : sizeof buf, f);
        if (got == 0)
            break;
        h = cache_fnv1a(h, buf, got);
        want -= (int64_t)got;
    }
    /* the data: blocks at evenly spaced offsets of what follows the header */
    long long data0 = weights ? (long long)ftello(f) : size, span = size - data0;
    for (int i = 0; weights && span > 0 && i < CACHE_HASH_SAMPLES; i++) {
        long long at = data0 + span / CACHE_HASH_SAMPLES * i;
        size_t got;
        if (fseeko(f, (off_t)at, SEEK_SET) != 0 || (got = fread(buf, 1, CACHE_HASH_BLOCK, f)) == 0)
            break;
        h = cache_fnv1a(h, buf, got);
    }
    fclose(f);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    long long ns = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    return json_pack("[I I s]", (json_int_t)sb.st_size, (json_int_t)ns, hex);
}

static int ends_with(const char *n, const char *suffix) {
    size_t l = strlen(n), s = strlen(suffix);
    return l > s && !strcmp(n + l - s, suffix);
}

static int is_model_file(const char *n, int text) {
    return ends_with(n, ".safetensors") || ends_with(n, ".json") ||
           (text && (!strcmp(n, "merges.txt") || ends_with(n, ".model") || ends_with(n, ".txt.gz")));
}

json_t *cache_model_sig(const char *path, int text) {
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
            if (!is_model_file(e->d_name, text) ||
                (size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= sizeof p ||
                !(k = cache_json_hex(e->d_name)))
                continue;
            json_object_set_new(o, json_string_value(k), content_sig(p));
            json_decref(k);
            files++;
        }
        if (d)
            closedir(d);
    } else {
        json_object_set_new(o, "file", content_sig(path));
        /* a file inside a Hub directory reads its config and tokenizer
         * there: text embeddings depend on them */
        char dir[4096];
        const char *slash = strrchr(path, '/');
        int len = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
        if (text && (size_t)snprintf(dir, sizeof dir, "%.*s", len, slash ? path : ".") <
                        sizeof dir)
            json_object_set_new(o, "dir", cache_model_sig(dir, 1));
    }
    return o;
}

/* A private directory of this user: no link, its own, writable by no one
 * else; a cache is written only into one. */
static int private_dir(const char *dir) {
    struct stat sb;
    return lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
           !(sb.st_mode & (S_IWGRP | S_IWOTH));
}

/* The temporary file has a name no one else can make (the directory is
 * private); rename replaces a link planted under path's name instead of
 * writing through it. */
const char *cache_save(const char *dir, const char *path, const char *tmp_tag,
                       const char *tensor, const float *data, int64_t rows, int64_t dim,
                       int n_meta, const char *const *meta_keys, const char *const *meta_vals) {
    char tmp[4200];
    if (!private_dir(dir))
        return "the cache folder is a link, someone else's, or writable by others";
    snprintf(tmp, sizeof tmp, "%s/.%s-tmp%ld", dir, tmp_tag, (long)getpid());
    if (unlink(tmp) != 0 && errno != ENOENT)
        return strerror(errno);
    const char *tn[1] = {tensor};
    int nd[1] = {2};
    int64_t shape[2] = {rows, dim};
    const int64_t *sh[1] = {shape};
    const float *dp[1] = {data};
    if (vitc_safetensors_save(tmp, 1, tn, nd, sh, dp, n_meta, meta_keys, meta_vals) != VITC_OK)
        return vitc_last_error();
    struct stat sb;
    errno = 0;
    if (lstat(tmp, &sb) != 0 || !S_ISREG(sb.st_mode) || rename(tmp, path) != 0) {
        const char *why = strerror(errno ? errno : EEXIST);
        unlink(tmp);
        return why;
    }
    return NULL;
}

vitc_safetensors *cache_open(const char *path, const char *key_name, const char *key,
                             const char *tensor, int64_t dim, const float **data, int64_t *rows) {
    vitc_safetensors *st;
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        vitc_safetensors_load(path, &st) != VITC_OK)
        return NULL;
    const char *k = vitc_safetensors_get_metadata(st, key_name);
    int i = vitc_safetensors_find(st, tensor);
    const char *name, *dt;
    int nd;
    const int64_t *shape;
    if (k && !strcmp(k, key) && i >= 0 &&
        vitc_safetensors_tensor(st, i, &name, &dt, &nd, &shape, data) == VITC_OK && nd == 2 &&
        shape[1] == dim) {
        *rows = shape[0];
        return st;
    }
    vitc_safetensors_free(st);
    return NULL;
}
