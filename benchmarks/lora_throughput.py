"""Multi-LoRA throughput: the same offline workload with no adapter, one adapter for every
request, and N different adapters mixed in every step (issue: 4 mixed rank-16 adapters cost
<= 25 % of the no-adapter throughput).

Workload: --num-requests (32) x --input-len (128) random prompt tokens -> exactly --output-len
(128) tokens, greedy, eos ignored, on a random-weight model of Qwen2.5-0.5B shape (dtype auto:
bf16 where the CPU computes in bf16, else float32) with random rank-16 adapters on all seven
projections (benchmarks' PEFT directories, inflight.testing.make_lora_adapter). One engine
(enable_lora, max_loras = --adapters) serves every row, so the base rows run the very same
model as the adapter rows; the no-adapter row is also run with LoRA off (the fast paths
untouched) as the reference. Prints a table with the CPU named; asserts nothing.

    python benchmarks/lora_throughput.py                  # Qwen2.5-0.5B shape, 32 x 128 -> 128
    python benchmarks/lora_throughput.py --tiny --output-len 16   # seconds: a smoke run
    python benchmarks/lora_throughput.py --micro   # the delta alone: dense masked vs segments vs gathered bmm
    python benchmarks/lora_throughput.py --linears  # every linear layer of the model, modes interleaved

`--linears` is the figure to trust on a busy machine: it times every linear layer of the real
model (oneDNN-packed base methods wrapped by LoRALinear) at a decode step's rows (32) and a
prefill chunk's (512), the three modes interleaved round by round and the median kept, so load
from other processes hits them alike. LoRA only adds work in the linear layers, so its share of
their time bounds its share of the step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from bench_timing import Timer, fmt_other, median_run, wait_until_quiet  # noqa: E402

from inflight import LLM, SamplingParams, platform  # noqa: E402
from inflight.testing import (  # noqa: E402
    QWEN25_05B_CONFIG,
    make_lora_adapter,
    make_random_checkpoint,
    make_tiny_checkpoint,
    read_config,
)


def _model(tiny: bool) -> Path:
    if tiny:
        return make_tiny_checkpoint("qwen2", tempfile.mkdtemp(prefix="inflight-lora-tiny-"))
    path = Path("/tmp/inflight-bench/qwen25-05b-bf16")
    if not (path / "model.safetensors").is_file():
        make_random_checkpoint(path, config=QWEN25_05B_CONFIG)
    return path


def _run(llm: LLM, prompts: list[list[int]], names: list[str | None], output_len: int) -> Timer:
    reqs = [
        {"prompt_token_ids": p} | ({"lora_name": n} if n else {}) for p, n in zip(prompts, names)
    ]
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    with Timer() as t:
        outs = llm.generate(reqs, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return t


def _delta(way: str, ops: list[Any], slots: Any, mask: Any, s: int, r: int) -> None:
    import torch

    for x, a, bs, outs in ops:
        y = torch.zeros(x.shape[0], sum(outs))
        p = len(outs)
        if way == "dense":
            h = (
                torch.nn.functional.linear(x, a.view(-1, a.shape[-1])).view(-1, p, s * r)
                * mask[:, None]
            )
            start = 0
            for i, (b, n) in enumerate(zip(bs, outs)):
                y[:, start : start + n].addmm_(h[:, i], b.view(n, s * r).t())
                start += n
        elif way == "segments":
            for slot in slots.unique().tolist():
                if slot < 0:
                    continue
                idx = (slots == slot).nonzero()[:, 0]
                h = torch.nn.functional.linear(x[idx], a[:, slot].reshape(p * r, -1))
                y[idx] += torch.cat(
                    [h[:, i * r : (i + 1) * r] @ b[:, slot].t() for i, b in enumerate(bs)], dim=1
                )
        else:
            safe = slots.clamp(min=0)
            h = torch.bmm(
                a[:, safe].permute(1, 0, 2, 3).reshape(x.shape[0], p * r, -1), x[:, :, None]
            )  # (T, P*R, 1)
            h = h * (slots >= 0)[:, None, None]
            start = 0
            for i, (b, n) in enumerate(zip(bs, outs)):
                y[:, start : start + n] += torch.bmm(
                    b[:, safe].permute(1, 0, 2), h[:, i * r : (i + 1) * r]
                )[..., 0]
                start += n


def _micro(num_adapters: int, rank: int) -> None:
    """Time one step's LoRA delta on the 0.5B shapes three ways (all layers of one decoder layer,
    float32, 2 threads): the dense masked GEMMs LoRALinear runs, a Python loop over the step's
    adapters (gather rows, two GEMMs, scatter back), and per-row gathered A/B with bmm."""
    import time

    import torch

    shapes = {
        "qkv": (896, [896, 128, 128]),
        "o": (896, [896]),
        "gate_up": (896, [4864, 4864]),
        "down": (4864, [896]),
    }
    gen = torch.Generator().manual_seed(0)
    s, r = num_adapters, rank
    print(f"LoRA delta per decoder layer, {s} adapters of rank {r} (float32): ms per step")
    print("| rows | dense masked (ours) | segment loop | gathered bmm |\n|---:|---:|---:|---:|")
    for rows in (1, 32, 512):
        slots = torch.randint(-1, s, (rows,), generator=gen)
        timings = []
        for way in ("dense", "segments", "bmm"):
            ops = []
            for n_in, outs in shapes.values():
                a = torch.randn(len(outs), s, r, n_in, generator=gen) * 0.02
                bs = [torch.randn(n, s, r, generator=gen) * 0.02 for n in outs]
                ops.append((torch.randn(rows, n_in, generator=gen), a, bs, outs))
            mask = (
                torch.nn.functional.one_hot(slots + 1, s + 1)[:, 1:]
                .float()
                .repeat_interleave(r, dim=1)
            )

            _delta(way, ops, slots, mask, s, r)
            t0 = time.perf_counter()
            reps = 20 if rows < 512 else 5
            for _ in range(reps):
                _delta(way, ops, slots, mask, s, r)
            timings.append((time.perf_counter() - t0) / reps * 1e3)
        print(f"| {rows} | {timings[0]:.3f} | {timings[1]:.3f} | {timings[2]:.3f} |")


def _linears(model: Path, adapters: list[Path], rounds: int) -> None:
    import statistics
    import time

    import torch

    from inflight.models.linear import GateUpLinear, linear_layers
    from inflight.models.lora import LoRALinear

    llm = LLM(
        model=str(model),
        dtype="auto",
        device="cpu",
        enable_lora=True,
        max_loras=len(adapters),
        num_kv_blocks=64,
        progress=False,
    )
    runner = llm.engine.runner
    assert runner is not None and runner.lora is not None
    for i, path in enumerate(adapters):
        runner.lora.load(i, llm.engine.adapters.load(f"a{i}", str(path)))
    layers = [m for m in linear_layers(runner.model) if isinstance(m.method, LoRALinear)]
    cpu = platform.current().cpu
    print(f"CPU: {cpu.model_name} ({cpu.num_cores} cores) | {runner.model.cpu_paths.summary}")
    print(
        f"every decoder linear layer ({len(layers)}), {len(adapters)} rank-16 adapters, median of {rounds} interleaved rounds: ms"
    )
    print(
        "| rows | base | 1 adapter | overhead | 4 mixed | overhead |\n|---:|---:|---:|---:|---:|---:|"
    )
    n = len(adapters)
    with torch.inference_mode():
        for rows in (32, 512):
            xs = [
                torch.randn(rows, layer.in_features, dtype=runner.model.lm_head.weight.dtype)
                for layer in layers
            ]
            modes = {"base": None, "one": [0] * rows, "mixed": [i % n for i in range(rows)]}
            times: dict[str, list[float]] = {k: [] for k in modes}
            for _ in range(rounds):
                for mode, slots in modes.items():
                    ctx = runner.lora.step(slots) if slots is not None else contextlib.nullcontext()
                    with ctx:
                        t0 = time.perf_counter()
                        for layer, x in zip(layers, xs):
                            layer.method.apply_silu_mul(layer, x) if isinstance(
                                layer, GateUpLinear
                            ) else layer.method.apply(layer, x)
                        times[mode].append((time.perf_counter() - t0) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"| {rows} | {med['base']:.1f} | {med['one']:.1f} | {100 * (med['one'] / med['base'] - 1):+.1f} % "
                f"| {med['mixed']:.1f} | {100 * (med['mixed'] / med['base'] - 1):+.1f} % |"
            )


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--adapters", type=int, default=4, help="distinct adapters in the mixed run")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeat", type=int, default=1, help="runs per row (the median is shown)")
    p.add_argument(
        "--tiny", action="store_true", help="the tiny test model instead of the 0.5B shape"
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="wait up to this long for an idle machine first",
    )
    p.add_argument(
        "--micro", action="store_true", help="time only the delta computation, three ways"
    )
    p.add_argument(
        "--linears",
        action="store_true",
        help="time the model's linear layers with and without adapters",
    )
    return p.parse_args()


def _make_adapters(config: dict[str, Any], rank: int, count: int) -> list[Path]:
    """`count` random PEFT adapters (seeds 0..count-1) in a fresh temporary directory."""
    root = Path(tempfile.mkdtemp(prefix="inflight-lora-adapters-"))
    return [make_lora_adapter(root / f"a{i}", config, rank=rank, seed=i) for i in range(count)]


def _engines(model: Path, args: argparse.Namespace, adapters: list[Path]) -> dict[str | None, LLM]:
    """The LoRA-off reference engine (key None) and one LoRA engine serving every adapter row
    ("lora"), both warmed up."""
    common: dict[str, Any] = dict(dtype=args.dtype, device="cpu", max_num_seqs=args.num_requests, progress=False,
                                  max_model_len=args.input_len + args.output_len + 16)  # fmt: skip
    engines: dict[str | None, LLM] = {None: LLM(model=str(model), **common)}
    engines["lora"] = LLM(
        model=str(model),
        enable_lora=True,
        max_loras=args.adapters,
        max_lora_rank=max(args.rank, 16),
        **common,
    )
    for i, path in enumerate(adapters):
        engines["lora"].load_lora_adapter(f"a{i}", str(path))
    return engines


def _warm_up(engines: dict[str | None, LLM], prompts: list[list[int]]) -> None:
    for llm in engines.values():  # warm-up: one short run each
        _run(llm, prompts[:2], [None, None], 2)
    for llm in engines.values():  # a loaded machine must not time the requests out (default 600 s)
        llm.engine.inputs.config = dataclasses.replace(
            llm.engine.inputs.config, default_timeout_s=3600.0
        )


def _report(args: argparse.Namespace, rows: list[tuple[str, Timer]], paths: str) -> None:
    n = args.num_requests
    tokens = n * args.output_len
    base = tokens / rows[0][1].seconds
    cpu = platform.current().cpu
    print(f"CPU: {cpu.model_name} ({cpu.num_cores} cores) | {paths}")
    print(
        f"{n} x ({args.input_len} -> {args.output_len}), rank-{args.rank} adapters on q/k/v/o/gate/up/down, {'tiny model' if args.tiny else 'Qwen2.5-0.5B shape'}"
    )
    print("| run | s | output tok/s | vs base |\n|---|---:|---:|---:|")
    for label, t in rows:
        tps = tokens / t.seconds
        print(
            f"| {label} | {t.seconds:.2f} | {tps:.1f} | {tps / base:.2f}x |{fmt_other(t.other_cores)}"
        )
    mixed = tokens / rows[-1][1].seconds
    print(
        f"{args.adapters} mixed adapters cost {100 * (1 - mixed / base):.1f} % of the base throughput (target <= 25 %)"
    )


def _throughput(args: argparse.Namespace) -> None:
    """The four rows (LoRA off, LoRA on without adapters, one adapter, N mixed) and their table."""
    model = _model(args.tiny)
    config = read_config(model)
    adapters = _make_adapters(config, args.rank, args.adapters)
    vocab = int(config["vocab_size"])
    prompts = [
        [(7 + 31 * i + 17 * j) % (vocab - 3) + 3 for j in range(args.input_len)]
        for i in range(args.num_requests)
    ]
    wait_until_quiet(args.wait_quiet)
    n = args.num_requests
    scenarios: list[tuple[str, str | None, list[str | None]]] = [
        ("LoRA off (base engine)", None, [None] * n),
        ("LoRA on, no adapter", "lora", [None] * n),
        ("1 adapter for all", "lora", ["a0"] * n),
        (f"{args.adapters} adapters mixed", "lora", [f"a{i % args.adapters}" for i in range(n)]),
    ]
    engines = _engines(model, args, adapters)
    paths = engines["lora"].engine.runner.model.cpu_paths.summary  # type: ignore[union-attr]
    _warm_up(engines, prompts)
    rows: list[tuple[str, Timer]] = []
    for label, key, names in scenarios:
        runs = [_run(engines[key], prompts, names, args.output_len) for _ in range(args.repeat)]
        rows.append((label, median_run(runs)))
        print(f"[{label}: {rows[-1][1].seconds:.1f} s]", flush=True)
    _report(args, rows, paths)


def main() -> None:
    args = _parse_args()
    if args.micro:
        _micro(args.adapters, args.rank)
    elif args.linears:
        model = _model(args.tiny)
        paths = _make_adapters(read_config(model), args.rank, args.adapters)
        _linears(model, paths, args.repeat if args.repeat > 1 else 7)
    else:
        _throughput(args)


if __name__ == "__main__":
    main()
