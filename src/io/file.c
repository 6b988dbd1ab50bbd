/*
 * file.c — how vitc opens files to read and replaces files it writes.
 *
 * Reading: a path is opened with O_NONBLOCK and fstat'ed before anything is
 * read, so a FIFO or a device given where a file is expected is refused at
 * once instead of blocking forever; only then is O_NONBLOCK cleared.
 *
 * Writing never loses what was there (SQLite's habit): the new content goes
 * to a fresh file beside the target, is flushed and fsync'ed, and is renamed
 * over the target; the directory is fsync'ed so the rename itself survives a
 * crash. On any failure only the temporary file is removed, so the target is
 * either its old bytes or the complete new ones. A target that exists but is
 * not a regular file (a device node, a FIFO, a directory) is refused and left
 * alone: replacing /dev/something by a PNG is never what the user meant.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "internal.h"

const char *vitc__file_kind(mode_t m) {
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISLNK(m))
        return "a symbolic link";
    return "not a regular file";
}

vitc_status vitc__open_regular(const char *path, uint64_t max_bytes, FILE **out, uint64_t *size) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return vitc__err(VITC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return vitc__err(VITC_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return vitc__err(VITC_ERR_IO, "%s: is %s; vitc reads only regular files", path,
                         vitc__file_kind(sb.st_mode));
    }
    if (max_bytes && (uint64_t)sb.st_size > max_bytes) {
        close(fd);
        return vitc__err(VITC_ERR_FORMAT,
                         "%s: file of %" PRIu64 " bytes is over the limit of %" PRIu64 " bytes",
                         path, (uint64_t)sb.st_size, max_bytes);
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = NULL;
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return vitc__err(VITC_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    *out = f;
    if (size)
        *size = (uint64_t)sb.st_size;
    return VITC_OK;
}

vitc_status vitc_open_read(const char *path, int64_t max_bytes, FILE **out, int64_t *size) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_open_read: out is NULL");
    *out = NULL;
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_open_read: path is NULL");
    if (max_bytes < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_open_read: negative max_bytes");
    uint64_t n;
    VITC_TRY(vitc__open_regular(path, (uint64_t)max_bytes, out, &n));
    if (size)
        *size = (int64_t)n;
    return VITC_OK;
}

vitc_status vitc__json_parse_capped(const char *text, size_t len, const char *label,
                                    const char *what, size_t max_items, struct json_t **out) {
    *out = NULL;
    /* jansson's tree costs up to ~80x the text: counted before it is built */
    size_t items = vitc__json_items(text, len);
    if (max_items && items > max_items)
        return vitc__err(VITC_ERR_FORMAT, "%s: %zu JSON values are over the limit of %zu for %s",
                         label, items, max_items, what);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root && json_error_code(&jerr) == json_error_out_of_memory)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory parsing %zu bytes of JSON (%zu "
                         "values)", label, len, items);
    if (!root)
        return vitc__err(VITC_ERR_FORMAT, "%s is not JSON (%s, line %d)", label, jerr.text,
                         jerr.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return vitc__err(VITC_ERR_FORMAT, "%s is not a JSON object", label);
    }
    *out = root;
    return VITC_OK;
}

vitc_status vitc__json_load_capped(const char *path, uint64_t cap, size_t max_items,
                                   const char *what, struct json_t **out) {
    FILE *f;
    uint64_t size;
    *out = NULL;
    VITC_TRY(vitc__open_regular(path, 0, &f, &size));
    if (cap && size > cap) {
        fclose(f);
        return vitc__err(VITC_ERR_FORMAT, "%s: %" PRIu64 " bytes are over the limit of %" PRIu64
                         " bytes for %s", path, size, cap, what);
    }
    char *text = malloc((size_t)size + 1);
    if (!text) {
        fclose(f);
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory reading %" PRIu64 " bytes", path,
                         size);
    }
    size_t got = fread(text, 1, (size_t)size, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (got != (size_t)size) {
        free(text);
        return vitc__err(VITC_ERR_IO, "%s: read %zu of %" PRIu64 " bytes%s%s", path, got, size,
                         err ? ": " : " (changed while read?)", err ? strerror(err) : "");
    }
    text[got] = '\0';
    vitc_status s = vitc__json_parse_capped(text, got, path, what, max_items, out);
    free(text);
    return s;
}

/* Where the file really goes: a symbolic link to a regular file is followed,
 * so the link stays a link and its target gets the new content. */
static vitc_status write_target(const char *path, char **real, struct stat *sb, int *exists) {
    *real = NULL;
    *exists = 0;
    if (lstat(path, sb) != 0) {
        if (errno == ENOENT)
            return VITC_OK;
        return vitc__err(VITC_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (S_ISLNK(sb->st_mode)) {
        if (stat(path, sb) != 0)
            return vitc__err(VITC_ERR_IO, "%s: is a symbolic link that leads nowhere (%s); "
                             "not replacing it", path, strerror(errno));
        if (S_ISREG(sb->st_mode) && !(*real = realpath(path, NULL)))
            return vitc__err(VITC_ERR_IO, "%s: cannot resolve the link: %s", path,
                             strerror(errno));
    }
    if (!S_ISREG(sb->st_mode))
        return vitc__err(VITC_ERR_IO, "%s: exists and is %s; vitc writes only regular files "
                         "and leaves it alone", path, vitc__file_kind(sb->st_mode));
    /* Replacing by rename would succeed on a read-only file; writing in place
     * would not, and that protection is the user's to keep. */
    if (access(*real ? *real : path, W_OK) != 0)
        return vitc__err(VITC_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    *exists = 1;
    return VITC_OK;
}

/* A fresh file beside target (same directory, so rename is atomic). The mode
 * honours the umask as a plain fopen would. */
static vitc_status open_temp(const char *target, char **tmp_out, int *fd_out) {
    static _Atomic unsigned counter;
    size_t cap;
    if (!vitc__add_size(strlen(target), 64, &cap))
        return vitc__err(VITC_ERR_INVALID_ARG, "path too long");
    char *tmp = malloc(cap);
    if (!tmp)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", target);
    for (int tries = 0; tries < 100; tries++) {
        snprintf(tmp, cap, "%s.tmp%ld.%u", target, (long)getpid(), counter++);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
        if (fd >= 0) {
            *tmp_out = tmp;
            *fd_out = fd;
            return VITC_OK;
        }
        if (errno != EEXIST)
            break;
    }
    int e = errno;
    free(tmp);
    return vitc__err(VITC_ERR_IO, "%s: cannot create a file beside it: %s", target, strerror(e));
}

/* fsync the directory holding path so that the rename is on disk too. File
 * systems that cannot sync a directory say EINVAL; that is not a failure. */
static vitc_status sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    vitc_status s = VITC_OK;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP))
        s = vitc__err(VITC_ERR_IO, "%s: written, but syncing its directory failed: %s", path,
                      strerror(errno));
    if (fd >= 0)
        close(fd);
    free(dir);
    return s;
}

vitc_status vitc__write_file(const char *path, vitc__write_fn fn, void *ctx) {
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "write: path is NULL");
    struct stat sb;
    char *real = NULL, *tmp = NULL;
    int exists, fd = -1;
    FILE *f = NULL;
    vitc_status s = write_target(path, &real, &sb, &exists);
    const char *target = real ? real : path;
    if (s == VITC_OK)
        s = open_temp(target, &tmp, &fd);
    if (s != VITC_OK)
        goto done;
    /* The replacement keeps the permissions of the file it replaces. */
    if (exists && fchmod(fd, sb.st_mode & 07777) != 0) {
        s = vitc__err(VITC_ERR_IO, "%s: cannot set the mode of the new file: %s", path,
                      strerror(errno));
        goto done;
    }
    if (!(f = fdopen(fd, "wb"))) {
        s = vitc__err(VITC_ERR_IO, "%s: cannot open the new file: %s", path, strerror(errno));
        goto done;
    }
    fd = -1;
    s = fn(f, ctx);
    int err = errno;
    /* fflush makes buffered data meet the disk here. A stdio failure (full
     * disk, EFBIG) is the cause whatever the writer made of it. */
    if (s == VITC_OK && !ferror(f) && fflush(f) != 0)
        err = errno;
    if (ferror(f)) {
        s = vitc__err(VITC_ERR_IO, "%s: write failed: %s", path, strerror(err));
        goto done;
    }
    if (s != VITC_OK)
        goto done;
    if (fsync(fileno(f)) != 0) {
        s = vitc__err(VITC_ERR_IO, "%s: write failed (fsync): %s", path, strerror(errno));
        goto done;
    }
    int rc = fclose(f);
    f = NULL;
    if (rc != 0) {
        s = vitc__err(VITC_ERR_IO, "%s: write failed (close): %s", path, strerror(errno));
        goto done;
    }
    if (rename(tmp, target) != 0) {
        s = vitc__err(VITC_ERR_IO, "%s: cannot rename the finished file into place: %s", path,
                      strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL;
    s = sync_dir(target);
done:
    if (f)
        fclose(f);
    if (fd >= 0)
        close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(real);
    return s;
}

typedef struct bytes_ctx {
    const void *data;
    size_t len;
} bytes_ctx;

static vitc_status bytes_write(FILE *f, void *p) {
    const bytes_ctx *c = p;
    return fwrite(c->data, 1, c->len, f) == c->len ? VITC_OK : VITC_ERR_IO;
}

vitc_status vitc_save_bytes(const char *path, const void *data, size_t len) {
    if (!data && len)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_save_bytes: data is NULL");
    bytes_ctx c = {data, len};
    return vitc__write_file(path, bytes_write, &c);
}

/* ------------------------------------------------------------------ */
/* .npy                                                               */
/* ------------------------------------------------------------------ */

typedef struct npy_ctx {
    const float *data;
    size_t numel;
    const char *header;
    size_t header_len;
} npy_ctx;

static vitc_status npy_write(FILE *f, void *p) {
    const npy_ctx *c = p;
    if (fwrite(c->header, 1, c->header_len, f) != c->header_len)
        return VITC_ERR_IO;
    unsigned char buf[4096];
    size_t k = 0;
    for (size_t i = 0; i < c->numel; i++) {
        uint32_t u;
        memcpy(&u, &c->data[i], 4);
        for (int b = 0; b < 4; b++)
            buf[k++] = (unsigned char)(u >> (8 * b)); /* little-endian on any host */
        if (k == sizeof buf || i + 1 == c->numel) {
            if (fwrite(buf, 1, k, f) != k)
                return VITC_ERR_IO;
            k = 0;
        }
    }
    return VITC_OK;
}

vitc_status vitc_save_npy(const char *path, const float *data, int ndim, const int64_t *shape) {
    if (!path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_save_npy: path is NULL");
    /* numpy 1.x reads at most 32 dimensions. */
    if (ndim < 0 || ndim > 32 || (ndim > 0 && !shape))
        return vitc__err(VITC_ERR_SHAPE, "%s: ndim %d (0..32, with a shape)", path, ndim);
    int ok;
    size_t numel = vitc__numel(ndim, shape, &ok), bytes;
    if (!ok || !vitc__mul_size(numel, 4, &bytes)) {
        char sb[160];
        return vitc__err(VITC_ERR_SHAPE, "%s: bad shape %s (negative or too large)", path,
                         vitc__shape_str(sb, sizeof sb, ndim, shape));
    }
    if (numel && !data)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: data is NULL", path);
    /* Format 1.0: magic, version, header length (2 bytes), then a Python dict
     * padded with spaces to a multiple of 64 and ended by '\n'. 32 dims of 20
     * digits fit easily in the 65535-byte header. */
    char hdr[1024];
    int n = snprintf(hdr + 10, sizeof hdr - 10,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int d = 0; d < ndim; d++)
        n += snprintf(hdr + 10 + n, sizeof hdr - 10 - (size_t)n, "%s%" PRId64,
                      d ? ", " : "", shape[d]);
    n += snprintf(hdr + 10 + n, sizeof hdr - 10 - (size_t)n, "%s), }", ndim == 1 ? "," : "");
    size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
    memset(hdr + 10 + n, ' ', pad);
    hdr[10 + n + pad] = '\n';
    size_t hl = (size_t)n + pad + 1;
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)(hl & 0xff);
    hdr[9] = (char)(hl >> 8);
    npy_ctx c = {data, numel, hdr, 10 + hl};
    return vitc__write_file(path, npy_write, &c);
}

/* ------------------------------------------------------------------ */
/* Temporaries of killed writers                                      */
/* ------------------------------------------------------------------ */

/* n decimal digits at *s (at least one): their value, *s past them; -1 when
 * there are none or too many. */
static long long take_digits(const char **s) {
    long long v = 0;
    int n = 0;
    while (**s >= '0' && **s <= '9' && n < 18) v = v * 10 + (*(*s)++ - '0'), n++;
    return n && !(**s >= '0' && **s <= '9') ? v : -1;
}

/* The writer's pid when name (after "<target>.") is one of the temporaries
 * vitc's writers make beside a target: "tmp<pid>.<n>" (vitc__write_file),
 * "model<pid>.tmp" and "model<pid>.tmp.tmp<pid>.<n>" (a checkpoint's model
 * part, src/train/checkpoint.c); else -1. */
static long long temp_owner(const char *s) {
    long long pid;
    if (!strncmp(s, "tmp", 3)) {
        s += 3;
        if ((pid = take_digits(&s)) < 0 || *s++ != '.' || take_digits(&s) < 0 || *s)
            return -1;
        return pid;
    }
    if (strncmp(s, "model", 5))
        return -1;
    s += 5;
    if ((pid = take_digits(&s)) < 0 || strncmp(s, ".tmp", 4))
        return -1;
    s += 4;
    if (!*s)
        return pid;
    if (strncmp(s, ".tmp", 4))
        return -1;
    s += 4;
    if (take_digits(&s) < 0 || *s++ != '.' || take_digits(&s) < 0 || *s)
        return -1;
    return pid;
}

void vitc__remove_stale_temps(const char *target) {
    char *real = target ? realpath(target, NULL) : NULL;
    const char *t = real ? real : target;
    if (!t) {
        free(real);
        return;
    }
    const char *slash = strrchr(t, '/'), *base = slash ? slash + 1 : t;
    char *dir = slash ? strndup(t, slash == t ? 1 : (size_t)(slash - t)) : strdup(".");
    size_t blen = strlen(base);
    DIR *dp = dir && blen ? opendir(dir) : NULL;
    struct dirent *e;
    while (dp && (e = readdir(dp))) {
        if (strncmp(e->d_name, base, blen) || e->d_name[blen] != '.')
            continue;
        long long pid = temp_owner(e->d_name + blen + 1);
        struct stat sb;
        /* A pid that no process has is a writer that died mid-write: what
         * it left is nobody's. A live pid (this process's writers among
         * them) may be writing: its file stays. */
        if (pid <= 0 || pid > INT_MAX || pid == (long long)getpid() ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        if (fstatat(dirfd(dp), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            unlinkat(dirfd(dp), e->d_name, 0);
    }
    if (dp)
        closedir(dp);
    free(dir);
    free(real);
}
