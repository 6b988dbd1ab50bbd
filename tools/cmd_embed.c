/*
 * cmd_embed.c — `vitc embed`: images in, one embedding per image out.
 *
 * Batched like classify: images decoded and preprocessed into a batch
 * buffer, one forward per batch. The default embedding is the model's own
 * pooled output as its library returns it (ViT/DeiT: the class token after
 * the final LayerNorm); --normalize L2-normalises it. An image that cannot
 * be read is reported and skipped; the run exits 1 at the end.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_text.h"

#define EMBED_DEFAULT_BATCH 8
#define EMBED_MAX_BATCH 4096
#define EMBED_MAX_CROP 16384

/* --out's formats, by its extension (cli_out_format's order). */
enum { EMBED_OUT_NPY, EMBED_OUT_JSONL, EMBED_OUT_JSON };
static const char *const embed_out_exts[] = {".npy", ".jsonl", ".json"};

static const char embed_usage[] =
    "usage: vitc embed --model M [options] IMAGE...\n"
    "       vitc embed --model M (--text T | --text-file F) [options]\n"
    "\n"
    "One embedding per PNG or JPEG image. M is a safetensors checkpoint or a\n"
    "Hugging Face Hub model directory (config.json + model.safetensors).\n"
    "With --text, the text features of a CLIP or SigLIP checkpoint with both\n"
    "towers instead (transformers' get_text_features; objects {\"text\": T,\n"
    "\"embedding\": [...]}), comparable by cosine with its image embeddings.\n"
    "\n"
    "options:\n"
    "  --model M        checkpoint file or Hub directory\n"
    "  --arch NAME      architecture of a file without vitc.config metadata\n"
    "  --pool P         default (the model's pooled output: ViT/DeiT the class\n"
    "                   token after the final LayerNorm), cls, mean (of the\n"
    "                   normed patch tokens), tokens (the normed patch tokens,\n"
    "                   [N, C] per image)\n"
    "  --text T         embed the text T (CLIP / SigLIP; no images then)\n"
    "  --text-file F    embed each line of F (UTF-8, up to 50,000 lines)\n"
    "  --normalize      L2-normalise each embedding (each token for tokens)\n"
    "  --out FILE       FILE.npy: [images, C] (tokens: [images, N, C]) float32;\n"
    "                   FILE.jsonl: --json's lines; FILE.json: a JSON array of\n"
    "                   those objects (a name without extension gets .npy bytes)\n"
    "  --json           one JSON object per image and line on stdout:\n"
    "                   {\"image\": PATH, \"embedding\": [...]} (the default\n"
    "                   without --out)\n"
    "  --crop C         center crop size (default: the model's image size)\n"
    "  --resize R       shorter side before cropping (default crop*256/224;\n"
    "                   0: no resize)\n"
    "                   A Hub model without --crop/--resize is preprocessed by its\n"
    "                   own processor (preprocessor_config.json, transformers' PIL\n"
    "                   path); with them, by torchvision's eval transform.\n"
    "  --batch B        images per forward pass, 1..4096 (default 8)\n"
    "  --threads N      threads, 1..256 (default: all CPUs available)\n"
    CLI_PRECISION_HELP
    "  --quiet          no progress line on stderr\n"
    "  -h, --help       this help\n"
    "\n"
    "With --out, rows follow the order of the images that could be read.\n"
    "Exit status: 0 ok, 1 when an image or the model could not be used,\n"
    "2 for a usage error.\n";

typedef struct embed_opts {
    const char *model, *arch, *pool, *out, *precision, *attn_precision, *text, *text_file;
    int normalize, json, crop, resize, batch, threads, quiet;
    int crop_set, resize_set;
    int out_format; /* an EMBED_OUT_* */
    char **images;
    int n_images;
} embed_opts;

static int embed_parse(int argc, char **argv, embed_opts *o, vitc_pool *pool) {
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o->arch, 0, 0, NULL},
        {"--pool", NULL, CLI_STRING, &o->pool, 0, 0, NULL},
        {"--out", "-o", CLI_STRING, &o->out, 0, 0, NULL},
        {"--normalize", NULL, CLI_FLAG, &o->normalize, 0, 0, NULL},
        {"--json", NULL, CLI_FLAG, &o->json, 0, 0, NULL},
        {"--crop", NULL, CLI_INT, &o->crop, 1, EMBED_MAX_CROP, &o->crop_set},
        {"--resize", NULL, CLI_INT, &o->resize, 0, EMBED_MAX_CROP, &o->resize_set},
        {"--batch", NULL, CLI_INT, &o->batch, 1, EMBED_MAX_BATCH, NULL},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o->precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o->attn_precision, 0, 0, NULL},
        {"--quiet", "-q", CLI_FLAG, &o->quiet, 0, 0, NULL},
        {"--text", NULL, CLI_STRING, &o->text, 0, 0, NULL},
        {"--text-file", NULL, CLI_STRING, &o->text_file, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), -1, "image"};
    o->batch = EMBED_DEFAULT_BATCH;
    /* cli_parse_images, where text may stand for the images */
    if (!(o->images = calloc((size_t)argc, sizeof *o->images)))
        return cli_error("out of memory");
    int rc = cli_parse_command("embed", &spec, argc, argv, o->images, &o->n_images);
    if (rc == CLI_PARSE_HELP) {
        fputs(embed_usage, stdout);
        return -1;
    }
    if (rc != 0)
        return rc;
    if (!o->model)
        return cli_usage_error("embed", "--model is required");
    if (o->text && o->text_file)
        return cli_usage_error("embed", "--text and --text-file exclude each other");
    if ((o->text || o->text_file) && o->n_images)
        return cli_usage_error("embed", "embed either text (--text, --text-file) or images, "
                                        "not both");
    if (!o->text && !o->text_file && o->n_images == 0)
        return cli_usage_error("embed", "no images given");
    if ((o->text || o->text_file) && o->pool && strcmp(o->pool, "default"))
        return cli_usage_error("embed", "--pool applies to images; text has one embedding");
    static const char *const names[] = {"default", "cls", "mean", "tokens"};
    *pool = VITC_POOL_DEFAULT;
    if (o->pool) {
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(o->pool, names[i]))
                k = i;
        if (k < 0)
            return cli_usage_error("embed", "--pool must be default, cls, mean or tokens");
        *pool = (vitc_pool)k;
    }
    if (o->out && (o->out_format = cli_out_format("embed", "--out", o->out,
                                                   "a float32 .npy array or JSON",
                                                   embed_out_exts, 3)) < 0)
        return CLI_USAGE;
    if (!o->out)
        o->json = 1;
    return 0;
}

/* what: "image" or "text", the key that names the row. */
static void embed_print_json(FILE *f, const char *what, const char *path, const float *e,
                             size_t n) {
    fprintf(f, "{\"%s\": ", what);
    cli_json_string(f, path);
    fputs(", \"embedding\": [", f);
    /* a non-finite value is null, as classify prints it: JSON has no nan */
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        cli_json_number(f, (double)e[i]);
    }
    fputs("]}\n", f);
}

/* rows embeddings of per floats, with their images' paths, as --out's
 * JSON: one object a line, or (as_array) those lines inside [ ]. Built in
 * memory, then written atomically like every file vitc writes. */
static int embed_save_json(const char *out, const char *what, int as_array, const float *emb,
                           const char *const *paths, int rows, size_t per) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return cli_error("--out %s: out of memory", out);
    if (as_array)
        fputc('[', f);
    for (int r = 0; r < rows; r++) {
        if (as_array && r)
            fputc(',', f);
        embed_print_json(f, what, paths[r], emb + (size_t)r * per, per);
    }
    if (as_array)
        fputs("]\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(buf);
        return cli_error("--out %s: out of memory", out);
    }
    int rc = vitc_save_bytes(out, buf, len) == VITC_OK ? CLI_OK : cli_error("%s", vitc_last_error());
    free(buf);
    return rc;
}

/* --text / --text-file: the text features of a model with both towers,
 * written as the image embeddings are (stdout JSON, or --out). */
static int embed_text(embed_opts *o) {
    char **texts = NULL, *one[1] = {(char *)o->text};
    int n = 0, rc;
    vitc_vit *m = NULL;
    float *emb = NULL;
    if (o->text) {
        if ((rc = cli_check_text("--text", o->text)) != CLI_OK)
            return rc;
        n = 1;
    } else if ((rc = cli_read_lines("--text-file", o->text_file, &texts, &n)) != CLI_OK) {
        cli_free_texts(texts, n);
        return rc;
    }
    char *const *tv = o->text ? one : texts;
    cli_input in;
    const cli_model_opts mo = {o->model, o->arch, o->precision, o->attn_precision, 0, 0, 0, 0, 0};
    if ((rc = cli_open_model("embed", &mo, &m, &in)) != CLI_OK ||
        (rc = cli_text_model(o->model, m)) != CLI_OK)
        goto done;
    size_t D = (size_t)vitc_vit_text_dim(m);
    if (!(emb = malloc((size_t)n * D * sizeof *emb))) {
        rc = cli_error("out of memory for %d embeddings of %zu floats", n, D);
        goto done;
    }
    cli_progress pr;
    cli_progress_start(&pr, "embed: texts", n, o->quiet);
    rc = cli_encode_texts(m, (const char *const *)tv, n, emb, &pr, 0);
    cli_progress_clear(&pr);
    if (rc != CLI_OK)
        goto done;
    if (o->normalize)
        cli_l2_normalize(emb, (size_t)n, D);
    if (o->json)
        for (int i = 0; i < n; i++) embed_print_json(stdout, "text", tv[i], emb + i * D, D);
    if (o->out && o->out_format != EMBED_OUT_NPY) {
        if ((rc = embed_save_json(o->out, "text", o->out_format == EMBED_OUT_JSON, emb,
                                  (const char *const *)tv, n, D)) != CLI_OK)
            goto done;
    } else if (o->out) {
        int64_t shape[2] = {n, (int64_t)D};
        if (vitc_save_npy(o->out, emb, 2, shape) != VITC_OK) {
            rc = cli_error("%s", vitc_last_error());
            goto done;
        }
    }
    if (o->out && !o->quiet) {
        fputs("vitc: wrote ", stderr);
        cli_put_escaped(stderr, o->out, SIZE_MAX);
        fprintf(stderr, " (%d text embedding%s of %zu floats)\n", n, n == 1 ? "" : "s", D);
    }
    rc = fflush(stdout) != 0 || ferror(stdout)
             ? cli_error("writing the results failed: %s", strerror(errno))
             : CLI_OK;
done:
    free(emb);
    cli_free_texts(texts, n);
    vitc_vit_free(m);
    return rc;
}

int cmd_embed(int argc, char **argv) {
    embed_opts o;
    vitc_pool pool;
    vitc_vit *m = NULL;
    float *batch = NULL, *emb = NULL;
    const char **paths = NULL, **row_paths = NULL;
    cli_input in;
    int64_t per = 0;
    int failed = 0, done = 0;
    memset(&o, 0, sizeof o);
    int rc = embed_parse(argc, argv, &o, &pool);
    if (rc != 0) {
        free(o.images);
        return rc < 0 ? CLI_OK : rc;
    }
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    if (o.text || o.text_file) {
        rc = embed_text(&o);
        free(o.images);
        return rc;
    }
    cli_progress pr;
    cli_progress_start(&pr, "embed", o.n_images, o.quiet);
    const vitc_vit_config *cfg;
    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, o.crop,
                               o.crop_set, o.resize, o.resize_set, 1};
    if ((rc = cli_open_model("embed", &mo, &m, &in)) != CLI_OK)
        goto done;
    cfg = vitc_vit_get_config(m);
    if (vitc_vit_embed_size(m, pool, in.height, in.width, &per) != VITC_OK) {
        rc = cli_error("%s", vitc_last_error());
        goto done;
    }
    if (o.batch > o.n_images)
        o.batch = o.n_images;
    /* Every image's embedding is kept for --out: n_images * per floats. */
    size_t rows = o.out ? (size_t)o.n_images : (size_t)o.batch, eb, bb;
    if (__builtin_mul_overflow(rows, (size_t)per * sizeof(float), &eb) ||
        __builtin_mul_overflow((size_t)o.batch, in.per_image * sizeof(float), &bb) ||
        !(emb = malloc(eb)) || !(batch = malloc(bb)) ||
        !(paths = malloc(sizeof *paths * (size_t)o.batch)) ||
        (o.out && !(row_paths = malloc(sizeof *row_paths * (size_t)o.n_images)))) {
        rc = cli_error("out of memory for %zu embeddings of %lld floats", rows, (long long)per);
        goto done;
    }
    size_t C = (size_t)cfg->hidden_dim;
    for (int next = 0; next < o.n_images;) {
        int nb = cli_fill_batch(o.images, o.n_images, &next, cfg, &in, o.batch, batch, paths,
                                pr.shown, &failed);
        if (nb == 0)
            continue;
        float *dst = emb + (o.out ? (size_t)done * (size_t)per : 0);
        if (vitc_vit_embed(m, batch, nb, in.height, in.width, pool, dst) != VITC_OK) {
            rc = cli_error("forward pass: %s", vitc_last_error());
            goto done;
        }
        if (o.normalize) /* per embedding; per token for tokens */
            cli_l2_normalize(dst, (size_t)nb * (size_t)per / C, C);
        cli_progress_clear(&pr);
        if (o.json)
            for (int b = 0; b < nb; b++)
                embed_print_json(stdout, "image", paths[b], dst + (size_t)b * (size_t)per, (size_t)per);
        if (o.out)
            memcpy(row_paths + done, paths, sizeof *paths * (size_t)nb);
        fflush(stdout);
        done += nb;
        cli_progress_update(&pr, done + failed);
    }
    cli_progress_clear(&pr);
    if (o.out && done > 0 && o.out_format != EMBED_OUT_NPY) {
        if ((rc = embed_save_json(o.out, "image", o.out_format == EMBED_OUT_JSON, emb,
                                  row_paths, done, (size_t)per)) != CLI_OK)
            goto done;
    } else if (o.out && done > 0) {
        int64_t shape[3] = {done, (int64_t)((size_t)per / C), (int64_t)C};
        int ndim = pool == VITC_POOL_TOKENS ? 3 : 2;
        if (ndim == 2)
            shape[1] = per;
        if (vitc_save_npy(o.out, emb, ndim, shape) != VITC_OK) {
            rc = cli_error("%s", vitc_last_error());
            goto done;
        }
    }
    /* --out is otherwise silent (stdout has nothing): say what went there */
    if (o.out && done > 0 && !o.quiet) {
        fputs("vitc: wrote ", stderr);
        cli_put_escaped(stderr, o.out, SIZE_MAX);
        fprintf(stderr, " (%d embedding%s of %lld floats)\n", done, done == 1 ? "" : "s",
                (long long)per);
    }
    if (fflush(stdout) != 0 || ferror(stdout))
        rc = cli_error("writing the results failed: %s", strerror(errno));
    else
        rc = failed ? CLI_FAIL : CLI_OK;
    if (failed && !o.quiet)
        fprintf(stderr, "vitc: %d of %d images could not be embedded\n", failed, o.n_images);
done:
    free(batch);
    free(emb);
    free(paths);
    free(row_paths);
    free(o.images);
    vitc_vit_free(m);
    return rc;
}
