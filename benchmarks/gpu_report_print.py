"""benchmarks/gpu_report.py's tables: the report dict it builds, printed as markdown rows and the
issue's target lines."""

from __future__ import annotations

from typing import Any

# report row -> the server's flags: the model in the engine thread; in a worker process (the CUDA
# default); the whole engine in a process of its own (--served-variants engine-process)
SERVED = {"served (uni)": ["--distributed-executor-backend", "uni"], "served": ["--distributed-executor-backend", "mp"],
          "served (engine process)": ["--engine-process"]}  # fmt: skip


def print_report(r: dict[str, Any]) -> None:
    c = r["ceilings"]
    print(f"\n## {r['device']}, torch {r['torch']}, {r['config']}")
    print(f"copy {c['copy_gb_s']:.0f} GB/s, bf16 GEMM {c['bf16_tflop_s']:.0f} TFLOP/s\n")
    print("| run | tok/s | TTFT p50 ms | TPOT ms |\n|---|---:|---:|---:|")
    for name in ("offline", "offline (2,048 tokens a step)", "offline (runner on its own thread)", "offline (mp)", "HF static", "served (uni)", "served", "served (engine process)", "offline (served workload)"):
        row = r.get(name)
        if row and "error" in row:
            print(f"| {name} | failed: {row['error'][:80]} | | |")
        elif row:
            print(f"| {name} | {row['tok_s']:.0f} | {row.get('ttft_p50_ms', float('nan')):.0f} | "
                  f"{row.get('tpot_ms', float('nan')):.2f} |")  # fmt: skip
    b = r["batch-1"]
    print(f"| batch-1 (graphs) | {1e3 / b['tpot_ms']:.1f} | | {b['tpot_ms']:.2f} |")
    if "tpot_multistep_ms" in b:
        print(f"| batch-1 (graphs, {b['num_scheduler_steps']} steps) | {1e3 / b['tpot_multistep_ms']:.1f} | | {b['tpot_multistep_ms']:.2f} |")
    for key, what in (("tpot_gemv_ms", "graphs, Triton GEMV"), ("tpot_gemv_silu_ms", "graphs, Triton GEMV, down fused")):
        if key in b:
            print(f"| batch-1 ({what}) | {1e3 / b[key]:.1f} | | {b[key]:.2f} |")
    print(f"| batch-1 (eager) | {1e3 / b['tpot_eager_ms']:.1f} | | {b['tpot_eager_ms']:.2f} |")
    for key, what in (("tpot_eager_unfused_ms", "eager, fused elementwise off"), ("tpot_eager_unfused_unsplit_ms", "eager, fused off, split-KV off")):
        if key in b:
            print(f"| batch-1 ({what}) | {1e3 / b[key]:.1f} | | {b[key]:.2f} |")
    if "HF single" in r:
        print(f"| HF single | {1e3 / r['HF single']['tpot_ms']:.1f} | | {r['HF single']['tpot_ms']:.2f} |")
    print(f"\nbatch-1: {b['weight_gb']:.2f} GB/token, roofline {b['roofline_ms']:.2f} ms -> "
          f"{100 * b['of_roofline']:.1f} % of roofline (target >= 80 %)")
    for key, what in (("tpot_gemv_ms", ""), ("tpot_gemv_silu_ms", ", down fused with SiLU * up")):
        if key in b:
            print(f"batch-1 on the Triton GEMV{what}: {100 * b['roofline_ms'] / b[key]:.1f} % of roofline")
    if "of_roofline_multistep" in b:
        print(f"batch-1 with {b['num_scheduler_steps']} decode passes a step: {100 * b['of_roofline_multistep']:.1f} % of roofline")
    if "HF static" in r:
        print(f"offline / HF static: {r['offline']['tok_s'] / r['HF static']['tok_s']:.2f}x (target >= 3x)")
    for name in ("offline (2,048 tokens a step)", "offline (runner on its own thread)", "offline (mp)"):
        if "HF static" in r and "tok_s" in r.get(name, {}):
            print(f"{name} / HF static: {r[name]['tok_s'] / r['HF static']['tok_s']:.2f}x")
    print_served(r)


def print_served(r: dict[str, Any]) -> None:
    off = r.get("offline (served workload)")
    for name, flags in SERVED.items():
        row = r.get(name, {})
        if off and "tok_s" in row:
            print(f"{name} / offline: {row['tok_s'] / off['tok_s']:.2f} (target >= 0.95; {' '.join(flags)}); "
                  f"TTFT p50 {row['ttft_p50_ms']:.0f} ms, {row['cpu_ms_per_token']:.3f} server CPU ms a token"
                  + (f"; the model worker idle {100 * row['worker_idle_share']:.1f} % between steps" if "worker_idle_share" in row else ""))  # fmt: skip
