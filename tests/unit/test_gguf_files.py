"""GGUF reading without a model run: the K-quant writer against gguf-py's dequantizer, and bad
files refused at start-up with one error naming the tensor / field, before weights are read."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from inflight.config import ModelConfig
from inflight.quant.ggml_quantize import quantize
from inflight.quant.gguf import GGUFCheckpoint, hf_name
from inflight.quant.weight import QuantWeight, block_info, dequantize

# worst element error / max|x| of a normal row, per type (4-bit ~1/15 of the range, 8-bit ~1/255)
ROUND_TRIP = {"q8_0": 0.01, "q4_0": 0.1, "q4_1": 0.1, "q5_0": 0.05, "q5_1": 0.05, "q4_k": 0.1, "q5_k": 0.05, "q6_k": 0.03}


@pytest.mark.parametrize("qtype", list(ROUND_TRIP))
def test_quantizer_round_trips_through_gguf_dequantize(qtype: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 512)).astype(np.float32) * 0.1
    x[1] = np.abs(x[1])  # all positive: the K-quants' min is 0
    x[2] = 0.0  # an all-zero row: scales 0, no NaN
    blocks = quantize(x, qtype)
    elems, nbytes = block_info(qtype)
    assert blocks.shape == (6, 512 // elems * nbytes) and blocks.dtype == np.uint8
    y = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, qtype.upper()))
    assert np.abs(y - x).max() <= ROUND_TRIP[qtype] * np.abs(x).max()
    assert np.all(y[2] == 0)
    w = dequantize(QuantWeight(qtype, (6, 512), torch.from_numpy(blocks)))  # the seam's reference agrees
    assert torch.equal(w, torch.from_numpy(y.astype(np.float32)))


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, str]], arch: str = "llama") -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_context_length(128)
    for name, (x, kind) in tensors.items():
        if kind == "F32":
            w.add_tensor(name, x)
        else:
            t = getattr(gguf.GGMLQuantizationType, kind)
            q = gguf.quants.quantize(x, t)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _file(tmp_path: Path, kind: str = "Q8_0", arch: str = "llama") -> Path:
    x = np.random.default_rng(0).standard_normal((100, 256)).astype(np.float32)
    return _write(tmp_path / "m.gguf", {"token_embd.weight": (x, "F32"), "blk.0.attn_q.weight": (x[:64], kind)}, arch)


def test_a_good_file_reads(tmp_path: Path) -> None:
    ckpt = GGUFCheckpoint(_file(tmp_path))
    cfg = ckpt.hf_config()
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == 100 and cfg["tie_word_embeddings"]
    assert ckpt.quantized_names() == {"model.layers.0.self_attn.q_proj.weight"}
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"


def test_unknown_quant_type_names_the_tensor(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_q\.weight' has GGML type TQ2_0, which is not supported"):
        GGUFCheckpoint(_file(tmp_path, "TQ2_0"))


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    path = _file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"tensor 'blk\.0\.attn_q\.weight' ends at byte \d+, past the end .* truncated"):
        ModelConfig.from_path(path)  # start-up: the config is read before any engine exists


@pytest.mark.parametrize("cut", [0, 3, 40, 200])
def test_corrupt_or_cut_headers_are_one_clear_error(tmp_path: Path, cut: int) -> None:
    path = _file(tmp_path)
    path.write_bytes(path.read_bytes()[:cut] if cut else b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"m\.gguf"):
        GGUFCheckpoint(path)


def test_unsupported_architecture_and_missing_fields(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"general\.architecture 'gpt2' is not supported"):
        GGUFCheckpoint(_file(tmp_path, arch="gpt2"))
    path = _write(tmp_path / "n.gguf", {"token_embd.weight": (np.zeros((8, 64), np.float32), "F32")})
    reader_cfg = GGUFCheckpoint(path)
    reader_cfg.fields.pop("llama.attention.head_count")
    with pytest.raises(ValueError, match=r"lacks metadata field 'llama\.attention\.head_count'"):
        reader_cfg.hf_config()


def test_split_file_with_a_missing_shard(tmp_path: Path) -> None:
    first = _file(tmp_path).rename(tmp_path / "m-00001-of-00002.gguf")
    with pytest.raises(FileNotFoundError, match=r"lacks shard\(s\) m-00002-of-00002\.gguf"):
        GGUFCheckpoint(first)


def test_dummy_weights_are_refused_for_quantized_models(tmp_path: Path) -> None:
    from inflight.models import loader

    cfg = ModelConfig.from_path(_file(tmp_path), load_format="dummy", device="cpu")
    with pytest.raises(ValueError, match=r"load_format: dummy .* does not apply to a quantized checkpoint"):
        loader.load_model(cfg, progress=False)
