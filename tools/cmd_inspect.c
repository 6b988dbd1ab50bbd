/* cmd_inspect.c — `vitc inspect FILE.safetensors`: tensors, metadata and the
 * architecture vitc recognises, as text or JSON. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "cli.h"

static void inspect_help(FILE *f) {
    fprintf(f,
            "usage: vitc inspect [--json] [--arch NAME] [--full] FILE.safetensors\n\n"
            "List a safetensors file's tensors (name, dtype, shape), its metadata and the\n"
            "Vision Transformer architecture vitc recognises in it.\n\n"
            "options:\n"
            "  --json       one JSON object: {\"file\", \"tensors\": [{\"name\", \"dtype\",\n"
            "               \"shape\"}], \"parameters\", \"metadata\", \"architecture\", \"config\"}\n"
            "               (architecture and config null, and \"not_recognised\" saying why,\n"
            "               when the file is not a ViT vitc recognises)\n"
            "  --arch NAME  check the file against this architecture (vit_b_16, ...);\n"
            "               exit 1 when it does not match\n"
            "  --full       print long metadata values whole (text output cuts them)\n"
            "  -h, --help   this help\n");
}

/* Long metadata values (a vitc.config with 1000 labels) would bury the
 * listing; text output shows their start and length unless --full. */
enum { INSPECT_META_CUT = 100 };

/* Display width of a UTF-8 string, counted in code points. */
static int utf8_width(const char *s) {
    int w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void print_shape(int nd, const int64_t *shape) {
    putchar('[');
    for (int j = 0; j < nd; j++)
        printf(j ? ", %" PRId64 : "%" PRId64, shape[j]);
    putchar(']');
}

/* The shortest decimal that reads back as the same float, so 1e-6 prints
 * as 1e-06 and not as its double widening 9.99999997e-07. */
static double short_double(float f) {
    char buf[32];
    for (int prec = 6; prec < 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}

static json_t *config_json(const vitc_vit_config *c) {
    json_t *mean = json_pack("[fff]", short_double(c->mean[0]), short_double(c->mean[1]),
                             short_double(c->mean[2]));
    json_t *std = json_pack("[fff]", short_double(c->std[0]), short_double(c->std[1]),
                            short_double(c->std[2]));
    return json_pack("{si si si si si si si si sf so so}", "image_size", c->image_size,
                     "patch_size", c->patch_size, "in_channels", c->in_channels, "hidden_dim",
                     c->hidden_dim, "depth", c->depth, "num_heads", c->num_heads, "mlp_dim",
                     c->mlp_dim, "num_classes", c->num_classes, "norm_eps", short_double(c->norm_eps),
                     "mean", mean, "std", std);
}

static int inspect_json(const char *path, const vitc_safetensors *st, const vitc_vit *m,
                        const char *why) {
    json_t *root = json_object(), *ts = json_array(), *meta = json_object();
    size_t params = 0;
    for (int i = 0; i < vitc_safetensors_count(st); i++) {
        const char *name, *dtype;
        int nd;
        const int64_t *shape;
        vitc_safetensors_tensor(st, i, &name, &dtype, &nd, &shape, NULL);
        json_t *sh = json_array();
        for (int j = 0; j < nd; j++)
            json_array_append_new(sh, json_integer(shape[j]));
        json_array_append_new(ts, json_pack("{ss ss so}", "name", name, "dtype", dtype, "shape",
                                            sh));
        params += cli_numel(nd, shape);
    }
    for (int i = 0; i < vitc_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        vitc_safetensors_metadata(st, i, &k, &v);
        json_object_set_new(meta, k, json_string(v));
    }
    json_t *jpath = json_string(path); /* NULL when the path is not UTF-8 */
    json_object_set_new(root, "file", jpath ? jpath : json_string("(path not UTF-8)"));
    json_object_set_new(root, "tensors", ts);
    json_object_set_new(root, "parameters", json_integer((json_int_t)params));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "architecture", m ? json_string(vitc_vit_arch_name(m)) : json_null());
    json_object_set_new(root, "config", m ? config_json(vitc_vit_get_config(m)) : json_null());
    if (!m)
        json_object_set_new(root, "not_recognised", json_string(why));
    char *s = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!s)
        return cli_error("%s: cannot format JSON", path);
    puts(s);
    free(s);
    return CLI_OK;
}

static void inspect_text(const char *path, const vitc_safetensors *st, const vitc_vit *m,
                         const char *why, int full) {
    int n = vitc_safetensors_count(st);
    size_t params = 0;
    int w = 4;
    for (int i = 0; i < n; i++) {
        const char *name;
        int nd;
        const int64_t *shape;
        vitc_safetensors_tensor(st, i, &name, NULL, &nd, &shape, NULL);
        params += cli_numel(nd, shape);
        if (utf8_width(name) > w)
            w = utf8_width(name) > 60 ? 60 : utf8_width(name);
    }
    fputs("file: ", stdout);
    cli_put_escaped(stdout, path, SIZE_MAX);
    putchar('\n');
    printf("tensors: %d (%zu parameters, %.1f MB as float32)\n", n, params,
           (double)params * 4 / 1e6);
    for (int i = 0; i < n; i++) {
        const char *name, *dtype;
        int nd;
        const int64_t *shape;
        vitc_safetensors_tensor(st, i, &name, &dtype, &nd, &shape, NULL);
        fputs("  ", stdout);
        cli_put_escaped(stdout, name, SIZE_MAX);
        printf("%*s  %-4s  ", w > utf8_width(name) ? w - utf8_width(name) : 0, "", dtype);
        print_shape(nd, shape);
        putchar('\n');
    }
    int nm = vitc_safetensors_metadata_count(st);
    printf("metadata: %d\n", nm);
    for (int i = 0; i < nm; i++) {
        const char *k, *v;
        vitc_safetensors_metadata(st, i, &k, &v);
        size_t len = strlen(v);
        fputs("  ", stdout);
        cli_put_escaped(stdout, k, SIZE_MAX);
        fputs(": ", stdout);
        cli_put_escaped(stdout, v, full ? SIZE_MAX : INSPECT_META_CUT);
        if (!full && len > INSPECT_META_CUT)
            printf("... (%zu bytes; --full shows all)", len);
        putchar('\n');
    }
    if (m) {
        const vitc_vit_config *c = vitc_vit_get_config(m);
        printf("architecture: %s (image %d, patch %d, channels %d, hidden %d, depth %d, "
               "heads %d, mlp %d, classes %d)\n",
               vitc_vit_arch_name(m), c->image_size, c->patch_size, c->in_channels,
               c->hidden_dim, c->depth, c->num_heads, c->mlp_dim, c->num_classes);
    } else {
        printf("architecture: not a Vision Transformer vitc recognises (%s)\n", why);
    }
}

/* A Hugging Face Hub model (directory, index, or a file with config.json
 * beside it): what vitc built from it, and the tensors it skipped. */
static int inspect_hub(const char *path, vitc_vit *m, int json) {
    const vitc_vit_config *c = vitc_vit_get_config(m);
    int ni = vitc_vit_num_ignored(m), np = vitc_vit_num_params(m);
    if (json) {
        json_t *o = json_object(), *ign = json_array(), *par = json_array();
        json_object_set_new(o, "model", json_string(path));
        json_object_set_new(o, "family", json_string(vitc_vit_family(m)));
        json_object_set_new(o, "architecture", json_string(vitc_vit_arch_name(m)));
        json_object_set_new(o, "has_head", json_boolean(vitc_vit_has_head(m)));
        json_object_set_new(o, "prefix_tokens", json_integer(vitc_vit_num_prefix_tokens(m)));
        json_object_set_new(o, "config", json_pack("{si si si si si si si si sf}", "image_size",
                            c->image_size, "patch_size", c->patch_size, "in_channels",
                            c->in_channels, "hidden_dim", c->hidden_dim, "depth", c->depth,
                            "num_heads", c->num_heads, "mlp_dim", c->mlp_dim, "num_classes",
                            c->num_classes, "norm_eps", short_double(c->norm_eps)));
        for (int i = 0; i < np; i++) {
            const char *name;
            int nd;
            const int64_t *shape;
            json_t *sh = json_array();
            vitc_vit_param(m, i, &name, &nd, &shape, NULL, NULL);
            for (int j = 0; j < nd; j++) json_array_append_new(sh, json_integer(shape[j]));
            json_array_append_new(par, json_pack("{ss so}", "name", name, "shape", sh));
        }
        for (int i = 0; i < ni; i++) json_array_append_new(ign, json_string(vitc_vit_ignored(m, i)));
        json_object_set_new(o, "parameters", par);
        json_object_set_new(o, "ignored", ign);
        int rc = json_dumpf(o, stdout, JSON_COMPACT) == 0 ? CLI_OK : CLI_FAIL;
        putchar('\n');
        json_decref(o);
        return rc;
    }
    fputs("model: ", stdout);
    cli_put_escaped(stdout, path, SIZE_MAX);
    printf("\nfamily: %s (", vitc_vit_family(m));
    cli_put_escaped(stdout, vitc_vit_arch_name(m), SIZE_MAX);
    printf(")\nconfig: image %d, patch %d, channels %d, hidden %d, depth %d, heads %d, mlp %d, "
           "classes %d, eps %g, prefix tokens %d%s\n", c->image_size, c->patch_size,
           c->in_channels, c->hidden_dim, c->depth, c->num_heads, c->mlp_dim, c->num_classes,
           short_double(c->norm_eps), vitc_vit_num_prefix_tokens(m),
           vitc_vit_has_head(m) ? "" : ", no head (embeddings only)");
    printf("parameters: %d tensors (query/key/value fused)\n", np);
    printf("ignored: %d (not used by the vision forward)\n", ni);
    for (int i = 0; i < ni; i++) {
        fputs("  ", stdout);
        cli_put_escaped(stdout, vitc_vit_ignored(m, i), SIZE_MAX);
        putchar('\n');
    }
    return CLI_OK;
}

static int inspect_try_hub(const char *path, int json) {
    vitc_vit *m;
    if (vitc_vit_load(path, NULL, &m) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    int rc = inspect_hub(path, m, json);
    vitc_vit_free(m);
    if (fflush(stdout) != 0)
        rc = cli_error("cannot write the output");
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL, *arch = NULL;
    char *pos[1];
    int json = 0, full = 0, n_pos;
    const cli_opt opts[] = {
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
        {"--full", NULL, CLI_FLAG, &full, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &arch, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 1, "file"};
    int prc = cli_parse_command("inspect", &spec, argc, argv, pos, &n_pos);
    if (prc == CLI_PARSE_HELP) {
        inspect_help(stdout);
        return CLI_OK;
    }
    if (prc != 0)
        return prc;
    if (!n_pos)
        return cli_usage_error("inspect", "no file given");
    path = pos[0];

    vitc_safetensors *st;
    size_t plen = strlen(path);
    struct stat sb;
    if ((stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) ||
        (plen >= 5 && !strcmp(path + plen - 5, ".json")))
        return inspect_try_hub(path, json);
    if (vitc_safetensors_load(path, &st) != VITC_OK) {
        /* A Hub file (int64 position_ids) with config.json beside it. */
        char err[1024];
        snprintf(err, sizeof err, "%s", vitc_last_error());
        vitc_vit *hm;
        if (vitc_vit_load(path, NULL, &hm) == VITC_OK) {
            int rc = inspect_hub(path, hm, json);
            vitc_vit_free(hm);
            return rc;
        }
        return cli_error("%s", err);
    }
    /* Not being a ViT is an answer, not a failure: layer files are valid. */
    vitc_vit *m = NULL;
    char why[512] = "";
    if (vitc_vit_from_safetensors(st, arch, &m) != VITC_OK) {
        m = NULL;
        snprintf(why, sizeof why, "%s", vitc_last_error());
        vitc_vit *hm;
        /* config.json beside it, or CLIP in open_clip's / timm's names */
        if (!arch && vitc_vit_load(path, NULL, &hm) == VITC_OK &&
            (strncmp(vitc_vit_family(hm), "hf-", 3) == 0 || strstr(vitc_vit_family(hm), "clip"))) {
            int rc = inspect_hub(path, hm, json);
            vitc_vit_free(hm);
            vitc_safetensors_free(st);
            return rc;
        }
        if (arch) { /* asked for: a mismatch is the answer the user wants as a failure */
            int rc = cli_error("%s: not a %s: %s", path, arch, vitc_last_error());
            vitc_safetensors_free(st);
            return rc;
        }
    } else if (arch && strcmp(vitc_vit_arch_name(m), arch) != 0) {
        /* The file's vitc.config wins over --arch when loading; asked to
         * check, a file describing another model is a mismatch. */
        const vitc_vit_config *c = vitc_vit_get_config(m);
        int rc = cli_error("%s: not a %s: the file describes %s (patch %d, hidden %d, depth %d, "
                           "heads %d, mlp %d, channels %d)", path, arch, vitc_vit_arch_name(m),
                           c->patch_size, c->hidden_dim, c->depth, c->num_heads, c->mlp_dim,
                           c->in_channels);
        vitc_vit_free(m);
        vitc_safetensors_free(st);
        return rc;
    }
    int rc = CLI_OK;
    if (json)
        rc = inspect_json(path, st, m, why);
    else
        inspect_text(path, st, m, why, full);
    vitc_vit_free(m);
    vitc_safetensors_free(st);
    if (fflush(stdout) != 0)
        rc = cli_error("cannot write the output");
    return rc;
}
