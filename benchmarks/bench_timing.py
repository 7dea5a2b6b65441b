"""Generic timing helpers for the benchmarks: wall time plus how busy the rest of the machine was.

On a small shared machine one busy neighbour slows a 2-thread run several-fold, so every
measurement also records how many cores other processes kept busy meanwhile ("other
cores", from /proc/stat; None where that is unavailable), and a run can first wait for
the machine to go quiet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

# Warn when other processes kept more than this many cores busy during a measurement.
OTHER_LOAD_WARN_CORES = 0.25


class Timer:
    """Wall time of a block, plus how busy the rest of the machine was meanwhile.

    `other_cores` = (machine-wide busy CPU time - this process's CPU time) / wall time,
    from /proc/stat (None elsewhere). A value well above 0 means another process competed
    for the cores and the figure is pessimistic; worker processes of the engine, if it
    spawns any, count as "other" too.
    """

    def __enter__(self) -> Timer:
        self._busy0, self._cpu0 = _machine_busy_seconds(), time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        busy1, own = _machine_busy_seconds(), time.process_time() - self._cpu0
        self.other_cores = (None if busy1 is None or self._busy0 is None
                            else max(0.0, (busy1 - self._busy0 - own) / self.seconds))


def best_of_two(fn: Callable[[], object]) -> float:
    """Seconds of the faster of two calls (the Triton benches' CPU rehearsal: the interpreter)."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def wait_until_quiet(max_wait_s: float, probe_s: float = 1.0) -> None:
    """Block (at most `max_wait_s`) until other processes use < OTHER_LOAD_WARN_CORES cores."""
    if max_wait_s <= 0:
        return
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        with Timer() as probe:
            time.sleep(probe_s)
        if probe.other_cores is None or probe.other_cores < OTHER_LOAD_WARN_CORES:
            return
    print(f"[warn] machine still busy after waiting {max_wait_s:g}s; measuring anyway")


def _machine_busy_seconds() -> float | None:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # up to steal, no guest


def median_run(runs: list[Timer]) -> Timer:
    return sorted(runs, key=lambda t: t.seconds)[len(runs) // 2]


def fmt_other(cores: float | None) -> str:
    if cores is None or cores < OTHER_LOAD_WARN_CORES:
        return ""
    return f"  [other processes busy: {cores:.2f} cores]"


class TokenClock:
    """generate's streamer, as a clock: the time of each put since it was made (the prompt's first,
    then each step's new tokens, the whole batch at once)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.times: list[float] = []

    def put(self, value: object) -> None:
        self.times.append(time.perf_counter() - self.t0)

    def end(self) -> None:
        pass

    def tpot_ms(self) -> float | None:
        """Time per output token of the run, from its own steps (first token to last): never from two
        runs' difference, which a neighbour's load can make negative."""
        steps = self.times[1:]
        return (steps[-1] - steps[0]) / (len(steps) - 1) * 1e3 if len(steps) > 1 else None
