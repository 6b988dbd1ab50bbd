/*
 * attn_testutil.h — the attention inputs test_attention.c and
 * test_attention_backward.c both build: q, k, v in the separate or timm's
 * fused layout, and the masks both use. Include after "testutil.h" and
 * "kernels/kernels.h".
 */
#ifndef VITC_ATTN_TESTUTIL_H
#define VITC_ATTN_TESTUTIL_H

/* q, k, v of d (B, H, L, S, D, Dv set) from the stream s, values in [-1, 1).
 * fused: one [B, N, 3, H, d] buffer (timm's qkv linear; L == S, D == Dv)
 * into *qkv; else [B, H, N, d] each into *q, *k, *v. The caller frees. */
static inline void atu_make_qkv(vitc__sdpa_desc *d, int fused, float **qkv, float **q, float **k,
                                float **v, uint64_t *s) {
    int64_t B = d->B, H = d->H, L = d->L, S = d->S, D = d->D, Dv = d->Dv;
    if (fused) {
        assert_int_equal(L, S);
        assert_int_equal(D, Dv);
        size_t n = (size_t)(B * L * 3 * H * D);
        *qkv = tu_falloc(n);
        tu_fill(s, *qkv, n, 1.0f);
        d->q = *qkv, d->k = *qkv + H * D, d->v = *qkv + 2 * H * D;
        d->q_sb = d->k_sb = d->v_sb = L * 3 * H * D;
        d->q_sh = d->k_sh = d->v_sh = D;
        d->q_sr = d->k_sr = d->v_sr = 3 * H * D;
    } else {
        *q = tu_falloc((size_t)(B * H * L * D));
        *k = tu_falloc((size_t)(B * H * S * D));
        *v = tu_falloc((size_t)(B * H * S * Dv));
        tu_fill(s, *q, (size_t)(B * H * L * D), 1.0f);
        tu_fill(s, *k, (size_t)(B * H * S * D), 1.0f);
        tu_fill(s, *v, (size_t)(B * H * S * Dv), 1.0f);
        d->q = *q, d->q_sb = H * L * D, d->q_sh = L * D, d->q_sr = D;
        d->k = *k, d->k_sb = H * S * D, d->k_sh = S * D, d->k_sr = D;
        d->v = *v, d->v_sb = H * S * Dv, d->v_sh = S * Dv, d->v_sr = Dv;
    }
}

/* The strides (batch, head, row) of a [B, N, H, d] tensor in the fused
 * layout (timm's, rows of the heads side by side), else of [B, H, N, d]. */
static inline void atu_strides(int fused, int64_t N, int64_t H, int64_t d, int64_t *sb,
                               int64_t *sh, int64_t *sr) {
    *sb = N * H * d;
    *sh = fused ? d : N * d;
    *sr = fused ? H * d : d;
}

enum atu_mask { ATU_MASK_LS, ATU_MASK_B1LS, ATU_MASK_KEYPAD };
enum { ATU_MASK_COUNT = ATU_MASK_KEYPAD + 1 }; /* the tests' own kinds follow */

/* A float mask set on d and returned (the caller frees):
 *   ATU_MASK_LS      [L, S] in [-3, 3), broadcast over b and h
 *   ATU_MASK_B1LS    [B, 1, L, S] in [-3, 3)
 *   ATU_MASK_KEYPAD  [B, 1, 1, S], the last third of the keys -inf (a bool
 *                    key-padding mask as it reaches the kernel) */
static inline float *atu_make_mask(vitc__sdpa_desc *d, enum atu_mask kind, uint64_t *s) {
    int64_t B = d->B, L = d->L, S = d->S;
    float *m = NULL;
    switch (kind) {
    case ATU_MASK_LS:
        m = tu_falloc((size_t)(L * S));
        tu_fill(s, m, (size_t)(L * S), 3.0f);
        d->m_sr = S;
        break;
    case ATU_MASK_B1LS:
        m = tu_falloc((size_t)(B * L * S));
        tu_fill(s, m, (size_t)(B * L * S), 3.0f);
        d->m_sb = L * S, d->m_sr = S;
        break;
    case ATU_MASK_KEYPAD:
        m = tu_falloc((size_t)(B * S));
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < S; j++) m[b * S + j] = j >= S - S / 3 ? -INFINITY : 0.0f;
        d->m_sb = S;
        break;
    }
    d->mask = m;
    return m;
}

#endif /* VITC_ATTN_TESTUTIL_H */
