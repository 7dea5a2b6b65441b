"""A checkpoint's configuration, read without torch: what the start-up checks need.

`Checkpoint.read(path)` reads a Hugging Face directory's config.json (and generation_config.json)
or a GGUF file's header (inflight/quant/gguf.py, torch-free until a tensor is read). `check`
refuses what the loader would refuse after the weights started loading (an architecture we do
not run, an activation we do not implement, a `quantization_config` we cannot read, `--quantization`
on a checkpoint that is quantized already); `max_model_len` checks the requested length.

`EngineArgs.check` (engine/args.py) calls these before torch is imported (`inflight serve` answers
in well under a second), and `EngineArgs.create_engine_config` calls that first: `LLM(...)` raises
the same message. `ModelConfig.from_path` (config.py) builds on a `Checkpoint`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The `architectures` models/loader.py builds (its ARCHITECTURES; tests/unit/test_engine_config_checks.py
# checks they agree), and those whose quantized checkpoints it loads
ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
)  # fmt: skip
QUANT_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# what every decoder's config.json gives (the model is built from them)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_DEFAULT_MAX_POSITIONS = 2048  # a config.json without max_position_embeddings (Llama 1's context)
_TOP_LEVEL_KEYS = ("model_type", "architectures", "tie_word_embeddings", "torch_dtype", "dtype")


def flatten_text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A vision-language config with the decoder's fields at the top level, as the hub's Qwen2-VL
    configs have them; transformers 5 nests them in `text_config` (which wins where both are)."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        return hf
    merged = {**hf, **{k: v for k, v in text.items() if k not in _TOP_LEVEL_KEYS}}
    merged.pop("text_config")
    return merged


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"model: {file} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"model: {file} must hold a JSON object")
    return data


class ConfigFields:
    """The decoder sizes both `Checkpoint` (torch-free checks) and `config.ModelConfig` (the loaded
    model) read from config.json: one definition of each."""

    hf_config: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def num_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.hf_config.get("num_key_value_heads") or self.num_heads)


@dataclass(frozen=True)
class Checkpoint(ConfigFields):
    """config.json (decoder fields at the top level) + generation_config.json of one checkpoint."""

    path: str
    hf_config: dict[str, Any]
    generation: dict[str, Any] = field(default_factory=dict)
    # a GGUF file's row-parallel layers (o_proj, down_proj): the largest block (elements) any of
    # them is stored in, with that tensor and its type; tensor parallelism cuts their input columns (read_quant)
    gguf_blocks: dict[str, tuple[int, str]] = field(default_factory=dict)
    # a GGUF file whose weights are all of one float type ("F16", "BF16", "F32"; None otherwise):
    # its linear layers are float layers, kept in that type where dtype auto widens it (config.py)
    gguf_float: str | None = None

    @classmethod
    def read(cls, path: str | Path) -> Checkpoint:
        path = Path(path)
        if path.suffix == ".gguf":  # llama.cpp's file: the config comes from its metadata
            from inflight.quant.gguf import GGUFCheckpoint

            gguf = GGUFCheckpoint(path)
            return cls(str(path), gguf.hf_config(), gguf_blocks=_gguf_blocks(gguf.tensors),
                       gguf_float=gguf.float_type())  # fmt: skip
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model: no config.json in {path}")
        hf = flatten_text_config(_read_json(path / "config.json"))
        gen_file = path / "generation_config.json"
        return cls(str(path), hf, _read_json(gen_file) if gen_file.is_file() else {})

    @property
    def architecture(self) -> str:
        archs = self.hf_config.get("architectures") or ["LlamaForCausalLM"]
        return str(archs[0])

    @property
    def quantized(self) -> str | None:
        """What a quantized checkpoint is ("GGUF", the quant_method), None for full precision."""
        if self.path.endswith(".gguf"):
            return "GGUF"
        qc = self.hf_config.get("quantization_config")
        return None if qc is None else str(qc.get("quant_method") if isinstance(qc, dict) else qc)

    def max_model_len(self, requested: int | None) -> int:
        """`requested` (None: the model's own limit), never above max_position_embeddings."""
        limit = int(self.hf_config.get("max_position_embeddings") or _DEFAULT_MAX_POSITIONS)
        if requested is not None and requested > limit:
            raise ValueError(f"max_model_len: {requested} exceeds the model's max_position_embeddings {limit}")
        return limit if requested is None else requested

    def row_blocks(self) -> dict[str, tuple[int, int, str]]:
        """The row-parallel layers (o_proj, down_proj): (input features, the block their input
        columns are stored in, in elements (1: any column), what stores them) of a quantized
        checkpoint; tensor parallelism cuts their inputs on whole blocks."""
        heads, hidden = self.num_heads, int(self.hf_config["hidden_size"])
        inputs = {"o_proj": heads * int(self.hf_config.get("head_dim") or hidden // heads),
                  "down_proj": int(self.hf_config["intermediate_size"])}  # fmt: skip
        blocks = dict(self.gguf_blocks)
        qc = self.hf_config.get("quantization_config")
        if not blocks and isinstance(qc, dict) and qc.get("quant_method") in ("awq", "gptq"):
            g = int(qc.get("group_size", qc.get("q_group_size", 128)))
            # -1: one group (scale, zero) per row, which holds for any of its columns: cut on whole bytes
            blocks = {name: (2 if g == -1 else g, "quantization_config.group_size") for name in inputs}
        return {name: (k, *blocks.get(name, (1, "per channel"))) for name, k in inputs.items()}

    def check_shards(self, tp: int) -> None:
        """A quantized checkpoint's row-parallel layers split by `tp` ranks into whole groups /
        blocks, as models/parallel.py and the quantized readers cut them: o_proj's input (the
        heads) evenly, down_proj's (the intermediate rows) evenly or else in whole blocks dealt
        out unevenly (`block_shares`)."""
        if tp == 1 or self.quantized is None:
            return
        qc = self.hf_config.get("quantization_config")
        act_order = isinstance(qc, dict) and qc.get("quant_method") == "gptq" and qc.get("desc_act")
        if act_order and int(qc.get("group_size", 128)) != -1:  # groups follow g_idx (-1: one group, any order)
            raise ValueError(f"tensor_parallel_size: {tp} would split act-order (desc_act) GPTQ layers by input "
                             "columns, whose groups are not contiguous; use 1, or a checkpoint without desc_act")  # fmt: skip
        layers = self.row_blocks()

        heads, kv = self.num_heads, self.num_kv_heads

        def fits(n: int, name: str) -> bool:  # also what ParallelConfig.check_model asks of the heads
            if heads % n or (kv % n if kv >= n else n % kv):
                return False
            k, block, _ = layers[name]
            if name == "down_proj":
                return block_shares(k, block, n) is not None
            return k % n == 0 and (k // n) % block == 0

        for name, (k, block, what) in layers.items():
            if k % block:  # the loader would refuse it at any size; say so before the workers start
                raise ValueError(f"{name}: {what} {block} does not divide its {k} input features")
            if not fits(tp, name):
                ok = [1] + [n for n in range(2, k + 1) if all(fits(n, m) for m in layers)]
                cut = (f"splits {name}'s {k} input features into {k // tp} per rank, not whole blocks of {block} ({what})"
                       if name == "o_proj" else f"cannot deal {name}'s {k} input features to {tp} ranks in whole "
                       f"blocks of {block} ({what}: {k // block} blocks)")  # fmt: skip
                raise ValueError(f"tensor_parallel_size: {tp} {cut}; use one of {ok}")

    def check_quantization_config(self) -> None:
        """A `quantization_config` we cannot load, refused naming its field."""
        if "quantization_config" not in self.hf_config:
            return
        qc = self.hf_config["quantization_config"]
        if not isinstance(qc, dict):
            raise ValueError(f"quantization_config: must be a JSON object, got {qc!r}")
        from inflight.quant.quant_config import QuantConfig

        QuantConfig(qc)

    def check(self, quantization: str | None = None, load_format: str = "auto") -> None:
        """What the loader would refuse once loading began, refused before any weight is read."""
        for key in REQUIRED:
            v = self.hf_config.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model: {self.path}: config {key} must be a positive integer, got {v!r}")
        arch = self.architecture
        if arch not in ARCHITECTURES:
            raise ValueError(f"model: architecture {arch!r} is not supported; have {sorted(ARCHITECTURES)}")
        act = self.hf_config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act: {act!r} is not supported (silu only)")
        self.check_quantization_config()
        check_quantization(self.quantized, quantization, Path(self.path).name)
        if self.quantized is None and quantization is None:
            return
        if load_format == "dummy":
            raise ValueError("load_format: dummy (random float weights) does not apply to a quantized checkpoint "
                             "or --quantization; write a quantized random checkpoint instead (inflight.testing.gguf)")  # fmt: skip
        if arch not in QUANT_ARCHITECTURES:
            raise ValueError(f"model: quantized {arch} checkpoints are not supported (only {sorted(QUANT_ARCHITECTURES)})")


def check_quantization(quantized: str | None, quantization: str | None, name: str) -> None:
    """`--quantization` (quantize at load) applies to full-precision checkpoints only."""
    if quantization is None or quantized is None:
        return
    where = f"{name} is already quantized (GGUF)" if quantized == "GGUF" else f"this one is already quantized ({quantized})"
    raise ValueError(f"quantization: {quantization!r} applies to full-precision checkpoints; {where}")


def block_shares(total: int, block: int, ranks: int) -> list[int] | None:
    """Each rank's share of `total` input columns stored in blocks of `block` elements: even where
    that falls on whole blocks, else whole blocks dealt out, the first ranks one more (a
    Qwen2.5-0.5B Q4_K_M file's down_proj, 4864 = 19 super-blocks of 256, at TP=2: 2560 + 2304);
    None where a rank would get no whole block."""
    if total % ranks == 0 and (total // ranks) % block == 0:
        return [total // ranks] * ranks
    blocks = total // block
    if total % block or blocks < ranks:
        return None
    return [(blocks // ranks + (r < blocks % ranks)) * block for r in range(ranks)]


def _gguf_blocks(tensors: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Row-parallel layer -> (largest block in elements, the tensor stored in it and its GGML
    type) over every layer."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    out: dict[str, tuple[int, str]] = {}
    for name, t in tensors.items():
        layer = "o_proj" if ".attn_output." in name else "down_proj" if ".ffn_down." in name else None
        if layer is not None:
            kind = t.tensor_type.name
            elems = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][0]
            if elems > out.get(layer, (0, ""))[0]:
                out[layer] = (elems, f"tensor '{name}', {kind}")
    return out
