/* The decode step's attention (decode_kernel.c's attend()) with its chains of dependent float32
 * operations run across vector lanes, each lane doing one score's or one output's operations in
 * the scalar code's order: the same bits (tests/model/test_decode_kernel_bits.py).
 *
 * Scores: dot_q's order is lane l (l < 16) accumulating q[i] k[i] over i = l, l + 16, ... (a fused
 * multiply-add each: GCC contracts dot_q's `lane[l] += q * k` at -mfma), then s = 0 + lane[0] +
 * ... + lane[15] in that order, then s * scale. dot_q pays that sum as 16 dependent adds a score
 * (~64 cycles, Zen 4; ~27 k scores a thread a step on Qwen2.5-0.5B). Here ATT_PW positions run at
 * once: their K rows are transposed (att_columns: kt[d * ATT_PW + j] = row j's element d), once for
 * the key head's G query heads, and each of a score's adds is one lane of a vector add. With one or
 * two query heads a call (the several-row path: a task a query head) the rows' lane vectors are
 * transposed instead (att_scores_rows), per head: hot, 24 calls of 150 positions, one head,
 * Zen 4: float32 0.075 (dot_q) / 0.068 (K transposed) / 0.052 ms, bf16 0.06 / 0.06 / 0.036.
 * P.V: `o[g][i] += pr * v[i]` position after position kept in registers, two heads a pass
 * (att_pv), not a load and a store of o a position.
 * AVX-512 and AVX2 + FMA builds (ATT_VEC); the portable build keeps the scalar loops. Needs
 * hd % 16 == 0 (attend() keeps dot_q otherwise), st_t, LD and IFL_STORAGE_BF16. */
#ifndef IFL_ATTEND_VEC_H
#define IFL_ATTEND_VEC_H
#if defined(__AVX512F__) || defined(IFLQ_AVX2)
#define ATT_VEC 1

#if defined(__AVX512F__)
#define ATT_VL 16
typedef __m512 att_v;
#define ATT_ZERO() _mm512_setzero_ps()
#define ATT_SET1(x) _mm512_set1_ps(x)
#define ATT_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ATT_ADD(a, b) _mm512_add_ps(a, b)
#define ATT_MUL(a, b) _mm512_mul_ps(a, b)
#define ATT_MAX(a, b) _mm512_max_ps(a, b) /* a > b ? a : b, lane by lane: `if (s > mx) mx = s` */
#define ATT_LOAD(p) _mm512_load_ps(p)
#define ATT_LOADU(p) _mm512_loadu_ps(p)
#define ATT_STORE(p, a) _mm512_storeu_ps(p, a)
/* 16 elements of a row from c, as floats */
static inline __m512 att_row(const st_t *row, int c) {
#if IFL_STORAGE_BF16
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + c))), 16));
#else
    return _mm512_loadu_ps(row + c);
#endif
}
#else
#define ATT_VL 8
typedef __m256 att_v;
#define ATT_ZERO() _mm256_setzero_ps()
#define ATT_SET1(x) _mm256_set1_ps(x)
#define ATT_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ATT_ADD(a, b) _mm256_add_ps(a, b)
#define ATT_MUL(a, b) _mm256_mul_ps(a, b)
#define ATT_MAX(a, b) _mm256_max_ps(a, b)
#define ATT_LOAD(p) _mm256_load_ps(p)
#define ATT_LOADU(p) _mm256_loadu_ps(p)
#define ATT_STORE(p, a) _mm256_storeu_ps(p, a)
static inline __m256 att_row(const st_t *row, int c) {
#if IFL_STORAGE_BF16
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + c))), 16));
#else
    return _mm256_loadu_ps(row + c);
#endif
}
#endif
#define ATT_PW ATT_VL /* positions a pass: a vector's lanes */
/* K / V rows asked for ahead of their use (-DIFL_ATT_PF=0: not), a few lines at a time between the
 * arithmetic rather than a pass's 128 lines at once (which stalled on the full miss buffers): the
 * step's GEMVs between two layers evict them (525 MB a 0.5B Q8_0 step) and blocks lie anywhere
 * (no hardware stream across them). 0.5B Q8_0 step, 2 threads, Zen 4 (stream_ab.py): attention
 * 0.62 ms a thread without, 0.59 a pass ahead at once, 0.53 spread. */
#ifndef IFL_ATT_PF
#define IFL_ATT_PF 1
#endif
#define ATT_PF_AHEAD 6 /* P.V: V rows this many positions ahead */
/* the lines of a row of n elements */
static inline void att_prefetch(const st_t *row, int n) {
    for (size_t b = 0; b < n * sizeof(st_t); b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

/* r[l] lane j = r[j] lane l before (an ATT_VL x ATT_VL transpose) */
static inline void att_transpose(att_v r[ATT_VL]) {
    att_v t[ATT_VL];
#if defined(__AVX512F__)
    for (int k = 0; k < 8; ++k) { /* per 128-bit lane L (columns 4L .. 4L+3): rows 2k, 2k+1 interleaved */
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) { /* r[4k + m], lane L: column 4L + m of rows 4k .. 4k+3 */
        const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]);
        const __m512d e = _mm512_castps_pd(t[4 * k + 2]), f = _mm512_castps_pd(t[4 * k + 3]);
        r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, e));
        r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, e));
        r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, f));
        r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, f));
    }
    for (int m = 0; m < 4; ++m) { /* the 4 x 4 128-bit lanes of r[m], r[4 + m], r[8 + m], r[12 + m] */
        const __m512 v0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44), v1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xee);
        const __m512 v2 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44), v3 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xee);
        t[m] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        t[4 + m] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        t[8 + m] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        t[12 + m] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
#else
    for (int k = 0; k < 4; ++k) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; ++k) {
        const __m256d a = _mm256_castps_pd(t[4 * k]), b = _mm256_castps_pd(t[4 * k + 1]);
        const __m256d e = _mm256_castps_pd(t[4 * k + 2]), f = _mm256_castps_pd(t[4 * k + 3]);
        r[4 * k] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, e));
        r[4 * k + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, e));
        r[4 * k + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, f));
        r[4 * k + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, f));
    }
    for (int m = 0; m < 4; ++m) {
        t[m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x20);
        t[4 + m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x31);
    }
#endif
    for (int l = 0; l < ATT_VL; ++l) r[l] = t[l];
}

/* kt[d * ATT_PW + j] = LD(rows[j][d]), d < hd */
static inline void att_columns(const st_t *const rows[ATT_PW], int hd, float *kt) {
    for (int c = 0; c < hd; c += ATT_VL) {
        att_v r[ATT_VL];
        for (int j = 0; j < ATT_VL; ++j) r[j] = att_row(rows[j], c);
        att_transpose(r);
        for (int l = 0; l < ATT_VL; ++l) ATT_STORE(kt + (size_t)(c + l) * ATT_PW, r[l]);
    }
}

/* s[j] = q . (K row j) * scale for the ATT_PW rows, in dot_q's order without transposing K: per
 * half of the 16 lanes (AVX2: two; AVX-512: one) each row's lane vector accumulated over the
 * row, the ATT_PW vectors transposed, then added lane after lane. Fewer operations than
 * att_columns + att_scores for one or two query heads a key head (the several-row path), where
 * the transposed K rows are not shared. */
#ifndef IFL_ATT_ROWS_MAX
#define IFL_ATT_ROWS_MAX 2 /* query heads a call up to which att_scores_rows runs (7: K transposed, bf16 0.16 vs 0.20 ms) */
#endif
static inline att_v att_scores_rows(const float *q, const st_t *const rows[ATT_PW], int hd, float scale) {
    att_v sum = ATT_ZERO();
    for (int h = 0; h < 16; h += ATT_VL) {
        att_v acc[ATT_PW];
        for (int j = 0; j < ATT_PW; ++j) acc[j] = ATT_ZERO();
        for (int i = h; i < hd; i += 16) {
            const att_v qv = ATT_LOADU(q + i);
            for (int j = 0; j < ATT_PW; ++j) acc[j] = ATT_FMA(qv, att_row(rows[j], i), acc[j]);
        }
        att_transpose(acc);
        for (int l = 0; l < ATT_VL; ++l) sum = ATT_ADD(sum, acc[l]);
    }
    return ATT_MUL(sum, ATT_SET1(scale));
}

/* s[j] = q . (K row j) * scale for the ATT_PW rows of kt (64-aligned), each in dot_q's order: lanes
 * 0-7 accumulated, then 8-15 (8 independent FMA chains: AVX2's 16 registers hold them) */
static inline att_v att_scores(const float *q, const float *kt, int hd, float scale) {
    att_v sum = ATT_ZERO();
    for (int h = 0; h < 16; h += 8) {
        att_v acc[8];
        for (int l = 0; l < 8; ++l) acc[l] = ATT_ZERO();
        for (int i = h; i < hd; i += 16)
            for (int l = 0; l < 8; ++l) acc[l] = ATT_FMA(ATT_SET1(q[i + l]), ATT_LOAD(kt + (size_t)(i + l) * ATT_PW), acc[l]);
        for (int l = 0; l < 8; ++l) sum = ATT_ADD(sum, acc[l]);
    }
    return ATT_MUL(sum, ATT_SET1(scale));
}

/* scores (nh rows of n = len - start) = q (nh x hd) . K * scale over positions start .. len - 1 of
 * the block table row, ATT_PW a pass; mx[g] = max(mx[g], row g's scores). A full pass's scores are
 * stored and maxed as one vector (the scalar store and compare were ~13 % of the attention, hot,
 * 2048 positions); a lane takes a score where `s > mx` would, and the lanes then meet in the same
 * comparison: the same maximum (up to a zero's sign, which no e^(s - mx) sees) */
static void att_scores_heads(const float *q, int nh, int hd, float scale, const st_t *K, const int64_t *row, int bs,
                             int start, int len, float *scores, float *mx) {
    float kt[hd * ATT_PW] __attribute__((aligned(64))), s[ATT_PW];
    const st_t *rows[ATT_PW];
    att_v mxv[nh];
    const int n = len - start;
    for (int g = 0; g < nh; ++g) mxv[g] = ATT_SET1(-INFINITY);
    for (int p = start; p < len; p += ATT_PW) {
        const int cnt = len - p < ATT_PW ? len - p : ATT_PW;
        for (int j = 0; j < ATT_PW; ++j) { /* a short pass repeats its first row */
            const int at = p + (j < cnt ? j : 0);
            rows[j] = K + ((long)row[at / bs] * bs + at % bs) * hd;
        }
        const int by_rows = nh <= IFL_ATT_ROWS_MAX;
        if (!by_rows) att_columns(rows, hd, kt);
        for (int g = 0; g < nh; ++g) {
#if IFL_ATT_PF
            for (int at = p + ATT_PW + g; at < p + 2 * ATT_PW && at < len; at += nh) /* the next pass's K rows */
                att_prefetch(K + ((long)row[at / bs] * bs + at % bs) * hd, hd);
#endif
            const att_v sv = by_rows ? att_scores_rows(q + (size_t)g * hd, rows, hd, scale)
                                     : att_scores(q + (size_t)g * hd, kt, hd, scale);
            float *out = scores + (size_t)g * n + p - start;
            if (cnt == ATT_PW) {
                ATT_STORE(out, sv);
                mxv[g] = ATT_MAX(sv, mxv[g]);
                continue;
            }
            ATT_STORE(s, sv);
            for (int j = 0; j < cnt; ++j) {
                out[j] = s[j];
                if (s[j] > mx[g]) mx[g] = s[j];
            }
        }
    }
    for (int g = 0; g < nh; ++g) {
        ATT_STORE(s, mxv[g]);
        for (int j = 0; j < ATT_PW; ++j)
            if (s[j] > mx[g]) mx[g] = s[j];
    }
}

/* x[i] = R(x[i]), i < n: decode_kernel.c's f2bf rounding (NaN included) in a loop GCC vectorises */
static inline void att_round(float *x, int n) {
#if IFL_STORAGE_BF16
    for (int i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        const uint32_t even = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, nan = (u & 0xffff0000u) | 0x400000u;
        u = (u & 0x7fffffffu) > 0x7f800000u ? nan : even;
        memcpy(x + i, &u, 4);
    }
#else
    (void)x, (void)n;
#endif
}

#include "attend_pv.h" /* P.V: att_pv_heads */
#endif
#endif
