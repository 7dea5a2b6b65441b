"""The benchmark workload through `inflight.LLM` (no HTTP): all requests in one generate call.

Latencies come from each RequestOutput's engine metrics (perf_counter times): TTFT =
first_token_time - arrival_time, ITL = the gaps between token_times, E2E = finished_time -
arrival_time. Arrival is when LLM.generate queued the request, so offline TTFT includes the
wait behind the other requests but no HTTP, JSON or detokenizing-for-the-wire time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from inflight.bench.dataset import SampleRequest
from inflight.bench.metrics import RequestResult


def build_llm(args: argparse.Namespace) -> Any:
    """The engine the `inflight bench` engine flags describe (EngineArgs, as `inflight serve`)."""
    from inflight.engine.args import EngineArgs
    from inflight.engine.llm_engine import LLMEngine
    from inflight.llm import LLM

    return LLM.from_engine(LLMEngine.from_engine_args(EngineArgs.from_cli_args(args).for_offline(), progress=False))


def _params(requests: list[SampleRequest], ignore_eos: bool, temperature: float) -> list[Any]:
    from inflight.sampling_params import SamplingParams

    return [
        SamplingParams(max_tokens=r.output_len, ignore_eos=ignore_eos, temperature=temperature)
        for r in requests
    ]


def run_offline(
    llm: Any,
    requests: list[SampleRequest],
    warmups: list[SampleRequest],
    ignore_eos: bool,
    temperature: float,
    progress: bool,
) -> tuple[list[RequestResult], float]:
    """(results in request order, duration of the generate call in s)."""
    if warmups:
        llm.generate(
            [w.prompt for w in warmups], _params(warmups, ignore_eos, temperature), use_tqdm=False
        )
    params = _params(requests, ignore_eos, temperature)
    t0 = time.perf_counter()
    outs = llm.generate([r.prompt for r in requests], params, use_tqdm=progress)
    duration = time.perf_counter() - t0
    return [_result(r, o, t0) for r, o in zip(requests, outs)], duration


def _result(req: SampleRequest, out: Any, t0: float) -> RequestResult:
    m, c = out.metrics, out.outputs[0]
    times = m.token_times
    success = c.finish_reason in ("stop", "length")
    error = "" if success else out.error or f"finished with finish_reason={c.finish_reason}"
    end = m.finished_time or (times[-1] if times else m.arrival_time)
    return RequestResult(
        prompt_len=req.prompt_len, output_len=req.output_len,
        success=success, error=error,
        start_s=m.arrival_time - t0,
        ttft_s=None if m.first_token_time is None else m.first_token_time - m.arrival_time,
        latency_s=end - m.arrival_time, itl_s=[b - a for a, b in zip(times, times[1:])],
        output_tokens=len(c.token_ids), output_tokens_source="engine",
        server_prompt_tokens=len(out.prompt_token_ids), finish_reason=c.finish_reason,
        generated_text=c.text,
    )  # fmt: skip
