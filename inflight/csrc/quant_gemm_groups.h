/* inflight quantized GEMM, AVX-512 VNNI: 16 weight rows per 512-bit vector (AVX2: 8 per 256-bit
 * vector), integer sums per block. Included by quant_gemm.h. The scheme of quant_kernels.h (int8
 * activations per 32, weights as w = ws * q + wm with unsigned q) in another layout (described
 * for 8 rows; on 512 bits two 8-row halves are interleaved, every vector holding both):
 *  - a group of 8 weight rows is unpacked interleaved: per 32-element block, 8 vectors whose lane
 *    r holds 4 consecutive q of row r (a 8 x 4-byte transpose), then the rows' scales (and float
 *    offsets) as one vector per block (per 16 elements: two);
 *  - per activation row and block, 8 vpdpbusd with the activation's 4 bytes broadcast from memory
 *    sum the whole block in int32 for all 8 rows at once, then one conversion, one scale product
 *    and one FMA: 11 vector ops per 256 products (the 4 x 4 tile of quant_gemm.h: 32);
 *  - offsets that are a constant multiple of the scale (wm = -c ws: q8_0 / i8c re-based by 128,
 *    q4_0 8, q5_0 16, q6_k 32) start the int32 sum at -c * sum(x) instead (no float work);
 *    the others (q4_1, q5_1, q4_k, q5_k, i4g with zeros) add wm . xb in one FMA per block.
 * The 8 (16) outputs of a group are adjacent floats of y: stored as one vector, no horizontal sums.
 */
#ifndef IFL_QUANT_GEMM_GROUPS_H
#define IFL_QUANT_GEMM_GROUPS_H
#ifdef IFLQ_AVX2

#ifdef IFLQ_VNNI
#define IFLV_RN 4 /* activation rows per microkernel: 4 float + 8 int accumulators, 8 weight vectors */
#endif
#if defined(IFLQ_VNNI) && defined(__AVX512F__) && !defined(IFLV_NO_ZMM)
/* 16-row groups on 512-bit vectors: each activation broadcast feeds 16 weight rows, half the loads
 * per product of 8-row groups (the kernel alone, Zen 4, one core, in L1: 267 -> 372 GFLOP/s) */
#define IFLV_VS 2
typedef __m512 IflvF;
typedef __m512i IflvI;
#define IFLV_DOT(s, u, x) _mm512_dpbusd_epi32((s), (u), (x))
#define IFLV_LOADI(p) _mm512_load_si512((const void *)(p))
#define IFLV_SET1I _mm512_set1_epi32
#define IFLV_ZEROI _mm512_setzero_si512
#define IFLV_ADDI _mm512_add_epi32
#define IFLV_CVT _mm512_cvtepi32_ps
#define IFLV_FMA _mm512_fmadd_ps
#define IFLV_MUL _mm512_mul_ps
#define IFLV_LOAD _mm512_load_ps
#define IFLV_BCAST(p) _mm512_set1_ps(*(p))
#define IFLV_ZERO _mm512_setzero_ps
#else
#define IFLV_VS 1
typedef __m256 IflvF;
typedef __m256i IflvI;
#define IFLV_LOADI(p) _mm256_load_si256((const __m256i *)(p))
#define IFLV_SET1I _mm256_set1_epi32
#define IFLV_ZEROI _mm256_setzero_si256
#define IFLV_ADDI _mm256_add_epi32
#define IFLV_CVT _mm256_cvtepi32_ps
#define IFLV_FMA _mm256_fmadd_ps
#define IFLV_MUL _mm256_mul_ps
#define IFLV_LOAD _mm256_load_ps
#define IFLV_BCAST _mm256_broadcast_ss
#define IFLV_ZERO _mm256_setzero_ps
#endif
#define IFLV_GR (8 * IFLV_VS) /* weight rows per group: two 8-row halves interleaved on 512 bits */
#ifdef IFLQ_VNNI
#if IFLV_VS == 1
/* s + the 4-byte dots of u (unsigned) and x (signed) in each int32 lane */
#define IFLV_DOT(s, u, x) _mm256_dpbusd_epi32((s), (u), (x))
#endif
#else
#define IFLV_RN 2 /* AVX2's 16 registers: 8 weight vectors, 4 int + 2 float accumulators */
/* maddubs + madd: exact for q < 128 (pairs of 127 * 127 fit int16); signed layouts: quant_gemm_s16.h */
#define IFLV_DOT(s, u, x) _mm256_add_epi32((s), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (x)), _mm256_set1_epi16(1)))
#endif

/* One group's unpacked layout: wq [nb][8 k4][GR rows] uint32, sc [nb][H][GR], of [nb][H][GR] (H = 1
 * per 32, 2 per 16); the unpackers below write one 8-row half hf of it (rows 8 hf .. 8 hf + 7 of
 * each GR). Bytes of one group: */
static inline size_t iflv_group_bytes(int K) {
#ifdef IFLQ_VNNI
    return ((size_t)K + (size_t)(K / 16) * 4 * 2) * IFLV_GR;
#else /* AVX2's signed q8_0 / i8c groups hold 16-bit q (quant_gemm_s16.h) */
    return ((size_t)K * 2 + (size_t)(K / 16) * 4) * IFLV_GR;
#endif
}

/* Where half hf of a group's vectors and scales start; vector (b, k) is at wq[(8 b + k) * IFLV_VS] */
static inline __m256i *iflv_wq(uint8_t *g, int hf) { return (__m256i *)g + hf; }
static inline float *iflv_sc(uint8_t *g, int K, int hf) { return (float *)(g + (size_t)K * IFLV_GR) + 8 * hf; }

/* The offset constant c of a layout whose wm = -c ws (after re-basing signed q by 128), else 0
 * (AVX2's q8_0 / i8c: signed 16-bit q, no offset). */
static inline int iflv_const_offset(int qtype) {
    switch (qtype) {
#ifdef IFLQ_VNNI
    case QT_Q8_0: case QT_I8C: return 128;
#endif
    case QT_Q4_0: case QT_Q4_0G: return 8;
    case QT_Q5_0: case QT_Q5_0G: return 16;
    case QT_Q6_K: return 32;
    default: return 0;
    }
}

/* 8 x 8 uint32 transpose: in[r][c] -> out[c * IFLV_VS][r] (a group's half). */
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
        out[col[c] * IFLV_VS] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        out[(col[c] + 4) * IFLV_VS] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

/* Rows [n0, n0 + nr) (nr <= 8; missing rows are zeros) into a group at g. rows: 8 row-major
 * unpacked rows of scratch (iflv_rows_bytes). */
static inline size_t iflv_rows_bytes(int K) { return 8 * ((size_t)K + (size_t)K / 16 * 8); }

/* q8_0 / q4_0 / q5_0 / q4_1 / q5_1 (one f16 scale per 32; q4_1 / q5_1 an f16 offset m per 32 too,
 * the others a constant multiple of the scale): each block of the 8 rows decoded in registers and
 * transposed, no row scratch (the row-wise unpack + transpose cost ~25 % of a 32-row GEMM).
 * Returns 0 for the other layouts. */
static int iflv_unpack_group_legacy(const QWeight *w, int n0, int nr, uint8_t *g, int hf) {
    const int qt = w->qtype, K = w->K, nb = K / 32;
    if (qt != QT_Q8_0 && qt != QT_Q4_0 && qt != QT_Q5_0 && qt != QT_Q4_1 && qt != QT_Q5_1 && qt != QT_Q5_0G && qt != QT_Q4_0G) return 0;
    const int has_m = qt == QT_Q4_1 || qt == QT_Q5_1, five = qt == QT_Q5_0 || qt == QT_Q5_1 || qt == QT_Q5_0G;
    const size_t bb = iflq_row_bytes(qt, 32), rb = (size_t)nb * bb;
    float *sc = iflv_sc(g, K, hf), *of = sc + (size_t)nb * IFLV_GR;
    const uint8_t *base = w->data + (size_t)n0 * rb;
    for (int b = 0; b < nb; ++b) {
        __m256i in[8];
        for (int r = 0; r < 8; ++r) {
            if (r >= nr) {
                in[r] = qt == QT_Q8_0 ? _mm256_set1_epi8((char)0x80) : _mm256_setzero_si256();
                sc[(size_t)b * IFLV_GR + r] = 0.f;
                if (has_m) of[(size_t)b * IFLV_GR + r] = 0.f;
                continue;
            }
            const uint8_t *blk = base + (size_t)r * rb + (size_t)b * bb;
            uint16_t h;
            if (qt == QT_Q4_0G) {
                const uint8_t *qs = iflq_q4g_block(base + (size_t)r * rb, b, &h);
                sc[(size_t)b * IFLV_GR + r] = iflq_h2f(h);
                in[r] = iflq_nibbles16(qs);
                continue;
            }
            if (qt == QT_Q5_0G) {
                uint32_t qh;
                const uint8_t *qs;
                iflq_q5g_block(base + (size_t)r * rb, b, &h, &qh, &qs);
                sc[(size_t)b * IFLV_GR + r] = iflq_h2f(h);
                in[r] = _mm256_or_si256(iflq_nibbles16(qs), iflq_bits32(qh));
                continue;
            }
            memcpy(&h, blk, 2);
            sc[(size_t)b * IFLV_GR + r] = iflq_h2f(h);
            if (qt == QT_Q8_0) { /* VNNI only (AVX2: quant_gemm_s16.h) */
                in[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
                continue;
            }
            if (has_m) {
                memcpy(&h, blk + 2, 2);
                of[(size_t)b * IFLV_GR + r] = iflq_h2f(h);
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
        iflv_transpose8(in, iflv_wq(g, hf) + (size_t)b * 8 * IFLV_VS);
    }
    return 1;
}

#include "quant_gemm_kgroups.h"

static void iflv_unpack_group(const QWeight *w, int n0, int nr, int per32, uint8_t *g, int hf, uint8_t *rows) {
    const int K = w->K, nb = K / 32, H = per32 ? 1 : 2, ns = K / 16;
    float *sc = iflv_sc(g, K, hf), *of = sc + (size_t)nb * H * IFLV_GR;
    float *ws = (float *)(rows + (size_t)8 * K), *wm = ws + (size_t)8 * ns;
    const int flip = iflq_signed(w->qtype); /* VNNI only: AVX2's signed layouts go to quant_gemm_s16.h */
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
        iflv_transpose8(in, iflv_wq(g, hf) + (size_t)b * 8 * IFLV_VS);
        for (int h = 0; h < H; ++h)
            for (int r = 0; r < 8; ++r) {
                sc[((size_t)b * H + h) * IFLV_GR + r] = ws[(size_t)r * ns + 2 * b + h];
                of[((size_t)b * H + h) * IFLV_GR + r] = wm[(size_t)r * ns + 2 * b + h];
            }
    }
}

/* y[j][0..GR) = the group's GR rows . activation rows m0..m0+RN; a->xs16 / xs32 hold -c sum(x) for
 * a constant offset c (quant_gemm.h, iflg_act_sums), FOFS: float offsets instead. */
static inline __attribute__((always_inline)) void iflv_kernel(const uint8_t *g, const IflgAct *a, int m0, int K,
                                                              const int RN, const int PER32, const int FOFS,
                                                              IflvF out[IFLV_RN]) {
    const int nb = K / 32, ns = K / 16, H = PER32 ? 1 : 2, GR = IFLV_GR;
    const float *sc = (const float *)(g + (size_t)K * GR), *of = sc + (size_t)nb * H * GR;
    IflvF acc[IFLV_RN];
#pragma GCC unroll 4
    for (int j = 0; j < RN; ++j) acc[j] = IFLV_ZERO();
    for (int b = 0; b < nb; ++b) {
        IflvI wv[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) wv[k] = IFLV_LOADI(g + ((size_t)b * 8 + k) * 4 * GR);
        /* int sums in two chains per activation row (elements 0-15, 16-31), k outer: 2 RN independent
         * vpdpbusd chains of 4 interleave (one chain of 8 per row waited on its latency: 168 vs 181
         * GFLOP/s at 32 rows, 184 vs 218 at 512); each starts at -c sum(x) of its half, or 0 */
        IflvI s[IFLV_RN][2];
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) {
            const size_t m = (size_t)(m0 + j);
            s[j][0] = IFLV_SET1I(PER32 ? a->xs32[m * nb + b] : a->xs16[m * ns + 2 * b]);
            s[j][1] = PER32 ? IFLV_ZEROI() : IFLV_SET1I(a->xs16[m * ns + 2 * b + 1]);
        }
#pragma GCC unroll 4
        for (int kk = 0; kk < 4; ++kk)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const IflvI u = wv[kk + 4 * h];
#pragma GCC unroll 4
                for (int j = 0; j < RN; ++j) {
                    const int32_t *x4 = (const int32_t *)(a->xq + (size_t)(m0 + j) * K + 32 * b);
                    s[j][h] = IFLV_DOT(s[j][h], u, IFLV_SET1I(x4[kk + 4 * h]));
                }
            }
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) {
            const size_t m = (size_t)(m0 + j);
            const IflvF d = IFLV_BCAST(a->dx + m * nb + b);
            if (PER32) {
                const IflvF p = IFLV_CVT(IFLV_ADDI(s[j][0], s[j][1]));
                acc[j] = IFLV_FMA(p, IFLV_MUL(IFLV_LOAD(sc + (size_t)b * GR), d), acc[j]);
                if (FOFS) acc[j] = IFLV_FMA(IFLV_LOAD(of + (size_t)b * GR), IFLV_BCAST(a->xb32 + m * nb + b), acc[j]);
            } else {
#pragma GCC unroll 2
                for (int h = 0; h < 2; ++h) {
                    const float *sch = sc + ((size_t)b * 2 + h) * GR;
                    acc[j] = IFLV_FMA(IFLV_CVT(s[j][h]), IFLV_MUL(IFLV_LOAD(sch), d), acc[j]);
                    if (FOFS)
                        acc[j] = IFLV_FMA(IFLV_LOAD(of + ((size_t)b * 2 + h) * GR), IFLV_BCAST(a->xb + m * ns + 2 * b + h), acc[j]);
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
                            IflvF out[IFLV_RN]) {
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

/* n0 + [0, nr) of GR outputs (nr < GR at the end of w): out + bias stored to dst */
static inline void iflv_store(float *dst, const float *bias, IflvF v, int nr) {
#if IFLV_VS == 2
    const __mmask16 k = (__mmask16)((1u << nr) - 1);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias));
    _mm512_mask_storeu_ps(dst, k, v);
#else
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (bias) v = _mm256_add_ps(v, nr == 8 ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, k));
    if (nr == 8) _mm256_storeu_ps(dst, v);
    else _mm256_maskstore_ps(dst, k, v);
#endif
}

#include "quant_gemm_s16.h"

/* y[m * ldy + n] = x_m . w_n (+ bias[n]) for n in [n0, n1) (n1 - n0 <= IFLG_RT, a multiple of GR
 * but at the end), all M rows. buf: IFLG_RT / GR groups + one row of scratch (iflv_tile_bytes). */
static inline size_t iflv_tile_bytes(int K) { return (IFLG_RT / IFLV_GR) * iflv_group_bytes(K) + iflv_rows_bytes(K) + 64; }

static void iflv_rows(const QWeight *w, int n0, int n1, const IflgAct *a, int M, float *y, int ldy, const float *bias,
                      uint8_t *buf) {
#ifndef IFLQ_VNNI
    if (iflq_signed(w->qtype)) {
        ifls_rows(w, n0, n1, a, M, y, ldy, bias, buf);
        return;
    }
#endif
    const int K = w->K, per32 = w->qtype != QT_Q6_K && !(w->qtype == QT_I4G && w->group % 32);
    const int cst = iflv_const_offset(w->qtype), fofs = !cst, ngroups = (n1 - n0 + IFLV_GR - 1) / IFLV_GR;
    const size_t gb = iflv_group_bytes(K);
    uint8_t *groups = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63), *rows = groups + (IFLG_RT / IFLV_GR) * gb;
    for (int gi = 0; gi < ngroups; ++gi)
        for (int hf = 0; hf < IFLV_VS; ++hf) { /* 8 rows at a time; past n1: zeros */
            const int r0 = n0 + IFLV_GR * gi + 8 * hf, left = n1 - r0, nr = left < 0 ? 0 : left < 8 ? left : 8;
            uint8_t *g = groups + gi * gb;
            if (!iflv_unpack_group_legacy(w, r0, nr, g, hf) && !iflv_unpack_group_k(w, r0, nr, g, hf))
                iflv_unpack_group(w, r0, nr, per32, g, hf, rows);
        }
    IflgAhead ahead = iflg_ahead(w, n1, M, IFLV_RN);
    for (int m0 = 0, c = 0; m0 < M; m0 += IFLV_RN, ++c) {
        const int rn = M - m0 < IFLV_RN ? M - m0 : IFLV_RN;
        iflg_prefetch(&ahead, c);
        for (int gi = 0; gi < ngroups; ++gi) {
            const int r0 = n0 + IFLV_GR * gi, nr = n1 - r0 < IFLV_GR ? n1 - r0 : IFLV_GR;
            IflvF out[IFLV_RN];
            iflv_kernel_any(groups + gi * gb, a, m0, K, rn, per32, fofs, out);
            for (int j = 0; j < rn; ++j) iflv_store(y + (size_t)(m0 + j) * ldy + r0, bias ? bias + r0 : NULL, out[j], nr);
        }
    }
}

#endif /* IFLQ_AVX2 */
#endif
