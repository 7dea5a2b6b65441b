"""K-quant GGUF files (Q4_K / Q5_K / Q6_K: 256-element super-blocks) served under tensor parallelism.

The tiny qwen3 here is the narrowest shape whose row-parallel inputs split into super-blocks:
hidden 256, 4 heads x 128 (o_proj's 512 inputs: 256 per rank), intermediate 768 (down_proj's
3 super-blocks: an even 384 per rank would cut one, so they are dealt 512 + 256, gate / up's rows
alike: `checkpoint.block_shares`, the way a Qwen2.5-0.5B Q4_K_M file's 4864 = 19 super-blocks
split), tied embeddings (the quantized token embedding and the lm_head over its bytes split by
vocabulary rows). Anchors: transformers' GGUF loader on the same file, and TP=1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_gguf import EXACT_ATOL, KERNEL_ATOL, N_NEW, _hf_refs, _prompts, _run
from transformers import AutoModelForCausalLM

from inflight import LLM
from inflight.checkpoint import Checkpoint, block_shares
from inflight.config import ModelConfig
from inflight.models import loader
from inflight.models.parallel import TensorParallel
from inflight.quant.embedding import QuantEmbedding
from inflight.quant.gguf import GGUFCheckpoint
from inflight.quant.weight import dequantize
from inflight.testing.checkpoints import QWEN25_05B_CONFIG
from inflight.testing.gguf import hf_to_gguf

SHAPE = {"hidden_size": 256, "intermediate_size": 768, "head_dim": 128}
# (file type, per-tensor overrides, C kernels): every K type in a row-parallel layer; Q4_K_M's mix
# (attn_v, ffn_down in Q6_K) through the portable path (HF's values exactly), the other mix
# (Q5_K, o_proj Q6_K, down_proj Q4_K) through the C kernels (int8 activations per 32: a cut on a
# super-block boundary leaves every 32-element activation block whole)
CASES = [("q4_k_m", None, False), ("q5_k", {"attn_output": "q6_k", "ffn_down": "q4_k"}, True),
         ("q5_0", None, True)]  # each rank's shard regrouped (q5_0g) where the AVX-512 VNNI kernels run


@pytest.fixture(scope="module")
def k_file(tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[str, Path] = {}

    def make(qtype: str, types: dict[str, str] | None = None) -> Path:
        if qtype not in cache:
            src = tiny_model_dir("qwen3", **SHAPE)
            out = tmp_path_factory.mktemp(f"ktp_{qtype}")
            for f in ("config.json", "generation_config.json"):  # HF's loader needs a directory
                (out / f).write_text((src / f).read_text())
            cache[qtype] = hf_to_gguf(src, out / "model.gguf", qtype, types=types)
        return cache[qtype]

    return make


def _llm(path: Path, tp: int) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, max_num_seqs=4, progress=False,
               tensor_parallel_size=tp)  # fmt: skip


@pytest.mark.parametrize(("qtype", "types", "kernels"), CASES, ids=["q4_k_m", "q5_k-mix-kernels", "q5_0-kernels"])
def test_k_quants_under_tensor_parallel_match_transformers(qtype: str, types: dict[str, str] | None, kernels: bool,
                                                           k_file: Callable[..., Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """TP=2 (two worker processes, each reading its share of the file) gives HF's and TP=1's greedy
    tokens and logits: within EXACT_ATOL through the portable path (the same dequantized values;
    tokens identical), within KERNEL_ATOL through the C kernels, whose tokens may part only where
    the reference's own top two logits are that close. (Each layer's product is the same split or
    whole, to 3e-6; but the all-reduce adds the ranks' partial sums in another order, and a 1e-7
    change now and then moves an activation across an int8 rounding boundary of the next layer:
    one rounding step, 0.05 in these logits on the 23-token prompt; its last step is a 0.004 tie.)"""
    path = k_file(qtype, types)
    if not kernels:
        monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")  # inherited by the worker processes
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    refs = _hf_refs(hf, _prompts())
    one = _run(_llm(path, 1), _prompts())
    llm = _llm(path, 2)
    try:
        two = _run(llm, _prompts())
    finally:
        llm.engine.shutdown()
    atol = KERNEL_ATOL if kernels else EXACT_ATOL
    for got, want, ref in zip(two, one, refs):
        _agree(got, ref, atol)
        _agree(got, want, atol)
        _agree(want, ref, atol)


def _agree(got: tuple[list[int], torch.Tensor], ref: tuple[list[int], torch.Tensor], atol: float) -> None:
    """Greedy tokens identical up to a step where `ref`'s top two logits are within `atol`, logits
    within `atol` until then."""
    (tokens, logits), (want, full) = got, ref
    same = next((s for s, (a, b) in enumerate(zip(tokens, want)) if a != b), N_NEW)
    if same < N_NEW:
        top2 = full[same].topk(2).values
        assert (top2[0] - top2[1]).item() <= atol, f"step {same}: {tokens} vs {want}"
    assert (logits[:same] - full[:same]).abs().max().item() <= atol


def test_each_rank_holds_whole_super_blocks(k_file: Callable[..., Path]) -> None:
    """Both ranks built in this process (loading needs no collective): down_proj's input columns
    and gate / up's rows [0, 512) and [512, 768), o_proj's [0, 256) and [256, 512), each exactly
    the file's blocks (dequantized: equal to the file's columns / rows); the vocabulary by rows,
    the tied lm_head over the embedding's own bytes."""
    path = k_file("q4_k_m", None)
    file = dict(GGUFCheckpoint(path).weights())
    cfg = ModelConfig.from_path(path, dtype="float32", device="cpu")
    for rank, (start, size) in enumerate([(0, 512), (512, 256)]):
        model = loader.load_model(cfg, progress=False, tp=TensorParallel(rank, 2))
        mlp, attn = model.model.layers[1].mlp, model.model.layers[1].self_attn
        assert (mlp.down_proj.in_features, mlp.down_proj.col_start) == (size, start)
        down = dequantize(mlp.down_proj.method.weights[0])  # Q6_K in a Q4_K_M file
        assert torch.equal(down, file["model.layers.1.mlp.down_proj.weight"].read(1, start, size))
        gate_up = torch.cat([dequantize(w) for w in mlp.gate_up_proj.method.weights])
        want = torch.cat([file[f"model.layers.1.mlp.{p}_proj.weight"].read(0, start, size) for p in ("gate", "up")])
        assert torch.equal(gate_up, want)
        o = dequantize(attn.o_proj.method.weights[0])
        assert torch.equal(o, file["model.layers.1.self_attn.o_proj.weight"].read(1, 256 * rank, 256))
        embed = model.model.embed_tokens
        assert isinstance(embed, QuantEmbedding) and model.lm_head.method.weights[0] is embed.qweight
        assert embed.vocab_start == rank * embed.rows


def test_shapes_that_cannot_split_name_the_tensor_and_the_sizes_that_would(k_file: Callable[..., Path]) -> None:
    """At start-up, before any worker starts: o_proj's 512 inputs at TP=4 would be 128 per rank
    (half a super-block). From headers alone (`Checkpoint.check_shards`, the blocks as a Q4_K_M
    file's): Qwen2.5-0.5B (o_proj 896 in Q5_0 blocks of 32, down_proj 4864 = 19 Q6_K super-blocks)
    serves at TP=2 (2560 + 2304); Qwen2.5-7B's o_proj (28 heads x 128 in Q4_K) splits into whole
    super-blocks at TP=2, not 4; a down_proj of 3 super-blocks cannot feed 4 ranks. The sizes
    offered also pass ParallelConfig.check_model (heads and KV heads)."""
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 4 splits o_proj's 512 input features into 128 per "
                       r"rank, not whole blocks of 256 \(tensor 'blk\.\d+\.attn_output\.weight', Q4_K\); use one of \[1, 2\]"):  # fmt: skip
        _llm(k_file("q4_k_m", None), 4)

    def header(o_block: tuple[int, str], **hf: int) -> Checkpoint:
        blocks = {"o_proj": o_block, "down_proj": (256, "tensor 'blk.0.ffn_down.weight', Q6_K")}
        return Checkpoint("model-Q4_K_M.gguf", {**QWEN25_05B_CONFIG, **hf}, gguf_blocks=blocks)

    header((32, "tensor 'blk.0.attn_output.weight', Q5_0")).check_shards(2)
    assert block_shares(4864, 256, 2) == [2560, 2304] and block_shares(4864, 256, 4) == [1280, 1280, 1280, 1024]
    q4k = (256, "tensor 'blk.0.attn_output.weight', Q4_K")
    qwen7b = header(q4k, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944)
    qwen7b.check_shards(2)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 4 splits o_proj's 3584 input features into 896 per "
                       r"rank, not whole blocks of 256 \(tensor 'blk\.0\.attn_output\.weight', Q4_K\); use one of \[1, 2\]"):  # fmt: skip
        qwen7b.check_shards(4)
    narrow = header(q4k, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=768)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 4 cannot deal down_proj's 768 input features to 4 "
                       r"ranks in whole blocks of 256 \(tensor 'blk\.0\.ffn_down\.weight', Q6_K: 3 blocks\); "
                       r"use one of \[1, 2\]"):  # fmt: skip
        narrow.check_shards(4)
