/*
 * cmd_train.c — `vitc train`: a Vision Transformer trained on Fashion-MNIST,
 * MNIST or an ImageFolder tree, with checkpoints a run resumes from bit for
 * bit.
 *
 * Determinism: the data order of epoch e is a Fisher-Yates shuffle drawn
 * from (seed, e), a batch's augmentation from (seed, global step), the model
 * from seed; nothing depends on wall time, thread count or on where a run
 * was stopped. So the training state a checkpoint needs is the parameters,
 * the optimizer's moments and step, and (epoch, step in epoch) — plus the
 * hyperparameters, kept so that `--resume CKPT` alone continues the run.
 *
 * The checkpoint is the --out file: model tensors under torchvision's names
 * with vitc.config (labels, mean, std) — a model for every vitc command —
 * plus "vitc.optim.*" tensors (the optimizer state, flat, in the parameter
 * layout) and "vitc.train" metadata. It is replaced atomically (temporary
 * file, fsync, rename) after every epoch and when SIGINT, SIGTERM or SIGHUP
 * (a dropped SSH session) stops the run between two steps. The format is
 * the library's (vitc_checkpoint_save / vitc_checkpoint_load,
 * src/train/checkpoint.c).
 *
 * Fine-tuning: --init takes any model vitc loads; a model whose classes
 * are not the folder's gets a new head (vitc_vit_reset_head).
 * --freeze-backbone trains that head alone on embeddings computed once.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "rng.h"
#include "models/vit_config.h"
#include "train.h"

static const char train_usage[] =
    "usage: vitc train --data DIR|fashion-mnist --out M.safetensors [options]\n"
    "\n"
    "Train a Vision Transformer (torchvision's architecture and initialisation)\n"
    "with AdamW and cross-entropy. --out is the checkpoint, written after every\n"
    "epoch and on SIGINT/SIGTERM/SIGHUP; it loads as a model in every vitc\n"
    "command.\n"
    "\n"
    "data:\n"
    "  --data D          fashion-mnist (Debian's dataset-fashion-mnist), a folder\n"
    "                    of MNIST-style IDX files, or an ImageFolder root with\n"
    "                    train/<class>/*.png|jpg (and val/<class>/...)\n"
    "  --subset N        train on the first N training images only\n"
    "  --eval-subset N   evaluate on the first N test/val images only\n"
    "  --augment LIST    comma list of crop (RandomCrop, padding 4), flip\n"
    "                    (horizontal), resized-crop (RandomResizedCrop; ImageFolder)\n"
    "model (a new one; --resume and --init take the file's):\n"
    "  --arch NAME       fashion (28px, patch 4, depth 6, dim 96, 4 heads, MLP 192;\n"
    "                    the default)%s\n"
    "  --config FILE     JSON as in vitc.config (image_size, patch_size, in_channels,\n"
    "                    hidden_dim, depth, num_heads, mlp_dim, norm_eps, mean, std)\n"
    "  --image-size S --patch P --depth D --dim C --heads H --mlp M --channels 1|3\n"
    "                    override the architecture's values\n"
    "  --init M          start from model M (a fresh optimizer): a .safetensors or a\n"
    "                    Hub directory. Its classes are the folder's (same names in\n"
    "                    order, or same count when M has no names): its weights are\n"
    "                    the start, head included. Otherwise it is fine-tuned: its\n"
    "                    head replaced by a new one for the folder's classes\n"
    "  --freeze-backbone with --init: a linear probe. Each image's embedding is\n"
    "                    computed once (no augmentation), then only the head is\n"
    "                    trained on them; the saved model classifies as usual\n"
    "optimisation:\n"
    "  --epochs N        train until N epochs are done (required)\n"
    "  --batch B         images per step (default 128)\n"
    "  --lr LR           peak learning rate (default 1e-3)\n"
    "  --weight-decay WD AdamW's decoupled weight decay (default 0.05; not on biases,\n"
    "                    norms, class token, position embedding)\n"
    "  --warmup E        linear warmup over E epochs (default 0; fractions allowed)\n"
    "  --schedule S      none (constant, the default), cosine (to --min-lr after\n"
    "                    warmup) or onecycle (torch's OneCycleLR, max_lr = --lr)\n"
    "  --schedule-epochs E  the schedule's length (default --epochs)\n"
    "  --min-lr LR       cosine's final rate (default 0)\n"
    "  --label-smoothing X  (default 0)\n"
    "  --clip X          clip the gradients' global norm to X (default: no clipping)\n"
    "  --lr-layer-decay F  layer-wise lr decay (BEiT): block l of L at lr*F^(L-l), the\n"
    "                    embeddings F^(L+1), final norm and head 1 (default 1: off)\n"
    "  --seed S          model initialisation, data order, augmentation (default 0)\n"
    "run:\n"
    "  --out FILE        the checkpoint (required)\n"
    "  --model-out FILE  when done, also write the model alone (no optimizer\n"
    "                    state: a third of the checkpoint's size)\n"
    "  --resume CKPT     continue the run saved in CKPT up to --epochs; its\n"
    "                    hyperparameters are kept unless given again\n"
    "  --eval-every E    evaluate every E epochs and after the last (default 1; 0: last only)\n"
    "  --log FILE.jsonl  one JSON object per step and per epoch (appended on --resume)\n"
    "  --threads N       threads (default: all CPUs available)\n"
    "  --quiet           no progress on stderr\n"
    "  -h, --help        this help\n"
    "\n"
    "Unreadable ImageFolder images are skipped with a warning and counted.\n"
#ifdef VITC_MPI
    "Data parallel: mpirun -np K vitc train ... splits every batch over K ranks\n"
    "(this vitc was built with MPI=1).\n"
#endif
    "Exit status: 0 done, 1 failed, 2 usage error, 128+N stopped by signal N\n"
    "(SIGINT, SIGTERM, SIGHUP, SIGPIPE) after writing the checkpoint.\n";

/* --arch NAME's config into c: "fashion", the CLI's small Fashion-MNIST
 * model (1 channel on IDX data), else the library's ViT preset of that
 * name (vitc__vit_preset_config: one table for vitc_vit_load and train). */
static int arch_config(const char *name, vitc_vit_config *c) {
    if (!strcmp(name, "fashion")) {
        *c = vitc_vit_default_config();
        c->image_size = 28;
        c->patch_size = 4;
        c->in_channels = 1;
        c->hidden_dim = 96;
        c->depth = 6;
        c->num_heads = 4;
        c->mlp_dim = 192;
        return CLI_OK;
    }
    if (vitc__vit_preset_config(name, c))
        return CLI_OK;
    return cli_error("--arch %s: unknown (see vitc train --help)", name);
}

/* train_usage with the library's preset names listed after "fashion",
 * wrapped as the rest of the help is, into buf. */
static void train_usage_text(char *buf, size_t cap) {
    char list[512] = "";
    size_t col = 33; /* after "                    the default)" */
    for (int i = 0; vitc__vit_preset_name(i); i++) {
        const char *nm = vitc__vit_preset_name(i);
        size_t len = strlen(list), w = strlen(nm) + 2;
        int wrap = col + w > 86;
        snprintf(list + len, sizeof list - len, wrap ? ",\n                    %s" : ", %s", nm);
        col = wrap ? 20 + w - 2 : col + w;
    }
    snprintf(buf, cap, train_usage, list);
}

/* The options' ranges, which a resumed checkpoint's record must keep too. */
#define TRAIN_MAX_EPOCHS 1000000
#define TRAIN_MAX_BATCH 65536
#define TRAIN_MAX_LR 10
#define TRAIN_MAX_WD 10
#define TRAIN_MAX_CLIP 1e9
#define TRAIN_MAX_SUBSET 1000000000

/* The hyperparameters of a run, as the checkpoint keeps them. */
typedef struct hyper {
    int batch;
    double lr, wd, warmup, smoothing, clip, schedule_epochs, min_lr;
    char schedule[16];
    int schedule_fixed; /* --schedule-epochs was given: resumes keep it */
    double layer_decay; /* --lr-layer-decay (1: off) */
    int freeze;         /* --freeze-backbone: a linear probe */
    unsigned augment;
    uint64_t seed;
    int64_t subset, eval_subset;
} hyper;

typedef struct train_opts {
    const char *data, *arch, *config, *out, *resume, *init, *log, *schedule, *augment, *seed;
    const char *model_out;
    int freeze;
    double layer_decay;
    int g_layer_decay;
    int image_size, patch, depth, dim, heads, mlp, channels;
    int epochs, batch, threads, eval_every, quiet, subset, eval_subset;
    double lr, wd, warmup, smoothing, clip, schedule_epochs, min_lr;
    /* given on the command line */
    int g_image_size, g_patch, g_depth, g_dim, g_heads, g_mlp, g_channels, g_batch, g_lr, g_wd,
        g_warmup, g_smoothing, g_clip, g_schedule_epochs, g_min_lr, g_schedule, g_augment,
        g_seed, g_subset, g_eval_subset, g_epochs;
} train_opts;

static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }

static int parse_augment(const char *s, unsigned *out) {
    *out = 0;
    if (!s || !*s || !strcmp(s, "none"))
        return 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "crop"))
            *out |= VITC_AUG_CROP;
        else if (!strcmp(t, "flip"))
            *out |= VITC_AUG_FLIP;
        else if (!strcmp(t, "resized-crop"))
            *out |= VITC_AUG_RESIZED_CROP;
        else
            return -1;
    }
    return 0;
}

static void augment_str(unsigned a, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s%s%s", a & VITC_AUG_CROP ? "crop," : "", a & VITC_AUG_FLIP ? "flip," : "",
             a & VITC_AUG_RESIZED_CROP ? "resized-crop," : "", a ? "" : "none");
    size_t n = strlen(buf);
    if (n && buf[n - 1] == ',')
        buf[n - 1] = 0;
}

/* ---- the model's architecture ---------------------------------------- */

/* A new model's config: preset, then --config, then the flags. */
static int build_config(const train_opts *o, const train_data *d, vitc_vit_config *c) {
    *c = vitc_vit_default_config();
    vitc_vit_config p;
    if (arch_config(o->arch ? o->arch : "fashion", &p) != CLI_OK)
        return CLI_FAIL;
    c->image_size = p.image_size;
    c->patch_size = p.patch_size;
    c->in_channels = d->idx ? p.in_channels : 3;
    c->hidden_dim = p.hidden_dim;
    c->depth = p.depth;
    c->num_heads = p.num_heads;
    c->mlp_dim = p.mlp_dim;
    if (d->idx || c->in_channels == 1) {
        for (int i = 0; i < 3; i++) {
            c->mean[i] = d->mean;
            c->std[i] = d->std;
        }
    }
    if (!d->idx && c->in_channels == 3) {
        const float m[3] = {0.485f, 0.456f, 0.406f}, s[3] = {0.229f, 0.224f, 0.225f};
        memcpy(c->mean, m, sizeof m);
        memcpy(c->std, s, sizeof s);
    }
    if (o->config && train_config_from_file(o->config, c) != CLI_OK)
        return CLI_FAIL;
    if (o->g_image_size) c->image_size = o->image_size;
    if (o->g_patch) c->patch_size = o->patch;
    if (o->g_depth) c->depth = o->depth;
    if (o->g_dim) c->hidden_dim = o->dim;
    if (o->g_heads) c->num_heads = o->heads;
    if (o->g_mlp) c->mlp_dim = o->mlp;
    if (o->g_channels) c->in_channels = o->channels;
    c->num_classes = vitc_dataset_num_classes(d->train);
    return CLI_OK;
}

/* On --resume / --init the file's architecture rules; flags that disagree
 * with it are an error, not silently ignored. */
static int check_model_matches(const train_opts *o, const vitc_vit_config *c, const char *path) {
    struct { int given, want, have; const char *flag; } f[] = {
        {o->g_image_size, o->image_size, c->image_size, "--image-size"},
        {o->g_patch, o->patch, c->patch_size, "--patch"},
        {o->g_depth, o->depth, c->depth, "--depth"},
        {o->g_dim, o->dim, c->hidden_dim, "--dim"},
        {o->g_heads, o->heads, c->num_heads, "--heads"},
        {o->g_mlp, o->mlp, c->mlp_dim, "--mlp"},
        {o->g_channels, o->channels, c->in_channels, "--channels"}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given && f[i].want != f[i].have)
            return cli_error("%s: the checkpoint's model has %s %d, not %d", path, f[i].flag + 2,
                             f[i].have, f[i].want);
    if (o->arch || o->config) {
        vitc_vit_config want;
        /* compare the architecture the flags name with the file's */
        vitc_vit_config p;
        if (o->arch && arch_config(o->arch, &p) != CLI_OK)
            return CLI_FAIL;
        want = *c;
        if (o->arch) {
            want.image_size = p.image_size;
            want.patch_size = p.patch_size;
            want.hidden_dim = p.hidden_dim;
            want.depth = p.depth;
            want.num_heads = p.num_heads;
            want.mlp_dim = p.mlp_dim;
        }
        if (o->config && train_config_from_file(o->config, &want) != CLI_OK)
            return CLI_FAIL;
        if (want.image_size != c->image_size || want.patch_size != c->patch_size ||
            want.hidden_dim != c->hidden_dim || want.depth != c->depth ||
            want.num_heads != c->num_heads || want.mlp_dim != c->mlp_dim)
            return cli_error("%s: a model of %dpx, patch %d, depth %d, dim %d, %d heads, MLP %d; "
                             "%s asks for %dpx, patch %d, depth %d, dim %d, %d heads, MLP %d",
                             path, c->image_size, c->patch_size, c->depth, c->hidden_dim,
                             c->num_heads, c->mlp_dim, o->arch ? "--arch" : "--config",
                             want.image_size, want.patch_size, want.depth, want.hidden_dim,
                             want.num_heads, want.mlp_dim);
    }
    return CLI_OK;
}

/* The model's labels must be the data set's classes, in order. */
static int check_labels(vitc_vit *m, vitc_dataset *ds, const char *path) {
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int nc = vitc_dataset_num_classes(ds);
    if (c->num_classes != nc)
        return cli_error("%s: a model of %d classes; the data set has %d", path, c->num_classes,
                         nc);
    for (int i = 0; i < nc; i++) {
        const char *a = vitc_vit_label(m, i), *b = vitc_dataset_class_name(ds, i);
        if (a && b && strcmp(a, b))
            return cli_error("%s: class %d is \"%s\" in the model, \"%s\" in the data set", path, i,
                             a, b);
    }
    return CLI_OK;
}

/* ---- checkpoints ------------------------------------------------------- */

typedef struct progress_state {
    int epoch;             /* epochs done */
    int64_t step_in_epoch; /* steps done in epoch `epoch` (0 at an epoch's end) */
    int64_t global_step;
} progress_state;

static char *train_meta_json(const hyper *h, const progress_state *p, const char *data) {
    json_t *o = json_object();
    char aug[64], seed[32];
    augment_str(h->augment, aug, sizeof aug);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)h->seed);
    int bad = !o;
    if (o) {
        bad |= json_object_set_new(o, "epoch", json_integer(p->epoch));
        bad |= json_object_set_new(o, "step_in_epoch", json_integer(p->step_in_epoch));
        bad |= json_object_set_new(o, "global_step", json_integer(p->global_step));
        bad |= json_object_set_new(o, "seed", json_string(seed));
        bad |= json_object_set_new(o, "batch", json_integer(h->batch));
        bad |= json_object_set_new(o, "lr", json_real(h->lr));
        bad |= json_object_set_new(o, "weight_decay", json_real(h->wd));
        bad |= json_object_set_new(o, "warmup_epochs", json_real(h->warmup));
        bad |= json_object_set_new(o, "schedule", json_string(h->schedule));
        bad |= json_object_set_new(o, "schedule_epochs", json_real(h->schedule_epochs));
        bad |= json_object_set_new(o, "schedule_fixed", json_boolean(h->schedule_fixed));
        bad |= json_object_set_new(o, "min_lr", json_real(h->min_lr));
        bad |= json_object_set_new(o, "label_smoothing", json_real(h->smoothing));
        bad |= json_object_set_new(o, "clip", json_real(h->clip));
        bad |= json_object_set_new(o, "augment", json_string(aug));
        bad |= json_object_set_new(o, "subset", json_integer(h->subset));
        bad |= json_object_set_new(o, "eval_subset", json_integer(h->eval_subset));
        bad |= json_object_set_new(o, "data", json_string(data));
        bad |= json_object_set_new(o, "optimizer", json_string("adamw"));
        /* only when on: a run without it writes what earlier versions wrote */
        if (h->layer_decay != 1)
            bad |= json_object_set_new(o, "lr_layer_decay", json_real(h->layer_decay));
        if (h->freeze)
            bad |= json_object_set_new(o, "freeze_backbone", json_true());
        /* The generators are counter-based (seed, epoch, step): this is all
         * of their state. */
        bad |= json_object_set_new(o, "rng", json_string("splitmix64(seed, epoch, step)"));
    }
    char *t = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    return t;
}

/* with_optim 0 writes the model alone (what --model-out ships). The file
 * format is the library's (vitc_checkpoint_save, src/train/checkpoint.c). */
static int save_file(const char *path, vitc_vit *m, vitc_optimizer *opt, int with_optim,
                     const char *const *labels, const hyper *h, const progress_state *p,
                     const char *data) {
    char *tr = train_meta_json(h, p, data);
    if (tr && !with_optim) { /* the model alone keeps its run's optimizer step in the record */
        json_t *o = json_loads(tr, 0, NULL);
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)vitc_optimizer_get_step(opt));
        free(tr);
        tr = NULL;
        if (o && !json_object_set_new(o, "optimizer_step", json_string(step)))
            tr = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
        json_decref(o);
    }
    if (!tr)
        return cli_error("out of memory writing a checkpoint");
    int rc = CLI_OK;
    if (vitc_checkpoint_save(path, m, with_optim ? opt : NULL, labels, tr) != VITC_OK)
        rc = cli_error("writing %s %s: %s (the previous file is untouched)",
                       with_optim ? "checkpoint" : "model", path, vitc_last_error());
    free(tr);
    return rc;
}

static int save_checkpoint(const char *path, vitc_vit *m, vitc_optimizer *opt,
                           const char *const *labels, const hyper *h, const progress_state *p,
                           const char *data) {
    return save_file(path, m, opt, 1, labels, h, p, data);
}

/* A number of the resumed record within the range of the option that sets
 * it (a file is as untrusted as a command line): *v, or the error printed.
 * An absent field is an error unless it is optional (have_dflt: dflt). */
static int rec_num(json_t *o, const char *path, const char *k, int integer, double lo, double hi,
                   int have_dflt, double dflt, double *v) {
    json_t *j = json_object_get(o, k);
    if (!j && have_dflt) {
        *v = dflt;
        return CLI_OK;
    }
    if (!j || !json_is_number(j) || (integer && !json_is_integer(j)))
        return cli_error("--resume %s: vitc.train \"%s\" is %s; expected %s (a damaged or edited "
                         "checkpoint)", path, k, j ? "not a number" : "missing",
                         integer ? "an integer" : "a number");
    *v = json_number_value(j);
    if (!(*v >= lo && *v <= hi)) /* NaN too */
        return cli_error("--resume %s: vitc.train \"%s\" is %g, outside [%g, %g] (a damaged or "
                         "edited checkpoint)", path, k, *v, lo, hi);
    return CLI_OK;
}

/* Load a checkpoint: the model, the run's state and hyperparameters; the
 * optimizer's state is copied in (vitc_checkpoint_load_optimizer) once the
 * optimizer exists. Every field is held to the command line's own range:
 * a resumed run can do nothing a command line could not ask for. */
static int load_checkpoint(const char *path, vitc_vit **m, hyper *h, progress_state *p) {
    char *meta = NULL;
    if (vitc_checkpoint_load(path, m, &meta) != VITC_OK)
        return cli_lib_error("--resume");
    json_t *o = json_loads(meta, 0, NULL);
    vitc_checkpoint_free_meta(meta);
    int rc = CLI_OK;
    if (!o || !json_is_object(o)) {
        rc = cli_error("--resume %s: vitc.train metadata is not a JSON object", path);
    } else {
        json_t *seed = json_object_get(o, "seed"), *sch = json_object_get(o, "schedule"),
               *aug = json_object_get(o, "augment"), *opt = json_object_get(o, "optimizer");
        const char *sv = json_is_string(seed) ? json_string_value(seed) : "";
        const char *sn = json_is_string(sch) ? json_string_value(sch) : "";
        double ep, sie, gs, b, sub, esub;
        char *end = NULL;
        errno = 0;
        unsigned long long sd = strtoull(sv, &end, 10);
        if ((rc = rec_num(o, path, "epoch", 1, 0, TRAIN_MAX_EPOCHS, 0, 0, &ep)) ||
            (rc = rec_num(o, path, "step_in_epoch", 1, 0, 9e15, 0, 0, &sie)) ||
            (rc = rec_num(o, path, "global_step", 1, 0, 9e15, 0, 0, &gs)) ||
            (rc = rec_num(o, path, "batch", 1, 1, TRAIN_MAX_BATCH, 0, 0, &b)) ||
            (rc = rec_num(o, path, "lr", 0, 0, TRAIN_MAX_LR, 0, 0, &h->lr)) ||
            (rc = rec_num(o, path, "weight_decay", 0, 0, TRAIN_MAX_WD, 0, 0, &h->wd)) ||
            (rc = rec_num(o, path, "warmup_epochs", 0, 0, TRAIN_MAX_EPOCHS, 0, 0, &h->warmup)) ||
            (rc = rec_num(o, path, "schedule_epochs", 0, 1e-6, TRAIN_MAX_EPOCHS, 0, 0,
                          &h->schedule_epochs)) ||
            (rc = rec_num(o, path, "min_lr", 0, 0, TRAIN_MAX_LR, 0, 0, &h->min_lr)) ||
            (rc = rec_num(o, path, "label_smoothing", 0, 0, 1, 0, 0, &h->smoothing)) ||
            (rc = rec_num(o, path, "clip", 0, 0, TRAIN_MAX_CLIP, 0, 0, &h->clip)) ||
            (rc = rec_num(o, path, "subset", 1, 0, TRAIN_MAX_SUBSET, 0, 0, &sub)) ||
            /* absent in checkpoints written before it was saved: the whole set */
            (rc = rec_num(o, path, "eval_subset", 1, 0, TRAIN_MAX_SUBSET, 1, 0, &esub)) ||
            (rc = rec_num(o, path, "lr_layer_decay", 0, 1e-9, 1, 1, 1, &h->layer_decay))) {
            /* printed */
        } else if (!*sv || *sv < '0' || *sv > '9' || *end || errno) {
            rc = cli_error("--resume %s: vitc.train \"seed\" must be a string of decimal digits "
                           "(0 to 2^64-1) (a damaged or edited checkpoint)", path);
        } else if (strcmp(sn, "none") && strcmp(sn, "cosine") && strcmp(sn, "onecycle")) {
            rc = cli_error("--resume %s: vitc.train \"schedule\" must be none, cosine or onecycle "
                           "(a damaged or edited checkpoint)", path);
        } else if (!json_is_string(aug) ||
                   parse_augment(json_string_value(aug), &h->augment) != 0) {
            rc = cli_error("--resume %s: vitc.train \"augment\" must be a list of crop, flip, "
                           "resized-crop (a damaged or edited checkpoint)", path);
        } else if (opt && (!json_is_string(opt) || strcmp(json_string_value(opt), "adamw"))) {
            rc = cli_error("--resume %s: vitc.train \"optimizer\" is not \"adamw\"; vitc train "
                           "resumes AdamW runs only", path);
        } else {
            p->epoch = (int)ep;
            p->step_in_epoch = (int64_t)sie;
            p->global_step = (int64_t)gs;
            h->batch = (int)b;
            h->subset = (int64_t)sub;
            h->eval_subset = (int64_t)esub;
            h->seed = sd;
            snprintf(h->schedule, sizeof h->schedule, "%s", sn);
            h->schedule_fixed = json_is_true(json_object_get(o, "schedule_fixed"));
            h->freeze = json_is_true(json_object_get(o, "freeze_backbone"));
        }
    }
    json_decref(o);
    if (rc != CLI_OK) {
        vitc_vit_free(*m);
        *m = NULL;
    }
    return rc;
}

/* ---- the run ----------------------------------------------------------- */

/* Epoch e's order: Fisher-Yates from (seed, e). tools/fashion_torch.py
 * reproduces it. */
static void epoch_order(int64_t *perm, int64_t n, uint64_t seed, int epoch) {
    vitc__rng r = {seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(epoch + 1))};
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(vitc__rng_next(&r) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static uint64_t step_seed(uint64_t seed, int64_t global_step) {
    vitc__rng r = {seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(global_step + 1))};
    return vitc__rng_next(&r);
}

static int lr_at(const hyper *h, int64_t step, int64_t spe, double *lr, double *mom, int *set_mom) {
    int64_t total = (int64_t)llround(h->schedule_epochs * (double)spe);
    int64_t warm = (int64_t)llround(h->warmup * (double)spe);
    if (total < 1)
        total = 1;
    *set_mom = 0;
    if (!strcmp(h->schedule, "cosine")) {
        if (warm >= total)
            warm = total - 1;
        if (vitc_lr_warmup_cosine(step, warm, total, h->lr, h->min_lr, lr) != VITC_OK)
            return cli_lib_error("learning rate");
    } else if (!strcmp(h->schedule, "onecycle")) {
        vitc_onecycle_config c = vitc_onecycle_default_config(h->lr, total);
        if (vitc_lr_onecycle(&c, step < total ? step : total, lr, mom) != VITC_OK)
            return cli_lib_error("learning rate");
        *set_mom = 1;
    } else {
        *lr = warm > 0 && step < warm ? h->lr * (double)(step + 1) / (double)warm : h->lr;
    }
    return CLI_OK;
}

/* A run's length for people: "42.1s", "3m12s", "2h05m". */
static void fmt_duration(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e8)
        s = 0;
    if (s < 60)
        snprintf(buf, cap, "%.1fs", s);
    else if (s < 3600)
        snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, cap, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
}

/* ---- data parallel over MPI (make MPI=1) ---------------------------------
 * Each rank computes its contiguous shard of every global batch, scaled so
 * that the shards' gradients add up to the whole batch's mean; the sum is
 * made in rank order on rank 0 (gather, add, broadcast), so it does not
 * depend on message timing, and every rank then takes the same optimizer
 * step. Rank 0 evaluates, writes the checkpoint, the log and the progress. */
static int dp_rank = 0, dp_size = 1;

#ifdef VITC_MPI
#include <mpi.h>

static int64_t dp_sum_i64(int64_t v) {
    long long in = v, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return out;
}

static double dp_sum_f64_ordered(double v) {
    double all[1024], sum = 0;
    if (dp_size > 1024)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Allgather(&v, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int r = 0; r < dp_size; r++) sum += all[r];
    return sum;
}

/* Gradients of every rank summed in rank order, on every rank. */
/* Parameter i's gradient [*k]. */
static float *dp_grad(vitc_vit *m, int i, size_t *k) {
    const char *nm;
    int nd;
    const int64_t *sh;
    float *d, *g;
    vitc_vit_param(m, i, &nm, &nd, &sh, &d, &g);
    *k = cli_numel(nd, sh);
    return g;
}

static int dp_grads(vitc_vit *m, float **buf) {
    int np = vitc_vit_num_params(m);
    size_t n = 0, k;
    for (int i = 0; i < np; i++) {
        dp_grad(m, i, &k);
        n += k;
    }
    if (!*buf && !(*buf = malloc(n * (size_t)(dp_rank == 0 ? dp_size + 1 : 1) * sizeof **buf)))
        return cli_error("out of memory for the gradient exchange");
    float *mine = *buf, *all = *buf + n;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int i = 0; i < np; i++) {
            float *g = dp_grad(m, i, &k);
            if (pass == 0)
                memcpy(mine + off, g, k * sizeof *g);
            else
                memcpy(g, mine + off, k * sizeof *g);
            off += k;
        }
        if (pass == 0) {
            if (n > (size_t)INT32_MAX)
                return cli_error("gradients too large for one MPI message");
            MPI_Gather(mine, (int)n, MPI_FLOAT, dp_rank == 0 ? all : NULL, (int)n, MPI_FLOAT, 0,
                       MPI_COMM_WORLD);
            if (dp_rank == 0)
                for (size_t j = 0; j < n; j++) {
                    float acc = all[j];
                    for (int r = 1; r < dp_size; r++) acc += all[(size_t)r * n + j];
                    mine[j] = acc;
                }
            MPI_Bcast(mine, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
    }
    return CLI_OK;
}
#endif

typedef struct run {
    train_opts *o;
    hyper h;
    progress_state p;
    train_data d;
    vitc_vit *m;
    vitc_optimizer *opt;
    const char **labels;
    FILE *log;
    int tty;
    float *gbuf; /* MPI: gradients packed for the exchange */
    /* --freeze-backbone: the embeddings of the valid images, computed once,
     * and the head the probe trains (the model's own tensors) */
    int64_t D;
    float *emb, *vemb;     /* [pn, D] training, [pvn, D] evaluation */
    int64_t *plab, *pvlab; /* [pn], [pvn] */
    int64_t pn, pvn;
    float *hw, *hb, *hgw, *hgb; /* head weight [C, D], bias [C], and their gradients */
} run;


/* ---- fine-tuning a loaded model ------------------------------------------ */

/* --init's model classifies into the folder's classes already: the same
 * count, and the same names in order where the model has names. Then its
 * head is kept (a restart from its weights); otherwise it gets a new one. */
static int same_classes(vitc_vit *m, vitc_dataset *ds) {
    int nc = vitc_dataset_num_classes(ds);
    if (!vitc_vit_has_head(m) || vitc_vit_get_config(m)->num_classes != nc)
        return 0;
    for (int i = 0; i < nc; i++) {
        const char *a = vitc_vit_label(m, i), *b = vitc_dataset_class_name(ds, i);
        if (a && b && strcmp(a, b))
            return 0;
    }
    return 1;
}

static int new_head(vitc_vit *m, vitc_dataset *ds, uint64_t seed, const char *path) {
    int nc = vitc_dataset_num_classes(ds);
    const char **names = calloc((size_t)nc, sizeof *names);
    if (!names)
        return cli_error("out of memory");
    for (int i = 0; i < nc; i++) names[i] = vitc_dataset_class_name(ds, i);
    int rc = CLI_OK;
    if (vitc_vit_reset_head(m, nc, names, seed) != VITC_OK)
        rc = cli_error("--init %s: a new head of %d classes: %s", path, nc, vitc_last_error());
    free(names);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") ||
                   !strcasecmp(dot, ".jpeg"));
}

/* The images of one class folder in the order vitc_dataset_open_folder
 * lists them (regular files, links followed, .png/.jpg/.jpeg, names sorted
 * bytewise): *names [*n], each and the array to free. */
static int list_images(const char *dir, char ***names, int *n) {
    DIR *dp = opendir(dir);
    *names = NULL;
    *n = 0;
    if (!dp)
        return cli_error("%s: cannot open folder: %s", dir, strerror(errno));
    int cap = 0, rc = CLI_OK;
    struct dirent *e;
    char path[4096];
    while (rc == CLI_OK && (e = readdir(dp))) {
        struct stat sb;
        if (!is_image_name(e->d_name) ||
            (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path ||
            stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (*n == cap) {
            char **v = realloc(*names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!v) {
                rc = cli_error("out of memory listing %s", dir);
                break;
            }
            *names = v;
        }
        if (!((*names)[*n] = strdup(e->d_name)))
            rc = cli_error("out of memory listing %s", dir);
        else
            ++*n;
    }
    closedir(dp);
    if (*n > 1)
        qsort(*names, (size_t)*n, sizeof **names, cmp_name);
    return rc;
}

/* probe_embed for a model with its own image processor (a Hub model): each
 * image of the ImageFolder split dir decoded as the processor wants and
 * preprocessed by it (vitc_vit_preprocess: its resize, crop and
 * normalisation, transformers' numbers), then embedded alone. */
static int probe_embed_processor(run *R, vitc_dataset *ds, const char *dir, float *out,
                                 int64_t *lab, int64_t *n, const char *what) {
    int64_t N = vitc_dataset_size(ds), pos = 0;
    int flags = vitc_vit_image_flags(R->m), rc = CLI_OK;
    float *x = NULL;
    size_t xcap = 0;
    cli_progress pr;
    cli_progress_start(&pr, what, N, R->o->quiet);
    for (int c = 0; c < vitc_dataset_num_classes(ds) && pos < N && rc == CLI_OK; c++) {
        char cdir[4096], path[4096];
        char **names;
        int k;
        if ((size_t)snprintf(cdir, sizeof cdir, "%s/%s", dir, vitc_dataset_class_name(ds, c)) >=
            sizeof cdir) {
            rc = cli_error("%s: path too long", dir);
            break;
        }
        if ((rc = list_images(cdir, &names, &k)) != CLI_OK)
            k = 0;
        for (int j = 0; j < k && pos < N && rc == CLI_OK; j++, pos++) {
            vitc_image img;
            int H, W;
            int64_t sz;
            if ((size_t)snprintf(path, sizeof path, "%s/%s", cdir, names[j]) >= sizeof path ||
                vitc_dataset_label(ds, pos) != c) {
                rc = cli_error("%s: the folder changed while it was read (%s)", dir, path);
                break;
            }
            if (vitc_image_load_flags(path, 0, flags, &img) != VITC_OK) {
                cli_progress_clear(&pr);
                cli_warning("skipping unreadable image %s (%s)", path, vitc_last_error());
                continue;
            }
            if (vitc_vit_preprocess_size(R->m, img.width, img.height, &H, &W) != VITC_OK ||
                vitc_vit_embed_size(R->m, VITC_POOL_DEFAULT, H, W, &sz) != VITC_OK) {
                vitc_image_free(&img);
                rc = cli_lib_error(what);
                break;
            }
            if (sz != R->D) {
                vitc_image_free(&img);
                rc = cli_error("%s: an embedding of %lld floats at %dx%d, %lld at the model's "
                               "size", path, (long long)sz, W, H, (long long)R->D);
                break;
            }
            if ((size_t)3 * H * W > xcap) {
                float *t = realloc(x, (xcap = (size_t)3 * H * W) * sizeof *x);
                if (!t) {
                    vitc_image_free(&img);
                    rc = cli_error("out of memory for an image of %dx%d", W, H);
                    break;
                }
                x = t;
            }
            vitc_status st = vitc_vit_preprocess(R->m, &img, x);
            vitc_image_free(&img);
            if (st != VITC_OK ||
                vitc_vit_embed(R->m, x, 1, H, W, VITC_POOL_DEFAULT, out + *n * R->D) != VITC_OK) {
                rc = cli_lib_error(what);
                break;
            }
            lab[(*n)++] = c;
            cli_progress_update(&pr, pos + 1);
        }
        for (int j = 0; j < k; j++) free(names[j]);
        free(names);
    }
    cli_progress_clear(&pr);
    free(x);
    return rc;
}

/* Embeddings of every valid image of ds into *out [*n, D], labels *lab. */
static int probe_embed(run *R, vitc_dataset *ds, const char *split, float **out, int64_t **lab,
                       int64_t *n, const char *what) {
    const vitc_vit_config *c = vitc_vit_get_config(R->m);
    int S = c->image_size, B = 32;
    int64_t N = vitc_dataset_size(ds), D = R->D;
    float *x = malloc((size_t)B * c->in_channels * S * S * sizeof *x);
    int64_t *idx = malloc((size_t)B * sizeof *idx);
    *out = malloc((size_t)(N ? N : 1) * D * sizeof **out);
    *lab = malloc((size_t)(N ? N : 1) * sizeof **lab);
    *n = 0;
    if (!x || !idx || !*out || !*lab) {
        free(x), free(idx);
        return cli_error("out of memory for the embeddings of %lld images", (long long)N);
    }
    if (!R->d.idx && vitc_vit_has_processor(R->m)) {
        char dir[4096];
        free(x), free(idx);
        if ((size_t)snprintf(dir, sizeof dir, "%s/%s", R->o->data, split) >= sizeof dir)
            return cli_error("%s: path too long", R->o->data);
        vitc_vit_set_training(R->m, 0);
        return probe_embed_processor(R, ds, dir, *out, *lab, n, what);
    }
    vitc_batch_opts bo = train_batch_opts(c); /* the eval transform: no augmentation */
    cli_progress pr;
    cli_progress_start(&pr, what, N, R->o->quiet);
    int rc = CLI_OK;
    vitc_vit_set_training(R->m, 0);
    for (int64_t i = 0; i < N && rc == CLI_OK; i += B) {
        int b = (int)(N - i < B ? N - i : B), nv = 0;
        for (int k = 0; k < b; k++) idx[k] = i + k;
        if (vitc_dataset_load_batch(ds, idx, b, &bo, x, *lab + *n, &nv) != VITC_OK)
            rc = cli_lib_error(what);
        else if (nv > 0 &&
                 vitc_vit_embed(R->m, x, nv, S, S, VITC_POOL_DEFAULT, *out + *n * D) != VITC_OK)
            rc = cli_lib_error(what);
        *n += nv;
        cli_progress_update(&pr, i + b);
    }
    cli_progress_clear(&pr);
    free(x), free(idx);
    return rc;
}

/* The linear probe: the head is the model's last [C, D] weight followed by
 * its [C] bias (every family's state_dict ends so); all else is frozen
 * (lr scale 0: the optimizer skips it), then the embeddings are cached. */
static int probe_setup(run *R) {
    const vitc_vit_config *c = vitc_vit_get_config(R->m);
    int C = c->num_classes, np = vitc_vit_num_params(R->m), head = -1;
    if (dp_size > 1)
        return cli_error("--freeze-backbone runs on one process: run it without mpirun");
    if (vitc_vit_embed_size(R->m, VITC_POOL_DEFAULT, c->image_size, c->image_size, &R->D) !=
        VITC_OK)
        return cli_lib_error("--freeze-backbone");
    int rc;
    if ((rc = probe_embed(R, R->d.train, "train", &R->emb, &R->plab, &R->pn, "embedding the training "
                          "images")) != CLI_OK)
        return rc;
    if (R->d.eval && (rc = probe_embed(R, R->d.eval, "val", &R->vemb, &R->pvlab, &R->pvn,
                                       "embedding the evaluation images")) != CLI_OK)
        return rc;
    /* after the forwards: parameter pointers are valid until the next one */
    for (int i = np - 2; i >= 0 && head < 0; i--) {
        const char *nm;
        int nd, nd2;
        const int64_t *sh, *sh2;
        float *d, *g;
        if (vitc_vit_param(R->m, i, &nm, &nd, &sh, &d, &g) != VITC_OK ||
            vitc_vit_param(R->m, i + 1, &nm, &nd2, &sh2, &R->hb, &R->hgb) != VITC_OK)
            return cli_lib_error("--freeze-backbone");
        if (nd == 2 && sh[0] == C && sh[1] == R->D && nd2 == 1 && sh2[0] == C)
            head = i, R->hw = d, R->hgw = g;
    }
    if (head < 0 || !R->hgw || !R->hgb)
        return cli_error("--freeze-backbone: the model's head does not take its default "
                         "embedding of %lld floats; train it without --freeze-backbone",
                         (long long)R->D);
    for (int i = 0; i < np; i++)
        if (i != head && i != head + 1 && vitc_optimizer_set_lr_scale(R->opt, i, 0) != VITC_OK)
            return cli_lib_error("--freeze-backbone");
    return CLI_OK;
}

/* logits [n, C] = e [n, D] W^T + b, summed in double in a fixed order. */
static void probe_forward(const run *R, const float *e, int n, int C, float *logits) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < C; j++) {
            const float *w = R->hw + (size_t)j * R->D, *x = e + (size_t)i * R->D;
            double acc = R->hb[j];
            for (int64_t k = 0; k < R->D; k++) acc += (double)w[k] * x[k];
            logits[(size_t)i * C + j] = (float)acc;
        }
}

/* The head's gradients (replaced, not accumulated: nothing else has any). */
static void probe_backward(run *R, const float *e, int n, int C, const float *dl) {
    for (int j = 0; j < C; j++) {
        double gb = 0;
        for (int i = 0; i < n; i++) gb += dl[(size_t)i * C + j];
        R->hgb[j] = (float)gb;
        for (int64_t k = 0; k < R->D; k++) {
            double g = 0;
            for (int i = 0; i < n; i++) g += (double)dl[(size_t)i * C + j] * e[(size_t)i * R->D + k];
            R->hgw[(size_t)j * R->D + k] = (float)g;
        }
    }
}

/* train_evaluate over the cached evaluation embeddings. */
static void probe_evaluate(const run *R, eval_result *r) {
    int C = vitc_vit_get_config(R->m)->num_classes;
    float *l = malloc((size_t)C * sizeof *l);
    memset(r, 0, sizeof *r);
    double loss = 0;
    for (int64_t i = 0; l && i < R->pvn; i++) {
        probe_forward(R, R->vemb + (size_t)i * R->D, 1, C, l);
        int best = train_argmax(l, C);
        double se = 0;
        for (int j = 0; j < C; j++) se += exp((double)l[j] - l[best]);
        loss += log(se) + l[best] - l[R->pvlab[i]];
        r->correct += best == R->pvlab[i];
        r->n++;
    }
    r->loss = r->n ? loss / r->n : 0;
    free(l);
}

static int report_skipped(run *R, int64_t *reported) {
    int64_t n = vitc_dataset_num_skipped(R->d.train);
    for (; *reported < n; ++*reported) /* a path is untrusted text: escaped */
        cli_warning("skipping unreadable image %s",
                    vitc_dataset_skipped_path(R->d.train, *reported));
    return 0;
}

static int run_epochs(run *R) {
    train_opts *o = R->o;
    const vitc_vit_config *c = vitc_vit_get_config(R->m);
    int C = c->num_classes, S = c->image_size, B = R->h.batch;
    const int probe = R->h.freeze;
    int64_t N = probe ? R->pn : vitc_dataset_size(R->d.train);
    int64_t spe = (N + B - 1) / B;
    size_t per = (size_t)c->in_channels * S * S;
    if (probe && (size_t)R->D > per)
        per = (size_t)R->D;
    if (N < 1) {
        return cli_error("no readable training image to train on");
    }
    float *x = malloc((size_t)B * per * sizeof *x);
    float *logits = malloc((size_t)B * C * sizeof *logits);
    float *dlogits = malloc((size_t)B * C * sizeof *dlogits);
    int64_t *perm = malloc((size_t)N * sizeof *perm), *lab = malloc((size_t)B * sizeof *lab);
    int rc = CLI_OK;
    int64_t reported = 0;
    int log_rc = CLI_OK; /* a --log write failed */
    /* for the closing line: this run's epochs, time and best evaluation */
    int first_epoch = R->p.epoch, best_epoch = 0;
    double run_t0 = cli_now(), best_acc = -1;
    if (!x || !logits || !dlogits || !perm || !lab) {
        rc = cli_error("out of memory for a batch of %d", B);
        goto out;
    }
    vitc_batch_opts bo = train_batch_opts(c);
    bo.augment = R->h.augment;
    if (R->p.step_in_epoch >= spe) { /* a checkpoint from the epoch's last step */
        R->p.epoch++;
        R->p.step_in_epoch = 0;
    }
    for (int e = R->p.epoch; e < o->epochs && rc == CLI_OK; e++) {
        epoch_order(perm, N, R->h.seed, e);
        double t0 = cli_now(), last = t0, loss_sum = 0;
        int64_t seen = 0, correct = 0, done_imgs = 0;
        if (!probe)
            vitc_vit_set_training(R->m, 1);
        const int whole_epoch = R->p.step_in_epoch == 0;
        for (int64_t k = R->p.step_in_epoch; k < spe; k++) {
            int b = (int)(N - k * B < B ? N - k * B : B), nv = 0;
            /* this rank's shard of the batch: [lo, hi) */
            int lo = (int)((int64_t)b * dp_rank / dp_size);
            int hi = (int)((int64_t)b * (dp_rank + 1) / dp_size);
            bo.seed = step_seed(R->h.seed, R->p.global_step);
            bo.first = lo;
            if (probe) {
                for (int i = lo; i < hi; i++, nv++) {
                    memcpy(x + (size_t)nv * R->D, R->emb + (size_t)perm[k * B + i] * R->D,
                           (size_t)R->D * sizeof *x);
                    lab[nv] = R->plab[perm[k * B + i]];
                }
            } else if (hi > lo && vitc_dataset_load_batch(R->d.train, perm + k * B + lo, hi - lo,
                                                          &bo, x, lab, &nv) != VITC_OK) {
                rc = cli_lib_error("training data");
                break;
            }
            int64_t nv_all = nv;
#ifdef VITC_MPI
            if (dp_size > 1)
                nv_all = dp_sum_i64(nv);
#endif
            report_skipped(R, &reported);
            double lr, mom = 0;
            int set_mom;
            float loss = 0, gnorm = 0;
            if ((rc = lr_at(&R->h, R->p.global_step, spe, &lr, &mom, &set_mom)) != CLI_OK)
                break;
            if (vitc_optimizer_set_lr(R->opt, lr) != VITC_OK ||
                (set_mom && vitc_optimizer_set_momentum(R->opt, mom) != VITC_OK)) {
                rc = cli_lib_error("optimizer");
                break;
            }
            if (nv_all > 0) {
                int64_t right = 0;
                if (!probe && vitc_optimizer_zero_grad(R->opt) != VITC_OK) {
                    rc = cli_lib_error("training step");
                    break;
                }
                if (nv > 0) {
                    if (probe)
                        probe_forward(R, x, nv, C, logits);
                    if ((!probe && vitc_vit_forward(R->m, x, nv, S, S, logits) != VITC_OK) ||
                        vitc_cross_entropy(logits, lab, nv, C, (float)R->h.smoothing, &loss,
                                           dlogits) != VITC_OK) {
                        rc = cli_lib_error("training step");
                        break;
                    }
                    /* a shard's mean, weighted to its part of the whole batch */
                    if (nv != nv_all) {
                        float w = (float)nv / (float)nv_all;
                        for (size_t i = 0; i < (size_t)nv * C; i++) dlogits[i] *= w;
                    }
                    if (probe)
                        probe_backward(R, x, nv, C, dlogits);
                    else if (vitc_vit_backward(R->m, dlogits) != VITC_OK) {
                        rc = cli_lib_error("training step");
                        break;
                    }
                    for (int i = 0; i < nv; i++)
                        right += train_argmax(logits + (size_t)i * C, C) == lab[i];
                }
#ifdef VITC_MPI
                if (dp_size > 1) {
                    if ((rc = dp_grads(R->m, &R->gbuf)) != CLI_OK)
                        break;
                    loss = (float)(dp_sum_f64_ordered((double)loss * nv) / (double)nv_all);
                    right = dp_sum_i64(right);
                }
#endif
                if ((R->h.clip > 0 &&
                     vitc_clip_grad_norm_optimizer(R->opt, (float)R->h.clip, &gnorm) != VITC_OK) ||
                    vitc_optimizer_step(R->opt) != VITC_OK) {
                    rc = cli_lib_error("training step");
                    break;
                }
                correct += right;
                loss_sum += (double)loss * nv_all;
                seen += nv_all;
            }
            done_imgs += b;
            R->p.global_step++;
#ifdef VITC_MPI
            if (dp_size > 1) { /* every rank stops at the same step */
                int sig = (int)stop_signal, any = 0;
                MPI_Allreduce(&sig, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
                stop_signal = any;
            }
#endif
            R->p.step_in_epoch = k + 1;
            if (R->log)
                fprintf(R->log,
                        "{\"type\": \"step\", \"epoch\": %d, \"step\": %lld, \"loss\": %.9g, "
                        "\"lr\": %.9g%s%.9g}\n",
                        e + 1, (long long)R->p.global_step, (double)loss, lr,
                        R->h.clip > 0 ? ", \"grad_norm\": " : ", \"images\": ",
                        R->h.clip > 0 ? (double)gnorm : (double)nv);
            /* flushed, a log one can follow while it runs; a record that
             * cannot be written stops the run as a signal does */
            if (R->log && (log_rc = train_log_flush(R->log, o->log)) != CLI_OK)
                break;
            double t = cli_now();
            if (!o->quiet && (k + 1 == spe || t - last > (R->tty ? 0.2 : 10.0))) {
                double ips = done_imgs / (t - t0 > 1e-9 ? t - t0 : 1e-9);
                char eta[32];
                /* the run's time left, not the epoch's: what one waits for */
                int64_t left = N - (k + 1) * (int64_t)B + (int64_t)(o->epochs - e - 1) * N;
                cli_fmt_time((double)(left > 0 ? left : 0) / ips, eta, sizeof eta);
                int w = 24, fill = (int)((k + 1) * w / spe);
                char bar[32];
                for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
                bar[w] = 0;
                fprintf(stderr, "%sepoch %d/%d [%s] %lld/%lld loss %.4f %.0f img/s ETA %s%s",
                        R->tty ? "\r" : "", e + 1, o->epochs, bar, (long long)(k + 1),
                        (long long)spe, seen ? loss_sum / seen : 0.0, ips, eta,
                        R->tty ? "\033[K" : "\n");
                last = t;
            }
            if (stop_signal)
                break;
        }
        if (R->tty && !o->quiet)
            fputc('\n', stderr);
        if (rc != CLI_OK)
            break;
        if (stop_signal || log_rc) {
            char why[32] = "the --log error";
            if (!log_rc)
                snprintf(why, sizeof why, "signal %d", (int)stop_signal);
            if (dp_rank == 0 && (rc = save_checkpoint(o->out, R->m, R->opt, R->labels, &R->h, &R->p,
                                      R->d.desc)) == CLI_OK)
                fprintf(stderr,
                        "vitc: stopped by %s at epoch %d, step %lld; checkpoint %s "
                        "(continue with --resume %s)\n",
                        why, e + 1, (long long)R->p.step_in_epoch, o->out, o->out);
            if (rc == CLI_OK)
                rc = log_rc ? log_rc : 128 + (int)stop_signal;
            break;
        }
        /* Every file of the set failed to decode: nothing was trained, and
         * a checkpoint of "loss 0" would say otherwise. */
        if (whole_epoch && seen == 0) {
            rc = cli_error("none of the %lld training images could be read (each was skipped "
                           "with a warning): nothing to train on; no checkpoint written",
                           (long long)N);
            break;
        }
        double secs = cli_now() - t0;
        R->p.epoch = e + 1;
        R->p.step_in_epoch = 0;
        int last_epoch = e + 1 == o->epochs;
        eval_result er;
        int evaluated = 0;
        if (dp_rank == 0 && R->d.eval &&
            (last_epoch || (o->eval_every > 0 && (e + 1) % o->eval_every == 0))) {
            if (probe)
                probe_evaluate(R, &er);
            else if ((rc = train_evaluate(R->m, R->d.eval, B > 256 ? B : 256, &er, NULL, o->quiet,
                                          "evaluation")) != CLI_OK)
                break;
            evaluated = 1;
            double acc = (double)er.correct / (er.n ? er.n : 1);
            if (er.n && acc > best_acc)
                best_acc = acc, best_epoch = e + 1;
        }
        if (dp_rank == 0 &&
            (rc = save_checkpoint(o->out, R->m, R->opt, R->labels, &R->h, &R->p, R->d.desc)) !=
                CLI_OK)
            break;
        if (dp_rank != 0)
            continue;
        double tl = seen ? loss_sum / seen : 0, ta = seen ? (double)correct / seen : 0;
        if (evaluated)
            fprintf(stderr,
                    "epoch %d/%d: train loss %.4f acc %.2f%%, %s loss %.4f acc %.2f%% (%lld "
                    "images), %.1f s, %.0f img/s\n",
                    e + 1, o->epochs, tl, 100 * ta, R->d.idx ? "test" : "val", er.loss,
                    100.0 * er.correct / (er.n ? er.n : 1), (long long)er.n, secs,
                    done_imgs / (secs > 0 ? secs : 1));
        else
            fprintf(stderr, "epoch %d/%d: train loss %.4f acc %.2f%%, %.1f s, %.0f img/s\n", e + 1,
                    o->epochs, tl, 100 * ta, secs, done_imgs / (secs > 0 ? secs : 1));
        if (R->log) {
            fprintf(R->log,
                    "{\"type\": \"epoch\", \"epoch\": %d, \"step\": %lld, \"train_loss\": %.9g, "
                    "\"train_acc\": %.9g, \"seconds\": %.3f, \"images_per_s\": %.1f",
                    e + 1, (long long)R->p.global_step, tl, ta, secs,
                    done_imgs / (secs > 0 ? secs : 1));
            if (evaluated)
                fprintf(R->log, ", \"eval_loss\": %.9g, \"eval_acc\": %.9g, \"eval_images\": %lld",
                        er.loss, (double)er.correct / (er.n ? er.n : 1), (long long)er.n);
            fputs("}\n", R->log);
            if ((rc = train_log_flush(R->log, o->log)) != CLI_OK)
                break;
        }
    }
    if (rc == CLI_OK && dp_rank == 0 && R->p.epoch >= o->epochs && o->model_out)
        rc = save_file(o->model_out, R->m, R->opt, 0, R->labels, &R->h, &R->p, R->d.desc);
    if (rc == CLI_OK && dp_rank == 0 && R->p.epoch >= o->epochs) {
        char took[32], best[96];
        fmt_duration(cli_now() - run_t0, took, sizeof took);
        if (best_epoch)
            snprintf(best, sizeof best, "best %s accuracy %.2f%% (epoch %d)",
                     R->d.idx ? "test" : "val", 100 * best_acc, best_epoch);
        else
            snprintf(best, sizeof best, "no evaluation");
        fprintf(stderr, "vitc: trained %d epoch%s in %s; %s; wrote %s%s%s\n",
                o->epochs - first_epoch, o->epochs - first_epoch == 1 ? "" : "s", took, best,
                o->out, o->model_out ? " and " : "", o->model_out ? o->model_out : "");
    }
    if (rc == CLI_OK && R->p.epoch >= o->epochs && vitc_dataset_num_skipped(R->d.train))
        fprintf(stderr, "vitc: %lld unreadable training images were skipped\n",
                (long long)vitc_dataset_num_skipped(R->d.train));
out:
    free(x), free(logits), free(dlogits), free(perm), free(lab);
    return rc;
}

static int train_main(train_opts *o) {
    run R;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.tty = cli_stderr_tty();
    int rc;
    if (o->threads > 0)
        vitc_set_num_threads(o->threads);
    /* What will be written is checked (and locked) before anything is read:
     * a bad --out must not cost an epoch. Rank 0 alone writes. */
    train_output outs[3] = {{"--out", o->out, -1, NULL, -1},
                            {"--model-out", o->model_out, -1, NULL, -1},
                            {"--log", o->log, -1, NULL, -1}};
    const train_output ins[3] = {{"--resume", o->resume, -1, NULL, 0},
                                 {"--init", o->init, -1, NULL, -1},
                                 {"--config", o->config, -1, NULL, -1}};
    if (dp_rank == 0 && (rc = train_outputs_open(outs, 3, ins, 3)) != CLI_OK)
        return rc;
    if ((rc = train_data_open(o->data, 1, 0, NULL, &R.d)) != CLI_OK)
        goto done;
    /* hyperparameters: defaults, then the checkpoint's, then the flags */
    hyper *h = &R.h;
    h->batch = 128;
    h->lr = 1e-3;
    h->wd = 0.05;
    h->layer_decay = 1;
    snprintf(h->schedule, sizeof h->schedule, "none");
    h->schedule_epochs = 0;
    if (o->resume) {
        if ((rc = load_checkpoint(o->resume, &R.m, h, &R.p)) != CLI_OK)
            goto done;
        if ((rc = check_model_matches(o, vitc_vit_get_config(R.m), o->resume)) != CLI_OK)
            goto done;
        if (R.p.step_in_epoch && o->g_batch && o->batch != h->batch) {
            rc = cli_error("--resume %s: stopped mid-epoch with batch %d; --batch %d cannot "
                           "continue that epoch", o->resume, h->batch, o->batch);
            goto done;
        }
    }
    if (o->resume && o->freeze && !h->freeze) {
        rc = cli_error("--resume %s: a run that trains the whole model; --freeze-backbone "
                       "cannot start on it (use --init %s for a new probe)", o->resume, o->resume);
        goto done;
    }
    if (h->freeze && o->g_augment) {
        rc = cli_usage_error("train", "--resume %s: a --freeze-backbone run, which has no "
                             "augmentation: drop --augment", o->resume);
        goto done;
    }
    if (o->freeze) h->freeze = 1;
    if (o->g_layer_decay) h->layer_decay = o->layer_decay;
    if (o->g_batch) h->batch = o->batch;
    if (o->g_lr) h->lr = o->lr;
    if (o->g_wd) h->wd = o->wd;
    if (o->g_warmup) h->warmup = o->warmup;
    if (o->g_smoothing) h->smoothing = o->smoothing;
    if (o->g_clip) h->clip = o->clip;
    if (o->g_min_lr) h->min_lr = o->min_lr;
    if (o->g_subset) h->subset = o->subset;
    if (o->g_eval_subset) h->eval_subset = o->eval_subset;
    if (o->g_schedule) {
        if (strcmp(o->schedule, "none") && strcmp(o->schedule, "cosine") &&
            strcmp(o->schedule, "onecycle")) {
            rc = cli_usage_error("train", "--schedule wants none, cosine or onecycle, got '%s'",
                                 o->schedule);
            goto done;
        }
        snprintf(h->schedule, sizeof h->schedule, "%s", o->schedule);
    }
    if (o->g_augment && parse_augment(o->augment, &h->augment) != 0) {
        rc = cli_usage_error("train", "--augment wants a list of crop, flip, resized-crop; got '%s'",
                             o->augment);
        goto done;
    }
    if (o->g_seed) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(o->seed, &end, 10);
        if (!*o->seed || *end || errno || o->seed[0] == '-') {
            rc = cli_usage_error("train", "--seed wants a non-negative integer, got '%s'", o->seed);
            goto done;
        }
        h->seed = s;
    }
    /* The schedule's length: given, else this run's --epochs (so a resumed
     * run that trains longer stretches its schedule). */
    if (o->g_schedule_epochs) {
        h->schedule_epochs = o->schedule_epochs;
        h->schedule_fixed = 1;
    } else if (!h->schedule_fixed) {
        h->schedule_epochs = o->epochs;
    }
    if (h->subset > 0 && vitc_dataset_truncate(R.d.train, h->subset) != VITC_OK) {
        rc = cli_lib_error("--subset");
        goto done;
    }
    if (h->eval_subset > 0 && R.d.eval && vitc_dataset_truncate(R.d.eval, h->eval_subset) != VITC_OK) {
        rc = cli_lib_error("--eval-subset");
        goto done;
    }
    if (!o->resume) {
        if (o->init) {
            if (vitc_vit_load(o->init, NULL, &R.m) != VITC_OK) {
                rc = cli_lib_error("--init");
                goto done;
            }
            if ((rc = check_model_matches(o, vitc_vit_get_config(R.m), o->init)) != CLI_OK)
                goto done;
            if (!same_classes(R.m, R.d.train) &&
                (rc = new_head(R.m, R.d.train, h->seed, o->init)) != CLI_OK)
                goto done;
        } else {
            vitc_vit_config cfg;
            if ((rc = build_config(o, &R.d, &cfg)) != CLI_OK)
                goto done;
            if (vitc_vit_create(&cfg, h->seed, &R.m) != VITC_OK) {
                rc = cli_lib_error("model");
                goto done;
            }
        }
    }
    if ((rc = check_labels(R.m, R.d.train, o->resume ? o->resume : o->init ? o->init : "model")) !=
        CLI_OK)
        goto done;
    {
        const vitc_vit_config *c = vitc_vit_get_config(R.m);
        if (c->in_channels != 1 && c->in_channels != 3) {
            rc = cli_error("the model takes %d channels; vitc trains 1- or 3-channel models",
                           c->in_channels);
            goto done;
        }
        int nc = vitc_dataset_num_classes(R.d.train);
        if (!(R.labels = calloc((size_t)nc, sizeof *R.labels))) {
            rc = cli_error("out of memory");
            goto done;
        }
        for (int i = 0; i < nc; i++) R.labels[i] = vitc_dataset_class_name(R.d.train, i);
    }
    vitc_optim_config oc = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    oc.lr = h->lr;
    oc.weight_decay = h->wd;
    if (vitc_optimizer_create_vit(R.m, &oc, &R.opt) != VITC_OK ||
        (h->layer_decay != 1 && vitc_optimizer_set_layer_decay(R.opt, h->layer_decay) != VITC_OK)) {
        rc = cli_lib_error("optimizer");
        goto done;
    }
    if (h->freeze && (rc = probe_setup(&R)) != CLI_OK)
        goto done;
    if (o->resume && vitc_checkpoint_load_optimizer(o->resume, R.opt) != VITC_OK) {
        rc = cli_lib_error("--resume");
        goto done;
    }
    if (R.p.epoch >= o->epochs) {
        fprintf(stderr, "vitc: %s has %d epochs done; nothing to do for --epochs %d\n",
                o->resume, R.p.epoch, o->epochs);
        rc = save_checkpoint(o->out, R.m, R.opt, R.labels, h, &R.p, R.d.desc);
        if (rc == CLI_OK && o->model_out) /* what a finished run writes, asked for again */
            rc = save_file(o->model_out, R.m, R.opt, 0, R.labels, h, &R.p, R.d.desc);
        goto done;
    }
    if (dp_rank != 0) {
        o->quiet = 1;
        o->log = NULL;
    }
    if (o->log && (rc = train_log_open(o->log, o->resume != NULL, &R.log)) != CLI_OK)
        goto done;
    if (!o->quiet) {
        const vitc_vit_config *c = vitc_vit_get_config(R.m);
        if (dp_size > 1)
            fprintf(stderr, "vitc train: %d MPI ranks, %d images each per step of %d\n", dp_size,
                    h->batch / dp_size, h->batch);
        fprintf(stderr,
                "vitc train: %s, %lld training images, %d classes; ViT %dpx/%d, depth %d, dim %d, "
                "%d heads, MLP %d, %d channel%s; batch %d, lr %g (%s), %s epoch %d of %d\n",
                R.d.desc, (long long)vitc_dataset_size(R.d.train), c->num_classes, c->image_size,
                c->patch_size, c->depth, c->hidden_dim, c->num_heads, c->mlp_dim, c->in_channels,
                c->in_channels > 1 ? "s" : "", h->batch, h->lr, h->schedule,
                o->resume ? "resuming at" : "from", R.p.epoch + 1, o->epochs);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    /* A dropped SSH session must not lose the partial epoch: it is SIGHUP
     * (with a terminal) or SIGPIPE at the next progress line (stderr a
     * pipe whose reader is gone); either stops the run as SIGINT does. */
    const int stops[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (int i = 0; i < 4; i++) sigaction(stops[i], &sa, NULL);
    rc = run_epochs(&R);
    for (int i = 0; i < 4; i++) signal(stops[i], SIG_DFL);
done:
    if (R.log && fclose(R.log) != 0 && rc == CLI_OK)
        rc = cli_error("--log %s: write failed: %s", o->log, strerror(errno));
    train_outputs_close(outs, 3);
    vitc_optimizer_free(R.opt);
    vitc_vit_free(R.m);
    free(R.labels);
    free(R.gbuf);
    free(R.emb), free(R.vemb), free(R.plab), free(R.pvlab);
    train_data_close(&R.d);
    return rc;
}

int cmd_train(int argc, char **argv) {
    train_opts o;
    memset(&o, 0, sizeof o);
    o.eval_every = 1;
    const cli_opt opts[] = {
        {"--data", NULL, CLI_STRING, &o.data, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o.arch, 0, 0, NULL},
        {"--config", NULL, CLI_STRING, &o.config, 0, 0, NULL},
        {"--out", NULL, CLI_STRING, &o.out, 0, 0, NULL},
        {"--resume", NULL, CLI_STRING, &o.resume, 0, 0, NULL},
        {"--init", NULL, CLI_STRING, &o.init, 0, 0, NULL},
        {"--log", NULL, CLI_STRING, &o.log, 0, 0, NULL},
        {"--model-out", NULL, CLI_STRING, &o.model_out, 0, 0, NULL},
        {"--schedule", NULL, CLI_STRING, &o.schedule, 0, 0, &o.g_schedule},
        {"--augment", NULL, CLI_STRING, &o.augment, 0, 0, &o.g_augment},
        {"--seed", NULL, CLI_STRING, &o.seed, 0, 0, &o.g_seed},
        {"--image-size", NULL, CLI_INT, &o.image_size, 1, 4096, &o.g_image_size},
        {"--patch", NULL, CLI_INT, &o.patch, 1, 4096, &o.g_patch},
        {"--depth", NULL, CLI_INT, &o.depth, 1, 256, &o.g_depth},
        {"--dim", NULL, CLI_INT, &o.dim, 1, 65536, &o.g_dim},
        {"--heads", NULL, CLI_INT, &o.heads, 1, 1024, &o.g_heads},
        {"--mlp", NULL, CLI_INT, &o.mlp, 1, 1 << 20, &o.g_mlp},
        {"--channels", NULL, CLI_INT, &o.channels, 1, 3, &o.g_channels},
        {"--epochs", NULL, CLI_INT, &o.epochs, 1, TRAIN_MAX_EPOCHS, &o.g_epochs},
        {"--batch", NULL, CLI_INT, &o.batch, 1, TRAIN_MAX_BATCH, &o.g_batch},
        {"--threads", NULL, CLI_INT, &o.threads, 1, 256, NULL},
        {"--eval-every", NULL, CLI_INT, &o.eval_every, 0, 1000000, NULL},
        {"--subset", NULL, CLI_INT, &o.subset, 1, TRAIN_MAX_SUBSET, &o.g_subset},
        {"--eval-subset", NULL, CLI_INT, &o.eval_subset, 1, TRAIN_MAX_SUBSET, &o.g_eval_subset},
        {"--lr", NULL, CLI_DOUBLE, &o.lr, 0, TRAIN_MAX_LR, &o.g_lr},
        {"--weight-decay", NULL, CLI_DOUBLE, &o.wd, 0, TRAIN_MAX_WD, &o.g_wd},
        {"--warmup", NULL, CLI_DOUBLE, &o.warmup, 0, TRAIN_MAX_EPOCHS, &o.g_warmup},
        {"--schedule-epochs", NULL, CLI_DOUBLE, &o.schedule_epochs, 1e-6, TRAIN_MAX_EPOCHS,
         &o.g_schedule_epochs},
        {"--min-lr", NULL, CLI_DOUBLE, &o.min_lr, 0, TRAIN_MAX_LR, &o.g_min_lr},
        {"--label-smoothing", NULL, CLI_DOUBLE, &o.smoothing, 0, 1, &o.g_smoothing},
        {"--clip", NULL, CLI_DOUBLE, &o.clip, 0, TRAIN_MAX_CLIP, &o.g_clip},
        {"--quiet", NULL, CLI_FLAG, &o.quiet, 0, 0, NULL},
        {"--freeze-backbone", NULL, CLI_FLAG, &o.freeze, 0, 0, NULL},
        {"--lr-layer-decay", NULL, CLI_DOUBLE, &o.layer_decay, 1e-9, 1, &o.g_layer_decay},
    };
    char usage[sizeof train_usage + 512];
    train_usage_text(usage, sizeof usage);
    int r = topt_parse("train", usage, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                       NULL, NULL);
    if (r)
        return r < 0 ? CLI_OK : r;
    if (!o.data)
        return cli_usage_error("train", "--data is required");
    if (!o.out)
        return cli_usage_error("train", "--out is required");
    if (!o.g_epochs)
        return cli_usage_error("train", "--epochs is required");
    if (o.resume && o.init)
        return cli_usage_error("train", "--resume and --init exclude each other");
    if (o.freeze && !o.init && !o.resume)
        return cli_usage_error("train", "--freeze-backbone trains a head on a pretrained model's "
                               "embeddings: give the model with --init MODEL");
    if (o.freeze && o.g_augment)
        return cli_usage_error("train", "--freeze-backbone computes each image's embedding once, "
                               "without augmentation: drop --augment");
    if (o.freeze && o.g_layer_decay)
        return cli_usage_error("train", "--freeze-backbone trains the head alone: "
                               "--lr-layer-decay has nothing to decay");
#ifdef VITC_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &dp_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &dp_size);
    int rc = train_main(&o);
    /* A rank that failed alone would leave the others waiting in a
     * collective: the whole job ends with it. */
    if (rc != CLI_OK && dp_size > 1)
        MPI_Abort(MPI_COMM_WORLD, rc);
    MPI_Finalize();
    return rc;
#else
    return train_main(&o);
#endif
}
