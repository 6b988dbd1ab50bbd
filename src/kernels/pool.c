/*
 * pool.c — the library's one thread pool.
 *
 * Workers are created lazily on the first parallel region that needs them and
 * live for the rest of the process. The caller of a region is thread 0 and
 * works too, so n threads means n - 1 workers. Between regions a worker spins
 * for a short while (ViT runs ~100 regions back to back, and a futex wake-up
 * costs more than a typical gap between them), then sleeps on a condvar.
 *
 * Partition: [0, n) is cut into nthreads contiguous, nearly equal ranges and
 * thread t always gets range t. The owner of an index depends only on n and
 * the thread count, never on timing, so a kernel that computes each index
 * independently gets bitwise identical results for any thread count.
 *
 * Regions started from several user threads at once are serialised by a
 * mutex (they share the workers); a region started inside a pool task runs
 * serially on the calling thread with the caller's tid.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define vitc__cpu_relax() _mm_pause()
#else
#define vitc__cpu_relax() ((void)0)
#endif

#include "kernels.h"

#define VITC_MAX_THREADS 256
/* How long an idle worker, or a caller waiting for its workers, spins before
 * sleeping. Long enough to bridge the serial gaps of a forward pass. */
#define VITC_SPIN_NS 200000L
/* After this long a waiting thread yields between checks: when the machine
 * is oversubscribed the thread it waits for may need this very core. */
#define VITC_YIELD_NS 20000L

typedef struct vitc__pool {
    pthread_mutex_t region_lock; /* one region at a time (user threads) */
    pthread_mutex_t lock;        /* guards the sleeps below */
    pthread_cond_t wake;         /* workers: a new region (or stop) */
    pthread_cond_t done;         /* caller: the last worker finished */
    /* Region counter, a seqlock: odd while the caller writes the region
     * below, even once it is published. */
    _Atomic uint64_t gen;
    _Atomic int remaining;       /* workers of this region not yet done */
    _Atomic int caller_sleeping;
    int sleepers;                /* workers blocked on wake (under lock) */
    uint64_t pokes;              /* vitc__pool_prewake's (under lock) */
    int stop;
    /* The region being run. Atomic (relaxed) because a worker that takes no
     * part in one region may read them while the next one is written; the
     * seqlock tells it to read again. */
    _Atomic(vitc__range_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n;
    _Atomic int active; /* threads taking part, caller included */
    int nworkers;
    pthread_t threads[VITC_MAX_THREADS];
    /* gen when worker i was created: it starts from there, because it may
     * first run only after the region it was created for is published. */
    uint64_t start_gen[VITC_MAX_THREADS];
    /* VITC_POOL_STATS only: when each worker started and finished the
     * region (ns), written before its acknowledgement. */
    int64_t w_t0[VITC_MAX_THREADS], w_t1[VITC_MAX_THREADS], w_cpu[VITC_MAX_THREADS];
    int64_t w_wait[VITC_MAX_THREADS];
} vitc__pool;

static vitc__pool vitc__P = {
    .region_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

static _Atomic int vitc__nthreads; /* 0: not yet decided */
static _Thread_local int vitc__inside;
static _Thread_local int vitc__tid;

static int vitc__default_threads(void) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n < 1) n = 1;
    return n > VITC_MAX_THREADS ? VITC_MAX_THREADS : n;
}

void vitc_set_num_threads(int n) {
    if (n <= 0) n = vitc__default_threads();
    if (n > VITC_MAX_THREADS) n = VITC_MAX_THREADS;
    /* Taken so that a region in flight keeps the count it started with. */
    pthread_mutex_lock(&vitc__P.region_lock);
    atomic_store(&vitc__nthreads, n);
    pthread_mutex_unlock(&vitc__P.region_lock);
}

int vitc__num_threads(void) {
    int n = atomic_load_explicit(&vitc__nthreads, memory_order_relaxed);
    if (n == 0) {
        n = vitc__default_threads();
        int expect = 0;
        if (!atomic_compare_exchange_strong(&vitc__nthreads, &expect, n)) n = expect;
    }
    return n;
}

int vitc_get_num_threads(void) { return vitc__num_threads(); }
int vitc__in_parallel(void) { return vitc__inside; }

int64_t vitc__pool_cpu_ns(void) { /* this thread's CPU time */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t vitc__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- VITC_POOL_STATS=1: where threads wait --------------------------
 * Per kind of region (its function; parallel_for's task function), summed
 * over the process and printed to stderr at exit: regions, time busy per
 * thread, the workers' start latency, the time threads sat idle at the
 * region's end, and the serial time before the region (thread 0 alone
 * since the previous region ended, the other threads spinning). Off: one
 * predictable branch per region. Addresses print as offsets in their
 * object: `nm -C build/vitc` (or addr2line -f -e) names them. */
#define VITC_STATS_KINDS 64
typedef struct {
    const void *fn, *prev; /* prev: the kind of the region before */
    int64_t count, n, wall, busy, wake, idle, serial, kwait;
    /* In CPU time, which other processes on the cores do not inflate:
     * each thread's time in the region, the time threads would idle at its
     * end if all ran at once (max - own, summed), thread 0's time between
     * regions. */
    int64_t cpu, imb, cserial;
} vitc__stat;
static int vitc__stats_on = -1;
static _Thread_local int64_t vitc__stats_wait; /* this region's waits inside kernels */

/* Read atomically where no region lock orders the read after
 * vitc__stats_init (a user thread running work inline while another starts
 * the first region). */
int vitc__pool_stats(void) { return __atomic_load_n(&vitc__stats_on, __ATOMIC_RELAXED) == 1; }
void vitc__pool_note_wait(int64_t cpu_ns) { vitc__stats_wait += cpu_ns; }
static vitc__stat vitc__stats[VITC_STATS_KINDS];
static int64_t vitc__stats_last_end, vitc__stats_last_cpu;
static const void *vitc__stats_last_fn;

static void vitc__stats_init(void) {
    const char *e = getenv("VITC_POOL_STATS");
    __atomic_store_n(&vitc__stats_on, e && e[0] && strcmp(e, "0") != 0, __ATOMIC_RELAXED);
}

/* One region ended (under region_lock): t0 published, t1 the caller done,
 * t2 every thread done. */
static void vitc__stats_add(const void *fn, int64_t n, int nt, int64_t t0, int64_t t1, int64_t t2,
                            int64_t c0, int64_t c1) {
    const vitc__pool *P = &vitc__P;
    vitc__stat *s = NULL;
    for (int i = 0; i < VITC_STATS_KINDS && !s; i++)
        if (vitc__stats[i].fn == fn && vitc__stats[i].prev == vitc__stats_last_fn)
            s = &vitc__stats[i];
    for (int i = 0; i < VITC_STATS_KINDS && !s; i++)
        if (!vitc__stats[i].fn) {
            s = &vitc__stats[i];
            s->fn = fn;
            s->prev = vitc__stats_last_fn;
        }
    if (!s) return; /* table full: dropped */
    s->count++;
    s->n += n;
    s->wall += t2 - t0;
    s->busy += t1 - t0;
    s->idle += t2 - t1;
    int64_t mx = c1 - c0 - vitc__stats_wait, sum = mx;
    s->kwait += vitc__stats_wait;
    vitc__stats_wait = 0;
    for (int t = 1; t < nt; t++) {
        s->kwait += P->w_wait[t];
        mx = P->w_cpu[t] > mx ? P->w_cpu[t] : mx;
        sum += P->w_cpu[t];
    }
    s->cpu += sum;
    s->imb += mx * nt - sum;
    if (vitc__stats_last_cpu) s->cserial += c0 - vitc__stats_last_cpu;
    vitc__stats_last_cpu = vitc__pool_cpu_ns(); /* after the wait at the end */
    for (int t = 1; t < nt; t++) {
        s->busy += P->w_t1[t] - P->w_t0[t];
        s->wake += P->w_t0[t] - t0;
        s->idle += t2 - P->w_t1[t];
    }
    if (vitc__stats_last_end) s->serial += t0 - vitc__stats_last_end;
    vitc__stats_last_end = t2;
    vitc__stats_last_fn = fn;
}

/* fn's offset in its object (the kernels' functions are static: no names). */
static unsigned long vitc__stats_off(const void *fn) {
    Dl_info di;
    if (fn && dladdr(fn, &di) && di.dli_fbase) return (unsigned long)((uintptr_t)fn - (uintptr_t)di.dli_fbase);
    return (unsigned long)(uintptr_t)fn;
}

__attribute__((destructor)) static void vitc__stats_print(void) {
    if (vitc__stats_on != 1) return;
    fprintf(stderr, "pool stats (ms; idle: thread-time waiting at the region's end; serial: "
                    "before it, one thread; c*: CPU time; cpu: work, cimb: idle were all threads running, cwait: "
                    "waits inside kernels)\n%-9s %-9s %6s %7s %9s %9s %8s %8s %8s %9s %8s %8s %8s\n",
            "region", "after", "count", "n", "wall", "busy", "wake", "idle", "serial", "cpu", "cimb",
            "cserial", "cwait");
    for (int i = 0; i < VITC_STATS_KINDS && vitc__stats[i].fn; i++) {
        const vitc__stat *s = &vitc__stats[i];
        fprintf(stderr,
                "%#-9lx %#-9lx %6lld %7lld %9.3f %9.3f %8.3f %8.3f %8.3f %9.3f %8.3f %8.3f %8.3f\n",
                vitc__stats_off(s->fn), vitc__stats_off(s->prev), (long long)s->count, (long long)s->n,
                s->wall / 1e6, s->busy / 1e6, s->wake / 1e6, s->idle / 1e6, s->serial / 1e6,
                s->cpu / 1e6, s->imb / 1e6, s->cserial / 1e6, s->kwait / 1e6);
    }
}

static void vitc__run_share(vitc__range_fn fn, void *ctx, int64_t n, int t, int nt) {
    /* Range t of nt: [n*t/nt, n*(t+1)/nt), computed without overflow for any
     * n that fits int64 (nt <= 256). */
    int64_t q = n / nt, r = n % nt;
    int64_t b = q * t + (t < r ? t : r);
    int64_t e = b + q + (t < r ? 1 : 0);
    if (b < e) fn(ctx, b, e, t);
}

static void *vitc__worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    vitc__pool *P = &vitc__P;
    uint64_t seen = P->start_gen[tid];
    vitc__inside = 1;
    vitc__tid = tid;
    for (;;) {
        uint64_t g = atomic_load_explicit(&P->gen, memory_order_acquire);
        if (g == seen) {
            int64_t t0 = vitc__now_ns();
            for (int spin = 1; g == seen; spin++) {
                vitc__cpu_relax();
                g = atomic_load_explicit(&P->gen, memory_order_acquire);
                if ((spin & 63) == 0) {
                    int64_t dt = vitc__now_ns() - t0;
                    if (dt > VITC_SPIN_NS) break;
                    if (dt > VITC_YIELD_NS) sched_yield();
                }
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&P->lock);
            P->sleepers++;
            const uint64_t pk = P->pokes;
            while ((g = atomic_load(&P->gen)) == seen && !P->stop && P->pokes == pk)
                pthread_cond_wait(&P->wake, &P->lock);
            P->sleepers--;
            int stop = P->stop;
            pthread_mutex_unlock(&P->lock);
            if (stop) return NULL;
            if (g == seen) continue; /* poked: spin for the region on its way */
        }
        if (g & 1) { /* being written: read it again when published */
            vitc__cpu_relax();
            continue;
        }
        vitc__range_fn fn = atomic_load_explicit(&P->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&P->ctx, memory_order_relaxed);
        int64_t n = atomic_load_explicit(&P->n, memory_order_relaxed);
        int active = atomic_load_explicit(&P->active, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&P->gen, memory_order_relaxed) != g)
            continue; /* a later region replaced it: this one did not need us */
        seen = g;
        if (tid >= active) continue; /* not in this region: no ack owed */
        int64_t c0 = 0;
        if (vitc__stats_on) P->w_t0[tid] = vitc__now_ns(), c0 = vitc__pool_cpu_ns();
        vitc__run_share(fn, ctx, n, tid, active);
        if (vitc__stats_on) {
            P->w_t1[tid] = vitc__now_ns();
            P->w_cpu[tid] = vitc__pool_cpu_ns() - c0 - vitc__stats_wait;
            P->w_wait[tid] = vitc__stats_wait;
            vitc__stats_wait = 0;
        }
        if (atomic_fetch_sub(&P->remaining, 1) == 1 && atomic_load(&P->caller_sleeping)) {
            pthread_mutex_lock(&P->lock);
            pthread_cond_signal(&P->done);
            pthread_mutex_unlock(&P->lock);
        }
    }
}

/* Joins the workers at exit so leak checkers see a clean process. */
__attribute__((destructor)) static void vitc__pool_shutdown(void) {
    vitc__pool *P = &vitc__P;
    if (pthread_mutex_trylock(&P->region_lock) != 0) return; /* a region is running */
    pthread_mutex_lock(&P->lock);
    P->stop = 1;
    pthread_cond_broadcast(&P->wake);
    pthread_mutex_unlock(&P->lock);
    for (int i = 0; i < P->nworkers; i++) pthread_join(P->threads[i], NULL);
    P->nworkers = 0;
    pthread_mutex_unlock(&P->region_lock);
}

/* Creates workers up to want - 1; returns the thread count available. */
static int vitc__ensure_workers(int want) {
    vitc__pool *P = &vitc__P;
    /* After the exit-time shutdown above, regions run serially. Regions can
     * still start then (a destructor that runs later, or a user thread still
     * running while the process exits). Workers created for them would see
     * stop at their first idle sleep (the only place they look) and quit
     * while still counted in nworkers, so the next region would wait on
     * `done` forever for a worker that is gone. */
    if (P->stop) return 1;
    while (P->nworkers < want - 1) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        /* Kernels keep tiles on the stack; glibc's default is 8 MB anyway,
         * this keeps it so under a smaller RLIMIT_STACK. */
        pthread_attr_setstacksize(&attr, 8u << 20);
        P->start_gen[P->nworkers + 1] = atomic_load(&P->gen);
        int rc = pthread_create(&P->threads[P->nworkers], &attr, vitc__worker,
                                (void *)(intptr_t)(P->nworkers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* run with the threads we have */
        P->nworkers++;
    }
    return want < P->nworkers + 1 ? want : P->nworkers + 1;
}

typedef struct {
    vitc__task_fn fn;
    void *ctx;
} vitc__each_ctx;

static void vitc__each(void *c, int64_t b, int64_t e, int tid) {
    const vitc__each_ctx *ec = c;
    for (int64_t i = b; i < e; i++) ec->fn(ec->ctx, i, tid);
}

typedef struct {
    vitc__task_fn fn;
    void *ctx;
    int64_t n, grain;
    _Atomic int64_t next;  /* indices claimed so far */
    _Atomic int64_t front; /* grain 1: the next index from the front */
} vitc__claim_ctx;

/* Once per thread: grains of indices until none is left. With grain 1 the
 * last thread (its range ends the region's; not the only one) takes
 * indices from the back, the others from the front: as balanced, but with
 * two threads each runs the indices nearest its own static share, those
 * whose rows it wrote and reads next (a batch's images, split by rows
 * around the attention: gemm_lp.c). Each claim that finds next < n takes
 * one index, so the front's and the back's never meet. */
static void vitc__claim(void *c, int64_t b, int64_t e, int tid) {
    vitc__claim_ctx *cc = c;
    if (cc->grain == 1 && b > 0 && e == cc->n) {
        for (int64_t k = 0; atomic_fetch_add_explicit(&cc->next, 1, memory_order_relaxed) < cc->n;
             k++)
            cc->fn(cc->ctx, cc->n - 1 - k, tid);
        return;
    }
    for (int64_t i; (i = atomic_fetch_add_explicit(&cc->next, cc->grain, memory_order_relaxed)) < cc->n;) {
        if (cc->grain == 1) i = atomic_fetch_add_explicit(&cc->front, 1, memory_order_relaxed);
        for (int64_t j = i; j < i + cc->grain && j < cc->n; j++) cc->fn(cc->ctx, j, tid);
    }
}

void vitc__parallel_range(int64_t n, vitc__range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (vitc__inside) { /* nested: serial, keeping the outer owner's tid */
        fn(ctx, 0, n, vitc__tid);
        return;
    }
    int nt = vitc__num_threads();
    if (nt > n) nt = (int)n;
    if (nt <= 1) {
        vitc__inside = 1;
        vitc__tid = 0;
        fn(ctx, 0, n, 0);
        vitc__inside = 0;
        return;
    }
    vitc__pool *P = &vitc__P;
    pthread_mutex_lock(&P->region_lock);
    if (vitc__stats_on < 0) vitc__stats_init();
    int64_t st0 = vitc__stats_on ? vitc__now_ns() : 0, st1 = 0;
    int64_t sc0 = vitc__stats_on ? vitc__pool_cpu_ns() : 0, sc1 = 0;
    nt = vitc__ensure_workers(nt);
    atomic_store(&P->caller_sleeping, 0);
    atomic_store(&P->remaining, nt - 1);
    uint64_t g = atomic_load_explicit(&P->gen, memory_order_relaxed);
    atomic_store_explicit(&P->gen, g + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&P->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&P->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&P->n, n, memory_order_relaxed);
    atomic_store_explicit(&P->active, nt, memory_order_relaxed);
    /* Publishing under the lock pairs with the workers' check-then-wait, so
     * a worker about to sleep cannot miss the region. */
    pthread_mutex_lock(&P->lock);
    atomic_store_explicit(&P->gen, g + 2, memory_order_release);
    if (P->sleepers) pthread_cond_broadcast(&P->wake);
    pthread_mutex_unlock(&P->lock);
    vitc__inside = 1;
    vitc__tid = 0;
    vitc__run_share(fn, ctx, n, 0, nt);
    vitc__inside = 0;
    if (vitc__stats_on) st1 = vitc__now_ns(), sc1 = vitc__pool_cpu_ns();
    if (atomic_load(&P->remaining) != 0) {
        int64_t t0 = vitc__now_ns();
        for (int spin = 1; atomic_load_explicit(&P->remaining, memory_order_acquire) != 0; spin++) {
            vitc__cpu_relax();
            if ((spin & 63) == 0 && vitc__now_ns() - t0 > VITC_YIELD_NS) sched_yield();
            if ((spin & 63) == 0 && vitc__now_ns() - t0 > VITC_SPIN_NS) {
                pthread_mutex_lock(&P->lock);
                atomic_store(&P->caller_sleeping, 1);
                while (atomic_load(&P->remaining) != 0) pthread_cond_wait(&P->done, &P->lock);
                pthread_mutex_unlock(&P->lock);
                break;
            }
        }
    }
    if (vitc__stats_on) /* parallel_for's regions by their task function */
        vitc__stats_add(fn == vitc__each    ? (const void *)((const vitc__each_ctx *)ctx)->fn
                        : fn == vitc__claim ? (const void *)((const vitc__claim_ctx *)ctx)->fn
                                            : (const void *)fn,
                        n, nt, st0, st1, vitc__now_ns(), sc0, sc1);
    pthread_mutex_unlock(&P->region_lock);
}

void vitc__pool_prewake(void) {
    vitc__pool *P = &vitc__P;
    if (vitc__inside || vitc__num_threads() < 2) return;
    pthread_mutex_lock(&P->lock);
    if (P->sleepers) {
        P->pokes++;
        pthread_cond_broadcast(&P->wake);
    }
    pthread_mutex_unlock(&P->lock);
}

void vitc__parallel_for(int64_t n, vitc__task_fn fn, void *ctx) {
    vitc__each_ctx ec = {fn, ctx};
    vitc__parallel_range(n, vitc__each, &ec);
}

void vitc__parallel_for_dynamic(int64_t n, int64_t grain, vitc__task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    vitc__claim_ctx cc = {fn, ctx, n, grain, 0, 0};
    /* One range per thread, as many threads as grains at most: each calls
     * vitc__claim once (nested or on one thread: one call claims all). */
    vitc__parallel_range((n + grain - 1) / grain, vitc__claim, &cc);
}

void vitc__chunks_init(vitc__chunks *c, int64_t total, int64_t chunk, int64_t unit, int nparts) {
    int64_t i = 0, b = 0, two = 2 * (int64_t)(nparts > 0 ? nparts : 1);
    if (unit < 1) unit = 1;
    if (chunk < unit) chunk = unit;
    for (; b < total && i < VITC_CHUNKS_MAX; i++) {
        int64_t share = ((total - b + two - 1) / two + unit - 1) / unit * unit;
        c->bound[i] = b;
        b += share < chunk ? share : chunk;
    }
    c->bound[i] = total;
    c->total = total;
    c->chunk = chunk;
    c->guided = b >= total;
    c->n = c->guided ? i : (total + chunk - 1) / chunk;
}

void vitc__coop_init(vitc__coop *co, int64_t total, int64_t nblocks,
                     int64_t (*pack)(void *ctx, int64_t s), void *ctx) {
    atomic_init(&co->next, 0);
    co->total = total;
    co->pack = pack;
    co->ctx = ctx;
    for (int64_t b = 0; b < nblocks && b < VITC_COOP_BLOCKS; b++) atomic_init(&co->done[b], 0);
}

void vitc__coop_need(vitc__coop *co, int64_t block, int64_t n) {
    _Atomic int *done = &co->done[block];
    int64_t w0 = 0, w = 0; /* VITC_POOL_STATS: CPU time spent waiting */
    for (int spin = 0; atomic_load_explicit(done, memory_order_acquire) < n;) {
        if (atomic_load_explicit(&co->next, memory_order_relaxed) < co->total) {
            int64_t s = atomic_fetch_add_explicit(&co->next, 1, memory_order_relaxed);
            if (s < co->total)
                atomic_fetch_add_explicit(&co->done[co->pack(co->ctx, s)], 1, memory_order_release);
        } else {
            if (!w0 && vitc__pool_stats()) w0 = vitc__pool_cpu_ns();
            if (++spin < 4096)
                vitc__cpu_relax();
            else /* the packer may have lost its core (oversubscribed machine) */
                sched_yield();
            w = w0;
        }
    }
    if (w) vitc__pool_note_wait(vitc__pool_cpu_ns() - w);
}
