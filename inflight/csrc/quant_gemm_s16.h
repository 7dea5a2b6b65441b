/* inflight quantized GEMM, AVX2 without VNNI, signed 8-bit layouts (q8_0, i8c): 16-bit products.
 * Included by quant_gemm_groups.h (AVX2 flavour only).
 *
 * AVX2's only 8-bit product, maddubs, takes one operand unsigned and saturates pairs to int16, so a
 * signed q cannot be re-based to q + 128 as on VNNI (pairs up to 2 x 255 x 127). Until 2026-11-26
 * the groups kept q and |q| and moved q's sign onto x per vector (llama.cpp's sign trick:
 * broadcast, sign, maddubs, madd, add per 32 products, the weights re-read every 2 activation
 * rows: 97 GFLOP/s a core at 32 rows). Here q and x are widened to int16 once (q when its tile
 * is unpacked, x once per call) and multiplied by madd: 8 int32 lanes of 2 products each, exact
 * (|q x| <= 128 x 127), the sum of a block of 32 in int32, then one conversion, scale product and
 * FMA per block and activation row, as the other groups (bit-identical to the old AVX2 path).
 * Per 16 products a madd and an add; each broadcast of an x pair feeds the 16 rows of two groups,
 * each weight vector IFLS_RN activation rows. Zen 4 forced to AVX2, one core, CPU time,
 * interleaved with the sign-trick groups (load ~9): q8_0 [gate; up] 9728 x 896 at 32 rows 94 ->
 * 125 GFLOP/s, at 512 rows 102 -> 136; down 896 x 4864 at 512 rows 102 -> 138; the 151,936-row
 * lm_head at 32 rows 99 -> 125 (one group per broadcast: 113-124; 6 rows a pass
 * or 3 groups x 4 rows (24-row tiles, all 16 registers): the same).
 * Group layout (8 weight rows): wq [nb][16 pairs][8 rows] x 2 int16, then sc [nb][8] float.
 */
#ifndef IFL_QUANT_GEMM_S16_H
#define IFL_QUANT_GEMM_S16_H
#if defined(IFLQ_AVX2) && !defined(IFLQ_VNNI)

#ifndef IFLS_RN
#define IFLS_RN 4 /* activation rows per pass: 2 x 4 int sums, 2 weight vectors, x; 3 and 6 measured the same */
#endif

static inline size_t ifls_group_bytes(int K) { return (size_t)K * 16 + (size_t)(K / 32) * 32; }

/* 8 rows of 32 signed bytes (in[r], row r's block) -> the block's 16 pair vectors at out. */
static inline void ifls_block(const __m256i in[8], __m256i *out) {
    __m256i lo[8], hi[8];
    for (int r = 0; r < 8; ++r) {
        lo[r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(in[r]));
        hi[r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(in[r], 1));
    }
    iflv_transpose8(lo, out); /* lane r of out[c]: elements 2c, 2c + 1 of row r */
    iflv_transpose8(hi, out + 8);
}

/* Rows [n0, n0 + nr) of w (nr <= 8, the rest zeros) into group g; rows: scratch of iflv_rows_bytes. */
static void ifls_unpack(const QWeight *w, int n0, int nr, uint8_t *g, uint8_t *rows) {
    const int K = w->K, nb = K / 32, ns = K / 16;
    float *sc = (float *)(g + (size_t)K * 16), *ws = (float *)(rows + (size_t)8 * K), *wm = ws + (size_t)8 * ns;
    const size_t rb = iflq_row_bytes(w->qtype, K);
    if (w->qtype != QT_Q8_0) /* i8c: the row unpack (q as is, the row's scale per 16) */
        for (int r = 0; r < nr; ++r) iflq_unpack_row(w, n0 + r, rows + (size_t)r * K, ws + (size_t)r * ns, wm + (size_t)r * ns);
    for (int b = 0; b < nb; ++b) {
        __m256i in[8];
        for (int r = 0; r < 8; ++r) {
            if (r >= nr) {
                in[r] = _mm256_setzero_si256();
                sc[8 * b + r] = 0.f;
            } else if (w->qtype == QT_Q8_0) { /* straight from the block: f16 scale, 32 int8 */
                const uint8_t *blk = w->data + (size_t)(n0 + r) * rb + (size_t)b * 34;
                uint16_t h;
                memcpy(&h, blk, 2);
                sc[8 * b + r] = iflq_h2f(h);
                in[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            } else {
                sc[8 * b + r] = ws[(size_t)r * ns + 2 * b];
                in[r] = _mm256_loadu_si256((const __m256i *)(rows + (size_t)r * K + 32 * b));
            }
        }
        ifls_block(in, (__m256i *)g + 16 * b);
    }
}

/* out[G * j + i] = group i's 8 rows (i < G: 1 or 2 groups at g, gb bytes apart) . activation row
 * m0 + j (x16: int16 activations, dx their scales). Two groups share each broadcast of x. */
static inline __attribute__((always_inline)) void ifls_kernel(const uint8_t *g, size_t gb, const int16_t *x16,
                                                              const float *dx, int m0, int K, const int G,
                                                              const int RN, __m256 *out) {
    const int nb = K / 32;
    const float *sc0 = (const float *)(g + (size_t)K * 16), *sc1 = (const float *)(g + gb + (size_t)K * 16);
    __m256 acc[2 * IFLS_RN];
#pragma GCC unroll 12
    for (int j = 0; j < G * RN; ++j) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i s[2 * IFLS_RN];
#pragma GCC unroll 12
        for (int j = 0; j < G * RN; ++j) s[j] = _mm256_setzero_si256();
        const __m256i *w0 = (const __m256i *)g + 16 * b, *w1 = (const __m256i *)(g + gb) + 16 * b;
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) {
            const __m256i v0 = _mm256_load_si256(w0 + c), v1 = G > 1 ? _mm256_load_si256(w1 + c) : v0;
#pragma GCC unroll 6
            for (int j = 0; j < RN; ++j) {
                const __m256i xv = _mm256_set1_epi32(((const int32_t *)(x16 + (size_t)(m0 + j) * K + 32 * b))[c]);
                s[G * j] = _mm256_add_epi32(s[G * j], _mm256_madd_epi16(v0, xv));
                /* one running sum each: gcc otherwise re-associates a block's 16 products into a
                 * tree and spills them (80 instead of 113 GFLOP/s) */
                __asm__("" : "+x"(s[G * j]));
                if (G > 1) {
                    s[G * j + 1] = _mm256_add_epi32(s[G * j + 1], _mm256_madd_epi16(v1, xv));
                    __asm__("" : "+x"(s[G * j + 1]));
                }
            }
        }
        const __m256 f0 = _mm256_load_ps(sc0 + 8 * b), f1 = G > 1 ? _mm256_load_ps(sc1 + 8 * b) : f0;
#pragma GCC unroll 6
        for (int j = 0; j < RN; ++j) {
            const __m256 d = _mm256_broadcast_ss(dx + (size_t)(m0 + j) * nb + b);
            acc[G * j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[G * j]), _mm256_mul_ps(f0, d), acc[G * j]);
            if (G > 1)
                acc[G * j + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[G * j + 1]), _mm256_mul_ps(f1, d), acc[G * j + 1]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < G * RN; ++j) out[j] = acc[j];
}

#define IFLS_G(RN) if (G == 2) ifls_kernel(g, gb, x16, dx, m0, K, 2, RN, out); else ifls_kernel(g, gb, x16, dx, m0, K, 1, RN, out); return
static void ifls_kernel_any(const uint8_t *g, size_t gb, const int16_t *x16, const float *dx, int m0, int K, int G,
                            int rn, __m256 *out) {
    switch (rn) { /* constant G and RN keep the sums in registers */
    case 1: IFLS_G(1);
    case 2: IFLS_G(2);
#if IFLS_RN > 3
    case 3: IFLS_G(3);
#endif
#if IFLS_RN > 4
    case 4: IFLS_G(4);
#endif
#if IFLS_RN > 5
    case 5: IFLS_G(5);
#endif
    default: IFLS_G(IFLS_RN);
    }
}
#undef IFLS_G

/* As iflv_rows for a signed layout: rows [n0, n1) (<= IFLG_RT) of w, all M activation rows. */
static void ifls_rows(const QWeight *w, int n0, int n1, const IflgAct *a, int M, float *y, int ldy, const float *bias,
                      uint8_t *buf) {
    const int K = w->K, ngroups = (n1 - n0 + 7) / 8;
    const size_t gb = ifls_group_bytes(K);
    uint8_t *groups = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63), *rows = groups + (IFLG_RT / 8) * gb;
    for (int gi = 0; gi < ngroups; ++gi) {
        const int r0 = n0 + 8 * gi, nr = n1 - r0 < 8 ? n1 - r0 : 8;
        ifls_unpack(w, r0, nr, groups + gi * gb, rows);
    }
    IflgAhead ahead = iflg_ahead(w, n1, M, IFLS_RN);
    for (int m0 = 0, c = 0; m0 < M; m0 += IFLS_RN, ++c) {
        const int rn = M - m0 < IFLS_RN ? M - m0 : IFLS_RN;
        iflg_prefetch(&ahead, c);
        for (int gi = 0; gi < ngroups; gi += 2) {
            const int G = ngroups - gi < 2 ? 1 : 2;
            __m256 out[2 * IFLS_RN];
            ifls_kernel_any(groups + gi * gb, gb, a->x16, a->dx, m0, K, G, rn, out);
            for (int i = 0; i < G; ++i) {
                const int r0 = n0 + 8 * (gi + i), nr = n1 - r0 < 8 ? n1 - r0 : 8;
                for (int j = 0; j < rn; ++j)
                    iflv_store(y + (size_t)(m0 + j) * ldy + r0, bias ? bias + r0 : NULL, out[G * j + i], nr);
            }
        }
    }
}

#endif
#endif
