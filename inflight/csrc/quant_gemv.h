/* Batch-1 GEMV straight from the file's blocks (included by quant_kernels.h; AVX2 / VNNI only,
 * the portable flavour unpacks a row and runs iflq_dot).
 *
 * For one or a few activation rows the unpack of quant_kernels.h (a row to one byte per element
 * plus a float scale and offset per 16, stored, then read back by the dot) costs more than the
 * product itself: per 256 Q6_K elements it wrote 256 bytes and 32 floats and read them again.
 * Here a 256-element super-block is decoded in registers and multiplied at once:
 *  - one integer dot per 32 elements (vpdpbusd, or maddubs + madd), the raw 4/5/6-bit q against
 *    the int8 activations;
 *  - the block's 8 (q4_k, q5_k) or 16 (q6_k) sub-block scales become 8 / 16 float factors
 *    d * sc * dx in two vector ops (sc widened from the 6-bit / int8 fields, dx the activation's
 *    per-32 scales, loaded as a vector), so each 32 elements cost one convert and one FMA;
 *  - the offsets (q4_k / q5_k -dmin * m per 32, q6_k -32 d sc per 16) are one or two FMAs per
 *    block against the activation's per-16 sums xb.
 * The 32-element formats (q4_0 q4_1 q5_0 q5_1: the 896-wide rows of a Qwen2.5-0.5B Q4_K_M file;
 * their code in quant_gemv_q32.h)
 * one block per 256-bit vector (q4_0 / q5_0: the halves of two blocks, iflv_dot_pair),
 * four blocks' int32 lanes reduced to one convert and FMA, the constant offsets (-8 d, -16 d)
 * started in vpdpbusd's lanes (VNNI), 8 rows' sums reduced at once: q5_0 0.99 ns a 22-byte block
 * in L2 on Zen 4 (llama.cpp's dot 1.67; benchmarks/kquant_l2.py).
 * q8_0 (quant_gemv_q8.h): the weight unsigned (q + 128) against x with the lanes started at
 * -128 sum(x) (VNNI), the factors of 4 blocks as one f16 conversion and one product, 8 rows' sums
 * at once: 0.94-0.98 -> 0.87 ns a 34-byte block in L2 at K = 896 (AVX2 1.06 -> 0.93; llama.cpp 1.15).
 * The result is the same sum as iflq_dot's (dequantize(w) . q8(x)) in another float order.
 */
#ifndef IFL_QUANT_GEMV_H
#define IFL_QUANT_GEMV_H
#if defined(IFLQ_AVX2) && !defined(IFLV_OFF) /* IFLV_OFF: the unpack path (benchmarks/kquant_gemv.py) */

/* Direct for up to 3 activation rows (q8_0, q4_0 .. q5_1: 2): each row decodes the blocks again, so
 * from a few rows on the 8-row groups of quant_gemm.h (decoded once per tile) win. Single core,
 * Zen 4, CPU time, 512 x 4096: direct / groups q6_k 90 / 294 us at 1 row, 207 / 413 at 2, 295 / 433
 * at 3, 454 / 467 at 4; q8_0 60 / 111 at 1, 151 / 162 at 2, 213 / 180 at 3. q5_0 (12 x 9728 x 896,
 * from DRAM): direct / groups 10.5 / 21.5 ms at 1 row (24 weights), 11.5 / 12.7 at 2 (VNNI; AVX2
 * 14.1 / 13.2); against the fused decode kernel's alternative, the row unpack (9728 x 896 in L3):
 * 373 / 868 us at 1 row, 731 / 904 at 2, 1093 / 906 at 3. */
static inline int iflv_use(int qtype, int M) {
    if (qtype == QT_Q8_0) return M <= 2;
    if (qtype == QT_Q4_0 || qtype == QT_Q4_1 || qtype == QT_Q5_0 || qtype == QT_Q5_1) return M <= 2;
#if defined(IFLQ_VNNI) && defined(__AVX512BW__) /* quant_gemv_q32.h's IFLV_Q32_512BW: the q5_0g dot */
    if (qtype == QT_Q5_0G || qtype == QT_Q4_0G) return M <= 2;
#endif
    return M <= 3 && (qtype == QT_Q4_K || qtype == QT_Q5_K || qtype == QT_Q6_K);
}

/* 8 int32 lanes (bytes 4i..4i+3 each) of one 32-element chunk, scaled by the 8 (or, q6_k, the 4 + 4
 * lanes') float factors */
#define IFLV_ACC(acc, p, f) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, acc)

/* Software prefetch of the weight stream IFLV_PF bytes ahead, one hint per cache line of a block,
 * for rows of K >= IFLV_PF_K: the hardware prefetcher alone falls behind on long rows, whose 14 KB
 * activation row (K = 14336, + its per-block factors) no longer stays in L1 beside the stream and
 * is re-read from L2 every row (the same rows against a 4 KB activation run at the K = 4096 rate).
 * Into L2 (T2), 8 KB ahead: interleaved, CPU time, one core (two), Zen 4, 4096 x 14336 from DRAM,
 * against T0 2 KB ahead: q4_k 14.7 -> 20.2 GB/s (12.1 -> 14.7), q6_k 14.2 -> 17.8 (13.2 -> 17.2),
 * pure read 18-25; none at all 12.6 / 10.7. Not on K = 4096 (the same hint there: 19.5 -> 17.0 at
 * two threads). Walking odd rows backwards (the activation's tail still in L1) halved the rate. */
#ifndef IFLV_PF
#define IFLV_PF 8192
#endif
#ifndef IFLV_PF_K
#define IFLV_PF_K 8192
#endif
#ifndef IFLV_PF_HINT
#define IFLV_PF_HINT _MM_HINT_T2
#endif
/* A second, farther software prefetch of every type's 1-row stream into L2 (T1), IFLV_PF2 bytes
 * ahead (0: none), beside the near one into L1: the L2's own queue holds more misses in flight than
 * the L1's fill buffers, so the far hints keep DRAM busier while the near ones turn L2 hits into L1
 * hits. Intel Xeon (Sapphire-Rapids-class, 2 threads, stream_ab.py, interleaved, 0.5B Q8_0): the
 * GEMVs' CPU time 20.0 -> 18.7 ms at 4096 (paired 80 -> 85 %), the same at 5120 / 6144, none at
 * 3072, 20.3 without the near hint; Q4_K_M 14.6 -> 13.5 at 5120; 8B Q4_K_M 190.9 -> 179.1. */
#ifndef IFLV_PF2
#define IFLV_PF2 0
#endif
static inline void iflv_prefetch(const uint8_t *blk, int nbytes) {
    for (int o = 0; o < nbytes; o += 64) _mm_prefetch((const char *)(blk + IFLV_PF + o), IFLV_PF_HINT);
    if (IFLV_PF2)
        for (int o = 0; o < nbytes; o += 64) _mm_prefetch((const char *)(blk + IFLV_PF2 + o), _MM_HINT_T1);
}

static inline __m256 iflv_u8x8(const uint8_t *p) { /* 8 bytes -> 8 floats */
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Per 256 activations the 8 sub-blocks' sums of 32 (xb's pairs), built once per tile of rows: the
 * hadd / permute per row and block were ~0.3 ns of a q4_k block's ~7.5 (AVX2, one core, in L2) */
static inline void iflv_sums32(int K, const float *xb, float *xs) {
    const __m256i pair_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); /* undo hadd's lane order */
    for (int b = 0; b < K / 256; ++b)
        _mm256_storeu_ps(xs + 8 * b, _mm256_permutevar8x32_ps(
                                         _mm256_hadd_ps(_mm256_loadu_ps(xb + 16 * b), _mm256_loadu_ps(xb + 16 * b + 8)), pair_order));
}

/* A q4_k / q5_k block's 12 scale bytes (6-bit sc and m, sub-blocks 4-7 split in nibbles and the top
 * bits of 0-3) as two 64-bit words of one byte each, [sc_0..3 | m_0..3] and [sc_4..7 | m_4..7]: in
 * scalar registers, whose result then moves to the vector unit once or twice (iflq_k4_unpack's
 * four 32-bit words took four moves; a vector unpack from one 16-byte load was slower: AVX2, one
 * core, in L2, Zen 4, 6.45 -> 6.83 ns a q4_k block) */
static inline void iflv_k4_words(const uint8_t *s, uint64_t *lo, uint64_t *hi) {
    uint64_t a;
    uint32_t u2;
    memcpy(&a, s, 8);
    memcpy(&u2, s + 8, 4);
    const uint64_t u = ((uint64_t)(u2 >> 4) << 32) | u2;
    *lo = a & 0x3f3f3f3f3f3f3f3full;
    /* low 4 bits from u2's nibbles, high 2 from bits 6-7 of sc_0..3 / m_0..3 */
    *hi = (u & 0x0f0f0f0f0f0f0f0full) | ((a >> 2) & 0x3030303030303030ull);
}

/* Row n of a q4_k / q5_k weight . one quantized activation row (xq K int8, dx K/32, xs K/32: iflv_sums32). */
static float iflv_dot_k45(const QWeight *w, int n, const int8_t *xq, const float *dx, const float *xs) {
    const int K = w->K, five = w->qtype == QT_Q5_K;
    const size_t bb = five ? 176 : 144;
    const uint8_t *row = w->data + (size_t)n * iflq_row_bytes(w->qtype, K);
    const __m256i low = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 accm = _mm256_setzero_ps();
#ifndef IFLQ_VNNI
    const __m256i pick[2] = {_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)};
#endif
    for (int b = 0; b < K / 256; ++b) {
        const uint8_t *blk = row + (size_t)b * bb, *qh = blk + 16, *ql = blk + (five ? 48 : 16);
        const int8_t *x = xq + 256 * b;
        if (K >= IFLV_PF_K) iflv_prefetch(blk, (int)bb);
        int dd;
        memcpy(&dd, blk, 4);
        const __m256 dm = _mm256_cvtph_ps(_mm_set1_epi32(dd)); /* [d dmin] x 4 */
        /* d, dmin as one broadcast pair and sc, m from iflv_k4_words: 6.45 -> 6.26-6.36 ns a block (AVX2,
         * one core, in L2, Zen 4; the scalar h2f + broadcast of each and the 32-bit unpack before) */
        uint64_t p, q;
        iflv_k4_words(blk + 4, &p, &q);
        const uint64_t sc = (p & 0xffffffffull) | (q << 32), m = (p >> 32) | (q & 0xffffffff00000000ull);
        const __m256 scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        const __m256 mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m)));
        const __m256 fv = _mm256_mul_ps(_mm256_mul_ps(scv, _mm256_moveldup_ps(dm)), _mm256_loadu_ps(dx + 8 * b));
        /* offsets: -dmin * m_j * (sum of sub-block j's activations, xs) */
        accm = _mm256_fmadd_ps(_mm256_mul_ps(mv, _mm256_movehdup_ps(dm)), _mm256_loadu_ps(xs + 8 * b), accm);
        const __m256i hv = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
#ifndef IFLQ_VNNI
        __m256i sj[4];
#endif
        for (int j = 0; j < 4; ++j) { /* 32 bytes: sub-block 2j in the low nibbles, 2j + 1 in the high */
            __m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                                             _mm256_and_si256(_mm256_srli_epi16(hv, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                                             _mm256_and_si256(_mm256_srli_epi16(hv, 2 * j + 1), one), 4));
            }
#ifdef IFLQ_VNNI
            __m256i p0 = iflq_dot32(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * j)));
            __m256i p1 = iflq_dot32(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * j + 32)));
            /* the factor taken from fv by a permute: stored and broadcast back from memory it waited on
             * store forwarding (q5_k here, one core, in L2, Zen 4: 7.62 -> 7.50 ns a block) */
            IFLV_ACC(acc[(2 * j) & 3], p0, _mm256_permutevar8x32_ps(fv, _mm256_set1_epi32(2 * j)));
            IFLV_ACC(acc[(2 * j + 1) & 3], p1, _mm256_permutevar8x32_ps(fv, _mm256_set1_epi32(2 * j + 1)));
#else
            /* AVX2: each sub-block pair's 16-bit pair sums added in int16 before the madd (4 products a
             * lane), two pairs once more across the 128-bit halves (8 products, |lane| <= 8 x 31 x 128 <
             * 32768: exact), so per 128 elements one madd, convert and FMA where there were four: one
             * core, in L2, Zen 4, 8.1 -> 7.4-7.6 ns a block (kquant_l2.py --flavour avx2; the same
             * reduction by vphaddd instead of the shuffles was slower, 8.1 -> 8.7) */
            const __m256i m0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * j)));
            const __m256i m1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * j + 32)));
            sj[j] = _mm256_add_epi16(_mm256_unpacklo_epi64(m0, m1), _mm256_unpackhi_epi64(m0, m1));
            if (j & 1) {
                const __m256i t = _mm256_add_epi16(_mm256_permute2x128_si256(sj[j - 1], sj[j], 0x20),
                                                   _mm256_permute2x128_si256(sj[j - 1], sj[j], 0x31));
                IFLV_ACC(acc[j >> 1], _mm256_madd_epi16(t, _mm256_set1_epi16(1)), _mm256_permutevar8x32_ps(fv, pick[j >> 1]));
            }
#endif
        }
    }
    return iflq_hsum(_mm256_sub_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])), accm));
}

/* Per 256 activations the 16 per-16 sums xb in the order the q6_k loop's integer sums come out,
 * [0 2 4 6 1 3 5 7 | 8 10 .. 15], built once per tile of rows (see iflv_dot_q6k) */
static inline void iflv_q6k_sums(int K, const float *xb, float *xo) {
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int i = 0; i < K / 16; i += 8) _mm256_storeu_ps(xo + i, _mm256_permutevar8x32_ps(_mm256_loadu_ps(xb + i), order));
}

/* Row n of a q6_k weight . one quantized activation row (xq K int8, dx K/32, xo K/16: iflv_q6k_sums). */
static float iflv_dot_q6k(const QWeight *w, int n, const int8_t *xq, const float *dx, const float *xo) {
    const int K = w->K;
    const uint8_t *row = w->data + (size_t)n * iflq_row_bytes(QT_Q6_K, K);
    const __m256i low = _mm256_set1_epi8(0xF), bits45 = _mm256_set1_epi8(0x30);
    /* the 16 int8 scales into the order of the sums, [0 2 4 6 1 3 5 7 | 8 10 .. 15] */
    const __m128i sc_order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    __m256 acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int b = 0; b < K / 256; ++b) {
        const uint8_t *blk = row + (size_t)b * 210, *ql = blk, *qh = blk + 128;
        const int8_t *x = xq + 256 * b;
        if (K >= IFLV_PF_K) iflv_prefetch(blk, 210);
        uint16_t hd;
        memcpy(&hd, blk + 208, 2);
        const __m256 d = _mm256_set1_ps(iflq_h2f(hd));
        /* sums and scales in the order [0 2 4 6 | 1 3 5 7] of each half: sub-blocks 2i and 2i + 1 of
         * 16 share dx_i, so a half's factors take dx[4h .. 4h + 3] twice (one broadcast load), and
         * no permute is left per block (the sums' and dx's were 4 of ~80 vector ops) */
        const __m128i scb = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blk + 192)), sc_order);
        const __m256 s_lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb)), d);
        const __m256 s_hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scb, 8))), d);
        const __m256 f_lo = _mm256_mul_ps(s_lo, _mm256_broadcast_ps((const __m128 *)(dx + 8 * b)));
        const __m256 f_hi = _mm256_mul_ps(s_hi, _mm256_broadcast_ps((const __m128 *)(dx + 8 * b + 4)));
        /* offsets: q - 32, so -32 d sc_j * (sum of sub-block j's activations) */
        accm = _mm256_fmadd_ps(s_lo, _mm256_loadu_ps(xo + 16 * b), accm);
        accm = _mm256_fmadd_ps(s_hi, _mm256_loadu_ps(xo + 16 * b + 8), accm);
        __m256i sums[2];
        for (int h = 0; h < 2; ++h) { /* two halves of 128: chunks 4h .. 4h + 3 */
            const __m256i a = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i c = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            /* q = nibble | 2 high bits at bits 4-5: each pair of qh bits is moved there by one 16-bit
             * shift (bits crossing bytes are masked off) and merged by one ternary-logic op on VNNI
             * ((x & 0xF) | y; AVX2 an AND and an OR): Zen 4, one core, in L2, 7.8 -> 7.6 ns a block,
             * AVX2 flavour 9.4 -> 8.7 */
#if defined(IFLQ_VNNI) && defined(__AVX512VL__)
#define IFLV_LO_OR(x, y) _mm256_ternarylogic_epi32(x, y, low, 0xEC)
#else
#define IFLV_LO_OR(x, y) _mm256_or_si256(_mm256_and_si256(x, low), y)
#endif
            const __m256i q0 = IFLV_LO_OR(a, _mm256_and_si256(_mm256_slli_epi16(hv, 4), bits45));
            const __m256i q1 = IFLV_LO_OR(c, _mm256_and_si256(_mm256_slli_epi16(hv, 2), bits45));
            const __m256i q2 = IFLV_LO_OR(_mm256_srli_epi16(a, 4), _mm256_and_si256(hv, bits45));
            const __m256i q3 = IFLV_LO_OR(_mm256_srli_epi16(c, 4), _mm256_and_si256(_mm256_srli_epi16(hv, 2), bits45));
#undef IFLV_LO_OR
            const int8_t *xh = x + 128 * h;
            /* chunk k's lanes 0-3 are sub-block 8h + 2k, 4-7 sub-block 8h + 2k + 1: the 128-bit halves'
             * sums are the 8 sub-blocks' in the order [0 2 4 6 | 1 3 5 7], which the factors and xo
             * follow: 2 converts and 2 FMAs a block instead of 8 and 8 (and 8 factor broadcasts). VNNI
             * sums them by 6 unpacks + 3 adds, not 3 vphaddd (Zen 4, one core, in L2: 7.0 -> 6.7-6.9 ns
             * a block); AVX2 keeps its one vphaddd (the same
             * unpacks there: 7.5 -> 7.7) */
#ifdef IFLQ_VNNI
            const __m256i p0 = iflq_dot32(q0, _mm256_loadu_si256((const __m256i *)xh));
            const __m256i p1 = iflq_dot32(q1, _mm256_loadu_si256((const __m256i *)(xh + 32)));
            const __m256i p2 = iflq_dot32(q2, _mm256_loadu_si256((const __m256i *)(xh + 64)));
            const __m256i p3 = iflq_dot32(q3, _mm256_loadu_si256((const __m256i *)(xh + 96)));
            const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
            const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
            sums[h] = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
#else
            /* AVX2: two chunks' 16-bit pair sums folded into one vector before the madd (|lane| <= 4 x
             * 63 x 128, exact in int16): 2 madds and 1 hadd a half instead of 4 and 3 */
            const __m256i m0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)xh));
            const __m256i m1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(xh + 32)));
            const __m256i m2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(xh + 64)));
            const __m256i m3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(xh + 96)));
            const __m256i one16 = _mm256_set1_epi16(1);
            const __m256i s01 = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_unpacklo_epi64(m0, m1), _mm256_unpackhi_epi64(m0, m1)), one16);
            const __m256i s23 = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_unpacklo_epi64(m2, m3), _mm256_unpackhi_epi64(m2, m3)), one16);
            sums[h] = _mm256_hadd_epi32(s01, s23);
#endif
        }
        IFLV_ACC(acc, sums[0], f_lo);
        IFLV_ACC(acc1, sums[1], f_hi);
    }
    return iflq_hsum(_mm256_fmadd_ps(accm, _mm256_set1_ps(-32.f), _mm256_add_ps(acc, acc1)));
}

#include "quant_gemv_q32.h"
#include "quant_gemv_q8.h"

#if defined(IFLQ_VNNI) && defined(__AVX512BW__) && !defined(IFLV_NO512)
#define IFLV_512 1
/* q4_k on 512-bit vectors (the avx512vnni flavour): 64 elements, two sub-blocks, per vpdpbusd /
 * convert / FMA, their factors picked by one permute from the block's factor vector; half the
 * instructions of the 256-bit loop, which bounded q4_k (~15 GB/s a core from L2). Interleaved,
 * 2 threads, Zen 4 at load 2: q4_k [gate; up] 5.3 -> 4.7 ms, down 2.9 -> 2.7; the same for q5_k
 * and q6_k measured 3-6 % slower (their extra bit-plane work gains less than the wider loads cost). */
static inline __m512i iflv_halves16(int lo, int hi) { /* 16-bit lanes: lo in the low 256 bits, hi above */
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)), _mm256_set1_epi16((short)hi), 1);
}
static inline __m512i iflv_halves32(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(lo)), _mm256_set1_epi32(hi), 1);
}

/* A q4_k block's 12 scale bytes as 16: [sc_0..3 | m_0..3 | sc_4..7 | m_4..7] (iflv_k4_words): 6.0 ->
 * 5.7 ns a block (one core, in L2, Zen 4) against iflq_k4_unpack's four words stored and reloaded */
static inline __m128i iflv_k4_scales(const uint8_t *s) {
    uint64_t lo, hi;
    iflv_k4_words(s, &lo, &hi);
    return _mm_set_epi64x((long long)hi, (long long)lo);
}

/* Per 256 activations, [dx_0..7 | s_0..7] (s_j = sub-block j's sum in float, xb_2j + xb_2j+1): the 16
 * floats a q4_k block multiplies its [sc | m] by, built once per tile of rows; the odd sub-blocks'
 * dx / 16, as their q stay in the high nibble (16 q: exact, vpdpbusd sums 4 products in int32) */
static inline void iflv_k4_acts(int K, const float *dx, const float *xb, float *dxs) {
    const __m256i pair_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); /* undo hadd's lane order */
    const __m256 sixteenth = _mm256_setr_ps(1.f, 0.0625f, 1.f, 0.0625f, 1.f, 0.0625f, 1.f, 0.0625f);
    for (int b = 0; b < K / 256; ++b) { /* [dx_0..3 | s_0..3 | dx_4..7 | s_4..7]: iflv_k4_scales' order */
        const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(dx + 8 * b), sixteenth);
        const __m256 s = _mm256_permutevar8x32_ps(
            _mm256_hadd_ps(_mm256_loadu_ps(xb + 16 * b), _mm256_loadu_ps(xb + 16 * b + 8)), pair_order);
        _mm256_storeu_ps(dxs + 16 * b, _mm256_permute2f128_ps(f, s, 0x20));
        _mm256_storeu_ps(dxs + 16 * b + 8, _mm256_permute2f128_ps(f, s, 0x31));
    }
}

/* Row n of a q4_k weight . one activation row given as xq and iflv_k4_acts' dxs. The vector pipes
 * bound this loop (Zen 4; the scalar unpack of the 12-byte scales runs beside them for free, a
 * vector one was slower), so the per-block float work is one 16-lane product: [sc | m] (one
 * convert) times [d | -dmin] times [dx | s], whose low half is the 8 dot factors and whose high
 * half is the offset, accumulated under a mask (the hadd / permute of the sums per row and block
 * were 1.9 of 7.6 ns a block, one core, in L2). */
static float iflv_dot_q4k_512(const QWeight *w, int n, const int8_t *xq, const float *dxs) {
    const int K = w->K;
    const uint8_t *row = w->data + (size_t)n * iflq_row_bytes(QT_Q4_K, K);
    const __m512i nib = _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8((char)0xF0), 1);
    const __m512i dsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1); /* [d | dmin | d | dmin] x 4 */
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512 accm = _mm512_setzero_ps();
    for (int b = 0; b < K / 256; ++b) {
        const uint8_t *blk = row + (size_t)b * 144, *ql = blk + 16;
        const int8_t *x = xq + 256 * b;
        if (K >= IFLV_PF_K) iflv_prefetch(blk, 144);
        uint32_t dd;
        memcpy(&dd, blk, 4);
        const __m512 dm = _mm512_permutexvar_ps(dsel, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))));
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(iflv_k4_scales(blk + 4))), dm),
                                       _mm512_loadu_ps(dxs + 16 * b));
        accm = _mm512_mask_add_ps(accm, 0xF0F0, accm, t);
        for (int j = 0; j < 4; ++j) { /* sub-blocks 2j (low nibbles, low 256 bits) and 2j + 1 (high) */
            /* the high nibbles unshifted, 16 q (one AND for both halves, no shift: 6.6 -> 5.9 ns a block) */
            __m512i q = _mm512_and_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(ql + 32 * j))), nib);
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512((const void *)(x + 64 * j)));
            const int f0 = 2 * j + (j >= 2 ? 4 : 0); /* sub-block 2j's factor in t */
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(iflv_halves32(f0, f0 + 1), t), acc[j]);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))) -
           _mm512_reduce_add_ps(accm);
}

#endif

/* out[r] = row n0 + r of w . activation row (xq, dx, xb), r < nt, where iflv_use(). */
static void iflv_dots(const QWeight *w, int n0, int nt, const int8_t *xq, const float *dx, const float *xb,
                      float *out) {
    switch (w->qtype) { /* the 32-element formats, each its own constant-folded copy */
    case QT_Q4_0: iflv_q32_q4_0(w, n0, nt, xq, dx, xb, out); return;
    case QT_Q4_1: iflv_q32_q4_1(w, n0, nt, xq, dx, xb, out); return;
    case QT_Q5_0: iflv_q32_q5_0(w, n0, nt, xq, dx, xb, out); return;
#ifdef IFLV_Q32_512BW
    case QT_Q5_0G: iflv_q5g_range(w, n0, nt, xq, dx, out); return;
    case QT_Q4_0G: iflv_q4g_range(w, n0, nt, xq, dx, out); return;
#endif
    case QT_Q5_1: iflv_q32_q5_1(w, n0, nt, xq, dx, xb, out); return;
    case QT_Q8_0: iflv_q8_range(w, n0, nt, xq, dx, out); return;
#ifdef IFLV_512
    case QT_Q4_K: {
        float dxs[w->K / 16]; /* K / 4 bytes of stack */
        iflv_k4_acts(w->K, dx, xb, dxs);
        for (int r = 0; r < nt; ++r) out[r] = iflv_dot_q4k_512(w, n0 + r, xq, dxs);
        return;
    }
#else
    case QT_Q4_K:
#endif
    case QT_Q5_K: {
        float xs[w->K / 32]; /* K / 8 bytes of stack */
        iflv_sums32(w->K, xb, xs);
        for (int r = 0; r < nt; ++r) out[r] = iflv_dot_k45(w, n0 + r, xq, dx, xs);
        return;
    }
    default: { /* q6_k */
        float xo[w->K / 16]; /* K / 4 bytes of stack */
        iflv_q6k_sums(w->K, xb, xo);
        for (int r = 0; r < nt; ++r) out[r] = iflv_dot_q6k(w, n0 + r, xq, dx, xo);
    }
    }
}
#else
static inline int iflv_use(int qtype, int M) { (void)qtype; (void)M; return 0; }
static inline void iflv_dots(const QWeight *w, int n0, int nt, const int8_t *xq, const float *dx, const float *xb,
                             float *out) {
    (void)w; (void)n0; (void)nt; (void)xq; (void)dx; (void)xb; (void)out;
}
#endif
#endif
