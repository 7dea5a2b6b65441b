/* inflight quantized GEMM: activation rows (batched decode, prefill, also one row) against a
 * quantized weight on AVX2 / AVX-512 VNNI. Included by quant_kernels.c after quant_kernels.h,
 * whose scheme it keeps (int8 activations per 32, weight rows as w = ws * q + wm).
 *
 * The work is split into tiles of IFLG_RT weight rows (a thread's tiles are contiguous; it
 * prefetches the next into L2 while it computes), each unpacked once and used by all M rows:
 *  - quant_gemm_groups.h (every layout on VNNI; on AVX2 all but i8c): 8 / 16 weight rows per vector,
 *    a block's int32 sums for all 8 at once; the fast path, see there.
 *  - below, for i8c on AVX2, where maddubs would saturate re-based q + 128 (q8_0 takes the groups
 *    with |q| and the sign trick since 2026-11-26: 71 -> 99 GFLOP/s at 32 rows, one core): a
 *    microkernel holds RM = 2 weight rows x RN = 4 activation rows of float accumulators
 *    (llamafile's tinyBLAS idea) and per (weight row, activation row, 32-block) spends llama.cpp's
 *    sign trick, maddubs + madd, a conversion, a scale product and an FMA.
 * Portable C keeps quant_kernels.h's iflq_rows (one weight row x up to 4 activation rows).
 */
#ifndef IFL_QUANT_GEMM_H
#define IFL_QUANT_GEMM_H
#ifdef IFLQ_AVX2

#define IFLG_RM 2 /* the signed-layout tiles: 2 x 4 float accumulators of AVX2's 16 registers */
#define IFLG_RN 4
#ifndef IFLG_RT
#define IFLG_RT 16 /* weight rows unpacked per tile: 16 x 4864 = 78 KB of q, in L2 */
#endif

/* The quantized activation rows of one call: xq / dx / xb (quant_kernels.h), and for the VNNI
 * kernel -c x int sums per 16 and per 32 and xb per 32 ([M][K/16] int32, [M][K/32] int32, [M][K/32]). */
typedef struct {
    const int8_t *xq;
    const float *dx, *xb, *xb32;
    const int32_t *xs16, *xs32;
} IflgAct;

/* Bytes of the per-call sums beside xq / dx / xb. */
static inline size_t iflg_act_bytes(int M, int K) { return (size_t)M * (K / 16 + 2 * (K / 32)) * 4; }

/* Row m's sums (after iflq_quantize_row); the int sums times -c, the weight's constant offset
 * (quant_gemm_groups.h: the kernel starts its int32 sums there). */
static void iflg_act_sums(int m, int K, int c, const int8_t *xq, const float *xb, int32_t *xs16, int32_t *xs32,
                          float *xb32) {
    const int8_t *p = xq + (size_t)m * K;
    xs16 += (size_t)m * (K / 16), xs32 += (size_t)m * (K / 32), xb32 += (size_t)m * (K / 32), xb += (size_t)m * (K / 16);
    for (int g = 0; g < K / 16; ++g) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += p[16 * g + i];
        xs16[g] = -c * s;
    }
    for (int b = 0; b < K / 32; ++b) {
        xs32[b] = xs16[2 * b] + xs16[2 * b + 1];
        xb32[b] = xb[2 * b] + xb[2 * b + 1];
    }
}

/* The thread's next tile (OpenMP's static split gives each thread a contiguous run of tiles),
 * fetched into L2 a slice per chunk of activation rows while this tile computes: unpacking reads
 * the weights from DRAM, and at 32 rows it waited on them ~20 % of the time. */
typedef struct {
    const char *at;
    size_t lines, per_chunk;
} IflgAhead;

static inline IflgAhead iflg_ahead(const QWeight *w, int n1, int M, int rn) {
    const size_t row_bytes = iflq_row_bytes(w->qtype, w->K);
    const int next = n1 + IFLG_RT < w->N ? IFLG_RT : w->N - n1, chunks = (M + rn - 1) / rn;
    IflgAhead a = {(const char *)w->data + (size_t)n1 * row_bytes, next > 0 ? ((size_t)next * row_bytes + 63) / 64 : 0, 0};
    a.per_chunk = (a.lines + chunks - 1) / chunks;
    return a;
}

static inline void iflg_prefetch(const IflgAhead *a, int chunk) {
    for (size_t l = chunk * a->per_chunk; l < (size_t)(chunk + 1) * a->per_chunk && l < a->lines; ++l)
        _mm_prefetch(a->at + 64 * l, _MM_HINT_T1);
}

#ifndef IFLQ_VNNI /* the AVX2 tiles of signed layouts; the rest runs quant_gemm_groups.h */
/* The RM x RN tile over all of K: out[i * RN + j] = sum_b (ws . dx) * dot(q_i, x_j), offsets not
 * included. q: RM unpacked rows (stride K), ws their scales per 16 (stride K / 16); xq, dx: RN
 * activation rows (stride K, K / 32). PER32: the two scales of each block are equal. SGN: q is
 * signed (AVX2 only). Every argument after K is a constant at each call: the loops unroll and
 * the accumulators live in registers. */
static inline __attribute__((always_inline)) void iflg_tile(const uint8_t *q, const float *ws, const float *wm,
                                                            const int8_t *xq, const float *dx, const float *xb, int K,
                                                            const int RM, const int RN, const int PER32, const int SGN,
                                                            float *out) {
    __m256 acc[IFLG_RM][IFLG_RN];
    const int nb = K / 32, ns = K / 16;
#pragma GCC unroll 4
    for (int i = 0; i < RM; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i w[IFLG_RM], x[IFLG_RN];
        __m256 s[IFLG_RM], d[IFLG_RN];
#pragma GCC unroll 4
        for (int i = 0; i < RM; ++i) {
            w[i] = _mm256_loadu_si256((const __m256i *)(q + (size_t)i * K + 32 * b));
            const float *wsi = ws + (size_t)i * ns + 2 * b;
            /* lanes 0-3 of a dot hold elements 0-15 of the block, lanes 4-7 elements 16-31 */
            s[i] = PER32 ? _mm256_broadcast_ss(wsi) : _mm256_set_m128(_mm_broadcast_ss(wsi + 1), _mm_broadcast_ss(wsi));
        }
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) {
            x[j] = _mm256_loadu_si256((const __m256i *)(xq + (size_t)j * K + 32 * b));
            d[j] = _mm256_broadcast_ss(dx + (size_t)j * nb + b);
        }
#pragma GCC unroll 4
        for (int i = 0; i < RM; ++i) {
            const __m256i uw = SGN ? _mm256_sign_epi8(w[i], w[i]) : w[i];
#pragma GCC unroll 4
            for (int j = 0; j < RN; ++j) {
                const __m256i xv = SGN ? _mm256_sign_epi8(x[j], w[i]) : x[j];
                const __m256 p = _mm256_cvtepi32_ps(iflq_dot32(uw, xv));
                acc[i][j] = _mm256_fmadd_ps(p, _mm256_mul_ps(s[i], d[j]), acc[i][j]);
            }
        }
    }
    if (!SGN) { /* + sum_g wm_ig xb_jg into the same lanes (hsum adds them all): K / 128 FMAs a pair */
        for (int g = 0; g < ns; g += 8) {
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(ns - g), lanes); /* K % 128: a tail */
            __m256 a[IFLG_RM], c[IFLG_RN];
#pragma GCC unroll 4
            for (int i = 0; i < RM; ++i) a[i] = _mm256_maskload_ps(wm + (size_t)i * ns + g, mask);
#pragma GCC unroll 4
            for (int j = 0; j < RN; ++j) c[j] = _mm256_maskload_ps(xb + (size_t)j * ns + g, mask);
#pragma GCC unroll 4
            for (int i = 0; i < RM; ++i)
#pragma GCC unroll 4
                for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_fmadd_ps(a[i], c[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RM; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < RN; ++j) out[i * RN + j] = iflq_hsum(acc[i][j]);
}

/* iflg_tile with (RM, RN, PER32, SGN) made constants: one specialised body per combination. */
#define IFLG_VARIANTS(RM, RN)                                                                    \
    if (per32 && sgn) iflg_tile(q, ws, wm, xq, dx, xb, K, RM, RN, 1, 1, out);                             \
    else if (per32) iflg_tile(q, ws, wm, xq, dx, xb, K, RM, RN, 1, 0, out);                               \
    else if (sgn) iflg_tile(q, ws, wm, xq, dx, xb, K, RM, RN, 0, 1, out);                                 \
    else iflg_tile(q, ws, wm, xq, dx, xb, K, RM, RN, 0, 0, out);                                          \
    return
#define IFLG_COLS(RM)                                                                              \
    switch (rn) {                                                                                 \
    case 1: IFLG_VARIANTS(RM, 1);                                                                 \
    case 2: IFLG_VARIANTS(RM, 2);                                                                 \
    case 3: IFLG_VARIANTS(RM, 3);                                                                 \
    default: IFLG_VARIANTS(RM, 4);                                                                \
    }

static void iflg_tile_any(const uint8_t *q, const float *ws, const float *wm, const int8_t *xq, const float *dx,
                          const float *xb, int K, int rm, int rn, int per32, int sgn, float *out) {
    switch (rm) {
    case 1: IFLG_COLS(1);
    default: IFLG_COLS(2);
    }
}
#undef IFLG_COLS
#undef IFLG_VARIANTS

/* Rows [n0, n1) of w (n1 - n0 <= IFLG_RT) unpacked into buf. Returns whether q is signed (the
 * layouts that come here are; the unsigned variants keep the tile general). */
static int iflg_unpack(const QWeight *w, int n0, int nt, uint8_t *q, float *ws, float *wm) {
    const int K = w->K, ns = K / 16;
    for (int r = 0; r < nt; ++r) iflq_unpack_row(w, n0 + r, q + (size_t)r * K, ws + (size_t)r * ns, wm + (size_t)r * ns);
    return iflq_signed(w->qtype);
}

/* y[m * ldy + n] = x_m . w_n (+ bias[n]) for n in [n0, n1), n1 - n0 <= IFLG_RT, all M rows;
 * buf: iflq_unpack_bytes(IFLG_RT, K). xq / dx / xb: the M quantized activation rows. */
static void iflg_rows(const QWeight *w, int n0, int n1, const int8_t *xq, const float *dx, const float *xb, int M,
                      float *y, int ldy, const float *bias, uint8_t *buf) {
    const int K = w->K, nb = K / 32, ns = K / 16, nt = n1 - n0;
    uint8_t *q = buf;
    float *ws = (float *)(buf + (size_t)IFLG_RT * K), *wm = ws + (size_t)IFLG_RT * ns;
    const int sgn = iflg_unpack(w, n0, nt, q, ws, wm);
    const int per32 = w->qtype != QT_Q6_K && !(w->qtype == QT_I4G && w->group % 32);
    IflgAhead ahead = iflg_ahead(w, n1, M, IFLG_RN);
    for (int m0 = 0, c = 0; m0 < M; m0 += IFLG_RN, ++c) { /* these RN activation rows stay in L1 over the tile */
        const int rn = M - m0 < IFLG_RN ? M - m0 : IFLG_RN;
        iflg_prefetch(&ahead, c);
        for (int r0 = 0; r0 < nt; r0 += IFLG_RM) {
            const int rm = nt - r0 < IFLG_RM ? nt - r0 : IFLG_RM;
            float out[IFLG_RM * IFLG_RN];
            iflg_tile_any(q + (size_t)r0 * K, ws + (size_t)r0 * ns, wm + (size_t)r0 * ns, xq + (size_t)m0 * K,
                          dx + (size_t)m0 * nb, xb + (size_t)m0 * ns, K, rm, rn, per32, sgn, out);
            for (int i = 0; i < rm; ++i) {
                const float bv = bias ? bias[n0 + r0 + i] : 0.f;
                for (int j = 0; j < rn; ++j) y[(size_t)(m0 + j) * ldy + n0 + r0 + i] = out[i * rn + j] + bv;
            }
        }
    }
}

#endif /* !IFLQ_VNNI */

#include "quant_gemm_groups.h"

/* Per-thread scratch of iflg_tile_rows. */
static inline size_t iflg_buf_bytes(int K) {
    size_t v = iflv_tile_bytes(K);
#ifndef IFLQ_VNNI
    if (iflq_unpack_bytes(IFLG_RT, K) > v) v = iflq_unpack_bytes(IFLG_RT, K);
#endif
    return v;
}

/* The GEMM over rows [n0, n1) of w (at most IFLG_RT), every activation row: the 8-row groups of
 * quant_gemm_groups.h, but for i8c on AVX2 (maddubs would saturate: the 2 x 4 tiles). */
static inline void iflg_tile_rows(const QWeight *w, int n0, int n1, const IflgAct *a, int M, float *y, int ldy,
                                  const float *bias, uint8_t *buf) {
#ifndef IFLQ_VNNI
    if (w->qtype == QT_I8C) { /* q8_0: the groups, |q| and the sign trick */
        iflg_rows(w, n0, n1, a->xq, a->dx, a->xb, M, y, ldy, bias, buf);
        return;
    }
#endif
    iflv_rows(w, n0, n1, a, M, y, ldy, bias, buf);
}
#endif /* IFLQ_AVX2 */
#endif
