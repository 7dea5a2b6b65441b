"""csrc/tile_queue.h, the run-time balanced split of the C kernels' GEMV / GEMM tiles: every tile
is handed out exactly once, a thread that finishes early takes the rest of a slow thread's share
(by halves, each walked in order), and queues left by an earlier call never leak into the next. A small C driver with real OpenMP
threads (one of them made slow), built with the system compiler as the kernels are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inflight.models.cbuild import compiler

CSRC = Path(__file__).resolve().parents[2] / "inflight" / "csrc"
DRIVER = r"""
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tile_queue.h"
int main(void) {
    const int T = 1000, calls = 3;
    uint64_t *tq = tq_alloc(4);
    int *owner = malloc(sizeof(int) * T * calls);
    memset(owner, -1, sizeof(int) * T * calls);
    int dup = 0;
#pragma omp parallel num_threads(4) reduction(+ : dup)
    for (int c = 0; c < calls; ++c) {
        const int slow = c % 4; /* a different slow thread each call */
        TQ_FOR(tq, T, t) {
            if (omp_get_thread_num() == slow) usleep(1000);
            if (__atomic_exchange_n(&owner[c * T + t], omp_get_thread_num(), __ATOMIC_RELAXED) != -1) ++dup;
        }
#pragma omp barrier
    }
    for (int c = 0; c < calls; ++c) {
        int missing = 0, by_slow = 0;
        for (int t = 0; t < T; ++t) {
            missing += owner[c * T + t] < 0;
            by_slow += owner[c * T + t] == c % 4;
        }
        printf("%d %d %d\n", missing, dup, by_slow);
    }
    return 0;
}
"""


@pytest.mark.skipif(compiler() is None, reason="no C compiler")
def test_every_tile_once_and_the_slow_threads_share_taken(tmp_path: Path) -> None:
    (tmp_path / "drv.c").write_text(DRIVER)
    exe = tmp_path / "drv"
    subprocess.run([str(compiler()), "-O2", "-fopenmp", f"-I{CSRC}", str(tmp_path / "drv.c"), "-o", str(exe)], check=True)
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        missing, dup, by_slow = map(int, line.split())
        assert missing == 0 and dup == 0
        # its static share is 250 tiles; sleeping 1 ms a tile it keeps only a few chunks of them (100 would take 0.1 s)
        assert by_slow < 100, by_slow


RUNS = r"""
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tile_queue.h"
int main(void) {
    const int T = 2000;
    uint64_t *tq = tq_alloc(2);
    int *order = malloc(sizeof(int) * T), n0 = 0;
#pragma omp parallel num_threads(2)
    TQ_FOR(tq, T, t) {
        if (omp_get_thread_num() == 1) usleep(200); /* the slow one: thread 0 takes most of its share */
        else order[n0++] = t;
    }
    int runs = 1; /* maximal runs of consecutive tiles in thread 0's order */
    for (int i = 1; i < n0; ++i) runs += order[i] != order[i - 1] + 1;
    printf("%d %d\n", n0, runs);
    return 0;
}
"""


@pytest.mark.skipif(compiler() is None, reason="no C compiler")
def test_a_thief_walks_what_it_takes_in_order(tmp_path: Path) -> None:
    """Taken 4 tiles at a time from the back, the slow share would reach thread 0 as ~200 runs, each
    behind the last (the prefetchers restart at every one); taken by halves, a handful."""
    (tmp_path / "runs.c").write_text(RUNS)
    exe = tmp_path / "runs"
    subprocess.run([str(compiler()), "-O2", "-fopenmp", f"-I{CSRC}", str(tmp_path / "runs.c"), "-o", str(exe)], check=True)
    n0, runs = map(int, subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split())
    assert n0 > 1500  # its own 1000 and most of the other's
    assert runs < 40, runs
