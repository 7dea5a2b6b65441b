"""EAGLE-1 head: batch-1 tokens/s with and without it, in one run (interleaved, medians).

There is no trained head for a random model, and a random head is never accepted. So the
workload is the tests' mirror (inflight/testing/eagle.py): a one-layer Mistral-shaped target
(hidden 1024, intermediate 4096, 16 heads, 4 KV heads, window 16, tiny vocabulary, float32) and
the EAGLE-1 head that is its own layer: every draft is accepted (K + 1 tokens per step). The head
is as large as the target here (a trained head is one layer of a 32-layer model), so this shows
what the machinery costs per step, not the speed-up a real head gives.

    python benchmarks/spec_eagle.py --repeat 7 --k 4 --output-len 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from bench_timing import Timer, fmt_other  # noqa: E402

from inflight import LLM, SamplingParams  # noqa: E402
from inflight.testing import make_tiny_checkpoint  # noqa: E402
from inflight.testing.eagle import make_eagle1_head, make_mirror_target  # noqa: E402

SHAPE = {"num_hidden_layers": 1, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
         "num_key_value_heads": 4}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    target = make_mirror_target(make_tiny_checkpoint("mistral", root / "target", **SHAPE))
    head = make_eagle1_head(target, root / "head", mirror=True)
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": args.k}
    llm = LLM(model=str(target), speculative_config=spec, dtype="float32", device="cpu", progress=False)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    prompt = [{"prompt_token_ids": list(range(3, 40))}]
    speculator, runs = llm.engine.speculator, {"off": [], "eagle": []}  # type: ignore[var-annotated]
    for rep in range(args.repeat + 1):  # the first round warms up
        for name in runs:
            llm.engine.speculator = speculator if name == "eagle" else None
            with Timer() as t:
                out = llm.generate(prompt, params, use_tqdm=False)[0]
            if rep:
                runs[name].append((args.output_len / t.seconds, t.other_cores or 0.0, out.metrics))
    m = runs["eagle"][-1][2]
    res = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    other = max(r[1] for rs in runs.values() for r in rs)
    print(f"cpu {platform.processor() or platform.machine()}, K={args.k}, {args.output_len} tokens, median of {args.repeat}")
    print(f"off   {res['off']:7.1f} tok/s\neagle {res['eagle']:7.1f} tok/s  {res['eagle'] / res['off']:.2f}x"
          f"  accepted {m.num_accepted_draft_tokens}/{m.num_draft_tokens} in {m.num_drafts} steps{fmt_other(other)}")
    print(json.dumps({"off_tok_s": res["off"], "eagle_tok_s": res["eagle"], "other_cores": other,
                      "accepted": m.num_accepted_draft_tokens, "drafted": m.num_draft_tokens, "steps": m.num_drafts}))  # fmt: skip


if __name__ == "__main__":
    main()
