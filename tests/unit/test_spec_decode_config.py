"""--speculative-config: parsed and checked at start-up (one error naming the field), and the
n-gram proposer's matching rule, without a model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inflight import LLM
from inflight.cli import build_parser
from inflight.engine.args import EngineArgs
from inflight.server import options
from inflight.spec_decode.config import SpeculativeConfig
from inflight.spec_decode.ngram import TokenBuffer, propose_ngram


@pytest.mark.parametrize(
    "value,field",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
        ({"num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 33}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "lookahead"),
        ({"method": "ngram", "num_speculative_tokens": 2, "adaptive_k": 1}, "adaptive_k"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "model"),
        ({"method": "eagle3", "num_speculative_tokens": 2, "model": "x", "prompt_lookup_max": 2}, "prompt_lookup_max"),
    ],
)
def test_bad_config_names_the_field(value: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^speculative_config\.{field}: "):
        SpeculativeConfig.parse(value)
    with pytest.raises(ValueError, match=rf"speculative_config\.{field}"):
        LLM("no/such/model", speculative_config=value)  # refused before anything loads


def test_defaults_and_spellings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert SpeculativeConfig.parse(None) is None and SpeculativeConfig.parse("") is None
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert c == SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=4)
    one = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 6})
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (6, 6)  # vLLM: one bound sets the other
    with pytest.raises(ValueError, match="speculative_config: not valid JSON"):
        SpeculativeConfig.parse("{method: ngram}")
    text = '{"method": "ngram", "num_speculative_tokens": 5}'
    ns = build_parser().parse_args(["serve", "--speculative-config", text])
    assert options.load(ns).engine.speculative_config == text
    cfg = tmp_path / "c.json"  # in the config file it is a JSON object, not flattened into sections
    cfg.write_text(json.dumps({"BackendConfig": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}}))
    loaded = options.load(build_parser().parse_args(["serve", "--config", str(cfg)])).engine
    assert SpeculativeConfig.parse(loaded.speculative_config).num_speculative_tokens == 2
    cfg.write_text(json.dumps({"speculative_config": {"method": "ngram", "num_speculative_tokens": 99}}))
    with pytest.raises(options.ConfigError, match="speculative_config.num_speculative_tokens"):
        options.load(build_parser().parse_args(["serve", "--config", str(cfg)]))
    assert EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 1}).speculative_config


def test_ngram_longest_latest_match_and_loops() -> None:
    ids = np.array([1, 2, 3, 4, 5, 9, 7, 3, 4, 6, 1, 2, 3, 4])
    # tail (1 2 3 4) matched at 0..3 (length 4) beats (3 4) at 7..8: what followed it was 5 9 7
    assert propose_ngram(ids, 3, 1, 4) == [5, 9, 7]
    assert propose_ngram(ids, 3, 1, 2) == [6, 1, 2]  # windows <= 2: the latest (3 4) wins
    assert propose_ngram(ids, 3, 5, 6) == []  # no earlier match of 5 tokens
    assert propose_ngram(np.array([8, 7, 7, 7]), 4, 1, 4) == [7, 7, 7, 7]  # a loop of period 1 goes on
    assert propose_ngram(np.array([5, 1, 2, 1, 2]), 5, 1, 4) == [1, 2, 1, 2, 1]
    assert propose_ngram(np.array([1, 2, 3]), 2, 1, 4) == []


def test_token_buffer_grows_by_the_appended_tokens() -> None:
    buf = TokenBuffer()
    tokens = list(range(300))
    assert buf.sync(tokens).tolist() == tokens
    tokens += [7] * 500
    assert buf.sync(tokens).tolist() == tokens
    assert buf.sync([4, 5]).tolist() == [4, 5]  # shorter: another sequence, rebuilt


def test_tokenizers_compare_by_id_and_ignore_llama_cpp_padding() -> None:
    """A draft's tokenizer against the target's (a GGUF's token list, a tokenizer.json's vocab +
    added tokens): the same text at every id; ids only one side has must be `[PAD<id>]`."""
    from inflight.spec_decode.config import _same_tokens

    hf = {0: "a", 1: "b", 2: "<|end|>"}
    assert _same_tokens(hf, {0: "a", 1: "b", 2: "<|end|>", 3: "[PAD3]", 4: "[PAD4]"})
    assert _same_tokens(None, hf) and _same_tokens(hf, None)  # no tokenizer: token-id prompts only
    assert not _same_tokens(hf, {0: "b", 1: "a", 2: "<|end|>"})  # two ids exchanged
    assert not _same_tokens(hf, {0: "a", 1: "b", 2: "<|end|>", 3: "c"})  # a real token more
