"""Speculative decoding (n-gram prompt lookup): tokens/s with and without, in one run.

Workload (copy-heavy, stated): a random-weight Llama (hidden 1024, 8 layers, 16 heads, 4 KV
heads, intermediate 2816, vocab 32000, tied embeddings, init std 0.02; 123M parameters,
bfloat16 checkpoint). Such a model, decoding greedily, repeats itself: it emits long runs of
one token and short loops (the script prints the share of output tokens that equal an earlier
4-gram's continuation, i.e. what prompt lookup can find). Each prompt is 32 random ids + a
64-token span + 16 random ids + the span's first 8 ids again (the span "quoted" in the prompt).

Measured, on one `LLM` (the proposer switched on and off between runs, interleaved, medians of
--repeat):
  1. batch 1: requests one at a time, --output-len tokens each: tokens/s off vs on, acceptance
     rate (accepted / proposed drafts), tokens per step of a request;
  2. batch 32: 32 requests in one generate call: throughput off vs on (on = the default
     disable_by_batch_size, so speculation turns itself off), and forced on
     (disable_by_batch_size 64) to show why the rule exists.
Prints a table and JSON; never asserts timings. "other" = cores other processes kept busy;
"tok/cpu-s" = tokens per CPU second of this process (with OMP_WAIT_POLICY=PASSIVE idle threads
do not spin): on a machine others keep busy, the work each side takes, without their time.

    python benchmarks/spec_decode.py                       # K=4, 128 tokens, repeat 3
    python benchmarks/spec_decode.py --k 6 --output-len 64 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from bench_timing import Timer, fmt_other  # noqa: E402

from inflight import LLM, SamplingParams  # noqa: E402
from inflight.spec_decode.proposer import Speculator  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
          "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
          "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


# the draft model: the same vocabulary, 1/4 the width, 2 layers (9M parameters besides the embedding)
DRAFT = {**CONFIG, "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def checkpoint(root: Path, name: str = "spec-llama-1024x8", config: dict[str, Any] = CONFIG) -> Path:
    from inflight.testing.checkpoints import make_random_checkpoint

    path = root / name
    if not (path / "model.safetensors").exists():
        make_random_checkpoint(path, config=config)
    return path


def target_path(root: Path, gguf: str | None) -> Path:
    """The target checkpoint, or (`gguf`) a GGUF file of it in that quantization type."""
    path = checkpoint(root)
    if gguf is None:
        return path
    from inflight.testing.gguf import hf_to_gguf

    out = root / f"spec-llama-1024x8-{gguf}.gguf"
    return out if out.exists() else hf_to_gguf(path, out, gguf)


def prompts(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = lambda k: [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(k)]  # noqa: E731
        span = ids(64)
        out.append({"prompt_token_ids": ids(32) + span + ids(16) + span[:8]})
    return out


def run(llm: LLM, speculator: Speculator | None, batch: list[dict[str, Any]], params: SamplingParams, one_by_one: bool) -> dict[str, Any]:
    llm.engine.speculator = speculator
    cpu0 = time.process_time()  # this process's CPU time: the work, without the time others held the cores
    with Timer() as t:
        outs = [o for p in batch for o in llm.generate([p], params, use_tqdm=False)] if one_by_one else llm.generate(batch, params, use_tqdm=False)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    drafts = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_draft_tokens for o in outs)
    steps = sum(len(o.metrics.schedule_times) for o in outs)  # steps that ran each request
    return {"tok_s": tokens / t.seconds, "tok_cpu_s": tokens / (time.process_time() - cpu0), "other": t.other_cores, "acceptance": accepted / drafts if drafts else None,
            "tokens_per_step": tokens / steps, "outputs": [o.outputs[0].token_ids for o in outs]}  # fmt: skip


def lookup_share(outputs: list[list[int]], n: int = 4) -> float:
    """Share of output tokens that follow an earlier occurrence of their preceding n-gram the same way."""
    hits = total = 0
    for ids in outputs:
        seen: dict[tuple[int, ...], int] = {}
        for i in range(n, len(ids)):
            key = tuple(ids[i - n : i])
            hits += seen.get(key) == ids[i]
            total += 1
            seen[key] = ids[i]
    return hits / max(total, 1)


def identical(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> list[int]:
    """[requests whose greedy tokens are the same with and without, requests] over the runs."""
    pairs = [(a, b) for x, y in zip(off, on) for a, b in zip(x["outputs"], y["outputs"])]
    return [sum(a == b for a, b in pairs), len(pairs)]


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--batch1-requests", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batch-output-len", type=int, default=None, help="tokens per request at --batch (default: --output-len)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default="/tmp/inflight-bench")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--draft-model", action="store_true", help="also batch 1 with a random 2-layer draft model (a second engine)")
    ap.add_argument("--gguf", metavar="QTYPE", help="serve the target as a GGUF file of this type (q8_0, q4_k_m ...), "
                                                    "written from the checkpoint by inflight.testing.gguf")  # fmt: skip
    args = ap.parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": args.k}
    target = target_path(Path(args.root), args.gguf)
    llm = LLM(model=str(target), progress=False, max_num_seqs=max(32, args.batch), speculative_config=spec)
    on = llm.engine.speculator
    forced = Speculator(type(on.config)(**{**on.config.__dict__, "disable_by_batch_size": 64}), llm.engine.config.model.vocab_size)  # type: ignore[union-attr]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    batch_params = SamplingParams(max_tokens=args.batch_output_len or args.output_len, temperature=0.0, ignore_eos=True)
    one, many = prompts(args.batch1_requests, 0), prompts(args.batch, 1)
    # warm-up, over every prompt: each measured run then finds the same prompt blocks in the prefix
    # cache (the first "off" run found none, so its prompts' last pieces ran another path: bf16 / Q8_0
    # round differently there, which counted as speculation changing tokens)
    run(llm, on, one, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), True)
    # and at the batch size: without it the first batch run (off) paid the KV pool's first touch and the
    # wide GEMMs' first calls, which put "off" at 0.15-0.6x of the identical "default" run
    run(llm, forced, many, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), False)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in ("b1_off", "b1_on", "bN_off", "bN_on", "bN_forced")}
    for _ in range(args.repeat):  # interleaved: a noisy neighbour hits both sides alike
        rows["b1_off"].append(run(llm, None, one, params, True))
        rows["b1_on"].append(run(llm, on, one, params, True))
        rows["bN_off"].append(run(llm, None, many, batch_params, False))
        rows["bN_on"].append(run(llm, on, many, batch_params, False))
        rows["bN_forced"].append(run(llm, forced, many, batch_params, False))
    same = identical(rows["b1_off"], rows["b1_on"]) + identical(rows["bN_off"], rows["bN_forced"])
    res = {
        "cpu": platform.processor() or platform.machine(), "k": args.k, "output_len": args.output_len, "gguf": args.gguf,
        "paths": llm.engine.runner.model.cpu_paths.summary,
        "greedy_identical": same, "lookup_share": lookup_share(rows["b1_off"][0]["outputs"]),
        **{f"{k}_tok_s": median(v, "tok_s") for k, v in rows.items()},
        **{f"{k}_tok_cpu_s": median(v, "tok_cpu_s") for k, v in rows.items()},
        **{f"{k}_other": max((r["other"] or 0.0) for r in v) for k, v in rows.items()},
        "b1_acceptance": rows["b1_on"][0]["acceptance"], "b1_tokens_per_step": rows["b1_on"][0]["tokens_per_step"],
        "bN_forced_acceptance": rows["bN_forced"][0]["acceptance"],
    }  # fmt: skip
    print(res["paths"])
    print(f"K={args.k}, {args.output_len} tokens per request; greedy identical (requests): batch 1 {same[0]}/{same[1]}, "
          f"batch {args.batch} {same[2]}/{same[3]}; "
          f"{res['lookup_share']:.0%} of output tokens are an earlier 4-gram's continuation")
    print(f"{'':28}{'tok/s':>9}{'x':>7}{'tok/cpu-s':>11}{'x':>7}  other")
    for label, key, base in [("batch 1, off", "b1_off", "b1_off"), ("batch 1, ngram", "b1_on", "b1_off"),
                             (f"batch {args.batch}, off", "bN_off", "bN_off"), (f"batch {args.batch}, ngram (default)", "bN_on", "bN_off"),
                             (f"batch {args.batch}, ngram forced on", "bN_forced", "bN_off")]:  # fmt: skip
        cpu = res[key + "_tok_cpu_s"], res[key + "_tok_cpu_s"] / res[base + "_tok_cpu_s"]
        print(f"{label:28}{res[key + '_tok_s']:9.1f}{res[key + '_tok_s'] / res[base + '_tok_s']:7.2f}{cpu[0]:11.1f}{cpu[1]:7.2f}  "
              f"{fmt_other(res[key + '_other'])}")
    print(f"batch 1: acceptance {res['b1_acceptance']:.0%}, {res['b1_tokens_per_step']:.2f} tokens per step; "
          f"batch {args.batch} forced: acceptance {res['bN_forced_acceptance']:.0%}")
    if args.draft_model:
        draft = {"method": "draft_model", "model": str(checkpoint(Path(args.root), "spec-llama-256x2", DRAFT)), "num_speculative_tokens": args.k}
        del llm
        dm = LLM(model=str(target), progress=False, speculative_config=draft)
        run(dm, dm.engine.speculator, one[:1], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), True)
        d_runs = [run(dm, dm.engine.speculator, one, params, True) for _ in range(args.repeat)]
        res |= {"b1_draft_tok_s": median(d_runs, "tok_s"), "b1_draft_tok_cpu_s": median(d_runs, "tok_cpu_s"),
                "b1_draft_acceptance": d_runs[0]["acceptance"],
                "b1_draft_other": max(r["other"] or 0.0 for r in d_runs)}  # fmt: skip
        print(f"{'batch 1, draft model':28}{res['b1_draft_tok_s']:9.1f}{res['b1_draft_tok_s'] / res['b1_off_tok_s']:7.2f}"
              f"{res['b1_draft_tok_cpu_s']:11.1f}{res['b1_draft_tok_cpu_s'] / res['b1_off_tok_cpu_s']:7.2f}  "
              f"{fmt_other(res['b1_draft_other'])}  acceptance {res['b1_draft_acceptance'] or 0:.0%}")
    print(json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
