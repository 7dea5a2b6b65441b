/* e^y of 16 / 8 floats: Cephes' expf (llama.cpp's and Sleef's scheme): y = n ln2 + r, |r| <= ln2 / 2,
 * a degree-6 polynomial, times 2^n; within 2 ulp of e^y. y is clamped to [-104, 88.8]: below, e^y
 * is 0 in float32; above, it overflows to inf as expf does. The clamp passes a NaN through (min /
 * max return their second operand when either is NaN): a NaN attention score must not weigh 0. Needs IFLQ_AVX2 (AVX2 + FMA) or
 * __AVX512F__ and <immintrin.h> before it. decode_kernel.c's SiLU, the attention kernels and
 * ifl_silu_mul use it (tested against float64 in tests/model/test_decode_kernel.py). */
#ifndef IFL_VEC_EXP_H
#define IFL_VEC_EXP_H
#define IFLX_EXP_POLY(FMA, SET, r)                                                                      \
    FMA(FMA(FMA(FMA(FMA(SET(1.9875691500e-4f), r, SET(1.3981999507e-3f)), r, SET(8.3334519073e-3f)), r, \
                SET(4.1665795894e-2f)), r, SET(1.6666665459e-1f)), r, SET(5.0000001201e-1f))
#if defined(IFLQ_AVX2)
static inline __m256 ifl_exp8(__m256 y) {
    y = _mm256_min_ps(_mm256_set1_ps(88.8f), _mm256_max_ps(_mm256_set1_ps(-104.f), y)); /* NaN stays NaN */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), y);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = IFLX_EXP_POLY(_mm256_fmadd_ps, _mm256_set1_ps, r);
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    /* 2^n as 2^(n/2) 2^(n - n/2), each a normal float for n in [-150, 129] */
    __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
}
#endif
#if defined(__AVX512F__)
static inline __m512 ifl_exp16(__m512 y) {
    y = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-104.f), y));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), y);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = IFLX_EXP_POLY(_mm512_fmadd_ps, _mm512_set1_ps, r);
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* e[i] = exp(e[i] - mx) for i < n, 16 / 8 lanes at a time where the build has them (expf for the
 * tail and the portable build); returns their sum. The decode step's attention and the eager path's
 * (attention_kernels.c) both use it. */
static inline float ifl_exp_shifted(float *e, int n, float mx) {
    int i = 0;
    float sum = 0.f;
#if defined(__AVX512F__)
    const __m512 m16 = _mm512_set1_ps(mx);
    for (; i + 16 <= n; i += 16) {
        __m512 v = ifl_exp16(_mm512_sub_ps(_mm512_loadu_ps(e + i), m16));
        _mm512_storeu_ps(e + i, v);
        sum += _mm512_reduce_add_ps(v);
    }
#endif
#if defined(IFLQ_AVX2)
    const __m256 m8 = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) {
        __m256 v = ifl_exp8(_mm256_sub_ps(_mm256_loadu_ps(e + i), m8));
        _mm256_storeu_ps(e + i, v);
        float t[8];
        _mm256_storeu_ps(t, v);
        for (int j = 0; j < 8; ++j) sum += t[j];
    }
#endif
    for (; i < n; ++i) sum += (e[i] = expf(e[i] - mx));
    return sum;
}
#endif
