/* inflight quantized GEMM, AVX-512 VNNI: 8 weight rows per vector, integer sums per block.
 * Included by quant_gemm.h. The scheme of quant_kernels.h (int8 activations per 32, weights as
 * w = ws * q + wm with unsigned q) in another layout:
 *  - a group of 8 weight rows is unpacked interleaved: per 32-element block, 8 vectors whose lane
 *    r holds 4 consecutive q of row r (a 8 x 4-byte transpose), then the rows' scales (and float
 *    offsets) as one vector per block (per 16 elements: two);
 *  - per activation row and block, 8 vpdpbusd with the activation's 4 bytes broadcast from memory
 *    sum the whole block in int32 for all 8 rows at once, then one conversion, one scale product
 *    and one FMA: 11 vector ops per 256 products (the 4 x 4 tile of quant_gemm.h: 32);
 *  - offsets that are a constant multiple of the scale (wm = -c ws: q8_0 / i8c re-based by 128,
 *    q4_0 8, q5_0 16, q6_k 32) start the int32 sum at -c * sum(x) instead (no float work);
 *    the others (q4_1, q5_1, q4_k, q5_k, i4g with zeros) add wm . xb in one FMA per block.
 * The 8 outputs of a group are 8 adjacent floats of y: stored as one vector, no horizontal sums.
 */
#ifndef IFL_QUANT_GEMM_GROUPS_H
#define IFL_QUANT_GEMM_GROUPS_H
#ifdef IFLQ_AVX2

#ifdef IFLQ_VNNI
#define IFLV_RN 4 /* activation rows per microkernel: 4 float + 8 int accumulators, 8 weight vectors */
/* s + the 4-byte dots of u (unsigned) and x (signed) in each int32 lane */
#define IFLV_DOT(s, u, x) _mm256_dpbusd_epi32((s), (u), (x))
#else
#define IFLV_RN 2 /* AVX2's 16 registers: 8 weight vectors, 4 int + 2 float accumulators */
/* maddubs + madd: exact for q < 128 (pairs of 127 * 127 fit int16); signed layouts do not come here */
#define IFLV_DOT(s, u, x) _mm256_add_epi32((s), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (x)), _mm256_set1_epi16(1)))
#endif

/* One group's unpacked layout: wq [nb][8 k4][8 rows] uint32, sc [nb][H][8], of [nb][H][8] (H = 1
 * per 32, 2 per 16). Bytes of one group: */
static inline size_t iflv_group_bytes(int K) { return (size_t)K * 8 + (size_t)(K / 16) * 8 * 4 * 2; }

/* The offset constant c of a layout whose wm = -c ws (after re-basing signed q by 128), else 0. */
static inline int iflv_const_offset(int qtype) {
    switch (qtype) {
    case QT_Q8_0: case QT_I8C: return 128;
    case QT_Q4_0: return 8;
    case QT_Q5_0: return 16;
    case QT_Q6_K: return 32;
    default: return 0;
    }
}

/* 8 x 8 uint32 transpose: in[r][c] -> out[c][r] (out rows 32 bytes apart). */
static inline void iflv_transpose8(const __m256i in[8], __m256i *out) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)
        for (int h = 0; h < 2; ++h) {
            u[4 * i + h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + 2 + h]);
            u[4 * i + 2 + h] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + 2 + h]);
        }
    /* u[0..3]: rows 0-3 of columns (0,4) (2,6) (1,5) (3,7) in their two 128-bit halves; u[4..7] rows 4-7 */
    const int col[4] = {0, 2, 1, 3};
    for (int c = 0; c < 4; ++c) {
        out[col[c]] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        out[col[c] + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

/* Rows [n0, n0 + nr) (nr <= 8; missing rows are zeros) into a group at g. rows: 8 row-major
 * unpacked rows of scratch (iflv_rows_bytes). */
static inline size_t iflv_rows_bytes(int K) { return 8 * ((size_t)K + (size_t)K / 16 * 8); }

/* q8_0 / q4_0 / q5_0 / q4_1 / q5_1 (one f16 scale per 32; q4_1 / q5_1 an f16 offset m per 32 too,
 * the others a constant multiple of the scale): each block of the 8 rows decoded in registers and
 * transposed, no row scratch (the row-wise unpack + transpose cost ~25 % of a 32-row GEMM).
 * Returns 0 for the other layouts. */
static int iflv_unpack_group_legacy(const QWeight *w, int n0, int nr, uint8_t *g) {
    const int qt = w->qtype, K = w->K, nb = K / 32;
    if (qt != QT_Q8_0 && qt != QT_Q4_0 && qt != QT_Q5_0 && qt != QT_Q4_1 && qt != QT_Q5_1) return 0;
    const int has_m = qt == QT_Q4_1 || qt == QT_Q5_1, five = qt == QT_Q5_0 || qt == QT_Q5_1;
    const size_t bb = iflq_row_bytes(qt, 32), rb = (size_t)nb * bb;
    float *sc = (float *)(g + (size_t)K * 8), *of = sc + (size_t)nb * 8;
    const uint8_t *base = w->data + (size_t)n0 * rb;
    for (int b = 0; b < nb; ++b) {
        __m256i in[8];
        for (int r = 0; r < 8; ++r) {
            if (r >= nr) {
                in[r] = qt == QT_Q8_0 ? _mm256_set1_epi8((char)0x80) : _mm256_setzero_si256();
                sc[(size_t)b * 8 + r] = 0.f;
                if (has_m) of[(size_t)b * 8 + r] = 0.f;
                continue;
            }
            const uint8_t *blk = base + (size_t)r * rb + (size_t)b * bb;
            uint16_t h;
            memcpy(&h, blk, 2);
            sc[(size_t)b * 8 + r] = iflq_h2f(h);
            if (qt == QT_Q8_0) {
                in[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
                continue;
            }
            if (has_m) {
                memcpy(&h, blk + 2, 2);
                of[(size_t)b * 8 + r] = iflq_h2f(h);
            }
            const uint8_t *qs = blk + 2 + 2 * has_m;
            if (five) {
                uint32_t qh;
                memcpy(&qh, qs, 4);
                in[r] = _mm256_or_si256(iflq_nibbles16(qs + 4), iflq_bits32(qh));
            } else {
                in[r] = iflq_nibbles16(qs);
            }
        }
        iflv_transpose8(in, (__m256i *)g + (size_t)b * 8);
    }
    return 1;
}

#include "quant_gemm_kgroups.h"

static void iflv_unpack_group(const QWeight *w, int n0, int nr, int per32, uint8_t *g, uint8_t *rows) {
    const int K = w->K, nb = K / 32, H = per32 ? 1 : 2, ns = K / 16;
    float *sc = (float *)(g + (size_t)K * 8), *of = sc + (size_t)nb * H * 8;
    float *ws = (float *)(rows + (size_t)8 * K), *wm = ws + (size_t)8 * ns;
#ifdef IFLQ_VNNI
    const int flip = iflq_signed(w->qtype);
#else
    const int flip = 0; /* AVX2 takes signed layouts to quant_gemm.h's tiles */
#endif
    for (int r = 0; r < 8; ++r) {
        uint8_t *row = rows + (size_t)r * K;
        if (r >= nr) {
            memset(row, flip ? 0x80 : 0, (size_t)K);
            memset(ws + (size_t)r * ns, 0, sizeof(float) * (size_t)ns);
            memset(wm + (size_t)r * ns, 0, sizeof(float) * (size_t)ns);
            continue;
        }
        iflq_unpack_row(w, n0 + r, row, ws + (size_t)r * ns, wm + (size_t)r * ns);
        if (flip) /* q + 128: unsigned for vpdpbusd; the constant offset takes the 128 back */
            for (int k = 0; k < K; k += 32)
                _mm256_storeu_si256((__m256i *)(row + k), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + k)),
                                                                           _mm256_set1_epi8((char)0x80)));
    }
    for (int b = 0; b < nb; ++b) { /* block b: 8 rows x 8 groups of 4 bytes -> 8 groups x 8 rows */
        __m256i in[8];
        for (int r = 0; r < 8; ++r) in[r] = _mm256_loadu_si256((const __m256i *)(rows + (size_t)r * K + 32 * b));
        iflv_transpose8(in, (__m256i *)g + (size_t)b * 8);
        for (int h = 0; h < H; ++h)
            for (int r = 0; r < 8; ++r) {
                sc[((size_t)b * H + h) * 8 + r] = ws[(size_t)r * ns + 2 * b + h];
                of[((size_t)b * H + h) * 8 + r] = wm[(size_t)r * ns + 2 * b + h];
            }
    }
}

/* y[j][0..8) = the group's 8 rows . activation rows m0..m0+RN; a->xs16 / xs32 hold -c sum(x) for a
 * constant offset c (quant_gemm.h, iflg_act_sums), FOFS: float offsets instead. */
static inline __attribute__((always_inline)) void iflv_kernel(const uint8_t *g, const IflgAct *a, int m0, int K,
                                                              const int RN, const int PER32, const int FOFS,
                                                              __m256 out[IFLV_RN]) {
    const int nb = K / 32, ns = K / 16, H = PER32 ? 1 : 2;
    const __m256i *wq = (const __m256i *)g;
    const float *sc = (const float *)(g + (size_t)K * 8), *of = sc + (size_t)nb * H * 8;
    __m256 acc[IFLV_RN];
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i wv[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) wv[k] = _mm256_load_si256(wq + (size_t)b * 8 + k);
        /* int sums in two chains per activation row (elements 0-15, 16-31), k outer: 2 RN independent
         * vpdpbusd chains of 4 interleave (one chain of 8 per row waited on its latency: 168 vs 181
         * GFLOP/s at 32 rows, 184 vs 218 at 512); each starts at -c sum(x) of its half, or 0 */
        __m256i s[IFLV_RN][2];
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) {
            const size_t m = (size_t)(m0 + j);
            s[j][0] = _mm256_set1_epi32(PER32 ? a->xs32[m * nb + b] : a->xs16[m * ns + 2 * b]);
            s[j][1] = PER32 ? _mm256_setzero_si256() : _mm256_set1_epi32(a->xs16[m * ns + 2 * b + 1]);
        }
#pragma GCC unroll 4
        for (int kk = 0; kk < 4; ++kk)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
                for (int j = 0; j < RN; ++j) {
                    const int32_t *x4 = (const int32_t *)(a->xq + (size_t)(m0 + j) * K + 32 * b);
                    s[j][h] = IFLV_DOT(s[j][h], wv[kk + 4 * h], _mm256_set1_epi32(x4[kk + 4 * h]));
                }
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) {
            const size_t m = (size_t)(m0 + j);
            const __m256 d = _mm256_broadcast_ss(a->dx + m * nb + b);
            if (PER32) {
                const __m256 p = _mm256_cvtepi32_ps(_mm256_add_epi32(s[j][0], s[j][1]));
                acc[j] = _mm256_fmadd_ps(p, _mm256_mul_ps(_mm256_load_ps(sc + (size_t)b * 8), d), acc[j]);
                if (FOFS)
                    acc[j] = _mm256_fmadd_ps(_mm256_load_ps(of + (size_t)b * 8), _mm256_broadcast_ss(a->xb32 + m * nb + b), acc[j]);
            } else {
#pragma GCC unroll 2
                for (int h = 0; h < 2; ++h) {
                    const float *sch = sc + ((size_t)b * 2 + h) * 8;
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j][h]), _mm256_mul_ps(_mm256_load_ps(sch), d), acc[j]);
                    if (FOFS)
                        acc[j] = _mm256_fmadd_ps(_mm256_load_ps(of + ((size_t)b * 2 + h) * 8),
                                                 _mm256_broadcast_ss(a->xb + m * ns + 2 * b + h), acc[j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) out[j] = acc[j];
}

#define IFLV_VARIANTS(RN)                                                                                     \
    if (per32 && fofs) iflv_kernel(g, a, m0, K, RN, 1, 1, out);                                           \
    else if (per32) iflv_kernel(g, a, m0, K, RN, 1, 0, out);                                              \
    else if (fofs) iflv_kernel(g, a, m0, K, RN, 0, 1, out);                                               \
    else iflv_kernel(g, a, m0, K, RN, 0, 0, out);                                                         \
    return

static void iflv_kernel_any(const uint8_t *g, const IflgAct *a, int m0, int K, int rn, int per32, int fofs,
                            __m256 out[IFLV_RN]) {
    switch (rn) {
    case 1: IFLV_VARIANTS(1);
#if IFLV_RN == 4
    case 2: IFLV_VARIANTS(2);
    case 3: IFLV_VARIANTS(3);
    default: IFLV_VARIANTS(4);
#else
    default: IFLV_VARIANTS(2);
#endif
    }
}
#undef IFLV_VARIANTS

static inline __m256i iflv_mask(int n) { /* lanes < n */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y[m * ldy + n] = x_m . w_n (+ bias[n]) for n in [n0, n1) (n1 - n0 <= IFLG_RT, a multiple of 8
 * but at the end), all M rows. buf: IFLG_RT / 8 groups + one row of scratch (iflv_tile_bytes). */
static inline size_t iflv_tile_bytes(int K) { return (IFLG_RT / 8) * iflv_group_bytes(K) + iflv_rows_bytes(K) + 64; }

static void iflv_rows(const QWeight *w, int n0, int n1, const IflgAct *a, int M, float *y, int ldy, const float *bias,
                      uint8_t *buf) {
    const int K = w->K, per32 = w->qtype != QT_Q6_K && !(w->qtype == QT_I4G && w->group % 32);
    const int cst = iflv_const_offset(w->qtype), fofs = !cst, ngroups = (n1 - n0 + 7) / 8;
    const size_t gb = iflv_group_bytes(K);
    uint8_t *groups = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63), *rows = groups + (IFLG_RT / 8) * gb;
    for (int gi = 0; gi < ngroups; ++gi) {
        const int r0 = n0 + 8 * gi, nr = n1 - r0 < 8 ? n1 - r0 : 8;
        uint8_t *g = groups + gi * gb;
        if (!iflv_unpack_group_legacy(w, r0, nr, g) && !iflv_unpack_group_k(w, r0, nr, g))
            iflv_unpack_group(w, r0, nr, per32, g, rows);
    }
    IflgAhead ahead = iflg_ahead(w, n1, M, IFLV_RN);
    for (int m0 = 0, c = 0; m0 < M; m0 += IFLV_RN, ++c) {
        const int rn = M - m0 < IFLV_RN ? M - m0 : IFLV_RN;
        iflg_prefetch(&ahead, c);
        for (int gi = 0; gi < ngroups; ++gi) {
            const int r0 = n0 + 8 * gi, nr = n1 - r0 < 8 ? n1 - r0 : 8;
            __m256 out[IFLV_RN];
            iflv_kernel_any(groups + gi * gb, a, m0, K, rn, per32, fofs, out);
            __m256 bv = _mm256_setzero_ps();
            if (bias) bv = nr == 8 ? _mm256_loadu_ps(bias + r0) : _mm256_maskload_ps(bias + r0, iflv_mask(nr));
            for (int j = 0; j < rn; ++j) {
                float *dst = y + (size_t)(m0 + j) * ldy + r0;
                if (nr == 8) _mm256_storeu_ps(dst, _mm256_add_ps(out[j], bv));
                else _mm256_maskstore_ps(dst, iflv_mask(nr), _mm256_add_ps(out[j], bv));
            }
        }
    }
}

#endif /* IFLQ_AVX2 */
#endif
