/* inflight quantized matmul: y (M, N) = x (M, K) . dequantize(w)^T (+ bias), float32 in and out.
 * The scheme is in quant_kernels.h; this file is the entry point QuantLinear calls through
 * inflight/quant/kernels.py (built per instruction-set flavour by inflight/platform.py's flags,
 * like decode_kernel.c). One OpenMP parallel region: the activation rows are quantized, then
 * the output rows are split statically over the threads, each unpacking IFLQ_RT rows at a time
 * into its own L1/L2 buffer and multiplying them with every activation row (4 at a time).
 */
#include <omp.h>
#include <stdlib.h>

#include "quant_kernels.h"
#include "quant_gemm.h"

#ifdef IFLQ_AVX2
/* From this many activation rows on, the GEMM of quant_gemm.h runs, else iflq_rows' one-row dot.
 * The 8-row groups win from one row on (q8_0 [gate; up], single core: 30 -> 37 GFLOP/s at 1 row,
 * 62 -> 90 at 3; AVX2 q5_0 22 -> 30 at 1 row), so every AVX2+ product takes them. */
#ifndef IFLG_MIN_M
#define IFLG_MIN_M 1
#endif
#define IFLQ_GEMM_RT IFLG_RT
#define IFLG_CONST_OFFSET(qtype) iflv_const_offset(qtype)
#else
#define IFLQ_GEMM_RT IFLQ_RT
#endif

int ifl_quant_abi_version(void) { return 1; }

/* 0 portable C, 1 AVX2 (maddubs), 2 AVX-512 VNNI (vpdpbusd on 256-bit vectors) */
int ifl_quant_path(void) {
#if defined(IFLQ_VNNI)
    return 2;
#elif defined(IFLQ_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* Returns 0, -1 on a bad argument, -2 out of memory. */
int ifl_quant_matmul(int qtype, int N, int K, int group, const uint8_t *data, const void *scales,
                     const uint8_t *zeros, int scales_per_row, const float *x, int M, float *y, const float *bias,
                     int nthreads) {
    if (qtype < 0 || qtype >= QT_N || N <= 0 || K <= 0 || K % 32 || M <= 0 || nthreads <= 0) return -1;
    if ((qtype == QT_Q4_K || qtype == QT_Q5_K || qtype == QT_Q6_K) && K % 256) return -1;
    if (qtype == QT_I4G && (group <= 0 || group % 16 || K % group)) return -1;
    QWeight w = {qtype, N, K, group, data, (const uint16_t *)scales, zeros, scales_per_row};
#ifdef IFLQ_AVX2
    const int gemm = M >= IFLG_MIN_M && !iflv_use(qtype, M); /* K-quants / q8_0: quant_gemv.h below 4 / 3 rows */
    const size_t per = gemm ? iflg_buf_bytes(K) : iflq_unpack_bytes(IFLQ_RT, K), sums = gemm ? iflg_act_bytes(M, K) : 0;
#else
    const int gemm = 0;
    const size_t per = iflq_unpack_bytes(IFLQ_RT, K), sums = 0;
#endif
    const int rt = gemm ? IFLQ_GEMM_RT : IFLQ_RT, tiles = (N + rt - 1) / rt;
    int8_t *xq = malloc((size_t)M * K);
    float *dx = malloc(sizeof(float) * ((size_t)M * (K / 32) + (size_t)M * (K / 16)) + sums);
    uint8_t *bufs = malloc(per * (size_t)nthreads);
    if (!xq || !dx || !bufs) {
        free(xq); free(dx); free(bufs);
        return -2;
    }
    float *xb = dx + (size_t)M * (K / 32);
#ifdef IFLQ_AVX2
    int32_t *xs16 = (int32_t *)(xb + (size_t)M * (K / 16)), *xs32 = xs16 + (size_t)M * (K / 16);
    float *xb32 = (float *)(xs32 + (size_t)M * (K / 32));
#endif
#pragma omp parallel num_threads(nthreads)
    {
        uint8_t *buf = bufs + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
        for (int m = 0; m < M; ++m) {
            iflq_quantize_row(x + (size_t)m * K, K, xq + (size_t)m * K, dx + (size_t)m * (K / 32),
                              xb + (size_t)m * (K / 16));
#ifdef IFLQ_AVX2
            if (gemm) iflg_act_sums(m, K, IFLG_CONST_OFFSET(qtype), xq, xb, xs16, xs32, xb32);
#endif
        }
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; ++t) {
            int n0 = t * rt, n1 = n0 + rt < N ? n0 + rt : N;
#ifdef IFLQ_AVX2
            if (gemm) {
                const IflgAct act = {xq, dx, xb, xb32, xs16, xs32};
                iflg_tile_rows(&w, n0, n1, &act, M, y, N, bias, buf);
                continue;
            }
#endif
            iflq_rows(&w, n0, n1, xq, dx, xb, M, y, N, bias, buf);
        }
    }
    free(xq); free(dx); free(bufs);
    return 0;
}

static inline uint16_t iflq_f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else /* round to nearest even; the scales here are finite and >= 0 */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) { /* subnormal half */
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - exp;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
    return (uint16_t)(sign | h);
#endif
}

/* w (N, K) float -> Q8_0 blocks (N, K / 32 * 34), as llama.cpp's quantize_row_q8_0_ref. */
int ifl_quantize_q8_0(const float *w, int N, int K, uint8_t *out, int nthreads) {
    if (N <= 0 || K <= 0 || K % 32 || nthreads <= 0) return -1;
    const int nb = K / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b) {
            const float *x = w + (size_t)n * K + 32 * b;
            uint8_t *blk = out + ((size_t)n * nb + b) * 34;
            float amax = 0.f;
            for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
            float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
            uint16_t h = iflq_f2h(d);
            memcpy(blk, &h, 2);
            for (int i = 0; i < 32; ++i) blk[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
        }
    return 0;
}
