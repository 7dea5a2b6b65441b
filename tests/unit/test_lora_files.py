"""A PEFT adapter directory is untrusted input: every malformed, over-rank, non-finite or
not-plain-LoRA adapter is a ParamError naming what is wrong (the server's 400), and an
over-rank adapter is refused from its header, before its tensors are read."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from inflight.errors import ParamError
from inflight.lora.adapter import LoRAShapes, load_peft
from inflight.testing import make_lora_adapter

HF = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2}  # fmt: skip
SHAPES = LoRAShapes.from_hf(HF)


def _adapter(tmp_path: Path, name: str = "a", **kw: Any) -> Path:
    return make_lora_adapter(tmp_path / name, HF, rank=kw.pop("rank", 4), targets=kw.pop("targets", ("q_proj", "down_proj")),
                             dtype=torch.float32, **kw)  # fmt: skip


def _config(path: Path, **changes: Any) -> Path:
    cfg = json.loads((path / "adapter_config.json").read_text()) | changes
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return path


def _load(path: Path, max_rank: int = 64) -> Any:
    return load_peft(path, SHAPES, max_rank, torch.float32, "x")


def _refused(path: Path, *words: str, max_rank: int = 64) -> str:
    with pytest.raises(ParamError) as e:
        _load(path, max_rank)
    assert e.value.param == "lora_path"
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


def test_plain_adapter_loads(tmp_path: Path) -> None:
    a = _load(_adapter(tmp_path))
    assert a.rank == 4 and len(a.weights) == 4


def test_malformed_files(tmp_path: Path) -> None:
    """The six adapters that gave 500, and their neighbours."""
    p = _adapter(tmp_path, "trunc")
    data = (p / "adapter_model.safetensors").read_bytes()
    (p / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])  # data cut short
    _refused(p, "safetensors")
    p = _adapter(tmp_path, "garbage")
    (p / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # header past the file
    _refused(p, "header length")
    p = _adapter(tmp_path, "notjson")
    (p / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{[")
    _refused(p, "safetensors")
    _refused(_config(_adapter(tmp_path, "rank0", rank=0), r=4), "has rank 0")  # rank-0 tensors
    _refused(_adapter(tmp_path, "rank0cfg", rank=0), "r must be a positive integer")
    _refused(_config(_adapter(tmp_path, "alpha"), lora_alpha="sixteen"), "lora_alpha")
    p = _adapter(tmp_path, "list")
    (p / "adapter_config.json").write_text("[1, 2]")
    _refused(p, "JSON object")
    _refused(_config(_adapter(tmp_path, "pattern"), alpha_pattern=["q_proj", 2]), "alpha_pattern")
    _refused(_config(_adapter(tmp_path, "regex"), rank_pattern={"q_proj(": 4}), "rank_pattern")
    p = _adapter(tmp_path, "utf8")
    (p / "adapter_config.json").write_bytes(b"\xff\xfe\x00")
    _refused(p, "JSON")


def test_non_finite_weights_and_scales(tmp_path: Path) -> None:
    _refused(_config(_adapter(tmp_path, "huge"), lora_alpha=1e308), "finite")
    p = _adapter(tmp_path, "nan")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(p / "adapter_model.safetensors"))
    key = next(k for k in tensors if "lora_B" in k)
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(p / "adapter_model.safetensors"))
    _refused(p, "finite")
    tensors[key][0, 0] = float("inf")
    save_file(tensors, str(p / "adapter_model.safetensors"))
    _refused(p, "finite")
    with pytest.raises(ParamError, match="lora_alpha"):  # JSON's NaN literal, as Python's json writes it
        _load(_config(_adapter(tmp_path, "nanalpha"), lora_alpha=float("nan")))


def test_rank_is_checked_from_config_and_header_before_reading(tmp_path: Path) -> None:
    _refused(_config(_adapter(tmp_path, "cfg"), r=1024), "r is 1024", "max_lora_rank")
    _refused(_config(_adapter(tmp_path, "pat"), rank_pattern={"q_proj": 128}), "rank_pattern")
    _refused(_config(_adapter(tmp_path, "mismatch"), r=8), "rank 4", "says 8")
    big = _adapter(tmp_path, "big", rank=128, targets=("gate_proj", "up_proj", "down_proj"))
    _config(big, r=16)  # the config lies; the header tells
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("needs /proc/self/io to count the bytes read")
    before = int(io.read_text().split("rchar:")[1].split()[0])
    _refused(big, "rank 128", "max_lora_rank", max_rank=64)
    read = int(io.read_text().split("rchar:")[1].split()[0]) - before
    size = (big / "adapter_model.safetensors").stat().st_size
    assert read < size / 4, (read, size)  # the header and the config, not the tensors


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"use_dora": True}, "use_dora"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"init_lora_weights": "pissa_niter_4"}, "init_lora_weights"),
        ({"init_lora_weights": "olora"}, "init_lora_weights"),
        ({"init_lora_weights": "corda"}, "init_lora_weights"),
        ({"init_lora_weights": "loftq"}, "init_lora_weights"),
        ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens"),
        ({"layer_replication": [[0, 2]]}, "layer_replication"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"lora_bias": True}, "lora_bias"),
        ({"bias": "all"}, "bias"),
        ({"use_rslora": "yes"}, "use_rslora"),
        ({"some_future_variant": {"k": 1}}, "some_future_variant"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_variants_that_change_the_math_are_refused(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    _refused(_config(_adapter(tmp_path), **changes), field)


def test_variants_that_keep_the_math_load(tmp_path: Path) -> None:
    """Initialisations that leave the base weights alone, and rsLoRA's scale alpha / sqrt(r)."""
    for init in (True, False, "gaussian", "eva", "orthogonal"):
        _load(_config(_adapter(tmp_path, f"init{init}"), init_lora_weights=init, use_dora=False, modules_to_save=None))
    plain = _load(_config(_adapter(tmp_path, "plain"), lora_alpha=8))
    rs = _load(_config(_adapter(tmp_path, "rs"), lora_alpha=8, use_rslora=True))
    key = next(k for k in plain.weights if k[1] == "q_proj")
    # rank 4: alpha / r = 2, alpha / sqrt(r) = 4
    torch.testing.assert_close(rs.weights[key][1], plain.weights[key][1] * 2)
    pat = _load(_config(_adapter(tmp_path, "pat"), lora_alpha=8, alpha_pattern={"down_proj": 16}))
    down = next(k for k in plain.weights if k[1] == "down_proj")
    torch.testing.assert_close(pat.weights[down][1], plain.weights[down][1] * 2)
    torch.testing.assert_close(pat.weights[key][1], plain.weights[key][1])
