/*
 * serve_core.c — `vitc serve` apart from HTTP: the bounded queue, the
 * dynamic batcher on one session, the replies and the metrics; requests
 * are parsed by serve_parse.c. The HTTP side (cmd_serve.c) hands a body in
 * and gets a status and JSON back, so a test (tests/test_serve_core.c)
 * drives this file without a socket.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_text.h"
#include "serve.h"

#ifdef VITC_HAVE_MHD

struct serve_request {
    int n, done, failed;
    size_t per;  /* floats of each input's result */
    float *out;  /* [n, per]: embeddings or logits */
    char err[256];
};


static const double batch_bounds[SERVE_BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                         512, 1024, 2048, 4096, 8192};
static const double time_bounds[SERVE_TIME_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                       0.025, 0.05, 0.1, 0.25, 0.5,
                                                       1, 2.5, 5, 10};

static void hist_add(serve_hist *h, double v) {
    int b = 0;
    while (b < h->n && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

int serve_state_init(serve_state *s, int max_batch, int max_wait_ms, int max_queue,
                     size_t max_body) {
    memset(s, 0, sizeof *s);
    s->max_batch = max_batch;
    s->max_wait_ms = max_wait_ms;
    s->max_queue = max_queue;
    s->max_body = max_body;
    atomic_init(&s->ready, 0);
    s->batch_hist = (serve_hist){batch_bounds, SERVE_BATCH_BUCKETS, {0}, 0, 0};
    s->queue_hist = (serve_hist){time_bounds, SERVE_TIME_BUCKETS, {0}, 0, 0};
    s->infer_hist = (serve_hist){time_bounds, SERVE_TIME_BUCKETS, {0}, 0, 0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    /* the batcher's deadline must not move with the wall clock */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->mmu, NULL);
    pthread_cond_init(&s->cv_work, &ca);
    pthread_cond_init(&s->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    s->queue = calloc((size_t)max_queue, sizeof *s->queue);
    return s->queue ? 0 : -1;
}

void serve_state_free(serve_state *s) {
    serve_web_free(s);
    serve_dense_free(s);
    vitc_session_free(s->session);
    vitc_vit_free(s->model);
    free(s->queue);
    free(s->api_key);
    free(s->model_name);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->mmu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    memset(s, 0, sizeof *s);
}

int serve_model_ready(serve_state *s, const char *model_path) {
    const vitc_vit_config *cfg = vitc_vit_get_config(s->model);
    if (vitc_vit_embed_size(s->model, VITC_POOL_DEFAULT, s->in.height, s->in.width,
                            &s->embed_dim) != VITC_OK ||
        vitc_vit_prepare(s->model) != VITC_OK || vitc_session_create(s->model, &s->session) != VITC_OK)
        return cli_error("%s", vitc_last_error());
    s->num_classes = vitc_vit_has_head(s->model) ? cfg->num_classes : 0;
    /* texts and images share the response's rows: one width for both */
    s->has_text = vitc_vit_has_text(s->model) && vitc_vit_tokenizer(s->model) &&
                  vitc_vit_text_dim(s->model) == s->embed_dim;
    /* the name the responses carry: the path's last component */
    const char *base = model_path, *p;
    size_t n = strlen(model_path);
    while (n > 1 && model_path[n - 1] == '/') n--;
    for (p = model_path; p < model_path + n; p++)
        if (*p == '/' && p + 1 < model_path + n)
            base = p + 1;
    if (!(s->model_name = strndup(base, (size_t)(model_path + n - base))))
        return cli_error("out of memory");
    return CLI_OK;
}

/* ------------------------------------------------------------------ */
/* The batcher                                                         */
/* ------------------------------------------------------------------ */

static struct timespec deadline_ts(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

void serve_batcher_run(serve_state *s) {
    size_t per_image = s->in.per_image;
    size_t per_out = (size_t)s->embed_dim > (size_t)s->num_classes ? (size_t)s->embed_dim
                                                                   : (size_t)s->num_classes;
    float *batch = malloc((size_t)s->max_batch * per_image * sizeof *batch); /* [B, C, H, W] */
    float *out = malloc((size_t)s->max_batch * per_out * sizeof *out);       /* [B, per_out] */
    serve_item *items = malloc((size_t)s->max_batch * sizeof *items);
    const char **texts = malloc((size_t)s->max_batch * sizeof *texts);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->q_len == 0 && !s->stop) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->q_len == 0)
            break;
        /* Dynamic batching: wait for the batch to fill until max_wait_ms
         * after the oldest item arrived (the time cli_now keeps, on the
         * monotonic clock as the condition variable); under load the
         * queue is already full enough and nothing waits. */
        double deadline = s->queue[s->q_head].t_queued + s->max_wait_ms * 1e-3;
        while (s->q_len < s->max_batch && !s->stop && cli_now() < deadline) {
            struct timespec ts = deadline_ts(deadline);
            pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
        }
        if (s->q_len == 0)
            continue; /* its client went away while the batch filled */
        int kind = s->queue[s->q_head].kind, nb = 0;
        while (nb < s->max_batch && s->q_len > 0 && s->queue[s->q_head].kind == kind) {
            items[nb++] = s->queue[s->q_head];
            s->q_head = (s->q_head + 1) % s->max_queue;
            s->q_len--;
        }
        pthread_mutex_unlock(&s->mu);

        double t0 = cli_now();
        vitc_status st = VITC_OK;
        if (!batch || !out || !items || !texts)
            st = VITC_ERR_NOMEM;
        else if (kind == SERVE_ITEM_TEXT) {
            /* the model API, not a session: only this thread runs the
             * model, so nothing else reads it meanwhile */
            for (int i = 0; i < nb; i++) texts[i] = items[i].text;
            st = vitc_vit_encode_text(s->model, texts, nb, out);
        } else {
            for (int i = 0; i < nb; i++)
                memcpy(batch + (size_t)i * per_image, items[i].pixels, per_image * sizeof *batch);
            st = kind == SERVE_ITEM_EMBED
                     ? vitc_session_embed(s->session, batch, nb, s->in.height, s->in.width,
                                          VITC_POOL_DEFAULT, out)
                     : vitc_session_forward(s->session, batch, nb, s->in.height, s->in.width,
                                            out);
        }
        double t1 = cli_now();
        const char *err =
            st == VITC_OK ? NULL : (batch && out && texts ? vitc_last_error() : "out of memory");
        pthread_mutex_lock(&s->mmu);
        hist_add(&s->batch_hist, nb);
        hist_add(&s->infer_hist, t1 - t0);
        for (int i = 0; i < nb; i++) hist_add(&s->queue_hist, t0 - items[i].t_queued);
        s->images_total += (uint64_t)nb;
        pthread_mutex_unlock(&s->mmu);

        pthread_mutex_lock(&s->mu);
        size_t per = kind == SERVE_ITEM_CLASSIFY ? (size_t)s->num_classes : (size_t)s->embed_dim;
        for (int i = 0; i < nb; i++) {
            serve_request *r = items[i].req;
            if (err) {
                r->failed = 1;
                snprintf(r->err, sizeof r->err, "the forward failed: %s", err);
            } else {
                memcpy(r->out + (size_t)items[i].index * r->per, out + (size_t)i * per,
                       per * sizeof *out);
            }
            free(items[i].pixels);
            r->done++;
        }
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    free(batch);
    free(out);
    free(items);
    free(texts);
}

void serve_stop_batcher(serve_state *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}

void serve_drain(serve_state *s) {
    pthread_mutex_lock(&s->mu);
    while (s->active > 0 || s->http_active > 0) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void serve_http_active(serve_state *s, int delta) {
    pthread_mutex_lock(&s->mu);
    s->http_active += delta;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ */
/* Endpoints                                                           */
/* ------------------------------------------------------------------ */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void serve_put_base64(FILE *f, const void *bytes, size_t len) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16;
        if (i + 1 < len)
            x |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < len)
            x |= p[i + 2];
        fputc(b64chars[(x >> 18) & 63], f);
        fputc(b64chars[(x >> 12) & 63], f);
        fputc(i + 1 < len ? b64chars[(x >> 6) & 63] : '=', f);
        fputc(i + 2 < len ? b64chars[x & 63] : '=', f);
    }
}

/* The bytes go through a buffer a multiple of 3 long, so that the chunks'
 * base64 joins into the whole's (no padding inside). */
void serve_put_base64_floats(FILE *f, const float *v, size_t n) {
    unsigned char buf[3 * 256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) {
            buf[k++] = (unsigned char)(u >> (8 * b));
            if (k == sizeof buf) {
                serve_put_base64(f, buf, k);
                k = 0;
            }
        }
    }
    serve_put_base64(f, buf, k);
}

static void write_classify(serve_state *s, FILE *f, const float *logits, int k) {
    int C = s->num_classes;
    cli_ranked *rank = malloc((size_t)C * sizeof *rank);
    double mx = -INFINITY, sum = 0.0;
    for (int c = 0; c < C; c++)
        if (logits[c] > mx)
            mx = logits[c];
    for (int c = 0; c < C; c++) sum += exp((double)logits[c] - mx);
    if (!rank)
        return;
    for (int c = 0; c < C; c++) {
        rank[c].score = logits[c];
        rank[c].index = c;
    }
    qsort(rank, (size_t)C, sizeof *rank, cli_ranked_cmp);
    fputs("[", f);
    for (int r = 0; r < k; r++) {
        int c = rank[r].index;
        const char *label = vitc_vit_label(s->model, c);
        fprintf(f, "%s{\"index\": %d, \"label\": ", r ? ", " : "", c);
        if (label)
            cli_json_string(f, label);
        else
            fputs("null", f);
        fputs(", \"prob\": ", f);
        cli_json_number(f, exp((double)logits[c] - mx) / sum);
        fputs(", \"logit\": ", f);
        cli_json_number(f, logits[c]);
        fputc('}', f);
    }
    fputs("]", f);
    free(rank);
}

/* What parsing needs of the loaded model. */
serve_parse_cfg serve_state_parse_cfg(const serve_state *s) {
    const vitc_vit_config *cfg = s->model ? vitc_vit_get_config(s->model) : NULL;
    serve_parse_cfg c = {s->in, cfg ? cfg->mean : NULL, cfg ? cfg->std : NULL,
                         s->num_classes, s->has_text, s->max_queue, 0};
    return c;
}

/* The client went away: its items still in the queue leave it (the
 * batcher never sees them); those already in a running batch finish.
 * Called with s->mu held. */
static void drop_queued(serve_state *s, serve_request *req) {
    int kept = 0, dropped = 0;
    for (int i = 0; i < s->q_len; i++) {
        serve_item *it = &s->queue[(s->q_head + i) % s->max_queue];
        if (it->req == req) {
            free(it->pixels);
            dropped++;
        } else {
            s->queue[(s->q_head + kept) % s->max_queue] = *it;
            kept++;
        }
    }
    s->q_len = kept;
    req->done += dropped;
    pthread_mutex_lock(&s->mmu);
    s->dropped_items += (uint64_t)dropped;
    s->dropped_requests++;
    pthread_mutex_unlock(&s->mmu);
}

void serve_handle(serve_state *s, int endpoint, const char *body, size_t len,
                  const serve_raw *raw, serve_reply *r) {
    serve_handle_conn(s, endpoint, body, len, raw, NULL, NULL, r);
}

void serve_handle_conn(serve_state *s, int endpoint, const char *body, size_t len,
                       const serve_raw *raw, int (*gone)(void *), void *gone_arg,
                       serve_reply *r) {
    if (s->sam || s->depth) {
        serve_dense_handle(s, endpoint, body, len, raw, r);
        return;
    }
    if (endpoint > SERVE_EP_OTHER) {
        serve_web_handle(s, endpoint, body, len, raw, r);
        return;
    }
    memset(r, 0, sizeof *r);
    r->status = 200;
    serve_request req;
    memset(&req, 0, sizeof req);
    serve_parse_cfg pc = serve_state_parse_cfg(s);
    serve_parsed pr;
    if (serve_parse_request(&pc, endpoint, body, len, raw, &pr, r) != 0)
        return;
    int n = pr.n, base64 = pr.base64, k = pr.top_k;
    float **pixels = pr.pixels;
    const char **texts = pr.texts;
    req.n = n;
    req.per = endpoint == SERVE_EP_EMBEDDINGS ? (size_t)s->embed_dim : (size_t)s->num_classes;
    if (!(req.out = malloc((size_t)n * req.per * sizeof *req.out))) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        /* the batcher leaves once the queue is empty: nothing may join it */
        pthread_mutex_unlock(&s->mu);
        serve_fail(r, 503, "the server is shutting down");
        goto out;
    }
    if (s->q_len + n > s->max_queue) {
        pthread_mutex_unlock(&s->mu);
        serve_fail(r, 429, "the queue is full (%d images waiting, --max-queue %d): retry later",
                   s->q_len, s->max_queue);
        goto out;
    }
    double t = cli_now();
    for (int i = 0; i < n; i++) {
        int at = (s->q_head + s->q_len) % s->max_queue;
        s->queue[at] = (serve_item){&req, i,
                                    texts[i] ? SERVE_ITEM_TEXT
                                    : endpoint == SERVE_EP_EMBEDDINGS ? SERVE_ITEM_EMBED
                                                                      : SERVE_ITEM_CLASSIFY,
                                    pixels[i], texts[i], t};
        pixels[i] = NULL; /* the batcher frees it */
        s->q_len++;
    }
    s->active++;
    pthread_cond_signal(&s->cv_work);
    int left = 0;
    double next_look = t + 0.02;
    while (req.done < n) {
        if (!gone || left) {
            /* left: only its items in a running batch remain */
            pthread_cond_wait(&s->cv_done, &s->mu);
            continue;
        }
        /* The connection's thread waits here, so no one else watches its
         * socket: look every 20 ms (a poll that does not block), on a
         * clock of its own since other requests' batches wake it too. */
        struct timespec ts = deadline_ts(next_look);
        pthread_cond_timedwait(&s->cv_done, &s->mu, &ts);
        double now = cli_now();
        if (req.done >= n || now < next_look)
            continue;
        next_look = now + 0.02;
        pthread_mutex_unlock(&s->mu);
        left = gone(gone_arg);
        pthread_mutex_lock(&s->mu);
        if (left)
            drop_queued(s, &req);
    }
    s->active--;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    if (left) {
        /* nginx's code for it: logged and counted, sent to no one */
        serve_fail(r, 499, "the client closed the connection before its reply");
        goto out;
    }
    if (req.failed) {
        serve_fail(r, 500, "%s", req.err);
        goto out;
    }

    FILE *f = open_memstream(&r->body, &r->len);
    if (!f) {
        serve_fail(r, 500, "out of memory");
        goto out;
    }
    fputs("{\"object\": \"list\", \"data\": [", f);
    for (int i = 0; i < n; i++) {
        const float *v = req.out + (size_t)i * req.per;
        if (endpoint == SERVE_EP_EMBEDDINGS) {
            fprintf(f, "%s{\"object\": \"embedding\", \"index\": %d, \"embedding\": ",
                    i ? ", " : "", i);
            if (base64) {
                /* OpenAI's encoding_format "base64": numpy.frombuffer(...,
                 * "<f4") reads it */
                fputc('"', f);
                serve_put_base64_floats(f, v, req.per);
                fputc('"', f);
            } else {
                fputc('[', f);
                for (size_t j = 0; j < req.per; j++) {
                    if (j)
                        fputs(", ", f);
                    cli_json_number(f, v[j]);
                }
                fputc(']', f);
            }
        } else {
            fprintf(f, "%s{\"object\": \"classification\", \"index\": %d, \"topk\": ",
                    i ? ", " : "", i);
            write_classify(s, f, v, k);
        }
        fputc('}', f);
    }
    fputs("], \"model\": ", f);
    cli_json_string(f, s->model_name);
    /* OpenAI's usage counts tokens; an image has none to bill: 0, with
     * the images counted apart */
    fprintf(f, ", \"usage\": {\"prompt_tokens\": 0, \"total_tokens\": 0, \"images\": %d}}\n", n);
    if (fclose(f) != 0) {
        free(r->body);
        r->body = NULL;
        serve_fail(r, 500, "out of memory");
    }
out:
    serve_parsed_free(&pr);
    free(req.out);
}

/* ------------------------------------------------------------------ */
/* Metrics                                                             */
/* ------------------------------------------------------------------ */

void serve_metrics_request(serve_state *s, int endpoint, int status) {
    pthread_mutex_lock(&s->mmu);
    for (int i = 0; i < SERVE_N_STATUS; i++) {
        if (s->req_status[endpoint][i] == status || s->req_status[endpoint][i] == 0) {
            s->req_status[endpoint][i] = status;
            s->req_count[endpoint][i]++;
            break;
        }
    }
    pthread_mutex_unlock(&s->mmu);
}

static void put_hist(FILE *f, const char *name, const char *help, const serve_hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->counts[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

int serve_metrics_text(serve_state *s, char **out, size_t *len) {
    static const char *const ep_names[SERVE_N_EP] = {
        "/health",  "/metrics",      "/v1/embeddings", "/v1/classify", "other",    "page",
        "/v1/info", "/v1/zero-shot", "/v1/attention",  "/v1/segment",  "/v1/depth"};
    FILE *f = open_memstream(out, len);
    if (!f)
        return -1;
    pthread_mutex_lock(&s->mu);
    int q = s->q_len;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->mmu);
    fputs("# HELP vitc_requests_total HTTP requests answered, by endpoint and status.\n"
          "# TYPE vitc_requests_total counter\n", f);
    for (int e = 0; e < SERVE_N_EP; e++)
        for (int i = 0; i < SERVE_N_STATUS && s->req_status[e][i]; i++)
            fprintf(f, "vitc_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ep_names[e],
                    s->req_status[e][i], (unsigned long long)s->req_count[e][i]);
    fprintf(f, "# HELP vitc_queue_size Images waiting for the model.\n"
               "# TYPE vitc_queue_size gauge\nvitc_queue_size %d\n", q);
    fprintf(f, "# HELP vitc_queue_capacity --max-queue.\n"
               "# TYPE vitc_queue_capacity gauge\nvitc_queue_capacity %d\n", s->max_queue);
    fprintf(f, "# HELP vitc_images_total Images run through the model.\n"
               "# TYPE vitc_images_total counter\nvitc_images_total %llu\n",
            (unsigned long long)s->images_total);
    fprintf(f, "# HELP vitc_dropped_images_total Queued images whose client went away: "
               "never run.\n# TYPE vitc_dropped_images_total counter\n"
               "vitc_dropped_images_total %llu\n", (unsigned long long)s->dropped_items);
    fprintf(f, "# HELP vitc_dropped_requests_total Requests whose client went away before "
               "the reply.\n# TYPE vitc_dropped_requests_total counter\n"
               "vitc_dropped_requests_total %llu\n", (unsigned long long)s->dropped_requests);
    fprintf(f, "# HELP vitc_ready 1 when the model is loaded and requests are taken.\n"
               "# TYPE vitc_ready gauge\nvitc_ready %d\n", atomic_load(&s->ready) == 1);
    put_hist(f, "vitc_batch_size", "Images per forward.", &s->batch_hist);
    put_hist(f, "vitc_queue_seconds", "Time an image waited in the queue.", &s->queue_hist);
    put_hist(f, "vitc_inference_seconds", "Time of one batch's forward.", &s->infer_hist);
    pthread_mutex_unlock(&s->mmu);
    if (fclose(f) != 0) {
        free(*out);
        return -1;
    }
    return 0;
}

#endif
