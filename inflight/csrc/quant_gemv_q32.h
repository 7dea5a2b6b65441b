/* Batch-1 GEMV of the 32-element formats q4_0 / q4_1 / q5_0 / q5_1 straight from their blocks
 * (included by quant_gemv.h inside its AVX2 guard, after the K-quant and q8_0 dots; split out to keep
 * each file near STYLE.md's size). The design, figures and what was tried: docs/quant_history.md,
 * "The 32-element formats" and its second pass. */
#ifndef IFL_QUANT_GEMV_Q32_H
#define IFL_QUANT_GEMV_Q32_H

/* One 32-element block of q4_0 / q4_1 / q5_0 / q5_1 (qs: 16 bytes, element j in the low nibble of
 * byte j, j + 16 in the high one; qh: bit j is element j's fifth bit) against 32 int8 activations
 * x: 8 int32 lanes of the unsigned q (0..31) times x. */
#if defined(IFLQ_VNNI) && defined(__AVX512BW__)
#define IFLV_Q32_512BW 1
#endif
static inline __attribute__((always_inline)) __m256i iflv_q32_block(const uint8_t *qs, uint32_t qh, __m256i x,
                                                                    const int five) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
#ifdef IFLV_Q32_512BW
    /* low 128 bits unshifted, high 128 bits >> 4 (one variable shift); the fifth bit as 16 from a
     * zero-masked move, merged with the nibble by one ternary-logic op ((s & 0xF) | h; a masked add
     * needed a register copy) */
    if (!five) /* q4: the high nibbles stay in place (16 q), the high 128 bits' factor is / 16 */
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_and_si256(v, _mm256_setr_epi64x(0x0F0F0F0F0F0F0F0F, 0x0F0F0F0F0F0F0F0F,
                                                                                (long long)0xF0F0F0F0F0F0F0F0ULL, (long long)0xF0F0F0F0F0F0F0F0ULL)), x);
    const __m256i s = _mm256_srlv_epi16(v, _mm256_setr_epi64x(0, 0, 0x0004000400040004, 0x0004000400040004));
    const __m256i q = _mm256_ternarylogic_epi32(s, _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)),
                                                _mm256_set1_epi8(0xF), 0xEC);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x);
#else
    __m256i q = _mm256_and_si256(_mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0), _mm256_set1_epi8(0xF));
    if (five) q = _mm256_or_si256(q, iflq_bits32(qh));
    return iflq_dot32(q, x);
#endif
}

/* The f16 d (and m) of blocks b .. b + 3 (blk: block b, bb bytes a block), widened */
static inline __attribute__((always_inline)) void iflv_q32_dm4(const uint8_t *blk, size_t bb, const int has_m,
                                                               __m128 *d, __m128 *m) {
#ifdef IFLV_Q32_512BW
    /* words 0 and bb / 2 of the first two blocks' 32 bytes and of the next two's (d; m one word on):
     * one two-source permute instead of 4-8 scalar loads, shifts and ORs */
    const int wb = (int)bb / 2;
    const __m256i sel = _mm256_setr_epi16(0, wb, 16, 16 + wb, 1, 1 + wb, 17, 17 + wb, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i dw = _mm256_castsi256_si128(_mm256_permutex2var_epi16(
        _mm256_loadu_si256((const __m256i *)blk), sel, _mm256_loadu_si256((const __m256i *)(blk + 2 * bb))));
    *d = _mm_cvtph_ps(dw);
    if (has_m) *m = _mm_cvtph_ps(_mm_unpackhi_epi64(dw, dw));
#else
    uint64_t dh = 0, mh = 0;
    for (int j = 0; j < 4; ++j) {
        uint16_t h;
        memcpy(&h, blk + j * bb, 2);
        dh |= (uint64_t)h << (16 * j);
        if (has_m) {
            memcpy(&h, blk + j * bb + 2, 2);
            mh |= (uint64_t)h << (16 * j);
        }
    }
    *d = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dh));
    if (has_m) *m = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)mh));
#endif
}

/* One block's factor d dx for iflv_q32_block's lanes (q4's high half / 16, as it holds 16 q) */
static inline __m256 iflv_q32_f1(float f, const int five) {
#ifdef IFLV_Q32_512BW
    if (!five) return _mm256_set_m128(_mm_set1_ps(f * 0.0625f), _mm_set1_ps(f));
#endif
    (void)five;
    return _mm256_set1_ps(f);
}

/* Row n of a q4_0 / q4_1 / q5_0 / q5_1 weight . one quantized activation row: w = d q + o per 32
 * elements, o = -8 d (q4_0), -16 d (q5_0) or the block's m (q4_1, q5_1); returned as 8 lanes to be
 * summed (iflv_q32_range sums 8 rows at once). Four blocks at a time: their d (and m) widened in
 * one conversion, the four factors d dx in one product, the four blocks' int32 lanes reduced by
 * hadd to one convert and one FMA (no per-block factor broadcast: q5_0 9728 x 896 from L3, one
 * core, 1.86 -> 1.39 ns a block), the offsets o . (dx sum(x)) in one FMA per four blocks against
 * the activation's per-32 sums. (VNNI runs q4_0 / q5_0 as iflv_dot_pair below.) Two rows
 * at a time (sharing the activation's loads) were 1.10 ns a block from L3 but 2.3-2.7 from DRAM,
 * software prefetch or not: two interleaved streams defeat the hardware prefetcher. */
static inline __attribute__((always_inline)) __m256 iflv_dot_q32(const QWeight *w, int n, const int8_t *xq,
                                                                 const float *dx, const float *xb, const int five,
                                                                 const int has_m) {
    const int nb = w->K / 32;
    const size_t bb = 18 + 2 * (size_t)has_m + 4 * (size_t)five, qs_at = 2 + 2 * (size_t)has_m + 4 * (size_t)five;
    const uint8_t *row = w->data + (size_t)n * bb * nb;
    __m256 acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    float tail = 0.f;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *blk = row + (size_t)b * bb;
        __m128 d, m = _mm_setzero_ps();
        iflv_q32_dm4(blk, bb, has_m, &d, &m);
        const __m128 s32 = _mm_hadd_ps(_mm_loadu_ps(xb + 2 * b), _mm_loadu_ps(xb + 2 * b + 4)); /* dx sum(x) per block */
        accm = _mm_fmadd_ps(has_m ? m : d, s32, accm);
        __m256i p[4];
        for (int j = 0; j < 4; ++j) {
            const uint8_t *bj = blk + j * bb;
            uint32_t qh = 0;
            if (five) memcpy(&qh, bj + 2 + 2 * has_m, 4);
            p[j] = iflv_q32_block(bj + qs_at, qh, _mm256_loadu_si256((const __m256i *)(xq + 32 * (b + j))), five);
        }
        /* 8 lanes per block -> 2: [b0 b1 b2 b3 | b0 b1 b2 b3], against the factors d dx twice */
        const __m256i sum = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        const __m128 f = _mm_mul_ps(d, _mm_loadu_ps(dx + b));
#ifdef IFLV_Q32_512BW
        const __m128 fh = five ? f : _mm_mul_ps(f, _mm_set1_ps(0.0625f));
#else
        const __m128 fh = f;
#endif
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set_m128(fh, f), acc);
    }
    for (; b < nb; ++b) { /* K / 32 not a multiple of 4 */
        const uint8_t *blk = row + (size_t)b * bb;
        uint16_t h, hm = 0;
        uint32_t qh = 0;
        memcpy(&h, blk, 2);
        if (has_m) memcpy(&hm, blk + 2, 2);
        if (five) memcpy(&qh, blk + 2 + 2 * has_m, 4);
        const float d = iflq_h2f(h), o = has_m ? iflq_h2f(hm) : d;
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        IFLV_ACC(acc1, iflv_q32_block(blk + qs_at, qh, xv, five), iflv_q32_f1(d * dx[b], five));
        tail += o * (xb[2 * b] + xb[2 * b + 1]);
    }
    __m128 m4 = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    float off = _mm_cvtss_f32(_mm_add_ss(m4, _mm_movehdup_ps(m4))) + tail;
    if (!has_m) off *= five ? -16.f : -8.f;
    return _mm256_add_ps(_mm256_add_ps(acc, acc1), _mm256_castps128_ps256(_mm_set_ss(off)));
}

/* 8 vectors -> their 8 horizontal sums: 7 hadds, 2 permutes and an add for 8 rows instead of 6 ops
 * per row (the per-row tail was ~15 % of a q5_0 row of K = 896) */
static inline __m256 iflv_hsum8(const __m256 *v) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 c = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* a: rows 0..3 [low 128 halves' sums | high halves'], c rows 4..7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31));
}

#include "quant_gemv_q32_pair.h" /* q4_0 / q5_0 two blocks a vector: iflv_dot_pair */
#ifdef IFLV_Q32_512BW
#include "quant_gemv_q5g.h" /* q5_0 regrouped at load: iflv_q5g_range */
#endif

/* Rows n0 .. n0 + nt - 1 of a q4_0 .. q5_1 weight . one activation row (the row loop inlined with
 * the format's constants: 1.39 -> 1.17 ns a block, as above). Each 8 rows' sums in one reduction,
 * padded with zero rows so that a row's float order does not depend on how many rows its call has. */
static inline __attribute__((always_inline)) void iflv_q32_range(const QWeight *w, int n0, int nt, const int8_t *xq,
                                                                 const float *dx, const float *xb, const int five,
                                                                 const int has_m, float *out) {
    const int pairs = !has_m && w->K <= IFLV_XS_K;
    int8_t xp[pairs ? w->K : 1]; /* 1.5 K bytes of stack */
    int32_t xs[pairs ? w->K / 8 : 1];
    if (pairs) iflv_pair_acts(w->K, xq, five ? 16 : 8, xp, xs);
#ifndef IFLV_Q32_512BW
    float sp[pairs ? w->K / 32 : 1];
    if (pairs) iflv_pair_sums(w->K, xb, sp);
#else
    const float *sp = 0;
#endif
    for (int c = 0; c < nt; c += 8) {
        const int cn = nt - c < 8 ? nt - c : 8;
        __m256 v[8];
        int r = 0;
        if (pairs)
            for (; r < cn; ++r) v[r] = iflv_dot_pair(w, n0 + c + r, xq, dx, xb, xp, xs, sp, five);
        for (; r < cn; ++r) v[r] = iflv_dot_q32(w, n0 + c + r, xq, dx, xb, five, has_m);
        for (; r < 8; ++r) v[r] = _mm256_setzero_ps();
        float s[8];
        _mm256_storeu_ps(s, iflv_hsum8(v));
        memcpy(out + c, s, sizeof(float) * (size_t)cn);
    }
}

/* each format its own constant-folded copy, out of line: inlined into iflv_dots (with its stack
 * arrays) they moved the q4_k loop's code and cost it 5 % (kquant_l2.py, Zen 4) */
#define IFLV_Q32_FN(name, five, has_m)                                                                       \
    static __attribute__((noinline)) void name(const QWeight *w, int n0, int nt, const int8_t *xq,          \
                                               const float *dx, const float *xb, float *out) {              \
        iflv_q32_range(w, n0, nt, xq, dx, xb, five, has_m, out);                                           \
    }
IFLV_Q32_FN(iflv_q32_q4_0, 0, 0)
IFLV_Q32_FN(iflv_q32_q4_1, 0, 1)
IFLV_Q32_FN(iflv_q32_q5_0, 1, 0)
IFLV_Q32_FN(iflv_q32_q5_1, 1, 1)
#undef IFLV_Q32_FN

#endif
