/* K-quant super-blocks (q4_k, q5_k, q6_k) decoded straight into quant_gemm_groups.h's 8-row group
 * layout (included there; AVX2 / VNNI only).
 *
 * The general path (iflv_unpack_group) unpacks each of the 8 rows into a row scratch (one byte per
 * element, a float scale and offset per 16: 256 bytes + 32 floats written and read back per
 * super-block and row), then transposes it. Here a super-block of each of the 8 rows is decoded
 * in registers, 32 elements at a time, and transposed at once; its sub-block scales become float
 * vectors per row (d * sc, and -dmin * m for q4_k / q5_k) that one 8 x 8 transpose turns into
 * the per-block vectors of the group. The values are those of iflq_unpack_row (the same float
 * products), so the GEMM's result does not change, only the time the unpack takes.
 */
#ifndef IFL_QUANT_GEMM_KGROUPS_H
#define IFL_QUANT_GEMM_KGROUPS_H
#ifdef IFLQ_AVX2

/* llama.cpp's 12-byte q4_K / q5_K scale field -> 8 six-bit scales and 8 mins as 8 floats each
 * (iflq_scale_min_k4's values, sub-block j in lane j) */
static inline void iflk_scales_k4(const uint8_t *s, __m256 *sc, __m256 *m) {
    uint32_t o[4];
    iflq_k4_unpack(s, o);
    const __m128i v = _mm_setr_epi32((int)o[0], (int)o[1], (int)o[2], (int)o[3]);
    *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    *m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}

/* One super-block of 8 q4_k / q5_k rows (blk[r] NULL: a missing row, zeros) -> 8 blocks of the
 * group's half: wq 64 vectors, sc / of 64 floats each ([block][row]; IFLV_VS times apart). */
static inline void iflv_k45_super(const uint8_t *const blk[8], int five, __m256i *wq, float *sc, float *of) {
    const __m256i low = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256i fs[8], fm[8];
    for (int r = 0; r < 8; ++r) {
        if (!blk[r]) {
            fs[r] = fm[r] = _mm256_setzero_si256();
            continue;
        }
        uint16_t hd, hm;
        memcpy(&hd, blk[r], 2);
        memcpy(&hm, blk[r] + 2, 2);
        __m256 s8, m8;
        iflk_scales_k4(blk[r] + 4, &s8, &m8);
        fs[r] = _mm256_castps_si256(_mm256_mul_ps(_mm256_set1_ps(iflq_h2f(hd)), s8));
        fm[r] = _mm256_castps_si256(_mm256_mul_ps(_mm256_set1_ps(-iflq_h2f(hm)), m8));
    }
    iflv_transpose8(fs, (__m256i *)sc); /* [row][sub-block] -> [sub-block][row] */
    iflv_transpose8(fm, (__m256i *)of);
    for (int j = 0; j < 8; ++j) { /* sub-block j: the low (j even) or high nibbles of 32 bytes */
        __m256i in[8];
        for (int r = 0; r < 8; ++r) {
            if (!blk[r]) {
                in[r] = _mm256_setzero_si256();
                continue;
            }
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk[r] + (five ? 48 : 16) + 32 * (j / 2)));
            v = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, low);
            if (five) { /* bit j of qh[l] is bit 4 of element l */
                const __m256i hb = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(blk[r] + 16)), _mm_cvtsi32_si128(j));
                v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(hb, one), 4));
            }
            in[r] = v;
        }
        iflv_transpose8(in, wq + 8 * j * IFLV_VS);
    }
}

/* One super-block of 8 q6_k rows -> 8 blocks of a group's half: wq 64 vectors, sc 128 floats
 * ([block][half][row]; IFLV_VS times apart);
 * the offset -32 ws is the kernel's constant one (no float offsets). */
static inline void iflv_k6_super(const uint8_t *const blk[8], __m256i *wq, float *sc) {
    const __m256i low = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
    __m256i flo[8], fhi[8];
    for (int r = 0; r < 8; ++r) {
        if (!blk[r]) {
            flo[r] = fhi[r] = _mm256_setzero_si256();
            continue;
        }
        uint16_t hd;
        memcpy(&hd, blk[r] + 208, 2);
        const __m256 d = _mm256_set1_ps(iflq_h2f(hd));
        const __m128i scb = _mm_loadu_si128((const __m128i *)(blk[r] + 192));
        flo[r] = _mm256_castps_si256(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb))));
        fhi[r] = _mm256_castps_si256(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scb, 8)))));
    }
    /* scale j (per 16) of a row is [block j / 2][half j % 2]: sub-blocks 0-7 are blocks 0-3 */
    iflv_transpose8(flo, (__m256i *)sc);
    iflv_transpose8(fhi, (__m256i *)(sc + 64 * IFLV_VS));
    for (int h = 0; h < 2; ++h)     /* halves of 128: ql + 64 h (64 bytes), qh + 32 h (32 bytes) */
        for (int k = 0; k < 4; ++k) { /* block 4 h + k: low (k < 2) or high nibbles of ql + 32 (k & 1), qh bits 2k */
            __m256i in[8];
            for (int r = 0; r < 8; ++r) {
                if (!blk[r]) {
                    in[r] = _mm256_setzero_si256();
                    continue;
                }
                const __m256i a = _mm256_loadu_si256((const __m256i *)(blk[r] + 64 * h + 32 * (k & 1)));
                const __m256i hv = _mm256_loadu_si256((const __m256i *)(blk[r] + 128 + 32 * h));
                const __m256i lo = _mm256_and_si256(k < 2 ? a : _mm256_srli_epi16(a, 4), low);
                const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(2 * k)), three);
                in[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            }
            iflv_transpose8(in, wq + 8 * (4 * h + k) * IFLV_VS);
        }
}

/* Rows [n0, n0 + nr) of a q4_k / q5_k / q6_k weight into a group at g (iflv_unpack_group's
 * layout). Returns 0 for the other layouts. */
static int iflv_unpack_group_k(const QWeight *w, int n0, int nr, uint8_t *g, int hf) {
    const int qt = w->qtype, K = w->K, nb = K / 32, nsb = K / 256;
    if (qt != QT_Q4_K && qt != QT_Q5_K && qt != QT_Q6_K) return 0;
    const size_t rb = iflq_row_bytes(qt, K), bb = rb / (size_t)nsb;
    const int H = qt == QT_Q6_K ? 2 : 1;
    float *sc = iflv_sc(g, K, hf), *of = sc + (size_t)nb * H * IFLV_GR;
    __m256i *wq = iflv_wq(g, hf);
    const uint8_t *base = w->data + (size_t)n0 * rb;
    for (int s = 0; s < nsb; ++s) {
        const uint8_t *blk[8];
        for (int r = 0; r < 8; ++r) blk[r] = r < nr ? base + (size_t)r * rb + (size_t)s * bb : NULL;
        /* a super-block: 8 blocks x 8 vectors, and 8 blocks x H x GR scales (= 64 VS floats per H) */
        const size_t at = (size_t)s * 64 * IFLV_VS;
        if (qt == QT_Q6_K)
            iflv_k6_super(blk, wq + at, sc + 2 * at);
        else
            iflv_k45_super(blk, qt == QT_Q5_K, wq + at, sc + at, of + at);
    }
    return 1;
}

#endif /* IFLQ_AVX2 */
#endif
