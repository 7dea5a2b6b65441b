/* The read-bandwidth probe of benchmarks/roofline.py (`fastest_read`): n bytes streamed by
 * `nthreads` OpenMP threads, each its contiguous share, OR-reduced in 8 independent vector
 * accumulators so that the loop is bound by the loads alone (no float arithmetic, unlike x.sum()).
 * Built with the quantized kernels' flavour flags; nothing of inflight calls it. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 256-bit loads even where AVX-512 runs: on the Zen 4 VM one core read 23.0 GB/s with them, 20.9
 * with 512-bit ones (best of 8, interleaved; software prefetch made both slower) */
#if defined(__AVX2__)
#include <immintrin.h>
typedef __m256i vec;
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VOR(a, b) _mm256_or_si256(a, b)
#define VZERO() _mm256_setzero_si256()
#else
typedef uint64_t vec;
static inline vec VLOAD(const uint8_t *p) { vec v; memcpy(&v, p, sizeof v); return v; }
#define VOR(a, b) ((a) | (b))
#define VZERO() ((vec)0)
#endif

static uint64_t fold(vec v) {
    uint64_t w[sizeof(vec) / 8], r = 0;
    memcpy(w, &v, sizeof v);
    for (size_t i = 0; i < sizeof(vec) / 8; ++i) r |= w[i];
    return r;
}

/* The OR of all 8-byte words of p[0 .. n) (n a multiple of 8 * sizeof(vec); the result only keeps
 * the loads alive). */
uint64_t ifl_read_probe(const uint8_t *p, size_t n, int nthreads) {
    const size_t step = 8 * sizeof(vec), chunks = n / step;
    uint64_t all = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : all)
    {
        vec a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO(), a4 = VZERO(), a5 = VZERO(), a6 = VZERO(),
            a7 = VZERO();
#pragma omp for schedule(static)
        for (size_t c = 0; c < chunks; ++c) {
            const uint8_t *q = p + c * step;
            a0 = VOR(a0, VLOAD(q));
            a1 = VOR(a1, VLOAD(q + sizeof(vec)));
            a2 = VOR(a2, VLOAD(q + 2 * sizeof(vec)));
            a3 = VOR(a3, VLOAD(q + 3 * sizeof(vec)));
            a4 = VOR(a4, VLOAD(q + 4 * sizeof(vec)));
            a5 = VOR(a5, VLOAD(q + 5 * sizeof(vec)));
            a6 = VOR(a6, VLOAD(q + 6 * sizeof(vec)));
            a7 = VOR(a7, VLOAD(q + 7 * sizeof(vec)));
        }
        all |= fold(VOR(VOR(VOR(a0, a1), VOR(a2, a3)), VOR(VOR(a4, a5), VOR(a6, a7))));
    }
    return all;
}
