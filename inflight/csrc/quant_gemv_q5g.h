/* The batch-1 GEMV of q5_0g and q4_0g (quant_kernels.h iflq_q5g_block / iflq_q4g_block: q5_0 / q4_0
 * regrouped at load per 4 blocks), AVX-512 VNNI + BW (included by quant_gemv_q32.h under
 * IFLV_Q32_512BW). Per 4 blocks: one 512-bit load of their quants (each 128-bit lane a block), q5_0's
 * fifth bits as two 64-bit mask loads (elements 0-15 of the four, then 16-31), one f16 load of their d's. The file's layout spent ~11 shuffle-port
 * uops per 4 blocks on inserts, GPR -> mask moves and permutes (iflv_dot_pair: 0.975 ns a block, one
 * core in L2); this 0.683, and from DRAM the read's rate where that was 75-88 % of it (Intel Xeon,
 * benchmarks/csrc/q5_0_groups_probe.c; docs/quant_history.md). */
#ifndef IFL_QUANT_GEMV_Q5G_H
#define IFL_QUANT_GEMV_Q5G_H

#ifndef IFLV_Q5G_PF /* the stream's software prefetch, bytes ahead: q8_0's (Intel 2 KB; Zen none) */
#ifdef IFLV_Q8_PF
#define IFLV_Q5G_PF IFLV_Q8_PF
#else
#define IFLV_Q5G_PF 0
#endif
#endif

/* per 4 blocks of one activation row: [x 0-15 of the 4 blocks | x 16-31] (K bytes, xp) and the lanes
 * -o sum(x) of each block's 4-element groups (xs, K / 8 int32) the dot starts from (o: the format's
 * offset, 16 for q5_0, 8 for q4_0) */
static inline void iflv_grp_acts(int K, const int8_t *xq, int o, int8_t *xp, int32_t *xs) {
    const __m256i ov = _mm256_set1_epi8((char)o);
    for (int b = 0; b + 4 <= K / 32; b += 4) {
        __m256i x[4], lo[2], hi[2];
        for (int k = 0; k < 4; ++k) x[k] = _mm256_loadu_si256((const __m256i *)(xq + 32 * (b + k)));
        for (int h = 0; h < 2; ++h) {
            lo[h] = _mm256_permute2x128_si256(x[2 * h], x[2 * h + 1], 0x20);
            hi[h] = _mm256_permute2x128_si256(x[2 * h], x[2 * h + 1], 0x31);
            const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ov, lo[h]), ov, hi[h]);
            _mm256_storeu_si256((__m256i *)(xs + 4 * b + 8 * h), _mm256_sub_epi32(_mm256_setzero_si256(), s));
        }
        _mm256_storeu_si256((__m256i *)(xp + 32 * b), lo[0]);
        _mm256_storeu_si256((__m256i *)(xp + 32 * b + 32), lo[1]);
        _mm256_storeu_si256((__m256i *)(xp + 32 * b + 64), hi[0]);
        _mm256_storeu_si256((__m256i *)(xp + 32 * b + 96), hi[1]);
    }
}

/* Row n . one activation row (xp, xs of iflv_grp_acts), as 8 lanes to be summed */
static inline __attribute__((always_inline)) __m256 iflv_grp_row(const QWeight *w, int n, const int8_t *xp,
                                                                 const int32_t *xs, const float *dx, const int five) {
    const int nb = w->K / 32;
    const size_t bb = five ? 22 : 18, at_d = five ? 80 : 64; /* a block's bytes; the d's in a group */
    const uint8_t *row = w->data + (size_t)n * bb * nb;
    const __m512i low = _mm512_set1_epi8(0xF), b16 = _mm512_set1_epi8(0x10);
    const __m512i fsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 4) {
        const uint8_t *g = row + (size_t)b * bb;
        if (IFLV_Q5G_PF) {
            _mm_prefetch((const char *)g + IFLV_Q5G_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)g + IFLV_Q5G_PF + 64, _MM_HINT_T0);
        }
        if (IFLV_PF2) {
            _mm_prefetch((const char *)g + IFLV_PF2, _MM_HINT_T1);
            _mm_prefetch((const char *)g + IFLV_PF2 + 64, _MM_HINT_T1);
        }
        const __m512i v = _mm512_loadu_si512((const void *)g);
        __m512i qa = _mm512_and_si512(v, low), qc = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        if (five) { /* | (fifth bit ? 16 : 0): the unsigned q (0..31) */
            uint64_t ka, kc;
            memcpy(&ka, g + 64, 8);
            memcpy(&kc, g + 72, 8);
            qa = _mm512_ternarylogic_epi32(v, _mm512_maskz_mov_epi8(_cvtu64_mask64(ka), b16), low, 0xEC);
            qc = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), _mm512_maskz_mov_epi8(_cvtu64_mask64(kc), b16), low, 0xEC);
        }
        __m512i p = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(xs + 4 * b)), qa,
                                        _mm512_loadu_si512((const void *)(xp + 32 * b)));
        p = _mm512_dpbusd_epi32(p, qc, _mm512_loadu_si512((const void *)(xp + 32 * b + 64)));
        const __m128 f = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + at_d))), _mm_loadu_ps(dx + b));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(fsel, _mm512_castps128_ps512(f)), acc);
    }
    return _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

/* out[r] = row n0 + r . one activation row, r < nt; each 8 rows' sums in one reduction, padded with
 * zero rows (a row's float order does not depend on its call's rows) */
static inline __attribute__((always_inline)) void iflv_grp_range(const QWeight *w, int n0, int nt, const int8_t *xq,
                                                                 const float *dx, float *out, const int five) {
    int8_t xp[w->K]; /* K bytes of stack */
    int32_t xs[w->K / 8];
    iflv_grp_acts(w->K, xq, five ? 16 : 8, xp, xs);
    for (int c = 0; c < nt; c += 8) {
        const int cn = nt - c < 8 ? nt - c : 8;
        __m256 v[8];
        for (int r = 0; r < 8; ++r) v[r] = r < cn ? iflv_grp_row(w, n0 + c + r, xp, xs, dx, five) : _mm256_setzero_ps();
        float s[8];
        _mm256_storeu_ps(s, iflv_hsum8(v));
        memcpy(out + c, s, sizeof(float) * (size_t)cn);
    }
}
static __attribute__((noinline)) void iflv_q5g_range(const QWeight *w, int n0, int nt, const int8_t *xq, const float *dx,
                                                     float *out) {
    iflv_grp_range(w, n0, nt, xq, dx, out, 1);
}
static __attribute__((noinline)) void iflv_q4g_range(const QWeight *w, int n0, int nt, const int8_t *xq, const float *dx,
                                                     float *out) {
    iflv_grp_range(w, n0, nt, xq, dx, out, 0);
}

#endif
