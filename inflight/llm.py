"""LLM: the offline Python API, shaped like vLLM's so users can switch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from inflight.engine.args import EngineArgs
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.tokenizer import PromptInput, apply_chat_template
from inflight.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from inflight.sampling_params import SamplingParams, embedding_params

Messages = list[dict[str, Any]]


class LLM:
    """Batch generation over the in-flight engine.

    >>> llm = LLM(model=PATH)
    >>> outs = llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0))
    >>> outs[0].outputs[0].text
    """

    def __init__(self, model: str | None = None, *, progress: bool = True, **kwargs: Any) -> None:
        """
        Args:
            model: Hugging Face checkpoint directory (None: the bundled demo model).
            progress: show a progress bar while the weights load.
            kwargs: engine arguments, the fields of `inflight.engine.args.EngineArgs` (dtype,
                device, max_model_len, max_num_seqs, max_num_batched_tokens, block_size,
                kv_cache_memory_bytes, enable_prefix_caching, ...), with its defaults; an
                unknown one is a TypeError naming it.
        """
        args = EngineArgs.from_kwargs(model, "LLM", **kwargs).for_offline()
        if args.data_parallel_size != 1:
            raise ValueError("data_parallel_size: replicas are served (inflight serve --data-parallel-size); run one LLM per replica offline")
        self.engine = LLMEngine.from_engine_args(args, progress=progress)

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams carrying the checkpoint's generation_config.json defaults (as vLLM does)."""
        gen = self.engine.config.model.generation_defaults
        keys = {"temperature": float, "top_k": int, "top_p": float}
        kwargs = {k: cast(gen[k]) for k, cast in keys.items() if gen.get(k) is not None}
        if gen.get("do_sample") is False:
            kwargs["temperature"] = 0.0
        return SamplingParams(**kwargs)

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter in directory `path` as `name` (needs enable_lora=True); prompts
        select it with {"prompt": ..., "lora_name": name}."""
        self.engine.adapters.load(name, path)

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        Args:
            prompts: a string, a token-id list, {"prompt_token_ids": [...]}, or a list of those. A
                dict prompt may select a LoRA adapter: "lora_name", or TensorRT-LLM's
                "lora_task_id" (+ "lora_weights" and "lora_config" the first time).
            sampling_params: one for all prompts, or one per prompt.
            priority: optional per-prompt priority, 1 (highest) .. 5.
            timeout: seconds each request may take (finish_reason "length", finish detail
                "timeout", past it). None: no deadline, however long the batch runs (the
                server's 600 s default is for clients that wait on a connection).
        """
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = sampling_params or self.get_default_sampling_params()
        per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError("sampling_params: need one per prompt")
        # validate every prompt before queuing any: a bad one must not leave the others queued
        requests = [
            self.engine.make_request(prompt, p, priority=priority[i] if priority else 5,
                                     timeout=math.inf if timeout is None else timeout, final_only=True)  # fmt: skip
            for i, (prompt, p) in enumerate(zip(prompts, per_prompt))
        ]
        ids = []
        for req in requests:
            self.engine.add_request(req)
            ids.append(req.request_id)
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: Messages | list[Messages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate.

        Vision-language models take image parts: `{"type": "image", "image": <PIL.Image>}` or
        `{"type": "image_url", "image_url": {"url": ...}}` (a data: URL or a local path: the
        Python API trusts its caller); video parts alike with a list of PIL frames or a URL."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        prompts: list[PromptInput] = []
        for conv in conversations:
            conv, media = _split_media(conv)  # type: ignore[arg-type]
            text = apply_chat_template(tok, conv, add_generation_prompt, chat_template, tools)
            # the template already holds the special tokens: don't add BOS again
            prompt: dict[str, Any] = {"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)}
            if media:
                prompt["multi_modal_data"] = media
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm)

    def embed(
        self, prompts: PromptInput | Sequence[PromptInput], pooling: str = "last", use_tqdm: bool = True
    ) -> list[EmbeddingRequestOutput]:
        """Embeddings from this decoder model: the final hidden state of the last prompt token
        ("last", as E5-Mistral / GTE-Qwen) or the mean over the prompt ("mean"), L2-normalized.
        """
        outs = self.generate(prompts, embedding_params(pooling), use_tqdm)
        return [
            EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.embedding.tolist()))
            for o in outs
        ]

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        wanted = set(request_ids)
        bar = tqdm(total=len(request_ids), desc="Generating", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [final[rid] for rid in request_ids]


def _split_media(conv: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """Image / video parts -> template parts + the images / frames in prompt order."""
    from inflight.multimodal.media import MediaOptions, decode_image, decode_video, load_bytes

    opts = MediaOptions(allowed_local_media_path="/")
    media: dict[str, list[Any]] = {}
    out = []
    for msg in conv:
        content = msg.get("content")
        if not isinstance(content, list):
            out.append(msg)
            continue
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            modality = {"image": "image", "image_url": "image", "video": "video", "video_url": "video"}.get(str(kind))
            if modality is None:
                parts.append(part)
                continue
            value = part.get(kind)
            if isinstance(value, dict):
                value = value.get("url")
            if isinstance(value, str):
                data = load_bytes(value, modality, f"{modality}_url", opts)
                if modality == "image":
                    value = decode_image(data, "image_url", opts)
                else:
                    value = decode_video(data, "video_url", 2.0, 32, opts)
            media.setdefault(modality, []).append(value)
            parts.append({"type": modality})
        out.append({**msg, "content": parts})
    return out, media
