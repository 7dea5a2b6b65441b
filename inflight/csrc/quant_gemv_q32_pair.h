/* The q4_0 / q5_0 pair path of the batch-1 GEMV: two blocks a vector (included by quant_gemv_q32.h
 * after iflv_q32_block, iflv_q32_dm4 and iflv_q32_f1, which its tail of K / 32 mod 4 blocks uses;
 * split out to keep each file near STYLE.md's size). VNNI: iflv_pair with the offsets in the
 * integers; AVX2: iflv_pair2 with the per-call sums of iflv_pair_sums. */
#ifndef IFL_QUANT_GEMV_Q32_PAIR_H
#define IFL_QUANT_GEMV_Q32_PAIR_H

/* q4_0 / q5_0, two blocks a vector: [elements 0-15 of block j | of j + 1] and [16-31 of j |
 * of j + 1], both vpdpbusd'd into one vector whose lanes 0-3 are block j's and 4-7 block j + 1's,
 * so four blocks' lanes reduce in one hadd (three before) and, VNNI, each pair's offset lanes, -o
 * times the activations' sums, start the dot (the offset exact in the integers). Per call of up to 8
 * rows, the activations in that order (xp, K bytes) and the offset lanes (xs, K / 8 int32), on the
 * stack up to K = IFLV_XS_K. One core, 256 x 896 in L2, Zen 4: q5_0 1.02 -> 0.99 ns a block, q4_0
 * 0.79 -> 0.71 (k-register unpacks of the two qh halves instead of the scalar ones: 1.35); AVX2
 * q4_0 1.06 -> 0.85, q5_0 1.51 -> 1.48. q4_1 / q5_1 this way were 0.98x / 0.87x. */
#ifndef IFLV_XS_K
#define IFLV_XS_K 16384
#endif
static inline void iflv_pair_acts(int K, const int8_t *xq, int o, int8_t *xp, int32_t *xs) {
#ifdef IFLV_Q32_512BW
    const __m256i ov = _mm256_set1_epi8((char)o);
#else
    (void)o; (void)xs;
#endif
    for (int b = 0; b + 2 <= K / 32; b += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 32 * b + 32));
        const __m256i xa = _mm256_permute2x128_si256(x0, x1, 0x20), xc = _mm256_permute2x128_si256(x0, x1, 0x31);
        _mm256_storeu_si256((__m256i *)(xp + 32 * b), xa);
        _mm256_storeu_si256((__m256i *)(xp + 32 * b + 32), xc);
#ifdef IFLV_Q32_512BW
        const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ov, xa), ov, xc);
        _mm256_storeu_si256((__m256i *)(xs + 4 * b), _mm256_sub_epi32(_mm256_setzero_si256(), s));
#endif
    }
}

#ifdef IFLV_Q32_512BW
/* blocks j, j + 1 (b0, bb bytes a block) . their activations xp, offsets xs: 8 int32 lanes */
static inline __attribute__((always_inline)) __m256i iflv_pair(const uint8_t *b0, size_t bb, const int8_t *xp,
                                                               const int32_t *xs, const int five) {
    const size_t qs_at = 2 + 4 * (size_t)five;
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qs_at))),
                                              _mm_loadu_si128((const __m128i *)(b0 + bb + qs_at)), 1);
    const __m256i low = _mm256_set1_epi8(0xF);
    __m256i qa, qc;
    uint32_t ka = 0, kc = 0;
    if (five) { /* the fifth bits of elements 0-15 of both blocks, and of 16-31 */
        uint32_t h0, h1;
        memcpy(&h0, b0 + 2, 4);
        memcpy(&h1, b0 + bb + 2, 4);
        ka = (h0 & 0xFFFF) | (h1 << 16);
        kc = (h0 >> 16) | (h1 & 0xFFFF0000u);
    }
    if (five) {
        qa = _mm256_ternarylogic_epi32(v, _mm256_maskz_mov_epi8((__mmask32)ka, _mm256_set1_epi8(0x10)), low, 0xEC);
        qc = _mm256_ternarylogic_epi32(_mm256_srli_epi16(v, 4), _mm256_maskz_mov_epi8((__mmask32)kc, _mm256_set1_epi8(0x10)),
                                       low, 0xEC);
    } else {
        qa = _mm256_and_si256(v, low);
        qc = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    const __m256i p = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)xs), qa, _mm256_loadu_si256((const __m256i *)xp));
    return _mm256_dpbusd_epi32(p, qc, _mm256_loadu_si256((const __m256i *)(xp + 32)));
}
#else
/* AVX2: per call, each block's dx sum(x) (K / 32 floats; as _mm_hadd_ps adds them), so that a 4-block
 * group spends no hadd on its offsets */
static inline void iflv_pair_sums(int K, const float *xb, float *sp) {
    for (int b = 0; b + 4 <= K / 32; b += 4)
        _mm_storeu_ps(sp + b, _mm_hadd_ps(_mm_loadu_ps(xb + 2 * b), _mm_loadu_ps(xb + 2 * b + 4)));
}

/* AVX2 blocks j, j + 1 . their activations xp: 16 int16 pair sums, lanes 0-7 block j's, 8-15 j + 1's
 * (<= 15748). q5_0's fifth bits of both blocks' both halves from two broadcast 8-byte loads (d, qh,
 * 2 bytes of qs), a blend and a shift: 2 shuffles, 2 ANDs, 2 mins for 64 bits where iflq_bits32 took
 * scalar packing, 2 broadcasts, 2 shuffles, 2 ORs, 2 compares and 2 ANDs. */
static inline __attribute__((always_inline)) __m256i iflv_pair2(const uint8_t *b0, size_t bb, const int8_t *xp,
                                                                const int five) {
    const size_t qs_at = 2 + 4 * (size_t)five;
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qs_at))),
                                              _mm_loadu_si128((const __m128i *)(b0 + bb + qs_at)), 1);
    long long w0, w1;
    memcpy(&w0, b0, 8);
    memcpy(&w1, b0 + bb, 8);
    /* [A, A << 4 | B, B << 4], A / B the first 8 bytes of block j / j + 1: each fifth bit at bit 4-7
     * of some byte, so one AND and a min with 16 make it 16 or 0 */
    const __m256i h = _mm256_sllv_epi64(_mm256_blend_epi32(_mm256_set1_epi64x(w0), _mm256_set1_epi64x(w1), 0xF0),
                                        _mm256_setr_epi64x(0, 4, 0, 4));
    const __m256i low = _mm256_set1_epi8(0xF);
    __m256i qa = _mm256_and_si256(v, low), qc = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if (five) { /* element e's bit: byte 2 + e / 8 of A (e % 8 >= 4) or of A << 4 (byte 10 + e / 8) */
        const __m256i sa = _mm256_setr_epi64x(0x020202020A0A0A0A, 0x030303030B0B0B0B, 0x020202020A0A0A0A, 0x030303030B0B0B0B);
        const __m256i sc = _mm256_add_epi8(sa, _mm256_set1_epi8(2));
        const __m256i bit = _mm256_set1_epi32(0x80402010), b16 = _mm256_set1_epi8(0x10);
        qa = _mm256_or_si256(qa, _mm256_min_epu8(_mm256_and_si256(_mm256_shuffle_epi8(h, sa), bit), b16));
        qc = _mm256_or_si256(qc, _mm256_min_epu8(_mm256_and_si256(_mm256_shuffle_epi8(h, sc), bit), b16));
    }
    return _mm256_add_epi16(_mm256_maddubs_epi16(qa, _mm256_loadu_si256((const __m256i *)xp)),
                            _mm256_maddubs_epi16(qc, _mm256_loadu_si256((const __m256i *)(xp + 32))));
}
#endif

#ifndef IFLV_Q32_PF
#define IFLV_Q32_PF 0 /* software prefetch of iflv_dot_pair's stream this many bytes ahead (0: none) */
#endif
#ifndef IFLV_Q32_PF_HINT
#define IFLV_Q32_PF_HINT _MM_HINT_T0
#endif
/* Row n of a q4_0 / q5_0 weight . one activation row (xp, xs of iflv_pair_acts; xq, dx, xb for a
 * tail of K / 32 mod 4 blocks), as iflv_dot_q32 returns it */
static inline __attribute__((always_inline)) __m256 iflv_dot_pair(const QWeight *w, int n, const int8_t *xq,
                                                                  const float *dx, const float *xb, const int8_t *xp,
                                                                  const int32_t *xs, const float *sp,
                                                                  const int five) {
    const int nb = w->K / 32;
    const size_t bb = 18 + 4 * (size_t)five, qs_at = 2 + 4 * (size_t)five;
    const uint8_t *row = w->data + (size_t)n * bb * nb;
    __m256 acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    float tail = 0.f;
    int b = 0;
#ifndef IFLV_Q32_512BW
    /* AVX2: the pair sums reduced by one int16 hadd (<= 31496) and one madd to the same int32 lanes as
     * two madds and an int32 hadd; the offsets' sums precomputed per call (sp); the same products and
     * FMAs as before, so the same float result. One core, 256 x 896 in L2, Zen 4: q5_0 1.48 -> 1.24
     * ns a block, q4_0 0.84 -> 0.80 (d's shuffled out of iflv_pair2's loads instead of the scalar
     * loads: 0.95x, the scalar ports are idle) */
    (void)xs;
    const __m256i fsel = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3); /* hadd's order, below */
#pragma GCC unroll 2 /* 8 blocks an iteration: q4_0 0.76 -> 0.72 ns a block, q5_0 the same */
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *blk = row + (size_t)b * bb;
        if (IFLV_Q32_PF) { /* 4 blocks: 88 bytes (q5_0) */
            _mm_prefetch((const char *)blk + IFLV_Q32_PF, IFLV_Q32_PF_HINT);
            _mm_prefetch((const char *)blk + IFLV_Q32_PF + 64, IFLV_Q32_PF_HINT);
        }
        if (IFLV_PF2) {
            _mm_prefetch((const char *)blk + IFLV_PF2, _MM_HINT_T1);
            _mm_prefetch((const char *)blk + IFLV_PF2 + 64, _MM_HINT_T1);
        }
        const __m256i p01 = iflv_pair2(blk, bb, xp + 32 * b, five);
        const __m256i p23 = iflv_pair2(blk + 2 * bb, bb, xp + 32 * b + 64, five);
        const __m256i sum = _mm256_madd_epi16(_mm256_hadd_epi16(p01, p23), _mm256_set1_epi16(1));
        __m128 d, m;
        iflv_q32_dm4(blk, bb, 0, &d, &m);
        accm = _mm_fmadd_ps(d, _mm_loadu_ps(sp + b), accm);
        const __m128 f = _mm_mul_ps(d, _mm_loadu_ps(dx + b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), fsel), acc);
    }
#else
    (void)sp;
    const __m256i fsel = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3); /* hadd's order, below */
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *blk = row + (size_t)b * bb;
        if (IFLV_Q32_PF) { /* 4 blocks: 88 bytes (q5_0) */
            _mm_prefetch((const char *)blk + IFLV_Q32_PF, IFLV_Q32_PF_HINT);
            _mm_prefetch((const char *)blk + IFLV_Q32_PF + 64, IFLV_Q32_PF_HINT);
        }
        __m128 d, m;
        iflv_q32_dm4(blk, bb, 0, &d, &m);
        const __m256i p01 = iflv_pair(blk, bb, xp + 32 * b, xs + 4 * b, five);
        const __m256i p23 = iflv_pair(blk + 2 * bb, bb, xp + 32 * b + 64, xs + 4 * b + 8, five);
        const __m256i sum = _mm256_hadd_epi32(p01, p23); /* [b0 b0 b2 b2 | b1 b1 b3 b3] */
        const __m128 f = _mm_mul_ps(d, _mm_loadu_ps(dx + b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), fsel), acc);
    }
#endif
    for (; b < nb; ++b) { /* K / 32 not a multiple of 4: a block at a time, the offset in float */
        const uint8_t *blk = row + (size_t)b * bb;
        uint16_t h;
        uint32_t qh = 0;
        memcpy(&h, blk, 2);
        if (five) memcpy(&qh, blk + 2, 4);
        const float d = iflq_h2f(h);
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        IFLV_ACC(acc1, iflv_q32_block(blk + qs_at, qh, xv, five), iflv_q32_f1(d * dx[b], five));
        tail += d * (five ? -16.f : -8.f) * (xb[2 * b] + xb[2 * b + 1]);
    }
    const __m128 m4 = _mm_add_ps(accm, _mm_movehl_ps(accm, accm)); /* AVX2's offsets (else zero) */
    tail += _mm_cvtss_f32(_mm_add_ss(m4, _mm_movehdup_ps(m4))) * (five ? -16.f : -8.f);
    return _mm256_add_ps(_mm256_add_ps(acc, acc1), _mm256_castps128_ps256(_mm_set_ss(tail)));
}

#endif
