/* inflight CPU decode attention: the single-token rows of a step (batched decode) attend to their
 * context straight from the paged float32 KV cache (inflight/models/attention.py's layout):
 *
 *     kv (2, KV, slots, hd), K at [0], V at [1]; position p of row d at slot
 *     table[d][p / bs] * bs + p % bs
 *
 * out (D, H, hd) = softmax(q . K^T * scale) . V over positions [start, ctx[d]), start = ctx - window
 * with a sliding window, else 0. The torch path it replaces (attention.py _decode_attention) gathers
 * every row's blocks into a padded (2, KV, D, L, hd) copy (index_select) and runs two batched
 * matmuls of D x KV small matrices: 1.3 ms a layer at 32 rows x ~200 positions (Qwen2.5-0.5B,
 * Zen 4, 2 threads), 30 ms of a 220 ms Q8_0 decode step. Here one task per (row, KV head) walks
 * the row's blocks once: each block's scores for the G query heads that share the KV head, an
 * online softmax (running max, the sums rescaled when it rises), and P.V accumulated in float32,
 * one division at the end; exp is the vector Cephes exp of the decode kernel's SiLU (vec_exp.h).
 * Equal to the torch path up to float32 summation order and exp's rounding (2 ulp).
 * Built per instruction-set flavour like quant_kernels.c (platform.QUANT_FLAVOURS' flags).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define IFLQ_AVX2 1
#endif
#include "vec_exp.h"

/* per-thread stack buffers: (G x hd) q and accumulators, (G x bs) scores: 80 KB at the maxima */
#define IFLA_MAX_HD 256 /* floats of one head */
#define IFLA_MAX_G 32   /* query heads per KV head */
#define IFLA_MAX_BS 128 /* positions per cache block */

int ifl_attn_abi_version(void) { return 1; }

/* 0 portable C, 1 AVX2 + FMA, 2 AVX-512 */
int ifl_attn_path(void) {
#if defined(__AVX512F__)
    return 2;
#elif defined(IFLQ_AVX2)
    return 1;
#else
    return 0;
#endif
}

#if defined(IFLQ_AVX2)
/* The 8 horizontal sums of v[0..7], in order, as one vector. */
static inline __m256 hsum8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

/* s[t] = q . k_t for the n (<= IFLA_MAX_BS) consecutive keys k (n x hd): 8 keys at a time, each
 * one vector accumulator, then one transposing reduction (a horizontal sum per key cost as much as
 * its 8 FMAs at hd 64). */
static void scores(const float *q, const float *k, int n, int hd, float *s) {
    int t = 0;
#if defined(IFLQ_AVX2)
    if (hd % 8 == 0)
        for (; t + 8 <= n; t += 8) {
            __m256 acc[8];
            for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 8) {
                const __m256 qv = _mm256_loadu_ps(q + i);
                for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (size_t)(t + j) * hd + i), acc[j]);
            }
            _mm256_storeu_ps(s + t, hsum8(acc));
        }
#endif
    for (; t < n; ++t) {
        float a = 0.f;
        for (int i = 0; i < hd; ++i) a += q[i] * k[(size_t)t * hd + i];
        s[t] = a;
    }
}

/* acc (hd) += sum_t p[t] v_t over the n consecutive values v (n x hd), 64 floats of acc at a time
 * held in registers across the n values (not a load and store of acc per value). */
static void accumulate(const float *p, const float *v, int n, int hd, float *acc) {
    int c = 0;
    for (; c + 64 <= hd; c += 64) {
        float a[64];
        memcpy(a, acc + c, sizeof a);
        for (int t = 0; t < n; ++t)
            for (int i = 0; i < 64; ++i) a[i] += p[t] * v[(size_t)t * hd + c + i];
        memcpy(acc + c, a, sizeof a);
    }
    for (; c < hd; ++c)
        for (int t = 0; t < n; ++t) acc[c] += p[t] * v[(size_t)t * hd + c];
}

/* Row d, KV head kvh: its G query heads (q rows kvh * G ...) over positions [start, len). */
static void attend_group(int G, int hd, int bs, const float *q, const float *K, const float *V,
                         const int64_t *row, int start, int len, float scale, float *out) {
    float qs[IFLA_MAX_G * IFLA_MAX_HD] __attribute__((aligned(64)));
    float acc[IFLA_MAX_G * IFLA_MAX_HD] __attribute__((aligned(64)));
    float s[IFLA_MAX_G][IFLA_MAX_BS], mx[IFLA_MAX_G], sum[IFLA_MAX_G];
    for (int i = 0; i < G * hd; ++i) qs[i] = q[i] * scale, acc[i] = 0.f;
    for (int g = 0; g < G; ++g) mx[g] = -INFINITY, sum[g] = 0.f;
    for (int p = start; p < len;) {
        const int blk = p / bs, end = (blk + 1) * bs < len ? (blk + 1) * bs : len, n = end - p;
        const long base = (long)row[blk] * bs - (long)blk * bs; /* slot of position p: base + p */
        const float *k = K + (base + p) * hd, *v = V + (base + p) * hd; /* a block's slots are consecutive */
        for (int g = 0; g < G; ++g) scores(qs + g * hd, k, n, hd, s[g]);
        for (int g = 0; g < G; ++g) {
            float bm = s[g][0];
            for (int t = 1; t < n; ++t) bm = s[g][t] > bm ? s[g][t] : bm;
            if (bm > mx[g]) { /* the running max rises: rescale what was summed under the old one */
                const float c = mx[g] == -INFINITY ? 0.f : expf(mx[g] - bm);
                sum[g] *= c;
                for (int i = 0; i < hd; ++i) acc[g * hd + i] *= c;
                mx[g] = bm;
            }
            sum[g] += ifl_exp_shifted(s[g], n, mx[g]);
        }
        for (int g = 0; g < G; ++g) accumulate(s[g], v, n, hd, acc + g * hd);
        p = end;
    }
    for (int g = 0; g < G; ++g) {
        const float inv = sum[g] > 0.f ? 1.f / sum[g] : 0.f; /* no position (len 0): zeros */
        for (int i = 0; i < hd; ++i) out[g * hd + i] = acc[g * hd + i] * inv;
    }
}

/* q (D, H, hd) and out (D, H, hd) contiguous float32; kv (2, KV, slots, hd); table rows of
 * `table_stride` int64 block ids; ctx (D,) int64 positions attended by each row (its own token
 * included); window 0: none. Returns 0, or -1 on a shape the fixed buffers do not hold. */
int ifl_decode_attention(int D, int H, int KV, int hd, int bs, const float *q, const float *kv, int64_t slots,
                         const int64_t *table, int64_t table_stride, const int64_t *ctx, int window, float scale,
                         float *out, int nthreads) {
    if (KV <= 0 || H % KV || H / KV > IFLA_MAX_G || hd > IFLA_MAX_HD || bs > IFLA_MAX_BS || bs <= 0)
        return -1;
    const int G = H / KV;
    const float *Kc = kv, *Vc = kv + (size_t)KV * slots * hd;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int task = 0; task < D * KV; ++task) {
        const int d = task / KV, kvh = task % KV, len = (int)ctx[d];
        const int start = window > 0 && len > window ? len - window : 0;
        attend_group(G, hd, bs, q + ((size_t)d * H + (size_t)kvh * G) * hd, Kc + (size_t)kvh * slots * hd,
                     Vc + (size_t)kvh * slots * hd, table + (size_t)d * table_stride, start, len, scale,
                     out + ((size_t)d * H + (size_t)kvh * G) * hd);
    }
    return 0;
}
