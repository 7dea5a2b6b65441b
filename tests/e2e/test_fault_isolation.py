"""One request can't freeze or fail the others: what can never be scheduled is refused at arrival,
and a fault inside a step (injected here) fails only the request it belongs to.

Faults are injected into the real engine (a forward, the sampler, a beam round, the scheduler
raising for one request or one step); the other requests' tokens must equal their fault-free
runs, and every KV block must be free afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_helpers import _assert_idle, _greedy

from inflight import LLM, ParamError, SamplingParams
from inflight.engine.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from inflight.engine.beam import BeamGroup
from inflight.outputs import RequestOutput

PROMPTS = {
    "a": [5, 6, 7, 8, 9],
    "b": [11, 12, 13],
    "poison": [21, 22, 23, 24],
    "c": [31, 32, 33, 34, 35, 36],
}


def _run(llm: LLM, params: dict[str, SamplingParams]) -> dict[str, RequestOutput]:
    """Run the requests together on the engine; their final outputs by id."""
    engine = llm.engine
    for rid, p in params.items():
        engine.add_request(engine.make_request(PROMPTS[rid], p, request_id=rid))
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    _assert_idle(llm)
    return finals


def _params() -> dict[str, SamplingParams]:
    return {
        "a": _greedy(max_tokens=8),
        "b": SamplingParams(
            max_tokens=8, temperature=1.0, seed=7, ignore_eos=True
        ),  # its generator must be restored
        "poison": _greedy(max_tokens=8),
        "c": _greedy(max_tokens=5),
    }


@pytest.fixture(scope="module")
def reference(llm: LLM) -> dict[str, list[int]]:
    return {rid: out.outputs[0].token_ids for rid, out in _run(llm, _params()).items()}


def test_wider_than_the_running_batch_is_refused_naming_the_field(llm: LLM) -> None:
    make = llm.engine.make_request  # max_num_seqs is 8 here
    cases = [
        (SamplingParams(use_beam_search=True, best_of=9, temperature=0.0, max_tokens=2), "best_of"),
        (SamplingParams(use_beam_search=True, n=9, temperature=0.0, max_tokens=2), "n"),
        (SamplingParams(beam_width=9, temperature=0.0, max_tokens=2), "beam_width"),
        (SamplingParams(n=9, temperature=1.0, max_tokens=2), "n"),
        (SamplingParams(n=2, best_of=9, temperature=1.0, max_tokens=2), "best_of"),
        # 8 beams fit the batch, but not 8 x 200 tokens in a 64-block pool: it could never run
        (
            SamplingParams(beam_width=8, temperature=0.0, max_tokens=200, ignore_eos=True),
            "beam_width",
        ),
    ]
    for params, field in cases:
        with pytest.raises(ParamError) as e:
            make([5, 6, 7], params)
        assert e.value.param == field and ("8" in str(e.value) or "64" in str(e.value)), str(
            e.value
        )
    make(
        [5, 6, 7], SamplingParams(beam_width=8, temperature=0.0, max_tokens=8)
    )  # the widest that fits


def test_searches_that_fit_alone_but_not_together_both_finish(llm: LLM) -> None:
    """Two 5-wide beam searches can't run side by side in an 8-slot batch: the older one goes first
    (it preempts the other's beams), nothing waits on itself, and a plain request runs alongside."""
    engine = llm.engine
    beam = SamplingParams(beam_width=5, temperature=0.0, max_tokens=6, ignore_eos=True)
    for rid, p in (("a", beam), ("c", beam), ("b", _greedy(max_tokens=6))):
        engine.add_request(engine.make_request(PROMPTS[rid], p, request_id=rid))
    finals: dict[str, RequestOutput] = {}
    for _ in range(500):  # a livelock would spin here; the three need a few dozen steps
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    assert sorted(finals) == ["a", "b", "c"]
    assert all(
        len(c.token_ids) == 6 and c.finish_reason == "length"
        for o in finals.values()
        for c in o.outputs
    )
    _assert_idle(llm)


def test_numbers_that_would_overflow_are_refused() -> None:
    for kwargs, field in (
        ({"length_penalty": 1e308, "beam_width": 2, "temperature": 0.0}, "length_penalty"),
        ({"temperature": float("inf")}, "temperature"),
        ({"embedding_bias": [1e300]}, "embedding_bias"),
    ):
        with pytest.raises(ParamError) as e:
            SamplingParams(**kwargs)
        assert e.value.param == field


def test_a_fault_in_the_forward_or_sampler_fails_only_its_request(
    llm: LLM, reference: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = llm.engine.runner
    current: list[str] = []
    run, sampler = runner._run, runner.sampler

    def spy_run(pieces: Any, *args: Any) -> Any:  # the pieces one forward runs (all, or one alone on retry)
        current[:] = [sr.request_id for sr in pieces]
        return run(pieces, *args)

    def faulty_sampler(logits: Any, batch: Any) -> Any:
        out = sampler(logits, batch)  # draws the seeded generators first: a retry must rewind them
        if "poison" in current:
            raise RuntimeError("injected sampler fault")
        return out

    monkeypatch.setattr(runner, "_run", spy_run)
    monkeypatch.setattr(runner, "sampler", faulty_sampler)
    finals = _run(llm, _params())
    assert finals["poison"].outputs[0].finish_reason == "abort"
    assert "injected sampler fault" in (finals["poison"].error or "")
    for rid in ("a", "b", "c"):  # their tokens are those of the fault-free run
        assert finals[rid].error is None and finals[rid].outputs[0].token_ids == reference[rid], rid


def test_a_fault_in_output_processing_fails_only_its_request(
    llm: LLM, reference: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    on_token = llm.engine.output_processor.on_token

    def faulty(req: Any, st: Any, **kw: Any) -> Any:  # kw: `last` (697a0c2)
        if req.request_id == "poison" and req.num_output_tokens == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return on_token(req, st, **kw)

    monkeypatch.setattr(llm.engine.output_processor, "on_token", faulty)
    finals = _run(llm, _params())
    assert (
        "injected" in (finals["poison"].error or "")
        and len(finals["poison"].outputs[0].token_ids) >= 3
    )
    for rid in ("a", "b", "c"):
        assert finals[rid].error is None and finals[rid].outputs[0].token_ids == reference[rid], rid


def test_a_failing_beam_round_ends_only_that_search(
    llm: LLM, reference: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    step = BeamGroup.step

    def faulty(self: BeamGroup) -> Any:
        if self.request_id == "poison" and self.cur_len > self.prompt_len + 1:
            raise OverflowError("injected beam fault")
        return step(self)

    monkeypatch.setattr(BeamGroup, "step", faulty)
    params = _params() | {
        "poison": SamplingParams(beam_width=2, temperature=0.0, max_tokens=6, ignore_eos=True)
    }
    finals = _run(llm, params)
    assert finals["poison"].outputs[0].finish_reason == "abort" and "injected beam fault" in (
        finals["poison"].error or ""
    )
    for rid in ("a", "b", "c"):
        assert finals[rid].outputs[0].token_ids == reference[rid], rid


async def _collect(
    engine: AsyncEngine, rid: str, params: SamplingParams
) -> list[int] | BaseException:
    try:
        final = None
        async for final in engine.generate(PROMPTS[rid], params, request_id=rid):  # noqa: B007
            pass
        assert final is not None
        return final.outputs[0].token_ids
    except (RequestFailedError, EngineDeadError) as e:
        return e


def test_a_step_that_raises_fails_its_requests_and_the_engine_goes_on(
    llm: LLM, reference: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = AsyncEngine(llm.engine)
    update = llm.engine.scheduler.update_from_output
    raised: list[int] = []

    def once(*args: Any) -> Any:  # not attributable to one request: the whole step fails, once
        if not raised:
            raised.append(1)
            raise RuntimeError("injected step fault")
        return update(*args)

    monkeypatch.setattr(llm.engine.scheduler, "update_from_output", once)

    async def main() -> tuple[list[Any], list[int] | BaseException]:
        first = await asyncio.gather(
            *(_collect(engine, rid, p) for rid, p in _params().items() if rid != "poison")
        )
        after = await _collect(engine, "a", _greedy(max_tokens=8))
        return first, after

    try:
        first, after = asyncio.run(main())
    finally:
        engine.shutdown()
    failed = [r for r in first if isinstance(r, RequestFailedError)]
    assert failed and all("injected step fault" in str(e) for e in failed)
    survivors = [
        (rid, r) for rid, r in zip(("a", "b", "c"), first) if not isinstance(r, BaseException)
    ]
    assert all(
        r == reference[rid] for rid, r in survivors
    )  # requests outside that step never noticed
    assert (
        after == reference["a"]
        and engine.stats.dead is None
        and "injected" in (engine.stats.last_error or "")
    )
    _assert_idle(llm)


def test_steps_that_keep_raising_make_the_engine_dead_and_nothing_hangs(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = AsyncEngine(llm.engine)

    def always(*args: Any) -> Any:
        raise RuntimeError("device lost")

    monkeypatch.setattr(llm.engine.executor, "collect", always)

    async def main() -> list[Any]:
        results = []
        for rid in (
            "a",
            "b",
            "c",
            "poison",
        ):  # one after another: three failed steps in a row, then dead
            results.append(
                await asyncio.wait_for(_collect(engine, rid, _greedy(max_tokens=4)), timeout=30)
            )
        return results

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    assert all(isinstance(r, (RequestFailedError, EngineDeadError)) for r in results)
    assert isinstance(results[-1], EngineDeadError) and "device lost" in str(results[-1])
    assert engine.stats.dead is not None and "device lost" in engine.stats.dead
    _assert_idle(llm)
