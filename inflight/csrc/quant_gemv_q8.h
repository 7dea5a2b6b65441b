/* Batch-1 GEMV of q8_0 straight from its 34-byte blocks (f16 d, 32 int8 q), one activation row
 * (iflv_q8_range: the decode step's iflv_dots) or up to IFLV_Q8_ROWS rows at once (iflv_q8_rows:
 * a speculative verification's K + 1 rows, the weights streamed once), both summing every row in the
 * same float order, so a verification row equals the one-row step bit for bit:
 *  - per 4 blocks one f16 conversion of their d and one product with their dx (no scalar
 *    conversion, product and broadcast a block); each block's 8 int32 lanes (exact) converted and
 *    FMA'd against its factor, picked from [f | f] by one in-lane permute, blocks 0 and 2 of each 4
 *    into one accumulator, 1 and 3 into a second; a last group of K / 32 mod 4 blocks padded with
 *    zero lanes and zero factors;
 *  - the two accumulators added, the 8 lanes summed by iflv_hsum8 (8 rows at once),
 *    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
 * The integer lanes may come from any exact method: the one-row VNNI path runs the weight unsigned
 * (q ^ 0x80 = q + 128) against the signed x with the lanes started at -128 sum(x) (iflv_q8_acts,
 * once per call); AVX2 and the multi-row AVX2 path |q| . sign(x, q); the multi-row VNNI path
 * (x + 128) . q started at -128 sum(q) (xu, made once per step, against each block once).
 * Figures and what was tried: docs/quant_history.md, "q8_0's 1-row GEMV". */
#ifndef IFL_QUANT_GEMV_Q8_H
#define IFL_QUANT_GEMV_Q8_H

#ifdef __AVX512VL__
#define IFLV_Q8_ROWS 8 /* 32 ymm registers: 8 accumulators + 4 blocks' q and offsets + temporaries */
#else
#define IFLV_Q8_ROWS 4
#endif

/* the f16 d of 4 blocks (blk: the first; nv < 4: the rest 0) */
static inline __m128 iflv_q8_d4(const uint8_t *blk, int nv) {
    uint64_t dh = 0;
    for (int j = 0; j < nv; ++j) {
        uint16_t h;
        memcpy(&h, blk + 34 * j, 2);
        dh |= (uint64_t)h << (16 * j);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dh));
}

/* dx of 4 blocks from dx + b (nv < 4: the rest 0) */
static inline __m128 iflv_q8_dx4(const float *dx, int nv) {
    if (nv == 4) return _mm_loadu_ps(dx);
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    memcpy(t, dx, sizeof(float) * (size_t)nv);
    return _mm_loadu_ps(t);
}

/* 4 blocks' 8 int32 lanes times their factors f (d dx, 4 blocks), into acc[0] / acc[1]. A hadd tree
 * of the 4 blocks' lanes to one convert and FMA (as the q32 formats') was slower here: Zen 4, one
 * core, in L2, K = 896 / 4864: 1.03 / 0.98 ns a block, this 0.87 / 0.81 (the old one-block loop 0.98 / 0.87) */
static inline __attribute__((always_inline)) void iflv_q8_acc4(const __m256i *p, __m128 f, __m256 *acc) {
    const __m256 ff = _mm256_insertf128_ps(_mm256_castps128_ps256(f), f, 1);
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[0]), _mm256_permute_ps(ff, 0x00), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[1]), _mm256_permute_ps(ff, 0x55), acc[1]);
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[2]), _mm256_permute_ps(ff, 0xAA), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[3]), _mm256_permute_ps(ff, 0xFF), acc[1]);
}

#ifndef IFLV_Q8_XS_K
/* the one-row VNNI path's offset lanes (K bytes of stack) up to this K; longer rows |q| . sign(x, q):
 * the lanes' 4.8 KB beside a K = 4864 row's activations cost it from DRAM (one core, Zen 4, the 0.5B
 * down, kquant_gemv.py --shape qwen05b-q8 --fused --cpu: 0.91-0.95x of the old loop with them,
 * 1.01x without), though in L2 they gain 0.84 -> 0.81 ns a block */
#define IFLV_Q8_XS_K 2048
#endif
#ifdef IFLQ_VNNI
#define IFLV_Q8_XS 1
/* -128 sum(x) per 4 activations: the lanes the unsigned q + 128 start from */
static inline void iflv_q8_acts(int K, const int8_t *xq, int32_t *xs) {
    const __m256i c = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < K / 32; ++b) {
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, _mm256_loadu_si256((const __m256i *)(xq + 32 * b)));
        _mm256_storeu_si256((__m256i *)(xs + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), s));
    }
}
#endif

#ifndef IFLV_Q8_PF
#define IFLV_Q8_PF 0 /* software prefetch of the 1-row stream this many bytes ahead (0: none) */
#endif
#ifndef IFLV_Q8_PF_HINT
#define IFLV_Q8_PF_HINT _MM_HINT_T0
#endif
/* the 136 bytes of 4 blocks, IFLV_Q8_PF ahead: a thread's rows are contiguous, so the hint runs on
 * into the next rows of its share */
static inline __attribute__((always_inline)) void iflv_q8_pf(const uint8_t *blk) {
    if (IFLV_Q8_PF) {
        _mm_prefetch((const char *)blk + IFLV_Q8_PF, IFLV_Q8_PF_HINT);
        _mm_prefetch((const char *)blk + IFLV_Q8_PF + 64, IFLV_Q8_PF_HINT);
        _mm_prefetch((const char *)blk + IFLV_Q8_PF + 128, IFLV_Q8_PF_HINT);
    }
    if (IFLV_PF2) {
        _mm_prefetch((const char *)blk + IFLV_PF2, _MM_HINT_T1);
        _mm_prefetch((const char *)blk + IFLV_PF2 + 64, _MM_HINT_T1);
        _mm_prefetch((const char *)blk + IFLV_PF2 + 128, _MM_HINT_T1);
    }
}

/* Row n of a q8_0 weight . one activation row (xs: iflv_q8_acts' lanes, or NULL), 8 lanes to sum */
static inline __attribute__((always_inline)) __m256 iflv_q8_row(const QWeight *w, int n, const int8_t *xq,
                                                                const float *dx, const int32_t *xs) {
    const int nb = w->K / 32;
    const uint8_t *row = w->data + (size_t)n * 34 * nb;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
#ifndef IFLV_Q8_XS
    (void)xs; /* the offset lanes exist only with VNNI */
#endif
    for (int b = 0; b < nb; b += 4) {
        const uint8_t *blk = row + (size_t)b * 34;
        const int nv = nb - b < 4 ? nb - b : 4;
        iflv_q8_pf(blk);
        __m256i p[4];
        for (int j = 0; j < 4; ++j) {
            if (j >= nv) { p[j] = _mm256_setzero_si256(); continue; }
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 34 * j + 2));
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * (b + j)));
#ifdef IFLV_Q8_XS
            if (xs) {
                p[j] = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(xs + 8 * (b + j))),
                                           _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), x);
                continue;
            }
#endif
            p[j] = iflq_dot32(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
        }
        iflv_q8_acc4(p, _mm_mul_ps(iflv_q8_d4(blk, nv), iflv_q8_dx4(dx + b, nv)), acc);
    }
    return _mm256_add_ps(acc[0], acc[1]);
}

/* out[r] = row n0 + r of a q8_0 weight . one activation row, r < nt; out of line as the q32 formats' */
static __attribute__((noinline)) void iflv_q8_range(const QWeight *w, int n0, int nt, const int8_t *xq,
                                                    const float *dx, float *out) {
    const int32_t *xsp = NULL;
#ifdef IFLV_Q8_XS
    const int use = w->K <= IFLV_Q8_XS_K;
    int32_t xs[use ? w->K / 4 : 1]; /* K bytes of stack */
    if (use) {
        iflv_q8_acts(w->K, xq, xs);
        xsp = xs;
    }
#endif
    for (int c = 0; c < nt; c += 8) {
        const int cn = nt - c < 8 ? nt - c : 8;
        __m256 v[8];
        for (int r = 0; r < 8; ++r) v[r] = r < cn ? iflv_q8_row(w, n0 + c + r, xq, dx, xsp) : _mm256_setzero_ps();
        float s[8];
        _mm256_storeu_ps(s, iflv_hsum8(v));
        memcpy(out + c, s, sizeof(float) * (size_t)cn);
    }
}

/* Row n of a q8_0 weight . MM <= IFLV_Q8_ROWS activation rows (xq / xu: row stride K, dx: K / 32),
 * each in iflv_q8_range's order; the block's bytes, f16 d and offset lanes loaded once for the MM rows */
static inline __attribute__((always_inline)) void iflv_q8_rows_mm(const QWeight *w, int n, const int8_t *xq,
                                                                  const float *dx, const uint8_t *xu, const int MM,
                                                                  float *out) {
    const int K = w->K, nb = K / 32;
    const uint8_t *row = w->data + (size_t)n * 34 * nb;
    __m256 acc[8][2];
    for (int m = 0; m < 8; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    int b = 0;
#ifdef IFLV_Q32_512BW
    /* whole groups of 4 on 512 bits: blocks (b, b + 1) and (b + 2, b + 3) a vector each, whose low
     * half is acc[m][0] and high half acc[m][1], the same FMAs lane for lane (the 256-bit loop was
     * ~7 % slower at 5 rows: decode_rows.py --gguf q8_0, 123M model, 1 thread) */
    __m512 az[8];
    for (int m = 0; m < 8; ++m) az[m] = _mm512_setzero_ps();
    const __m512i sel01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i sel23 = _mm512_add_epi32(sel01, _mm512_set1_epi32(2));
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *blk = row + (size_t)b * 34;
        _mm_prefetch((const char *)blk + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 2048 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 2048 + 128, _MM_HINT_T0);
        __m512i q[2], o[2];
        for (int h = 0; h < 2; ++h) {
            q[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 68 * h + 2))),
                                      _mm256_loadu_si256((const __m256i *)(blk + 68 * h + 36)), 1);
            o[h] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q[h]));
        }
        const __m128 d = iflv_q8_d4(blk, 4);
        for (int m = 0; m < MM; ++m) {
            const __m512 f = _mm512_castps128_ps512(_mm_mul_ps(d, _mm_loadu_ps(dx + (size_t)m * nb + b)));
            const uint8_t *x = xu + (size_t)m * K + 32 * (size_t)b;
            const __m512i p0 = _mm512_dpbusd_epi32(o[0], _mm512_loadu_si512((const void *)x), q[0]);
            const __m512i p1 = _mm512_dpbusd_epi32(o[1], _mm512_loadu_si512((const void *)(x + 64)), q[1]);
            az[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(sel01, f), az[m]);
            az[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(sel23, f), az[m]);
        }
    }
    for (int m = 0; m < MM; ++m) {
        acc[m][0] = _mm512_castps512_ps256(az[m]);
        acc[m][1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(az[m]), 1));
    }
#endif
    for (; b < nb; b += 4) { /* 512-bit: a last group of K / 32 mod 4 blocks */
        const uint8_t *blk = row + (size_t)b * 34;
        const int nv = nb - b < 4 ? nb - b : 4;
        _mm_prefetch((const char *)blk + 2048, _MM_HINT_T0); /* 2 KB ahead: the old rows_q8's, 5 rows 20.1 -> 18.8 ms */
        _mm_prefetch((const char *)blk + 2048 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 2048 + 128, _MM_HINT_T0);
        __m256i q[4], o[4]; /* VNNI: o = -128 sum(q) lanes; AVX2: o = |q| */
        for (int j = 0; j < 4; ++j) {
            q[j] = j < nv ? _mm256_loadu_si256((const __m256i *)(blk + 34 * j + 2)) : _mm256_setzero_si256();
#ifdef IFLQ_VNNI
            o[j] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), q[j]));
#else
            o[j] = _mm256_sign_epi8(q[j], q[j]);
#endif
        }
        const __m128 d = iflv_q8_d4(blk, nv);
        for (int m = 0; m < MM; ++m) {
            __m256i p[4];
            for (int j = 0; j < 4; ++j) {
                const size_t at = (size_t)m * K + 32 * (size_t)(b + (j < nv ? j : 0)); /* padding: q = 0 */
#ifdef IFLQ_VNNI
                (void)xq;
                p[j] = _mm256_dpbusd_epi32(o[j], _mm256_loadu_si256((const __m256i *)(xu + at)), q[j]);
#else
                (void)xu;
                p[j] = iflq_dot32(o[j], _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + at)), q[j]));
#endif
            }
            iflv_q8_acc4(p, _mm_mul_ps(d, iflv_q8_dx4(dx + (size_t)m * nb + b, nv)), acc[m]);
        }
    }
    __m256 v[8];
    for (int m = 0; m < 8; ++m) v[m] = _mm256_add_ps(acc[m][0], acc[m][1]);
    float s[8];
    _mm256_storeu_ps(s, iflv_hsum8(v));
    memcpy(out, s, sizeof(float) * (size_t)MM);
}

static void iflv_q8_rows(const QWeight *w, int n, const int8_t *xq, const float *dx, const uint8_t *xu, int MM,
                         float *out) {
    switch (MM) { /* a constant MM keeps the accumulators in registers */
    case 1: iflv_q8_rows_mm(w, n, xq, dx, xu, 1, out); break;
    case 2: iflv_q8_rows_mm(w, n, xq, dx, xu, 2, out); break;
    case 3: iflv_q8_rows_mm(w, n, xq, dx, xu, 3, out); break;
#if IFLV_Q8_ROWS == 8
    case 4: iflv_q8_rows_mm(w, n, xq, dx, xu, 4, out); break;
    case 5: iflv_q8_rows_mm(w, n, xq, dx, xu, 5, out); break;
    case 6: iflv_q8_rows_mm(w, n, xq, dx, xu, 6, out); break;
    case 7: iflv_q8_rows_mm(w, n, xq, dx, xu, 7, out); break;
#endif
    default: iflv_q8_rows_mm(w, n, xq, dx, xu, IFLV_Q8_ROWS, out); break;
    }
}

#endif
