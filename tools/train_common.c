/*
 * train_common.c — options, data sets, evaluation and the model config JSON,
 * shared by `vitc train` and `vitc eval`.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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

int train_evaluate(vitc_vit *m, vitc_dataset *ds, int batch, eval_result *r, int64_t *confusion,
                   int quiet, const char *what) {
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int C = c->num_classes, S = c->image_size;
    int64_t n = vitc_dataset_size(ds);
    size_t per = (size_t)c->in_channels * S * S;
    memset(r, 0, sizeof *r);
    if (vitc_dataset_num_classes(ds) > C)
        return cli_error("%s has %d classes, the model %d", what, vitc_dataset_num_classes(ds), C);
    float *x = malloc((size_t)batch * per * sizeof *x);
    float *logits = malloc((size_t)batch * C * sizeof *logits);
    int64_t *idx = malloc((size_t)batch * sizeof *idx), *lab = malloc((size_t)batch * sizeof *lab);
    if (!x || !logits || !idx || !lab) {
        free(x), free(logits), free(idx), free(lab);
        return cli_error("out of memory for an evaluation batch of %d", batch);
    }
    if (confusion)
        memset(confusion, 0, (size_t)C * C * sizeof *confusion);
    int training = vitc_vit_is_training(m);
    vitc_vit_set_training(m, 0);
    vitc_batch_opts o = train_batch_opts(c);
    int rc = CLI_OK;
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
        if (nv == 0)
            continue;
        if (vitc_vit_forward(m, x, nv, S, S, logits) != VITC_OK) {
            rc = cli_lib_error("forward");
            break;
        }
        for (int k = 0; k < nv; k++) {
            const float *l = logits + (size_t)k * C;
            int best = train_argmax(l, C);
            float mx = l[best];
            double se = 0;
            for (int j = 0; j < C; j++) se += exp((double)l[j] - mx);
            loss_sum += log(se) + mx - l[lab[k]];
            r->correct += best == lab[k];
            if (confusion)
                confusion[lab[k] * C + best]++;
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

