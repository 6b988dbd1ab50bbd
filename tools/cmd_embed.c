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
#include <sys/stat.h>
#include <sys/types.h>

#include "cli.h"
#include "cli_text.h"
#include "index.h"

#ifdef VITC_MPI
#include <mpi.h>
#endif

#define EMBED_DEFAULT_BATCH 8
#define EMBED_MAX_BATCH 4096
#define EMBED_MAX_CROP 16384

/* --out's formats, by its extension (cli_out_format's order). */
enum { EMBED_OUT_NPY, EMBED_OUT_JSONL, EMBED_OUT_JSON };
static const char *const embed_out_exts[] = {".npy", ".jsonl", ".json"};

static const char embed_usage[] =
    "usage: vitc embed --model M [options] IMAGE...\n"
    "       vitc embed --model M (--text T | --text-file F) [options]\n"
    "       [mpirun -np K] vitc embed --model M --files-from LIST --out DIR [options]\n"
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
    "  --files-from LIST  the images: LIST's lines, one path each; --out DIR is\n"
    "                   then an index directory for vitc similar --index DIR:\n"
    "                   DIR/shard-RRRRR-of-KKKKK.safetensors per rank and\n"
    "                   DIR/index.json. A rerun skips the shards that are done\n"
#ifdef VITC_MPI
    "                   (under mpirun -np K, rank r embeds the r-th of K\n"
    "                   contiguous parts of LIST; this vitc was built with MPI=1)\n"
#else
    "                   (this vitc has no MPI: build it with make MPI=1 to\n"
    "                   split LIST over mpirun's ranks)\n"
#endif
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
    const char *files_from;
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
        {"--files-from", NULL, CLI_STRING, &o->files_from, 0, 0, NULL},
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
    if (o->files_from && (o->text || o->text_file || o->n_images))
        return cli_usage_error("embed", "--files-from gives the images: no image arguments, "
                                        "--text or --text-file with it");
    if (o->files_from && (!o->out || o->json))
        return cli_usage_error("embed", "--files-from writes an index directory: give it as "
                                        "--out DIR (and no --json)");
    if (o->files_from && o->pool && !strcmp(o->pool, "tokens"))
        return cli_usage_error("embed", "an index holds one embedding per image: --pool "
                                        "default, cls or mean with --files-from");
    if (!o->text && !o->text_file && !o->files_from && o->n_images == 0)
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
    if (o->out && !o->files_from && (o->out_format = cli_out_format("embed", "--out", o->out,
                                                   "a float32 .npy array or JSON",
                                                   embed_out_exts, 3)) < 0)
        return CLI_USAGE;
    if (!o->out)
        o->json = 1;
    return 0;
}

/* ---- --files-from LIST --out DIR: one shard per rank ---------------------
 * Each rank embeds a contiguous part of LIST (not every K-th path): the
 * shards read in rank order are then LIST in order, the same rows as one
 * process's single shard, and a rank reads neighbouring files, often of one
 * folder. Every rank passes through the same collectives whatever fails
 * (a rank that returned early would leave the others waiting). */

static int mpi_all_ok(int ok) {
#ifdef VITC_MPI
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
#else
    return ok;
#endif
}

/* Gathers v[3] of every rank into all[size * 3] on rank 0 (NULL elsewhere). */
static void mpi_gather3(const long long v[3], long long *all, int size) {
#ifdef VITC_MPI
    (void)size;
    MPI_Gather(v, 3, MPI_LONG_LONG, all, 3, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
#else
    for (int i = 0; i < 3 * size; i++) all[i] = v[i % 3];
#endif
}

static int mkdir_p(const char *dir) {
    char buf[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, dir, len + 1);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    struct stat sb;
    return (mkdir(buf, 0777) == 0 || errno == EEXIST) && stat(buf, &sb) == 0 &&
                   S_ISDIR(sb.st_mode)
               ? 0
               : -1;
}

/* The index's key: what makes two shards' embeddings comparable. */
static char *embed_index_key(const embed_opts *o, const vitc_vit *m, int64_t per, int n,
                             char *const *list, int size) {
    char hash[17];
    index_list_hash(list, n, hash);
    json_t *k = json_pack("{s i s o s s s s s s s b s i s i s I s {s i s s} s i}", "format",
                          INDEX_VERSION, "model", index_model_id(o->model), "precision",
                          vitc_precision_name(vitc_vit_get_precision(m)), "attention_precision",
                          vitc_precision_name(vitc_vit_get_attention_precision(m)), "pool",
                          o->pool ? o->pool : "default", "normalize", o->normalize, "crop",
                          o->crop_set ? o->crop : -1, "resize", o->resize_set ? o->resize : -1,
                          "dim", (json_int_t)per, "list", "entries", n, "fnv1a64", hash,
                          "shards", size);
    char *s = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(k);
    return s;
}

/* Before any work: the model, the list, the key, this rank's shard state
 * and (rank 0) what DIR holds already. CLI_OK, or a reported error. */
static int embed_index_prepare(const embed_opts *o, vitc_pool pool, int rank, int size,
                               vitc_vit **m, cli_input *in, int64_t *per, char ***list, int *n,
                               char **key, int *state, int64_t *rows) {
    int rc;
    char why[4400], name[64], path[4200];
    const cli_model_opts mo = {o->model, o->arch, o->precision, o->attn_precision, o->crop,
                               o->crop_set, o->resize, o->resize_set, 1};
    if ((rc = cli_open_model("embed", &mo, m, in)) != CLI_OK ||
        (rc = index_read_list(o->files_from, list, n)) != CLI_OK)
        return rc;
    if (vitc_vit_embed_size(*m, pool, in->height, in->width, per) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    if (!(*key = embed_index_key(o, *m, *per, *n, *list, size)))
        return cli_error("out of memory");
    if (mkdir_p(o->out) != 0)
        return cli_error("--out %s: cannot make the index directory: %s", o->out,
                         strerror(errno ? errno : ENOTDIR));
    if (rank == 0 && index_is_dir(o->out)) {
        char *old = index_manifest_key(o->out, why, sizeof why);
        if (!old)
            return cli_error("--out %s: %s; remove it or choose another --out", o->out, why);
        int same = !strcmp(old, *key);
        free(old);
        if (!same)
            return cli_error("--out %s holds the index of another model, list, options or "
                             "number of ranks (%s/%s); remove it or choose another --out",
                             o->out, o->out, INDEX_MANIFEST);
    }
    if (rank == 0 && index_other_shards(o->out, size, name, sizeof name))
        return cli_error("--out %s holds %s, a shard of a run with another number of ranks "
                         "than %d; rerun with that many, or remove it", o->out, name, size);
    int first, count;
    index_share(*n, rank, size, &first, &count);
    index_shard_name(name, sizeof name, rank, size);
    snprintf(path, sizeof path, "%s/%s", o->out, name);
    char place[128];
    snprintf(place, sizeof place, "{\"entries\":%d,\"first\":%d,\"rank\":%d}", count, first,
             rank);
    *state = index_shard_state(path, *key, place, *per, rows, why, sizeof why);
    if (*state == INDEX_SHARD_FOREIGN)
        return cli_error("%s: %s; remove it or choose another --out", path, why);
    if (*state == INDEX_SHARD_DAMAGED)
        cli_warning("%s is damaged (%s); embedding its images again", path, why);
    return CLI_OK;
}

/* This rank's share of the list into its shard. *rows, *failed: what it holds. */
static int embed_index_shard(const embed_opts *o, vitc_pool pool, int rank, int size,
                             vitc_vit *m, const cli_input *in, int64_t per, char **list, int n,
                             const char *key, int64_t *rows, int *failed) {
    int first, count, rc = CLI_OK;
    char name[64], path[4200], place[128], label[64];
    index_share(n, rank, size, &first, &count);
    index_shard_name(name, sizeof name, rank, size);
    snprintf(path, sizeof path, "%s/%s", o->out, name);
    snprintf(place, sizeof place, "{\"entries\":%d,\"first\":%d,\"rank\":%d}", count, first,
             rank);
    index_sweep_temps(o->out, name);
    const vitc_vit_config *cfg = vitc_vit_get_config(m);
    int batch_n = o->batch < count ? o->batch : count > 0 ? count : 1;
    size_t C = (size_t)cfg->hidden_dim, eb, bb;
    float *emb = NULL /* [count, per] */, *batch = NULL /* [batch_n, per_image] */;
    const char **paths = NULL, **row_paths = NULL;
    if (__builtin_mul_overflow((size_t)(count ? count : 1), (size_t)per * sizeof(float), &eb) ||
        __builtin_mul_overflow((size_t)batch_n, in->per_image * sizeof(float), &bb) ||
        !(emb = malloc(eb)) || !(batch = malloc(bb)) ||
        !(paths = malloc(sizeof *paths * (size_t)batch_n)) ||
        !(row_paths = malloc(sizeof *row_paths * (size_t)(count ? count : 1)))) {
        rc = cli_error("out of memory for %d embeddings of %lld floats", count, (long long)per);
        goto done;
    }
    cli_progress pr;
    snprintf(label, sizeof label, size > 1 ? "embed: rank %d of %d" : "embed", rank, size);
    cli_progress_start(&pr, label, count, o->quiet);
    int done = 0;
    for (int next = 0; next < count;) {
        int nb = cli_fill_batch(list + first, count, &next, cfg, in, batch_n, batch, paths,
                                pr.shown, failed);
        if (nb == 0)
            continue;
        float *dst = emb + (size_t)done * (size_t)per;
        if (vitc_vit_embed(m, batch, nb, in->height, in->width, pool, dst) != VITC_OK) {
            cli_progress_clear(&pr);
            rc = cli_error("forward pass: %s", vitc_last_error());
            goto done;
        }
        if (o->normalize)
            cli_l2_normalize(dst, (size_t)nb * (size_t)per / C, C);
        memcpy(row_paths + done, paths, sizeof *paths * (size_t)nb);
        done += nb;
        cli_progress_update(&pr, done + *failed);
    }
    cli_progress_clear(&pr);
    const char *why = index_save_shard(path, key, place, emb, done, per, row_paths, *failed);
    if (why) {
        rc = cli_error("%s: %s", path, why);
        goto done;
    }
    *rows = done;
    if (!o->quiet) { /* one write: K ranks share a terminal */
        char e[4400];
        cli_escape(e, sizeof e, path);
        fprintf(stderr, "vitc: wrote %s (%d embedding%s of %lld floats)\n", e, done,
                done == 1 ? "" : "s", (long long)per);
    }
done:
    free(emb);
    free(batch);
    free(paths);
    free(row_paths);
    return rc;
}

static int embed_index(const embed_opts *o, vitc_pool pool, int rank, int size) {
    vitc_vit *m = NULL;
    cli_input in;
    int64_t per = 0, rows = 0;
    char **list = NULL, *key = NULL, name[64], path[4200];
    int n = 0, state = INDEX_SHARD_ABSENT, failed = 0;
    long long *all = NULL;
    /* rank 0 gathers every rank's [written, rows, bytes] */
    int rc = rank == 0 && !(all = malloc((size_t)size * 3 * sizeof *all))
                 ? cli_error("out of memory")
                 : embed_index_prepare(o, pool, rank, size, &m, &in, &per, &list, &n, &key,
                                       &state, &rows);
    /* one rank's refusal (a foreign shard, another run's manifest) stops all
     * before any work */
    if (!mpi_all_ok(rc == CLI_OK)) {
        rc = rc != CLI_OK ? rc : CLI_FAIL;
        goto done;
    }
    index_shard_name(name, sizeof name, rank, size);
    snprintf(path, sizeof path, "%s/%s", o->out, name);
    if (state == INDEX_SHARD_DONE) {
        if (!o->quiet) {
            char e[4400];
            cli_escape(e, sizeof e, path);
            fprintf(stderr, "vitc: %s is complete (%lld embeddings); skipped\n", e,
                    (long long)rows);
        }
    } else {
        rc = embed_index_shard(o, pool, rank, size, m, &in, per, list, n, key, &rows, &failed);
    }
    struct stat sb;
    int written = rc == CLI_OK && stat(path, &sb) == 0;
    long long mine[3] = {written, rows, written ? (long long)sb.st_size : 0};
    mpi_gather3(mine, all, size);
    /* the manifest last, once every shard is on disk: a reader that finds it
     * finds them all */
    if (rank == 0) {
        long long *r_rows = malloc((size_t)size * 2 * sizeof *r_rows);
        int ok = r_rows != NULL;
        for (int r = 0; r_rows && r < size; r++) {
            ok &= all[3 * r] != 0;
            r_rows[r] = all[3 * r + 1];
            r_rows[size + r] = all[3 * r + 2];
        }
        if (!ok && rc == CLI_OK)
            rc = cli_error("--out %s: %s; rerun the same command to finish it (done shards are "
                           "kept)", o->out, r_rows ? "a rank failed, no index.json was written"
                                                   : "out of memory");
        else if (ok && index_save_manifest(o->out, key, size, n, r_rows, r_rows + size) != CLI_OK)
            rc = CLI_FAIL;
        else if (ok && !o->quiet) {
            long long total = 0;
            for (int r = 0; r < size; r++) total += r_rows[r];
            char e[4400];
            cli_escape(e, sizeof e, o->out);
            fprintf(stderr, "vitc: wrote %s/%s (%d shard%s, %lld embedding%s of %d images)\n",
                    e, INDEX_MANIFEST, size, size == 1 ? "" : "s", total, total == 1 ? "" : "s",
                    n);
        }
        free(r_rows);
    }
    if (rc == CLI_OK && failed) {
        int first, count;
        index_share(n, rank, size, &first, &count);
        if (!o->quiet)
            fprintf(stderr, "vitc: %d of the %d images of %s could not be embedded\n", failed,
                    count, name);
        rc = CLI_FAIL;
    }
done:
    free(all);
    free(key);
    index_free_paths(list, n);
    vitc_vit_free(m);
    return rc;
}

/* --files-from: under mpirun (MPI=1 builds) each rank its shard. */
static int embed_files_from(embed_opts *o, vitc_pool pool, int argc, char **argv) {
#ifdef VITC_MPI
    int rank = 0, size = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = size > INDEX_MAX_SHARDS
                 ? cli_error("%d ranks: an index has at most %d shards", size, INDEX_MAX_SHARDS)
                 : embed_index(o, pool, rank, size);
    MPI_Finalize();
    return rc;
#else
    (void)argc, (void)argv;
    /* K copies of this vitc would each embed the whole list into one shard */
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    if (!ws)
        ws = getenv("PMI_SIZE");
    if (ws && atoi(ws) > 1)
        return cli_error("this vitc was built without MPI, so under mpirun each of the %d "
                         "ranks would embed the whole list: build it with make MPI=1", atoi(ws));
    return embed_index(o, pool, 0, 1);
#endif
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
    if (o.text || o.text_file || o.files_from) {
        rc = o.files_from ? embed_files_from(&o, pool, argc, argv) : embed_text(&o);
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
