/*
 * test_serve_core.c — `vitc serve`'s queue and batcher (tools/serve_core.c)
 * without HTTP: client threads call serve_handle at once on one model
 * while the batcher thread runs, so `make asan` and `make tsan` watch the
 * locking, the queue and the replies. Each reply must equal the same
 * image's embedding computed alone (batches of other sizes, 1e-4), and a
 * client that goes away while queued must get 499 at once with its
 * images taken out of the queue, never run.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve.h"

#ifdef VITC_HAVE_MHD

#define NCLIENTS 6
#define NREQ 8

static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* {"input": ["data:image/jpeg;base64,..."]} of tests/data/photo.jpg. */
static char *photo_body(size_t *len) {
    FILE *f = fopen("tests/data/photo.jpg", "rb");
    assert_non_null(f);
    unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n > 0 && n < sizeof buf);
    char *out = malloc(64 + (n + 2) / 3 * 4);
    assert_non_null(out);
    size_t k = (size_t)sprintf(out, "{\"input\": [\"data:image/jpeg;base64,");
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)buf[i] << 16 | (i + 1 < n ? (uint32_t)buf[i + 1] << 8 : 0) |
                     (i + 2 < n ? buf[i + 2] : 0);
        out[k++] = b64c[x >> 18 & 63];
        out[k++] = b64c[x >> 12 & 63];
        out[k++] = i + 1 < n ? b64c[x >> 6 & 63] : '=';
        out[k++] = i + 2 < n ? b64c[x & 63] : '=';
    }
    k += (size_t)sprintf(out + k, "\"]}");
    *len = k;
    return out;
}

/* A small model served as `vitc serve` serves a checkpoint file. */
static void start(serve_state *s, vitc_vit **m, int max_wait_ms) {
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 32;
    c.patch_size = 8;
    c.hidden_dim = 32;
    c.depth = 2;
    c.num_heads = 4;
    c.mlp_dim = 64;
    c.num_classes = 10;
    assert_int_equal(vitc_vit_create(&c, 7, m), VITC_OK);
    assert_int_equal(serve_state_init(s, 4, max_wait_ms, 64, 1 << 20), 0);
    s->model = *m;
    s->in.crop = 32;
    s->in.resize = 36;
    s->in.channels = 3;
    s->in.height = s->in.width = 32;
    s->in.per_image = 3 * 32 * 32;
    assert_int_equal(serve_model_ready(s, "dir/m.safetensors"), CLI_OK);
    atomic_store(&s->ready, 1);
}

static void *batcher(void *arg) {
    serve_batcher_run(arg);
    return NULL;
}

/* The first embedding's numbers in a reply's JSON. */
static int parse_embedding(const char *json, float *out, int n) {
    const char *p = strstr(json, "\"embedding\": [");
    if (!p)
        return -1;
    p += strlen("\"embedding\": [");
    for (int i = 0; i < n; i++) {
        char *end;
        out[i] = strtof(p, &end);
        if (end == p)
            return -1;
        p = end + (i + 1 < n ? 2 : 0);
    }
    return 0;
}

typedef struct {
    serve_state *s;
    const char *body;
    size_t len;
    const float *ref;
    int bad;
} client_arg;

static void *client(void *arg) {
    client_arg *a = arg;
    float got[64];
    for (int r = 0; r < NREQ; r++) {
        serve_reply rep;
        serve_handle(a->s, SERVE_EP_EMBEDDINGS, a->body, a->len, NULL, &rep);
        if (rep.status != 200 || parse_embedding(rep.body, got, (int)a->s->embed_dim) != 0)
            a->bad++;
        else
            for (int i = 0; i < a->s->embed_dim; i++)
                if (fabsf(got[i] - a->ref[i]) > 1e-4f * fmaxf(1.0f, fabsf(a->ref[i])))
                    a->bad++;
        free(rep.body);
    }
    return NULL;
}

static void test_concurrent_clients(void **state) {
    (void)state;
    serve_state s;
    vitc_vit *m;
    start(&s, &m, 2);
    size_t len;
    char *body = photo_body(&len);
    /* the reference: the image decoded as the server does, run alone */
    serve_parse_cfg pc = {s.in, vitc_vit_get_config(m)->mean, vitc_vit_get_config(m)->std,
                          s.num_classes, 0, s.max_queue, 0};
    serve_parsed p;
    serve_reply rep;
    assert_int_equal(serve_parse_request(&pc, SERVE_EP_EMBEDDINGS, body, len, NULL, &p, &rep),
                     0);
    assert_true(s.embed_dim <= 64);
    float ref[64];
    assert_int_equal(vitc_session_embed(s.session, p.pixels[0], 1, 32, 32, VITC_POOL_DEFAULT,
                                        ref),
                     VITC_OK);
    serve_parsed_free(&p);

    pthread_t bt, ct[NCLIENTS];
    assert_int_equal(pthread_create(&bt, NULL, batcher, &s), 0);
    client_arg args[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) {
        args[i] = (client_arg){&s, body, len, ref, 0};
        assert_int_equal(pthread_create(&ct[i], NULL, client, &args[i]), 0);
    }
    for (int i = 0; i < NCLIENTS; i++) {
        pthread_join(ct[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    serve_stop_batcher(&s);
    serve_drain(&s);
    pthread_join(bt, NULL);
    pthread_mutex_lock(&s.mmu);
    assert_int_equal(s.images_total, NCLIENTS * NREQ);
    assert_int_equal(s.dropped_items, 0);
    assert_true(s.batch_hist.count < NCLIENTS * NREQ); /* some batches held several */
    pthread_mutex_unlock(&s.mmu);
    free(body);
    serve_state_free(&s);
}

static int gone_after(void *arg) {
    /* the client leaves at its second look */
    return ++*(int *)arg >= 2;
}

static void test_gone_client_dropped(void **state) {
    (void)state;
    serve_state s;
    vitc_vit *m;
    start(&s, &m, 10000); /* a batch would wait 10 s to fill */
    size_t len;
    char *body = photo_body(&len);
    pthread_t bt;
    assert_int_equal(pthread_create(&bt, NULL, batcher, &s), 0);
    int looks = 0;
    double t0 = cli_now();
    serve_reply rep;
    serve_handle_conn(&s, SERVE_EP_EMBEDDINGS, body, len, NULL, gone_after, &looks, &rep);
    assert_int_equal(rep.status, 499);
    assert_null(rep.body);
    assert_true(cli_now() - t0 < 5.0);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(s.q_len, 0);
    assert_int_equal(s.active, 0);
    pthread_mutex_unlock(&s.mu);
    serve_stop_batcher(&s);
    pthread_join(bt, NULL);
    pthread_mutex_lock(&s.mmu);
    assert_int_equal(s.images_total, 0);
    assert_int_equal(s.dropped_items, 1);
    assert_int_equal(s.dropped_requests, 1);
    pthread_mutex_unlock(&s.mmu);
    free(body);
    serve_state_free(&s);
}

int main(void) {
    vitc_set_num_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_gone_client_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void) {
    printf("test_serve_core: skipped (built without libmicrohttpd)\n");
    return 0;
}

#endif
