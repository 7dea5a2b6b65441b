"""Image / video / audio content parts of chat messages and /v2 `text_input` lists.

Chat: `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI) or `{"type": "image_url",
"image_url": "..."}` (MindIE), `video_url` alike; the URL is a `data:` URL, a local file
(`file://` or a path, under --allowed-local-media-path) or http(s) (with --allow-remote-media).
The part becomes `{"type": "image"}` for the chat template (Qwen2-VL's writes the placeholder), and
the media is fetched, decoded and preprocessed in a worker thread (NumPy / Pillow; never on the
event loop), then handed to the engine as `multi_modal_data`. Every failure is a 400 naming the
field; `audio_url` is refused ("this model takes no audio").
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from inflight.errors import ParamError
from inflight.multimodal.media import (
    MAX_MEDIA_ITEMS,
    MediaOptions,
    decode_image,
    decode_video,
    load_typed,
    open_image,
)

MEDIA_TYPES = {"image_url": "image", "video_url": "video", "image": "image", "video": "video"}
AUDIO_TYPES = ("audio_url", "input_audio", "audio")


@dataclass(frozen=True)
class MediaRef:
    modality: str  # "image" | "video"
    url: str
    field: str  # the request field that named it, for errors ("messages[0].content[1].image_url")


def media_part(part: dict[str, Any], where: str) -> tuple[dict[str, Any], MediaRef] | None:
    """(template part, reference) for an image / video part; None for any other part type.
    `where` names the part in errors (e.g. "messages[0].content[1]")."""
    kind = part.get("type")
    if kind in AUDIO_TYPES:
        raise ParamError(f"{where}: {kind}: this model takes no audio", "audio_url")
    if kind not in MEDIA_TYPES:
        return None
    modality = MEDIA_TYPES[kind]
    field = f"{modality}_url"
    value = part.get(kind)
    if isinstance(value, dict):
        extra = set(value) - {"url", "detail"}
        if extra:
            raise ParamError(f"{where}.{kind}: unknown field {sorted(extra)[0]!r}", field)
        detail = value.get("detail", "auto")
        if detail not in ("auto", "high"):
            raise ParamError(
                f"{where}.{kind}.detail: {detail!r} is not supported; use auto or high (the model's pixel budget)",
                field,
            )
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ParamError(f'{where}.{kind}: needs a URL string (or {{"url": ...}})', field)
    return {"type": modality}, MediaRef(modality, value, field)


def text_input_media(body: dict[str, Any], takes_images: bool) -> list[MediaRef]:
    """The image parts of a /v2 MindIE `text_input` list, in order (the protocol parser puts their
    placeholders in the prompt; a text model's parser refuses them). Errors name the part."""
    v = body.get("text_input")
    if not takes_images or not isinstance(v, list):
        return []
    refs = []
    for j, part in enumerate(v):
        if isinstance(part, dict) and part.get("type") != "text":
            found = media_part(part, f"text_input[{j}]")
            if found is not None:
                refs.append(found[1])
    return refs


def check_counts(refs: list[MediaRef], opts: MediaOptions) -> None:
    if len(refs) > MAX_MEDIA_ITEMS:
        raise ParamError(
            f"messages: {len(refs)} media items; at most {MAX_MEDIA_ITEMS} per request", "messages"
        )
    for modality, limit in (("image", opts.max_images), ("video", opts.max_videos)):
        n = sum(1 for r in refs if r.modality == modality)
        if n > limit:
            raise ParamError(
                f"{modality}_url: {n} {modality}s; at most {limit} per request", f"{modality}_url"
            )


# Media work has its own bounded pool: slow remote fetches never wait behind (or hold up) grammar
# compiles or other to_thread work (eight slow fetches once held a json_object request 37.8 s in
# the shared default executor). A request's items load one after another: one fetch per request.
MEDIA_WORKERS = 4
_pool: ThreadPoolExecutor | None = None


def _media_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(MEDIA_WORKERS, thread_name_prefix="media")
    return _pool


def _load_all(engine: Any, refs: list[MediaRef], opts: MediaOptions) -> dict[str, list[Any]]:
    """Fetch every item, read the image headers and check the request's pixel budget, then decode
    and preprocess (decoding is the cost the budget bounds)."""
    loaded = []
    pixels = 0
    for ref in refs:
        got = load_typed(ref.url, ref.modality, ref.field, opts)
        image = open_image(got.data, ref.field, got.content_type) if ref.modality == "image" else None
        if image is not None:
            pixels += image.size[0] * image.size[1]
            if pixels > opts.max_pixels_per_request:
                raise ParamError(
                    f"{ref.field}: the request's images hold more than {opts.max_pixels_per_request} pixels "
                    "(--max-pixels-per-request)",
                    ref.field,
                )
        loaded.append((ref, got, image))
    out: dict[str, list[Any]] = {}
    for ref, got, image in loaded:
        if ref.modality == "image":
            processed = engine.process_media("image", decode_image(got.data, ref.field, opts, image=image))
        else:
            frames, fps = decode_video(got.data, ref.field, opts.video_fps, opts.video_max_frames, opts)
            processed = engine.process_media("video", (frames, fps))
        processed.digest()  # the content hash, here in the worker thread
        out.setdefault(ref.modality, []).append(processed)
    return out


async def load_media(engine: Any, refs: list[MediaRef], opts: MediaOptions) -> dict[str, list[Any]]:
    """Fetch, decode and preprocess every item in the media pool: {"image": [...], "video": [...]}."""
    if not refs:
        return {}
    if not engine.takes_images:
        raise ParamError(
            f"{refs[0].field}: this model takes no images or video (not a vision-language model)",
            refs[0].field,
        )
    check_counts(refs, opts)
    return await asyncio.get_running_loop().run_in_executor(_media_pool(), _load_all, engine, refs, opts)
