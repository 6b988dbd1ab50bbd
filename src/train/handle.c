/*
 * handle.c — the live-model registry of train.h. Ids are never reused, so a
 * stale id stays dead even when a new model lands at the freed address.
 */
#include <pthread.h>
#include <stdlib.h>

#include "train.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *g_live; /* [g_n] sorted ascending (ids only grow) */
static size_t g_n, g_cap;
static uint64_t g_next = 1;

uint64_t vitc__handle_register(void) {
    uint64_t id = 0;
    pthread_mutex_lock(&g_mu);
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 64;
        uint64_t *p = realloc(g_live, cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&g_mu);
            return 0; /* 0 is never alive: callers treat it as out of memory */
        }
        g_live = p;
        g_cap = cap;
    }
    id = g_next++;
    g_live[g_n++] = id;
    pthread_mutex_unlock(&g_mu);
    return id;
}

static size_t find(uint64_t id) { /* index of the first entry >= id */
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_live[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void vitc__handle_unregister(uint64_t id) {
    pthread_mutex_lock(&g_mu);
    size_t i = find(id);
    if (i < g_n && g_live[i] == id) {
        for (size_t j = i + 1; j < g_n; j++)
            g_live[j - 1] = g_live[j];
        g_n--;
    }
    pthread_mutex_unlock(&g_mu);
}

int vitc__handle_alive(uint64_t id) {
    if (!id)
        return 0;
    pthread_mutex_lock(&g_mu);
    size_t i = find(id);
    int alive = i < g_n && g_live[i] == id;
    pthread_mutex_unlock(&g_mu);
    return alive;
}
