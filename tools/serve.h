/* serve.h — `vitc serve`'s queue, batcher, endpoints and metrics
 * (serve_core.c) and request parsing (serve_parse.c), apart from the HTTP
 * library (cmd_serve.c). */
#ifndef VITC_SERVE_H
#define VITC_SERVE_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"

enum { SERVE_EP_HEALTH, SERVE_EP_METRICS, SERVE_EP_EMBEDDINGS, SERVE_EP_CLASSIFY, SERVE_EP_OTHER,
       /* serve_web.c's: the page's files, /v1/info, zero-shot, attention
        * maps, and the dense endpoints that answer what the model lacks */
       SERVE_EP_PAGE, SERVE_EP_INFO, SERVE_EP_ZERO_SHOT, SERVE_EP_ATTENTION, SERVE_EP_SEGMENT,
       SERVE_EP_DEPTH, SERVE_N_EP };
enum { SERVE_ITEM_EMBED, SERVE_ITEM_CLASSIFY, SERVE_ITEM_TEXT };

#define SERVE_N_STATUS 16 /* distinct status codes counted per endpoint */
#define SERVE_BATCH_BUCKETS 14
#define SERVE_TIME_BUCKETS 14

typedef struct serve_request serve_request;

/* One image waiting for the model. */
typedef struct serve_item {
    serve_request *req;
    int index;     /* in req's inputs */
    int kind;      /* SERVE_ITEM_* */
    float *pixels; /* [channels, height, width], what the forward reads */
    const char *text; /* SERVE_ITEM_TEXT: the text (the request's JSON owns it) */
    double t_queued;
} serve_item;

typedef struct serve_hist {
    const double *bounds; /* SERVE_*_BUCKETS upper bounds (le) */
    int n;
    uint64_t counts[SERVE_TIME_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
    double sum;
    uint64_t count;
} serve_hist;

typedef struct serve_state {
    vitc_vit *model;
    vitc_session *session;
    /* serve_dense.c's: a SAM or Depth Anything model instead of model */
    vitc_sam *sam;
    vitc_depth *depth;
    int depth_metric; /* config.json's depth_estimation_type "metric" */
    cli_input in;
    char *model_name; /* "model" in the responses: --model's base name */
    int64_t embed_dim;
    int num_classes;
    int has_text; /* a text tower and its tokenizer: text inputs are embedded */
    char *api_key;
    size_t max_body;
    int max_batch, max_wait_ms, max_queue;
    atomic_int ready; /* 0 loading, 1 ready, 2 stopping */

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the batcher: items queued, or stop */
    pthread_cond_t cv_done; /* the connections: an item finished */
    serve_item *queue;      /* ring of max_queue */
    int q_head, q_len;
    int stop;
    int active;      /* requests between decoding and their reply */
    int http_active; /* requests read by the HTTP side and not yet answered */

    pthread_mutex_t mmu; /* metrics */
    uint64_t req_count[SERVE_N_EP][SERVE_N_STATUS];
    int req_status[SERVE_N_EP][SERVE_N_STATUS];
    serve_hist batch_hist, queue_hist, infer_hist;
    uint64_t images_total;
    uint64_t dropped_items;    /* queued images of clients that went away, never run */
    uint64_t dropped_requests; /* requests whose client went away before the reply */
} serve_state;

typedef struct serve_reply {
    int status;      /* 200, or an error's */
    const char *msg; /* the error's message (static or in msgbuf) */
    char msgbuf[512];
    char *body; /* 200: the JSON (malloc'd) */
    size_t len;
} serve_reply;

int serve_state_init(serve_state *s, int max_batch, int max_wait_ms, int max_queue,
                     size_t max_body);
void serve_state_free(serve_state *s);
/* After the model loaded: its session and sizes. CLI_OK or reported. */
int serve_model_ready(serve_state *s, const char *model_path);
/* The batcher thread's loop, until serve_stop_batcher and an empty queue. */
void serve_batcher_run(serve_state *s);
void serve_stop_batcher(serve_state *s);
/* Wait until no request is queued, running or unanswered. */
void serve_drain(serve_state *s);
/* A request begins (1) or its reply went out (-1), for serve_drain. */
void serve_http_active(serve_state *s, int delta);
/* A raw image body (a Content-Type of image/...): the options come from the
 * query string (NULL: not given). */
typedef struct serve_raw {
    const char *top_k, *encoding_format;
} serve_raw;
/* A POST endpoint's body into the reply (blocks until its images ran):
 * JSON, or the image's bytes when raw is not NULL. */
void serve_handle(serve_state *s, int endpoint, const char *body, size_t len,
                  const serve_raw *raw, serve_reply *r);
void serve_metrics_request(serve_state *s, int endpoint, int status);
/* Prometheus' text format, malloc'd. 0 or -1 (out of memory). */
int serve_metrics_text(serve_state *s, char **out, size_t *len);
/* As serve_handle, with gone(arg) polled while the request waits for the
 * model: once it says the client went away (non-zero), the request's
 * images still queued are taken out and never run, and the reply is 499
 * (nobody reads it). gone NULL: never. */
void serve_handle_conn(serve_state *s, int endpoint, const char *body, size_t len,
                       const serve_raw *raw, int (*gone)(void *), void *gone_arg,
                       serve_reply *r);

/* Request parsing (serve_parse.c): what it needs of the loaded model, so
 * that it runs without one (tests/fuzz/fuzz_serve.c). */
typedef struct serve_parse_cfg {
    cli_input in;
    const float *mean, *std; /* torchvision's Normalize, when in.proc is NULL */
    int num_classes;         /* 0: no head */
    int has_text;            /* bare strings are texts */
    int max_queue;           /* inputs in one request at most */
    int64_t max_pixels;      /* the decoder's bound (0: its default) */
} serve_parse_cfg;

/* A parsed request: one of pixels[i] ([C, H, W], malloc'd) or texts[i]
 * (inside root) per input. */
typedef struct serve_parsed {
    int n, base64, top_k;
    float **pixels;
    const char **texts;
    json_t *root;
} serve_parsed;

/* body (JSON, or the image's bytes when raw is not NULL) into p: 0, or -1
 * with r's status (400 naming the problem, 500 out of memory) and p
 * empty. serve_parsed_free(p) after a 0. */
int serve_parse_request(const serve_parse_cfg *c, int endpoint, const char *body, size_t len,
                        const serve_raw *raw, serve_parsed *p, serve_reply *r);
void serve_parsed_free(serve_parsed *p);
/* One input (a data: URL or bare base64 of a PNG/JPEG), or an encoded
 * image's bytes, into a new *pixels [C, H, W]: 0, or -1 naming the
 * problem in err. */
int serve_decode_input(const serve_parse_cfg *c, const char *str, size_t len, float **pixels,
                       char *err, size_t err_len);
int serve_decode_image(const serve_parse_cfg *c, const void *bytes, size_t n, float **pixels,
                       char *err, size_t err_len);
/* base64 (standard or URL alphabet, padding optional, whitespace skipped)
 * into a new *out of *n bytes: 0, or -1 naming the problem in err. */
int serve_base64_decode(const char *s, size_t len, unsigned char **out, size_t *n, char *err,
                        size_t err_len);
/* r's status and message (msgbuf) from a printf format. */
void serve_vfail(serve_reply *r, int status, const char *fmt, va_list ap);
void serve_fail(serve_reply *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* serve_web.c: the web page, GET /v1/info, POST /v1/zero-shot, POST
 * /v1/attention (/v1/segment, /v1/depth: the error saying the model has
 * no mask decoder / depth head). Their forwards run on a second session of
 * the model, one request at a time, beside the batcher's. */
/* SERVE_EP_PAGE for a GET of one of the page's files ("/" is index.html),
 * a SERVE_EP_* of serve_web.c's API, or -1: not serve_web.c's URL. */
int serve_web_route(const char *method, const char *url, int *method_ok);
/* Queues a page file's response on c (the asset for url, with its
 * Content-Type, ETag, cache and Content-Security-Policy headers; 304 when
 * If-None-Match matches): MHD_YES or MHD_NO as the access handler returns. */
struct MHD_Connection;
int serve_web_send_asset(serve_state *s, struct MHD_Connection *c, const char *url);
/* serve_handle's part for serve_web.c's endpoints. */
void serve_web_handle(serve_state *s, int endpoint, const char *body, size_t len,
                      const serve_raw *raw, serve_reply *r);
/* Frees the second session and the class embedding cache (before the
 * model is freed). */
void serve_web_free(serve_state *s);
/* serve_dense.c: a SAM or Depth Anything model (config.json's model_type
 * "sam" / "depth_anything") loaded into s->sam / s->depth (*dense 1), or
 * nothing (*dense 0: another kind of model). precision (--precision, NULL:
 * fp32): SAM's image encoder's, as vitc_sam_load_precision; a Depth
 * Anything model takes fp32 only. CLI_OK or reported. */
int serve_dense_open(serve_state *s, const char *path, const char *precision, int *dense);
/* serve_handle's part when such a model is loaded: every POST endpoint and
 * /v1/info; one request at a time. */
void serve_dense_handle(serve_state *s, int endpoint, const char *body, size_t len,
                        const serve_raw *raw, serve_reply *r);
void serve_dense_free(serve_state *s);
/* What the request parsing (serve_parse.c) needs of s's loaded model. */
serve_parse_cfg serve_state_parse_cfg(const serve_state *s);
/* Replies' base64 (serve_core.c), standard alphabet with padding, no
 * quotes: len bytes, or n floats as float32 little-endian whatever the
 * host's order. */
void serve_put_base64(FILE *f, const void *bytes, size_t len);
void serve_put_base64_floats(FILE *f, const float *v, size_t n);

#endif
