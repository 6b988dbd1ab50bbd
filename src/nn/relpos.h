/*
 * relpos.h — SAM's decomposed relative positions (ViT-det attention): the
 * per-query row and column terms the fused attention adds to its scores
 * (vitc__sdpa_desc.rel_h / rel_w), computed from q and the position
 * tables, with their backward into q and the tables (relpos.c).
 *
 * For a query at grid position (qh, qw) of a gh x gw grid and a key at
 * (kh, kw) of the same grid:
 *   score += q . Rh[qh - kh + gh - 1] + q . Rw[qw - kw + gw - 1]
 * with Rh [2gh-1, D], Rw [2gw-1, D] the layer's tables (shared by every
 * head and image) resampled to 2g-1 rows when stored at another length.
 * q is the unscaled query (segment-anything's add_decomposed_rel_pos).
 */
#ifndef VITC_NN_RELPOS_H
#define VITC_NN_RELPOS_H

#include "../internal.h"
#include "../kernels/kernels.h"

typedef struct vitc__nn_relpos {
    int64_t B, H, gh, gw, D; /* L = gh * gw query rows and keys per head */
    const float *q; int64_t q_sb, q_sh, q_sr;  /* [B,H,L,D] */
    const float *tab_h, *tab_w;                /* [2gh-1, D], [2gw-1, D] (resampled) */
    float *rel_h; int64_t rh_sb, rh_sh, rh_sr; /* [B,H,L,gh] */
    float *rel_w; int64_t rw_sb, rw_sh, rw_sr; /* [B,H,L,gw] */
} vitc__nn_relpos;

/* table [T, D] resampled to n rows into out [n, D]: torch's
 * F.interpolate(mode="linear", align_corners=False) along the rows, as
 * segment-anything's get_rel_pos does (a copy when T == n). */
vitc_status vitc__nn_relpos_resample(float *out /* [n, D] */, const float *table /* [T, D] */,
                                     int64_t T, int64_t n, int64_t D);
/* Its backward: dtable [T, D] += the adjoint of the resampling of dout. */
vitc_status vitc__nn_relpos_resample_backward(float *dtable /* [T, D] */,
                                              const float *dout /* [n, D] */, int64_t T,
                                              int64_t n, int64_t D);

/* p->rel_h, p->rel_w from p->q and the tables. */
vitc_status vitc__nn_relpos_forward(const vitc__nn_relpos *p);
/* The fused attention's view of p's terms: sd->rel_h, rel_w, kh, kw. */
void vitc__nn_relpos_view(const vitc__nn_relpos *p, vitc__sdpa_desc *sd);
/* Given the gradients of rel_h and rel_w (drel_h, drel_w laid out as
 * p->rel_h, p->rel_w: the attention backward's vitc__sdpa_rel_grad):
 * dq [B,H,L,D] += their part through q (dq_* strides), and dtab_h
 * [2gh-1, D], dtab_w [2gw-1, D] += theirs (either may be NULL). */
vitc_status vitc__nn_relpos_backward(const vitc__nn_relpos *p, const float *drel_h,
                                     const float *drel_w, float *dq, int64_t dq_sb,
                                     int64_t dq_sh, int64_t dq_sr, float *dtab_h, float *dtab_w);

#endif
