"""benchmarks/offline_throughput.py runs end to end on a tiny model and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_offline_benchmark_runs_and_reports(tiny_model_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("offline_throughput", REPO / "benchmarks" / "offline_throughput.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses resolve their module through sys.modules
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    bench.main([
        "--model-dir", str(tiny_model_dir("qwen2")), "--dtypes", "float32", "--num-requests", "3",
        "--prompt-len", "8", "--output-len", "5", "--hf-single-requests", "1", "--repeat", "2",
        "--json", str(out),
    ])  # fmt: skip
    report = json.loads(out.read_text())
    by_engine = {r["engine"]: r for r in report["results"]}
    assert set(by_engine) == {"inflight", "hf-single", "hf-static"}
    assert by_engine["inflight"]["output_tokens"] == 15 and by_engine["hf-static"]["output_tokens"] == 15
    assert len(by_engine["inflight"]["extra"]["runs_seconds"]) == 2
    assert all(r["tok_per_s"] > 0 for r in report["results"])
    assert report["ratios"]["float32"]["vs_hf-static"] > 0
