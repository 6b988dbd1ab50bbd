/*
 * serve_web.c — `vitc serve`'s web page and the endpoints it draws from:
 * the page's files (built into the binary from web/), GET /v1/info (what
 * the loaded model can do), POST /v1/zero-shot (labels typed by the user,
 * as `vitc zero-shot`), POST /v1/attention (the class token's attention
 * over the patch grid, as `vitc attention-map`), and /v1/segment,
 * /v1/depth answering that a ViT classifier or CLIP has no mask decoder or
 * depth head.
 *
 * These forwards do not go through the batcher: zero-shot needs the text
 * tower for a label set once (then its class embeddings are cached), an
 * attention map needs the attention probabilities that a batched forward
 * does not keep. They run on a second session of the model (sessions are
 * how threads share one model), one request at a time, so a page's
 * clicks never starve the batched API of more than one forward's time.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_text.h"
#include "internal.h"
#include "serve.h"
#include "serve_assets.h"

#ifdef VITC_HAVE_MHD

#include <microhttpd.h>

#define ZS_DEFAULT_TEMPLATE "a photo of a {}."
/* Class embedding sets kept for repeated label sets: at most this many,
 * and at most this many floats in all (64 MiB). */
#define ZS_CACHE_ENTRIES 32
#define ZS_CACHE_FLOATS ((size_t)16 << 20)
/* Prompts per text forward: what the CLI's encoder takes at once. */
#define ZS_TEXT_BATCH 64
/* Prompts per request (labels x templates): past this, one request would
 * hold the second session for minutes. */
#define ZS_MAX_PROMPTS 20000
/* Images per zero-shot or attention request. */
#define WEB_MAX_IMAGES 16

typedef struct zs_entry {
    char *key;      /* the templates and labels, as JSON */
    float *classes; /* [K, D], unit rows */
    int64_t K;
    uint64_t used;  /* the cache's clock when last hit: the least recent goes first */
} zs_entry;

static struct {
    pthread_mutex_t mu; /* the second session: one forward at a time */
    vitc_session *session;
    pthread_mutex_t cmu; /* the class embedding cache */
    zs_entry cache[ZS_CACHE_ENTRIES];
    size_t cache_floats;
    uint64_t clock;
} W = {PTHREAD_MUTEX_INITIALIZER, NULL, PTHREAD_MUTEX_INITIALIZER, {{0}}, 0, 0};

void serve_web_free(serve_state *s) {
    (void)s;
    pthread_mutex_lock(&W.mu);
    vitc_session_free(W.session);
    W.session = NULL;
    pthread_mutex_unlock(&W.mu);
    pthread_mutex_lock(&W.cmu);
    for (int i = 0; i < ZS_CACHE_ENTRIES; i++) {
        free(W.cache[i].key);
        free(W.cache[i].classes);
        memset(&W.cache[i], 0, sizeof W.cache[i]);
    }
    W.cache_floats = 0;
    pthread_mutex_unlock(&W.cmu);
}

/* Locks W.mu with the second session made: 0, or -1 (unlocked) with r set. */
static int session_lock(serve_state *s, serve_reply *r) {
    pthread_mutex_lock(&W.mu);
    if (!W.session && vitc_session_create(s->model, &W.session) != VITC_OK) {
        pthread_mutex_unlock(&W.mu);
        serve_fail(r, 500, "cannot make a session of the model: %s", vitc_last_error());
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Routing and the page's files                                        */
/* ------------------------------------------------------------------ */

static const serve_asset *asset_of(const char *url) {
    if (!strcmp(url, "/"))
        url = "/index.html";
    for (int i = 0; i < serve_n_assets; i++)
        if (!strcmp(url, serve_assets[i].path))
            return &serve_assets[i];
    return NULL;
}

int serve_web_route(const char *method, const char *url, int *method_ok) {
    static const struct {
        const char *url, *method;
        int ep;
    } routes[] = {
        {"/v1/info", "GET", SERVE_EP_INFO},
        {"/v1/zero-shot", "POST", SERVE_EP_ZERO_SHOT},
        {"/v1/attention", "POST", SERVE_EP_ATTENTION},
        {"/v1/segment", "POST", SERVE_EP_SEGMENT},
        {"/v1/depth", "POST", SERVE_EP_DEPTH},
    };
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].url)) {
            *method_ok = !strcmp(method, routes[i].method) ||
                         (get && !strcmp(routes[i].method, "GET"));
            return routes[i].ep;
        }
    if (asset_of(url)) {
        *method_ok = get;
        return SERVE_EP_PAGE;
    }
    return -1;
}

int serve_web_send_asset(serve_state *s, struct MHD_Connection *c, const char *url) {
    const serve_asset *a = asset_of(url);
    if (!a)
        return MHD_NO; /* routed here only when it exists */
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    int status = inm && strstr(inm, a->etag) ? 304 : 200;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        status == 304 ? 0 : a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", a->type);
    MHD_add_response_header(resp, "ETag", a->etag);
    /* revalidated on each load (a 304 costs nothing), so that a new vitc's
     * page is never mixed with an old cached script */
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    /* nothing but this server's own files; images drawn from the user's
     * file are data: or blob: URLs */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'self'; img-src 'self' data: blob:; "
                            "object-src 'none'; base-uri 'none'; form-action 'none'; "
                            "frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    serve_metrics_request(s, SERVE_EP_PAGE, status);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ------------------------------------------------------------------ */
/* GET /v1/info                                                        */
/* ------------------------------------------------------------------ */

static int can_attend(const serve_state *s) { return vitc_vit_num_prefix_tokens(s->model) >= 1; }

static void info(serve_state *s, serve_reply *r) {
    const vitc_vit_config *cfg = vitc_vit_get_config(s->model);
    const char *family = vitc_vit_family(s->model), *arch = vitc_vit_arch_name(s->model);
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        return;
    }
    fputs("{\"object\": \"model\", \"model\": ", f);
    cli_json_string(f, s->model_name);
    fputs(", \"family\": ", f);
    cli_json_string(f, family ? family : "vit");
    fputs(", \"arch\": ", f);
    if (arch)
        cli_json_string(f, arch);
    else
        fputs("null", f);
    fprintf(f,
            ", \"image_size\": [%d, %d], \"patch_size\": %d, \"channels\": %d, "
            "\"embedding_dim\": %lld, \"num_classes\": %d, \"has_head\": %s, "
            "\"has_labels\": %s, \"has_text\": %s, \"class_token\": %s",
            s->in.height, s->in.width, cfg->patch_size, s->in.channels,
            (long long)s->embed_dim, s->num_classes, s->num_classes > 0 ? "true" : "false",
            s->num_classes > 0 && vitc_vit_label(s->model, 0) ? "true" : "false",
            s->has_text ? "true" : "false", can_attend(s) ? "true" : "false");
    fprintf(f,
            ", \"capabilities\": {\"embeddings\": true, \"classify\": %s, \"zero_shot\": %s, "
            "\"attention\": %s, \"segment\": false, \"depth\": false}",
            s->num_classes > 0 ? "true" : "false", s->has_text ? "true" : "false",
            can_attend(s) ? "true" : "false");
    fprintf(f,
            ", \"limits\": {\"max_body_bytes\": %zu, \"max_batch\": %d, \"max_queue\": %d, "
            "\"max_images\": %d, \"max_labels\": %d, \"max_label_bytes\": %d, "
            "\"max_prompts\": %d}}\n",
            s->max_body, s->max_batch, s->max_queue, WEB_MAX_IMAGES,
            CLI_TEXT_MAX_COUNT < ZS_MAX_PROMPTS ? CLI_TEXT_MAX_COUNT : ZS_MAX_PROMPTS,
            CLI_TEXT_MAX_BYTES, ZS_MAX_PROMPTS);
    if (fclose(f) != 0) {
        free(r->body);
        r->body = NULL;
        serve_fail(r, 500, "out of memory");
    }
}

/* ------------------------------------------------------------------ */
/* Shared request parts                                                */
/* ------------------------------------------------------------------ */

/* The images of "input" (a string or an array of strings or {"image": S}
 * objects), or the raw body's one image, into pixels[*n]: 0, or -1 with r
 * set (pixels freed). */
static int read_images(serve_state *s, json_t *root, const char *body, size_t len,
                       const serve_raw *raw, float ***pixels, int *n, serve_reply *r) {
    serve_parse_cfg pc = serve_state_parse_cfg(s);
    json_t *input = json_object_get(root, "input");
    if (!raw && (!input || !(json_is_string(input) || json_is_array(input)))) {
        serve_fail(r, 400,
                   "\"input\" is required: a base64 image or data: URL, or an array of them");
        return -1;
    }
    int k = raw || json_is_string(input) ? 1 : (int)json_array_size(input);
    if (k == 0) {
        serve_fail(r, 400, "\"input\" is empty");
        return -1;
    }
    if (k > WEB_MAX_IMAGES) {
        serve_fail(r, 400, "%d images in one request; this endpoint takes at most %d", k,
                   WEB_MAX_IMAGES);
        return -1;
    }
    float **px = calloc((size_t)k, sizeof *px);
    if (!px) {
        serve_fail(r, 500, "out of memory");
        return -1;
    }
    for (int i = 0; i < k; i++) {
        char err[400];
        int rc;
        if (raw) {
            rc = serve_decode_image(&pc, body, len, &px[i], err, sizeof err);
        } else {
            json_t *e = json_is_array(input) ? json_array_get(input, (size_t)i) : input;
            if (json_is_object(e))
                e = json_object_get(e, "image");
            if (!e || !json_is_string(e)) {
                serve_fail(r, 400, "input[%d]: not a string (a base64 image or a data: URL)", i);
                rc = -2;
            } else {
                rc = serve_decode_input(&pc, json_string_value(e), json_string_length(e), &px[i],
                                        err, sizeof err);
            }
        }
        if (rc != 0) {
            if (rc == -1)
                serve_fail(r, 400, "input[%d]: %s", i, err);
            for (int j = 0; j < k; j++) free(px[j]);
            free(px);
            return -1;
        }
    }
    *pixels = px;
    *n = k;
    return 0;
}

static void free_images(float **px, int n) {
    for (int i = 0; px && i < n; i++) free(px[i]);
    free(px);
}

/* Closes the data list and the reply; extra: more members ("" none). */
static int end_reply(serve_state *s, FILE *f, serve_reply *r, int n, const char *extra) {
    fputs("], \"model\": ", f);
    cli_json_string(f, s->model_name);
    fprintf(f, "%s, \"usage\": {\"prompt_tokens\": 0, \"total_tokens\": 0, \"images\": %d}}\n",
            extra, n);
    if (fclose(f) != 0) {
        free(r->body);
        r->body = NULL;
        serve_fail(r, 500, "out of memory");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* POST /v1/zero-shot                                                  */
/* ------------------------------------------------------------------ */

/* tmpl with each "{}" replaced by label (as `vitc zero-shot`): new, or NULL. */
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

/* A label or template: 1..CLI_TEXT_MAX_BYTES of valid UTF-8 without NUL,
 * the CLI's limits. NULL, or what is wrong. */
static const char *text_problem(json_t *e) {
    if (!json_is_string(e))
        return "not a string";
    size_t n = json_string_length(e);
    const char *v = json_string_value(e);
    if (n == 0)
        return "empty";
    if (n > CLI_TEXT_MAX_BYTES)
        return "longer than 4096 bytes (a prompt is cut at the model's context, 77 or 64 "
               "tokens, anyway)";
    if (memchr(v, 0, n))
        return "holds a NUL character";
    if (vitc__utf8_invalid_at(v, n) >= 0)
        return "not valid UTF-8";
    return NULL;
}

/* The class embeddings [K, D] of labels x templates on the second session
 * (W.mu held): 0, or -1 with r set. */
static int zs_classes(serve_state *s, const char *const *labels, int K,
                      const char *const *tmpls, int T, float *classes, serve_reply *r) {
    const vitc_tokenizer *tok = vitc_vit_tokenizer(s->model);
    int ctx = vitc_vit_text_context(s->model);
    int64_t D = s->embed_dim;
    int chunk = ZS_TEXT_BATCH / T > 0 ? ZS_TEXT_BATCH / T : 1;
    size_t rows = (size_t)chunk * (size_t)T;
    float *text = malloc(rows * (size_t)D * sizeof *text); /* [chunk * T, D] */
    int32_t *ids = malloc(rows * (size_t)ctx * sizeof *ids); /* [chunk * T, ctx] */
    int rc = 0;
    if (!text || !ids) {
        serve_fail(r, 500, "out of memory for %zu prompts", rows);
        rc = -1;
    }
    for (int k0 = 0; rc == 0 && k0 < K; k0 += chunk) {
        int nk = K - k0 < chunk ? K - k0 : chunk;
        for (int k = 0; rc == 0 && k < nk; k++)
            for (int t = 0; rc == 0 && t < T; t++) {
                char *p = zs_prompt(tmpls[t], labels[k0 + k]);
                size_t row = (size_t)k * T + (size_t)t;
                if (!p) {
                    serve_fail(r, 500, "out of memory");
                    rc = -1;
                } else if (vitc_tokenizer_encode(tok, p, -1, ids + row * (size_t)ctx, ctx, NULL) !=
                           VITC_OK) {
                    serve_fail(r, 400, "labels[%d]: %s", k0 + k, vitc_last_error());
                    rc = -1;
                }
                free(p);
            }
        if (rc == 0 &&
            (vitc_session_encode_text_ids(W.session, ids, nk * T, ctx, text) != VITC_OK ||
             vitc_zero_shot_classes(text, nk, T, D, classes + (size_t)k0 * (size_t)D) !=
                 VITC_OK)) {
            serve_fail(r, 500, "text tower: %s", vitc_last_error());
            rc = -1;
        }
    }
    free(text);
    free(ids);
    return rc;
}

/* A copy of the cached class embeddings for key into classes: 1 hit, 0 miss. */
static int zs_cache_get(const char *key, int64_t K, int64_t D, float *classes) {
    int hit = 0;
    pthread_mutex_lock(&W.cmu);
    for (int i = 0; i < ZS_CACHE_ENTRIES; i++)
        if (W.cache[i].key && W.cache[i].K == K && !strcmp(W.cache[i].key, key)) {
            memcpy(classes, W.cache[i].classes, (size_t)K * (size_t)D * sizeof *classes);
            W.cache[i].used = ++W.clock;
            hit = 1;
            break;
        }
    pthread_mutex_unlock(&W.cmu);
    return hit;
}

/* Keeps a copy, evicting the least recently used sets until it fits. */
static void zs_cache_put(const char *key, int64_t K, int64_t D, const float *classes) {
    size_t nf = (size_t)K * (size_t)D;
    if (nf > ZS_CACHE_FLOATS)
        return;
    char *k = strdup(key);
    float *c = malloc(nf * sizeof *c);
    if (!k || !c) {
        free(k);
        free(c);
        return;
    }
    memcpy(c, classes, nf * sizeof *c);
    pthread_mutex_lock(&W.cmu);
    for (;;) {
        int free_slot = -1, lru = -1;
        for (int i = 0; i < ZS_CACHE_ENTRIES; i++) {
            if (!W.cache[i].key) {
                if (free_slot < 0)
                    free_slot = i;
            } else if (lru < 0 || W.cache[i].used < W.cache[lru].used) {
                lru = i;
            }
        }
        if (free_slot >= 0 && W.cache_floats + nf <= ZS_CACHE_FLOATS) {
            W.cache[free_slot] = (zs_entry){k, c, K, ++W.clock};
            W.cache_floats += nf;
            break;
        }
        /* lru >= 0 here: the cache is full, by count or by floats */
        W.cache_floats -= (size_t)W.cache[lru].K * (size_t)D;
        free(W.cache[lru].key);
        free(W.cache[lru].classes);
        memset(&W.cache[lru], 0, sizeof W.cache[lru]);
    }
    pthread_mutex_unlock(&W.cmu);
}

static void zero_shot(serve_state *s, json_t *root, const char *body, size_t len,
                      const serve_raw *raw, serve_reply *r) {
    const char **labels = NULL, **own = NULL; /* own: the request's templates */
    static const char *const one[1] = {ZS_DEFAULT_TEMPLATE};
    const char *const *tmpls = one;
    float **px = NULL, *classes = NULL, *emb = NULL, *probs = NULL;
    cli_ranked *rank = NULL;
    char *key = NULL;
    int n = 0, K, T = 1, k = 5;
    int64_t D = s->embed_dim;
    if (!s->has_text) {
        serve_fail(r, 400, "the loaded model has no text tower with a tokenizer: zero-shot needs a "
                           "CLIP or SigLIP Hub directory with its tokenizer files");
        return;
    }
    if (raw) {
        serve_fail(r, 400, "/v1/zero-shot takes a JSON body (\"input\" and \"labels\"), not a raw "
                           "image");
        return;
    }
    json_t *jl = json_object_get(root, "labels");
    if (!jl || !json_is_array(jl) || json_array_size(jl) == 0) {
        serve_fail(r, 400, "\"labels\" is required: a non-empty array of strings");
        return;
    }
    if (json_array_size(jl) > CLI_TEXT_MAX_COUNT) {
        serve_fail(r, 400, "%zu labels; the limit is %d", json_array_size(jl), CLI_TEXT_MAX_COUNT);
        return;
    }
    K = (int)json_array_size(jl);
    json_t *jt = json_object_get(root, "templates");
    if (jt && json_is_string(jt)) {
        if (!(tmpls = vitc_zero_shot_templates(json_string_value(jt), &T))) {
            serve_fail(r, 400, "\"templates\" must be \"imagenet80\", \"simple\" or an array of "
                               "strings with {} where the label goes");
            return;
        }
    } else if (jt && json_is_array(jt)) {
        T = (int)json_array_size(jt);
        if (T == 0 || T > 1000) {
            serve_fail(r, 400, "\"templates\": 1 to 1000 strings, not %d", T);
            return;
        }
    } else if (jt && !json_is_null(jt)) {
        serve_fail(r, 400,
                   "\"templates\" must be \"imagenet80\", \"simple\" or an array of strings");
        return;
    }
    if ((int64_t)K * T > ZS_MAX_PROMPTS) {
        serve_fail(r, 400, "%d labels x %d templates is %lld prompts; one request takes at most %d "
                           "(use fewer templates or labels)",
                   K, T, (long long)K * T, ZS_MAX_PROMPTS);
        return;
    }
    json_t *tk = json_object_get(root, "top_k");
    if (tk && !json_is_null(tk)) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 1) {
            serve_fail(r, 400, "\"top_k\" must be an integer >= 1");
            return;
        }
        k = json_integer_value(tk) > K ? K : (int)json_integer_value(tk);
    }
    if (k > K)
        k = K;
    if (!(labels = malloc((size_t)K * sizeof *labels)) ||
        (jt && json_is_array(jt) && !(own = malloc((size_t)T * sizeof *own)))) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    for (int i = 0; i < K; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        const char *why = text_problem(e);
        if (why) {
            serve_fail(r, 400, "labels[%d]: %s", i, why);
            goto out;
        }
        labels[i] = json_string_value(e);
    }
    if (jt && json_is_array(jt)) {
        for (int t = 0; t < T; t++) {
            json_t *e = json_array_get(jt, (size_t)t);
            const char *why = text_problem(e);
            if (!why && !strstr(json_string_value(e), "{}"))
                why = "has no {} where the label goes (e.g. \"a photo of a {}.\")";
            if (why) {
                serve_fail(r, 400, "templates[%d]: %s", t, why);
                goto out;
            }
            own[t] = json_string_value(e);
        }
        tmpls = own;
    }
    if (read_images(s, root, body, len, raw, &px, &n, r) != 0)
        goto out;
    float scale, bias;
    int has_bias;
    if (vitc_vit_logit_params(s->model, &scale, &bias, &has_bias) != VITC_OK) {
        serve_fail(r, 500, "%s", vitc_last_error());
        goto out;
    }
    if (!(classes = malloc((size_t)K * (size_t)D * sizeof *classes)) ||
        !(emb = malloc((size_t)n * (size_t)D * sizeof *emb)) ||
        !(probs = malloc((size_t)n * (size_t)K * sizeof *probs)) ||
        !(rank = malloc((size_t)K * sizeof *rank))) {
        serve_fail(r, 500, "out of memory for %d labels", K);
        goto out;
    }
    /* the key: the templates and labels themselves (one model per server) */
    json_t *kt = jt && !json_is_null(jt) ? json_incref(jt) : json_string(ZS_DEFAULT_TEMPLATE);
    json_t *kj = kt ? json_pack("{s O s o}", "labels", jl, "templates", kt) : NULL;
    key = kj ? json_dumps(kj, JSON_COMPACT) : NULL;
    json_decref(kj);
    if (!key) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    int cached = zs_cache_get(key, K, D, classes);
    if (session_lock(s, r) != 0)
        goto out;
    if (!cached && zs_classes(s, labels, K, tmpls, T, classes, r) != 0) {
        pthread_mutex_unlock(&W.mu);
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (vitc_session_embed(W.session, px[i], 1, s->in.height, s->in.width,
                               VITC_POOL_DEFAULT, emb + (size_t)i * (size_t)D) != VITC_OK) {
            pthread_mutex_unlock(&W.mu);
            serve_fail(r, 500, "the forward failed: %s", vitc_last_error());
            goto out;
        }
    pthread_mutex_unlock(&W.mu);
    if (!cached)
        zs_cache_put(key, K, D, classes);
    if (vitc_zero_shot_probs(emb, n, classes, K, D, scale, bias, has_bias, probs) != VITC_OK) {
        serve_fail(r, 500, "%s", vitc_last_error());
        goto out;
    }
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    fputs("{\"object\": \"list\", \"data\": [", f);
    for (int i = 0; i < n; i++) {
        const float *p = probs + (size_t)i * (size_t)K;
        for (int c = 0; c < K; c++) {
            rank[c].score = p[c];
            rank[c].index = c;
        }
        qsort(rank, (size_t)K, sizeof *rank, cli_ranked_cmp);
        fprintf(f, "%s{\"object\": \"zero-shot\", \"index\": %d, \"labels\": [", i ? ", " : "",
                i);
        for (int j = 0; j < k; j++) {
            fputs(j ? ", {\"label\": " : "{\"label\": ", f);
            cli_json_string(f, labels[rank[j].index]);
            fprintf(f, ", \"index\": %d, \"prob\": ", rank[j].index);
            cli_json_number(f, (double)rank[j].score);
            fputc('}', f);
        }
        fputs("]}", f);
    }
    end_reply(s, f, r, n,
              has_bias ? (cached ? ", \"probabilities\": \"sigmoid\", \"cached\": true"
                                 : ", \"probabilities\": \"sigmoid\", \"cached\": false")
                       : (cached ? ", \"probabilities\": \"softmax\", \"cached\": true"
                                 : ", \"probabilities\": \"softmax\", \"cached\": false"));
out:
    free(key);
    free(labels);
    free(own);
    free_images(px, n);
    free(classes);
    free(emb);
    free(probs);
    free(rank);
}

/* ------------------------------------------------------------------ */
/* POST /v1/attention                                                  */
/* ------------------------------------------------------------------ */

/* The class token's row over the patches, map [gh * gw], as `vitc
 * attention-map` takes it (W.mu held): 0, or -1 with r set. */
static int attention_map(serve_state *s, const float *x, int rollout, int N, float *map,
                         serve_reply *r) {
    const vitc_vit_config *cfg = vitc_vit_get_config(s->model);
    int np = vitc_vit_num_prefix_tokens(s->model); /* class (+ distillation, registers) first */
    size_t nn = (size_t)N * N, count = nn;
    if (!rollout &&
        __builtin_mul_overflow((size_t)cfg->depth * (size_t)cfg->num_heads, nn, &count)) {
        serve_fail(r, 500, "the attention of %d layers over %d tokens is too large", cfg->depth, N);
        return -1;
    }
    float *buf = malloc(count * sizeof *buf); /* [N, N] or [depth, 1, heads, N, N] */
    if (!buf) {
        serve_fail(r, 500, "out of memory for the attention of %d tokens", N);
        return -1;
    }
    if (vitc_session_attention_maps(W.session, x, 1, s->in.height, s->in.width,
                                    rollout ? NULL : buf, rollout ? buf : NULL) != VITC_OK) {
        serve_fail(r, 500, "attention maps: %s", vitc_last_error());
        free(buf);
        return -1;
    }
    if (rollout) {
        memcpy(map, buf + np, sizeof *map * (size_t)(N - np));
    } else {
        /* the last layer, row 0 (the class token), averaged over heads */
        const float *last = buf + (size_t)(cfg->depth - 1) * cfg->num_heads * nn;
        for (int j = np; j < N; j++) {
            double acc = 0.0;
            for (int hd = 0; hd < cfg->num_heads; hd++) acc += last[(size_t)hd * nn + (size_t)j];
            map[j - np] = (float)(acc / cfg->num_heads);
        }
    }
    free(buf);
    return 0;
}

static void attention(serve_state *s, json_t *root, const char *body, size_t len,
                      const serve_raw *raw, serve_reply *r) {
    const vitc_vit_config *cfg = vitc_vit_get_config(s->model);
    float **px = NULL, *map = NULL; /* map [gh, gw] */
    unsigned char *seen = NULL;     /* [H, W, 3] */
    int n = 0, rollout = 1;
    if (!can_attend(s)) {
        serve_fail(r, 400, "the loaded model has no class token to map attention from (%s pools "
                           "without one)",
                   vitc_vit_family(s->model) ? vitc_vit_family(s->model) : "it");
        return;
    }
    json_t *jm = json_object_get(root, "method");
    if (jm && !json_is_null(jm)) {
        const char *v = json_is_string(jm) ? json_string_value(jm) : "";
        if (!strcmp(v, "cls"))
            rollout = 0;
        else if (strcmp(v, "rollout") != 0) {
            serve_fail(r, 400, "\"method\" must be \"rollout\" (all layers) or \"cls\" (the last "
                               "layer's class token, mean of heads)");
            return;
        }
    }
    int H = s->in.height, Wd = s->in.width, gh = H / cfg->patch_size, gw = Wd / cfg->patch_size;
    int N = vitc_vit_num_prefix_tokens(s->model) + gh * gw;
    size_t plane = (size_t)H * (size_t)Wd;
    if (read_images(s, root, body, len, raw, &px, &n, r) != 0)
        return;
    if (!(map = malloc((size_t)gh * (size_t)gw * sizeof *map)) || !(seen = malloc(3 * plane))) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    fputs("{\"object\": \"list\", \"data\": [", f);
    for (int i = 0; i < n; i++) {
        if (session_lock(s, r) != 0)
            break;
        int rc = attention_map(s, px[i], rollout, N, map, r);
        pthread_mutex_unlock(&W.mu);
        if (rc != 0)
            break;
        fprintf(f,
                "%s{\"object\": \"attention\", \"index\": %d, \"method\": \"%s\", "
                "\"grid\": [%d, %d], \"map\": [",
                i ? ", " : "", i, rollout ? "rollout" : "cls", gh, gw);
        for (int y = 0; y < gh; y++) {
            fputs(y ? ", [" : "[", f);
            for (int x = 0; x < gw; x++) {
                if (x)
                    fputs(", ", f);
                cli_json_number(f, map[(size_t)y * gw + x]);
            }
            fputc(']', f);
        }
        /* The image the model saw (resized and cropped), so the page lays
         * the map over what it covers: the normalisation undone, exact
         * after rounding as the pixels were uint8 before it. */
        for (size_t p = 0; p < plane; p++)
            for (int c = 0; c < 3; c++) {
                int ch = s->in.channels == 1 ? 0 : c;
                float v = (px[i][ch * plane + p] * cfg->std[ch] + cfg->mean[ch]) * 255.0f;
                seen[p * 3 + c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : lrintf(v));
            }
        fprintf(f, "], \"image\": {\"width\": %d, \"height\": %d, \"rgb\": ", Wd, H);
        fputc('"', f);
        serve_put_base64(f, seen, 3 * plane);
        fputc('"', f);
        fputs("}}", f);
    }
    if (r->status != 200) {
        fclose(f);
        free(r->body);
        r->body = NULL;
        goto out;
    }
    end_reply(s, f, r, n, "");
out:
    free_images(px, n);
    free(map);
    free(seen);
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

void serve_web_handle(serve_state *s, int endpoint, const char *body, size_t len,
                      const serve_raw *raw, serve_reply *r) {
    memset(r, 0, sizeof *r);
    r->status = 200;
    if (endpoint == SERVE_EP_INFO) {
        info(s, r);
        return;
    }
    if (endpoint == SERVE_EP_SEGMENT || endpoint == SERVE_EP_DEPTH) {
        serve_fail(r, 400,
                   "the loaded model has no %s: `vitc serve` runs ViT, DeiT, CLIP and SigLIP "
                   "models here",
                   endpoint == SERVE_EP_SEGMENT
                       ? "mask decoder (a SAM checkpoint has one)"
                       : "depth head (a Depth Anything checkpoint has one)");
        return;
    }
    json_t *root;
    json_error_t je;
    if (raw) {
        root = json_object();
        if (!root) {
            serve_fail(r, 500, "out of memory");
            return;
        }
    } else if (!(root = json_loadb(body, len, 0, &je))) {
        serve_fail(r, 400, "malformed JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return;
    }
    if (!json_is_object(root))
        serve_fail(r, 400, "the body must be a JSON object with \"input\"");
    else if (endpoint == SERVE_EP_ZERO_SHOT)
        zero_shot(s, root, body, len, raw, r);
    else
        attention(s, root, body, len, raw, r);
    json_decref(root);
}

#endif
