/*
 * dataset.c — training data: IDX files (MNIST, Fashion-MNIST; raw or gzip)
 * and ImageFolder trees, turned into normalized, augmented batches.
 *
 * Memory: an IDX dataset keeps its images once, as the file's bytes (uint8,
 * 47 MB for Fashion-MNIST's training set); an ImageFolder keeps only its
 * file list and decodes each image when a batch asks for it, so a tree
 * larger than memory streams from disk.
 *
 * Randomness: every random choice of a sample (crop offset, flip, the
 * resized crop's box) comes from a generator seeded with the batch's seed
 * and the sample's place in the batch, never from shared state. A batch is
 * therefore the same whatever the thread count, the order samples are
 * decoded in, or whether the run was resumed from a checkpoint.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef VITC_HAVE_ZLIB
#include <zlib.h>
#endif

#include "internal.h"
#include "kernels/kernels.h"
#include "rng.h"

/* IDX sizes vitc accepts: MNIST-like sets are 28x28, far below these; the
 * bounds keep a corrupt header from asking for absurd allocations. */
#define IDX_MAX_SIDE 4096
#define IDX_MAX_COUNT 100000000LL
#define IDX_MAX_BYTES (1LL << 34)
/* A gzip IDX file may hold at most this multiple of its own size (plus
 * IDX_GZIP_SLACK): real ones are 2 to 6 times smaller than their data, and a
 * header's count is only a claim, so a 1.2 MB file must not make vitc
 * inflate and keep gigabytes (deflate reaches 1032:1). */
#define IDX_GZIP_MAX_RATIO 64
#define IDX_GZIP_SLACK ((uint64_t)1 << 20)
/* An ImageFolder image is refused over this many pixels before decoding. */
#define FOLDER_MAX_PIXELS (64LL << 20)
#define FOLDER_MAX_FILES 100000000LL

static const char *const fashion_labels[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

struct vitc_dataset {
    int kind; /* 0: IDX in memory, 1: ImageFolder on disk */
    int64_t n;
    int n_classes;
    char **class_names; /* [n_classes] */
    /* IDX */
    int rows, cols;
    uint8_t *pixels;  /* [n, rows, cols] */
    int64_t *labels;  /* [n] (both kinds) */
    /* ImageFolder */
    char **paths;     /* [n] */
    /* Unreadable images met so far (ImageFolder), each once. */
    uint8_t *bad;     /* [n] 1 = skipped */
    int64_t n_bad;
    char **bad_paths; /* [n_bad] pointers into paths, in the order met */
};

void vitc_dataset_free(vitc_dataset *d) {
    if (!d)
        return;
    if (d->class_names)
        for (int i = 0; i < d->n_classes; i++) free(d->class_names[i]);
    free(d->class_names);
    free(d->pixels);
    free(d->labels);
    if (d->paths)
        for (int64_t i = 0; i < d->n; i++) free(d->paths[i]);
    free(d->paths);
    free(d->bad);
    free(d->bad_paths);
    free(d);
}

int64_t vitc_dataset_size(const vitc_dataset *d) { return d ? d->n : 0; }
int vitc_dataset_num_classes(const vitc_dataset *d) { return d ? d->n_classes : 0; }
const char *vitc_dataset_class_name(const vitc_dataset *d, int i) {
    return d && i >= 0 && i < d->n_classes ? d->class_names[i] : NULL;
}
int64_t vitc_dataset_label(const vitc_dataset *d, int64_t i) {
    return d && i >= 0 && i < d->n ? d->labels[i] : -1;
}
int vitc_dataset_image_side(const vitc_dataset *d) { return d && d->kind == 0 ? d->rows : 0; }
int64_t vitc_dataset_num_skipped(const vitc_dataset *d) { return d ? d->n_bad : 0; }
const char *vitc_dataset_skipped_path(const vitc_dataset *d, int64_t i) {
    return d && i >= 0 && i < d->n_bad ? d->bad_paths[i] : NULL;
}

vitc_status vitc_dataset_truncate(vitc_dataset *d, int64_t n) {
    if (!d || n < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_truncate: need a dataset and n >= 1");
    if (n >= d->n)
        return VITC_OK;
    if (d->paths)
        for (int64_t i = n; i < d->n; i++) {
            free(d->paths[i]);
            d->paths[i] = NULL;
        }
    d->n = n; /* the arrays keep their size; only the first n are used */
    return VITC_OK;
}

static vitc_status set_class_names(vitc_dataset *d, int n, const char *const *names) {
    d->class_names = calloc((size_t)n, sizeof *d->class_names);
    if (!d->class_names)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %d class names", n);
    d->n_classes = n;
    for (int i = 0; i < n; i++) {
        char buf[16];
        if (!names)
            snprintf(buf, sizeof buf, "%d", i);
        if (!(d->class_names[i] = strdup(names ? names[i] : buf)))
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate a class name");
    }
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* IDX                                                                */
/* ------------------------------------------------------------------ */

/* A file read through zlib when it is gzip (zlib reads plain files as they
 * are), else through stdio. */
typedef struct idx_file {
    const char *path;
    FILE *f;
#ifdef VITC_HAVE_ZLIB
    gzFile gz;
#endif
    uint64_t size; /* on disk */
} idx_file;

static vitc_status idx_open(idx_file *x, const char *path) {
    memset(x, 0, sizeof *x);
    x->path = path;
    VITC_TRY(vitc__open_regular(path, 0, &x->f, &x->size));
    unsigned char magic[2] = {0, 0};
    size_t got = fread(magic, 1, 2, x->f);
    rewind(x->f);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
#ifdef VITC_HAVE_ZLIB
        /* zlib takes the descriptor over; the FILE is closed without it. */
        int fd = dup(fileno(x->f));
        fclose(x->f);
        x->f = NULL;
        if (fd < 0 || !(x->gz = gzdopen(fd, "rb"))) {
            if (fd >= 0)
                close(fd);
            return vitc__err(VITC_ERR_IO, "%s: cannot open for gzip reading", path);
        }
#else
        fclose(x->f);
        x->f = NULL;
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "%s: gzip file, but this vitc was built without zlib (gunzip it first)",
                         path);
#endif
    }
    return VITC_OK;
}

static void idx_close(idx_file *x) {
    if (x->f)
        fclose(x->f);
#ifdef VITC_HAVE_ZLIB
    if (x->gz)
        gzclose(x->gz);
#endif
    memset(x, 0, sizeof *x);
}

/* Read exactly n bytes; *got (may be NULL) receives how many came. */
static vitc_status idx_read(idx_file *x, void *buf, size_t n, size_t *got_out) {
    size_t got = 0;
#ifdef VITC_HAVE_ZLIB
    if (x->gz) {
        while (got < n) {
            unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
            int r = gzread(x->gz, (char *)buf + got, chunk);
            if (r < 0) {
                int e;
                const char *msg = gzerror(x->gz, &e);
                return vitc__err(VITC_ERR_FORMAT, "%s: corrupt gzip data (%s)", x->path,
                                 msg ? msg : "zlib error");
            }
            if (r == 0)
                break;
            got += (size_t)r;
        }
    } else
#endif
    {
        got = fread(buf, 1, n, x->f);
        if (got < n && ferror(x->f))
            return vitc__err(VITC_ERR_IO, "%s: read error: %s", x->path, strerror(errno));
    }
    if (got_out)
        *got_out = got;
    return VITC_OK;
}

/* Header: 0 0 type ndim, then ndim big-endian uint32 sizes. */
static vitc_status idx_header(idx_file *x, int want_ndim, int64_t *dims) {
    unsigned char h[4 + 4 * 3];
    size_t got = 0; /* set by idx_read on success; GCC without zlib cannot see it */
    VITC_TRY(idx_read(x, h, 4, &got));
    if (got < 4)
        return vitc__err(VITC_ERR_FORMAT, "%s: too short for an IDX header (%zu bytes)", x->path,
                         got);
    if (h[0] != 0 || h[1] != 0)
        return vitc__err(VITC_ERR_FORMAT, "%s: not an IDX file (magic %02x %02x %02x %02x)",
                         x->path, h[0], h[1], h[2], h[3]);
    if (h[2] != 0x08)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: IDX element type 0x%02x; vitc reads unsigned bytes (0x08)", x->path,
                         h[2]);
    if (h[3] != want_ndim)
        return vitc__err(VITC_ERR_FORMAT, "%s: IDX file of %d dimensions, expected %d", x->path,
                         h[3], want_ndim);
    VITC_TRY(idx_read(x, h + 4, 4 * (size_t)want_ndim, &got));
    if (got < 4 * (size_t)want_ndim)
        return vitc__err(VITC_ERR_FORMAT, "%s: IDX header cut short", x->path);
    for (int i = 0; i < want_ndim; i++) {
        const unsigned char *p = h + 4 + 4 * i;
        dims[i] = ((int64_t)p[0] << 24) | ((int64_t)p[1] << 16) | ((int64_t)p[2] << 8) | p[3];
    }
    return VITC_OK;
}

/* A gzip file's header claims `total` bytes of data: refused over the
 * ratio cap before anything is allocated or inflated. */
static vitc_status idx_gzip_claim(const idx_file *x, uint64_t total) {
#ifdef VITC_HAVE_ZLIB
    if (x->gz && total > x->size * IDX_GZIP_MAX_RATIO + IDX_GZIP_SLACK)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: a gzip file of %llu bytes whose header claims %llu bytes of data, "
                         "over %d times its size (vitc's limit); gunzip it and pass the raw file "
                         "if the data is real", x->path, (unsigned long long)x->size,
                         (unsigned long long)total, IDX_GZIP_MAX_RATIO);
#else
    (void)x;
    (void)total;
#endif
    return VITC_OK;
}

/* The body: exactly `bytes` bytes and nothing after them. */
static vitc_status idx_body(idx_file *x, uint8_t *dst, size_t bytes) {
    size_t got = 0; /* set by idx_read on success; GCC without zlib cannot see it */
    VITC_TRY(idx_read(x, dst, bytes, &got));
    if (got < bytes)
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: IDX data cut short: the header promises %zu bytes, the file has %zu",
                         x->path, bytes, got);
    unsigned char extra;
    VITC_TRY(idx_read(x, &extra, 1, &got));
    if (got)
        return vitc__err(VITC_ERR_FORMAT, "%s: bytes after the IDX data the header describes",
                         x->path);
    return VITC_OK;
}

/* The body into a new buffer. A raw file's length was checked against the
 * header, so its buffer is allocated at once; a gzip stream's header is only
 * a claim (a few bytes can promise gigabytes), so its buffer grows with the
 * data that actually arrives. */
static vitc_status idx_body_alloc(idx_file *x, size_t bytes, uint8_t **out) {
    *out = NULL;
    size_t cap = bytes;
#ifdef VITC_HAVE_ZLIB
    if (x->gz && cap > ((size_t)16 << 20))
        cap = (size_t)16 << 20;
#endif
    uint8_t *buf = malloc(cap ? cap : 1);
    size_t have = 0;
    vitc_status s = VITC_OK;
    while (s == VITC_OK && buf && cap < bytes) {
        size_t got;
        s = idx_read(x, buf + have, cap - have, &got);
        have += got;
        if (s != VITC_OK || have < cap)
            break; /* cut short: idx_body below says so */
        size_t next = cap > bytes / 2 ? bytes : 2 * cap;
        uint8_t *nb = realloc(buf, next);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap = next;
    }
    if (!buf)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu bytes of images", bytes);
    if (s == VITC_OK && have < cap && cap < bytes)
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: IDX data cut short: the header promises %zu bytes, the file has %zu",
                      x->path, bytes, have);
    if (s == VITC_OK)
        s = idx_body(x, buf + have, bytes - have);
    if (s != VITC_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return VITC_OK;
}

static vitc_status idx_load(vitc_dataset *d, const char *images, const char *labels) {
    idx_file xi, xl;
    int64_t di[3], dl[1];
    vitc_status s = idx_open(&xi, images);
    if (s != VITC_OK)
        return s;
    s = idx_header(&xi, 3, di);
    if (s == VITC_OK && (di[0] < 1 || di[0] > IDX_MAX_COUNT))
        s = vitc__err(VITC_ERR_FORMAT, "%s: %lld images (1 to %lld accepted)", images,
                      (long long)di[0], (long long)IDX_MAX_COUNT);
    if (s == VITC_OK && (di[1] < 1 || di[1] > IDX_MAX_SIDE || di[2] < 1 || di[2] > IDX_MAX_SIDE))
        s = vitc__err(VITC_ERR_FORMAT, "%s: images of %lldx%lld (1 to %d a side accepted)",
                      images, (long long)di[1], (long long)di[2], IDX_MAX_SIDE);
    if (s == VITC_OK && di[1] != di[2])
        s = vitc__err(VITC_ERR_FORMAT, "%s: images of %lldx%lld; vitc trains on square images",
                      images, (long long)di[1], (long long)di[2]);
    size_t bytes = 0;
    if (s == VITC_OK && (!vitc__mul_size((size_t)di[0], (size_t)(di[1] * di[2]), &bytes) ||
                         bytes > (size_t)IDX_MAX_BYTES))
        s = vitc__err(VITC_ERR_FORMAT, "%s: %lld images of %lldx%lld is too much data", images,
                      (long long)di[0], (long long)di[1], (long long)di[2]);
    /* A raw file's length is known before allocating: it must match. */
    if (s == VITC_OK && xi.f && xi.size != 16 + (uint64_t)bytes)
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: file of %llu bytes; its header (%lld images of %lldx%lld) needs %llu",
                      images, (unsigned long long)xi.size, (long long)di[0], (long long)di[1],
                      (long long)di[2], (unsigned long long)(16 + bytes));
    if (s == VITC_OK)
        s = idx_gzip_claim(&xi, 16 + (uint64_t)bytes);
    if (s == VITC_OK)
        s = idx_body_alloc(&xi, bytes, &d->pixels);
    idx_close(&xi);
    if (s != VITC_OK)
        return s;
    d->n = di[0];
    d->rows = (int)di[1];
    d->cols = (int)di[2];

    if ((s = idx_open(&xl, labels)) != VITC_OK)
        return s;
    s = idx_header(&xl, 1, dl);
    if (s == VITC_OK && dl[0] != d->n)
        s = vitc__err(VITC_ERR_FORMAT, "%s: %lld labels for %lld images in %s", labels,
                      (long long)dl[0], (long long)d->n, images);
    if (s == VITC_OK && xl.f && xl.size != 8 + (uint64_t)d->n)
        s = vitc__err(VITC_ERR_FORMAT, "%s: file of %llu bytes; its header needs %llu", labels,
                      (unsigned long long)xl.size, (unsigned long long)(8 + d->n));
    if (s == VITC_OK)
        s = idx_gzip_claim(&xl, 8 + (uint64_t)d->n);
    uint8_t *lab = NULL;
    if (s == VITC_OK && (!(lab = malloc((size_t)d->n)) ||
                         !(d->labels = malloc((size_t)d->n * sizeof *d->labels))))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate %lld labels", (long long)d->n);
    if (s == VITC_OK)
        s = idx_body(&xl, lab, (size_t)d->n);
    idx_close(&xl);
    int maxl = -1;
    for (int64_t i = 0; s == VITC_OK && i < d->n; i++) {
        d->labels[i] = lab[i];
        if (lab[i] > maxl)
            maxl = lab[i];
    }
    free(lab);
    if (s == VITC_OK && maxl > 99)
        s = vitc__err(VITC_ERR_FORMAT, "%s: label %d; IDX data sets here have at most 100 classes",
                      labels, maxl);
    if (s == VITC_OK)
        s = set_class_names(d, maxl + 1 < 10 ? 10 : maxl + 1, NULL);
    return s;
}

vitc_status vitc_dataset_open_idx(const char *images, const char *labels, vitc_dataset **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_open_idx: out is NULL");
    *out = NULL;
    if (!images || !labels)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_open_idx: NULL path");
    vitc_dataset *d = calloc(1, sizeof *d);
    if (!d)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a dataset");
    vitc_status s = idx_load(d, images, labels);
    if (s == VITC_OK && !(d->bad = calloc((size_t)d->n, 1)))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate flags for %lld images", (long long)d->n);
    if (s != VITC_OK) {
        vitc_dataset_free(d);
        return s;
    }
    *out = d;
    return VITC_OK;
}

/* dir/<stem>-idx?-ubyte, or the same with .gz. */
static vitc_status idx_find(const char *dir, const char *stem, char *buf, size_t cap) {
    const char *ext[2] = {".gz", ""};
    struct stat sb;
    for (int i = 0; i < 2; i++) {
        snprintf(buf, cap, "%s/%s%s", dir, stem, ext[i]);
        if (stat(buf, &sb) == 0)
            return VITC_OK;
    }
    snprintf(buf, cap, "%s/%s", dir, stem);
    return vitc__err(VITC_ERR_IO, "%s: no such file (nor %s.gz)", buf, stem);
}

vitc_status vitc_dataset_open_mnist_dir(const char *dir, int train, int fashion_labels_,
                                        vitc_dataset **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_open_mnist_dir: out is NULL");
    *out = NULL;
    if (!dir)
        dir = VITC_FASHION_MNIST_DIR;
    if (strlen(dir) > 3800)
        return vitc__err(VITC_ERR_INVALID_ARG, "data directory path too long");
    char ip[4096], lp[4096];
    VITC_TRY(idx_find(dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", ip,
                      sizeof ip));
    VITC_TRY(idx_find(dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", lp,
                      sizeof lp));
    vitc_dataset *d;
    VITC_TRY(vitc_dataset_open_idx(ip, lp, &d));
    if (fashion_labels_ && d->n_classes == 10)
        for (int i = 0; i < 10; i++) {
            char *c = strdup(fashion_labels[i]);
            if (!c) {
                vitc_dataset_free(d);
                return vitc__err(VITC_ERR_NOMEM, "cannot allocate a class name");
            }
            free(d->class_names[i]);
            d->class_names[i] = c;
        }
    *out = d;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* ImageFolder                                                        */
/* ------------------------------------------------------------------ */

typedef struct strvec {
    char **v;
    int64_t n, cap;
} strvec;

static vitc_status strvec_push(strvec *s, const char *a, const char *b) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v)
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate a file list of %lld", (long long)cap);
        s->v = v;
        s->cap = cap;
    }
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    char *p = malloc(la + lb + 2);
    if (!p)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a path");
    memcpy(p, a, la);
    if (b) {
        p[la] = '/';
        memcpy(p + la + 1, b, lb + 1);
    } else {
        p[la] = 0;
    }
    s->v[s->n++] = p;
    return VITC_OK;
}

static void strvec_free(strvec *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* The walk follows links, as torchvision's does, but a link loop or a
 * second way into a folder must not repeat it: folders and files are known
 * by (device, inode), each walked / listed once. FOLDER_MAX_ENTRIES bounds
 * the directory entries read in all (docs/limits.md). */
#define FOLDER_MAX_ENTRIES 100000000LL

typedef struct idset {
    uint64_t *k; /* [cap][2]: device, inode + 1 (0: empty) */
    size_t n, cap;
} idset;

/* Adds (dev, ino); *fresh = 0 when it was there already. */
static vitc_status idset_add(idset *s, const struct stat *sb, int *fresh) {
    uint64_t dev = (uint64_t)sb->st_dev, ino = (uint64_t)sb->st_ino + 1;
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        uint64_t *k = calloc(cap, 2 * sizeof *k);
        if (!k)
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate the folder walk's file set");
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->k[2 * i + 1])
                continue;
            size_t h = (size_t)((s->k[2 * i] * 0x9e3779b97f4a7c15ULL) ^ s->k[2 * i + 1]) *
                       0x9e3779b97f4a7c15ULL % cap;
            while (k[2 * h + 1]) h = (h + 1) % cap;
            k[2 * h] = s->k[2 * i];
            k[2 * h + 1] = s->k[2 * i + 1];
        }
        free(s->k);
        s->k = k;
        s->cap = cap;
    }
    size_t h = (size_t)((dev * 0x9e3779b97f4a7c15ULL) ^ ino) * 0x9e3779b97f4a7c15ULL % s->cap;
    while (s->k[2 * h + 1]) {
        if (s->k[2 * h] == dev && s->k[2 * h + 1] == ino) {
            *fresh = 0;
            return VITC_OK;
        }
        h = (h + 1) % s->cap;
    }
    s->k[2 * h] = dev;
    s->k[2 * h + 1] = ino;
    s->n++;
    *fresh = 1;
    return VITC_OK;
}

typedef struct walk_ctx {
    const char *root;
    idset dirs, files;
    int64_t entries; /* directory entries read so far */
} walk_ctx;

typedef struct dentry {
    char *name;
    struct stat sb;
} dentry;

typedef struct dentries {
    dentry *v;
    int64_t n, cap;
} dentries;

static void dentries_free(dentries *e) {
    for (int64_t i = 0; i < e->n; i++) free(e->v[i].name);
    free(e->v);
    memset(e, 0, sizeof *e);
}

/* Python's sorted() on str compares code points; on UTF-8 bytes strcmp
 * gives the same order. */
static int cmp_dentry(const void *a, const void *b) {
    return strcmp(((const dentry *)a)->name, ((const dentry *)b)->name);
}

/* Sorted entries of dir (links followed, as torchvision does): sub-folders
 * into subs, regular files into files (either may be NULL). */
static vitc_status list_dir(walk_ctx *w, const char *dir, dentries *files, dentries *subs) {
    DIR *dp = opendir(dir);
    if (!dp)
        return vitc__err(VITC_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
    struct dirent *e;
    vitc_status s = VITC_OK;
    char path[4096];
    while (s == VITC_OK && (e = readdir(dp))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if (++w->entries > FOLDER_MAX_ENTRIES) {
            s = vitc__err(VITC_ERR_INVALID_ARG,
                          "%s: more than %lld directory entries under the data folder (vitc's "
                          "limit); point --data at a smaller tree", w->root,
                          (long long)FOLDER_MAX_ENTRIES);
            break;
        }
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue;
        struct stat sb;
        if (stat(path, &sb) != 0)
            continue;
        dentries *to = S_ISDIR(sb.st_mode) ? subs : S_ISREG(sb.st_mode) ? files : NULL;
        if (!to)
            continue;
        if (to->n == to->cap) {
            int64_t cap = to->cap ? 2 * to->cap : 64;
            dentry *v = realloc(to->v, (size_t)cap * sizeof *v);
            if (!v) {
                s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory listing the folder", dir);
                break;
            }
            to->v = v;
            to->cap = cap;
        }
        if (!(to->v[to->n].name = strdup(e->d_name))) {
            s = vitc__err(VITC_ERR_NOMEM, "%s: out of memory listing the folder", dir);
            break;
        }
        to->v[to->n++].sb = sb;
    }
    closedir(dp);
    if (s == VITC_OK && files && files->n > 1)
        qsort(files->v, (size_t)files->n, sizeof *files->v, cmp_dentry);
    if (s == VITC_OK && subs && subs->n > 1)
        qsort(subs->v, (size_t)subs->n, sizeof *subs->v, cmp_dentry);
    return s;
}

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    return !strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg");
}

/* torchvision's make_dataset: os.walk(class_dir) sorted, files of a folder
 * (sorted) before its sub-folders; a folder or file already seen (a link
 * loop, a second link to it) is skipped, and 16 levels deep is the end. */
static vitc_status walk_class(walk_ctx *w, const char *dir, int depth, int label, strvec *paths,
                              int64_t **labels, int64_t *lcap) {
    if (depth > 16)
        return VITC_OK;
    dentries files = {0}, subs = {0};
    vitc_status s = list_dir(w, dir, &files, &subs);
    for (int64_t i = 0; s == VITC_OK && i < files.n; i++) {
        int fresh;
        if (!has_image_ext(files.v[i].name))
            continue;
        if ((s = idset_add(&w->files, &files.v[i].sb, &fresh)) != VITC_OK || !fresh)
            continue;
        if (paths->n >= FOLDER_MAX_FILES) {
            s = vitc__err(VITC_ERR_INVALID_ARG, "%s: more than %lld images", dir,
                          (long long)FOLDER_MAX_FILES);
            break;
        }
        if (paths->n == *lcap) {
            int64_t cap = *lcap ? 2 * *lcap : 64;
            int64_t *l = realloc(*labels, (size_t)cap * sizeof *l);
            if (!l) {
                s = vitc__err(VITC_ERR_NOMEM, "cannot allocate labels");
                break;
            }
            *labels = l;
            *lcap = cap;
        }
        (*labels)[paths->n] = label;
        s = strvec_push(paths, dir, files.v[i].name);
    }
    for (int64_t i = 0; s == VITC_OK && i < subs.n; i++) {
        char sub[4096];
        int fresh;
        if ((s = idset_add(&w->dirs, &subs.v[i].sb, &fresh)) != VITC_OK || !fresh)
            continue;
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", dir, subs.v[i].name) < sizeof sub)
            s = walk_class(w, sub, depth + 1, label, paths, labels, lcap);
    }
    dentries_free(&files);
    dentries_free(&subs);
    return s;
}

vitc_status vitc_dataset_open_folder(const char *root, int n_classes, const char *const *classes,
                                     vitc_dataset **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_open_folder: out is NULL");
    *out = NULL;
    if (!root || (n_classes > 0 && !classes) || n_classes < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_open_folder: bad arguments");
    if (strlen(root) > 3000)
        return vitc__err(VITC_ERR_INVALID_ARG, "data folder path too long");
    strvec paths = {0};
    dentries found = {0};
    walk_ctx w = {0};
    w.root = root;
    int64_t *labels = NULL, lcap = 0;
    int fresh;
    struct stat rsb;
    vitc_dataset *d = calloc(1, sizeof *d);
    vitc_status s = d ? list_dir(&w, root, NULL, &found)
                      : vitc__err(VITC_ERR_NOMEM, "cannot allocate a dataset");
    /* The root counts as walked: a link back to it is a loop. */
    if (s == VITC_OK && stat(root, &rsb) == 0)
        s = idset_add(&w.dirs, &rsb, &fresh);
    if (s == VITC_OK && n_classes == 0) {
        if (found.n == 0)
            s = vitc__err(VITC_ERR_INVALID_ARG,
                          "%s: no class folders (ImageFolder wants ROOT/<class>/<image>)", root);
        else if (found.n > 100000)
            s = vitc__err(VITC_ERR_INVALID_ARG, "%s: %lld class folders", root,
                          (long long)found.n);
        if (s == VITC_OK) {
            const char **names = malloc((size_t)found.n * sizeof *names);
            if (!names)
                s = vitc__err(VITC_ERR_NOMEM, "cannot allocate class names");
            for (int64_t i = 0; s == VITC_OK && i < found.n; i++) names[i] = found.v[i].name;
            if (s == VITC_OK)
                s = set_class_names(d, (int)found.n, names);
            free(names);
        }
    } else if (s == VITC_OK) {
        /* Another split of a known class list (val after train): its folders
         * must be among those classes, so label i means the same in both. */
        for (int64_t i = 0; s == VITC_OK && i < found.n; i++) {
            int k = 0;
            while (k < n_classes && strcmp(classes[k], found.v[i].name)) k++;
            /* the known classes are the training split's (train) or the
             * model's labels (eval): name both, with the first few */
            if (k == n_classes)
                s = vitc__err(VITC_ERR_INVALID_ARG,
                              "%s/%s: not one of the %d known classes (%s%s%s%s%s%s): name the "
                              "class folders as the model's labels / the training set's classes",
                              root, found.v[i].name, n_classes, classes[0],
                              n_classes > 1 ? ", " : "", n_classes > 1 ? classes[1] : "",
                              n_classes > 2 ? ", " : "", n_classes > 2 ? classes[2] : "",
                              n_classes > 3 ? ", ..." : "");
        }
        if (s == VITC_OK)
            s = set_class_names(d, n_classes, classes);
    }
    /* Class c is walked only as an entry of the root's listing with its
     * exact name: a class name is never made into a path (a label
     * "../../usr" matches no entry, so it reads nothing outside root). */
    for (int c = 0; s == VITC_OK && c < d->n_classes; c++) {
        char dir[4096];
        int64_t i = 0;
        while (i < found.n && strcmp(found.v[i].name, d->class_names[c])) i++;
        if (i == found.n)
            continue; /* a class with no folder in this split */
        if ((s = idset_add(&w.dirs, &found.v[i].sb, &fresh)) != VITC_OK || !fresh)
            continue;
        snprintf(dir, sizeof dir, "%s/%s", root, found.v[i].name);
        s = walk_class(&w, dir, 0, c, &paths, &labels, &lcap);
    }
    if (s == VITC_OK && paths.n == 0)
        s = vitc__err(VITC_ERR_INVALID_ARG, "%s: no .png/.jpg/.jpeg images in its class folders",
                      root);
    if (s == VITC_OK) {
        d->kind = 1;
        d->n = paths.n;
        d->paths = paths.v;
        d->labels = labels;
        paths.v = NULL;
        paths.n = 0;
        labels = NULL;
        if (!(d->bad = calloc((size_t)d->n, 1)) || !(d->bad_paths = calloc((size_t)d->n, sizeof(char *))))
            s = vitc__err(VITC_ERR_NOMEM, "cannot allocate flags for %lld images", (long long)d->n);
    }
    dentries_free(&found);
    strvec_free(&paths);
    free(labels);
    free(w.dirs.k);
    free(w.files.k);
    if (s != VITC_OK) {
        vitc_dataset_free(d);
        return s;
    }
    *out = d;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Batches                                                            */
/* ------------------------------------------------------------------ */

vitc_batch_opts vitc_batch_default_opts(int image_size, int channels) {
    vitc_batch_opts o;
    memset(&o, 0, sizeof o);
    o.image_size = image_size;
    o.channels = channels;
    o.pad = 4;
    for (int i = 0; i < 3; i++) {
        o.mean[i] = 0.0f;
        o.std[i] = 1.0f;
    }
    return o;
}

/* The two source taps *i0, *i1 of [0, n) and the weight of *i1 at the
 * source coordinate f (clamped to the edge pixels). */
static void bilinear_tap(double f, int n, int *i0, int *i1, float *w1) {
    if (f < 0) f = 0;
    if (f > n - 1) f = n - 1;
    *i0 = (int)f;
    *i1 = *i0 + 1 < n ? *i0 + 1 : *i0;
    *w1 = (float)(f - *i0);
}

/* Bilinear sample of a [h, w] plane (align_corners=False) over the box
 * (y0, x0, bh, bw) into an s x s plane. */
static void resample(float *dst, int s, const float *src, int h, int w, double y0, double x0,
                     double bh, double bw) {
    for (int y = 0; y < s; y++) {
        int iy, iy1, ix, ix1;
        float wy, wx;
        bilinear_tap(y0 + (y + 0.5) * bh / s - 0.5, h, &iy, &iy1, &wy);
        for (int x = 0; x < s; x++) {
            bilinear_tap(x0 + (x + 0.5) * bw / s - 0.5, w, &ix, &ix1, &wx);
            float a = src[(size_t)iy * w + ix], b = src[(size_t)iy * w + ix1];
            float c = src[(size_t)iy1 * w + ix], e = src[(size_t)iy1 * w + ix1];
            dst[(size_t)y * s + x] = (a * (1 - wx) + b * wx) * (1 - wy) + (c * (1 - wx) + e * wx) * wy;
        }
    }
}

/* torch.randint(lo, hi) style: uniform integer in [0, n). */
static int64_t rand_below(vitc__rng *r, int64_t n) {
    return n <= 1 ? 0 : (int64_t)(vitc__rng_uniform53(r) * (double)n);
}

/* torchvision RandomResizedCrop.get_params: scale (0.08, 1), ratio (3/4, 4/3),
 * ten tries, then the center crop of the clamped ratio. */
static void rrc_box(vitc__rng *r, int h, int w, int *bi, int *bj, int *bh, int *bw) {
    double area = (double)h * w, lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
    for (int t = 0; t < 10; t++) {
        double target = area * (0.08 + (1.0 - 0.08) * vitc__rng_uniform53(r));
        double ar = exp(lr0 + (lr1 - lr0) * vitc__rng_uniform53(r));
        int cw = (int)lround(sqrt(target * ar)), ch = (int)lround(sqrt(target / ar));
        if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            *bi = (int)rand_below(r, h - ch + 1);
            *bj = (int)rand_below(r, w - cw + 1);
            *bh = ch;
            *bw = cw;
            return;
        }
    }
    double in_ratio = (double)w / h;
    int cw = w, ch = h;
    if (in_ratio < 3.0 / 4.0)
        ch = (int)lround(w / (3.0 / 4.0));
    else if (in_ratio > 4.0 / 3.0)
        cw = (int)lround(h * (4.0 / 3.0));
    if (ch > h) ch = h;
    if (cw > w) cw = w;
    *bi = (h - ch) / 2;
    *bj = (w - cw) / 2;
    *bh = ch;
    *bw = cw;
}

/* One sample into out [C, S, S] in [0, 1] (before normalization); plane is
 * [planes, S, S] of the source channels (1 for IDX, 3 for images). */
typedef struct sample_ctx {
    vitc_dataset *d;
    const int64_t *idx;
    const vitc_batch_opts *o;
    float *images;
    int64_t *labels;
    uint8_t *ok; /* [n] */
} sample_ctx;

static vitc_status load_sample(vitc_dataset *d, int64_t k, int64_t index,
                               const vitc_batch_opts *o, float *out /* [C, S, S] */) {
    int S = o->image_size, planes;
    size_t SS = (size_t)S * S;
    vitc__rng r = {o->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(o->first + k + 1))};
    vitc__rng_next(&r);
    float *src = NULL; /* [planes, S, S] in [0, 1] */
    vitc_status s = VITC_OK;
    if (d->kind == 0) {
        planes = 1;
        int h = d->rows, w = d->cols;
        const uint8_t *p = d->pixels + (size_t)index * h * w;
        if (!(src = malloc(SS * sizeof *src + (size_t)h * w * sizeof *src)))
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate a sample");
        float *tmp = src + SS;
        for (int i = 0; i < h * w; i++) tmp[i] = p[i] / 255.0f;
        if (h == S && w == S)
            memcpy(src, tmp, SS * sizeof *src);
        else
            resample(src, S, tmp, h, w, 0, 0, h, w);
    } else {
        planes = 3;
        vitc_image img = {0, 0, NULL};
        s = vitc_image_load(d->paths[index], FOLDER_MAX_PIXELS, &img);
        if (s != VITC_OK)
            return s;
        if (!(src = malloc(3 * SS * sizeof *src))) {
            vitc_image_free(&img);
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate a sample");
        }
        if (o->augment & VITC_AUG_RESIZED_CROP) {
            int bi, bj, bh, bw, h = img.height, w = img.width;
            size_t hw = (size_t)h * w;
            float *plane = malloc(hw * sizeof *plane);
            if (!plane)
                s = vitc__err(VITC_ERR_NOMEM, "cannot allocate an image plane");
            rrc_box(&r, h, w, &bi, &bj, &bh, &bw);
            for (int c = 0; s == VITC_OK && c < 3; c++) {
                for (size_t i = 0; i < hw; i++) plane[i] = img.rgb[3 * i + c] / 255.0f;
                resample(src + c * SS, S, plane, h, w, bi, bj, bh, bw);
            }
            free(plane);
        } else {
            /* Eval transform: Resize(S) of the shorter side (antialiased) and
             * CenterCrop(S), through the library's preprocessing. */
            const float zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
            s = vitc_image_preprocess(&img, S, S, zero, one, src);
        }
        vitc_image_free(&img);
        if (s != VITC_OK) {
            free(src);
            return s;
        }
    }
    /* RandomCrop(S, padding=pad): zero padding, offset in [0, 2 pad]. */
    if ((o->augment & VITC_AUG_CROP) && o->pad > 0) {
        int dy = (int)rand_below(&r, 2 * o->pad + 1) - o->pad;
        int dx = (int)rand_below(&r, 2 * o->pad + 1) - o->pad;
        float *tmp = malloc(SS * sizeof *tmp);
        if (!tmp) {
            free(src);
            return vitc__err(VITC_ERR_NOMEM, "cannot allocate a sample");
        }
        for (int c = 0; c < planes; c++) {
            float *pl = src + c * SS;
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++) {
                    int sy = y + dy, sx = x + dx;
                    tmp[(size_t)y * S + x] =
                        sy >= 0 && sy < S && sx >= 0 && sx < S ? pl[(size_t)sy * S + sx] : 0.0f;
                }
            memcpy(pl, tmp, SS * sizeof *tmp);
        }
        free(tmp);
    }
    if ((o->augment & VITC_AUG_FLIP) && vitc__rng_uniform(&r) < 0.5)
        for (int c = 0; c < planes; c++)
            for (int y = 0; y < S; y++) {
                float *row = src + c * SS + (size_t)y * S;
                for (int a = 0, b = S - 1; a < b; a++, b--) {
                    float t = row[a];
                    row[a] = row[b];
                    row[b] = t;
                }
            }
    /* Channels: gray to RGB repeats the plane; RGB to gray is torchvision's
     * Grayscale (ITU-R 601-2 luma). Then Normalize. */
    for (int c = 0; c < o->channels; c++) {
        float *dst = out + c * SS;
        for (size_t i = 0; i < SS; i++) {
            float v;
            if (planes == o->channels)
                v = src[c * SS + i];
            else if (planes == 1)
                v = src[i];
            else
                v = 0.299f * src[i] + 0.587f * src[SS + i] + 0.114f * src[2 * SS + i];
            dst[i] = (v - o->mean[c]) / o->std[c];
        }
    }
    free(src);
    return VITC_OK;
}

static void batch_task(void *p, int64_t k, int tid) {
    (void)tid;
    sample_ctx *c = p;
    size_t per = (size_t)c->o->channels * c->o->image_size * c->o->image_size;
    c->ok[k] = load_sample(c->d, k, c->idx[k], c->o, c->images + (size_t)k * per) == VITC_OK;
}

vitc_status vitc_dataset_load_batch(vitc_dataset *d, const int64_t *idx, int n,
                                    const vitc_batch_opts *o, float *images, int64_t *labels,
                                    int *n_valid) {
    if (!d || !idx || !o || !images || !labels || !n_valid || n < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_dataset_load_batch: bad arguments");
    *n_valid = 0;
    if (o->image_size < 1 || o->image_size > 4096 || (o->channels != 1 && o->channels != 3) ||
        o->pad < 0 || o->pad > o->image_size || o->first < 0)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "batch options: image_size %d, channels %d, pad %d (need 1..4096, 1 or 3, "
                         "0..image_size)", o->image_size, o->channels, o->pad);
    for (int c = 0; c < o->channels; c++)
        if (!(o->std[c] > 0) || !isfinite(o->std[c]) || !isfinite(o->mean[c]))
            return vitc__err(VITC_ERR_INVALID_ARG, "batch options: std[%d] = %g, mean %g", c,
                             (double)o->std[c], (double)o->mean[c]);
    for (int k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= d->n)
            return vitc__err(VITC_ERR_INVALID_ARG, "sample index %lld of a dataset of %lld",
                             (long long)idx[k], (long long)d->n);
    uint8_t *ok = calloc((size_t)n, 1);
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a batch");
    sample_ctx c = {d, idx, o, images, labels, ok};
    /* Samples are independent (each has its own generator), so decoding
     * them in parallel changes nothing in the batch. */
    vitc__parallel_for(n, batch_task, &c);
    size_t per = (size_t)o->channels * o->image_size * o->image_size;
    int m = 0;
    vitc_status s = VITC_OK;
    for (int k = 0; k < n; k++) {
        if (!ok[k]) {
            if (d->kind == 0) {
                s = vitc__err(VITC_ERR_NOMEM, "cannot allocate a sample");
                break;
            }
            /* An unreadable image is skipped (and remembered once); the batch
             * closes up behind it. */
            if (!d->bad[idx[k]]) {
                d->bad[idx[k]] = 1;
                d->bad_paths[d->n_bad++] = d->paths[idx[k]];
            }
            continue;
        }
        if (m != k)
            memmove(images + (size_t)m * per, images + (size_t)k * per, per * sizeof *images);
        labels[m++] = d->labels[idx[k]];
    }
    free(ok);
    *n_valid = m;
    return s;
}
