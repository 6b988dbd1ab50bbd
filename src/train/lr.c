/*
 * lr.c — learning-rate schedules as pure functions of the step, so a
 * resumed run needs only the step count: linear warmup + cosine, and
 * torch's OneCycleLR (its get_lr(), phase table and annealing functions).
 */
#include <math.h>

#include "train.h"

static const double PI = 3.14159265358979323846;

vitc_status vitc_lr_warmup_cosine(int64_t step, int64_t warmup_steps, int64_t total_steps,
                                  double base_lr, double min_lr, double *lr) {
    if (!lr)
        return vitc__err(VITC_ERR_INVALID_ARG, "warmup_cosine: lr is NULL");
    if (step < 0 || warmup_steps < 0 || total_steps <= warmup_steps)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "warmup_cosine: need step >= 0 and 0 <= warmup_steps < total_steps "
                         "(step %lld, warmup_steps %lld, total_steps %lld)",
                         (long long)step, (long long)warmup_steps, (long long)total_steps);
    if (!(base_lr >= 0.0 && min_lr >= 0.0))
        return vitc__err(VITC_ERR_INVALID_ARG, "warmup_cosine: base_lr %g and min_lr %g must be >= 0",
                         base_lr, min_lr);
    if (step < warmup_steps)
        *lr = base_lr * (double)(step + 1) / (double)warmup_steps;
    else if (step >= total_steps)
        *lr = min_lr;
    else
        *lr = min_lr + (base_lr - min_lr) *
                           (1.0 + cos(PI * (double)(step - warmup_steps) /
                                      (double)(total_steps - warmup_steps))) / 2.0;
    return VITC_OK;
}

vitc_onecycle_config vitc_onecycle_default_config(double max_lr, int64_t total_steps) {
    vitc_onecycle_config c = {max_lr, total_steps, 0.3, 0, 25.0, 1e4, 0, 1, 0.85, 0.95};
    return c;
}

/* torch's _annealing_cos and _annealing_linear. */
static double anneal(int linear, double start, double end, double pct) {
    if (linear)
        return (end - start) * pct + start;
    return end + (start - end) / 2.0 * (cos(PI * pct) + 1.0);
}

vitc_status vitc_lr_onecycle(const vitc_onecycle_config *c, int64_t step, double *lr,
                             double *momentum) {
    if (!c || !lr)
        return vitc__err(VITC_ERR_INVALID_ARG, "onecycle: config and lr must not be NULL");
    if (c->total_steps <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "onecycle: expected positive total_steps, got %lld",
                         (long long)c->total_steps);
    if (!(c->pct_start >= 0.0 && c->pct_start <= 1.0))
        return vitc__err(VITC_ERR_INVALID_ARG, "onecycle: expected pct_start in [0, 1], got %g",
                         c->pct_start);
    if (!(c->max_lr >= 0.0 && c->div_factor > 0.0 && c->final_div_factor > 0.0))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "onecycle: need max_lr >= 0 and positive div_factor, final_div_factor");
    if (step < 0 || step > c->total_steps)
        /* torch: "Tried to step {} times. The specified number of total steps is {}" */
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "onecycle: tried to step %lld times; the specified number of total steps is %lld",
                         (long long)step + 1, (long long)c->total_steps);
    const double T = (double)c->total_steps;
    const double initial = c->max_lr / c->div_factor, min_lr = initial / c->final_div_factor;
    /* torch's _schedule_phases: {end_step, start_lr, end_lr, start_mom, end_mom}. */
    double ph[3][5];
    int nph;
    if (c->three_phase) {
        nph = 3;
        double p0[5] = {c->pct_start * T - 1.0, initial, c->max_lr, c->max_momentum, c->base_momentum};
        double p1[5] = {2.0 * c->pct_start * T - 2.0, c->max_lr, initial, c->base_momentum,
                        c->max_momentum};
        double p2[5] = {T - 1.0, initial, min_lr, c->max_momentum, c->max_momentum};
        for (int j = 0; j < 5; j++)
            ph[0][j] = p0[j], ph[1][j] = p1[j], ph[2][j] = p2[j];
    } else {
        nph = 2;
        double p0[5] = {c->pct_start * T - 1.0, initial, c->max_lr, c->max_momentum, c->base_momentum};
        double p1[5] = {T - 1.0, c->max_lr, min_lr, c->base_momentum, c->max_momentum};
        for (int j = 0; j < 5; j++)
            ph[0][j] = p0[j], ph[1][j] = p1[j];
    }
    const double s = (double)step;
    double start = 0.0;
    for (int i = 0; i < nph; i++) {
        const double end = ph[i][0];
        if (s <= end || i == nph - 1) {
            /* A phase of zero length divides by zero in torch too (ZeroDivisionError). */
            if (end == start)
                return vitc__err(VITC_ERR_INVALID_ARG,
                                 "onecycle: phase %d has zero length (total_steps %lld, pct_start %g)",
                                 i, (long long)c->total_steps, c->pct_start);
            const double pct = (s - start) / (end - start);
            *lr = anneal(c->anneal_linear, ph[i][1], ph[i][2], pct);
            if (c->cycle_momentum && momentum)
                *momentum = anneal(c->anneal_linear, ph[i][3], ph[i][4], pct);
            break;
        }
        start = end;
    }
    return VITC_OK;
}
