"""GGUF checkpoints (llama.cpp's files), read as they are on disk.

`GGUFCheckpoint(path)` opens one file or every shard of a split one (`name-00001-of-00003.gguf`)
with gguf-py's reader over a numpy memmap, checks every tensor's type and byte range against
the file before any weight is read (a truncated or corrupt file, an unknown type: one
`ValueError` naming the file and the tensor or field), and gives:

  hf_config()   the architecture as a Hugging Face config dict (llama / qwen2 / qwen3; Mistral
                files say llama): sizes, norms eps, rope theta and scaling (`rope_freqs.weight`,
                llama.cpp's Llama 3 frequency factors, as `rope_freq_factors`), context length,
                vocabulary, tied embeddings, bos / eos
  weights()     (Hugging Face name, `GGUFTensor`) pairs: a `TensorSource` that dequantizes rows
                for float targets (norms, the embedding) and `read_quant` for linear layers
                (a `QuantWeight` holding the file's blocks, never a float copy)

llama.cpp's converter permutes the rows of q / k weights of llama-arch models (its rotary pairs
adjacent dims; HF rotates halves): `GGUFTensor` gathers the rows back (`_unpermute_rows`), as
transformers' GGUF loader does. Rows of a GGML block row are independent, so this works on the
quantized bytes. The tokenizer is rebuilt by transformers from `tokenizer.ggml.*`
(engine/tokenizer.py).
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch loads when a tensor is read: the start-up checks read the header without it
    import torch

    from inflight.quant.weight import QuantWeight

# GGML type name -> our qtype; None: a float tensor read as float
SUPPORTED_TYPES: dict[str, str | None] = {
    "F32": None, "F16": "f16", "BF16": "bf16",
    "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1",
    "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
}  # fmt: skip (Q4_1 / Q5_0 / Q5_1: what llama.cpp's K-quant files hold where a row is not 256-divisible)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}  # fmt: skip
# config.json's torch_dtype of a float file (a quantized one: float16, bfloat16 for a BF16 embedding)
_TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_ROW_CHUNK = 4096  # rows dequantized at a time for float targets: bounds the float32 scratch


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def shard_paths(path: str | Path) -> list[Path]:
    """Every shard of a split file (given any one of them), or [path]."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model: no such GGUF file {path}")
    m = _SHARD.match(path.name)
    if not m:
        return [path]
    n = int(m["n"])
    paths = [path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"model: split GGUF {path.name} lacks shard(s) {', '.join(missing)}")
    return paths


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name; None for one we do not know."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = re.match(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$", name)
    if m and m[2] in _LAYER_NAMES:
        return f"model.layers.{m[1]}.{_LAYER_NAMES[m[2]]}.{m[3]}"
    return None


def _open(path: Path) -> Any:
    """gguf-py's reader, with tensor types and byte ranges checked by name first."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class Reader(GGUFReader):  # type: ignore[misc]
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for field in fields:
                _, name_data, _, dims, raw_dtype, offset = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    kind = GGMLQuantizationType(int(raw_dtype[0])).name
                except ValueError:
                    kind = f"type id {int(raw_dtype[0])}"
                if kind not in SUPPORTED_TYPES:
                    raise ValueError(f"tensor {name!r} has GGML type {kind}, which is not supported "
                                     f"(supported: {', '.join(SUPPORTED_TYPES)})")  # fmt: skip
                elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
                end = int(start_offs + offset[0]) + int(np.prod(dims)) // elems * nbytes
                if end > len(self.data):
                    raise ValueError(f"tensor {name!r} ends at byte {end}, past the end of the file "
                                     f"({len(self.data)} bytes): the file is truncated")  # fmt: skip
            super()._build_tensors(start_offs, fields)

    try:
        return Reader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError) as e:
        raise ValueError(f"model: {path.name} is not a readable GGUF file: {e}") from e


class GGUFCheckpoint:
    """One GGUF model (all its shards): metadata, the HF config, and the tensors by HF name."""

    def __init__(self, path: str | Path) -> None:
        self.paths = shard_paths(path)
        readers = [_open(p) for p in self.paths]
        self.fields = readers[0].fields
        self.tensors: dict[str, Any] = {}
        self._maps: dict[str, Any] = {}  # tensor name -> its shard's mmap (pages released after loading)
        for reader in readers:
            for t in reader.tensors:
                if t.name in self.tensors:
                    raise ValueError(f"model: tensor {t.name!r} appears in two GGUF shards")
                self.tensors[t.name] = t
                self._maps[t.name] = getattr(reader.data, "_mmap", None)
        self.arch = str(self.get("general.architecture"))
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"model: GGUF general.architecture {self.arch!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")  # fmt: skip

    def get(self, key: str, default: Any = ...) -> Any:
        """A metadata value (strings decoded, arrays as lists); a missing required key is an error."""
        field = self.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"model: the GGUF file lacks metadata field {key!r}")
            return default
        try:
            return field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise ValueError(f"model: GGUF metadata field {key!r} is unreadable ({e})") from e

    def hf_config(self) -> dict[str, Any]:
        a = self.arch
        heads = int(self.get(f"{a}.attention.head_count"))
        hidden = int(self.get(f"{a}.embedding_length"))
        embd = self.tensors.get("token_embd.weight")
        if embd is None:
            raise ValueError("model: the GGUF file has no token_embd.weight tensor")
        cfg: dict[str, Any] = {
            "architectures": [ARCHITECTURES[a]], "model_type": a,
            "hidden_size": hidden,
            "intermediate_size": int(self.get(f"{a}.feed_forward_length")),
            "num_hidden_layers": int(self.get(f"{a}.block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self.get(f"{a}.attention.head_count_kv", heads)),
            "head_dim": int(self.get(f"{a}.attention.key_length", hidden // heads)),
            "rms_norm_eps": float(self.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(self.get(f"{a}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self.get(f"{a}.context_length", 2048)),
            "vocab_size": int(embd.shape[1]),  # GGUF dims run innermost first: (hidden, vocab)
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "hidden_act": "silu",
            "torch_dtype": _TORCH_DTYPES[self.float_type() or ("BF16" if embd.tensor_type.name == "BF16" else "F16")],
        }  # fmt: skip
        bos = self.get("tokenizer.ggml.bos_token_id", None)
        if bos is not None:
            cfg["bos_token_id"] = int(bos)
        # llama.cpp stops at any end-of-generation token: eos, and eot / eom where the file names them
        eog = [int(v) for k in ("eos", "eot", "eom") if (v := self.get(f"tokenizer.ggml.{k}_token_id", None)) is not None]
        if eog:
            cfg["eos_token_id"] = eog[0] if len(set(eog)) == 1 else sorted(set(eog), key=eog.index)
        scaling = self._rope_scaling()
        if scaling:
            cfg["rope_scaling"] = scaling
        if "rope_freqs.weight" in self.tensors:  # Llama 3.1's per-frequency divisors
            cfg["rope_freq_factors"] = [float(v) for v in np.asarray(self.tensors["rope_freqs.weight"].data).ravel()]
        return cfg

    def _rope_scaling(self) -> dict[str, Any] | None:
        a = self.arch
        kind = self.get(f"{a}.rope.scaling.type", "none")
        if kind == "none":
            return None
        factor = float(self.get(f"{a}.rope.scaling.factor"))
        if kind == "linear":
            return {"rope_type": "linear", "factor": factor}
        if kind == "yarn":
            orig = int(self.get(f"{a}.rope.scaling.original_context_length"))
            return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
        raise ValueError(f"model: GGUF {a}.rope.scaling.type {kind!r} is not supported (linear, yarn)")

    def weights(self) -> Iterator[tuple[str, GGUFTensor]]:
        """(HF name, source) of every tensor the model loads; an unknown name is an error."""
        cfg = self.hf_config()
        for name, t in self.tensors.items():
            if name == "rope_freqs.weight":
                continue  # read into the config
            ours = hf_name(name)
            if ours is None:
                raise ValueError(f"model: GGUF tensor {name!r} is not one a {self.arch} model has")
            heads = None
            if self.arch == "llama" and re.search(r"\.attn_[qk]\.", name):
                heads = cfg["num_attention_heads"] if ".attn_q." in name else cfg["num_key_value_heads"]
            yield ours, GGUFTensor(t, heads)
            self._release(name)

    def _release(self, name: str) -> None:
        """Drop a loaded tensor's file pages from this process's resident set (its bytes were
        copied out): otherwise the load's peak RSS holds the whole mapped file beside the copies
        (Llama-3-8B Q4_K_M: 10.0 GB peak for 5.4 GB steady). A page read again is read from
        the page cache; a system without madvise keeps them (only the peak is higher)."""
        t, mm = self.tensors[name], self._maps.get(name)
        page = mmap.PAGESIZE
        start = int(t.data_offset) // page * page
        end = min(-(-(int(t.data_offset) + int(t.n_bytes)) // page) * page, len(mm) if mm is not None else 0)
        try:
            if mm is not None and end > start:
                mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (AttributeError, OSError, ValueError):
            pass

    def float_type(self) -> str | None:
        """"F16" / "BF16" / "F32" when every 2-D tensor of the file (the linear weights and the
        token embedding) is of that one float type, as llama.cpp's model-f16.gguf files are; None
        for a file with quantized weights (or several float types)."""
        kinds = {t.tensor_type.name for t in self.tensors.values() if len(t.shape) > 1}
        return kinds.pop() if len(kinds) == 1 and kinds <= set(_TORCH_DTYPES) else None

    def quantized_names(self) -> set[str]:
        """HF names of the 2-D weights kept quantized (every type but F32 / F16 / BF16)."""
        return {ours for name, t in self.tensors.items()
                if SUPPORTED_TYPES[t.tensor_type.name] not in (None, "f16", "bf16") and (ours := hf_name(name))}  # fmt: skip


def _unpermute_rows(rows: int, heads: int) -> np.ndarray:
    """GGUF row of each HF row of a llama q / k weight: llama.cpp stored HF row (h, j, i) (head,
    half, pair index) at (h, i, j)."""
    hd = rows // heads
    h, j, i = np.meshgrid(np.arange(heads), np.arange(2), np.arange(hd // 2), indexing="ij")
    return (h * hd + i * 2 + j).reshape(-1)


class GGUFTensor:
    """A `TensorSource` over one GGUF tensor in HF orientation: (N out, K in), or (K,)."""

    def __init__(self, tensor: Any, unpermute_heads: int | None = None) -> None:
        self.name = tensor.name
        self.ggml_type = tensor.tensor_type.name
        self.qtype = SUPPORTED_TYPES[self.ggml_type]
        self.shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        self._data = tensor.data  # memmap view: (N, K) elements, or (N, row bytes) for blocks
        self._order = _unpermute_rows(self.shape[0], unpermute_heads) if unpermute_heads else None

    @property
    def quantized(self) -> bool:
        return self.qtype not in (None, "f16", "bf16")

    def _rows(self, start: int, size: int) -> np.ndarray:
        if self._order is None:
            return self._data[start : start + size]
        return self._data[self._order[start : start + size]]

    def read(self, dim: int, start: int, size: int) -> torch.Tensor:
        """Rows or columns [start, start + size): an F32 / F16 / BF16 tensor as the file's bytes
        (the caller's `copy_` converts it, in torch, once), quantized blocks dequantized to float32."""
        import torch

        if len(self.shape) == 1:
            return torch.from_numpy(np.array(self._data[start : start + size], dtype=np.float32))
        rows = range(0, self.shape[0]) if dim == 1 else range(start, start + size)
        dtype = getattr(torch, _TORCH_DTYPES.get(self.ggml_type, "float32"))
        out = torch.empty(len(rows), self.shape[1], dtype=dtype)
        # float types as a byte copy: widening F16 to float32 in numpy (single-threaded, a fresh
        # array per chunk) before the caller's copy_ narrowed it again cost 3.3 s of a Qwen2.5-0.5B
        # F16 file's 6.5 s of weight loading
        for r in range(0, len(rows), _ROW_CHUNK):
            n = min(_ROW_CHUNK, len(rows) - r)
            raw = self._rows(rows.start + r, n)
            if self.ggml_type in _TORCH_DTYPES:
                out[r : r + n].view(torch.uint8).numpy()[:] = np.asarray(raw).view(np.uint8).reshape(n, -1)
            else:
                out[r : r + n] = torch.from_numpy(self._dequant(raw))
        return out if dim == 0 else out[:, start : start + size]

    def _dequant(self, raw: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        return quants.dequantize(np.asarray(raw), getattr(GGMLQuantizationType, self.ggml_type)).astype(np.float32)

    def read_quant(self, dim: int, start: int, size: int) -> QuantWeight:
        """Rows (dim 0) or input columns (dim 1, on block boundaries) as a `QuantWeight` over a
        copy of the file's bytes (no float copy)."""
        import torch

        from inflight.quant.weight import QuantWeight, block_info

        if self.qtype is None:
            raise ValueError(f"is {self.ggml_type} beside quantized parts of the same layer (not supported)")
        n, k = self.shape
        elems, nbytes = block_info(self.qtype)
        if dim == 0:
            raw, shape = self._rows(start, size), (size, k)
        else:
            if start % elems or size % elems:
                raise ValueError(f"input columns [{start}, {start + size}) do not fall on {self.qtype} "
                                 f"block boundaries ({elems} elements)")  # fmt: skip
            raw8 = self._rows(0, n).view(np.uint8).reshape(n, -1)
            raw, shape = raw8[:, start // elems * nbytes : (start + size) // elems * nbytes], (n, size)
        data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1).copy())
        if self.qtype in ("f16", "bf16"):
            data = data.view(torch.float16 if self.qtype == "f16" else torch.bfloat16)
        return QuantWeight(self.qtype, shape, data)
