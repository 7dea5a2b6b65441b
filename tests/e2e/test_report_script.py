"""benchmarks/report.py --quick runs every measurement end to end (a real server included)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "report.py"
NUM_REQUESTS, INPUT_LEN, OUTPUT_LEN = 4, 16, 8  # --quick's workload
SWEEP = {(1, 16), (1, 32)}  # --quick's batches x contexts, 8 output tokens each
ROWS = ("offline", "served", "HF single", "HF static", "batch-1 decode")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("report") / "report.json"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_every_row_has_a_positive_throughput(quick_run: tuple[dict[str, Any], str]) -> None:
    rows = quick_run[0]["rows"]
    assert set(rows) == set(ROWS)
    for name in ROWS:
        assert math.isfinite(rows[name]["tok_per_s"]) and rows[name]["tok_per_s"] > 0, name
        assert rows[name]["ttft_p50_ms"] > 0 and rows[name]["tpot_median_ms"] > 0, name


def test_served_and_offline_generated_every_token(quick_run: tuple[dict[str, Any], str]) -> None:
    rows = quick_run[0]["rows"]
    for name in ("served", "offline"):
        extra = rows[name]["extra"]
        assert extra["failed"] == 0 and extra["completed"] == NUM_REQUESTS, name
        assert extra["total_output_tokens"] == NUM_REQUESTS * OUTPUT_LEN, name
        assert extra["num_output_len_mismatch"] == 0, name
    assert rows["batch-1 decode"]["extra"]["output_tokens"] == OUTPUT_LEN
    assert rows["HF static"]["extra"]["output_tokens"] == NUM_REQUESTS * OUTPUT_LEN
    assert rows["HF single"]["extra"]["output_tokens"] == OUTPUT_LEN  # 1 request timed


def test_batch1_beside_the_paired_roofline(quick_run: tuple[dict[str, Any], str]) -> None:
    """Each batch-1 step paired with a streaming read of its bytes (benchmarks/roofline.py)."""
    paired = quick_run[0]["roofline"]["paired"]
    assert paired["pairs"] == 8 and paired["probe"] in paired["candidates"]
    assert 0 < paired["q1_%"] <= paired["median_%"] <= paired["q3_%"] and paired["probe_gbps"] > 0
    assert "% of the paired roofline" in quick_run[1]


def test_sweep_has_every_cell(quick_run: tuple[dict[str, Any], str]) -> None:
    cells = quick_run[0]["sweep"]
    assert {(c["batch"], c["prompt_len"]) for c in cells} == SWEEP and len(cells) == len(SWEEP)
    for c in cells:
        assert c["failed"] == 0 and c["output_tokens"] == c["batch"] * c["output_len"]
        assert c["tok_per_s"] > 0 and c["tpot_median_ms"] > 0 and c["ttft_p50_ms"] > 0


def test_roofline_and_bandwidth(quick_run: tuple[dict[str, Any], str]) -> None:
    roof = quick_run[0]["roofline"]
    for when in ("before", "after"):
        kernels = roof["kernels"][when]
        assert kernels["sum_gbps"] > 0 and kernels["gemv_bf16_gbps"] > 0
        assert kernels["max_gbps"] == max(kernels["sum_gbps"], kernels["gemv_bf16_gbps"])
    assert roof["bandwidth_max_gbps"] == max(roof["bandwidth_before_gbps"], roof["bandwidth_after_gbps"])
    # the quick model: hidden 64, intermediate 128, 2 layers, 4 heads (2 KV) of 16, vocab 1024; weights
    # in the dtype the batch-1 path reads them (bf16 in the C kernel), qkv biases and norms in the model's
    paths = quick_run[0]["paths"]
    weights = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) + 1024 * 64
    small = 2 * ((64 + 2 * 32) + 2 * 64) + 64 + 64
    assert roof["total_bytes"] == paths["weight_bytes"] * weights + paths["storage_bytes"] * small
    assert roof["tpot_ms"] == quick_run[0]["rows"]["batch-1 decode"]["tpot_median_ms"]
    expected = 100 * roof["total_bytes"] / (roof["bandwidth_max_gbps"] * 1e9) * 1e3 / roof["tpot_ms"]
    assert roof["pct_of_roofline"] == pytest.approx(expected)


def test_json_describes_the_run(quick_run: tuple[dict[str, Any], str]) -> None:
    report = quick_run[0]
    assert report["machine"]["threads"] >= 1 and report["machine"]["torch"]
    # the CPU's features and the paths the engine chose are recorded with the results
    assert report["machine"]["platform"].startswith(f"cpu: {report['machine']['cpu']} ")
    assert set(report["machine"]["features_used"]) <= set(report["machine"]["cpu_features"])
    assert report["paths"]["summary"].startswith(report["machine"]["platform"])
    assert " | kernel: " in report["paths"]["summary"] and report["paths"]["dtype"] in ("bfloat16", "float32")
    assert report["config"]["quick"] is True and report["config"]["num_requests"] == NUM_REQUESTS
    assert [t["met"] in (True, False) for t in report["targets"]] == [True] * 5


def test_stdout_holds_the_tables(quick_run: tuple[dict[str, Any], str]) -> None:
    stdout = quick_run[1]
    for heading in ("| run | output tok/s |", "| batch-1 roofline | value |", "| batch | prompt len |", "targets:"):
        assert heading in stdout, heading
    for name in ROWS:
        assert f"| {name} |" in stdout, name


def test_offline_and_served_ran_in_pairs(quick_run: tuple[dict[str, Any], str]) -> None:
    report, stdout = quick_run
    pairs, rows = report["pairs"], report["rows"]
    assert len(pairs) == 2  # --quick's --pairs
    for p in pairs:
        assert p["offline_tok_per_s"] > 0 and p["served_tok_per_s"] > 0
        assert p["served_over_offline"] == pytest.approx(p["served_tok_per_s"] / p["offline_tok_per_s"])
    # the rows are one pair (the lower-median ratio), and the target is that pair's ratio
    ratios = sorted(p["served_over_offline"] for p in pairs)
    shown = rows["served"]["tok_per_s"] / rows["offline"]["tok_per_s"]
    assert shown == pytest.approx(ratios[0])
    target = next(t for t in report["targets"] if "served throughput" in t["target"])
    assert target["value"] == pytest.approx(shown)
    assert "served/offline tok/s per pair" in stdout


def _load_script_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_median_pair_picks_the_middle_ratio() -> None:
    report = _load_script_module("report")
    row = report.rp.Row
    pairs = [(row("offline", t_off, 1, 1, 0), row("served", t_srv, 1, 1, 0))
             for t_off, t_srv in ((100, 95), (300, 240), (200, 196), (100, 90))]  # 0.95, 0.8, 0.98, 0.9
    offline, served = report.median_pair(pairs)
    assert (offline.tok_per_s, served.tok_per_s) == (100, 90)  # the lower middle of 4
    offline, served = report.median_pair(pairs[:3])
    assert (offline.tok_per_s, served.tok_per_s) == (100, 95)


def test_roofline_bytes_of_qwen25_05b() -> None:
    """Every weight of Qwen2.5-0.5B read once (494,032,768 parameters) + one embedding row, bf16."""
    from inflight.testing import QWEN25_05B_CONFIG

    parts = _load_script_module("report_parts")
    counts = parts.bytes_per_token(QWEN25_05B_CONFIG, 2)
    assert counts["total_bytes"] == 2 * (494_032_768 + 896)
    assert counts["lm_head_bytes"] == 2 * 151936 * 896


def test_compare_dtypes_quick(tmp_path: Path) -> None:
    """--compare-dtypes: float32 vs the bf16 checkpoint at dtype auto, each with the CPU paths it ran."""
    out = tmp_path / "dtypes.json"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--compare-dtypes", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["machine"]["platform"].startswith("cpu: ")
    runs = {r["label"]: r for r in report["compare_dtypes"]}
    assert set(runs) == {"float32", "bf16 ckpt, auto"}
    for r in runs.values():
        assert r["offline"]["tok_per_s"] > 0 and r["hf_static"]["tok_per_s"] > 0 and r["batch1"]["tpot_median_ms"] > 0
        assert r["hf_static"]["extra"]["dtype"] == r["paths"]["dtype"]  # HF runs in the engine's dtype
        assert r["paths"]["summary"].startswith(report["machine"]["platform"])
    assert runs["float32"]["paths"]["weight_bytes"] == 4  # float32 weights, whichever path reads them
    auto = runs["bf16 ckpt, auto"]["paths"]
    assert auto["weight_bytes"] == (2 if auto["kernel"] else auto["storage_bytes"])
    assert "| run | engine dtype / kernel weights |" in proc.stdout
