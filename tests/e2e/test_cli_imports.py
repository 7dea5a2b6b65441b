"""The command line answers before torch loads: `--help` of every command and every start-up
mistake of `inflight serve` (path, port, certificate, config file, unknown flag, and the engine
config's checks against config.json or the GGUF header: `EngineArgs.check`) are parsed and
checked without importing torch or transformers; `LLM(...)` raises the same engine-config
messages. Measured on the import graph of a fresh interpreter (`sys.modules`), not in seconds."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inflight import checkpoint, cli
from inflight.config import gpu_driver_present
from inflight.engine.args import DEMO_MODEL, EngineArgs

_RUN = """
import contextlib, io, json, sys
from inflight.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1 if e.code else 0
            if isinstance(e.code, str):
                stderr.write(e.code)
    out.append({"argv": argv, "code": code, "out": stdout.getvalue(), "err": stderr.getvalue()})
print(json.dumps({"runs": out, "heavy": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def _run_cli(*argvs: list[str]) -> tuple[list[dict], list[str]]:
    """Each argv through `inflight.cli.main` in one fresh interpreter; (runs, heavy modules loaded)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(argvs)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    return result["runs"], result["heavy"]


@pytest.mark.timeout(180)
def test_help_and_startup_errors_never_import_torch(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    bad_cert = tmp_path / "cert.pem"
    bad_cert.write_text("not a certificate")
    bad_config = tmp_path / "c.json"
    bad_config.write_text(json.dumps({"max_num_seqs": "64"}))
    cases = [
        (["--help"], 0, "{serve,generate,lora,bench}"),
        (["lora", "make", "--help"], 0, "--rank"),
        (["serve", "--help"], 0, "--tool-call-parser"),
        (["generate", "--help"], 0, "--max-tokens"),
        (["bench", "--help"], 0, "--plot"),
        (["serve", "--model", str(tmp_path / "no-model")], 2, "no-model is not a directory"),
        (["serve", "--model", str(tmp_path / "no-model.gguf")], 2, "no-model.gguf does not exist"),
        (["serve", "--port", str(busy.getsockname()[1])], 2, "is already in use"),
        (["serve", "--ssl-certfile", str(bad_cert)], 2, "is not a usable certificate"),
        (["serve", "--config", str(bad_config)], 2, 'max_num_seqs: expected an integer, got "64"'),
        (["serve", "--timeout-body", "0"], 2, "timeout_body: must be more than 0"),
        (["serve", "--lora-modules", f"a={tmp_path / 'no-adapter'}"], 2, "no-adapter: not a directory"),
        (["serve", "--no-such-flag"], 2, "usage: inflight serve"),
    ]
    try:
        runs, heavy = _run_cli(*[argv for argv, _, _ in cases])
    finally:
        busy.close()
    for (argv, code, expected), run in zip(cases, runs):
        text = run["out"] + run["err"]
        assert run["code"] == code and expected in text, (argv, run)
    assert heavy == [], f"imported {heavy} for --help / a start-up error"


def test_an_unknown_flag_prints_the_commands_usage(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", DEMO_MODEL, "--no-such-flag", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: inflight serve") and "unrecognized arguments: --no-such-flag 1" in err


def test_bench_plot_checks_matplotlib_first(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Without matplotlib, `--plot` is refused before any request (the server here does not exist)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--base-url", "http://127.0.0.1:9", "--plot", "x.png", "--num-prompts", "1"])
    assert "--plot needs matplotlib" in str(e.value.code) and "inflight[bench]" in str(e.value.code)
    assert "Benchmark Result" not in capsys.readouterr().out


def test_a_gguf_file_passes_the_start_up_check(tmp_path: Path) -> None:
    from inflight.server import serve

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # its contents are the reader's to check, at load
    serve.check_files(str(gguf), "cpu", {}, None, None)


DEMO_CONFIG = json.loads((Path(DEMO_MODEL) / "config.json").read_text())


def _config_dir(root: Path, name: str, **changes: object) -> str:
    """A checkpoint directory holding only the demo model's config.json, changed (the checks read
    nothing else)."""
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**DEMO_CONFIG, **changes}))
    return str(d)


def _cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(engine flags, the message); the demo model: 4 heads, 2 KV heads, 512 positions, 2048 tokens."""
    from inflight.testing.gguf import make_tiny_gguf

    gguf = make_tiny_gguf(tmp / "m.gguf", "q8_0")
    q4k = make_tiny_gguf(tmp / "q4k.gguf", "q4_k")
    draft = _config_dir(tmp, "draft", vocab_size=4096)
    bert = _config_dir(tmp, "bert", architectures=["BertModel"])
    gelu = _config_dir(tmp, "gelu", hidden_act="gelu")
    headless = _config_dir(tmp, "headless", num_attention_heads=None)
    bnb = _config_dir(tmp, "bnb", quantization_config={"quant_method": "bitsandbytes"})
    awq = _config_dir(tmp, "awq", quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})
    wide_head = _config_dir(tmp, "wide_head", hidden_size=2 * DEMO_CONFIG["hidden_size"], num_hidden_layers=1)
    aux_head = _config_dir(tmp, "aux_head", num_hidden_layers=1, eagle_aux_hidden_state_layer_ids=[0, 1, 99])
    return [
        (["--block-size", "24"], "block_size: must be a power of two >= 1"),
        (["--max-seq-len", "4096"], "max_model_len: 4096 exceeds the model's max_position_embeddings 512"),
        (["--tensor-parallel-size", "3"], "tensor_parallel_size: 3 does not divide num_attention_heads (4); use one of [1, 2, 4]"),
        (["--tensor-parallel-size", "8"], "tensor_parallel_size: 8 does not divide num_attention_heads (4)"),
        (["--enable-lora", "--tensor-parallel-size", "2"], "enable_lora: not supported with tensor_parallel_size > 1 yet"),
        (["--nnodes", "2", "--tensor-parallel-size", "2"], "master_port: required with nnodes > 1"),
        (["--max-loras", "4", "--max-cpu-loras", "2"], "max_cpu_loras: must be >= max_loras"),
        (["--device", "gpu"], "device: 'gpu'; use auto | cpu | cuda | cuda:N"),
        (["--dtype", "float64"], "dtype: unknown dtype 'float64'; use auto, float32, bfloat16 or float16"),
        (["--num-kv-blocks", "1"], "num_blocks: must be >= 2"),
        (["--quantization", "int8", "--load-format", "dummy"], "load_format: dummy (random float weights) does not apply"),
        (["--model", str(gguf), "--quantization", "int8"], "quantization: 'int8' applies to full-precision checkpoints; m.gguf is already quantized (GGUF)"),
        (["--model", str(gguf), "--max-seq-len", "100000"], "max_model_len: 100000 exceeds the model's max_position_embeddings"),
        (["--model", str(q4k), "--tensor-parallel-size", "2"], "tensor_parallel_size: 2 splits o_proj's 256 input features into 128 per rank, not whole blocks of 256 (tensor 'blk.0.attn_output.weight', Q4_K); use one of [1]"),
        (["--model", awq, "--tensor-parallel-size", "4"], "tensor_parallel_size: 4 splits o_proj's 256 input features into 64 per rank, not whole blocks of 128 (quantization_config.group_size)"),
        (["--model", awq, "--tensor-parallel-size", "2"], "down_proj: quantization_config.group_size 128 does not divide its 704 input features"),
        (["--model", awq, "--quantization", "fp8"], "quantization: 'fp8' applies to full-precision checkpoints; this one is already quantized (awq)"),
        (["--model", bnb], "quantization_config.quant_method: 'bitsandbytes' is not supported"),
        (["--model", bert], "model: architecture 'BertModel' is not supported"),
        (["--model", gelu], "hidden_act: 'gelu' is not supported (silu only)"),
        (["--model", headless], f"model: {headless}: config num_attention_heads must be a positive integer, got None"),
        (["--speculative-config", json.dumps({"method": "draft_model", "model": draft, "num_speculative_tokens": 2})],
         "speculative_config.model: vocabulary of 4096 tokens, the target's has 2048"),
        (["--speculative-config", json.dumps({"method": "draft_model", "model": headless, "num_speculative_tokens": 2})],
         f"speculative_config.model: model: {headless}: config num_attention_heads must be a positive integer"),
        (["--speculative-config", json.dumps({"method": "draft_model", "model": str(tmp / "nowhere"), "num_speculative_tokens": 2})],
         "speculative_config.model: model: no config.json in"),
        (["--speculative-config", json.dumps({"method": "eagle", "model": wide_head, "num_speculative_tokens": 2})],
         f"speculative_config.model: hidden_size {2 * DEMO_CONFIG['hidden_size']} does not match the target's {DEMO_CONFIG['hidden_size']}"),
        (["--speculative-config", json.dumps({"method": "eagle3", "model": aux_head, "num_speculative_tokens": 2})],
         "speculative_config.model: eagle_aux_hidden_state_layer_ids [0, 1, 99]: three layers of the target's"),
    ] + ([] if gpu_driver_present() else [
        (["--device", "cuda"], "device: 'cuda', but this machine has no GPU driver (none of /dev/nvidiactl"),
    ])  # fmt: skip


@pytest.mark.timeout(240)
def test_engine_config_errors_never_import_torch(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    argvs = [["serve", "--port", "0", *flags] for flags, _ in cases]
    argvs += [["generate", "--block-size", "24", "hi"], ["bench", "--offline", "--max-seq-len", "4096"]]
    runs, heavy = _run_cli(*argvs)
    for (flags, message), run in zip(cases, runs):
        assert run["code"] == 2 and run["err"].startswith("inflight serve: ") and message in run["err"], (flags, run)
    assert runs[-2]["code"] == 1 and "inflight generate: block_size: must be a power of two" in runs[-2]["err"]
    assert runs[-1]["code"] == 1 and "inflight bench: max_model_len: 4096 exceeds" in runs[-1]["err"]
    assert heavy == [], f"imported {heavy} for an engine-config error"


@pytest.mark.timeout(180)
def test_lora_modules_are_checked_against_the_model_before_torch(tmp_path: Path) -> None:
    """`--lora-modules`: each adapter's config and tensor headers against config.json (rank,
    layers, projection sizes) before the model loads; a fitting one passes on to the port check."""
    from inflight.testing.lora import make_lora_adapter

    fits = make_lora_adapter(tmp_path / "fits", DEMO_CONFIG, rank=4, targets=("q_proj",))
    big = make_lora_adapter(tmp_path / "big", DEMO_CONFIG, rank=8, targets=("q_proj",))
    other = make_lora_adapter(tmp_path / "other", {**DEMO_CONFIG, "hidden_size": 128, "num_hidden_layers": 1}, rank=4, targets=("q_proj",))
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text((fits / "adapter_config.json").read_text())
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = ["--port", str(busy.getsockname()[1])]
    cases = [
        (["--lora-modules", f"a={big}", "--max-lora-rank", "4"], f"lora_modules: a={big}: adapter_config.json r is 8; this server takes ranks 1..4 (max_lora_rank)"),
        (["--lora-modules", f"a={other}"], f"lora_modules: a={other}: layer 0 q_proj: lora_A (4, 128) / lora_B (128, 4) do not fit the model (expected (4, 256) / (256, 4))"),
        (["--lora-modules", f"a={half}"], f"lora_modules: a={half}: no adapter_model.safetensors in"),
        (["--lora-modules", f"a={fits}"], "is already in use"),  # passed: the next check speaks
    ]  # fmt: skip
    try:
        runs, heavy = _run_cli(*[["serve", *port, *flags] for flags, _ in cases])
    finally:
        busy.close()
    for (flags, message), run in zip(cases, runs):
        assert run["code"] == 2 and message in run["err"], (flags, run)
    assert heavy == [], f"imported {heavy} for a LoRA adapter's start-up error"


def test_llm_raises_the_same_messages(tmp_path: Path) -> None:
    """`LLM(...)` runs the same check before any weight loads: the CLI's message, word for word."""
    from inflight import LLM

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    for flags, message in _cases(tmp_path):
        kwargs = EngineArgs.given_cli_args(parser.parse_args(flags))
        with pytest.raises(ValueError) as e:
            LLM(**kwargs)
        assert message in str(e.value), (flags, str(e.value))


def test_the_checked_architectures_are_the_loaders() -> None:
    from inflight.models import loader

    assert set(checkpoint.ARCHITECTURES) == set(loader.ARCHITECTURES)
