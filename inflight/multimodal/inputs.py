"""A prompt's images and videos as the engine carries them: where each sits in the token ids (its
placeholder span), its pixels, its content hash, and the prompt's M-RoPE positions.

Qwen2-VL prompts name an image with one `<|image_pad|>` between `<|vision_start|>` and
`<|vision_end|>` (the chat template writes it); the processor repeats the pad once per encoder
output row (t * h * w / merge^2), and the vision embeddings replace those rows at run time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from inflight.errors import ParamError
from inflight.multimodal.media import MAX_MEDIA_ITEMS
from inflight.multimodal.qwen2_vl_processor import ProcessedVision


@dataclass
class MultiModalItem:
    """One image or video of a request (pickles: it travels in NewRequestData to the runner)."""

    modality: str  # "image" | "video"
    pixel_values: np.ndarray  # (patches, C * T * p * p) float32, the vision encoder's input
    grid_thw: tuple[int, int, int]  # patches along time, height, width
    offset: int  # prompt position of its first placeholder token
    length: int  # placeholder tokens = encoder output rows
    hash: bytes  # content hash (pixels + grid): encoder-cache key and prefix-cache key
    second_per_grid: float = 1.0  # video: seconds per temporal patch (Qwen2.5-VL time positions)

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class VisionSpec:
    """What a vision-language checkpoint's config says about its prompts."""

    image_token_id: int
    video_token_id: int
    merge_size: int
    tokens_per_second: (
        float | None
    )  # Qwen2.5-VL: video time positions scale with seconds; None: Qwen2-VL

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> VisionSpec | None:
        vision = hf.get("vision_config")
        if not vision:
            return None
        tps = (
            vision.get("tokens_per_second")
            if hf.get("model_type", "").startswith("qwen2_5")
            else None
        )
        return cls(
            image_token_id=int(hf.get("image_token_id", 151655)),
            video_token_id=int(hf.get("video_token_id", 151656)),
            merge_size=int(vision.get("spatial_merge_size", 2)),
            tokens_per_second=None if tps is None else float(tps),
        )


def expand_placeholders(
    ids: list[int], media: dict[str, list[ProcessedVision]], spec: VisionSpec
) -> tuple[list[int], list[MultiModalItem]]:
    """Each run of a modality's pad token (one token, or already its full length) becomes that
    item's span; the i-th run of image pads is the i-th image. Counts must match."""
    pads = {"image": spec.image_token_id, "video": spec.video_token_id}
    runs: list[tuple[str, int]] = []  # (modality, run length) in prompt order
    out: list[int | None] = []  # None: where the next run goes
    i = 0
    while i < len(ids):
        modality = next((m for m, t in pads.items() if ids[i] == t), None)
        if modality is None:
            out.append(ids[i])
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        runs.append((modality, j - i))
        out.append(None)
        i = j
    for modality, field in (("image", "image_url"), ("video", "video_url")):
        n_runs = sum(1 for m, _ in runs if m == modality)
        n_items = len(media.get(modality, []))
        if n_runs != n_items:
            raise ParamError(
                f"{field}: the prompt has {n_runs} {modality} placeholder(s) for {n_items} {modality}(s)",
                field,
            )
    counters = {"image": 0, "video": 0}
    expanded: list[int] = []
    items: list[MultiModalItem] = []
    pending = iter(runs)
    for t in out:
        if t is not None:
            expanded.append(t)
            continue
        modality, run = next(pending)
        v = media[modality][counters[modality]]
        counters[modality] += 1
        n = v.num_tokens(spec.merge_size)
        if run not in (1, n):
            field = f"{modality}_url"
            raise ParamError(
                f"{field}: {run} placeholder tokens for a {modality} that takes {n}", field
            )
        h = hashlib.blake2b(modality.encode() + v.digest(), digest_size=16).digest()
        items.append(
            MultiModalItem(
                modality, v.pixel_values, v.grid_thw, len(expanded), n, h, v.second_per_grid
            )
        )
        expanded.extend([pads[modality]] * n)
    return expanded, items


def mrope_positions(
    num_tokens: int, items: list[MultiModalItem], spec: VisionSpec
) -> tuple[np.ndarray, int]:
    """(3, num_tokens) temporal/height/width positions of a prompt and the delta that later
    tokens add to their index (they run at index + delta on all three axes).

    Text advances all three by one per token; an item's tokens take start + (t * interval, row,
    column) over its merged grid, and the text after it starts at start + max(h, w) / merge (as
    HF's get_rope_index)."""
    pos = np.empty((3, num_tokens), dtype=np.int64)
    cur, i = 0, 0
    m = spec.merge_size
    for item in items:
        text = item.offset - i
        pos[:, i : item.offset] = np.arange(cur, cur + text)
        cur += text
        t, h, w = item.grid_thw[0], item.grid_thw[1] // m, item.grid_thw[2] // m
        if item.modality == "video" and spec.tokens_per_second is not None:
            interval = np.float32(spec.tokens_per_second) * np.float32(item.second_per_grid)
            tpos = (np.arange(t, dtype=np.float32) * interval).astype(np.int64)
        else:
            tpos = np.arange(t, dtype=np.int64)
        grid = np.stack(
            np.meshgrid(tpos, np.arange(h) + cur, np.arange(w) + cur, indexing="ij")
        ).reshape(3, -1)
        grid[0] += cur
        pos[:, item.offset : item.end] = grid
        cur += max(item.grid_thw[1], item.grid_thw[2]) // m
        i = item.end
    pos[:, i:] = np.arange(cur, cur + num_tokens - i)
    delta = int(pos.max()) + 1 - num_tokens if num_tokens else 0
    return pos, delta


__all__ = [
    "MAX_MEDIA_ITEMS",
    "MultiModalItem",
    "VisionSpec",
    "expand_placeholders",
    "mrope_positions",
]
