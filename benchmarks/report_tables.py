"""The tables and targets of benchmarks/report.py: markdown from the measured rows (report_parts.Row),
the roofline, the sweep and --compare-dtypes' runs; the targets' verdicts. Formatting only: every
figure comes in measured."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import report_parts as rp  # noqa: E402

ROWS = ("offline", "served", "HF single", "HF static", "batch-1 decode")


def _f(value: float | None, fmt: str = ".1f") -> str:
    return "n/a" if value is None or value != value else format(value, fmt)


def _ratio(rows: dict[str, rp.Row], name: str, base: str) -> float | None:
    ours, ref = rows[name].tok_per_s, rows[base].tok_per_s
    return ours / ref if ref and ref > 0 else None


def main_table(rows: dict[str, rp.Row]) -> str:
    lines = ["| run | output tok/s | TTFT p50 (ms) | TPOT median (ms) | vs HF static | "
             "vs HF single | other load (cores) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in ROWS:
        r = rows[name]
        lines.append(f"| {name} | {_f(r.tok_per_s)} | {_f(r.ttft_p50_ms)} | "
                     f"{_f(r.tpot_median_ms, '.2f')} | {_f(_ratio(rows, name, 'HF static'), '.2f')}x"
                     f" | {_f(_ratio(rows, name, 'HF single'), '.2f')}x | {_f(r.other_cores, '.2f')} |")
    return "\n".join(lines)


def roofline_table(roof: dict[str, Any]) -> str:
    k = roof["kernels"]
    items = [
        ("bytes read per decode token (MB)", _f(roof["total_bytes"] / 1e6)),
        ("bandwidth before, GB/s (sum / bf16 GEMV)",
         f"{_f(k['before']['sum_gbps'])} / {_f(k['before']['gemv_bf16_gbps'])}"),
        ("bandwidth after, GB/s (sum / bf16 GEMV)",
         f"{_f(k['after']['sum_gbps'])} / {_f(k['after']['gemv_bf16_gbps'])}"),
        ("bandwidth max (GB/s)", _f(roof["bandwidth_max_gbps"])),
        ("roofline at measured max (ms/token)", _f(roof["roofline_ms"], ".2f")),
        (f"roofline at nominal {roof['nominal_gbps']:g} GB/s (ms/token)",
         _f(roof["roofline_nominal_ms"], ".2f")),
        ("batch-1 TPOT median (ms)", _f(roof["tpot_ms"], ".2f")),
        ("same, without the C decode kernel (ms)", _f(roof.get("tpot_eager_ms"), ".2f")),
        ("% of measured roofline", _f(roof["pct_of_roofline"])),
        ("% of nominal roofline", _f(roof["pct_of_nominal"])),
    ]
    if (p := roof.get("paired")) is not None:  # benchmarks/roofline.py: each step beside a read of its bytes
        items += [(f"% of the paired roofline (median of {p['pairs']} step / {p['probe']} pairs, quartiles)",
                   f"{_f(p['median_%'])} ({_f(p['q1_%'])}-{_f(p['q3_%'])})"),
                  ("paired read bandwidth, GB/s (median / best)", f"{_f(p['probe_gbps'])} / {_f(p['probe_best_gbps'])}")]
    return "\n".join(["| batch-1 roofline | value |", "|---|---:|",
                      *(f"| {a} | {b} |" for a, b in items)])


def sweep_table(cells: list[dict[str, Any]]) -> str:
    lines = ["| batch | prompt len | output len | output tok/s | TPOT median (ms) | "
             "TTFT p50 (ms) | other load (cores) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['batch']} | {c['prompt_len']} | {c['output_len']} | {_f(c['tok_per_s'])} | "
              f"{_f(c['tpot_median_ms'], '.2f')} | {_f(c['ttft_p50_ms'])} | "
              f"{_f(c['other_cores'], '.2f')} |" for c in cells]
    return "\n".join(lines)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows, roof = report["rows"], report["roofline"]
    served_ttft, hf_ttft = rows["served"].ttft_p50_ms, rows["HF static"].ttft_p50_ms
    checks = [
        ("offline >= 2x HF static", _ratio(rows, "offline", "HF static"), 2.0, "x"),
        ("offline >= 10x HF single", _ratio(rows, "offline", "HF single"), 10.0, "x"),
        ("served throughput within 10% of offline (served/offline)",
         _ratio(rows, "served", "offline"), 0.9, "x"),
        ("served TTFT p50 < HF static TTFT (HF static / served)",
         hf_ttft / served_ttft if served_ttft and hf_ttft else None, 1.0, "x"),
        ("batch-1 >= 60% of roofline (measured bandwidth)", roof["pct_of_roofline"], 60.0, "%"),
    ]
    out = []
    for name, value, goal, unit in checks:
        met = None if value is None else (value > goal if "TTFT" in name else value >= goal)
        out.append({"target": name, "value": value, "goal": goal, "unit": unit, "met": met})
    return out


def print_report(report: dict[str, Any]) -> None:
    print("\n" + main_table(report["rows"]))
    ratios = ", ".join(f"{p['served_tok_per_s']:.1f}/{p['offline_tok_per_s']:.1f} = "
                       f"{p['served_over_offline']:.2f}x" for p in report["pairs"])
    print(f"served/offline tok/s per pair (offline then served, back to back): {ratios}; "
          "the rows above are the median pair")
    print("\n" + roofline_table(report["roofline"]))
    if report["sweep"]:
        print("\n" + sweep_table(report["sweep"]))
    print("\ntargets:")
    for t in report["targets"]:
        verdict = "n/a" if t["met"] is None else ("MET" if t["met"] else "NOT met")
        value = _f(t["value"], ".1f" if t["unit"] == "%" else ".2f")
        print(f"  - {t['target']}: {value}{t['unit']} -> {verdict}")
    print("'other load' = cores other processes kept busy during the measurement (served: "
          "minus the server's own); figures with it above 0.25 are likely pessimistic")


def compare_table(runs: list[dict[str, Any]]) -> str:
    lines = ["| run | engine dtype / kernel weights | offline tok/s | HF static tok/s (same dtype) | vs HF static | "
             "batch-1 ms/token | roofline ms | % of roofline | MB/token | other load (cores) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        p, roof = r["paths"], r["roofline"]
        weights = {2: "bf16", 4: "fp32"}[p["weight_bytes"]]
        lines.append(f"| {r['label']} | {p['dtype']} / {weights} | {_f(r['offline']['tok_per_s'])} | "
                     f"{_f(r['hf_static']['tok_per_s'])} | {_f(r['vs_hf_static'], '.2f')}x | "
                     f"{_f(roof['tpot_ms'], '.2f')} | {_f(roof['roofline_ms'], '.2f')} | "
                     f"{_f(roof['pct_of_roofline'])} | {_f(roof['total_bytes'] / 1e6)} | "
                     f"{_f(max(r[k]['other_cores'] or 0 for k in ('offline', 'hf_static', 'batch1')), '.2f')} |")  # fmt: skip
    return "\n".join(lines)
