"""Linear layers and their methods (inflight/models/linear.py, cpu_linear.py), the loader that
follows their checkpoint shards, and the fast paths' one question (`accepts`).

Numerics of whole models are the parity suites' job (tests/model/test_hf_parity.py,
test_decode_kernel.py, test_cpu_dispatch.py); here each piece is checked on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from inflight import LLM, SamplingParams
from inflight.models import cpu_kernel
from inflight.models.cpu_kernel import DecodeKernel
from inflight.models.cpu_linear import OneDNNLinear, cpu_packing_available, pack_weight
from inflight.models.cuda_graphs import DecodeGraphs
from inflight.models.linear import GateUpLinear, Linear, MergedLinear, PlainLinear, linear_layers

ONEDNN_FP32 = cpu_packing_available(torch.device("cpu"), torch.float32)


def _filled(layer: Any, seed: int = 0) -> Any:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return layer


def test_merged_layer_knows_its_shards_and_loads_their_rows() -> None:
    qkv = MergedLinear(8, {"q_proj": 6, "k_proj": 2, "v_proj": 2}, bias=True)
    assert qkv.output_sizes == [6, 2, 2] and qkv.out_features == 10
    assert [qkv.shard_rows(s) for s in ("q_proj", "k_proj", "v_proj")] == [(0, 6), (6, 2), (8, 2)]
    names = [n for n, _, _ in qkv.checkpoint_tensors("model.layers.3.self_attn.qkv_proj")]
    assert names == [f"model.layers.3.self_attn.{s}_proj.{p}" for s in "qkv" for p in ("weight", "bias")]
    k = torch.randn(2, 8)
    with torch.no_grad():
        qkv.load("weight", k, shard="k_proj")
        qkv.load("bias", torch.ones(2), shard="k_proj")
    assert torch.equal(qkv.weight[6:8], k) and torch.equal(qkv.bias[6:8], torch.ones(2))
    with pytest.raises(KeyError):
        qkv.shard_rows("o_proj")


def test_tied_layer_loads_nothing_and_keeps_its_owners_weight() -> None:
    embed = torch.nn.Embedding(10, 4)
    head = Linear(4, 10, bias=False, tied=True)
    assert head.weight is None and list(head.checkpoint_tensors("lm_head")) == []
    head.tie(embed.weight)
    head.drop_weight()  # a packing method drops plain weights: not the embedding's
    assert head.weight is embed.weight
    x = torch.randn(3, 4)
    assert torch.equal(head(x), F.linear(x, embed.weight))


def test_plain_method_is_f_linear() -> None:
    x = torch.randn(5, 8)
    lin = _filled(Linear(8, 6, bias=True))
    assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    gate_up = _filled(GateUpLinear(8, 6, bias=False))
    gate, up = F.linear(x, gate_up.weight).split(6, dim=-1)
    assert torch.equal(gate_up(x), F.silu(gate) * up)


@pytest.mark.skipif(not ONEDNN_FP32, reason="the platform module does not pack float32 here")
@pytest.mark.parametrize("bias", [False, True])
@torch.inference_mode()  # as the runner runs (with autograd on, oneDNN's fused swish rounds differently)
def test_onednn_method_packs_once_drops_the_weight_and_fuses_silu_mul(bias: bool) -> None:
    x = torch.randn(7, 8)
    gate_up = _filled(GateUpLinear(8, 6, bias=bias))
    gate_w, up_w = (w.clone() for w in gate_up.weight.detach().chunk(2))
    b_gate, b_up = gate_up.bias.detach().chunk(2) if bias else (None, None)
    plain = gate_up(x)
    gate_up.method = OneDNNLinear()
    gate_up.method.process_weights_after_loading(gate_up)
    assert gate_up.weight is None and len(gate_up.method.packed) == 2
    gate = torch.ops.mkldnn._linear_pointwise(x, pack_weight(gate_w), b_gate, "swish", [], "")
    want = torch.ops.mkldnn._linear_pointwise.binary(x, gate, pack_weight(up_w), b_up, "mul")
    assert torch.equal(gate_up(x), want)  # the same fused GEMMs as before the method existed
    torch.testing.assert_close(gate_up(x), plain, rtol=1e-4, atol=1e-5)
    lin = _filled(Linear(8, 6, bias=bias), seed=1)
    ref, w = lin(x), lin.weight.detach().clone()
    lin.method = OneDNNLinear(plain=w)  # a plain copy for the decode kernel, kept by the method
    lin.method.process_weights_after_loading(lin)
    assert lin.weight is None and lin.plain_weight() is w
    torch.testing.assert_close(lin(x), ref, rtol=1e-4, atol=1e-5)


def _load(path: Path, dtype: str = "float32", **kwargs: Any) -> LLM:
    return LLM(model=str(path), dtype=dtype, device="cpu", num_kv_blocks=16, progress=False, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied / tied lm_head with qkv biases
def test_loaded_model_runs_its_methods(arch: str, tiny_model_dir: Callable[..., Path]) -> None:
    model = _load(tiny_model_dir(arch)).engine.runner.model
    layers = linear_layers(model)
    assert len(layers) == 2 * 4 + 1 and layers[-1] is model.lm_head
    assert {type(layer.method) for layer in layers} == {OneDNNLinear if ONEDNN_FP32 else PlainLinear}
    assert model.lm_head.tied == (arch == "qwen2")
    if arch == "qwen2":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    if ONEDNN_FP32:  # packed: the plain weights are gone, the kernel's copies stay
        assert all(layer.weight is None for layer in layers if not layer.tied)
    assert all(layer.plain_weight() is not None for layer in layers)


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_loader_names_a_missing_shard_and_an_unexpected_tensor(tiny_model_dir: Callable[..., Path],
                                                               tmp_path: Path) -> None:  # fmt: skip
    src = tiny_model_dir("qwen2")
    missing = _rewrite(src, tmp_path / "missing", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks weights for \['model.layers.1.mlp.up_proj.weight'\]"):
        _load(missing)
    extra = _rewrite(src, tmp_path / "extra", lambda t: t.update({"model.layers.0.mlp.w3.weight": torch.zeros(1)}))
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'model.layers.0.mlp.w3.weight'"):
        _load(extra)
    # a tied checkpoint that still carries lm_head.weight loads (the copy is ignored)
    carried = _rewrite(src, tmp_path / "carried",
                       lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))  # fmt: skip
    out = _load(carried).generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_fast_paths_answer_the_same_question(tiny_model_dir: Callable[..., Path]) -> None:
    """CUDA graphs and the decode kernel both take steps without prompt embeddings, up to their
    size; the runner asks each in turn (graphs built on CPU: only their buffers exist). Graphs take
    all-decode steps only; the kernel also a piece of several rows (a verification, a short prompt)
    in at most MAX_PIECES pieces."""
    graphs = DecodeGraphs(max_batch=4, max_blocks=2, block_size=16, device=torch.device("cpu"))
    llm = _load(tiny_model_dir("llama"))
    kernel = llm.engine.runner.decode_kernel
    assert isinstance(kernel, DecodeKernel)
    for fast, most in ((graphs, 4), (kernel, cpu_kernel.MAX_ROWS)):
        assert fast.accepts(1) and fast.accepts(most) and not fast.accepts(most + 1)
        assert not fast.accepts(1, embeds=True)
    assert not graphs.accepts(1, decode_only=False)
    assert kernel.accepts(5, decode_only=False, num_pieces=1)  # one request's K + 1 rows
    pieces = cpu_kernel.MAX_PIECES
    assert kernel.accepts(pieces, num_pieces=pieces) and not kernel.accepts(pieces + 1, num_pieces=pieces + 1)


def test_runner_asks_its_fast_paths_each_step(tiny_model_dir: Callable[..., Path]) -> None:
    llm = _load(tiny_model_dir("llama"))
    runner = llm.engine.runner
    asked: list[tuple[int, bool, bool]] = []

    class Refuses:
        def accepts(self, num_rows: int, decode_only: bool = True, embeds: bool = False, num_pieces: int = 1) -> bool:
            asked.append((num_rows, decode_only, embeds))
            return False

    runner.graphs = Refuses()  # type: ignore[assignment]  # asked first, then the kernel
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}], params, use_tqdm=False)
    assert asked[0] == (6, False, False) and asked[1:] == [(2, True, False)] * 2
