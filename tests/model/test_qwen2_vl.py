"""Qwen2-VL / Qwen2.5-VL against Hugging Face on tiny random checkpoints (the real configs' layout,
shrunk): our pixel values equal HF's image processor's; greedy tokens and logprobs of prompts with
one and two images (different sizes, resized up and down) and a video, batched with a text-only
prompt under chunked prefill (pieces end inside image spans), equal HF `generate` on the same
weights and processed inputs; the prefix cache reuses KV for the same image + prompt only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from inflight import LLM, SamplingParams
from inflight.multimodal.qwen2_vl_processor import VisionProcessorConfig, process_image

MAX_TOKENS = 8
NUM_LOGPROBS = 3


def _image(h: int, w: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    # smooth gradients on top of noise: resizing then matters to every pixel
    return img.convert(mode) if mode != "RGB" else img


IMAGES = {"small": (60, 90), "wide": (150, 200), "tall": (252, 112)}


@pytest.fixture(scope="module")
def vl_dirs(tiny_vl_dir: Any) -> dict[str, Path]:
    return {
        "qwen2_vl": tiny_vl_dir("qwen2_vl"),
        # checkpoint tensors named as transformers >= 4.52 modules (model.language_model.*)
        "qwen2_5_vl": tiny_vl_dir("qwen2_5_vl", nested_names=True),
    }


# ------------------------------------------------------------------------------ preprocessing
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_pixel_values_equal_hf_image_processor(vl_dirs: dict[str, Path], mode: str) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    cfg = VisionProcessorConfig.from_dir(vl_dirs["qwen2_vl"])
    hf = Qwen2VLImageProcessorPil(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    images = [
        _image(h, w, i, mode) for i, (h, w) in enumerate([*IMAGES.values(), (30, 30), (1000, 40)])
    ]
    ours = [process_image(im, cfg) for im in images]
    ref = hf(images=images, return_tensors="np")
    assert [list(o.grid_thw) for o in ours] == ref["image_grid_thw"].tolist()
    np.testing.assert_array_equal(
        np.concatenate([o.pixel_values for o in ours]), ref["pixel_values"]
    )


# ------------------------------------------------------------------------------ generation
def _chat_prompt(tok: Any, parts: list[dict[str, Any]]) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(text, add_special_tokens=False)


@torch.no_grad()
def _hf_generate(
    model: Any, ids: list[int], cfg: dict[str, Any], media: dict[str, list[Any]]
) -> tuple[list[int], torch.Tensor]:
    kwargs: dict[str, Any] = {}
    t = torch.tensor([ids])
    kwargs["mm_token_type_ids"] = (t == cfg["image_token_id"]).int() + 2 * (
        t == cfg["video_token_id"]
    ).int()
    if media.get("image"):
        kwargs["pixel_values"] = torch.from_numpy(
            np.concatenate([v.pixel_values for v in media["image"]])
        )
        kwargs["image_grid_thw"] = torch.tensor([v.grid_thw for v in media["image"]])
    if media.get("video"):
        kwargs["pixel_values_videos"] = torch.from_numpy(
            np.concatenate([v.pixel_values for v in media["video"]])
        )
        kwargs["video_grid_thw"] = torch.tensor([v.grid_thw for v in media["video"]])
        if cfg["model_type"] == "qwen2_5_vl":
            kwargs["second_per_grid_ts"] = torch.tensor([v.second_per_grid for v in media["video"]])
    out = model.generate(
        t, attention_mask=torch.ones_like(t), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
        do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
        **kwargs,
    )  # fmt: skip
    return out.sequences[0, len(ids) :].tolist(), torch.log_softmax(
        torch.stack(out.logits)[:, 0].float(), -1
    )


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_greedy_matches_hf_with_images_video_and_text(vl_dirs: dict[str, Path], arch: str) -> None:
    import json

    path = vl_dirs[arch]
    cfg = json.loads((path / "config.json").read_text())
    llm = LLM(
        model=str(path), dtype="float32", device="cpu", progress=False,
        max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=40, block_size=8,
    )  # fmt: skip
    tok = llm.get_tokenizer()
    proc = llm.engine.inputs.vision_processor
    images = {k: _image(h, w, i) for i, (k, (h, w)) in enumerate(IMAGES.items())}
    frames = [_image(84, 112, 10 + i) for i in range(4)]
    img = "<|vision_start|><|image_pad|><|vision_end|>"
    cases: list[tuple[list[int], dict[str, list[Any]]]] = [
        (_chat_prompt(tok, [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]), {"image": [images["small"]]}),
        (_chat_prompt(tok, [{"type": "text", "text": "Compare"}, {"type": "image"}, {"type": "text", "text": "and"},
                            {"type": "image"}, {"type": "text", "text": "please."}]), {"image": [images["wide"], images["tall"]]}),
        (tok.encode("The cat sees a red house today.", add_special_tokens=False), {}),
        (tok.encode(f"A clip: <|vision_start|><|video_pad|><|vision_end|> then {img} done", add_special_tokens=False),
         {"video": [frames], "image": [images["small"]]}),
    ]  # fmt: skip
    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=NUM_LOGPROBS
    )
    prompts = [
        {"prompt_token_ids": ids, "multi_modal_data": media} if media else {"prompt_token_ids": ids}
        for ids, media in cases
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()

    hf_cls = getattr(transformers, cfg["architectures"][0])
    hf = hf_cls.from_pretrained(path, dtype=torch.float32).eval()
    for (_, media), out in zip(cases, outs):
        processed = {
            k: [llm.engine.inputs.process_media(k, v) for v in vs] for k, vs in media.items()
        }
        if media:
            assert len(out.prompt_token_ids) > len(_) + 4  # placeholders expanded
        tokens, logprobs = _hf_generate(hf, out.prompt_token_ids, cfg, processed)
        ours = out.outputs[0]
        assert ours.token_ids == tokens
        for step, (tid, lp) in enumerate(zip(ours.token_ids, ours.logprobs)):
            assert lp[tid].logprob == pytest.approx(logprobs[step, tid].item(), abs=1e-4)
    assert proc is not None
    assert any(len(o.prompt_token_ids) > 16 for o in outs)  # chunked: 16 tokens per step

    # the same image + prompt again: its blocks come from the prefix cache (the image rows too);
    # a different image behind the same placeholder ids never shares them, and matches HF alone
    again = llm.generate([prompts[0]], params, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 8 * ((len(outs[0].prompt_token_ids) - 1) // 8) - 8
    assert again.outputs[0].token_ids == outs[0].outputs[0].token_ids
    other = {"prompt_token_ids": cases[0][0], "multi_modal_data": {"image": [_image(60, 90, 99)]}}
    diff = llm.generate([other], params, use_tqdm=False)[0]
    first_image_block = outs[0].prompt_token_ids.index(cfg["image_token_id"]) // 8
    assert diff.num_cached_tokens <= first_image_block * 8
    tokens, _ = _hf_generate(
        hf,
        diff.prompt_token_ids,
        cfg,
        {"image": [llm.engine.inputs.process_media("image", _image(60, 90, 99))]},
    )
    assert diff.outputs[0].token_ids == tokens
    # the first image behind other text: no prefix-cache hit on it, but the encoder cache serves it
    vision = llm.engine.runner.vision
    encoded = vision.num_encoded
    moved = _chat_prompt(tok, [{"type": "text", "text": "Tell me:"}, {"type": "image"}])
    media = {"image": [images["small"]]}
    out = llm.generate(
        [{"prompt_token_ids": moved, "multi_modal_data": media}], params, use_tqdm=False
    )[0]
    assert vision.num_encoded == encoded and vision.cache.hits > 0
    processed = {"image": [llm.engine.inputs.process_media("image", images["small"])]}
    assert out.outputs[0].token_ids == _hf_generate(hf, out.prompt_token_ids, cfg, processed)[0]
    llm.engine.shutdown()


def test_prompt_and_media_must_agree(vl_dirs: dict[str, Path], tiny_model_dir: Any) -> None:
    from inflight.errors import ParamError

    llm = LLM(model=str(vl_dirs["qwen2_vl"]), dtype="float32", device="cpu", progress=False)
    pad = "<|vision_start|><|image_pad|><|vision_end|>"
    img = _image(60, 90, 0)
    cases = [
        (
            {"prompt": f"{pad} and {pad}", "multi_modal_data": {"image": [img]}},
            "image_url",
            "2 image placeholder",
        ),
        (
            {"prompt": "no placeholder", "multi_modal_data": {"image": [img]}},
            "image_url",
            "0 image placeholder",
        ),
        ({"prompt": pad, "multi_modal_data": {"image": [img] * 21}}, "messages", "at most 20"),
        ({"prompt": pad, "multi_modal_data": {"audio": [b""]}}, "audio_url", "no audio"),
    ]
    for prompt, param, match in cases:
        with pytest.raises(ParamError, match=match) as e:
            llm.engine.make_request(prompt)
        assert e.value.param == param
    # what travels to an "mp" worker pickles: pixels, spans, hashes, M-RoPE positions
    import pickle

    from inflight.outputs import NewRequestData

    req = llm.engine.make_request({"prompt": f"a {pad} b", "multi_modal_data": {"image": [img]}})
    data = NewRequestData(req.request_id, req.inputs)
    back = pickle.loads(pickle.dumps(data)).inputs
    (item,) = back.mm_items
    assert (item.offset, item.length, item.hash) == (
        req.mm_items[0].offset,
        6,
        req.mm_items[0].hash,
    )
    np.testing.assert_array_equal(item.pixel_values, req.mm_items[0].pixel_values)
    np.testing.assert_array_equal(back.mrope_positions, req.mrope_positions)
    assert back.mrope_delta == req.mrope_delta == -3  # 6 image tokens on a 2 x 3 grid advance 3
    # LLM.chat takes PIL images and data: URLs alike (PNG is lossless: the same pixels)
    import base64
    import io

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs = [
        llm.chat(
            [{"role": "user", "content": [part, {"type": "text", "text": "Hi"}]}],
            params,
            use_tqdm=False,
        )[0]
        for part in (
            {"type": "image", "image": img},
            {"type": "image_url", "image_url": {"url": url}},
        )
    ]
    assert outs[0].prompt_token_ids == outs[1].prompt_token_ids
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    llm.engine.shutdown()
    text = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)
    with pytest.raises(ParamError, match="takes no images") as e:
        text.engine.make_request({"prompt": "hi", "multi_modal_data": {"image": [img]}})
    assert e.value.param == "image_url"
    text.engine.shutdown()
