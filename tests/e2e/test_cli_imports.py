"""The command line answers before torch loads: `--help` of every command and every start-up
mistake of `inflight serve` (path, port, certificate, config file, unknown flag) are parsed and
checked without importing torch or transformers. Measured on the import graph of a fresh
interpreter (`sys.modules`), not in seconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inflight import cli
from inflight.engine.args import DEMO_MODEL

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
