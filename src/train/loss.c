/*
 * loss.c — cross-entropy with label smoothing, torch's definition
 * (F.cross_entropy, mean reduction), forward and gradient in one pass.
 */
#include <math.h>

#include "train.h"

vitc_status vitc_cross_entropy(const float *logits /* [B, C] */, const int64_t *labels /* [B] */,
                               int64_t B, int64_t C, float label_smoothing, float *loss,
                               float *dlogits /* [B, C] or NULL */) {
    if (!logits || !labels || !loss)
        return vitc__err(VITC_ERR_INVALID_ARG, "cross_entropy: logits, labels and loss must not be NULL");
    if (B < 1 || C < 1)
        return vitc__err(VITC_ERR_SHAPE, "cross_entropy: logits [%lld, %lld]: B and C must be >= 1",
                         (long long)B, (long long)C);
    size_t bc;
    if (!vitc__mul_size((size_t)B, (size_t)C, &bc) || bc > ((size_t)1 << 50))
        return vitc__err(VITC_ERR_NOMEM, "cross_entropy: logits [%lld, %lld] is too large",
                         (long long)B, (long long)C);
    if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "cross_entropy: label_smoothing %g is not in [0, 1]", (double)label_smoothing);
    /* Validate every label before writing anything. */
    for (int64_t b = 0; b < B; b++)
        if (labels[b] < 0 || labels[b] >= C)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "cross_entropy: labels[%lld] = %lld is not a class index in [0, %lld)",
                             (long long)b, (long long)labels[b], (long long)C);
    const double eps = label_smoothing, invB = 1.0 / (double)B, invC = 1.0 / (double)C;
    double total = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + b * C;
        double mx = -INFINITY, sumx = 0.0;
        for (int64_t c = 0; c < C; c++) {
            mx = x[c] > mx ? x[c] : mx;
            sumx += x[c];
        }
        double se = 0.0;
        for (int64_t c = 0; c < C; c++)
            se += exp((double)x[c] - mx);
        const double lse = mx + log(se);
        /* -log p_y and the mean over classes of -log p_c = lse - mean(x). */
        const double nll = lse - (double)x[labels[b]];
        double row = (1.0 - eps) * nll;
        if (eps > 0.0) /* torch skips the term: 0 * inf from a -inf logit is not NaN */
            row += eps * (lse - sumx * invC);
        total += row;
        if (dlogits) {
            float *d = dlogits + b * C;
            for (int64_t c = 0; c < C; c++) {
                double g = exp((double)x[c] - lse) - eps * invC;
                if (c == labels[b])
                    g -= 1.0 - eps;
                d[c] = (float)(g * invB);
            }
        }
    }
    *loss = (float)(total * invB);
    return VITC_OK;
}
