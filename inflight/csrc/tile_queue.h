/* Run-time balanced tiles for the C kernels' parallel loops (decode_kernel.c qgemv, quant_kernels.c
 * iflq_runs); included after <stdint.h>.
 *
 * The tiles of one call, balanced at run time. Each thread's static share [lo, hi) (contiguous:
 * its weight rows stream in order, which the prefetchers need; tiles dealt round-robin ran a core
 * at 9 instead of 14 GB/s) is claimed from the front by its owner, TQ_CHUNK tiles at a time; a
 * thread done with its own share takes the back half of what is left of another's (TQ_STEAL), to
 * walk in order from its own queue, where a third thread can take half of it again. Without it the early
 * thread waited at every barrier: ~1.2 ms of a 17 ms 0.5B Q8_0 step (Zen 4, 2 threads; the
 * barrier itself is 0.2 us), one core's share running a few % slower from one phase to the next.
 * One word a thread, {call : 16 | next : 24 | end : 24}: a claim is one CAS on a line its owner
 * keeps in cache, and a word left by an earlier call (another `call`) reads as the untouched share,
 * so no barrier is needed to set the queues up. A tile's sums do not depend on who computes it. */
#ifndef IFL_TILE_QUEUE_H
#define IFL_TILE_QUEUE_H
#ifndef TQ_CHUNK
#define TQ_CHUNK 4
#endif
#ifndef TQ_STEAL
/* A thief takes 1 / TQ_STEAL of what is left of a share (at least TQ_CHUNK tiles) and walks it in
 * order from its own queue, where the rest can be taken again; 0: TQ_CHUNK tiles at a time, each
 * chunk behind the last, which restarts the hardware prefetcher every 30 KB (4 tiles of 8 q8_0
 * rows of 896): the 0.5B Q8_0 file's GEMVs, 2 threads, Zen 4, loaded, CPU time (kquant_gemv.py
 * --shape qwen05b-q8 --fused --cpu --ab "TQ_STEAL=0" tree): 26.4 -> 21.8 ms a token's weights. */
#define TQ_STEAL 2
#endif
#ifndef TQ_TAPER
/* 1: an owner's claims shrink as its share runs out (half of what is left, at most TQ_CHUNK), so
 * that the last chunk a thread holds while the other has nothing left is one tile, not TQ_CHUNK:
 * the barrier after each GEMV waited for up to 4 tiles of the slower thread (Intel Xeon, 2 threads,
 * 0.5B Q8_0: ~0.85 ms of barrier waits a step; docs/quant_history.md, "Tiles by bytes") */
#define TQ_TAPER 1
#endif
#define TQ_STRIDE 8 /* uint64_t: 64 bytes */

/* The queues of a call: one line a thread, zeroed (call 0 is never a call's); NULL if out of memory. */
static inline uint64_t *tq_alloc(int nthreads) {
    uint64_t *tq = aligned_alloc(64, sizeof(uint64_t) * TQ_STRIDE * (size_t)nthreads);
    if (tq) memset(tq, 0, sizeof(uint64_t) * TQ_STRIDE * (size_t)nthreads);
    return tq;
}

static inline void tq_share(int T, int nth, int t, int *lo, int *hi) {
    *lo = (int)((int64_t)T * t / nth);
    *hi = (int)((int64_t)T * (t + 1) / nth);
}

/* Up to TQ_CHUNK tiles of thread v's share in call `call`, from its front (owner) or back; returns
 * how many (0: none left), the first in *first. */
static int tq_claim(uint64_t *tq, unsigned call, int T, int nth, int v, int owner, int *first) {
    uint64_t *w = tq + (size_t)v * TQ_STRIDE, old = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    for (;;) {
        int next, end;
        if ((unsigned)(old >> 48) != (call & 0xFFFFu)) {
            tq_share(T, nth, v, &next, &end);
        } else {
            next = (int)((old >> 24) & 0xFFFFFF);
            end = (int)(old & 0xFFFFFF);
        }
        int c = end - next < TQ_CHUNK ? end - next : TQ_CHUNK;
        if (owner && TQ_TAPER && c > (end - next + 1) / 2) c = (end - next + 1) / 2;
        if (!owner && TQ_STEAL && (end - next) / TQ_STEAL > c) c = (end - next) / TQ_STEAL; /* the back part */
        if (c <= 0) return 0;
        const int n2 = owner ? next + c : next, e2 = owner ? end : end - c;
        const uint64_t nw = ((uint64_t)(call & 0xFFFFu) << 48) | ((uint64_t)n2 << 24) | (uint64_t)e2;
        if (__atomic_compare_exchange_n(w, &old, nw, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *first = owner ? next : end - c;
            return c;
        }
    }
}

/* The next tile of this thread in call `call` (its own share first, then the others'), -1 when
 * none is left; *cur / *stop: the chunk it holds, *victim: whose share it takes from now. */
static inline int tq_next(uint64_t *tq, unsigned call, int T, int nth, int me, int *cur, int *stop, int *victim) {
    while (*cur == *stop) {
        if (*victim >= me + nth) return -1;
        int first, c = tq_claim(tq, call, T, nth, *victim % nth, *victim == me, &first);
        if (c > TQ_CHUNK) { /* a stolen run: its first chunk now, the rest in this thread's queue (its
                             * own share is done, so no one else writes that word meanwhile) */
            const uint64_t w = ((uint64_t)(call & 0xFFFFu) << 48) | ((uint64_t)(first + TQ_CHUNK) << 24) |
                               (uint64_t)(first + c);
            __atomic_store_n(tq + (size_t)me * TQ_STRIDE, w, __ATOMIC_RELEASE);
            c = TQ_CHUNK;
            *victim = me;
        }
        if (c) {
            *cur = first;
            *stop = first + c;
        } else {
            ++*victim;
        }
    }
    return (*cur)++;
}
/* for (each tile t of T this thread gets) { ... } inside a parallel region, every thread on the
 * same calls in the same order (the queues' line holds each thread's call count, word 1); no
 * barrier at the end: the caller's. */
#define TQ_FOR(tq, T, t)                                                                                      \
    for (int me_ = omp_get_thread_num(), nth_ = omp_get_num_threads(), cur_ = 0, stop_ = 0, victim_ = me_,      \
             call_ = (int)++(tq)[(size_t)me_ * TQ_STRIDE + 1], t;                                               \
         (t = tq_next((tq), (unsigned)call_, (T), nth_, me_, &cur_, &stop_, &victim_)) >= 0;)
#endif
