/* status.c — error messages, checked sizes and aligned memory. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "internal.h"

static _Thread_local char vitc__msg[1024];

const char *vitc_status_str(vitc_status s) {
    switch (s) {
    case VITC_OK: return "ok";
    case VITC_ERR_INVALID_ARG: return "invalid argument";
    case VITC_ERR_SHAPE: return "shape mismatch";
    case VITC_ERR_NOMEM: return "out of memory";
    case VITC_ERR_IO: return "i/o error";
    case VITC_ERR_FORMAT: return "malformed file";
    case VITC_ERR_KEY: return "bad weight name";
    case VITC_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}

const char *vitc_last_error(void) { return vitc__msg; }
const char *vitc_version(void) { return VITC_VERSION_STRING; }

vitc_status vitc__err(vitc_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vitc__msg, sizeof vitc__msg, fmt, ap);
    va_end(ap);
    return status;
}

vitc_status vitc__err_prefix(vitc_status status, const char *fmt, ...) {
    char head[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    /* Shift the old message right (truncating its end) and put head first. */
    size_t hl = strlen(head) + 2, cap = sizeof vitc__msg - 1, ml = strlen(vitc__msg);
    if (hl >= cap)
        hl = cap;
    if (ml > cap - hl)
        ml = cap - hl;
    memmove(vitc__msg + hl, vitc__msg, ml);
    vitc__msg[hl + ml] = '\0';
    memcpy(vitc__msg, head, hl - 2);
    memcpy(vitc__msg + hl - 2, ": ", 2);
    return status;
}

size_t vitc__numel(int ndim, const int64_t *shape, int *ok) {
    size_t n = 1;
    *ok = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX || !vitc__mul_size(n, (size_t)shape[i], &n)) {
            *ok = 0;
            return 0;
        }
    }
    return n;
}

const char *vitc__shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t used = 0;
    if (cap == 0)
        return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
    return buf;
}

/* Buffers from this size up (packed weights, activations, GEMM scratch)
 * are 2 MB aligned and asked to be backed by transparent huge pages: the
 * GEMM streams its weight panels (344 MB per ViT-B forward) and reads
 * activation rows kilobytes apart (attention heads, A strips), one TLB
 * miss per 4 KB page otherwise. Linux with THP in "madvise" mode (the
 * default) only gives huge pages to regions that ask. */
#define VITC_HUGE_MIN ((size_t)4 << 20)
#define VITC_HUGE_ALIGN ((size_t)2 << 20)

void *vitc__alloc(size_t bytes) {
    size_t rounded;
    if (bytes == 0)
        bytes = 64;
    if (!vitc__add_size(bytes, 63, &rounded))
        return NULL;
    rounded &= ~(size_t)63;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (rounded >= VITC_HUGE_MIN) {
        /* Only the start aligned: the last partial 2 MB keeps 4 KB pages,
         * so the resident size stays what the buffer touches. */
        void *p = NULL; /* (aligned_alloc would want the size a multiple of 2 MB) */
        if (posix_memalign(&p, VITC_HUGE_ALIGN, rounded) != 0) return NULL;
        (void)madvise(p, rounded, MADV_HUGEPAGE); /* a refusal only keeps 4 KB pages */
        return p;
    }
#endif
    return aligned_alloc(64, rounded);
}

void *vitc__calloc(size_t count, size_t size) {
    size_t bytes;
    if (!vitc__mul_size(count, size, &bytes))
        return NULL;
    void *p = vitc__alloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void vitc__free(void *p) { free(p); }

vitc_status vitc__buf_reserve(vitc__buf *b, size_t floats) {
    if (floats <= b->cap)
        return VITC_OK;
    size_t bytes;
    if (!vitc__mul_size(floats, sizeof(float), &bytes))
        return vitc__err(VITC_ERR_NOMEM, "scratch of %zu floats overflows", floats);
    float *p = vitc__alloc(bytes);
    if (!p)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu bytes of scratch", bytes);
    vitc__free(b->p);
    b->p = p;
    b->cap = floats;
    return VITC_OK;
}

void vitc__buf_free(vitc__buf *b) {
    vitc__free(b->p);
    b->p = NULL;
    b->cap = 0;
}
