"""Load time and resident memory of one model, two source trees side by side (before / after a
change): each sample is a fresh process with PYTHONPATH at one tree, the trees alternating.

    python benchmarks/load_ab.py MODEL [--tokenizer DIR] --trees /tmp/before $PWD [--reps 3] [--dtype D]

Prints per tree and sample: import seconds, `LLM(...)` seconds (load + fast-path preparation +
KV pool), time to the first token of a 4-token prompt after it, the CPU seconds of both (all
threads: steadier than wall time on a shared machine), the RSS after that token and the
peak, and the cpu_paths line. Best and median over the samples at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0 = time.perf_counter()
from inflight import LLM, SamplingParams
t1, c1 = time.perf_counter(), cpu()
kw = json.loads(sys.argv[1])
llm = LLM(progress=False, num_kv_blocks=64, max_model_len=1024, **kw)
t2 = time.perf_counter()
llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
t3, c3 = time.perf_counter(), cpu()
rss = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS")) / 1024
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
paths = getattr(llm.engine.executor.runner.model, "cpu_paths", None)
print(json.dumps({"import_s": t1 - t0, "llm_s": t2 - t1, "first_token_s": t3 - t2, "cpu_s": c3 - c1, "rss_mib": rss,
                  "peak_mib": peak, "paths": getattr(paths, "summary", "")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--trees", nargs="+", required=True)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    kw = {"model": args.model, "dtype": args.dtype} | ({"tokenizer": args.tokenizer} if args.tokenizer else {})
    got: dict[str, list[dict]] = {t: [] for t in args.trees}
    for rep in range(args.reps):
        for tree in args.trees if rep % 2 == 0 else args.trees[::-1]:
            out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kw)], env={**_env(), "PYTHONPATH": tree}, cwd=tree,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got[tree].append(r)
            print(f"{tree}: import {r['import_s']:.2f} s, LLM() {r['llm_s']:.2f} s, first token {r['first_token_s']:.2f} s "
                  f"(CPU {r['cpu_s']:.2f} s), "
                  f"RSS {r['rss_mib']:.0f} MiB (peak {r['peak_mib']:.0f}) | {r['paths']}", flush=True)
    for tree, rs in got.items():
        llm = [r["llm_s"] + r["first_token_s"] for r in rs]
        cpu = [r["cpu_s"] for r in rs]
        print(f"{tree}: LLM() to first token best {min(llm):.2f} s, median {statistics.median(llm):.2f} s "
              f"(CPU s best {min(cpu):.2f}, median {statistics.median(cpu):.2f}); "
              f"RSS median {statistics.median(r['rss_mib'] for r in rs):.0f} MiB, peak {max(r['peak_mib'] for r in rs):.0f}")


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


if __name__ == "__main__":
    main()
