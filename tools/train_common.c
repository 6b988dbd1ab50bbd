/*
 * train_common.c — options, data sets, evaluation and the model config JSON,
 * shared by `vitc train` and `vitc eval`.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "models/vit_config.h"
#include "train.h"

/* ---- options ---------------------------------------------------------- */

int topt_parse(const char *cmd, const char *usage, const cli_opt *opts, int n, int argc,
               char **argv, const char *arg_name, const char **arg) {
    const cli_spec spec = {opts, n, -1, "argument"};
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    int n_pos, rc;
    if (!pos)
        return cli_error("out of memory");
    /* Every positional is taken, then counted: an unknown option after a
     * stray argument is the error reported, and --help anywhere wins. */
    rc = cli_parse_command(cmd, &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(usage, stdout);
        rc = -1;
    } else if (rc != CLI_PARSE_OK) {
        rc = CLI_USAGE;
    } else if (!arg && n_pos) {
        rc = cli_usage_error(cmd, "unexpected argument '%s'", pos[0]);
    } else if (arg && n_pos != 1) {
        rc = cli_usage_error(cmd, "one %s, please (got %d arguments)", arg_name, n_pos);
    } else if (arg) {
        *arg = pos[0];
    }
    free(pos);
    return rc;
}

/* ---- data sets -------------------------------------------------------- */

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

int train_data_open(const char *spec, int need_train, int n_classes, const char *const *classes,
                    train_data *d) {
    memset(d, 0, sizeof *d);
    char buf[4096];
    vitc_status s;
    if (!spec || !*spec)
        return cli_error("--data is required");
    if (strlen(spec) > 3800)
        return cli_error("--data: path too long");
    int fashion = !strcmp(spec, "fashion-mnist");
    const char *dir = fashion ? VITC_FASHION_MNIST_DIR : spec;
    snprintf(buf, sizeof buf, "%s/t10k-images-idx3-ubyte", dir);
    int idx = fashion || exists(buf) || (strcat(buf, ".gz"), exists(buf));
    if (idx) {
        /* Fashion-MNIST: its class names and the statistics everyone uses
         * (mean 0.2860, std 0.3530 of the training pixels); other IDX sets
         * are MNIST's digits (0.1307, 0.3081). */
        if (fashion && !is_dir(dir))
            return cli_error("%s: no such folder (install Debian's dataset-fashion-mnist: "
                             "apt-get install dataset-fashion-mnist)", dir);
        int named = fashion || strstr(dir, "fashion") != NULL;
        d->idx = 1;
        d->mean = named ? 0.2860f : 0.1307f;
        d->std = named ? 0.3530f : 0.3081f;
        snprintf(d->desc, sizeof d->desc, "%s", named ? "fashion-mnist" : "mnist");
        if (need_train && (s = vitc_dataset_open_mnist_dir(dir, 1, named, &d->train)) != VITC_OK)
            return cli_lib_error("training set");
        if ((s = vitc_dataset_open_mnist_dir(dir, 0, named, &d->eval)) != VITC_OK) {
            train_data_close(d);
            return cli_lib_error("test set");
        }
        /* The model's classes are the training set's: a test label beyond
         * them could not be scored, which is known now, not after an epoch. */
        if (need_train && vitc_dataset_num_classes(d->eval) > vitc_dataset_num_classes(d->train)) {
            int tc = vitc_dataset_num_classes(d->train), ec = vitc_dataset_num_classes(d->eval);
            train_data_close(d);
            return cli_error("%s: the test labels go up to %d, the training set has classes 0 to %d only: "
                             "the training set must have every class the test set has", dir,
                             ec - 1, tc - 1);
        }
        return CLI_OK;
    }
    if (!is_dir(spec))
        return cli_error("--data %s: not 'fashion-mnist', an IDX folder or an ImageFolder root",
                         spec);
    snprintf(d->desc, sizeof d->desc, "folder");
    d->mean = 0.449f; /* ImageNet's, for a gray model; RGB models take all three */
    d->std = 0.226f;
    char tr[4096], va[4096];
    snprintf(tr, sizeof tr, "%s/train", spec);
    snprintf(va, sizeof va, "%s/val", spec);
    int has_train = is_dir(tr), has_val = is_dir(va);
    if (need_train) {
        if (!has_train)
            return cli_error("%s: no train/ folder (an ImageFolder root holds train/<class>/ "
                             "and val/<class>/)", spec);
        if (vitc_dataset_open_folder(tr, 0, NULL, &d->train) != VITC_OK)
            return cli_lib_error("training set");
        /* The class names become the model's labels, JSON text in the
         * checkpoint: a name that is not UTF-8 could never be saved. */
        for (int i = 0; i < vitc_dataset_num_classes(d->train); i++) {
            const char *name = vitc_dataset_class_name(d->train, i);
            char *fixed = cli_utf8_valid(name);
            int bad = !fixed || strcmp(fixed, name);
            if (bad) {
                int rc = fixed ? cli_error("%s: the class folder \"%s\" (bytes shown as U+FFFD) "
                                           "is not valid UTF-8; class names are stored as the "
                                           "model's labels, which are text: rename the folder",
                                           tr, fixed)
                               : cli_error("out of memory");
                free(fixed);
                train_data_close(d);
                return rc;
            }
            free(fixed);
        }
        if (has_val) {
            int nc = vitc_dataset_num_classes(d->train);
            const char **names = calloc((size_t)nc, sizeof *names);
            if (!names)
                return train_data_close(d), cli_error("out of memory");
            for (int i = 0; i < nc; i++) names[i] = vitc_dataset_class_name(d->train, i);
            s = vitc_dataset_open_folder(va, nc, names, &d->eval);
            free(names);
            if (s != VITC_OK) {
                train_data_close(d);
                return cli_lib_error("validation set");
            }
        }
        return CLI_OK;
    }
    /* eval: val/ when there is one, else the folder itself is the split */
    if (!has_val && has_train)
        return cli_error("%s: no val/ folder to evaluate on (give %s/train to evaluate on the "
                         "training images)", spec, spec);
    if (vitc_dataset_open_folder(has_val ? va : spec, n_classes, classes, &d->eval) != VITC_OK)
        return cli_lib_error("evaluation set");
    return CLI_OK;
}

void train_data_close(train_data *d) {
    vitc_dataset_free(d->train);
    vitc_dataset_free(d->eval);
    d->train = d->eval = NULL;
}

/* ---- evaluation ------------------------------------------------------- */

vitc_batch_opts train_batch_opts(const vitc_vit_config *c) {
    vitc_batch_opts o = vitc_batch_default_opts(c->image_size, c->in_channels);
    for (int i = 0; i < 3; i++) {
        o.mean[i] = c->mean[i];
        o.std[i] = c->std[i];
    }
    return o;
}

int train_argmax(const float *l, int C) {
    int best = 0;
    for (int j = 1; j < C; j++)
        if (l[j] > l[best])
            best = j;
    return best;
}

/* ---- the model config JSON --------------------------------------------- */

int train_config_from_file(const char *path, vitc_vit_config *c) {
    FILE *f;
    if (vitc_open_read(path, 1 << 20, &f, NULL) != VITC_OK)
        return cli_lib_error("--config");
    json_error_t err;
    json_t *o = json_loadf(f, 0, &err);
    fclose(f);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return cli_error("--config %s: not a JSON object (%s, line %d)", path, err.text, err.line);
    }
    struct { const char *k; int *v; } ints[] = {
        {"image_size", &c->image_size}, {"patch_size", &c->patch_size},
        {"in_channels", &c->in_channels}, {"hidden_dim", &c->hidden_dim},
        {"depth", &c->depth}, {"num_heads", &c->num_heads}, {"mlp_dim", &c->mlp_dim}};
    int rc = CLI_OK;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && rc == CLI_OK; i++) {
        json_t *v = json_object_get(o, ints[i].k);
        if (!v)
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
            rc = cli_error("--config %s: \"%s\" must be a positive integer", path, ints[i].k);
        else
            *ints[i].v = (int)json_integer_value(v);
    }
    json_t *v = json_object_get(o, "norm_eps");
    if (rc == CLI_OK && v) {
        if (!json_is_number(v) || !(json_number_value(v) > 0))
            rc = cli_error("--config %s: \"norm_eps\" must be a positive number", path);
        else
            c->norm_eps = (float)json_number_value(v);
    }
    const char *arr[2] = {"mean", "std"};
    for (int a = 0; a < 2 && rc == CLI_OK; a++) {
        json_t *x = json_object_get(o, arr[a]);
        if (!x)
            continue;
        if (!json_is_array(x) || json_array_size(x) != 3)
            rc = cli_error("--config %s: \"%s\" must be an array of 3 numbers", path, arr[a]);
        for (int i = 0; i < 3 && rc == CLI_OK; i++) {
            json_t *e = json_array_get(x, (size_t)i);
            if (!json_is_number(e) || (a == 1 && !(json_number_value(e) > 0)))
                rc = cli_error("--config %s: \"%s\"[%d] is not a valid number", path, arr[a], i);
            else
                (a ? c->std : c->mean)[i] = (float)json_number_value(e);
        }
    }
    json_decref(o);
    return rc;
}

/* ---- sparse counts ---------------------------------------------------- */

void eval_counts_free(eval_counts *e) {
    free(e->total), free(e->hit), free(e->key), free(e->val);
    memset(e, 0, sizeof *e);
}

static int counts_add(eval_counts *e, int t, int p) {
    if (2 * (e->n + 1) > e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 1024;
        int64_t *k = malloc(cap * sizeof *k), *v = calloc(cap, sizeof *v);
        if (!k || !v) {
            free(k), free(v);
            return -1;
        }
        for (size_t i = 0; i < cap; i++) k[i] = -1;
        for (size_t i = 0; i < e->cap; i++) {
            if (e->key[i] < 0)
                continue;
            size_t h = (size_t)((uint64_t)e->key[i] * 0x9e3779b97f4a7c15ULL % cap);
            while (k[h] >= 0) h = (h + 1) % cap;
            k[h] = e->key[i], v[h] = e->val[i];
        }
        free(e->key), free(e->val);
        e->key = k, e->val = v, e->cap = cap;
    }
    int64_t key = (int64_t)t * e->C + p;
    size_t h = (size_t)((uint64_t)key * 0x9e3779b97f4a7c15ULL % e->cap);
    while (e->key[h] >= 0 && e->key[h] != key) h = (h + 1) % e->cap;
    if (e->key[h] < 0)
        e->key[h] = key, e->n++;
    e->val[h]++;
    e->total[t]++;
    e->hit[t] += t == p;
    return 0;
}

int64_t *eval_counts_dense(const eval_counts *e) {
    int64_t *cm = calloc((size_t)e->C * (size_t)e->C, sizeof *cm);
    for (size_t i = 0; cm && i < e->cap; i++)
        if (e->key[i] >= 0)
            cm[e->key[i]] = e->val[i];
    return cm;
}

/* The one evaluation loop of `train`, `eval` and the demo. Its memory is a
 * batch of images and logits plus, when counts are asked for, 2 x C totals
 * and at most one cell per image: never a C x C matrix. */
int train_evaluate(vitc_vit *m, vitc_dataset *ds, int batch, eval_result *r, eval_counts *e,
                   int quiet, const char *what) {
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int C = c->num_classes, S = c->image_size;
    int64_t n = vitc_dataset_size(ds);
    size_t per = (size_t)c->in_channels * S * S;
    memset(r, 0, sizeof *r);
    if (vitc_dataset_num_classes(ds) > C)
        return cli_error("%s has %d classes, the model %d", what, vitc_dataset_num_classes(ds), C);
    int rc = CLI_OK;
    if (e) {
        memset(e, 0, sizeof *e);
        e->C = C;
        e->total = calloc((size_t)C, sizeof *e->total);
        e->hit = calloc((size_t)C, sizeof *e->hit);
        if (!e->total || !e->hit)
            rc = cli_error("out of memory for the counts of %d classes", C);
    }
    float *x = malloc((size_t)batch * per * sizeof *x);       /* [batch, in_channels, S, S] */
    float *logits = malloc((size_t)batch * C * sizeof *logits); /* [batch, C] */
    int64_t *idx = malloc((size_t)batch * sizeof *idx), *lab = malloc((size_t)batch * sizeof *lab);
    if (rc == CLI_OK && (!x || !logits || !idx || !lab))
        rc = cli_error("out of memory for an evaluation batch of %d", batch);
    int training = vitc_vit_is_training(m);
    vitc_vit_set_training(m, 0);
    vitc_batch_opts o = train_batch_opts(c);
    cli_progress pr;
    cli_progress_start(&pr, what, n, quiet);
    double loss_sum = 0;
    for (int64_t i = 0; i < n && rc == CLI_OK; i += batch) {
        int b = (int)(n - i < batch ? n - i : batch), nv;
        for (int k = 0; k < b; k++) idx[k] = i + k;
        if (vitc_dataset_load_batch(ds, idx, b, &o, x, lab, &nv) != VITC_OK) {
            rc = cli_lib_error(what);
            break;
        }
        if (nv && vitc_vit_forward(m, x, nv, S, S, logits) != VITC_OK) {
            rc = cli_lib_error("forward");
            break;
        }
        for (int k = 0; k < nv && rc == CLI_OK; k++) {
            const float *l = logits + (size_t)k * C;
            int best = train_argmax(l, C);
            float mx = l[best];
            double se = 0;
            for (int j = 0; j < C; j++) se += exp((double)l[j] - mx);
            loss_sum += log(se) + mx - l[lab[k]];
            r->correct += best == lab[k];
            if (e && counts_add(e, (int)lab[k], best) != 0)
                rc = cli_error("out of memory for the confusion counts");
        }
        r->n += nv;
        cli_progress_update(&pr, i + b);
    }
    cli_progress_clear(&pr);
    r->loss = r->n ? loss_sum / r->n : 0;
    r->skipped = vitc_dataset_num_skipped(ds);
    vitc_vit_set_training(m, training);
    free(x), free(logits), free(idx), free(lab);
    return rc;
}

/* ---- outputs -----------------------------------------------------------
 * Everything `vitc train` will write is checked before anything is read or
 * trained, so that a path that cannot be written fails in a second rather
 * than after an epoch whose work is then lost. Each output is also locked
 * (flock on PATH.lock, non-blocking) for the run, so that a second run on
 * the same file stops at once instead of both finishing "successfully"
 * with the last writer's file. */

/* The folder part of path, malloc'ed ("." for a bare name). */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* path with its folder resolved (realpath) and its last part as given, so
 * that two spellings of one place compare equal before the file exists. */
static char *canon(const char *path) {
    char *dir = dir_of(path), *real = dir ? realpath(dir, NULL) : NULL;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t cap = (real ? strlen(real) : 0) + strlen(base) + 2;
    char *c = real ? malloc(cap) : NULL;
    if (c)
        snprintf(c, cap, "%s/%s", real, base);
    free(dir), free(real);
    return c ? c : strdup(path);
}

static int same_place(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *ca = canon(a), *cb = canon(b);
    int same = ca && cb && !strcmp(ca, cb);
    free(ca), free(cb);
    return same;
}

static int check_output(const train_output *t) {
    struct stat sb;
    if (!*t->path)
        return cli_error("%s: an empty file name", t->opt);
    if (lstat(t->path, &sb) == 0) {
        if (S_ISLNK(sb.st_mode))
            return cli_error("%s %s: is a symbolic link; vitc train writes only to the path it is "
                             "given, never through a link: name the file itself", t->opt,
                             t->path);
        if (!S_ISREG(sb.st_mode))
            return cli_error("%s %s: is %s; give the name of a file to write", t->opt, t->path,
                             vitc__file_kind(sb.st_mode));
        if (access(t->path, W_OK) != 0)
            return cli_error("%s %s: cannot write: %s", t->opt, t->path, strerror(errno));
    } else if (errno != ENOENT) {
        return cli_error("%s %s: %s", t->opt, t->path, strerror(errno));
    }
    char *dir = dir_of(t->path);
    if (!dir)
        return cli_error("out of memory");
    int rc = CLI_OK;
    if (stat(dir, &sb) != 0)
        rc = cli_error("%s %s: its folder %s: %s", t->opt, t->path, dir, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        rc = cli_error("%s %s: %s is not a folder", t->opt, t->path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        rc = cli_error("%s %s: cannot create files in %s: %s", t->opt, t->path, dir,
                       strerror(errno));
    free(dir);
    return rc;
}

/* flock PATH.lock. The file is removed when the run ends; a run that finds
 * the lock file it opened already removed (by a run ending meanwhile)
 * opens it again, so two runs never hold two different lock files. */
static int lock_output(train_output *t) {
    size_t cap = strlen(t->path) + 8;
    if (!(t->lock = malloc(cap)))
        return cli_error("out of memory");
    snprintf(t->lock, cap, "%s.lock", t->path);
    for (int tries = 0; tries < 100; tries++) {
        struct stat a, b;
        int fd = open(t->lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
                      0666);
        if (fd < 0)
            return cli_error("%s %s: cannot create its lock file %s: %s", t->opt, t->path,
                             t->lock, strerror(errno));
        if (fstat(fd, &a) != 0 || !S_ISREG(a.st_mode)) {
            close(fd);
            return cli_error("%s %s: its lock file %s is not a regular file", t->opt, t->path,
                             t->lock);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            char pid[32] = "";
            ssize_t n = read(fd, pid, sizeof pid - 1);
            pid[n > 0 ? n : 0] = 0;
            pid[strcspn(pid, "\n")] = 0;
            close(fd);
            if (e == EWOULDBLOCK)
                return cli_error("%s %s: another vitc train (process %s) is writing it; wait "
                                 "for it to end or give another file", t->opt, t->path,
                                 *pid ? pid : "?");
            return cli_error("%s %s: cannot lock %s: %s", t->opt, t->path, t->lock,
                             strerror(e));
        }
        if (stat(t->lock, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)n) != n) {
                /* the pid is for the message of a second run only */
            }
            t->fd = fd;
            return CLI_OK;
        }
        close(fd);
    }
    return cli_error("%s %s: its lock file %s keeps changing", t->opt, t->path, t->lock);
}

int train_outputs_open(train_output *out, int n, const train_output *in, int n_in) {
    int rc = CLI_OK;
    for (int i = 0; i < n; i++) out[i].fd = -1, out[i].lock = NULL;
    for (int i = 0; i < n && rc == CLI_OK; i++) {
        if (!out[i].path)
            continue;
        if ((rc = check_output(&out[i])) != CLI_OK)
            break;
        for (int j = 0; j < i && rc == CLI_OK; j++)
            if (out[j].path && same_place(out[i].path, out[j].path))
                rc = cli_usage_error("train", "%s and %s name the same file (%s)", out[j].opt,
                                     out[i].opt, out[i].path);
        for (int j = 0; j < n_in && rc == CLI_OK; j++)
            if (in[j].path && in[j].same_ok != i && same_place(out[i].path, in[j].path))
                rc = cli_usage_error("train", "%s %s is the %s file: it would be overwritten",
                                     out[i].opt, out[i].path, in[j].opt);
    }
    for (int i = 0; i < n && rc == CLI_OK; i++)
        if (out[i].path)
            rc = lock_output(&out[i]);
    if (rc != CLI_OK)
        train_outputs_close(out, n);
    return rc;
}

void train_outputs_close(train_output *out, int n) {
    for (int i = 0; i < n; i++) {
        if (out[i].fd >= 0) {
            unlink(out[i].lock); /* still locked: no run can have taken it meanwhile */
            close(out[i].fd);
        }
        free(out[i].lock);
        out[i].fd = -1;
        out[i].lock = NULL;
    }
}

int train_log_open(const char *path, int append, FILE **f) {
    *f = NULL;
    /* O_NONBLOCK: a FIFO without a reader would block the open forever */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
                            O_NOCTTY, 0666);
    struct stat sb;
    if (fd < 0)
        return cli_error("--log %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cli_error("--log %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cli_error("--log %s: is %s; the log is a regular file", path, vitc__file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || (!append && ftruncate(fd, 0) != 0) ||
        !(*f = fdopen(fd, "a"))) {
        int e = errno;
        close(fd);
        return cli_error("--log %s: %s", path, strerror(e));
    }
    return CLI_OK;
}

int train_log_flush(FILE *f, const char *path) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f))
        return CLI_OK;
    return cli_error("--log %s: write failed: %s", path, errno ? strerror(errno) : "I/O error");
}
