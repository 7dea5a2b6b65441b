/* decode_kernel.c's GEMV over quantized weights (qgemv: a descriptor's parts through quant_kernels.h's
 * dots, tiles claimed from tile_queue.h, the activations rounded to int8 where they are made) and
 * any_gemv, plain or quantized. Included once, in place, by decode_kernel.c. */
#ifndef IFL_DECODE_QGEMV_H
#define IFL_DECODE_QGEMV_H

/* ------------------------------------------------------------------ quantized GEMV */
/* Scratch of the quantized path: the activation rows as int8 blocks and as float32 (the float
 * parts'; both shared), each thread's unpack buffer (IFLQ_RT rows); for iflv_q8_rows (VNNI) the
 * int8 rows + 128 (xu). */
typedef struct {
    int8_t *xq;
    uint8_t *xu;
    float *dx, *xb, *xf;
    uint8_t *ubuf;
    size_t ustride;
    uint64_t *tq;  /* each thread's tile queue (tq_claim), a cache line apart */
} QScratch;

static int qscratch_alloc(QScratch *qs, int nthreads, int M, int K) {
    qs->xf = malloc(sizeof(float) * (size_t)M * K);
    qs->xq = malloc((size_t)M * K);
    qs->xu = malloc((size_t)M * K);
    qs->dx = malloc(sizeof(float) * ((size_t)M * (K / 32) + (size_t)M * (K / 16)));
    qs->ustride = iflq_unpack_bytes(IFLQ_RT, K);
    qs->ubuf = malloc(qs->ustride * (size_t)nthreads);
    qs->xb = qs->dx ? qs->dx + (size_t)M * (K / 32) : NULL;
    qs->tq = tq_alloc(nthreads);
    return qs->xq && qs->dx && qs->ubuf && qs->xf && qs->xu && qs->tq;
}

static void qscratch_free(QScratch *qs) {
    free(qs->xq); free(qs->dx); free(qs->ubuf); free(qs->xf); free(qs->xu); free(qs->tq);
}

static QWeight qweight(const int64_t *desc) {
    QWeight w = {(int)desc[0], (int)desc[1], (int)desc[2], (int)desc[3], (const uint8_t *)desc[4],
                 (const uint16_t *)desc[5], (const uint8_t *)desc[6], (int)desc[7]};
    return w;
}

#if defined(IFLQ_AVX2) && !defined(IFLV_OFF)
/* q8_0 at several activation rows: quant_gemv_q8.h's iflv_q8_rows, whose sums are the one-row
 * step's bit for bit, the weights streamed once per IFLV_Q8_ROWS rows */
#define HAVE_ROWS_Q8 1
#define RQ8_MAX IFLV_Q8_ROWS
#endif

#define IFLQ_MAX_PARTS 4
#ifndef QG_RT
/* Weight rows a tile of qgemv: the 1-row dots set their activation's lanes up once a call (q8_0's
 * offsets, q5_0's pairs, q4_k's factors), and a thief's run starts on tile bounds; 8 -> 32 rows:
 * the 0.5B step's GEMVs, 2 threads, Zen 4, CPU time (stream_ab.py --variants "QG_RT=8" tree) */
#define QG_RT 32
#endif
#ifndef QG_TILE_BYTES
/* A tile's weight bytes at most, down to 8 rows: 32 rows of the 0.5B down projection (K = 4864,
 * 165 KB of q8_0) were ~11 us of one core's stream, which the other waited for at the barrier when
 * that tile came last (0: QG_RT rows whatever their bytes; docs/quant_history.md, "Tiles by bytes") */
#define QG_TILE_BYTES (48 * 1024)
#endif
/* rows a qgemv tile of a descriptor (its parts share K): QG_RT, halved while 8 rows or more of the
 * widest part's rows exceed QG_TILE_BYTES (a multiple of 8 rows: the 1-row dots sum 8 rows at once) */
static inline int qg_rows(const int64_t *desc) {
    const int K = (int)desc[1 + 2];
    size_t rb = 0;
    for (int p = 0; p < (int)desc[0]; ++p) {
        const int qt = (int)desc[1 + 8 * p];
        const size_t b = qt >= FT_BASE ? (size_t)K * (qt == FT_F8 ? 1 : qt == FT_F32 ? 4 : 2) : iflq_row_bytes(qt, K);
        rb = b > rb ? b : rb;
    }
    int rt = QG_RT;
    while (QG_TILE_BYTES && rt > 8 && (size_t)rt * rb > (size_t)QG_TILE_BYTES) rt /= 2;
    return rt;
}
#include "prefetch_ahead.h" /* the next GEMV's first rows while the phases between compute */
/* Block b (32 elements, fewer at a row's end) of activation row m of x (M x K) in every form qgemv
 * reads: float32 (xf, the float parts'), int8 with its scale and per-16 sums (xq, dx, xb), + 128
 * (xu; iflv_q8_rows). The step calls it where the block is produced
 * (the norms, attention, SiLU: `preq`), which saves qgemv its own pass and barrier.
 * quant_x_ints: the int8 forms of a whole block from its float32 one (xf), which the SiLU task's
 * silu_mul_block writes itself. */
static inline void quant_x_ints(const QScratch *qs, int K, int m, int b) {
    const float *xf = qs->xf + (size_t)m * K + 32 * b;
    int8_t *xq = qs->xq + (size_t)m * K + 32 * b;
    iflq_quantize_row(xf, 32, xq, qs->dx + (size_t)m * (K / 32) + b, qs->xb + (size_t)m * (K / 16) + 2 * b);
    for (int i = 0; i < 32; ++i) qs->xu[(size_t)m * K + 32 * b + i] = (uint8_t)(xq[i] ^ 0x80);
}

static inline void quant_x_block(const QScratch *qs, const st_t *x, int K, int m, int b, int ints) {
    const int n = K - 32 * b < 32 ? K - 32 * b : 32;
    float *xf = qs->xf + (size_t)m * K + 32 * b;
    for (int i = 0; i < n; ++i) xf[i] = LD(x[(size_t)m * K + 32 * b + i]);
    if (ints && n == 32) quant_x_ints(qs, K, m, b);
}

/* every block of rows 0..M-1 (from a single: the norms) */
static void quant_x_rows(const QScratch *qs, const st_t *x, int M, int K) {
    for (int m = 0; m < M; ++m)
        for (int b = 0; b < (K + 31) / 32; ++b) {
            quant_x_block(qs, x, K, m, b, 1);
            PF_TICK(IFL_PF_NORM);
        }
}

/* As gemv() for a quantized weight. desc: the number of parts P (a fused layer's runs of one
 * layout: q / k / v of a Q4_K_M file may be q5_0, q5_0, q8_0), then 8 int64 per part (qtype, N, K,
 * group, data, scales, zeros, scales_per_row), stacked along N. The M rows of x are quantized
 * once (the threads share the blocks), then the tiles of qg_rows() output rows of every part are
 * split statically over the threads, each unpacking into its own buffer. */
static void qgemv(const int64_t *desc, const st_t *bias, const st_t *x, int M, void *y, int ldy, int mode,
                  QScratch qs, int ph, int preq) {
    const int P = (int)desc[0], K = (int)desc[1 + 2], nb = K / 32, nbc = (K + 31) / 32, rt = qg_rows(desc);
    int first_tile[IFLQ_MAX_PARTS + 1], first_row[IFLQ_MAX_PARTS], ints = 0;
    first_tile[0] = 0;
    for (int p = 0, row = 0; p < P; ++p) {
        int n = (int)desc[1 + 8 * p + 1];
        first_row[p] = row;
        row += n;
        first_tile[p + 1] = first_tile[p] + (n + rt - 1) / rt;
        ints |= desc[1 + 8 * p] < FT_BASE;
    }
    if (!preq) { /* x as float32 (float parts), and int8 per 32 (integer parts) */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < M * nbc; ++t) quant_x_block(&qs, x, K, t / nbc, t % nbc, ints);
        SYNC(PH_QUANT);
    }
    uint8_t *q = qs.ubuf + qs.ustride * (size_t)omp_get_thread_num();
    float *ws = (float *)(q + (size_t)IFLQ_RT * K), *wm = ws + (size_t)IFLQ_RT * (K / 16);
    TQ_FOR(qs.tq, first_tile[P], t) {
        int p = 0;
        while (t >= first_tile[p + 1]) ++p;
        const QWeight w = qweight(desc + 1 + 8 * p);
        int n0 = (t - first_tile[p]) * rt, nt = w.N - n0 < rt ? w.N - n0 : rt, o0 = first_row[p] + n0;
        if (w.qtype >= FT_BASE) { /* f16 / bf16 / f8c rows, widened against float32 x */
            const size_t rb = (size_t)K * (w.qtype == FT_F8 ? 1 : w.qtype == FT_F32 ? 4 : 2);
            const float *fs = (const float *)w.scales;
            for (int r = 0; r < nt; ++r) {
                float s = w.qtype == FT_F8 ? 256.f * fs[w.scales_per_row ? n0 + r : 0] : 1.f;
                float bv = bias ? LD(bias[o0 + r]) : 0.f;
                for (int m0 = 0; m0 < M; m0 += 8) {
                    int mm = M - m0 < 8 ? M - m0 : 8;
                    float out[8];
                    ft_dot(w.qtype, w.data + (size_t)(n0 + r) * rb, qs.xf + (size_t)m0 * K, mm, K, out);
                    for (int m = 0; m < mm; ++m) store_out(y, (size_t)(m0 + m) * ldy + o0 + r, s * out[m] + bv, mode);
                }
            }
            continue;
        }
        const int sgn = iflq_signed(w.qtype);
#ifdef HAVE_ROWS_Q8
        /* several rows: iflv_q8_rows, whose sums are iflv_q8_range's bit for bit; one row:
         * iflv_q8_range itself, 12 % faster there (Zen 4, 1 thread, the 123M spec model: 8.5 vs 9.8 ms) */
        if (w.qtype == QT_Q8_0 && M > 1) {
            for (int r = 0; r < nt; ++r)
                for (int m0 = 0; m0 < M; m0 += RQ8_MAX) {
                    float out[RQ8_MAX];
                    int mm = M - m0 < RQ8_MAX ? M - m0 : RQ8_MAX;
                    iflv_q8_rows(&w, n0 + r, qs.xq + (size_t)m0 * K, qs.dx + (size_t)m0 * nb, qs.xu + (size_t)m0 * K,
                                 mm, out);
                    for (int m = 0; m < mm; ++m)
                        store_out(y, (size_t)(m0 + m) * ldy + o0 + r, out[m] + (bias ? LD(bias[o0 + r]) : 0.f), mode);
                }
            continue;
        }
#endif
        /* straight from the blocks (quant_gemv.h) at every row count where a one-row step is: a
         * verification's K + 1 rows then equal K + 1 one-row steps bit for bit (the unpack path sums
         * in another order: a greedy token of a near-tie changed with speculation) */
        if (iflv_use(w.qtype, 1)) {
            for (int m = 0; m < M; ++m) {
                float out[QG_RT];
                iflv_dots(&w, n0, nt, qs.xq + (size_t)m * K, qs.dx + (size_t)m * nb, qs.xb + (size_t)m * (K / 16), out);
                for (int r = 0; r < nt; ++r)
                    store_out(y, (size_t)m * ldy + o0 + r, out[r] + (bias ? LD(bias[o0 + r]) : 0.f), mode);
            }
            continue;
        }
        for (int s0 = 0; s0 < nt; s0 += IFLQ_RT) { /* the unpack buffer holds IFLQ_RT rows */
            const int st = nt - s0 < IFLQ_RT ? nt - s0 : IFLQ_RT;
            for (int r = 0; r < st; ++r)
                iflq_unpack_row(&w, n0 + s0 + r, q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16));
            for (int m0 = 0; m0 < M; m0 += 4) {
                int mm = M - m0 < 4 ? M - m0 : 4;
                for (int r = 0; r < st; ++r) {
                    float out[4];
                    iflq_dot(q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16), sgn,
                             qs.xq + (size_t)m0 * K, qs.dx + (size_t)m0 * nb, qs.xb + (size_t)m0 * (K / 16), K, mm, out);
                    float bv = bias ? LD(bias[o0 + s0 + r]) : 0.f;
                    for (int m = 0; m < mm; ++m) store_out(y, (size_t)(m0 + m) * ldy + o0 + s0 + r, out[m] + bv, mode);
                }
            }
        }
    }
    SYNC(ph);
}

/* A layer's GEMV: plain (w_t weights) or quantized (W is a descriptor). */
static inline void any_gemv(int quant, const void *W, const st_t *bias, const st_t *x, int M, int N, int K, void *y,
                            int ldy, int mode, Scratch sc, QScratch qs, int ph, int preq) {
    if (quant) {
        qgemv((const int64_t *)W, bias, x, M, y, ldy, mode, qs, ph, preq);
    } else {
        gemv((const w_t *)W, bias, x, M, N, K, y, ldy, mode, sc);
        prof_mark(ph);
    }
}

#endif
