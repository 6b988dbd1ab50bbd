/*
 * cmd_zero_shot.c — `vitc zero-shot`: label images with words the user
 * chooses, through a CLIP or SigLIP checkpoint's two towers.
 *
 * Each label becomes one prompt per template ("a photo of a {}."); the
 * prompts' text embeddings are normalised, averaged per label and
 * normalised again (the OpenAI / open_clip recipe, which big_vision's
 * SigLIP evaluator follows too), and compared with each image's by cosine:
 * CLIP's probabilities are the softmax over the labels of exp(logit_scale)
 * times the cosine, SigLIP's one sigmoid per label with its logit_bias
 * (the library's vitc_zero_shot_classes / _probs).
 *
 * The label set's class embeddings are what costs (1,000 labels x 80
 * templates is 80,000 prompts): they are cached in the user's cache
 * directory (tools/cache.c, as similar's index), keyed by the model's
 * content (tokenizer files included), the precisions, the templates and
 * the labels, so that a second call runs only the image tower.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cache.h"
#include "cli.h"
#include "cli_text.h"

#define ZS_DEFAULT_TEMPLATE "a photo of a {}."
#define ZS_MAX_BATCH 4096
/* Prompts per chunk of labels whose class embeddings are built together. */
#define ZS_CHUNK_PROMPTS 256
/* A key past this is not cached (a safetensors header holds 100 MB). */
#define ZS_MAX_KEY_BYTES (64u << 20)

static const char zs_usage[] =
    "usage: vitc zero-shot --model M (--labels L1,L2,... | --labels-file F)\n"
    "                      [options] IMAGE...\n"
    "\n"
    "Label PNG or JPEG images with words of your choice (zero-shot\n"
    "classification) with a CLIP or SigLIP checkpoint that has both towers and\n"
    "its tokenizer (a Hub CLIPModel or SiglipModel directory). Each label is put\n"
    "into each template; the prompts' text embeddings are normalised, averaged\n"
    "per label and normalised again, then compared with the image's by cosine.\n"
    "CLIP: probabilities are the softmax over the labels of exp(logit_scale) *\n"
    "cos. SigLIP: each label's own sigmoid(exp(logit_scale) * cos + logit_bias)\n"
    "(they need not sum to 1). See docs/zero-shot.md.\n"
    "\n"
    "options:\n"
    "  --model M          Hub directory (or checkpoint) with both towers\n"
    "  --arch NAME        architecture of a file without vitc.config metadata\n"
    "  --labels L         labels separated by commas (spaces around each removed)\n"
    "  --labels-file F    labels, one per line (UTF-8; up to 50,000)\n"
    "  --template T       the prompt, \"{}\" where the label goes (default\n"
    "                     \"" ZS_DEFAULT_TEMPLATE "\")\n"
    "  --templates SET    imagenet80 (OpenAI's 80 ImageNet prompts, averaged) or\n"
    "                     simple (their 7 best)\n"
    "  --top K            labels to print per image, 1.. (default 5; --topk too)\n"
    "  --json             one JSON object per image and line:\n"
    "                     {\"image\": PATH, \"labels\": [{\"label\": L, \"prob\": P}, ...]}\n"
    "  --batch B          images per forward pass, 1..4096 (default 8)\n"
    "  --threads N        threads, 1..256 (default: all CPUs available)\n"
    CLI_PRECISION_HELP
    "  --cache DIR        keep the label set's class embeddings in DIR (default\n"
    "                     $XDG_CACHE_HOME/vitc/zero-shot, else\n"
    "                     ~/.cache/vitc/zero-shot)\n"
    "  --no-cache         compute them every time; write no cache\n"
    "  --verbose          say on stderr whether the class embeddings were cached\n"
    "  --quiet            no progress on stderr\n"
    "  -h, --help         this help\n"
    "\n"
    "Labels are printed most probable first. Exit status: 0 ok, 1 when an image\n"
    "or the model could not be used, 2 for a usage error.\n";

typedef struct zs_opts {
    const char *model, *arch, *labels, *labels_file, *tmpl, *tmpl_set;
    const char *precision, *attn_precision, *cache_dir;
    int top, batch, threads, json, no_cache, verbose, quiet;
    char **images;
    int n_images;
} zs_opts;

/* tmpl with each "{}" replaced by label: a new string, or NULL. */
static char *zs_prompt(const char *tmpl, const char *label) {
    size_t n = 0, ll = strlen(label);
    for (const char *p = tmpl; (p = strstr(p, "{}")); p += 2) n++;
    size_t len = strlen(tmpl) - 2 * n + n * ll;
    char *out = malloc(len + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tmpl; *p;) {
        if (p[0] == '{' && p[1] == '}') {
            memcpy(o, label, ll);
            o += ll, p += 2;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return out;
}

/* The label set's class embeddings [K, D] from the text tower: chunks of
 * labels whose prompts fill about ZS_CHUNK_PROMPTS rows, so memory stays
 * [chunk * T, D] whatever K is. */
static int zs_compute_classes(vitc_vit *m, char *const *labels, int K,
                              const char *const *tmpls, int T, int64_t D, int quiet,
                              float *classes) {
    int chunk = ZS_CHUNK_PROMPTS / T > 0 ? ZS_CHUNK_PROMPTS / T : 1;
    size_t rows = (size_t)chunk * (size_t)T;
    float *text = malloc(rows * (size_t)D * sizeof *text); /* [chunk * T, D] */
    char **prompts = calloc(rows, sizeof *prompts);
    int rc = CLI_OK;
    cli_progress pr;
    cli_progress_start(&pr, "zero-shot: prompts", (int64_t)K * T, quiet);
    if (!text || !prompts)
        rc = cli_error("out of memory for %zu prompt embeddings of %lld floats", rows,
                       (long long)D);
    for (int k0 = 0; rc == CLI_OK && k0 < K; k0 += chunk) {
        int nk = K - k0 < chunk ? K - k0 : chunk;
        for (int k = 0; k < nk; k++)
            for (int t = 0; t < T; t++)
                if (!(prompts[(size_t)k * T + t] = zs_prompt(tmpls[t], labels[k0 + k])))
                    rc = cli_error("out of memory");
        if (rc == CLI_OK)
            rc = cli_encode_texts(m, (const char *const *)prompts, (int64_t)nk * T, text, &pr,
                                  (int64_t)k0 * T);
        if (rc == CLI_OK &&
            vitc_zero_shot_classes(text, nk, T, D, classes + (size_t)k0 * (size_t)D) != VITC_OK)
            rc = cli_error("%s", vitc_last_error());
        for (size_t i = 0; i < rows; i++) {
            free(prompts[i]);
            prompts[i] = NULL;
        }
    }
    cli_progress_clear(&pr);
    free(prompts);
    free(text);
    return rc;
}

/* The cache's key: everything the class embeddings depend on. */
static char *zs_key(const zs_opts *o, const vitc_vit *m, char *const *labels, int K,
                    const char *const *tmpls, int T, int64_t D) {
    json_t *jl = json_array(), *jt = json_array();
    for (int k = 0; jl && k < K; k++) json_array_append_new(jl, json_string(labels[k]));
    for (int t = 0; jt && t < T; t++) json_array_append_new(jt, json_string(tmpls[t]));
    json_t *k = json_pack("{s o s s s s s I s o s o s i}", "model", cache_model_sig(o->model, 1),
                          "precision", vitc_precision_name(vitc_vit_get_precision(m)),
                          "attention_precision",
                          vitc_precision_name(vitc_vit_get_attention_precision(m)), "dim",
                          (json_int_t)D, "templates", jt, "labels", jl, "recipe", 1);
    char *s = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(k);
    return s;
}

static void zs_print(const zs_opts *o, const char *path, const float *p, char *const *labels,
                     int K, cli_ranked *rank) {
    for (int k = 0; k < K; k++) {
        rank[k].score = p[k];
        rank[k].index = k;
    }
    qsort(rank, (size_t)K, sizeof *rank, cli_ranked_cmp);
    int top = o->top < K ? o->top : K;
    if (o->json) {
        fputs("{\"image\": ", stdout);
        cli_json_string(stdout, path);
        fputs(", \"labels\": [", stdout);
        for (int r = 0; r < top; r++) {
            fputs(r ? ", {\"label\": " : "{\"label\": ", stdout);
            cli_json_string(stdout, labels[rank[r].index]);
            fputs(", \"prob\": ", stdout);
            cli_json_number(stdout, (double)rank[r].score);
            fputc('}', stdout);
        }
        fputs("]}\n", stdout);
        return;
    }
    cli_put_escaped(stdout, path, SIZE_MAX);
    putchar('\n');
    for (int r = 0; r < top; r++) {
        printf("  %2d. %8.4f%%  ", r + 1, 100.0 * rank[r].score);
        cli_put_escaped(stdout, labels[rank[r].index], SIZE_MAX);
        putchar('\n');
    }
}

int cmd_zero_shot(int argc, char **argv) {
    zs_opts o;
    memset(&o, 0, sizeof o);
    o.top = 5;
    o.batch = 8;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o.model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o.arch, 0, 0, NULL},
        {"--labels", NULL, CLI_STRING, &o.labels, 0, 0, NULL},
        {"--labels-file", NULL, CLI_STRING, &o.labels_file, 0, 0, NULL},
        {"--template", NULL, CLI_STRING, &o.tmpl, 0, 0, NULL},
        {"--templates", NULL, CLI_STRING, &o.tmpl_set, 0, 0, NULL},
        {"--top", "--topk", CLI_INT, &o.top, 1, 1000000000, NULL},
        {"--json", NULL, CLI_FLAG, &o.json, 0, 0, NULL},
        {"--batch", NULL, CLI_INT, &o.batch, 1, ZS_MAX_BATCH, NULL},
        {"--threads", NULL, CLI_INT, &o.threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o.precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o.attn_precision, 0, 0, NULL},
        {"--cache", NULL, CLI_STRING, &o.cache_dir, 0, 0, NULL},
        {"--no-cache", NULL, CLI_FLAG, &o.no_cache, 0, 0, NULL},
        {"--verbose", "-v", CLI_FLAG, &o.verbose, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &o.quiet, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), -1, "image"};
    int rc = cli_parse_images("zero-shot", zs_usage, &spec, argc, argv, &o.model, &o.images,
                              &o.n_images);
    if (rc != 0) {
        free(o.images);
        return rc < 0 ? CLI_OK : rc;
    }
    vitc_vit *m = NULL;
    char **labels = NULL, *key = NULL, dir[4000] = "", cache[4200] = "";
    int K = 0, T = 1, failed = 0, done = 0;
    const char *one[1] = {o.tmpl ? o.tmpl : ZS_DEFAULT_TEMPLATE};
    const char *const *tmpls = one;
    float *classes = NULL; /* [K, D], unit rows */
    float *batch = NULL;   /* [batch, C, H, W] */
    float *emb = NULL;     /* [batch, D] */
    float *probs = NULL;   /* [batch, K] */
    const char **paths = NULL;
    cli_ranked *rank = NULL;
    cli_input in;
    vitc_safetensors *st = NULL;

    /* Every check on the user's text before the model is read. */
    if (!o.labels == !o.labels_file) {
        rc = cli_usage_error("zero-shot", "give the labels with --labels or --labels-file "
                                          "(one of them)");
        goto out;
    }
    if (o.tmpl && o.tmpl_set) {
        rc = cli_usage_error("zero-shot", "--template and --templates exclude each other");
        goto out;
    }
    if (o.no_cache && o.cache_dir) {
        rc = cli_usage_error("zero-shot", "--cache and --no-cache exclude each other");
        goto out;
    }
    if (o.tmpl_set && !(tmpls = vitc_zero_shot_templates(o.tmpl_set, &T))) {
        rc = cli_usage_error("zero-shot", "--templates must be imagenet80 or simple, not '%s'",
                             o.tmpl_set);
        goto out;
    }
    if (o.tmpl) {
        if ((rc = cli_check_text("--template", o.tmpl)) != CLI_OK)
            goto out;
        if (!strstr(o.tmpl, "{}")) {
            cli_error("--template has no {} where the label goes (e.g. \"a photo of a {}.\")");
            rc = CLI_USAGE;
            goto out;
        }
    }
    rc = o.labels ? cli_split_labels(o.labels, &labels, &K)
                  : cli_read_lines("--labels-file", o.labels_file, &labels, &K);
    if (rc != CLI_OK)
        goto out;
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);

    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, 0, 0, 0, 0, 1};
    if ((rc = cli_open_model("zero-shot", &mo, &m, &in)) != CLI_OK ||
        (rc = cli_text_model(o.model, m)) != CLI_OK)
        goto out;
    float scale, bias;
    int has_bias;
    int64_t D = vitc_vit_text_dim(m), E = 0;
    if (vitc_vit_logit_params(m, &scale, &bias, &has_bias) != VITC_OK ||
        vitc_vit_embed_size(m, VITC_POOL_DEFAULT, in.height, in.width, &E) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto out;
    }
    if (E != D) {
        rc = cli_error("%s: the image embedding has %lld floats, the text embedding %lld: not "
                       "one CLIP/SigLIP pair",
                       o.model, (long long)E, (long long)D);
        goto out;
    }
    if (!(classes = malloc((size_t)K * (size_t)D * sizeof *classes))) {
        rc = cli_error("out of memory for %d class embeddings of %lld floats", K, (long long)D);
        goto out;
    }

    /* The class embeddings: from the cache when its key is this one. */
    int use_cache = !o.no_cache, cached = 0;
    if (use_cache) {
        char why[4400];
        if (!(key = zs_key(&o, m, labels, K, tmpls, T, D))) {
            rc = cli_error("out of memory");
            goto out;
        }
        if (strlen(key) > ZS_MAX_KEY_BYTES) {
            cli_warning("the label set is too large to cache (%zu bytes of key)", strlen(key));
            use_cache = 0;
        } else if (cache_folder(o.cache_dir, "zero-shot", dir, sizeof dir, why, sizeof why) !=
                   0) {
            cli_warning("no class embedding cache (%s)", why);
            use_cache = 0;
        } else {
            snprintf(cache, sizeof cache, "%s/zero-shot-%016llx.safetensors", dir,
                     (unsigned long long)cache_fnv1a(CACHE_FNV_BASIS, key, strlen(key)));
            const float *data;
            int64_t rows;
            if ((st = cache_open(cache, "vitc.zero-shot", key, "classes", D, &data, &rows)) &&
                rows == K) {
                memcpy(classes, data, (size_t)K * (size_t)D * sizeof *classes);
                cached = 1;
            }
            vitc_safetensors_free(st);
            st = NULL;
        }
    }
    if (!cached) {
        if ((rc = zs_compute_classes(m, labels, K, tmpls, T, D, o.quiet, classes)) != CLI_OK)
            goto out;
        const char *mk[1] = {"vitc.zero-shot"}, *mv[1] = {key}, *why;
        if (use_cache &&
            (why = cache_save(dir, cache, "zero-shot", "classes", classes, K, D, 1, mk, mv)))
            cli_warning("the class embedding cache could not be written: %s", why);
    }
    if (o.verbose)
        fprintf(stderr, "vitc: class embeddings: %s (%d label%s x %d template%s)\n",
                cached ? "cached" : "computed", K, K == 1 ? "" : "s", T, T == 1 ? "" : "s");

    /* The images. */
    const vitc_vit_config *cfg = vitc_vit_get_config(m);
    if (o.batch > o.n_images)
        o.batch = o.n_images;
    size_t bb;
    if (__builtin_mul_overflow((size_t)o.batch, in.per_image * sizeof(float), &bb) ||
        !(batch = malloc(bb)) || !(emb = malloc((size_t)o.batch * (size_t)D * sizeof *emb)) ||
        !(probs = malloc((size_t)o.batch * (size_t)K * sizeof *probs)) ||
        !(paths = malloc(sizeof *paths * (size_t)o.batch)) ||
        !(rank = malloc(sizeof *rank * (size_t)K))) {
        rc = cli_error("out of memory for a batch of %d images", o.batch);
        goto out;
    }
    cli_progress pr;
    cli_progress_start(&pr, "zero-shot", o.n_images, o.quiet);
    for (int next = 0; next < o.n_images;) {
        int nb = cli_fill_batch(o.images, o.n_images, &next, cfg, &in, o.batch, batch, paths,
                                pr.shown, &failed);
        if (nb == 0)
            continue;
        if (vitc_vit_embed(m, batch, nb, in.height, in.width, VITC_POOL_DEFAULT, emb) !=
                VITC_OK ||
            vitc_zero_shot_probs(emb, nb, classes, K, D, scale, bias, has_bias, probs) !=
                VITC_OK) {
            cli_progress_clear(&pr);
            rc = cli_error("forward pass: %s", vitc_last_error());
            goto out;
        }
        cli_progress_clear(&pr);
        for (int b = 0; b < nb; b++)
            zs_print(&o, paths[b], probs + (size_t)b * (size_t)K, labels, K, rank);
        fflush(stdout);
        done += nb;
        cli_progress_update(&pr, done + failed);
    }
    cli_progress_clear(&pr);
    if (fflush(stdout) != 0 || ferror(stdout))
        rc = cli_error("writing the results failed: %s", strerror(errno));
    else
        rc = failed ? CLI_FAIL : CLI_OK;
    if (failed && !o.quiet)
        fprintf(stderr, "vitc: %d of %d images could not be labelled\n", failed, o.n_images);
out:
    cli_free_texts(labels, K);
    free(key);
    free(classes);
    free(batch);
    free(emb);
    free(probs);
    free(paths);
    free(rank);
    free(o.images);
    vitc_vit_free(m);
    return rc;
}
