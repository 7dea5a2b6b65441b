"""Write a large random GGUF fast: quantized blocks of random bytes (finite, small float16 scales)
streamed straight through the gguf package, never float weights quantized in Python.

    python benchmarks/random_gguf.py /tmp/llama3-8b-q4_k_m.gguf --type q4_k_m   # Llama-3-8B shape
    python benchmarks/random_gguf.py /tmp/llama3-8b-q8_0.gguf --type q8_0

For memory and bandwidth figures (benchmarks/quant_memory.py, quant_bench.py): the bytes a model
holds and reads per token are the file's, whatever the values. One random tensor per (type,
shape) is written for every layer, so writing is bound by the disk (~1 min for 5 GB). The file
has llama.cpp's "no_vocab" tokenizer (token ids only), like the random checkpoints of benchmarks/.
Q4_K_M follows llama-quantize's mix for Llama 3: Q4_K, with attn_v and ffn_down in Q6_K on the
"more bits" layers (the first and last eighth, every third between) and output.weight in Q6_K.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight.quant.weight import block_info  # noqa: E402
from inflight.testing.gguf import _metadata  # noqa: E402

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192, "bos_token_id": 128000,
    "eos_token_id": 128001, "tie_word_embeddings": False,
}  # fmt: skip
_SCALES = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}  # byte offsets of each block's float16 scales


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the layers Q4_K_M keeps attn_v / ffn_down in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_types(cfg: dict, qtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, (N, K) or (K,), type) of every tensor, in file order."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    mix = qtype == "q4_k_m"
    base = "q4_k" if mix else qtype
    out = [("token_embd.weight", (cfg["vocab_size"], h), base)]
    for i in range(layers):
        big = "q6_k" if mix and _more_bits(i, layers) else base
        out += [(f"blk.{i}.attn_norm.weight", (h,), "f32"), (f"blk.{i}.attn_q.weight", (h, h), base),
                (f"blk.{i}.attn_k.weight", (kv, h), base), (f"blk.{i}.attn_v.weight", (kv, h), big),
                (f"blk.{i}.attn_output.weight", (h, h), base), (f"blk.{i}.ffn_norm.weight", (h,), "f32"),
                (f"blk.{i}.ffn_gate.weight", (inter, h), base), (f"blk.{i}.ffn_up.weight", (inter, h), base),
                (f"blk.{i}.ffn_down.weight", (h, inter), big)]  # fmt: skip
    out += [("output_norm.weight", (h,), "f32"), ("output.weight", (cfg["vocab_size"], h), "q6_k" if mix else base)]
    return out


def _random(shape: tuple[int, ...], qtype: str, rng: np.random.Generator) -> np.ndarray:
    if qtype == "f32":
        return np.ones(shape, dtype=np.float32)
    n, k = shape
    elems, nbytes = block_info(qtype)
    blocks = rng.integers(0, 256, size=(n, k // elems, nbytes), dtype=np.uint8)
    scale = (rng.random((n, k // elems), dtype=np.float32) * 2e-3 + 1e-4).astype(np.float16)
    for off in _SCALES[qtype]:
        blocks[:, :, off : off + 2] = scale.view(np.uint8).reshape(n, k // elems, 2)
    return blocks.reshape(n, -1)


def write(out: Path, cfg: dict, qtype: str) -> Path:
    import gguf

    specs = tensor_types(cfg, qtype)
    writer = gguf.GGUFWriter(str(out), "llama")
    _metadata(writer, "llama", cfg, out.parent / "no-tokenizer")  # no tokenizer.json: "no_vocab"
    writer.add_vocab_size(cfg["vocab_size"])  # without a vocabulary llama.cpp sizes token_embd by this
    for name, shape, t in specs:
        if t == "f32":
            writer.add_tensor_info(name, shape[::-1], np.dtype(np.float32), 4 * shape[0])
        else:
            nbytes = shape[0] * shape[1] // block_info(t)[0] * block_info(t)[1]
            raw = getattr(gguf.GGMLQuantizationType, t.upper())
            writer.add_tensor_info(name, (shape[0], nbytes // shape[0]), np.dtype(np.uint8), nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    cache: dict[tuple[tuple[int, ...], str], np.ndarray] = {}
    for _, shape, t in specs:
        if (shape, t) not in cache:
            cache[(shape, t)] = _random(shape, t, rng)
        writer.write_tensor_data(cache[(shape, t)])
    writer.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="q4_k_m", choices=["q4_k_m", "q8_0", "q4_k", "q6_k"])
    args = ap.parse_args()
    path = write(args.out, LLAMA3_8B, args.type)
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
