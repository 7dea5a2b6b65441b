"""How long `inflight` takes to answer `--help` and a start-up mistake, against the time a
process needs to import torch and transformers (what every answer cost before the CLI checked
its arguments, paths, ports, certificates and engine config first: issue 25's target is under
1 s on a 2-core machine).

Each case is a fresh `python -m inflight.cli ...` process, timed from spawn to exit; the
reference is a fresh `python -c "import torch, transformers"`. Rounds alternate between every
case and the reference, so a machine whose load drifts affects all of them alike; the median of
--rounds is printed with the CPU.

    python benchmarks/cli_startup.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inflight import platform  # noqa: E402

CASES = {
    "inflight --help": ["--help"],
    "serve: model is not a directory": ["serve", "--model", "/nonexistent"],
    "serve: block_size 24": ["serve", "--block-size", "24"],
    "serve: max_model_len past the model's": ["serve", "--max-seq-len", "99999"],
    "serve: tensor_parallel_size 3 vs 4 heads": ["serve", "--tensor-parallel-size", "3"],
    "generate: block_size 24": ["generate", "--block-size", "24", "hi"],
}
REFERENCE = "import torch, transformers (before)"


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False, timeout=600)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[str]] = {name: [sys.executable, "-m", "inflight.cli", *a] for name, a in CASES.items()}
    runs[REFERENCE] = [sys.executable, "-c", "import torch, transformers"]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, argv in runs.items():
            times[name].append(_time(argv))
    cpu = platform.current().cpu
    print(f"cpu: {cpu.model_name or cpu.name} ({cpu.num_cores} cores); median of {args.rounds} rounds, seconds")
    ref = statistics.median(times[REFERENCE])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:45s} {med:7.2f}   {med / ref:5.2f}x the reference")


if __name__ == "__main__":
    main()
