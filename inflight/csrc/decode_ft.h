/* decode_kernel.c's float-format rows (f16 / bf16 / f8 / f32 weights widened in registers: ft_dot), a
 * quantized model's float layers and lm_head. Included once, in place, by decode_kernel.c. */
#ifndef IFL_DECODE_FT_H
#define IFL_DECODE_FT_H

/* ------------------------------------------------------------------ float-format parts
 * f16, bf16 and f8c QuantWeights (inflight/quant/float_kernels.py's layouts: a GGUF's F16 / BF16
 * layers beside quantized ones, `--quantization fp8`) in a quantized layer: each weight row widened
 * in registers and dotted with the float32 activations, as float_kernels.c does (no activation
 * rounding). f8c: e4m3's bits moved into a half (exponent bias 7 instead of 15), the 2^8 folded
 * into the row scale. */
/* qtype ids (cpu_kernel_quant.FLOAT_QTYPES); FT_F32: a float32 model's float lm_head beside float layers */
enum { FT_BASE = 64, FT_F16 = FT_BASE, FT_BF16, FT_F8, FT_F32 };

static inline float ft_elem(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) {
        float f;
        memcpy(&f, row + 4 * (size_t)k, 4);
        return f;
    }
    if (t == FT_F8) {
        uint8_t b = row[k];
        return h2f((uint16_t)(((b & 0x80) << 8) | ((b & 0x7f) << 7)));
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)k, 2);
    return t == FT_F16 ? h2f(h) : bf2f(h);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define FT_VL 16
typedef __m512 ftv;
static inline __attribute__((always_inline)) ftv ft_widen(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) return _mm512_loadu_ps((const float *)row + k);
    if (t == FT_F8) {
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + k)));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7));
        return _mm512_cvtph_ps(h);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)k));
    if (t == FT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#define FT_ZERO() _mm512_setzero_ps()
#define FT_FMA(w, p, a) _mm512_fmadd_ps(w, _mm512_loadu_ps(p), a)
#define FT_ADD(a, b) _mm512_add_ps(a, b)
#define FT_SUM(v) _mm512_reduce_add_ps(v)
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FT_VL 8
typedef __m256 ftv;
static inline __attribute__((always_inline)) ftv ft_widen(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) return _mm256_loadu_ps((const float *)row + k);
    if (t == FT_F8) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
        return _mm256_cvtph_ps(h);
    }
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (t == FT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#define FT_ZERO() _mm256_setzero_ps()
#define FT_FMA(w, p, a) _mm256_fmadd_ps(w, _mm256_loadu_ps(p), a)
#define FT_ADD(a, b) _mm256_add_ps(a, b)
static inline float FT_SUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* out[m] = row . x[m] (m < M, x rows of stride K); 4 accumulators per x row over the vector lanes */
static inline __attribute__((always_inline)) void ft_dot_t(const int t, const uint8_t *row, const float *x, int M,
                                                           int K, float *out) {
    for (int m = 0; m < M; ++m) {
        const float *xm = x + (size_t)m * K;
        int k = 0;
        float s = 0.f;
#ifdef FT_VL
        ftv a0 = FT_ZERO(), a1 = a0, a2 = a0, a3 = a0;
        for (; k + 4 * FT_VL <= K; k += 4 * FT_VL) {
            a0 = FT_FMA(ft_widen(t, row, k), xm + k, a0);
            a1 = FT_FMA(ft_widen(t, row, k + FT_VL), xm + k + FT_VL, a1);
            a2 = FT_FMA(ft_widen(t, row, k + 2 * FT_VL), xm + k + 2 * FT_VL, a2);
            a3 = FT_FMA(ft_widen(t, row, k + 3 * FT_VL), xm + k + 3 * FT_VL, a3);
        }
        for (; k + FT_VL <= K; k += FT_VL) a0 = FT_FMA(ft_widen(t, row, k), xm + k, a0);
        s = FT_SUM(FT_ADD(FT_ADD(a0, a1), FT_ADD(a2, a3)));
#else
        float lane[16] = {0};
        for (; k + 16 <= K; k += 16)
            for (int l = 0; l < 16; ++l) lane[l] += ft_elem(t, row, k + l) * xm[k + l];
        for (int l = 0; l < 16; ++l) s += lane[l];
#endif
        for (; k < K; ++k) s += ft_elem(t, row, k) * xm[k];
        out[m] = s;
    }
}

/* a constant type per instantiation: the widening inlines */
static void ft_dot(int t, const uint8_t *row, const float *x, int M, int K, float *out) {
    if (t == FT_F16)
        ft_dot_t(FT_F16, row, x, M, K, out);
    else if (t == FT_BF16)
        ft_dot_t(FT_BF16, row, x, M, K, out);
    else if (t == FT_F8)
        ft_dot_t(FT_F8, row, x, M, K, out);
    else
        ft_dot_t(FT_F32, row, x, M, K, out);
}

#endif
