/*
 * cli_text.c — user text into the text tower, for the commands that read
 * text (cli_text.h). Every check runs before the model does any work, so
 * a bad label costs nothing and writes nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_text.h"
#include "internal.h"

int cli_text_model(const char *model_path, vitc_vit *m) {
    if (!vitc_vit_has_text(m))
        return cli_error("%s has no text tower: text needs a checkpoint with both towers "
                         "(a Hub CLIPModel or SiglipModel directory, or an open_clip file)",
                         model_path);
    if (!vitc_vit_tokenizer(m)) {
        /* the library keeps why (which files to add, or why they did not
         * load); encoding says it before it reads anything */
        int D = vitc_vit_text_dim(m);
        float *out = malloc(sizeof *out * (size_t)(D > 0 ? D : 1));
        const char *one[1] = {"x"};
        if (out && vitc_vit_encode_text(m, one, 1, out) != VITC_OK) {
            free(out);
            return cli_error("%s", vitc_last_error());
        }
        free(out);
        return cli_error("%s has no tokenizer: add the checkpoint's tokenizer files beside "
                         "config.json (tokenizer.json, or vocab.json + merges.txt for CLIP, or "
                         "spiece.model for SigLIP)",
                         model_path);
    }
    return CLI_OK;
}

int cli_check_text(const char *what, const char *s) {
    size_t len = strlen(s);
    if (len == 0)
        return cli_error("%s is empty", what), CLI_USAGE;
    if (len > CLI_TEXT_MAX_BYTES)
        return cli_error("%s is %zu bytes; the limit is %d (a prompt is cut at the model's "
                         "context, 77 or 64 tokens, anyway)",
                         what, len, CLI_TEXT_MAX_BYTES),
               CLI_USAGE;
    long long bad = (long long)vitc__utf8_invalid_at(s, len);
    if (bad >= 0)
        return cli_error("%s is not valid UTF-8 at byte offset %lld (byte 0x%02x)", what, bad,
                         (unsigned char)s[bad]),
               CLI_USAGE;
    return CLI_OK;
}

void cli_free_texts(char **v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

/* Appends s[0..len) (a copy) to *v; CLI_OK, else the error printed. */
static int push_text(char ***v, int *n, int *cap, const char *s, size_t len) {
    if (*n >= CLI_TEXT_MAX_COUNT)
        return cli_error("more than %d texts; the limit is %d (docs/limits.md)",
                         CLI_TEXT_MAX_COUNT, CLI_TEXT_MAX_COUNT),
               CLI_USAGE;
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 16;
        char **g = realloc(*v, (size_t)c * sizeof *g);
        if (!g)
            return cli_error("out of memory");
        *v = g, *cap = c;
    }
    char *t = malloc(len + 1);
    if (!t)
        return cli_error("out of memory");
    memcpy(t, s, len);
    t[len] = 0;
    (*v)[(*n)++] = t;
    return CLI_OK;
}

int cli_split_labels(const char *s, char ***out, int *n) {
    int cap = 0, rc;
    *out = NULL;
    *n = 0;
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *a = p, *b = p + len;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if ((rc = push_text(out, n, &cap, a, (size_t)(b - a))) != CLI_OK)
            return rc;
        char what[64];
        snprintf(what, sizeof what, "--labels: label %d", *n);
        if ((rc = cli_check_text(what, (*out)[*n - 1])) != CLI_OK)
            return rc;
        if (!e)
            break;
        p = e + 1;
    }
    return CLI_OK;
}

int cli_read_lines(const char *what, const char *path, char ***out, int *n) {
    FILE *f;
    int64_t size;
    int cap = 0, rc = CLI_OK;
    *out = NULL;
    *n = 0;
    /* vitc_open_read refuses a directory, a FIFO and a file past the cap */
    if (vitc_open_read(path, CLI_TEXT_FILE_MAX_BYTES, &f, &size) != VITC_OK)
        return cli_error("%s %s: %s", what, path, vitc_last_error());
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return cli_error("%s %s: out of memory", what, path);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return cli_error("%s %s: read error", what, path);
    }
    buf[got] = 0;
    if (memchr(buf, 0, got)) {
        long long at = (long long)((char *)memchr(buf, 0, got) - buf);
        free(buf);
        return cli_error("%s %s: a NUL byte at offset %lld (not a text file)", what, path, at);
    }
    size_t i = 0;
    int line = 0;
    while (i < got && rc == CLI_OK) {
        char *e = memchr(buf + i, '\n', got - i);
        size_t len = e ? (size_t)(e - (buf + i)) : got - i;
        line++;
        if (len && buf[i + len - 1] == '\r')
            len--;
        if ((rc = push_text(out, n, &cap, buf + i, len)) == CLI_OK) {
            char w[4200];
            snprintf(w, sizeof w, "%s %s: line %d", what, path, line);
            rc = cli_check_text(w, (*out)[*n - 1]);
        }
        i += (e ? (size_t)(e - (buf + i)) + 1 : got - i);
    }
    free(buf);
    if (rc == CLI_OK && *n == 0)
        rc = (cli_error("%s %s: no lines", what, path), CLI_USAGE);
    return rc;
}

int cli_encode_texts(vitc_vit *m, const char *const *texts, int64_t n, float *out,
                     cli_progress *pr, int64_t done0) {
    int64_t D = vitc_vit_text_dim(m);
    for (int64_t i = 0; i < n; i += CLI_TEXT_BATCH) {
        int b = (int)(n - i < CLI_TEXT_BATCH ? n - i : CLI_TEXT_BATCH);
        if (vitc_vit_encode_text(m, texts + i, b, out + i * D) != VITC_OK) {
            if (pr)
                cli_progress_clear(pr);
            return cli_error("text tower: %s", vitc_last_error());
        }
        if (pr)
            cli_progress_update(pr, done0 + i + b);
    }
    return CLI_OK;
}
