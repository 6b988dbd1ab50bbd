/*
 * cmd_serve.c — `vitc serve`: one loaded model behind an HTTP API.
 *
 * libmicrohttpd in thread-per-connection mode (docs/serve.md says why):
 * each connection's thread reads and checks its request, decodes and
 * preprocesses its images (so decoding runs in parallel and a bad image
 * never reaches the model), queues one item per image and sleeps until the
 * batcher has filled its results, looking at its socket meanwhile: a
 * client gone away takes its images out of the queue. One batcher thread takes the queue's head
 * items in dynamic batches (up to --max-batch, waiting at most
 * --max-wait-ms after the first for more) and runs them on one session of
 * the model. The queue is bounded (--max-queue images): a request that does
 * not fit is refused at once with 429, never parked.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char serve_usage[] =
    "usage: vitc serve --model M [options]\n"
    "\n"
    "Serve one model over HTTP (docs/serve.md): GET /health, GET /metrics,\n"
    "POST /v1/embeddings (OpenAI's request and response shape), POST\n"
    "/v1/classify (top-k), POST /v1/zero-shot, POST /v1/attention, GET\n"
    "/v1/info, and a web page at GET /. Images come as base64 or data: URLs\n"
    "in JSON. A SAM or Depth Anything directory is served with POST\n"
    "/v1/segment or POST /v1/depth instead (--precision: SAM's image\n"
    "encoder's weight GEMMs; Depth Anything runs in fp32 only).\n"
    "\n"
    "options:\n"
    "  --model M          checkpoint file or Hub directory (a ViT, CLIP, SigLIP,\n"
    "                     SAM or Depth Anything one)\n"
    "  --arch NAME        architecture of a file without vitc.config metadata\n"
    "  --host H           address to bind (default 127.0.0.1; 0.0.0.0 for all)\n"
    "  --port P           TCP port, 0..65535 (default 8080; 0: any free port,\n"
    "                     printed on stderr)\n"
    "  --max-batch B      images per forward, 1..4096 (default 16)\n"
    "  --max-wait-ms T    how long a batch waits to fill, 0..10000 (default 5)\n"
    "  --max-queue Q      images waiting at most, 1..1000000 (default 256);\n"
    "                     a request that does not fit gets 429\n"
    "  --max-body-mb S    request body limit in MiB, 1..1024 (default 16): 413\n"
    "  --max-connections N  connections at once, 1..10000 (default 256)\n"
    "  --max-connections-per-ip N  connections at once from one address,\n"
    "                     0..10000 (default 0: no limit but the total)\n"
    "  --timeout-s S      idle seconds before a connection is closed, 1..3600\n"
    "                     (default 30)\n"
    "  --body-timeout-s S the most seconds a request body may take to arrive,\n"
    "                     1..3600 (default 60): a client trickling it is cut off\n"
    "  --threads N        threads of the forward, 1..256 (default: all CPUs)\n"
    CLI_PRECISION_HELP
    "  --api-key-file F   require 'Authorization: Bearer KEY' (KEY: F's first\n"
    "                     line) on every endpoint but /health and /metrics\n"
    "  -h, --help         this help\n"
    "\n"
    "SIGTERM or SIGINT: stop accepting, finish the queued requests, exit 0.\n";

typedef struct serve_opts {
    const char *model, *arch, *host, *precision, *attn_precision, *api_key_file;
    int port, max_batch, max_wait_ms, max_queue, max_body_mb, max_conn, timeout_s, threads;
    int max_conn_ip, body_timeout_s;
} serve_opts;

static int serve_parse(int argc, char **argv, serve_opts *o) {
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &o->model, 0, 0, NULL},
        {"--arch", NULL, CLI_STRING, &o->arch, 0, 0, NULL},
        {"--host", NULL, CLI_STRING, &o->host, 0, 0, NULL},
        {"--port", NULL, CLI_INT, &o->port, 0, 65535, NULL},
        {"--max-batch", NULL, CLI_INT, &o->max_batch, 1, 4096, NULL},
        {"--max-wait-ms", NULL, CLI_INT, &o->max_wait_ms, 0, 10000, NULL},
        {"--max-queue", NULL, CLI_INT, &o->max_queue, 1, 1000000, NULL},
        {"--max-body-mb", NULL, CLI_INT, &o->max_body_mb, 1, 1024, NULL},
        {"--max-connections", NULL, CLI_INT, &o->max_conn, 1, 10000, NULL},
        {"--max-connections-per-ip", NULL, CLI_INT, &o->max_conn_ip, 0, 10000, NULL},
        {"--timeout-s", NULL, CLI_INT, &o->timeout_s, 1, 3600, NULL},
        {"--body-timeout-s", NULL, CLI_INT, &o->body_timeout_s, 1, 3600, NULL},
        {"--threads", NULL, CLI_INT, &o->threads, 1, CLI_MAX_THREADS, NULL},
        {"--precision", NULL, CLI_STRING, &o->precision, 0, 0, NULL},
        {"--attention-precision", NULL, CLI_STRING, &o->attn_precision, 0, 0, NULL},
        {"--api-key-file", NULL, CLI_STRING, &o->api_key_file, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), 0, "argument"};
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_batch = 16;
    o->max_wait_ms = 5;
    o->max_queue = 256;
    o->max_body_mb = 16;
    o->max_conn = 256;
    o->timeout_s = 30;
    o->body_timeout_s = 60;
    int n_pos = 0;
    char *pos[1];
    int rc = cli_parse_command("serve", &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(serve_usage, stdout);
        return -1;
    }
    if (rc != 0)
        return rc;
    if (!o->model)
        return cli_usage_error("serve", "--model is required");
    return 0;
}

#ifndef VITC_HAVE_MHD

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    memset(&o, 0, sizeof o);
    int rc = serve_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? CLI_OK : rc;
    return cli_error("this vitc was built without libmicrohttpd, which `vitc serve` needs: "
                     "install libmicrohttpd-dev (scripts/install-deps.sh) and rebuild");
}

#else

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "serve.h"

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

/* A connection's thread parses, decodes and preprocesses its images while
 * the batcher's forward keeps every core busy. At the lowest priority it
 * runs in the forward's gaps instead of pre-empting the forward's worker
 * threads, whose next barrier would then wait for the one pre-empted: the
 * saturated server's overhead over `vitc bench` (bench/serve_load.py). On
 * Linux, nice applies per thread. */
static void connection_thread_nice(void) {
#ifdef __linux__
    static _Thread_local int done;
    if (!done) {
        done = 1;
        (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    }
#endif
}

/* ------------------------------------------------------------------ */
/* The server's state                                                  */
/* ------------------------------------------------------------------ */

static serve_state S;
static int sig_pipe[2] = {-1, -1};
static double body_timeout_s;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    /* a second signal while draining finds the byte already there: one
     * drain, which also ends once the queue is empty */
    if (write(sig_pipe[1], &b, 1) < 0) {
    }
    errno = saved;
}

static void *batcher_main(void *arg) {
    (void)arg;
    serve_batcher_run(&S);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* HTTP                                                               */
/* ------------------------------------------------------------------ */

/* One request's state across the access handler's calls. */
typedef struct conn_ctx {
    int endpoint;   /* SERVE_EP_* */
    int status;     /* an error decided before the body is read (0: none) */
    const char *msg; /* its message */
    char *body;
    size_t len, cap;
    double t_start; /* the headers were read (cli_now) */
} conn_ctx;

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type,
                                 char *text, size_t len, int retry_after, int endpoint) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    serve_metrics_request(&S, endpoint, status);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *json, size_t len,
                                 int endpoint) {
    return send_text(c, status, "application/json", json, len, 0, endpoint);
}

/* OpenAI's error object: {"error": {"message", "type", "code"}}. */
static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *msg,
                                  int endpoint) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return MHD_NO;
    const char *type = status == 401   ? "authentication_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    fputs("{\"error\": {\"message\": ", f);
    cli_json_string(f, msg);
    fprintf(f, ", \"type\": \"%s\", \"code\": %d}}\n", type, status);
    if (fclose(f) != 0) {
        free(buf);
        return MHD_NO;
    }
    int retry = status == 429 || status == 503 ? 1 : 0;
    return send_text(c, status, "application/json", buf, len, retry, endpoint);
}

static int endpoint_of(const char *method, const char *url, int *method_ok) {
    static const struct {
        const char *url, *method;
        int ep;
    } routes[] = {
        {"/health", "GET", SERVE_EP_HEALTH},
        {"/metrics", "GET", SERVE_EP_METRICS},
        {"/v1/embeddings", "POST", SERVE_EP_EMBEDDINGS},
        {"/v1/classify", "POST", SERVE_EP_CLASSIFY},
    };
    int ep = serve_web_route(method, url, method_ok);
    if (ep >= 0)
        return ep;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].url)) {
            *method_ok = !strcmp(method, routes[i].method) ||
                         (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET"));
            return routes[i].ep;
        }
    *method_ok = 0;
    return SERVE_EP_OTHER;
}

/* Constant-time: the key's length may leak, its bytes do not. */
static int key_equal(const char *a, size_t alen, const char *b, size_t blen) {
    unsigned char d = alen != blen;
    for (size_t i = 0; i < alen; i++) d |= (unsigned char)(a[i] ^ b[i % (blen ? blen : 1)]);
    return d == 0;
}

static int authorized(struct MHD_Connection *c) {
    if (!S.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    const char *k = h + 7;
    return key_equal(k, strlen(k), S.api_key, strlen(S.api_key));
}

/* Whether the client closed its connection (or reset it) while its
 * request waits for the model; libmicrohttpd does not watch the socket of
 * a connection whose thread is in the handler. Data sent ahead (a
 * pipelined request) is not a close. */
static int client_gone(void *arg) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(arg, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)cls;
    (void)version;
    conn_ctx *x = *con_cls;
    if (!x) {
        /* First call: headers only. Every refusal that does not need the
         * body is decided here, before a byte of it is read. */
        if (!(x = calloc(1, sizeof *x)))
            return MHD_NO;
        *con_cls = x;
        connection_thread_nice();
        x->t_start = cli_now();
        serve_http_active(&S, 1);
        int method_ok;
        x->endpoint = endpoint_of(method, url, &method_ok);
        if (x->endpoint == SERVE_EP_OTHER) {
            x->status = 404;
            x->msg = "no such endpoint: the API has GET /health, GET /metrics, GET /v1/info, "
                     "POST /v1/embeddings, /v1/classify, /v1/zero-shot, /v1/attention, "
                     "/v1/segment and /v1/depth, and the web page at GET /";
        } else if (!method_ok) {
            x->status = 405;
            x->msg = "method not allowed on this endpoint (docs/serve.md)";
        } else if (x->endpoint != SERVE_EP_HEALTH && x->endpoint != SERVE_EP_METRICS &&
                   x->endpoint != SERVE_EP_PAGE && !authorized(c)) {
            x->status = 401;
            x->msg = "missing or wrong API key: send 'Authorization: Bearer KEY'";
        } else {
            const char *cl =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            char *end;
            errno = 0;
            unsigned long long n = cl ? strtoull(cl, &end, 10) : 0;
            /* past the range is past the limit (MHD refuses what is not a
             * number before this is called) */
            if (cl && (errno == ERANGE || n > (unsigned long long)S.max_body)) {
                x->status = 413;
                x->msg = "request body larger than the server's --max-body-mb";
            }
        }
        if (x->status)
            /* Answer now: MHD then closes the connection instead of
             * reading (or 100-continuing) a body nobody will use. */
            return send_error(c, x->status, x->msg, x->endpoint);
        return MHD_YES;
    }
    if (*upload_size) {
        /* A chunked body has no Content-Length: the limit is kept here. */
        if (!x->status) {
            /* The idle timeout resets at every byte: a body trickled a
             * byte at a time would hold its thread forever without this. */
            if (cli_now() - x->t_start > body_timeout_s) {
                serve_metrics_request(&S, x->endpoint, 408);
                return MHD_NO;
            }
            if (x->len + *upload_size > S.max_body) {
                /* A chunked body has no length up front. MHD (0.9.75)
                 * queues no response in the middle of a body, and reading
                 * the rest to answer after it is what the limit forbids:
                 * the connection is closed instead. */
                serve_metrics_request(&S, x->endpoint, 413);
                return MHD_NO;
            }
            if (x->len + *upload_size + 1 > x->cap) {
                size_t cap = x->cap ? x->cap : 4096;
                while (cap < x->len + *upload_size + 1) cap *= 2;
                if (cap > S.max_body + 1)
                    cap = S.max_body + 1;
                char *b = realloc(x->body, cap);
                if (!b)
                    return MHD_NO;
                x->body = b;
                x->cap = cap;
            }
            memcpy(x->body + x->len, upload_data, *upload_size);
            x->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->status)
        return send_error(c, x->status, x->msg, x->endpoint);
    if (x->endpoint == SERVE_EP_METRICS) {
        char *buf;
        size_t len;
        if (serve_metrics_text(&S, &buf, &len) != 0)
            return send_error(c, 500, "out of memory", x->endpoint);
        return send_text(c, 200, "text/plain; version=0.0.4", buf, len, 0, x->endpoint);
    }
    if (x->endpoint == SERVE_EP_PAGE)
        return (enum MHD_Result)serve_web_send_asset(&S, c, url);
    int ready = atomic_load(&S.ready);
    if (x->endpoint == SERVE_EP_HEALTH) {
        const char *body = ready == 1 ? "{\"status\": \"ok\"}\n"
                           : ready == 0 ? "{\"status\": \"loading\"}\n"
                                        : "{\"status\": \"stopping\"}\n";
        char *t = strdup(body);
        if (!t)
            return MHD_NO;
        return send_text(c, ready == 1 ? 200 : 503, "application/json", t, strlen(t),
                         ready == 1 ? 0 : 1, x->endpoint);
    }
    if (ready != 1)
        return send_error(c, 503, ready == 0 ? "the model is still loading; retry shortly"
                                             : "the server is shutting down",
                          x->endpoint);
    /* JSON, or one raw image (no multipart: every library's form parser
     * has had its CVEs) */
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    serve_raw raw = {
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "top_k"),
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "encoding_format"),
    };
    int is_raw = ct && !strncasecmp(ct, "image/", 6);
    serve_reply rep;
    serve_handle_conn(&S, x->endpoint, x->body ? x->body : "", x->len, is_raw ? &raw : NULL,
                      client_gone, c, &rep);
    if (rep.status != 200) {
        enum MHD_Result ret = send_error(c, rep.status, rep.msg, x->endpoint);
        free(rep.body);
        return ret;
    }
    return send_json(c, 200, rep.body, rep.len, x->endpoint);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *x = *con_cls;
    if (x) {
        free(x->body);
        free(x);
        serve_http_active(&S, -1);
    }
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    cli_warning("http: %s", buf);
}

static int read_api_key(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return cli_error("--api-key-file %s: %s", path, strerror(errno));
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    if (!buf[0])
        return cli_error("--api-key-file %s: the first line (the key) is empty", path);
    if (!(*out = strdup(buf)))
        return cli_error("out of memory");
    return CLI_OK;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    memset(&o, 0, sizeof o);
    int rc = serve_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? CLI_OK : rc;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &addr.sin_addr) != 1)
        return cli_usage_error("serve", "--host %s: give an IPv4 address (127.0.0.1, 0.0.0.0)",
                               o.host);
    if (pipe(sig_pipe) != 0)
        return cli_error("cannot make a pipe: %s", strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    if (o.threads > 0)
        vitc_set_num_threads(o.threads);
    body_timeout_s = o.body_timeout_s;
    if (serve_state_init(&S, o.max_batch, o.max_wait_ms, o.max_queue,
                         (size_t)o.max_body_mb << 20) != 0)
        return cli_error("out of memory");
    if (o.api_key_file && (rc = read_api_key(o.api_key_file, &S.api_key)) != CLI_OK)
        return rc;


    /* Listen before loading: /health answers 503 while the model loads. */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)o.timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o.max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o.max_conn_ip,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, MHD_OPTION_END);
    if (!d) {
        rc = cli_error("cannot listen on %s:%d (in use, or not allowed)", o.host, o.port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "vitc: serve: listening on http://%s:%u (loading %s)\n", o.host,
            di ? (unsigned)di->port : (unsigned)o.port, o.model);
    fflush(stderr);

    const cli_model_opts mo = {o.model, o.arch, o.precision, o.attn_precision, 0, 0, 0, 0, 1};
    int dense = 0;
    if ((rc = serve_dense_open(&S, o.model, o.precision, &dense)) != CLI_OK ||
        (!dense && ((rc = cli_open_model("serve", &mo, &S.model, &S.in)) != CLI_OK ||
                    (rc = serve_model_ready(&S, o.model)) != CLI_OK))) {
        MHD_stop_daemon(d);
        goto out;
    }
    /* A SAM or Depth Anything model answers without the batcher (its
     * requests run one at a time): the thread still runs, idle, so that
     * the shutdown below stays one path. */
    pthread_t batcher;
    if (pthread_create(&batcher, NULL, batcher_main, NULL) != 0) {
        rc = cli_error("cannot start the batcher thread");
        MHD_stop_daemon(d);
        goto out;
    }
    /* A handler, not a blocked mask and sigwait: threads made before this
     * command runs (OpenBLAS starts its pool when loaded) would keep
     * SIGTERM unblocked and die of it. The handler writes the signal to a
     * pipe that this thread reads. Installed only now: while the model
     * loads nothing is queued, and a signal ends the process at once. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    atomic_store(&S.ready, 1);
    fprintf(stderr, "vitc: serve: ready\n");
    fflush(stderr);

    unsigned char sig = 0;
    while (read(sig_pipe[0], &sig, 1) != 1) {
        /* EINTR: the handler ran in this thread; its byte is in the pipe */
    }
    fprintf(stderr, "vitc: serve: %s: finishing the queued requests\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
    /* Stop accepting; requests already read finish, queued images run. */
    atomic_store(&S.ready, 2);
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET)
        close(ls);
    /* The batcher runs what is queued now, without waiting for batches
     * to fill; the requests being answered get their replies out before
     * the daemon closes their connections. */
    serve_stop_batcher(&S);
    serve_drain(&S);
    MHD_stop_daemon(d);
    pthread_join(batcher, NULL);
    fprintf(stderr, "vitc: serve: stopped\n");
    rc = CLI_OK;
out:
    serve_state_free(&S);
    return rc;
}

#endif
