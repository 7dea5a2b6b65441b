"""The strict bandwidth roofline of a batch-1 step, measured beside the step itself.

A VM's read bandwidth moves with its neighbours' traffic (the Zen 4 VM of docs/QUANTIZATION.md:
25-49 GB/s from one second to the next), so a probe taken at another moment than the decode sets
a roofline the decode may "beat" or miss by chance. Here the two alternate: a decode step of
ours, then a streaming read of the same number of bytes with the same threads, many pairs; each
pair's ratio read time / step time is the fraction of the roofline that step reached at that
moment, and the median of the ratios is the figure (`paired_roofline`). The read is the fastest
found on this machine (`fastest_read`) of x.sum(), x.amax() over float32 and a C OR-reduction of
vector loads (csrc/read_probe.c: no arithmetic chain, so only the loads bound it), all over one
buffer in 2 MiB pages where the kernel has transparent huge pages, as the engine's weights are
(inflight/memory.py; on the Zen 4 VM a 525 MB x.sum() read 37 GB/s so against 32 in 4 KiB pages).

    python benchmarks/roofline.py --mb 525 --threads 2      # the probes alone, best and median GB/s
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "read_probe.c"


def c_read(buf: torch.Tensor, threads: int) -> Callable[[], None] | None:
    """The C probe over `buf`'s bytes, or None where it cannot be built here."""
    from inflight import platform
    from inflight.models.cbuild import KernelUnavailable, compile_cached, quant_compile_flags

    flags = quant_compile_flags(platform.current().quant_flavour())
    try:
        lib = ctypes.CDLL(str(compile_cached(SOURCE, "read-probe", flags)))
    except (KernelUnavailable, OSError):
        return None
    lib.ifl_read_probe.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.ifl_read_probe.restype = ctypes.c_uint64
    n = buf.numel() * buf.element_size() // 256 * 256  # whole 8-vector chunks

    def read() -> None:  # holds `buf`: the probe must not outlive its bytes
        lib.ifl_read_probe(buf.data_ptr(), n, threads)

    return read


def reads(nbytes: int, threads: int) -> dict[str, Callable[[], None]]:
    """The candidate probes, each over its own view of one nbytes buffer (float32 ones: never
    denormal or NaN, so no slow path)."""
    from inflight import memory

    x = torch.ones(max(128, nbytes // 4), dtype=torch.float32)
    memory.huge_pages([x])  # as the weights are (memory.weights_in_huge_pages): 4 KiB pages read ~14 % slower
    found: dict[str, Callable[[], None]] = {"x.sum()": lambda: x.sum() and None, "x.amax()": lambda: x.amax() and None}
    if (c := c_read(x, threads)) is not None:
        found["C vector OR"] = c
    return found


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fastest_read(nbytes: int, threads: int, rounds: int = 6) -> tuple[str, Callable[[], None], dict[str, float]]:
    """(name, probe, best GB/s of each candidate): the candidates interleaved `rounds` times, the
    one with the best single read wins (torch's reads run on torch's threads: set them first)."""
    cands = reads(nbytes, threads)
    for fn in cands.values():
        fn()  # page faults, the build
    best = dict.fromkeys(cands, 0.0)
    for _ in range(rounds):
        for name, fn in cands.items():
            best[name] = max(best[name], nbytes / timed(fn) / 1e9)
    name = max(best, key=lambda k: best[k])
    return name, cands[name], best


def paired_roofline(step: Callable[[], None], read: Callable[[], None], nbytes: int, pairs: int) -> dict[str, float]:
    """`pairs` times: a step, then the read of the same `nbytes` (the order alternating, so that
    neither always follows the other); per pair, % = read seconds / step seconds. Returns the
    median %, its quartiles, the median step ms and the median and best probe GB/s."""
    ratios, steps, gbps = [], [], []
    for i in range(pairs):
        if i % 2:
            r = timed(read)
            s = timed(step)
        else:
            s = timed(step)
            r = timed(read)
        ratios.append(100 * r / s)
        steps.append(s * 1e3)
        gbps.append(nbytes / r / 1e9)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"median_%": statistics.median(ratios), "q1_%": q[0], "q3_%": q[2], "step_ms": statistics.median(steps),
            "probe_gbps": statistics.median(gbps), "probe_best_gbps": max(gbps), "pairs": pairs}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=525.0, help="bytes per read, MB (a Q8_0 0.5B token: 525)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nbytes = int(args.mb * 1e6)
    for threads in sorted({1, args.threads}):
        torch.set_num_threads(threads)
        name, _, best = fastest_read(nbytes, threads, args.rounds)
        print(f"{threads} thread(s), {args.mb:.0f} MB: " + ", ".join(f"{k} {v:.1f}" for k, v in best.items())
              + f" GB/s (best of {args.rounds}); fastest: {name}")  # fmt: skip


if __name__ == "__main__":
    main()
