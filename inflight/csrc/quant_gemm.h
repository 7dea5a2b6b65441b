/* inflight quantized GEMM: activation rows (batched decode, prefill, also one row) against a
 * quantized weight on AVX2 / AVX-512 VNNI. Included by quant_kernels.c after quant_kernels.h,
 * whose scheme it keeps (int8 activations per 32, weight rows as w = ws * q + wm).
 *
 * The work is split into tiles of IFLG_RT weight rows (a thread's tiles are contiguous; it
 * prefetches the next into L2 while it computes), each unpacked once and used by all M rows:
 *  - quant_gemm_groups.h: 16 weight rows per 512-bit vector on VNNI, 8 per 256-bit vector on AVX2,
 *    a block's int32 sums for all of them at once; see there. Signed layouts (q8_0, i8c) on AVX2,
 *    where maddubs would saturate q + 128: 16-bit q and x by madd (quant_gemm_s16.h).
 * Portable C keeps quant_kernels.h's iflq_rows (one weight row x up to 4 activation rows).
 */
#ifndef IFL_QUANT_GEMM_H
#define IFL_QUANT_GEMM_H
#ifdef IFLQ_AVX2

#ifndef IFLG_RT
#define IFLG_RT 16 /* weight rows unpacked per tile: 16 x 4864 = 78 KB of q, in L2 */
#endif

/* The quantized activation rows of one call: xq / dx / xb (quant_kernels.h), and for the VNNI
 * kernel -c x int sums per 16 and per 32 and xb per 32 ([M][K/16] int32, [M][K/32] int32, [M][K/32]). */
typedef struct {
    const int8_t *xq;
    const float *dx, *xb, *xb32;
    const int32_t *xs16, *xs32;
    const int16_t *x16; /* AVX2's signed layouts: xq widened (quant_gemm_s16.h), else NULL */
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

/* The thread's next tile (its own share of the tiles is a contiguous run: tile_queue.h),
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


#include "quant_gemm_groups.h"

/* Per-thread scratch of iflg_tile_rows. */
static inline size_t iflg_buf_bytes(int K) { return iflv_tile_bytes(K); }

/* The GEMM over rows [n0, n1) of w (at most IFLG_RT), every activation row: quant_gemm_groups.h. */
static inline void iflg_tile_rows(const QWeight *w, int n0, int n1, const IflgAct *a, int M, float *y, int ldy,
                                  const float *bias, uint8_t *buf) {
    iflv_rows(w, n0, n1, a, M, y, ldy, bias, buf);
}
#endif /* IFLQ_AVX2 */
#endif
