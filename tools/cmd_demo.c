/*
 * cmd_demo.c — `vitc demo`: every seed attention block on the seed's own
 * shapes, with torch-default random weights, printing the shapes, the
 * output's mean and standard deviation, and the median time of a few runs.
 * Calls only the public API.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rng.h"

static void demo_help(FILE *f) {
    fprintf(f,
            "usage: vitc demo [--threads N] [--repeat R]\n\n"
            "Run each tutorial attention block (docs/layers.md) on its tutorial's input shape\n"
            "(random weights drawn as PyTorch's defaults, a fixed random input) and print\n"
            "input and output shapes, the output's mean and std, and the median time.\n\n"
            "  --threads N   threads, 1..256 (default: all CPUs this process may use)\n"
            "  --repeat R    timed runs per block after one warm-up, 1..64 (default 5)\n"
            "  -h, --help    this help\n");
}

/* splitmix64 + Box-Muller: a fixed input without depending on libc's rand. */
static vitc__rng demo_rng = {0x5EEDull};
static double demo_uniform(void) { return vitc__rng_uniform53(&demo_rng); }
static float *demo_input(size_t n, int uniform) {
    float *x = malloc(n * sizeof(float));
    if (!x)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (uniform) {
            x[i] = (float)demo_uniform();
        } else {
            double u1 = 1.0 - demo_uniform(), u2 = demo_uniform();
            x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
    }
    return x;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void shape_str(char *buf, size_t cap, int nd, const int64_t *s) {
    size_t u = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < nd && u < cap; i++)
        u += (size_t)snprintf(buf + u, cap - u, i ? ",%lld" : "%lld", (long long)s[i]);
    if (u < cap)
        snprintf(buf + u, cap - u, "]");
}

/* One seed block on the seed's own input: the layer is the kind's default
 * config with the fields below set where they are not 0. */
typedef struct demo_case {
    const char *name;
    vitc_layer_kind kind;
    int in_channels, embed_dim, num_heads, batch_first;
    int training;
    int ndim;
    int64_t shape[4];
    int uniform_input;
} demo_case;

static const demo_case demo_cases[] = {
    {"AttentionBlock(3, 4, 64)", VITC_ATTENTION_BLOCK, 0, 0, 0, 0, 1, 4, {1, 3, 32, 32}, 0},
    {"ConvSABlock(64)", VITC_CONV_SA_BLOCK, 64, 0, 0, 0, 1, 4, {1, 64, 32, 32}, 0},
    {"SelfAttention(32, norm=group)", VITC_SELF_ATTENTION_GROUP, 32, 0, 0, 0, 1, 4, {64, 32, 16, 16}, 0},
    {"SelfAttention(32, norm=batch)", VITC_SELF_ATTENTION_BATCH, 32, 0, 0, 0, 1, 4, {64, 32, 16, 16}, 0},
    {"SelfAttentionMultiHead(32, 4)", VITC_SELF_ATTENTION_MULTIHEAD, 32, 0, 4, 0, 1, 4, {64, 32, 16, 16}, 0},
    {"MultiheadAttention(32, 8, batch_first)", VITC_MULTIHEAD_ATTENTION, 0, 32, 8, 1, 1, 3, {64, 256, 32}, 0},
    {"T2TAttention(49, 64, 1 head)", VITC_T2T_ATTENTION, 49, 64, 0, 0, 0, 3, {13, 100, 49}, 1},
    {"T2TAttention(49, 64, 4 heads)", VITC_T2T_ATTENTION, 49, 64, 4, 0, 0, 3, {13, 100, 49}, 1},
    {"SingleHeadAttention(768, 64)", VITC_SINGLE_HEAD_ATTENTION, 768, 64, 0, 0, 1, 3, {1, 197, 768}, 1},
};

static vitc_layer_config demo_config(const demo_case *c) {
    vitc_layer_config cfg = vitc_layer_default_config(c->kind);
    if (c->in_channels)
        cfg.in_channels = c->in_channels;
    if (c->embed_dim)
        cfg.embed_dim = c->embed_dim;
    if (c->num_heads)
        cfg.num_heads = c->num_heads;
    if (c->batch_first)
        cfg.batch_first = c->batch_first;
    return cfg;
}

/* One block: create, reset weights, run warm-up + repeat timed forwards. */
static int run_case(const demo_case *c, int repeat) {
    vitc_layer *l = NULL;
    const vitc_layer_config cfg = demo_config(c);
    if (vitc_layer_create(&cfg, &l) != VITC_OK || vitc_layer_reset_parameters(l, 42) != VITC_OK)
        return cli_lib_error(c->name);
    vitc_layer_set_training(l, c->training);
    int ond = 0, wnd = 0;
    int64_t os[8], ws[8];
    int mha = c->kind == VITC_MULTIHEAD_ATTENTION;
    float *x = demo_input(cli_numel(c->ndim, c->shape), c->uniform_input), *y = NULL, *w = NULL;
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    int rc = CLI_OK;
    if (!x) {
        rc = cli_error("%s: out of memory", c->name);
        goto done;
    }
    if (mha) {
        /* the seed: nm(t, t, t), need_weights defaulting to True */
        a.query.data = x;
        a.query.ndim = c->ndim;
        memcpy(a.query.shape, c->shape, sizeof c->shape);
        a.key = a.value = a.query;
        a.need_weights = 1;
        a.average_attn_weights = 1;
        if (vitc_mha_output_shapes(l, &a, &ond, os, &wnd, ws) != VITC_OK) {
            rc = cli_lib_error(c->name);
            goto done;
        }
        w = malloc(cli_numel(wnd, ws) * sizeof(float));
    } else if (vitc_layer_output_shape(l, c->ndim, c->shape, &ond, os) != VITC_OK) {
        rc = cli_lib_error(c->name);
        goto done;
    }
    y = malloc(cli_numel(ond, os) * sizeof(float));
    if (!y || (mha && !w)) {
        rc = cli_error("%s: out of memory", c->name);
        goto done;
    }
    double times[64];
    for (int r = 0; r <= repeat; r++) {
        double t0 = cli_now();
        vitc_status s = mha ? vitc_mha_forward(l, &a, y, w) : vitc_layer_forward(l, x, c->ndim, c->shape, y);
        if (s != VITC_OK) {
            rc = cli_lib_error(c->name);
            goto done;
        }
        if (r > 0) /* the first run sizes the scratch */
            times[r - 1] = 1e3 * (cli_now() - t0);
    }
    qsort(times, (size_t)repeat, sizeof *times, cmp_double);
    double sum = 0.0, sq = 0.0;
    size_t n = cli_numel(ond, os);
    for (size_t i = 0; i < n; i++) sum += y[i];
    double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++) sq += (y[i] - mean) * (y[i] - mean);
    char in_s[64], out_s[64], w_s[80] = "";
    shape_str(in_s, sizeof in_s, c->ndim, c->shape);
    shape_str(out_s, sizeof out_s, ond, os);
    if (mha) {
        char tmp[56];
        shape_str(tmp, sizeof tmp, wnd, ws);
        snprintf(w_s, sizeof w_s, " weights %s", tmp);
    }
    printf("%-40s %-15s -> %-15s mean %+.4f  std %.4f  %9.2f ms%s\n", c->name, in_s, out_s, mean,
           n > 1 ? sqrt(sq / (double)(n - 1)) : 0.0, times[(repeat - 1) / 2], w_s);
done:
    free(x);
    free(y);
    free(w);
    vitc_layer_free(l);
    return rc;
}

int cmd_demo(int argc, char **argv) {
    int threads = 0, repeat = 5, n_pos, rc;
    const cli_opt opts[] = {
        {"--threads", NULL, CLI_INT, &threads, 1, CLI_MAX_THREADS, NULL},
        {"--repeat", NULL, CLI_INT, &repeat, 1, 64, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 0, "argument"};
    rc = cli_parse_command("demo", &spec, argc, argv, NULL, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        demo_help(stdout);
        return CLI_OK;
    }
    if (rc != 0)
        return rc;
    vitc_set_num_threads(threads);


    printf("vitc %s demo: %d threads, kernels %s, gemm %s; median of %d runs\n", vitc_version(),
           vitc_get_num_threads(), vitc_get_arch(), vitc_get_gemm_backend(), repeat);
    for (size_t i = 0; i < sizeof demo_cases / sizeof demo_cases[0]; i++) {
        int rc = run_case(&demo_cases[i], repeat);
        if (rc != CLI_OK)
            return rc;
    }
    return CLI_OK;
}
