"""The /openapi.json component schemas: every request and response body the routes read and
send, with the ranges of SPEC.md §4 (openapi.py installs them with this server's limits)."""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _int(lo: int | None = None, hi: int | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def _num(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "number"}
    if lo is not None:
        s["exclusiveMinimum" if lo_open else "minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NULL_STR = {"type": "string", "nullable": True}
_TOKEN_ID = {"type": "integer", "minimum": 0, "x-token-id": True}  # install() bounds it by the vocabulary
_TOKENS = {"type": "array", "items": _TOKEN_ID, "minItems": 1}
_MINILM_VOCAB = 30522  # all-MiniLM-L6-v2's (BERT uncased) token ids
_STOP = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 16}]}

# Sampling and scheduling fields shared by completions and chat (SPEC.md §1, §4). Kept to
# what a request can always satisfy alone: cross-field rules (best_of >= n, n > 1 needs
# temperature > 0, prompt + max_tokens <= max_model_len) are checked by the server (400).
_SAMPLING: dict[str, Any] = {
    "model": {**_STR, "nullable": True, "description": "a served model name or LoRA adapter; default (absent or null): the first served name"},
    "max_tokens": {**_int(1), "nullable": True, "description": "capped at the room left in the context (and --max-iter-times), never refused for size"},
    "temperature": {**_num(0), "description": "0: greedy; above 2 allowed (MindIE, vLLM), not recommended"},
    "top_p": _num(0, 1, lo_open=True),
    "top_k": _int(-1, 2**31 - 1),
    "min_p": _num(0, 1),
    "typical_p": _num(0, 1, lo_open=True),
    "repetition_penalty": _num(0, 2, lo_open=True),
    "presence_penalty": _num(-2, 2),
    "frequency_penalty": _num(-2, 2),
    "seed": {**_int(-(2**63), 2**64 - 1), "description": "a negative seed is used modulo 2^64 (vLLM)"},
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "items": _int(0), "description": "ids beyond the vocabulary never occur (ignored, as MindIE)"},
    "ignore_eos": _BOOL,
    "min_tokens": {**_int(0, 64), "description": "at most max_tokens"},
    "skip_special_tokens": _BOOL,
    "include_stop_str_in_output": _BOOL,
    "priority": {**_int(1, 5), "description": "1 (highest) ... 5 (lowest, default)"},
    "timeout": {**_num(0, 3600, lo_open=True), "description": "seconds; the request ends with finish_detail timeout"},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL, "continuous_usage_stats": _BOOL}},
    "user": _STR,
}

# /v2 generate (server/generate/protocol.py): MindIE's `parameters`, and Triton / TensorRT-LLM's
# input names (TRITON_INPUTS there) as a flat body; cross-field rules (min_length <= max_tokens,
# input_lengths == len(input_ids), table / bias sizes, beams with a watermark) are the server's 400s
_NUMS = {"type": "array", "items": {"type": "number"}}
_WORDS = {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_STR, _TOKENS]}}],
          "description": 'a string or strings (matched on the text) and token-id arrays; "" or [""] means none'}  # fmt: skip
_EARLY_STOPPING = {"oneOf": [_BOOL, {"type": "string", "enum": ["never"]}, {"type": "integer", "enum": [0, 1]}]}
_MINDIE_PARAMS: dict[str, Any] = {
    "max_new_tokens": {**_int(1, 4096), "description": "default 20"}, "temperature": _num(0, 2),
    "top_k": _int(-1, 2**31 - 1), "top_p": _num(0, 1, lo_open=True), "typical_p": _num(0, 1, lo_open=True),
    "min_p": _num(0, 1), "repetition_penalty": _num(0, 2, lo_open=True), "seed": _int(0, 2**63 - 1),
    "do_sample": _BOOL, "details": _BOOL, "watermark": _BOOL, "priority": _int(1, 5), "timeout": _num(0, 3600, lo_open=True),
    "perf_stat": {**_BOOL, "description": "true: the final response / event adds perf_stat (per-token arrays)"},
    "batch_size": {**_int(1, 2**31 - 1), "description": "while this request runs, every engine step runs at most this many "
                   "sequences (1: alone); at least beam_width; absent: no cap"},
    "stop_words": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                   "description": 'a word or words; "" means none'}, "ignore_eos": _BOOL,
    "include_stop_str_in_output": _BOOL, "skip_special_tokens": _BOOL, "no_repeat_ngram_size": _int(0, 2**31 - 1),
    "min_length": {**_int(0, 1), "description": "at most max_new_tokens (the schema's bound holds for any max_new_tokens)"},
}  # fmt: skip
_TRITON_INPUTS: dict[str, Any] = {
    "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,256}$"},
    "text_input": {"type": "string", "minLength": 1},
    "input_ids": {**_TOKENS, "maxItems": 64, "description": "the prompt as token ids (instead of text_input)"},
    **{k: {**_int(1, 4096), "description": "most new tokens, default 20"} for k in ("max_tokens", "request_output_len")},
    **{k: _int(-1, 2**31 - 1) for k in ("top_k", "runtime_top_k")},
    "top_p": _num(0, 1, lo_open=True), "runtime_top_p": {**_num(0, 1), "description": "0: no nucleus filter"},
    **{k: _int(0, 2**63 - 1) for k in ("seed", "random_seed")},
    **{k: _num(-10, 10) for k in ("length_penalty", "len_penalty")},
    **{k: {**_int(0, 1), "description": "at most max_tokens (the schema's bound holds for any max_tokens)"}
       for k in ("min_length", "min_tokens")},
    **{k: _BOOL for k in ("stream", "streaming", "do_sample", "ignore_eos", "return_log_probs", "return_context_logits",
                          "return_generation_logits", "details", "include_stop_str_in_output", "skip_special_tokens")},
    "temperature": _num(0, 2), "typical_p": _num(0, 1, lo_open=True), "min_p": _num(0, 1),
    "repetition_penalty": _num(0, 2, lo_open=True), "presence_penalty": _num(-2, 2), "frequency_penalty": _num(-2, 2),
    "no_repeat_ngram_size": _int(0, 2**31 - 1), "end_id": _TOKEN_ID, "pad_id": _TOKEN_ID,
    "beam_width": {**_int(1, 4), "description": "beam search; every beam is returned"}, "early_stopping": _EARLY_STOPPING,
    "stop_words": _WORDS, "bad_words": _WORDS,
    "priority": _int(1, 5), "timeout": _num(0, 3600, lo_open=True), "watermark": _BOOL, "perf_stat": _BOOL,
    "batch_size": _MINDIE_PARAMS["batch_size"],
}  # fmt: skip
# two names of one engine field (generate/protocol.py: ALIASES): a body gives at most one of them
_TRITON_ALIASES = [("max_tokens", "request_output_len"), ("top_k", "runtime_top_k"), ("top_p", "runtime_top_p"),
                   ("seed", "random_seed"), ("length_penalty", "len_penalty"), ("stream", "streaming"),
                   ("min_length", "min_tokens")]  # fmt: skip


def _one_name_per_field() -> dict[str, Any]:
    """Bodies giving one field twice (two names, or at the top level and in parameters): the server
    400s them unless the values agree (generate/protocol.py: _merge)."""
    clashes: list[dict[str, Any]] = [{"required": list(pair)} for pair in _TRITON_ALIASES]
    groups = [{*pair} | ({"max_new_tokens"} if "max_tokens" in pair else set()) for pair in _TRITON_ALIASES]
    for name in _MINDIE_PARAMS:
        top = next((g for g in groups if name in g), {name}) & set(_TRITON_INPUTS)
        clashes += [{"required": [t, "parameters"], "properties": {"parameters": {"required": [name]}}} for t in sorted(top)]
    # a field that needs another (dependentRequired, written as `not` so generators read it)
    beams = {"beam_width": {"minimum": 2}}
    clashes += [{"required": ["beam_width", name], "properties": beams} for name in _NOT_WITH_BEAMS if name in _TRITON_INPUTS]
    clashes.append({"required": ["beam_width", "parameters"], "properties": {**beams, "parameters": {
        "anyOf": [{"required": [name]} for name in _NOT_WITH_BEAMS if name in _MINDIE_PARAMS]}}})
    return {"anyOf": clashes}


# what beam search refuses (SamplingParams._validate_beam), and batch_size, which must reach the width
_NOT_WITH_BEAMS = ["watermark", "batch_size"]  # every other control applies per beam (engine/beam.py)
# fields whose valid values depend on the served model or the server's options: accepted, described
# in docs/API.md, left out of the schema so that what it generates is always accepted
_MODEL_SHAPED = ("input_lengths (the number of input_ids), stop_words_list / bad_words_list (TensorRT-LLM's [2, N] "
                 "layout: token ids, then end offsets padded with -1), embedding_bias ([vocab] biases), embedding_bias_words + "
                 "embedding_bias_weights (one weight per word), prompt_embedding_table + prompt_vocab_size (p-tuning, [rows][hidden], "
                 "with input_ids), draft_input_ids + draft_logits (fewer drafts than max_tokens; [drafts][vocab]), "
                 "lora_task_id, lora_weights, lora_config (with --enable-lora)")  # fmt: skip
_BEAMS = "; with beam_width > 1 one entry per beam"
_TRITON_OUTPUTS: dict[str, Any] = {
    "output_ids": {"anyOf": [{"type": "array", "items": _int(0)}, {"type": "array", "items": {"type": "array", "items": _int(0)}}],
                   "description": "generated token ids (streamed: the new ones)" + _BEAMS},
    "sequence_length": {"anyOf": [_int(0), {"type": "array", "items": _int(0)}], "description": "their count" + _BEAMS},
    "cum_log_probs": {"anyOf": [{"type": "number"}, _NUMS], "description": "return_log_probs" + _BEAMS},
    "output_log_probs": {"anyOf": [_NUMS, {"type": "array", "items": _NUMS}], "description": "return_log_probs" + _BEAMS},
    "context_logits": {"type": "array", "items": _NUMS, "description": "return_context_logits: [prompt_len][vocab]"},
    "generation_logits": {"anyOf": [{"type": "array", "items": _NUMS}, {"type": "array", "items": {"type": "array", "items": _NUMS}}],
                          "description": "return_generation_logits: [new_tokens][vocab]" + _BEAMS},
}  # fmt: skip

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _int(0), "completion_tokens": _int(0), "total_tokens": _int(0)}}  # fmt: skip
_FINISH = {"type": "string", "nullable": True, "enum": ["stop", "length", "tool_calls", "error", None],
           "description": "OpenAI's values; a request ended early reports length, with finish_detail"}  # fmt: skip
_FINISH_DETAIL = {"type": "string", "enum": ["timeout", "abort"], "description": "why a choice reporting length ended early"}
_TOOL_CALL = {"type": "object", "properties": {"id": _STR, "type": _STR, "index": _int(0),
              "function": {"type": "object", "properties": {"name": _STR, "arguments": _STR}}}}  # fmt: skip
# an assistant message's tool_calls, as the chat template gets them: each names its function
_TOOL_CALL_IN = {"type": "object", "required": ["function"], "properties": {"id": _STR, "type": _STR, "function": {
    "type": "object", "required": ["name"], "properties": {"name": _STR, "arguments": {"oneOf": [
        {"type": "object"}, {"type": "string", "enum": ["{}"], "description": "or any JSON text of an object (400 if not JSON)"}]}}}}}  # fmt: skip


def _message(roles: list[str] | None, required: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    text_part = {"type": "object", "required": ["type", "text"], "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _STR}}
    return {
        "type": "object", "required": ["role", *required],
        "properties": {
            "role": {"type": "string", "enum": roles} if roles else {
                "type": "string", "minLength": 1, "not": {"enum": ["tool"]}, "examples": ["system", "user", "assistant", "developer"]},
            "content": {"oneOf": [_STR, {"type": "array", "items": text_part}]},
            "name": _STR, "tool_call_id": _STR, "tool_calls": {"type": "array", "items": _TOOL_CALL_IN},
        },
    }  # fmt: skip


# Cross-field rules the server checks (400 naming the field), stated so that a valid request is one
# the server accepts and the other way round. "Absent" includes null (the server reads null as absent).
_NEEDS_LOGPROBS = {"anyOf": [{"properties": {"top_logprobs": {"type": "null"}}},
                             {"required": ["logprobs"], "properties": {"logprobs": {"enum": [True]}}}]}  # fmt: skip
_PROMPT_IDS = {**_TOKENS, "x-prompt-ids": True}  # install() bounds its length by the model's input limit


def _min_tokens_fit(*names: str, default: int | None = None) -> dict[str, Any]:
    """min_tokens (<= 64) <= max_tokens (the first of `names` given; `default` when none is). JSON
    Schema can't compare two fields: the document allows min_tokens 0-1, or max_tokens absent
    or >= 64 (a few cases: a schema with many alternatives is more than schemathesis generates)."""
    big = {"properties": {n: {"anyOf": [{"type": "null"}, {"minimum": 64}]} for n in names}}
    if default is not None:  # absent means `default`, which holds only min_tokens up to it
        big = {"anyOf": [{"required": [names[0]], **big}, {"properties": {names[0]: {"type": "null"}, "min_tokens": {"maximum": default}}}]}
    return {"anyOf": [{"properties": {"min_tokens": {"anyOf": [{"type": "null"}, {"maximum": 1}]}}}, big]}


_SEQS = {"type": "integer", "minimum": 1, "x-max-seqs": True}  # install(): at most --max-num-seqs (they run side by side)


def _is(name: str, *values: Any) -> dict[str, Any]:
    """`name` is absent, null or one of `values` (the server reads null as absent)."""
    return {"properties": {name: {"anyOf": [{"type": "null"}, *([{"enum": list(values)}] if values else [])]}}}


_ONE_SEQUENCE = {"allOf": [_is("n", 1), _is("best_of", 1)]}
_BEAM = {"required": ["use_beam_search"], "properties": {"use_beam_search": {"enum": [True]}}}
# n or best_of > 1 samples, so it needs temperature > 0 (absent: 1), unless it is a beam search
_N_NEEDS_SAMPLING = {"anyOf": [_ONE_SEQUENCE, {"properties": {"temperature": {"anyOf": [{"type": "null"}, {"exclusiveMinimum": 0}]}}}, _BEAM]}
# best_of >= n, and == n when streaming unless a beam search (cases that always hold, as in _min_tokens_fit)
_CHAT_N_NEEDS_SAMPLING = {"anyOf": [_is("n", 1), {"properties": {"temperature": {"anyOf": [{"type": "null"}, {"exclusiveMinimum": 0}]}}}]}
_BEST_OF_FITS = {"anyOf": [_is("best_of"), _is("n", 1), {"properties": {"best_of": {"x-seqs-max": True}}}]}
_STREAM_BEST_OF = {"anyOf": [_is("stream", False), _is("best_of"), _ONE_SEQUENCE, _BEAM]}

# tool_choice other than "none" needs tools; a server that parses no tool calls (no --tool-call-parser,
# none detected in the chat template) takes tools only with tool_choice "none"
_CHOICE_NEEDS_TOOLS = {"anyOf": [_is("tool_choice", "none"), {"required": ["tools"], "properties": {"tools": {"minItems": 1}}}]}
_NO_TOOL_CALLS = {"anyOf": [{"required": ["tool_choice"], "properties": {"tool_choice": {"enum": ["none"]}}},
                            {"properties": {"tools": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}, "tool_choice": {"type": "null"}}}]}  # fmt: skip
_NEEDS_STREAM = {"anyOf": [{"properties": {"stream_options": {"anyOf": [{"type": "null"}, {"type": "object", "maxProperties": 0}]}}},
                           {"required": ["stream"], "properties": {"stream": {"enum": [True]}}}]}  # fmt: skip

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": _STR, "type": _STR, "param": _NULL_STR,
            "code": {"oneOf": [{"type": "string"}, {"type": "integer"}], "nullable": True}}}},
    },
    "CompletionRequest": {
        "type": "object", "required": ["prompt"], "allOf": [_min_tokens_fit("max_tokens", default=16), _NEEDS_STREAM, _N_NEEDS_SAMPLING, _BEST_OF_FITS, _STREAM_BEST_OF],
        "properties": {
            **_SAMPLING,
            "prompt": {"description": "a batch is limited by --max-queue (429 beyond), each prompt by the model's input limit (400)", "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                _PROMPT_IDS,
                {"type": "array", "items": _PROMPT_IDS, "minItems": 1},
            ]},
            "n": _SEQS, "best_of": {**_SEQS, "description": "at least n"}, "use_beam_search": _BOOL, "echo": _BOOL,
            "logprobs": {**_int(0, 5), "nullable": True, "description": "-1 (every token) with --max-logprobs -1"},
        },
    },
    "CompletionResponse": {
        "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": _STR, "object": {"type": "string", "enum": ["text_completion"]}, "created": _int(0), "model": _STR, "usage": _USAGE,
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "text", "finish_reason"], "properties": {
                "index": _int(0), "text": _STR, "finish_reason": _FINISH, "finish_detail": _FINISH_DETAIL,
                "logprobs": {"type": "object", "nullable": True}}}},
        },
    },
    # a tool message needs the id of the call it answers (server/openai/protocol.chat_messages)
    # other roles go to the chat template (vLLM does); a template that can't render them is a 400
    "ChatMessage": {"oneOf": [_message(None), _message(["tool"], ["tool_call_id"])]},
    "ChatCompletionRequest": {
        "type": "object", "required": ["messages"], "allOf": [_NEEDS_LOGPROBS, _NEEDS_STREAM, _CHAT_N_NEEDS_SAMPLING, _min_tokens_fit("max_completion_tokens", "max_tokens"), {"x-tool-rule": True}],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1, "description": "at most 4 MiB of text in all"},
            "n": _SEQS, "max_completion_tokens": {**_int(1), "nullable": True, "description": "as max_tokens, which it overrides"},
            "logprobs": _BOOL, "top_logprobs": {**_int(0, 20), "description": "needs logprobs: true; -1 (every token) with --max-logprobs -1"},
            "tools": {"type": "array", "maxItems": 32, "description": "function names unique", "items": {
                "type": "object", "required": ["type", "function"], "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {"type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": _STR, "strict": _BOOL,
                        "parameters": {"type": "object", "description": "a JSON schema (keywords the grammar can't enforce: 400 when strict)"}}}}}},
            "tool_choice": {"description": "a named function must be one of tools", "oneOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                {"type": "object", "required": ["type", "function"], "properties": {"type": {"type": "string", "enum": ["function"]},
                 "function": {"type": "object", "required": ["name"], "properties": {"name": _STR}}}}]},
            "response_format": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}}},
        },
    },
    "ChatCompletionResponse": {
        "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": _STR, "object": {"type": "string", "enum": ["chat.completion"]}, "created": _int(0), "model": _STR, "usage": _USAGE,
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
                "index": _int(0), "finish_reason": _FINISH, "finish_detail": _FINISH_DETAIL,
                "logprobs": {"type": "object", "nullable": True},
                "message": {"type": "object", "required": ["role", "content", "refusal"], "properties": {
                    "role": {"type": "string", "enum": ["assistant"]}, "content": _NULL_STR, "refusal": _NULL_STR,
                    "tool_calls": {"type": "array", "items": _TOOL_CALL}}}}}},
        },
    },
    "EmbeddingRequest": {
        "type": "object", "required": ["input"],
        "properties": {
            "model": {**_STR, "nullable": True, "x-embedding-models": True,
                      "description": "default (absent or null): all-MiniLM-L6-v2; a served name with --embedding-pooling"},
            "input": {"oneOf": [{"type": "string", "minLength": 1},
                                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "x-max-inputs": True},
                                {"type": "array", "items": _int(0, _MINILM_VOCAB - 1), "minItems": 1, "maxItems": 64},
                                {"type": "array", "items": {"type": "array", "items": _int(0, _MINILM_VOCAB - 1), "minItems": 1, "maxItems": 64},
                                 "minItems": 1, "x-max-inputs": True}]},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "user": _STR,
            "truncate_prompt_tokens": {"type": "integer", "minimum": -1, "maximum": 256, "not": {"const": 0},
                                       "description": "keep each text's first k tokens (-1: 256); without any truncation field a text past 256 tokens is a 400"},
            "truncate": {"type": "boolean", "description": "TEI: true = truncate_prompt_tokens -1"},
            "error_behavior": {"type": "string", "enum": ["error", "truncate"]},
        },
    },
    "EmbeddingResponse": {
        "type": "object", "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]}, "model": _STR,
            "usage": {"type": "object", "properties": {"prompt_tokens": _int(0), "total_tokens": _int(0)}},
            "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"type": "string", "enum": ["embedding"]}, "index": _int(0),
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
        },
    },
    "Model": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": _STR, "object": {"type": "string", "enum": ["model"]}, "created": _int(0), "owned_by": _STR, "root": _STR, "max_model_len": _int(1)},
    },
    "ModelList": {"type": "object", "required": ["object", "data"], "properties": {"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("Model")}}},
    "GenerateRequest": {
        "type": "object",
        "description": "MindIE's form (id, text_input, parameters) and Triton / TensorRT-LLM's input names at the top "
                       "level, mixed freely (a one-element array is read as its value); one name per field. Also "
                       "accepted (docs/API.md): " + _MODEL_SHAPED,
        "oneOf": [{"required": ["text_input"], "properties": {"text_input": _TRITON_INPUTS["text_input"]}},
                  {"required": ["input_ids"], "properties": {"input_ids": _TRITON_INPUTS["input_ids"]}}],
        "not": _one_name_per_field(),
        "properties": {**_TRITON_INPUTS, "parameters": {"type": "object", "properties": _MINDIE_PARAMS}},
    },
    "GenerateResponse": {
        "type": "object", "required": ["id", "model_name", "text_output", "details"],
        "properties": {
            "id": _STR, "model_name": _STR, "model_version": _NULL_STR,
            "text_output": {"anyOf": [_STR, {"type": "array", "items": _STR}], "description": "one text per beam with beam_width > 1"},
            "details": {"type": "object", "properties": {
                "finish_reason": {"type": "string", "enum": ["eos_token", "stop_sequence", "length", "timeout", "abort"]},
                "generated_tokens": _int(0), "first_token_cost": {"type": "number", "nullable": True},
                "decode_cost": {"type": "number", "nullable": True},
                "batch_size": _int(0), "queue_wait_time": _int(0),
                "tokens": {"type": "array", "items": {"type": "object", "properties": {
                    "id": _int(0), "text": _NULL_STR, "logprob": {"type": "number", "nullable": True}}}}}},
            "prefill_time": {"type": "number", "nullable": True}, "decode_time": {"type": "number", "nullable": True},
            "perf_stat": {"type": "object", "description": "perf_stat: true", "properties": {
                "prefill_time": {"type": "number", "nullable": True}, "decode_time_arr": _NUMS,
                "batch_size": {"type": "array", "items": _int(0)}, "queue_wait_time": {"type": "array", "items": _int(0)},
                "num_draft_tokens": _int(0), "num_accepted_draft_tokens": _int(0)}},
            **_TRITON_OUTPUTS,
        },
    },
    "TritonModelMetadata": {
        "type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {"name": _STR, "versions": {"type": "array", "items": _STR}, "platform": _STR,
                       "inputs": {"type": "array", "items": {"type": "object"}}, "outputs": {"type": "array", "items": {"type": "object"}}},
    },
    "LoadLoraRequest": {"type": "object", "required": ["lora_name", "lora_path"], "properties": {"lora_name": {"type": "string", "minLength": 1}, "lora_path": {"type": "string", "minLength": 1}}},
    "UnloadLoraRequest": {"type": "object", "required": ["lora_name"], "properties": {"lora_name": {"type": "string", "minLength": 1}}},
    "ModelReady": {"type": "object", "required": ["name", "ready"], "properties": {"name": _STR, "ready": _BOOL}},
    # vLLM's utility routes (server/tokenize_routes.py); /tokenize also takes chat `messages`
    "TokenizeRequest": {"type": "object", "required": ["prompt"], "properties": {
        "model": _STR, "prompt": {"type": "string", "description": "at most 4 MiB of characters (SPEC §4); empty: no tokens"}, "add_special_tokens": _BOOL,
        "return_token_strs": _BOOL}},
    "TokenizeResponse": {"type": "object", "required": ["count", "max_model_len", "tokens"], "properties": {
        "count": _int(0), "max_model_len": _int(1), "tokens": {"type": "array", "items": _TOKEN_ID},
        "token_strs": {"type": "array", "items": _STR, "nullable": True}}},
    "DetokenizeRequest": {"type": "object", "required": ["tokens"], "properties": {
        "model": _STR, "tokens": {"type": "array", "items": _TOKEN_ID}}},
    "DetokenizeResponse": {"type": "object", "required": ["prompt"], "properties": {"prompt": _STR}},
    "InvocationRequest": {"anyOf": [_ref("ChatCompletionRequest"), _ref("CompletionRequest"), _ref("EmbeddingRequest")],
                          "description": "SageMaker's route: messages -> chat, prompt -> completions, input -> embeddings"},
    "InvocationResponse": {"oneOf": [_ref("ChatCompletionResponse"), _ref("CompletionResponse"), _ref("EmbeddingResponse")]},
    "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string", "enum": ["ok", "draining", "unhealthy"]}, "error": _STR}},
}  # fmt: skip
