/* Each row's argmax and its log-softmax, from logits the decode kernel's threads just wrote, or
 * the sampler's (quant_kernels.c ifl_row_stats); included after vec_exp.h (ifl_exp16 / ifl_exp8). */
#ifndef IFL_ROW_STATS_H
#define IFL_ROW_STATS_H
/* A batch-1 greedy step reads from its 152k logits one argmax and (the Python API's cumulative
 * logprob) one logprob. As torch ops after this call (sample/sampler.py) they cost 0.4-0.5 ms a
 * step on 2 Zen 4 threads: log_softmax 0.17, argmax 0.11, gather and copies 0.15, every pass
 * cache-cold. Here each thread scans a slice of each row right after the lm_head wrote it (the
 * same static split as the GEMV's tiles: mostly its own, in its L2): max, first maximum, and
 * sum e^(x - max) with the vector exp of SiLU; the slices merge in ifl_logits's caller thread. */
typedef struct {
    float mx;      /* the slice's max (-inf for a slice of -inf) */
    int64_t at;    /* its first maximum, or its first NaN */
    int nan;       /* a NaN in the slice: torch's argmax takes the first NaN, and the logprob is NaN */
    double sum;    /* sum of e^(x - mx) over the slice (0 for a slice of -inf) */
} SliceStat;

static inline float hmax8(const float *lanes, int n, float best) {
    for (int j = 0; j < n; ++j) best = lanes[j] > best ? lanes[j] : best;
    return best;
}

/* the first index in v[lo, hi) where v == mx (mx is their max, not NaN) */
static int64_t first_equal(const float *v, int64_t lo, int64_t hi, float mx) {
    int64_t i = lo;
#if defined(IFLQ_AVX2)
    const __m256 b8 = _mm256_set1_ps(mx);
    for (; i + 8 <= hi; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), b8, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    while (i < hi && v[i] != mx) ++i;
    return i;
}

/* sum of e^(v[i] - mx) over [lo, hi): float lanes 1024 values at a time, then double (the scalar
 * tail and the portable build: double throughout; a float sum of 76k terms is off by ~1e-6) */
static double sum_exp(const float *v, int64_t lo, int64_t hi, float mx) {
    double total = 0.0;
    int64_t i = lo;
    while (i < hi) {
        const int64_t end = hi - i < 1024 ? hi : i + 1024;
        double part = 0.0;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        const __m512 m16 = _mm512_set1_ps(mx);
        for (; i + 16 <= end; i += 16) acc = _mm512_add_ps(acc, ifl_exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i), m16)));
        part += _mm512_reduce_add_ps(acc);
#elif defined(IFLQ_AVX2)
        __m256 acc = _mm256_setzero_ps();
        const __m256 m8 = _mm256_set1_ps(mx);
        for (; i + 8 <= end; i += 8) acc = _mm256_add_ps(acc, ifl_exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), m8)));
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        for (int j = 0; j < 8; ++j) part += lanes[j];
#endif
        for (; i < end; ++i) part += (double)expf(v[i] - mx);
        total += part;
    }
    return total;
}

static void slice_stat(const float *v, int64_t lo, int64_t hi, int sums, SliceStat *s) {
    float mx = -INFINITY;
    int nan = 0;
    int64_t i = lo;
#if defined(IFLQ_AVX2)
    __m256 m8 = _mm256_set1_ps(-INFINITY), un = _mm256_setzero_ps();
    for (; i + 8 <= hi; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        un = _mm256_or_ps(un, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        m8 = _mm256_max_ps(m8, a);
    }
    nan = _mm256_movemask_ps(un) != 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    mx = hmax8(lanes, 8, mx);
#endif
    for (; i < hi; ++i) {
        nan |= v[i] != v[i];
        mx = v[i] > mx ? v[i] : mx;
    }
    s->nan = nan;
    s->mx = mx;
    s->sum = 0.0;
    if (nan) {
        int64_t at = lo;
        while (v[at] == v[at]) ++at;
        s->at = at;
        return;
    }
    s->at = first_equal(v, lo, hi, mx);
    if (sums && mx != -INFINITY) s->sum = sum_exp(v, lo, hi, mx);
}

/* Inside the parallel region, after the logits' barrier: slice c of row m is item m * S + c. */
static void row_stats_slices(const float *logits, int M, int64_t N, int S, int sums, SliceStat *st) {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < M * S; ++t) {
        const int m = t / S, c = t % S;
        slice_stat(logits + (size_t)m * N, N * c / S, N * (c + 1) / S, sums, st + t);
    }
}

/* argmax[m]: torch's argmax of row m (first maximum, first NaN); logprob[m] (when not NULL): that
 * token's log-softmax, -log(sum e^(x - max)) (NaN with a NaN, an inf max or no finite value, as torch). */
static void row_stats_merge(const SliceStat *st, int M, int S, int64_t *argmax, double *logprob) {
    for (int m = 0; m < M; ++m) {
        const SliceStat *r = st + (size_t)m * S;
        int best = 0;
        for (int c = 0; c < S && !r[best].nan; ++c)
            if (r[c].nan || r[c].mx > r[best].mx) best = c;
        argmax[m] = r[best].at;
        if (!logprob) continue;
        const float mx = r[best].mx;
        double sum = 0.0;
        for (int c = 0; c < S; ++c)
            if (r[c].mx != -INFINITY) sum += r[c].sum * exp((double)r[c].mx - (double)mx);
        logprob[m] = r[best].nan || isinf(mx) ? NAN : -log(sum); /* as torch: a row of -inf is NaN */
    }
}

#endif
