/* inflight quantized-weight kernels: the parts shared by quant_kernels.c (QuantLinear's GEMV/GEMM)
 * and the fused decode kernel (decode_kernel.c includes this file).
 *
 * Scheme (llama.cpp's, generalised to every qtype of inflight/quant/weight.py):
 *  - activations are quantized per 32 elements to int8 with a float scale dx = max|x| / 127
 *    (llama.cpp's Q8_0), plus the float dx * sum(q) of each 16 elements ("bsum", for offsets);
 *  - a weight row is unpacked, in L1 and a few rows at a time (never the whole matrix), into
 *    one int8/uint8 q per element, a float scale ws per 16 elements and an optional float
 *    offset wm per 16: w = ws * q + wm. Every supported format has this form exactly:
 *      q8_0 i8c   q signed int8, no offset
 *      q4_0       q = nibble (0..15), ws = d, wm = -8 d
 *      q4_1 q5_1  q = 4 / 5-bit value, ws = d, wm = m;  q5_0: q = 5-bit value, ws = d, wm = -16 d
 *      q4_k q5_k  q = 4 / 5-bit value, ws = d * sc (6-bit sub-block scale), wm = -dmin * m
 *      q6_k       q = 6-bit value (0..63), ws = d * sc (int8 per 16), wm = -32 ws
 *      i4g        q = nibble, ws = s, wm = -z * s (AWQ / GPTQ groups, a multiple of 16)
 *  - products are integer: per 32 elements one u8 x s8 multiply-add into int32 lanes
 *    (maddubs + madd on AVX2, vpdpbusd on AVX-512 VNNI; signed weights move their sign onto x),
 *    scaled once per block in float; the offsets add sum_j wm_j * bsum_j (K / 16 FMAs a row).
 * The only rounding beyond the format's own is the activation's (relative error <= 1/254 per
 * element, llama.cpp's), so y equals dequantize(w) @ dequantize(quantize_q8(x)) up to float
 * summation order: that is what the tests check exactly, and the float product within 1 %.
 */
#ifndef IFL_QUANT_KERNELS_H
#define IFL_QUANT_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define IFLQ_AVX2 1
#endif
#if defined(IFLQ_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define IFLQ_VNNI 1
#elif defined(IFLQ_AVX2) && defined(__AVXVNNI__) /* AVX-VNNI (Alder Lake on): the 256-bit dot, VEX-encoded */
#define IFLQ_VNNI 1
#define _mm256_dpbusd_epi32 _mm256_dpbusd_avx_epi32
#endif

/* qtype ids: the order of inflight/quant/kernels.py QTYPE_IDS */
enum { QT_Q8_0, QT_Q4_0, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_I4G, QT_I8C, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q5_0G, QT_Q4_0G, QT_N };

typedef struct {
    int qtype, N, K, group;    /* group: i4g's group size */
    const uint8_t *data;       /* (N, row_bytes) */
    const uint16_t *scales;    /* i4g: f16 (N, K / group); i8c: float (N,) or (1,) */
    const uint8_t *zeros;      /* i4g: (N, K / group) or NULL (8) */
    int scales_per_row;        /* i8c: 1 per row, 0 one for the tensor */
} QWeight;

static inline float iflq_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; --exp; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

static inline size_t iflq_row_bytes(int qtype, int K) {
    switch (qtype) {
    case QT_Q8_0: return (size_t)K / 32 * 34;
    case QT_Q4_0: case QT_Q4_0G: return (size_t)K / 32 * 18;
    case QT_Q4_1: return (size_t)K / 32 * 20;
    case QT_Q5_0: case QT_Q5_0G: return (size_t)K / 32 * 22;
    case QT_Q5_1: return (size_t)K / 32 * 24;
    case QT_Q4_K: return (size_t)K / 256 * 144;
    case QT_Q5_K: return (size_t)K / 256 * 176;
    case QT_Q6_K: return (size_t)K / 256 * 210;
    case QT_I4G: return (size_t)K / 2;
    default: return (size_t)K; /* i8c */
    }
}

static inline int iflq_signed(int qtype) { return qtype == QT_Q8_0 || qtype == QT_I8C; }

/* q5_0g: q5_0 regrouped at load per 4 blocks, the same 88 bytes (inflight/quant/weight.py
 * regroup; K a multiple of 128): the 4 x 16 quant bytes, the low 16 bits of the 4 qh, their high
 * 16 bits, the 4 f16 d. The 1-row dot reads 4 blocks with one 512-bit load and two mask loads
 * (quant_gemv_q5g.h); here block b of a row, as q5_0's fields. */
static inline void iflq_q5g_block(const uint8_t *row, int b, uint16_t *d, uint32_t *qh, const uint8_t **qs) {
    const uint8_t *g = row + (size_t)(b / 4) * 88;
    const int k = b % 4;
    uint16_t lo, hi;
    memcpy(d, g + 80 + 2 * k, 2);
    memcpy(&lo, g + 64 + 2 * k, 2);
    memcpy(&hi, g + 72 + 2 * k, 2);
    *qh = (uint32_t)lo | (uint32_t)hi << 16;
    *qs = g + 16 * k;
}

/* q4_0g, likewise per 4 blocks (72 bytes): the 4 x 16 quant bytes, the 4 f16 d */
static inline const uint8_t *iflq_q4g_block(const uint8_t *row, int b, uint16_t *d) {
    const uint8_t *g = row + (size_t)(b / 4) * 72;
    memcpy(d, g + 64 + 2 * (b % 4), 2);
    return g + 16 * (b % 4);
}

/* llama.cpp's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block */
static inline void iflq_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The same 12 bytes, all 16 values at once: o[0..1] the 8 scales, o[2..3] the 8 mins, one byte
 * each (sub-block j in byte j), for the vector paths (quant_gemv.h, quant_gemm_kgroups.h). */
static inline void iflq_k4_unpack(const uint8_t *s, uint32_t o[4]) {
    uint32_t u[3];
    memcpy(u, s, 12);
    o[0] = u[0] & 0x3f3f3f3f;
    o[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    o[2] = u[1] & 0x3f3f3f3f;
    o[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
}

#ifdef IFLQ_AVX2
/* 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0-15), then the high ones (16-31) */
static inline __m256i iflq_nibbles16(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
/* 32 bits -> 32 bytes, 0x10 where bit i is set (llama.cpp's bytes_from_bits_32, scaled to bit 4) */
static inline __m256i iflq_bits32(uint32_t x32) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}
#endif

/* Row n of w -> q[K], ws[K / 16], wm[K / 16] (w = ws * q + wm; wm untouched for signed types). */
static void iflq_unpack_row(const QWeight *w, int n, uint8_t *q, float *ws, float *wm) {
    const int K = w->K;
    const uint8_t *row = w->data + (size_t)n * iflq_row_bytes(w->qtype, K);
    switch (w->qtype) {
    case QT_Q8_0:
        for (int b = 0; b < K / 32; ++b) {
            const uint8_t *blk = row + (size_t)b * 34;
            uint16_t h;
            memcpy(&h, blk, 2);
            ws[2 * b] = ws[2 * b + 1] = iflq_h2f(h);
            memcpy(q + 32 * b, blk + 2, 32);
        }
        break;
    case QT_Q4_0:
    case QT_Q4_0G:
        for (int b = 0; b < K / 32; ++b) {
            uint16_t h;
            const uint8_t *qs = row + (size_t)b * 18 + 2;
            if (w->qtype == QT_Q4_0G)
                qs = iflq_q4g_block(row, b, &h);
            else
                memcpy(&h, qs - 2, 2);
            float d = iflq_h2f(h);
            ws[2 * b] = ws[2 * b + 1] = d;
            wm[2 * b] = wm[2 * b + 1] = -8.f * d;
#ifdef IFLQ_AVX2
            _mm256_storeu_si256((__m256i *)(q + 32 * b), iflq_nibbles16(qs));
#else
            for (int j = 0; j < 16; ++j) {
                q[32 * b + j] = qs[j] & 0xF;
                q[32 * b + 16 + j] = qs[j] >> 4;
            }
#endif
        }
        break;
    case QT_Q4_1:
    case QT_Q5_0:
    case QT_Q5_0G:
    case QT_Q5_1: { /* d, [m], [qh (32 bits)], 16 bytes of low nibbles: element j low, j + 16 high */
        const int has_m = w->qtype == QT_Q4_1 || w->qtype == QT_Q5_1, five = w->qtype != QT_Q4_1;
        const size_t bb = iflq_row_bytes(w->qtype, 32);
        for (int b = 0; b < K / 32; ++b) {
            const uint8_t *blk = row + (size_t)b * bb;
            uint16_t h, hm = 0;
            uint32_t qh = 0;
            const uint8_t *qs;
            if (w->qtype == QT_Q5_0G) {
                iflq_q5g_block(row, b, &h, &qh, &qs);
            } else {
                memcpy(&h, blk, 2);
                if (has_m) memcpy(&hm, blk + 2, 2);
                qs = blk + 2 + 2 * has_m;
                if (five) {
                    memcpy(&qh, qs, 4);
                    qs += 4;
                }
            }
            float d = iflq_h2f(h);
            ws[2 * b] = ws[2 * b + 1] = d;
            wm[2 * b] = wm[2 * b + 1] = has_m ? iflq_h2f(hm) : -16.f * d;
#ifdef IFLQ_AVX2
            __m256i v = iflq_nibbles16(qs);
            if (five) v = _mm256_or_si256(v, iflq_bits32(qh));
            _mm256_storeu_si256((__m256i *)(q + 32 * b), v);
#else
            for (int j = 0; j < 16; ++j) {
                q[32 * b + j] = (qs[j] & 0xF) | (five ? ((qh >> j) & 1) << 4 : 0);
                q[32 * b + 16 + j] = (qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0);
            }
#endif
        }
        break;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        const int five = w->qtype == QT_Q5_K;
        const size_t bb = five ? 176 : 144;
        for (int b = 0; b < K / 256; ++b) {
            const uint8_t *blk = row + (size_t)b * bb;
            uint16_t hd, hm;
            memcpy(&hd, blk, 2);
            memcpy(&hm, blk + 2, 2);
            const float d = iflq_h2f(hd), dmin = iflq_h2f(hm);
            const uint8_t *sc = blk + 4, *qh = blk + 16, *ql = blk + (five ? 48 : 16);
            uint8_t *out = q + 256 * b;
            for (int j = 0; j < 8; ++j) { /* sub-block j: 32 elements */
                int s, m;
                iflq_scale_min_k4(j, sc, &s, &m);
                int at = 16 * b + 2 * j;
                ws[at] = ws[at + 1] = d * (float)s;
                wm[at] = wm[at + 1] = -dmin * (float)m;
                const uint8_t *src = ql + 32 * (j / 2);
                const int shift = (j & 1) ? 4 : 0;
#ifdef IFLQ_AVX2
                const __m256i one = _mm256_set1_epi8(1), low = _mm256_set1_epi8(0xF);
                __m256i v = _mm256_loadu_si256((const __m256i *)src);
                v = _mm256_and_si256(shift ? _mm256_srli_epi16(v, 4) : v, low);
                if (five) {
                    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh),
                                                                   _mm_cvtsi32_si128(j)), one);
                    v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
                }
                _mm256_storeu_si256((__m256i *)(out + 32 * j), v);
#else
                for (int l = 0; l < 32; ++l) {
                    uint8_t v = (src[l] >> shift) & 0xF;
                    if (five) v |= ((qh[l] >> j) & 1) << 4;
                    out[32 * j + l] = v;
                }
#endif
            }
        }
        break;
    }
    case QT_Q6_K:
        for (int b = 0; b < K / 256; ++b) {
            const uint8_t *blk = row + (size_t)b * 210;
            const uint8_t *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            uint16_t hd;
            memcpy(&hd, blk + 208, 2);
            const float d = iflq_h2f(hd);
            uint8_t *out = q + 256 * b;
            for (int j = 0; j < 16; ++j) {
                ws[16 * b + j] = d * (float)sc[j];
                wm[16 * b + j] = -32.f * d * (float)sc[j];
            }
            for (int h = 0; h < 2; ++h) { /* two halves of 128 */
                const uint8_t *l0 = ql + 64 * h, *hh = qh + 32 * h;
                uint8_t *o = out + 128 * h;
#ifdef IFLQ_AVX2
                const __m256i low = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
                __m256i a = _mm256_loadu_si256((const __m256i *)l0), c = _mm256_loadu_si256((const __m256i *)(l0 + 32));
                __m256i hv = _mm256_loadu_si256((const __m256i *)hh);
#define IFLQ_HI(sh) _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, sh), three), 4)
                _mm256_storeu_si256((__m256i *)o, _mm256_or_si256(_mm256_and_si256(a, low), IFLQ_HI(0)));
                _mm256_storeu_si256((__m256i *)(o + 32), _mm256_or_si256(_mm256_and_si256(c, low), IFLQ_HI(2)));
                _mm256_storeu_si256((__m256i *)(o + 64),
                                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), IFLQ_HI(4)));
                _mm256_storeu_si256((__m256i *)(o + 96),
                                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low), IFLQ_HI(6)));
#undef IFLQ_HI
                continue;
#endif
                for (int l = 0; l < 32; ++l) {
                    o[l] = (l0[l] & 0xF) | ((hh[l] & 3) << 4);
                    o[l + 32] = (l0[l + 32] & 0xF) | (((hh[l] >> 2) & 3) << 4);
                    o[l + 64] = (l0[l] >> 4) | (((hh[l] >> 4) & 3) << 4);
                    o[l + 96] = (l0[l + 32] >> 4) | (((hh[l] >> 6) & 3) << 4);
                }
            }
        }
        break;
    case QT_I4G: {
        const int g = w->group, ng = K / g;
        const uint16_t *s = w->scales + (size_t)n * ng;
        const uint8_t *z = w->zeros ? w->zeros + (size_t)n * ng : NULL;
        int i = 0;
#ifdef IFLQ_AVX2
        for (; i + 16 <= K / 2; i += 16) { /* interleave: element 2i low nibble, 2i + 1 high */
            __m128i v = _mm_loadu_si128((const __m128i *)(row + i)), m = _mm_set1_epi8(0xF);
            __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
            _mm_storeu_si128((__m128i *)(q + 2 * i), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128((__m128i *)(q + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
        }
#endif
        for (; i < K / 2; ++i) {
            q[2 * i] = row[i] & 0xF;
            q[2 * i + 1] = row[i] >> 4;
        }
        for (int j = 0; j < K / 16; ++j) {
            int gi = j * 16 / g;
            float sv = iflq_h2f(s[gi]);
            ws[j] = sv;
            wm[j] = -(float)(z ? z[gi] : 8) * sv;
        }
        break;
    }
    default: { /* QT_I8C */
        const float *s = (const float *)w->scales;
        float sv = s[w->scales_per_row ? n : 0];
        memcpy(q, row, (size_t)K);
        for (int j = 0; j < K / 16; ++j) ws[j] = sv;
        break;
    }
    }
}

/* ------------------------------------------------------------------ activations */
/* x (K floats) -> xq (K int8), dx (K / 32), xb (K / 16) = dx * sum of each 16 q. Rounding is to
 * nearest, ties to even (llama.cpp's AVX2 quantize_row_q8_0; the C path's roundf differs only on
 * exact ties). */
static void iflq_quantize_row(const float *x, int K, int8_t *xq, float *dx, float *xb) {
#ifdef IFLQ_AVX2
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
    for (int b = 0; b < K / 32; ++b) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v[k], nosign));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float d = _mm_cvtss_f32(m4) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        __m256i n[4];
        for (int k = 0; k < 4; ++k)
            n[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i lo = _mm256_add_epi32(n[0], n[1]), hi = _mm256_add_epi32(n[2], n[3]);
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        _mm256_storeu_si256((__m256i *)(xq + 32 * b), _mm256_permutevar8x32_epi32(p, order));
        dx[b] = d;
        __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(lo, hi)); /* lanes 0,1,4,5: lo; 2,3,6,7: hi */
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
        xb[2 * b] = d * (_mm_cvtss_f32(s4) + _mm_cvtss_f32(_mm_shuffle_ps(s4, s4, 1)));
        xb[2 * b + 1] = d * (_mm_cvtss_f32(_mm_shuffle_ps(s4, s4, 2)) + _mm_cvtss_f32(_mm_shuffle_ps(s4, s4, 3)));
    }
#else
    for (int b = 0; b < K / 32; ++b) {
        const float *v = x + 32 * b;
        float amax = 0.f;
        for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
        float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        dx[b] = d;
        for (int h = 0; h < 2; ++h) {
            int s = 0;
            for (int i = 16 * h; i < 16 * h + 16; ++i) {
                int qi = (int)roundf(v[i] * id);
                xq[32 * b + i] = (int8_t)qi;
                s += qi;
            }
            xb[2 * b + h] = d * (float)s;
        }
    }
#endif
}

/* ------------------------------------------------------------------ dot products
 * One unpacked weight row (q, ws, wm) against MM <= 4 quantized activation rows (row stride K,
 * K / 32, K / 16): out[m] = sum_k w_k x_k. */
#ifdef IFLQ_AVX2
static inline float iflq_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i iflq_dot32(__m256i uw, __m256i sx) { /* uint8 x int8 -> 8 int32 of 4 products */
#ifdef IFLQ_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), uw, sx);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(uw, sx), _mm256_set1_epi16(1));
#endif
}

static inline __attribute__((always_inline)) void iflq_dot_rows(const uint8_t *q, const float *ws, int sgn,
                                                                const int8_t *xq, const float *dx, int K,
                                                                const int MM, float out[4]) {
    __m256 acc[4];
    for (int m = 0; m < MM; ++m) acc[m] = _mm256_setzero_ps();
    const int nb = K / 32;
    for (int b = 0; b < nb; ++b) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        /* lanes 0-3 hold elements 0-15 of the block, lanes 4-7 elements 16-31 */
        __m256 sv = _mm256_set_m128(_mm_broadcast_ss(ws + 2 * b + 1), _mm_broadcast_ss(ws + 2 * b));
        __m256i uw = sgn ? _mm256_sign_epi8(w, w) : w;
        for (int m = 0; m < MM; ++m) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (size_t)m * K + 32 * b));
            if (sgn) xv = _mm256_sign_epi8(xv, w);
            __m256 p = _mm256_cvtepi32_ps(iflq_dot32(uw, xv));
            acc[m] = _mm256_fmadd_ps(p, _mm256_mul_ps(sv, _mm256_broadcast_ss(dx + (size_t)m * nb + b)), acc[m]);
        }
    }
    for (int m = 0; m < MM; ++m) out[m] = iflq_hsum(acc[m]);
}

static inline float iflq_dot_f(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = iflq_hsum(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}
#else
static inline void iflq_dot_rows(const uint8_t *q, const float *ws, int sgn, const int8_t *xq, const float *dx,
                                 int K, const int MM, float out[4]) {
    const int nb = K / 32;
    for (int m = 0; m < MM; ++m) {
        const int8_t *xm = xq + (size_t)m * K;
        float acc = 0.f;
        for (int b = 0; b < nb; ++b) {
            int32_t s0 = 0, s1 = 0;
            if (sgn) {
                for (int i = 0; i < 16; ++i) s0 += (int8_t)q[32 * b + i] * xm[32 * b + i];
                for (int i = 16; i < 32; ++i) s1 += (int8_t)q[32 * b + i] * xm[32 * b + i];
            } else {
                for (int i = 0; i < 16; ++i) s0 += q[32 * b + i] * xm[32 * b + i];
                for (int i = 16; i < 32; ++i) s1 += q[32 * b + i] * xm[32 * b + i];
            }
            acc += dx[(size_t)m * nb + b] * (ws[2 * b] * (float)s0 + ws[2 * b + 1] * (float)s1);
        }
        out[m] = acc;
    }
}

static inline float iflq_dot_f(const float *a, const float *b, int n) {
    float lane[8] = {0}, s = 0.f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
    for (; i < n; ++i) s += a[i] * b[i];
    for (int l = 0; l < 8; ++l) s += lane[l];
    return s;
}
#endif

/* Unpacked row against MM activation rows, offsets included. */
static inline void iflq_dot(const uint8_t *q, const float *ws, const float *wm, int sgn, const int8_t *xq,
                            const float *dx, const float *xb, int K, int MM, float out[4]) {
    switch (MM) { /* a constant MM keeps the accumulators in registers */
    case 1: iflq_dot_rows(q, ws, sgn, xq, dx, K, 1, out); break;
    case 2: iflq_dot_rows(q, ws, sgn, xq, dx, K, 2, out); break;
    case 3: iflq_dot_rows(q, ws, sgn, xq, dx, K, 3, out); break;
    default: iflq_dot_rows(q, ws, sgn, xq, dx, K, 4, out); break;
    }
    if (!sgn)
        for (int m = 0; m < MM; ++m) out[m] += iflq_dot_f(wm, xb + (size_t)m * (K / 16), K / 16);
}

#include "quant_gemv.h"

/* Bytes of one thread's unpack buffer for `rows` rows of K. */
static inline size_t iflq_unpack_bytes(int rows, int K) { return (size_t)rows * ((size_t)K + (size_t)K / 16 * 8) + 64; }

/* y[m * ldy + n] = x_m . w_n (+ bias[n]) for n in [n0, n1), the rows unpacked `RT` at a time into
 * buf (iflq_unpack_bytes(RT, K)), or, for a few activation rows of a K-quant / q8_0 weight,
 * multiplied straight from the blocks (quant_gemv.h); float output. xq/dx/xb: M quantized
 * activation rows. */
#define IFLQ_RT 8
static void iflq_rows(const QWeight *w, int n0, int n1, const int8_t *xq, const float *dx, const float *xb, int M,
                      float *y, int ldy, const float *bias, uint8_t *buf) {
    const int K = w->K, sgn = iflq_signed(w->qtype);
    if (iflv_use(w->qtype, M)) {
        for (int t0 = n0; t0 < n1; t0 += IFLQ_RT)
            for (int m = 0; m < M; ++m) {
                float out[IFLQ_RT];
                const int nt = n1 - t0 < IFLQ_RT ? n1 - t0 : IFLQ_RT;
                iflv_dots(w, t0, nt, xq + (size_t)m * K, dx + (size_t)m * (K / 32), xb + (size_t)m * (K / 16), out);
                for (int r = 0; r < nt; ++r) y[(size_t)m * ldy + t0 + r] = out[r] + (bias ? bias[t0 + r] : 0.f);
            }
        return;
    }
    uint8_t *q = buf;
    float *ws = (float *)(buf + (size_t)IFLQ_RT * K), *wm = ws + (size_t)IFLQ_RT * (K / 16);
    for (int t0 = n0; t0 < n1; t0 += IFLQ_RT) {
        int nt = n1 - t0 < IFLQ_RT ? n1 - t0 : IFLQ_RT;
        for (int r = 0; r < nt; ++r)
            iflq_unpack_row(w, t0 + r, q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16));
        for (int m0 = 0; m0 < M; m0 += 4) {
            int mm = M - m0 < 4 ? M - m0 : 4;
            for (int r = 0; r < nt; ++r) {
                float out[4];
                iflq_dot(q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16), sgn,
                         xq + (size_t)m0 * K, dx + (size_t)m0 * (K / 32), xb + (size_t)m0 * (K / 16), K, mm, out);
                float bv = bias ? bias[t0 + r] : 0.f;
                for (int m = 0; m < mm; ++m) y[(size_t)(m0 + m) * ldy + t0 + r] = out[m] + bv;
            }
        }
    }
}
#endif
