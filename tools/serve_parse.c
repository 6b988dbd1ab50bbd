/*
 * serve_parse.c — `vitc serve`'s request parsing: a POST body (JSON, or a
 * raw image with its options from the query string) into the images'
 * pixels and the texts, checked before anything is queued. It needs no
 * model and no socket, only what the model fixes (serve_parse_cfg), so
 * the fuzz target (tests/fuzz/fuzz_serve.c) runs the same code the
 * server's connection threads run.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_text.h"
#include "serve.h"

void serve_vfail(serve_reply *r, int status, const char *fmt, va_list ap) {
    vsnprintf(r->msgbuf, sizeof r->msgbuf, fmt, ap);
    r->status = status;
    r->msg = r->msgbuf;
}

void serve_fail(serve_reply *r, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    serve_vfail(r, status, fmt, ap);
    va_end(ap);
}

int serve_base64_decode(const char *s, size_t len, unsigned char **out, size_t *n, char *err,
                        size_t err_len) {
    unsigned char *o = malloc(len / 4 * 3 + 3);
    if (!o) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        int v;
        if (c >= 'A' && c <= 'Z')
            v = c - 'A';
        else if (c >= 'a' && c <= 'z')
            v = c - 'a' + 26;
        else if (c >= '0' && c <= '9')
            v = c - '0' + 52;
        else if (c == '+' || c == '-')
            v = 62;
        else if (c == '/' || c == '_')
            v = 63;
        else if (c == '=') {
            pad++;
            continue;
        } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            continue;
        else {
            snprintf(err, err_len, "bad base64: character 0x%02x at offset %zu", c, i);
            free(o);
            return -1;
        }
        if (pad) {
            snprintf(err, err_len, "bad base64: data after '=' padding at offset %zu", i);
            free(o);
            return -1;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (unsigned char)(acc >> bits);
        }
    }
    /* 6 leftover bits (a length of 4k+1 symbols) cannot be a byte */
    if (bits >= 6 || pad > 2) {
        snprintf(err, err_len, "bad base64: truncated (the length is not a whole number of "
                               "bytes)");
        free(o);
        return -1;
    }
    *out = o;
    *n = k;
    return 0;
}

int serve_decode_image(const serve_parse_cfg *c, const void *bytes, size_t n, float **pixels,
                       char *err, size_t err_len) {
    if (n == 0) {
        snprintf(err, err_len, "an empty image");
        return -1;
    }
    const cli_input *in = &c->in;
    vitc_image img;
    vitc_status st = vitc_image_load_memory_flags(
        bytes, n, c->max_pixels, in->proc ? vitc_vit_image_flags(in->proc) : 0, &img);
    if (st != VITC_OK) {
        snprintf(err, err_len, "cannot decode the image: %s", vitc_last_error());
        return -1;
    }
    float *px = malloc(in->per_image * sizeof *px); /* [C, H, W] */
    if (!px) {
        vitc_image_free(&img);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (in->proc) {
        int h, w;
        st = vitc_vit_preprocess_size(in->proc, img.width, img.height, &h, &w);
        if (st == VITC_OK && in->channels == 1) {
            /* as cli_load_input: PIL's convert("L") in every plane, the
             * first plane kept */
            size_t np = (size_t)img.width * (size_t)img.height;
            float *rgb = malloc((size_t)3 * (size_t)h * (size_t)w * sizeof *rgb);
            for (size_t i = 0; rgb && i < np; i++) {
                uint8_t *p = img.rgb + 3 * i;
                uint32_t l = (p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16;
                p[0] = p[1] = p[2] = (uint8_t)l;
            }
            st = rgb ? vitc_vit_preprocess(in->proc, &img, rgb) : VITC_ERR_NOMEM;
            if (st == VITC_OK)
                memcpy(px, rgb, (size_t)h * (size_t)w * sizeof *rgb);
            free(rgb);
        } else if (st == VITC_OK) {
            st = vitc_vit_preprocess(in->proc, &img, px);
        }
    } else {
        st = vitc_image_preprocess_channels(&img, in->resize, in->crop, in->channels, c->mean,
                                            c->std, px);
    }
    vitc_image_free(&img);
    if (st != VITC_OK) {
        free(px);
        snprintf(err, err_len, "cannot preprocess the image: %s", vitc_last_error());
        return -1;
    }
    *pixels = px;
    return 0;
}

int serve_decode_input(const serve_parse_cfg *c, const char *str, size_t len, float **pixels,
                       char *err, size_t err_len) {
    const char *b64 = str;
    size_t b64len = len;
    if (len >= 5 && !strncmp(str, "data:", 5)) {
        const char *comma = memchr(str, ',', len);
        if (!comma) {
            snprintf(err, err_len, "a data: URL without ',' before its data");
            return -1;
        }
        size_t hl = (size_t)(comma - str);
        if (hl < 7 || strncmp(comma - 7, ";base64", 7) != 0) {
            snprintf(err, err_len, "a data: URL must be base64 (data:image/png;base64,...)");
            return -1;
        }
        b64 = comma + 1;
        b64len = len - hl - 1;
    }
    unsigned char *bytes;
    size_t n;
    if (serve_base64_decode(b64, b64len, &bytes, &n, err, err_len) != 0)
        return -1;
    int rc = serve_decode_image(c, bytes, n, pixels, err, err_len);
    free(bytes);
    return rc;
}

void serve_parsed_free(serve_parsed *p) {
    if (p->pixels)
        for (int i = 0; i < p->n; i++) free(p->pixels[i]);
    free(p->pixels);
    free(p->texts);
    json_decref(p->root);
    memset(p, 0, sizeof *p);
}

int serve_parse_request(const serve_parse_cfg *c, int endpoint, const char *body, size_t len,
                        const serve_raw *raw, serve_parsed *p, serve_reply *r) {
    memset(p, 0, sizeof *p);
    p->top_k = 5;
    json_error_t je;
    json_t *root;
    if (raw) {
        /* a raw image body: its options from the query string, as the
         * JSON body would give them */
        root = json_object();
        if (root && raw->top_k) {
            long v;
            if (cli_parse_long(raw->top_k, 1, 1000000000, &v) != 0) {
                json_decref(root);
                serve_fail(r, 400, "top_k must be an integer >= 1");
                return -1;
            }
            json_object_set_new(root, "top_k", json_integer(v));
        }
        if (root && raw->encoding_format)
            json_object_set_new(root, "encoding_format", json_string(raw->encoding_format));
        if (root)
            json_object_set_new(root, "input", json_string(""));
        if (!root) {
            serve_fail(r, 500, "out of memory");
            return -1;
        }
    } else {
        root = json_loadb(body, len, 0, &je);
        if (!root) {
            serve_fail(r, 400, "malformed JSON: %s (line %d, column %d)", je.text, je.line,
                       je.column);
            return -1;
        }
    }
    p->root = root;
    if (!json_is_object(root)) {
        serve_fail(r, 400, "the body must be a JSON object with \"input\"");
        goto bad;
    }
    json_t *input = json_object_get(root, "input");
    if (!input || !(json_is_string(input) || json_is_array(input))) {
        serve_fail(r, 400, "\"input\" is required: a string or an array of strings (base64 images "
                           "or data: URLs)");
        goto bad;
    }
    size_t n = json_is_array(input) ? json_array_size(input) : 1;
    if (n == 0) {
        serve_fail(r, 400, "\"input\" is empty");
        goto bad;
    }
    if (n > (size_t)c->max_queue) {
        serve_fail(r, 400, "%zu inputs in one request; the server queues at most %d (--max-queue)",
                   n, c->max_queue);
        goto bad;
    }
    if (endpoint == SERVE_EP_EMBEDDINGS) {
        json_t *ef = json_object_get(root, "encoding_format");
        if (ef && !json_is_null(ef)) {
            const char *v = json_is_string(ef) ? json_string_value(ef) : "";
            if (!strcmp(v, "base64"))
                p->base64 = 1;
            else if (strcmp(v, "float") != 0) {
                serve_fail(r, 400, "\"encoding_format\" must be \"float\" or \"base64\"");
                goto bad;
            }
        }
    } else {
        if (c->num_classes <= 0) {
            serve_fail(r, 400, "the model has no classification head (a backbone): use "
                               "/v1/embeddings");
            goto bad;
        }
        json_t *tk = json_object_get(root, "top_k");
        if (tk && !json_is_null(tk)) {
            if (!json_is_integer(tk) || json_integer_value(tk) < 1) {
                serve_fail(r, 400, "\"top_k\" must be an integer >= 1");
                goto bad;
            }
            json_int_t v = json_integer_value(tk);
            p->top_k = v > c->num_classes ? c->num_classes : (int)v;
        }
        if (p->top_k > c->num_classes)
            p->top_k = c->num_classes;
    }
    p->n = (int)n;
    p->pixels = calloc(n, sizeof *p->pixels);
    p->texts = calloc(n, sizeof *p->texts);
    if (!p->pixels || !p->texts) {
        serve_fail(r, 500, "out of memory");
        goto bad;
    }
    for (int i = 0; i < p->n; i++) {
        json_t *e = json_is_array(input) ? json_array_get(input, (size_t)i) : input;
        /* {"image": B64} and {"text": T} say what they are; a bare string
         * is a text for a model with a text tower (as in OpenAI's API),
         * unless it is a data: URL, and a base64 image otherwise */
        int is_text = 0;
        if (json_is_object(e)) {
            json_t *t = json_object_get(e, "text");
            is_text = t != NULL;
            e = t ? t : json_object_get(e, "image");
        } else if (json_is_string(e)) {
            is_text = !raw && c->has_text && strncmp(json_string_value(e), "data:", 5) != 0;
        }
        if (!e || !json_is_string(e)) {
            serve_fail(r, 400, "input[%d]: not a string (a base64 image, a data: URL%s)", i,
                       c->has_text ? " or a text" : "");
            goto bad;
        }
        if (is_text) {
            size_t tl = json_string_length(e);
            if (endpoint != SERVE_EP_EMBEDDINGS || !c->has_text) {
                serve_fail(r, 400, "input[%d]: a text, but %s", i,
                           endpoint != SERVE_EP_EMBEDDINGS
                               ? "/v1/classify takes images"
                               : "the model has no text tower with a tokenizer (CLIP and SigLIP "
                                 "Hub directories with their tokenizer files have one)");
                goto bad;
            }
            if (tl == 0 || tl > CLI_TEXT_MAX_BYTES || memchr(json_string_value(e), 0, tl)) {
                serve_fail(r, 400, "input[%d]: a text must be 1 to %d bytes, without NUL", i,
                           (int)CLI_TEXT_MAX_BYTES);
                goto bad;
            }
            p->texts[i] = json_string_value(e);
            continue;
        }
        char err[400];
        if (raw ? serve_decode_image(c, body, len, &p->pixels[i], err, sizeof err)
                : serve_decode_input(c, json_string_value(e), json_string_length(e),
                                     &p->pixels[i], err, sizeof err)) {
            serve_fail(r, 400, "input[%d]: %s", i, err);
            goto bad;
        }
    }
    return 0;
bad:
    serve_parsed_free(p);
    return -1;
}
