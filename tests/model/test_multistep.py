"""Several decode passes per engine step (`num_scheduler_steps`, docs/MULTISTEP.md): the tokens
and logprobs of N = 4 are N = 1's and Hugging Face's, through stops in the middle of a run, a
prompt ending near max_model_len, and steps that fall back to one pass; no KV block leaks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_hf_parity import _hf_run, _random_prompts, _vocab

from inflight import LLM, SamplingParams

N = 4


def _generate(path: Path, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], steps: int,
              **engine_args: Any) -> tuple[list[Any], list[int], int]:  # fmt: skip
    """(outputs in prompt order, num_steps of every step that ran pieces, preemptions)."""
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_scheduler_steps=steps, block_size=16,
              progress=False, **{"num_kv_blocks": 24, "max_num_seqs": 8, **engine_args})  # fmt: skip
    scheduler = llm.engine.scheduler
    schedule, passes = scheduler.schedule, []

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        if out.scheduled:
            passes.append(out.num_steps)
        return out

    scheduler.schedule = spy  # type: ignore[method-assign]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()  # every block back in the pool, the reserved ones too
    assert llm.engine.runner is None or not llm.engine.runner.batch.requests  # None: in the mp worker
    llm.engine.shutdown()
    return outs, passes, scheduler.num_preemptions


def _same(a: list[Any], b: list[Any]) -> None:
    for x, y in zip(a, b, strict=True):
        ox, oy = x.outputs[0], y.outputs[0]
        assert (ox.token_ids, ox.text, ox.finish_reason, ox.stop_reason) == (oy.token_ids, oy.text, oy.finish_reason, oy.stop_reason)
        assert ox.cumulative_logprob == pytest.approx(oy.cumulative_logprob, abs=1e-4)


@pytest.mark.parametrize("batch,executor,blocks", [(1, "uni", 24), (8, "uni", 24), (3, "mp", 24), (8, "uni", 12)],
                         ids=["kernel", "batched", "mp", "preempted"])  # fmt: skip
def test_greedy_tokens_and_logprobs_equal_one_step_and_hf(batch: int, executor: str, blocks: int, tiny_model_dir: Callable[..., Path]) -> None:
    """Batch 1 runs the CPU decode kernel's greedy head each pass, 8 requests the eager model, mp
    the runner in a worker process (async scheduling waits for a multi-step step's tokens), 12
    blocks preempt and recompute requests (the slots reserved ahead never preempt anyone);
    max_tokens 13 is not a multiple of N: the last run is cut to the tokens left."""
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path))[:batch]
    params = SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True)
    multi, passes, preempted = _generate(path, prompts, params, N, distributed_executor_backend=executor, num_kv_blocks=blocks)
    assert (preempted > 0) == (blocks == 12)
    single, *_ = _generate(path, prompts, params, 1)
    _same(multi, single)
    assert passes.count(N) >= 2 and max(passes) == N
    hf = _hf_run(path, prompts, max_tokens=13)
    for out, tokens, lps in zip(multi, hf.tokens, hf.logprobs):
        o = out.outputs[0]
        assert o.token_ids == tokens and o.finish_reason == "length"
        assert o.cumulative_logprob == pytest.approx(float(lps[range(13), tokens].sum()), abs=1e-3)


def test_stops_in_the_middle_of_a_run(tiny_model_dir: Callable[..., Path]) -> None:
    """A stop token id, EOS and a stop string arriving mid-run end the request there, as one pass
    at a time does: the tokens after are dropped, the KV written past the stop freed."""
    path = tiny_model_dir("llama")
    prompt = _random_prompts(_vocab(path))[2]
    free = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = _generate(path, [prompt], free, 1)[0][0].outputs[0]
    # token 0 comes from the prompt's step, runs of N from token 1: index 6 is mid-run
    stop_id = ref.token_ids[6]
    first = ref.token_ids.index(stop_id)
    assert first % N not in (0, 1), "pick another index: this one starts or ends no run"
    by_text = ref.text[: len(ref.text) * 2 // 3][-3:]
    cases = [
        SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=[stop_id], ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=0.0, stop=[by_text], ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=0.0, stop=[by_text], include_stop_str_in_output=True, ignore_eos=True),
    ]
    for params in cases:
        multi, passes, _ = _generate(path, [prompt], params, N)
        single, *_ = _generate(path, [prompt], params, 1)
        _same(multi, single)
        assert multi[0].outputs[0].finish_reason == "stop" and len(multi[0].outputs[0].token_ids) < 16
        assert N in passes


def test_eos_in_the_middle_of_a_run(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("qwen2")
    prompt = _random_prompts(_vocab(path))[1]
    ref = _generate(path, [prompt], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), 1)[0][0].outputs[0]
    eos = ref.token_ids[7]
    params = SamplingParams(max_tokens=16, temperature=0.0, end_id=eos)
    multi, *_ = _generate(path, [prompt], params, N)
    single, *_ = _generate(path, [prompt], params, 1)
    _same(multi, single)
    assert multi[0].outputs[0].token_ids[-1] == eos and len(multi[0].outputs[0].token_ids) == ref.token_ids.index(eos) + 1


def test_prompt_ending_near_max_model_len(tiny_model_dir: Callable[..., Path]) -> None:
    """max_tokens is capped by the model length: the runs never reserve or write past it."""
    path = tiny_model_dir("qwen2")
    prompt = (_random_prompts(_vocab(path))[6] * 2)[:58]
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    multi, passes, _ = _generate(path, [prompt], params, N, max_model_len=64, num_kv_blocks=4)
    single, *_ = _generate(path, [prompt], params, 1, max_model_len=64, num_kv_blocks=4)
    _same(multi, single)
    assert len(multi[0].outputs[0].token_ids) == 6 and passes[1:] == [N, 1]
    assert multi[0].outputs[0].token_ids == _hf_run(path, [prompt], max_tokens=6).tokens[0]


def test_a_step_with_any_other_request_runs_one_pass(tiny_model_dir: Callable[..., Path]) -> None:
    """A sampled request or one asking for top logprobs beside greedy ones: every step they share
    runs one pass; the greedy requests' tokens are unchanged, and once alone they run N."""
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path))[:3]
    greedy = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    for other in (SamplingParams(max_tokens=5, temperature=0.8, seed=1, ignore_eos=True),
                  SamplingParams(max_tokens=5, temperature=0.0, logprobs=2, ignore_eos=True)):  # fmt: skip
        params = [greedy, greedy, other]
        multi, passes, _ = _generate(path, prompts, params, N)
        single, *_ = _generate(path, prompts, params, 1)
        _same(multi, single)
        assert passes[:5] == [1] * 5 and N in passes[5:]  # the prompts' step, then 4 decodes with `other`


class _Replay:
    """A captured graph's stand-in on CPU (torch.cuda.CUDAGraph needs a GPU): `replay()` runs the
    model over DecodeGraphs' persistent buffers (Triton's kernels in its interpreter), as the
    captured launches read them; the GPU run is tests/model/test_gpu_paths.py's."""

    def __init__(self, graphs: Any, b: int, runner: Any) -> None:
        self.graphs, self.b, self.runner = graphs, b, runner

    def replay(self) -> None:
        from inflight.models.triton_attention import TritonAttention

        g, b, r = self.graphs, self.b, self.runner
        meta = TritonAttention(g.block_size, r.window, torch.device("cpu")).graph_meta(g.query_start[: b + 1], g.seq_lens[:b],
                                                                                       g.block_table[:b], g.slots[:b])  # fmt: skip
        g.outputs[b] = r.model(g.input_ids[:b], g.positions[:b], r.kv_caches, meta)


def test_graph_passes_feed_each_token_back_in_the_buffers(tiny_model_dir: Callable[..., Path]) -> None:
    """DecodeGraphs.forward_steps on CPU: each pass's positions, slots and context lengths in the
    graph's buffers, the argmax fed back into its input ids, padding rows writing nothing (3 rows
    replay the 4-row graph): HF's tokens, N = 1's logprobs."""
    from inflight.models.cuda_graphs import DecodeGraphs

    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path))[:3]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    # the prompts run on the torch backend, the replays on Triton's kernels: the same cache layout
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_scheduler_steps=N, num_kv_blocks=24, block_size=16,
              max_num_seqs=4, progress=False)  # fmt: skip
    runner = llm.engine.runner
    runner.decode_kernel = None  # every pass through the graphs
    graphs = DecodeGraphs(4, runner.batch.max_blocks, 16, torch.device("cpu"))
    graphs.graphs = {b: _Replay(graphs, b, runner) for b in graphs.sizes}  # type: ignore[misc]
    runner.graphs = graphs
    multi = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    assert graphs.num_replays == N  # tokens 1-4: one step of N passes
    single, *_ = _generate(path, prompts, params, 1)
    _same(multi, single)
    assert [o.outputs[0].token_ids for o in multi] == _hf_run(path, prompts, max_tokens=5).tokens


def test_a_step_streams_its_tokens_as_one_delta(tiny_model_dir: Callable[..., Path]) -> None:
    """The engine's outputs per step (what a streaming client receives): the prompt's token, then
    N tokens a step in one delta, their token_times one instant; the deltas add up to the text."""
    path = tiny_model_dir("qwen2")
    prompt = {"prompt_token_ids": _random_prompts(_vocab(path))[3]}
    params = SamplingParams(max_tokens=11, temperature=0.0, ignore_eos=True)
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_scheduler_steps=N, num_kv_blocks=24, progress=False)
    engine = llm.engine
    engine.add_request(engine.make_request(prompt, params))
    outs = [o for _ in range(20) if engine.has_unfinished_requests() for o in engine.step()]
    assert [len(o.outputs[0].delta_token_ids) for o in outs] == [1, N, N, 2]
    assert sum((o.outputs[0].delta_token_ids for o in outs), []) == outs[-1].outputs[0].token_ids
    assert "".join(o.outputs[0].delta_text for o in outs) == outs[-1].outputs[0].text
    times = outs[-1].metrics.token_times
    assert len(set(times)) == 4 and times[1:5] == [times[1]] * N
    engine.kv.pool.check_idle()
