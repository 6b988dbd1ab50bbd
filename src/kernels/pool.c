/* pool.c — the library's thread pool (serial until the pthread pool lands). */
#include "kernels.h"

static _Thread_local int vitc__inside;
static int vitc__nthreads = 1;

void vitc_set_num_threads(int n) { vitc__nthreads = n > 0 ? n : 1; }
int vitc_get_num_threads(void) { return vitc__nthreads; }
int vitc__num_threads(void) { return vitc__nthreads; }
int vitc__in_parallel(void) { return vitc__inside; }

void vitc__parallel_for(int64_t n, vitc__task_fn fn, void *ctx) {
    int was = vitc__inside;
    vitc__inside = 1;
    for (int64_t i = 0; i < n; i++)
        fn(ctx, i, 0);
    vitc__inside = was;
}
