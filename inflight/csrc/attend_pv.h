/* The decode step's P.V (decode_kernel.c's attend(), after the scores and their e^(s - max)): each
 * output element the sum over the context's positions, in order, of p * v, an FMA each from 0, as
 * pv_scalar: the same bits (tests/model/test_decode_kernel_bits.py). Included by attend_vec.h
 * (ATT_VEC builds: att_v, ATT_VL, att_row, IFL_ATT_PF, ATT_PF_AHEAD). */
#ifndef IFL_ATTEND_PV_H
#define IFL_ATTEND_PV_H

/* o0[i] = sum over the context's positions p, in order, of p0[p] v_p[c + i], i < nv vectors (o1
 * with p1 likewise when two): attend()'s `o[g][i] += pr * LD(v[i])`, an FMA each from 0 */
static inline __attribute__((always_inline)) void att_pv(const st_t *V, const int64_t *row, int start, int len,
                                                           int bs, int hd, int c, const int nv, const float *p0,
                                                           const float *p1, float *o0, float *o1, const int two,
                                                           const int pf) {
    att_v a0[4], a1[4];
    for (int k = 0; k < nv; ++k) a0[k] = a1[k] = ATT_ZERO();
    for (int p = start; p < len;) {
        const int blk = p / bs, end = (blk + 1) * bs < len ? (blk + 1) * bs : len;
        const st_t *v = V + ((long)row[blk] * bs + p % bs) * hd + c;
        for (; p < end; ++p, v += hd) {
#if IFL_ATT_PF
            if (pf) {
                const int at = p + ATT_PF_AHEAD; /* in this block, the next, or past the end (v again) */
                const st_t *w = at < end ? v + ATT_PF_AHEAD * hd : at < len ? V + ((long)row[at / bs] * bs + at % bs) * hd + c : v;
                for (int k = 0; k < nv; k += 64 / (ATT_VL * (int)sizeof(st_t))) /* a line a vector or two */
                    _mm_prefetch((const char *)(w + ATT_VL * k), _MM_HINT_T0);
            }
#else
            (void)pf;
#endif
            const att_v b0 = ATT_SET1(p0[p - start]), b1 = two ? ATT_SET1(p1[p - start]) : b0;
            for (int k = 0; k < nv; ++k) {
                const att_v x = att_row(v, ATT_VL * k);
                a0[k] = ATT_FMA(b0, x, a0[k]);
                if (two) a1[k] = ATT_FMA(b1, x, a1[k]);
            }
        }
    }
    for (int k = 0; k < nv; ++k) {
        ATT_STORE(o0 + ATT_VL * k, a0[k]);
        if (two) ATT_STORE(o1 + ATT_VL * k, a1[k]);
    }
}

#if IFL_STORAGE_BF16 && defined(__AVX512F__)
/* bf16 V rows taken 32 elements a load, split into even and odd elements (a shift and an and: a
 * bf16 is the high half of its float) where att_row widens 16 with two uops, one on the shuffle port;
 * the heads' sums kept in that order and interleaved once at the end: each output element's FMAs are
 * the same, in the same position order. ATT_PVH heads a pass share each load (16 accumulators of 32
 * registers). One key head's 7 query heads, hot (benchmarks/csrc/attend_probe.c, Intel Xeon): 4.09
 * -> 3.61 ns a (head, position) at 512 positions, 4.12 -> 3.65 at 2048. (AVX2, 2 heads a pass: 6.15
 * -> 6.45: not there.) */
#define ATT_PV_SPLIT 1
#define ATT_PVH 4
static inline void att_split(const st_t *v, att_v *even, att_v *odd) {
    const __m512i x = _mm512_loadu_si512((const void *)v);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
}
static inline void att_merge(att_v even, att_v odd, float *out) { /* out[2i] = even[i], out[2i + 1] = odd[i] */
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(even, lo, odd));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(even, hi, odd));
}
/* o[h] (H heads, row stride hd) elements c .. c + nl * 2 ATT_VL = sum over positions, in order, of
 * p[h][p] v_p: nl (1 or 2) loads a position */
static inline __attribute__((always_inline)) void att_pv_split(const st_t *V, const int64_t *row, int start, int len,
                                                                 int bs, int hd, int c, const int nl, const float *pr,
                                                                 int n, const int H, float *o, const int pf) {
    att_v acc[ATT_PVH][4];
    for (int h = 0; h < H; ++h)
        for (int k = 0; k < 2 * nl; ++k) acc[h][k] = ATT_ZERO();
    for (int p = start; p < len;) {
        const int blk = p / bs, end = (blk + 1) * bs < len ? (blk + 1) * bs : len;
        const st_t *v = V + ((long)row[blk] * bs + p % bs) * hd + c;
        for (; p < end; ++p, v += hd) {
#if IFL_ATT_PF
            if (pf) { /* the first pass: the rows ATT_PF_AHEAD on (the others find them in cache) */
                const int at = p + ATT_PF_AHEAD;
                const st_t *w = at < end ? v + ATT_PF_AHEAD * hd : at < len ? V + ((long)row[at / bs] * bs + at % bs) * hd + c : v;
                for (int k = 0; k < nl; ++k) _mm_prefetch((const char *)(w + 2 * ATT_VL * k), _MM_HINT_T0);
            }
#else
            (void)pf;
#endif
            att_v x[4];
            for (int k = 0; k < nl; ++k) att_split(v + 2 * ATT_VL * k, &x[2 * k], &x[2 * k + 1]);
            for (int h = 0; h < H; ++h) {
                const att_v b = ATT_SET1(pr[(size_t)h * n + p - start]);
                for (int k = 0; k < 2 * nl; ++k) acc[h][k] = ATT_FMA(b, x[k], acc[h][k]);
            }
        }
    }
    for (int h = 0; h < H; ++h)
        for (int k = 0; k < nl; ++k) att_merge(acc[h][2 * k], acc[h][2 * k + 1], o + (size_t)h * hd + c + 2 * ATT_VL * k);
}
#endif

/* o (nh x hd) = pr (nh rows of n) . V over the context: with bf16 rows, AVX-512 and hd % 32 == 0,
 * att_pv_split's ATT_PVH heads a pass; else two heads a pass (each V vector loaded once for both),
 * an odd nh's last head alone. The V rows prefetched in the first pass only (the others find them
 * in L2) */
static void att_pv_heads(const st_t *V, const int64_t *row, int start, int len, int bs, int hd, int nh,
                         const float *pr, int n, float *o) {
#ifdef ATT_PV_SPLIT
    if (hd % (2 * ATT_VL) == 0) {
#define ATT_SPLIT_CALL(NL, H) att_pv_split(V, row, start, len, bs, hd, c, NL, pr + (size_t)g * n, n, H, o + (size_t)g * hd, g == 0)
        for (int g = 0; g < nh; g += ATT_PVH)
            for (int c = 0; c < hd; c += 4 * ATT_VL) {
                const int nl = hd - c >= 4 * ATT_VL ? 2 : 1, H = nh - g < ATT_PVH ? nh - g : ATT_PVH;
                switch ((H - 1) * 2 + nl - 1) {
                case 0: ATT_SPLIT_CALL(1, 1); break;
                case 1: ATT_SPLIT_CALL(2, 1); break;
                case 2: ATT_SPLIT_CALL(1, 2); break;
                case 3: ATT_SPLIT_CALL(2, 2); break;
                case 4: ATT_SPLIT_CALL(1, 3); break;
                case 5: ATT_SPLIT_CALL(2, 3); break;
                case 6: ATT_SPLIT_CALL(1, 4); break;
                default: ATT_SPLIT_CALL(2, ATT_PVH);
                }
            }
#undef ATT_SPLIT_CALL
        return;
    }
#endif
#define ATT_PV_CALL(NV, TWO) att_pv(V, row, start, len, bs, hd, c, NV, p0, p1, o0, o1, TWO, g == 0)
    for (int g = 0; g < nh; g += 2) {
        const int two = g + 1 < nh;
        const float *p0 = pr + (size_t)g * n, *p1 = p0 + n;
        for (int c = 0; c < hd; c += 4 * ATT_VL) {
            float *o0 = o + (size_t)g * hd + c, *o1 = o0 + hd;
            switch ((hd - c) / ATT_VL * 2 + two) { /* hd % 16 == 0: 1 .. 4 vectors left (2 or 4 on AVX2) */
            case 2: ATT_PV_CALL(1, 0); break;
            case 3: ATT_PV_CALL(1, 1); break;
            case 4: ATT_PV_CALL(2, 0); break;
            case 5: ATT_PV_CALL(2, 1); break;
            case 6: ATT_PV_CALL(3, 0); break;
            case 7: ATT_PV_CALL(3, 1); break;
            default:
                if (two) ATT_PV_CALL(4, 1);
                else ATT_PV_CALL(4, 0);
            }
        }
    }
#undef ATT_PV_CALL
}
#endif
