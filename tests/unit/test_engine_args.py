"""EngineArgs is the one source of engine options: every field is a flag of `inflight serve`,
`generate` and `bench` with the same default, an `LLM` keyword, a config-file key, and lands in
the EngineConfig where its metadata says."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import torch

from inflight import LLM
from inflight.cli import build_parser
from inflight.config import default_step_tokens
from inflight.engine.args import DEMO_MODEL, EngineArgs
from inflight.server import options

FIELDS = [f for f in fields(EngineArgs)]
HINTS = get_type_hints(EngineArgs)
# the positional / required arguments each subcommand needs besides the engine flags
BASE = {"serve": [], "generate": ["a prompt"], "bench": ["--offline"]}


def _sub(name: str) -> argparse.ArgumentParser:
    actions = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return actions[name]


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    return _sub(command).parse_args([*BASE[command], *argv])


def _engine(command: str, argv: list[str]) -> EngineArgs:
    ns = _parse(command, argv)
    return options.load(ns).engine if command == "serve" else EngineArgs.from_cli_args(ns)


def _other_value(f: Any) -> tuple[list[str], Any]:
    """(flags, value) that set field f to something other than its default."""
    flag = "--" + f.name.replace("_", "-")
    kind = HINTS[f.name]
    special = {"model": "/some/ckpt", "tokenizer": "/some/tok", "dtype": "bfloat16", "device": "cpu", "master_addr": "10.0.0.1",
               "speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'}  # fmt: skip
    if f.name in special:
        v = special[f.name]
        return ([] if v is None else [flag, str(v)]), (f.default if v is None else v)
    if kind is bool:
        return [flag if not f.default else "--no-" + flag[2:]], not f.default
    if f.metadata["choices"]:
        v = next(c for c in f.metadata["choices"] if c != f.default)
        return [flag, v], v
    return [flag, "48"], 48  # every int option accepts 48 (a power of two is not needed: no check here)


@pytest.mark.parametrize("command", ["serve", "generate", "bench"])
def test_every_field_is_a_flag_with_the_same_default(command: str) -> None:
    parser = _sub(command)
    for f in FIELDS:
        action = parser._option_string_actions.get("--" + f.name.replace("_", "-"))
        assert action is not None, f"{command} has no flag for {f.name}"
        assert action.dest == f.name and f.metadata["help"] in (action.help or "")
    assert _engine(command, []) == EngineArgs()  # nothing given: the dataclass defaults


@pytest.mark.parametrize("command", ["serve", "generate", "bench"])
def test_every_flag_sets_its_field(command: str) -> None:
    for f in FIELDS:
        argv, value = _other_value(f)
        assert getattr(_engine(command, argv), f.name) == value, (command, f.name)


@pytest.mark.parametrize("command", ["serve", "generate", "bench"])
def test_older_flag_spellings(command: str) -> None:
    args = _engine(command, ["--max-seq-len", "256", "--no-prefix-caching", "--max-input-token-len", "100"])
    assert (args.max_model_len, args.enable_prefix_caching, args.max_input_tokens) == (256, False, 100)
    with pytest.raises(SystemExit):  # argparse refuses a value outside the choices
        _parse(command, ["--attention-backend", "flash"])


def test_llm_keywords_are_the_fields() -> None:
    for f in FIELDS:
        if f.name != "model":
            _, value = _other_value(f)
            assert getattr(EngineArgs.from_kwargs("m", **{f.name: value}), f.name) == value
    with pytest.raises(TypeError, match=r"unknown engine argument 'max_num_seq' \(did you mean 'max_num_seqs'\?\)"):
        LLM("no/such/model", max_num_seq=4)  # refused before anything loads
    with pytest.raises(TypeError, match="'frobnicate'"):
        LLM("no/such/model", frobnicate=True)


def test_generate_uses_the_engine_step_budget(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """`inflight generate` used to default to 2048 batched tokens; now every entry point agrees."""
    path = str(tiny_model_dir("qwen2"))
    argv = ["--model", path, "--device", "cpu"]
    configs = [_engine(c, argv).create_engine_config() for c in ("serve", "generate", "bench")]
    configs.append(EngineArgs.from_kwargs(path, device="cpu").create_engine_config())  # what LLM(...) builds
    assert all(c == configs[0] for c in configs)
    assert configs[0].scheduler.max_num_batched_tokens == default_step_tokens(torch.device("cpu")) == 512


def test_batch_runs_take_a_larger_step_on_a_gpu(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """LLM / generate / bench offline: 8,192 tokens a step on a GPU unless given; the server 2,048;
    a CPU 512 everywhere (the H100 ran 256 x (512 -> 256) 16 % faster at 8,192)."""
    path = str(tiny_model_dir("qwen2"))
    cuda = torch.device("cuda")
    assert EngineArgs.from_kwargs(path, device="cuda").for_offline().max_num_batched_tokens == 8192
    assert default_step_tokens(cuda, offline=True) == 8192 and default_step_tokens(cuda) == 2048
    given = EngineArgs.from_kwargs(path, device="cuda", max_num_batched_tokens=100)
    assert given.for_offline().max_num_batched_tokens == 100
    cpu = EngineArgs.from_kwargs(path, device="cpu").for_offline()
    assert cpu.create_engine_config().scheduler.max_num_batched_tokens == 512


def test_each_field_lands_in_the_engine_config(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    path = str(tiny_model_dir("qwen2"))
    values = {"dtype": "bfloat16", "device": "cpu", "max_model_len": 64, "max_num_seqs": 3,
              "max_num_batched_tokens": 100, "block_size": 32, "kv_cache_memory_bytes": 1 << 20,
              "num_kv_blocks": 8, "enable_prefix_caching": False, "max_input_tokens": 10,
              "max_iter_times": 5, "cpu_fast_path": False, "attention_backend": "torch",
              "enforce_eager": True, "load_format": "dummy", "tensor_parallel_size": 2, "nnodes": 2,
              "node_rank": 1, "master_port": 29555, "collective_timeout_s": 30.0, "data_parallel_size": 1,
              "enable_lora": False, "quantization": None, "num_scheduler_steps": 1}  # fmt: skip (LoRA and multi-step are refused under TP, int8 with dummy weights)
    for f in FIELDS:  # a field added later gets a generic non-default value (or add one above)
        if f.metadata["to"] is not None and f.name not in values:
            values[f.name] = _other_value(f)[1]
    config = EngineArgs(model=path, **values).create_engine_config()
    sections = {"model": config.model, "cache": config.cache, "scheduler": config.scheduler, "engine": config,
                "parallel": config.parallel}  # fmt: skip
    for f in FIELDS:
        if f.metadata["to"] is None:
            continue
        section, _, name = f.metadata["to"].partition(".")
        got = getattr(sections[section], name or f.name)
        want = values[f.name]
        assert (str(got).removeprefix("torch.") if f.name in ("dtype", "device") else got) == want, f.name
    assert config.model.path == path
    assert EngineArgs(model=path, quantization="int8").create_engine_config().model.quantization == "int8"
    assert EngineArgs().model_path == DEMO_MODEL


def test_invalid_values_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="attention_backend"):
        EngineArgs(attention_backend="flash")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineArgs(tensor_parallel_size=0)


def test_config_file_engine_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"BackendConfig": {"maxSeqLen": 300, "maxInputTokenLen": 200, "maxBatchSize": 8,
                                                 "maxPrefillTokens": 1024, "cacheBlockSize": 32, "tpSize": 1},
                               "no_prefix_caching": True, "enforce_eager": True, "modelWeightPath": "/m"}))  # fmt: skip
    o = options.load(_parse("serve", ["--config", str(cfg), "--max-num-seqs", "4"]))
    e = o.engine
    assert (e.max_model_len, e.max_input_tokens, e.max_num_seqs, e.max_num_batched_tokens) == (300, 200, 4, 1024)
    assert (e.block_size, e.enable_prefix_caching, e.enforce_eager, e.model) == (32, False, True, "/m")
    for key in EngineArgs.config_keys():  # every engine key is accepted by the file reader
        name, inverted = EngineArgs.config_keys()[key]
        f = next(f for f in FIELDS if f.name == name)
        cfg.write_text(json.dumps({key: (not f.default) if inverted else f.default}))
        assert options.load(_parse("serve", ["--config", str(cfg)])).engine == EngineArgs()
    cfg.write_text(json.dumps({"tpSize": 2}))
    assert options.load(_parse("serve", ["--config", str(cfg)])).engine.tensor_parallel_size == 2
    cfg.write_text(json.dumps({"tpSize": 0}))
    with pytest.raises(SystemExit, match="tensor_parallel_size"):
        options.load(_parse("serve", ["--config", str(cfg)]))
