/* One 32-element block of the decode step's SiLU(gate) * up (decode_kernel.c's SiLU task loop) in
 * one pass of vectors: y = ST(R(silu(LD(g))) * LD(u)) and yf = LD(y), the float row the int8
 * rounding (quant_x_block) reads, with silu_inplace's vector operations and f2bf's rounding (NaN
 * included) lane by lane: the same bits as the scalar loops it replaces (-DIFL_SILU_REF builds
 * those; tests/model/test_decode_kernel_bits.py). The task was 4 passes over 32 floats (a copy,
 * silu_inplace, the rounding product with f2bf's branch a value, quant_x_block's copy). AVX-512
 * and AVX2 + FMA builds (SILU_VEC); needs st_t and IFL_STORAGE_BF16. */
#ifndef IFL_SILU_VEC_H
#define IFL_SILU_VEC_H
#if defined(__AVX512F__) || defined(IFLQ_AVX2)
#define SILU_VEC 1
#if defined(__AVX512F__)
#define SV_L 16
typedef __m512 sv_f;
typedef __m512i sv_i;
#define SV_EXP(x) ifl_exp16(x)
#define SV_SET1(x) _mm512_set1_ps(x)
#define SV_ISET1(x) _mm512_set1_epi32((int)(x))
#define SV_ADD(a, b) _mm512_add_ps(a, b)
#define SV_SUB(a, b) _mm512_sub_ps(a, b)
#define SV_MUL(a, b) _mm512_mul_ps(a, b)
#define SV_DIV(a, b) _mm512_div_ps(a, b)
#define SV_IADD(a, b) _mm512_add_epi32(a, b)
#define SV_AND(a, b) _mm512_and_si512(a, b)
#define SV_OR(a, b) _mm512_or_si512(a, b)
#define SV_SRL(a, n) _mm512_srli_epi32(a, n)
#define SV_SLL(a, n) _mm512_slli_epi32(a, n)
#define SV_ASI(x) _mm512_castps_si512(x)
#define SV_ASF(x) _mm512_castsi512_ps(x)
#define SV_BLEND_GT(a, b, x, y) _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(a, b), x, y) /* a > b ? y : x */
#define SV_LOADF(p) _mm512_loadu_ps(p)
#define SV_STOREF(p, x) _mm512_storeu_ps(p, x)
#define SV_LOADH(p) _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p)))
#define SV_STOREH(p, x) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtepi32_epi16(x))
#else
#define SV_L 8
typedef __m256 sv_f;
typedef __m256i sv_i;
#define SV_EXP(x) ifl_exp8(x)
#define SV_SET1(x) _mm256_set1_ps(x)
#define SV_ISET1(x) _mm256_set1_epi32((int)(x))
#define SV_ADD(a, b) _mm256_add_ps(a, b)
#define SV_SUB(a, b) _mm256_sub_ps(a, b)
#define SV_MUL(a, b) _mm256_mul_ps(a, b)
#define SV_DIV(a, b) _mm256_div_ps(a, b)
#define SV_IADD(a, b) _mm256_add_epi32(a, b)
#define SV_AND(a, b) _mm256_and_si256(a, b)
#define SV_OR(a, b) _mm256_or_si256(a, b)
#define SV_SRL(a, n) _mm256_srli_epi32(a, n)
#define SV_SLL(a, n) _mm256_slli_epi32(a, n)
#define SV_ASI(x) _mm256_castps_si256(x)
#define SV_ASF(x) _mm256_castsi256_ps(x)
/* a > b ? y : x per lane (signed: a and b below 2^31 here, a magnitude and the infinity's bits) */
#define SV_BLEND_GT(a, b, x, y) _mm256_blendv_epi8(x, y, _mm256_cmpgt_epi32(a, b))
#define SV_LOADF(p) _mm256_loadu_ps(p)
#define SV_STOREF(p, x) _mm256_storeu_ps(p, x)
#define SV_LOADH(p) _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p)))
static inline void sv_storeh(void *p, __m256i x) { /* the low halves of 8 int32 lanes (each < 2^16) */
    const __m256i w = _mm256_packus_epi32(x, x); /* per 128-bit lane: 4 halves, twice */
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(_mm256_permute4x64_epi64(w, 0x08)));
}
#define SV_STOREH(p, x) sv_storeh(p, x)
#endif

#if IFL_STORAGE_BF16
/* f2bf of every lane, as 32-bit lanes holding the bf16 bits: round to nearest even, a NaN quieted */
static inline sv_i sv_f2bf(sv_f f) {
    const sv_i u = SV_ASI(f);
    const sv_i even = SV_SRL(SV_IADD(u, SV_IADD(SV_ISET1(0x7fff), SV_AND(SV_SRL(u, 16), SV_ISET1(1)))), 16);
    const sv_i nan = SV_OR(SV_SRL(u, 16), SV_ISET1(0x40));
    return SV_BLEND_GT(SV_AND(u, SV_ISET1(0x7fffffff)), SV_ISET1(0x7f800000), even, nan);
}
static inline sv_f sv_ld(const st_t *p) { return SV_ASF(SV_SLL(SV_LOADH(p), 16)); }
#else
static inline sv_f sv_ld(const st_t *p) { return SV_LOADF(p); }
#endif

/* y[i] = ST(R(silu(LD(g[i]))) * LD(u[i])), yf[i] = LD(y[i]), i < 32; y NULL: yf only */
static inline void silu_mul_block(const st_t *g, const st_t *u, st_t *y, float *yf) {
    for (int i = 0; i < 32; i += SV_L) {
        const sv_f x = sv_ld(g + i);
        sv_f s = SV_DIV(x, SV_ADD(SV_SET1(1.f), SV_EXP(SV_SUB(SV_SET1(0.f), x))));
#if IFL_STORAGE_BF16
        s = SV_ASF(SV_SLL(sv_f2bf(s), 16)); /* R */
        const sv_i h = sv_f2bf(SV_MUL(s, sv_ld(u + i)));
        if (y) SV_STOREH(y + i, h);
        SV_STOREF(yf + i, SV_ASF(SV_SLL(h, 16)));
#else
        const sv_f v = SV_MUL(s, sv_ld(u + i));
        if (y) SV_STOREF(y + i, v);
        SV_STOREF(yf + i, v);
#endif
    }
}
#endif
#endif
