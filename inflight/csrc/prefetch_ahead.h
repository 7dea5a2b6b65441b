/* Keeping the memory busy while a batch-1 decode step computes (decode_kernel.c ifl_decode_step).
 * Included after tile_queue.h, quant_kernels.h, QG_RT and the FT_* qtypes. The prefetch defaults
 * off (no wall-time gain settled on the Zen 4 VM); the barrier on, for how it waits: where no wait
 * policy is set, libgomp spins 300,000 rounds (~6 ms) before it sleeps, which on a loaded 2-core
 * machine took a 0.5B Q8_0 step to 65-571 ms (paired 4-53 %) where ours (4,096 rounds, ~80 us)
 * took 40-60 ms (63-81 %), alternating quant_bench.py --paired runs at load 3.5-4.5; the same
 * under PASSIVE (74 / 73 %); quant_history.md, "prefetching the next GEMV".
 *
 * Why: at Qwen2.5-0.5B Q8_0 a step reads 525 MB in ~11 ms of GEMVs, and between them ~1.6 ms of
 * attention, norms, SiLU and barrier waits read next to nothing (Zen 4, 2 threads, 52 GB/s probe).
 * Each thread knows which weight rows it starts the next GEMV on (its static share of tile_queue.h's
 * tiles, claimed from the front), so before a GEMV the step plans the *next* one (pf_plan: the first
 * IFL_PF_BYTES of this thread's share) and the phases between tick the plan's cursor (pf_tick: a few
 * lines at a time, interleaved with their work), so that the GEMV finds its first rows in L2.
 * A prefetch changes no arithmetic: the same bits with the switches on or off (the kernel test).
 * What it measured (stream_ab.py, Q8_0 and Q4_K_M, PASSIVE, load 1-4): ticks in the attention
 * (since removed) moved time rather than saved it, o_proj 0.05-0.16 ms faster a step for 0.14-0.6 ms
 * more attention (on Zen 4 every prefetch hint fills L1, and the ticks take the core's miss slots
 * from the attention's own K / V loads); the SiLU and norm ticks and a burst of the next step's
 * first rows at the step's end (IFL_PF_TAIL; the engine's Python evicts them) within noise; the
 * barrier's ticks 2-8 % off the GEMVs' CPU time, the engine step unsettled at load 3-4.
 *
 * The cursor is thread-local (the ticks sit in loops that take no context); ifl_decode_step sets
 * it at its region's start and clears it at its end.
 *   IFL_PF          1: plan and tick; 0: every hook compiles to nothing
 *   IFL_PF_BYTES    a thread's bytes planned ahead of a GEMV (L2 is 1 MiB a core on Zen 4)
 *   IFL_PF_SILU     lines a tick of the SiLU loop (a 32-element task)
 *   IFL_PF_NORM     lines a tick of a norm's int8 rounding (a 32-element block)
 *   IFL_SPIN_BARRIER 1 (default): our own barrier (pf_barrier) in SYNC instead of OpenMP's: a
 *                   thread that arrives first ticks the rest of its plan (IFL_PF), spins as libgomp
 *                   would where GOMP_SPINCOUNT or OMP_WAIT_POLICY says (PF_SPINS rounds where
 *                   neither does), then sleeps on a futex; 0: OpenMP's barrier
 *   IFL_PF_BARRIER  lines a spin of that barrier (0: it only spins)
 *   IFL_PF_HINT     __builtin_prefetch's locality: 3 T0, 2 T1, 1 T2, 0 NTA
 *   IFL_PF_TAIL     bytes of layer 0's qkv, o and gate_up prefetched in one go at the step's end,
 *                   for the next step after the engine's Python (0: none) */
#ifndef IFL_PREFETCH_AHEAD_H
#define IFL_PREFETCH_AHEAD_H
#ifndef IFL_PF
#define IFL_PF 0
#endif
#ifndef IFL_PF_BYTES
#define IFL_PF_BYTES (512 * 1024)
#endif
#ifndef IFL_PF_SILU
#define IFL_PF_SILU 8
#endif
#ifndef IFL_PF_NORM
#define IFL_PF_NORM 4
#endif
#ifndef IFL_SPIN_BARRIER
#define IFL_SPIN_BARRIER 1
#endif
#ifndef IFL_PF_BARRIER
#define IFL_PF_BARRIER 8
#endif
#ifndef IFL_PF_TAIL
#define IFL_PF_TAIL 0
#endif
#ifndef IFL_PF_HINT
#define IFL_PF_HINT 2
#endif
#define PF_RANGES 4

/* A step's own barrier (sense by generation): the last thread in bumps gen. */
typedef struct {
    int count, gen, nth, sleepers;
} PfBarrier;

typedef struct {
    const char *p[PF_RANGES]; /* the planned byte ranges, walked in order */
    size_t n[PF_RANGES];
    int r, nr;
    size_t budget;   /* bytes the plan may still add */
    PfBarrier *bar;  /* the step's barrier while its region runs, else NULL */
} PfCursor;

#if IFL_PF || IFL_SPIN_BARRIER
static __thread PfCursor pf_cur;
#endif

#if IFL_PF
/* a new plan: the cursor forgets what it had not prefetched yet (the GEMV it was for is running) */
static inline void pf_reset(void) {
    pf_cur.r = pf_cur.nr = 0;
    pf_cur.budget = IFL_PF_BYTES;
}

static inline void pf_range(const uint8_t *p, size_t n) {
    if (n > pf_cur.budget) n = pf_cur.budget;
    if (!n || !p) return;
    pf_cur.budget -= n;
    if (pf_cur.nr && (const char *)p == pf_cur.p[pf_cur.nr - 1] + pf_cur.n[pf_cur.nr - 1]) {
        pf_cur.n[pf_cur.nr - 1] += n; /* the next part right behind the last (gate, then up) */
    } else if (pf_cur.nr < PF_RANGES) {
        pf_cur.p[pf_cur.nr] = (const char *)p;
        pf_cur.n[pf_cur.nr++] = n;
    }
}

/* Adds the front of this thread's share of a qgemv descriptor's tiles (what its owner claims first:
 * qgemv's tile order and tq_share), up to the budget left; desc NULL: nothing. */
static void pf_plan(const int64_t *desc) {
    if (!desc) return;
    const int P = (int)desc[0], K = (int)desc[1 + 2];
    if (P < 1 || P > IFLQ_MAX_PARTS) return;
    const int rt = qg_rows(desc);
    int T = 0;
    for (int p = 0; p < P; ++p) T += ((int)desc[1 + 8 * p + 1] + rt - 1) / rt;
    int lo, hi;
    tq_share(T, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    for (int p = 0, ft = 0; p < P && lo < hi && pf_cur.budget; ++p) {
        const int qt = (int)desc[1 + 8 * p], N = (int)desc[1 + 8 * p + 1], nt = (N + rt - 1) / rt;
        if (lo < ft + nt) {
            const int end = hi < ft + nt ? hi : ft + nt, r0 = (lo - ft) * rt;
            const int r1 = (end - ft) * rt < N ? (end - ft) * rt : N;
            const size_t rb = qt >= FT_BASE ? (size_t)K * (qt == FT_F8 ? 1 : qt == FT_F32 ? 4 : 2)
                                            : iflq_row_bytes(qt, K);
            pf_range((const uint8_t *)desc[1 + 8 * p + 4] + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
            lo = end;
        }
        ft += nt;
    }
}

/* the next `lines` cache lines of the plan, if any are left */
static inline void pf_tick(int lines) {
    while (lines > 0 && pf_cur.r < pf_cur.nr) {
        const char *p = pf_cur.p[pf_cur.r];
        size_t n = pf_cur.n[pf_cur.r], k = (n + 63) / 64 < (size_t)lines ? (n + 63) / 64 : (size_t)lines;
        for (size_t i = 0; i < k; ++i) __builtin_prefetch(p + 64 * i, 0, IFL_PF_HINT);
        lines -= (int)k;
        if (64 * k >= n) {
            ++pf_cur.r;
        } else {
            pf_cur.p[pf_cur.r] = p + 64 * k;
            pf_cur.n[pf_cur.r] = n - 64 * k;
        }
    }
}
#define PF_TICK(lines) pf_tick(lines)
/* plan the GEMV after the one about to run: desc (a quantized model's descriptor) or nothing */
#define PF_NEXT(quant, desc) do { pf_reset(); if (quant) pf_plan((const int64_t *)(desc)); } while (0)
#define PF_ALSO(quant, desc) do { if (quant) pf_plan((const int64_t *)(desc)); } while (0)
/* a burst of the next step's first rows (IFL_PF_TAIL bytes of this thread's shares), at the region's end */
#define PF_TAIL(quant, d0, d1, d2) do { if (IFL_PF_TAIL && (quant)) { pf_reset(); pf_cur.budget = IFL_PF_TAIL; \
    pf_plan((const int64_t *)(d0)); pf_plan((const int64_t *)(d1)); pf_plan((const int64_t *)(d2)); \
    pf_tick(IFL_PF_TAIL / 64 + 1); } } while (0)
#else
#define PF_TAIL(quant, d0, d1, d2) ((void)0)
#define pf_reset() ((void)0)
#define PF_TICK(lines) ((void)0)
#define PF_NEXT(quant, desc) ((void)0)
#define PF_ALSO(quant, desc) ((void)0)
#endif

#if IFL_SPIN_BARRIER
/* A thread that arrives first prefetches what is left of its plan (a tick a round), then spins
 * pf_idle_spins() rounds idle, then sleeps on a futex (elsewhere: yields), as OpenMP's barrier does
 * past its spin count. Memory order: the last arrival's release of gen pairs with the others'
 * acquire, as OpenMP's barrier orders the phases' writes; `sleepers` and gen are seq_cst so that
 * the last arrival either sees a sleeper and wakes it or the sleeper's futex sees the new gen. */
#ifndef PF_SPINS
/* idle pause rounds when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT says (~65 cycles each on Zen 4:
 * ~80 us). libgomp's 300,000 (~6 ms) on a loaded 2-core VM: a 0.5B step 162 -> 59 ms with ours */
#define PF_SPINS 4096
#endif
#ifdef __linux__
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PF_SLEEP(b, g) syscall(SYS_futex, &(b)->gen, FUTEX_WAIT_PRIVATE, (g), NULL, NULL, 0)
#define PF_WAKE(b) syscall(SYS_futex, &(b)->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0)
#else
#include <sched.h>
#define PF_SLEEP(b, g) sched_yield()
#define PF_WAKE(b) ((void)0)
#endif
#include <strings.h>
/* The idle spins libgomp would make: GOMP_SPINCOUNT if set ("infinite": no limit), else 0 under
 * OMP_WAIT_POLICY=passive, no limit under active, PF_SPINS otherwise. Read once (every thread
 * computes the same value, so the race is benign). */
static int pf_idle_spins(void) {
    static int cached = -1;
    int n = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (n >= 0) return n;
    const char *policy = getenv("OMP_WAIT_POLICY"), *count = getenv("GOMP_SPINCOUNT");
    if (count && *count) {
        const long long v = strncasecmp(count, "inf", 3) ? atoll(count) : INT_MAX;
        n = v < 0 ? 0 : v > INT_MAX ? INT_MAX : (int)v;
    } else if (policy && !strcasecmp(policy, "passive")) {
        n = 0;
    } else {
        n = policy && !strcasecmp(policy, "active") ? INT_MAX : PF_SPINS;
    }
    __atomic_store_n(&cached, n, __ATOMIC_RELAXED);
    return n;
}
static inline void pf_barrier(PfBarrier *b) {
    const int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->nth) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST)) PF_WAKE(b);
        return;
    }
    for (int idle = 0, limit = pf_idle_spins(); __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen;) {
#if IFL_PF
        const int work = IFL_PF_BARRIER && pf_cur.r < pf_cur.nr;
#else
        const int work = 0;
#endif
        if (work || idle < limit) {
            if (work) PF_TICK(IFL_PF_BARRIER);
            else ++idle;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->gen, __ATOMIC_SEQ_CST) == gen) PF_SLEEP(b, gen);
        __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    }
}
/* the region's start and end on every thread: the step's barrier (b: shared, zeroed), a new cursor */
#define PF_START(b) do { pf_reset(); __atomic_store_n(&(b)->nth, omp_get_num_threads(), __ATOMIC_RELAXED); \
                         pf_cur.bar = (b); } while (0)
#define PF_END() do { pf_reset(); pf_cur.bar = NULL; } while (0)
#define PF_BARRIER() do { if (pf_cur.bar) pf_barrier(pf_cur.bar); else { _Pragma("omp barrier") } } while (0)
#else
#define PF_START(b) pf_reset()
#define PF_END() pf_reset()
#define PF_BARRIER() _Pragma("omp barrier")
#endif
#endif
