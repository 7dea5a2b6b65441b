"""Speculative decoding: the engine proposes draft tokens itself (`--speculative-config`).

`config.py` parses and checks the option; `ngram.py` is prompt lookup; `proposer.py` is the
engine's hook (before each schedule: drafts for the requests that run this step). Verification
is the engine's existing draft path (core/scheduler.py, sample/sampler.py): greedy keeps the
agreeing prefix + the model's next token, sampled requests the target distribution exactly.
"""

from inflight.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
