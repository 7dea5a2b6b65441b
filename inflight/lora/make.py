"""`inflight lora make OUT_DIR`: a small PEFT LoRA adapter to try LoRA serving with.

Random weights (it teaches the model nothing; it visibly changes its answers) in PEFT's layout
for a checkpoint's shapes: the bundled demo model unless `--model` names another Llama-family
checkpoint. Serve it with `inflight serve --lora-modules NAME=OUT_DIR` and ask for `model: NAME`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inflight.engine.args import DEMO_MODEL

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lora_command", required=True)
    make = sub.add_parser("make", help="write a random PEFT LoRA adapter for a checkpoint (default: the demo model)")
    make.add_argument("out_dir", help="directory to write adapter_config.json + adapter_model.safetensors to")
    make.add_argument("--model", default=None, help="the base checkpoint directory (default: the bundled demo model)")
    make.add_argument("--rank", type=int, default=8, help="LoRA rank r (default: 8)")
    make.add_argument("--alpha", type=float, default=16.0, help="lora_alpha: the update is scaled by alpha / r (default: 16)")
    make.add_argument("--target-modules", nargs="+", default=list(MODULES), choices=MODULES, metavar="MODULE",
                      help=f"projections to adapt (default: all of {', '.join(MODULES)})")
    make.add_argument("--seed", type=int, default=0, help="random seed of the weights (default: 0)")
    make.add_argument("--std", type=float, default=0.05, help="standard deviation of A and B (default: 0.05: answers change)")
    make.set_defaults(func=run, subparser=make)


def run(args: argparse.Namespace) -> None:
    base = Path(args.model or DEMO_MODEL)
    config_path = base / "config.json"
    if not config_path.is_file():
        raise SystemExit(f"inflight lora make: --model {base}: no config.json (a Hugging Face checkpoint directory is expected)")
    if args.rank < 1:
        raise SystemExit("inflight lora make: --rank must be >= 1")
    out = Path(args.out_dir)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"inflight lora make: {out} exists and is not empty")
    from inflight.testing.lora import make_lora_adapter  # torch: only once the arguments are good

    make_lora_adapter(out, json.loads(config_path.read_text()), rank=args.rank, alpha=args.alpha,
                      targets=args.target_modules, seed=args.seed, std=args.std)  # fmt: skip
    print(f"wrote a rank-{args.rank} LoRA adapter for {base} to {out}")
    print(f"serve it: inflight serve{'' if args.model is None else f' --model {base}'} --lora-modules my-lora={out}")
