"""llama.cpp beside inflight (benchmarks/quant_bench.py, quant_8b_tpot.py, kquant_l2.py): llama.cpp
built once from the sources vendored in the llama-cpp-python sdist, the random Qwen2.5-0.5B-shaped
F16 GGUF its `llama-quantize` turns into each file, and `llama-batched-bench` runs with their CPU
seconds."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

from inflight import platform

LLAMA_VERSION = "0.3.36"  # llama-cpp-python's sdist, which vendors the llama.cpp sources
LLAMA_DIR = Path.home() / ".cache" / "inflight" / "llama.cpp"
LLAMA_TARGETS = ("llama-batched-bench", "llama-bench", "llama-quantize", "llama-server")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # gcc: explicit -mno-* win over -march=native's set


def llama_build_dir() -> Path:
    """Where `llama_build` builds: `build`, or `build-noamx` on a CPU with AMX (see there)."""
    return LLAMA_DIR / ("build-noamx" if "amx_int8" in platform.current().cpu.features else "build")


def llama_build() -> Path:
    """The llama.cpp bin directory, built once (GGML_NATIVE: the best this CPU runs). On a CPU with
    AMX, native minus AMX (`build-noamx`): this llama.cpp's AMX matmul (weights repacked for AMX
    tiles) segfaults at the first batch on a Sapphire-Rapids-class Xeon, Q8_0 and Q4_K_M alike
    (llama.cpp issue 20824, open); without it llama.cpp keeps its AVX-512 VNNI and repacked paths."""
    import subprocess

    build = llama_build_dir()
    amx = build.name == "build-noamx"
    bin_dir = build / "bin"
    if all((bin_dir / t).exists() for t in ("llama-batched-bench", "llama-quantize")):
        return bin_dir
    src = LLAMA_DIR / "src"
    src.mkdir(parents=True, exist_ok=True)
    tree = src / f"llama_cpp_python-{LLAMA_VERSION}" / "vendor" / "llama.cpp"
    if not tree.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_VERSION}", "-d", str(src)], check=True)  # fmt: skip
        subprocess.run(["tar", "xzf", str(src / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"), "-C", str(src)], check=True)
    no_amx = ["-DCMAKE_C_FLAGS=" + NO_AMX, "-DCMAKE_CXX_FLAGS=" + NO_AMX] if amx else []  # beat -march=native's
    subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *no_amx,
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF"],
                   check=True)  # fmt: skip
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target",
                    *LLAMA_TARGETS], check=True)  # fmt: skip
    return bin_dir


def write_model(root: Path) -> tuple[Path, Path]:
    """(tokenizer dir, F16 GGUF) of the random Qwen2.5-0.5B-shaped model (cached in `root`)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from inflight.testing import checkpoints
    from inflight.testing import gguf as tgguf
    from inflight.testing.tokenizer import build_tiny_tokenizer

    tok, out = root / "tokenizer", root / "model-f16.gguf"
    if out.exists() and tok.exists():
        return tok, out
    hf = checkpoints.make_random_checkpoint(root / "hf", config=checkpoints.QWEN25_05B_CONFIG, dtype=torch.float16)
    cfg = checkpoints.read_config(hf)
    writer = gguf.GGUFWriter(str(out), "qwen2")
    tgguf._metadata(writer, "qwen2", cfg, hf)  # no tokenizer.json: llama.cpp's "none" vocab below
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(cfg["vocab_size"])
    for name, w in load_file(str(hf / "model.safetensors")).items():
        tgguf._add_tensor(writer, tgguf.gguf_name(name), w.astype(np.float32), "f16" if w.ndim == 2 else "f32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    build_tiny_tokenizer(tok)  # ours needs one to start; prompts are token ids
    return tok, out


def llama_quantize(bin_dir: Path, f16: Path, ftype: str) -> Path:
    import subprocess

    out = f16.with_name(f"model-{ftype}.gguf")
    if not out.exists():
        subprocess.run([str(bin_dir / "llama-quantize"), str(f16), str(out), ftype], check=True, capture_output=True)
    return out


def cpu_seconds(who: int) -> float:
    """User + system CPU seconds of this process (RUSAGE_SELF) or its finished children."""
    import resource

    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def llama_bench(bin_dir: Path, path: Path, npl: int, args: argparse.Namespace) -> dict[str, Any]:
    """One `llama-batched-bench -npl npl` run of its own (so its CPU seconds are this batch's):
    the decode rate of one sequence (S_TG) as TPOT ms, the batch's output tok/s, CPU seconds,
    prefill tok/s (S_PP) and the command line."""
    import resource
    import subprocess

    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(path), "-t", str(args.threads), "-tb", str(args.threads),
           "-npp", str(args.input_len), "-ntg", str(args.output_len), "-npl", str(npl),
           "-c", str(npl * (args.input_len + args.output_len) + 64), "-b", "2048", "-ub", "512"]  # fmt: skip
    if args.llama_poll is not None:  # 0: waiting threads sleep (spinning on a loaded machine costs time slices)
        cmd += ["--poll", str(args.llama_poll)]
    c0 = cpu_seconds(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - c0
    for line in (done.stdout + done.stderr).splitlines():  # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit() and int(cells[2]) == npl:
            row = [float(c) for c in cells]
            return {"tpot_ms": 1e3 * npl / row[7], "tok_s": npl * args.output_len / row[8], "cpu_s": cpu,
                    "pp_tok_s": row[5], "cmd": " ".join(cmd[:1] + cmd[3:])}  # fmt: skip
    raise RuntimeError(f"no result row in llama-batched-bench's output: {' '.join(cmd)}")


def llama_batched(bin_dir: Path, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """llama-batched-bench at batch 1, then at `args.batch` in a run of its own: batch-1 TPOT (ms),
    the batch's output tok/s, CPU seconds and prefill tok/s."""
    one = llama_bench(bin_dir, path, 1, args)
    return llama_bench(bin_dir, path, args.batch, args) | {"tpot_ms": one["tpot_ms"]}
