"""Qwen2-VL / Qwen2.5-VL preprocessing with Pillow + NumPy, value for value what the Hugging Face
image processor (`Qwen2VLImageProcessorPil`) makes: RGB (alpha composited on white), resize with
`smart_resize` to a multiple of patch * merge within [min_pixels, max_pixels] (PIL bicubic on
uint8), rescale in float64 then float32, normalize in float32, patchify into rows of
C * temporal_patch * patch * patch values ordered merge-window by merge-window.

tests/model/test_qwen2_vl.py compares our pixel values with the HF processor's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from inflight.errors import ParamError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) divisible by `factor`, area within [min_pixels, max_pixels], aspect kept
    as closely as it can be (HF's function, same rounding)."""
    if max(height, width) / min(height, width) > 200:
        raise ParamError(
            f"image: aspect ratio {max(height, width) / min(height, width):.0f} exceeds 200",
            "image_url",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VisionProcessorConfig:
    """preprocessor_config.json of a Qwen2-VL checkpoint (with HF's defaults), plus video sampling."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    # video frames: HF's video processor defaults (smaller frames than a still image)
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 768 * 28 * 28
    video_fps: float = 2.0  # the rate of a frame list given without one (Python API)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dir(cls, path: str | Path) -> VisionProcessorConfig:
        """Read preprocessor_config.json (and video_preprocessor_config.json) when present."""
        path = Path(path)
        raw: dict[str, Any] = {}
        f = path / "preprocessor_config.json"
        if f.is_file():
            raw = json.loads(f.read_text())
        kw: dict[str, Any] = {}
        for key in ("patch_size", "temporal_patch_size", "merge_size"):
            if key in raw:
                kw[key] = int(raw[key])
        lo, hi = _pixel_bounds(raw)
        if lo is not None:
            kw["min_pixels"] = lo
        if hi is not None:
            kw["max_pixels"] = hi
        if raw.get("image_mean"):
            kw["image_mean"] = tuple(float(x) for x in raw["image_mean"])
        if raw.get("image_std"):
            kw["image_std"] = tuple(float(x) for x in raw["image_std"])
        if raw.get("rescale_factor"):
            kw["rescale_factor"] = float(raw["rescale_factor"])
        vf = path / "video_preprocessor_config.json"
        if vf.is_file():
            vlo, vhi = _pixel_bounds(json.loads(vf.read_text()))
            if vlo is not None:
                kw["video_min_pixels"] = vlo
            if vhi is not None:
                kw["video_max_pixels"] = vhi
        return cls(**kw, extra=raw)


def _pixel_bounds(raw: dict[str, Any]) -> tuple[int | None, int | None]:
    """min/max pixels across the layouts: top-level keys, size={shortest,longest}_edge, size={min,max}_pixels."""
    size = raw.get("size") or {}
    lo = raw.get("min_pixels", size.get("shortest_edge", size.get("min_pixels")))
    hi = raw.get("max_pixels", size.get("longest_edge", size.get("max_pixels")))
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


@dataclass
class ProcessedVision:
    """One image or video, ready for the vision encoder."""

    pixel_values: np.ndarray  # (t * h * w, C * temporal_patch * patch * patch) float32
    grid_thw: tuple[int, int, int]  # patches along time, height, width (before merging)
    second_per_grid: float = 1.0  # video: seconds covered by one temporal patch (Qwen2.5-VL M-RoPE)
    _digest: bytes = b""

    def digest(self) -> bytes:
        """Content hash of the encoder input (pixels, grid, timing); computed once (the server
        computes it in the worker thread that preprocessed the item)."""
        if not self._digest:
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{self.grid_thw}:{self.second_per_grid}:{self.pixel_values.shape}".encode())
            h.update(np.ascontiguousarray(self.pixel_values).data)
            self._digest = h.digest()
        return self._digest

    def num_tokens(self, merge_size: int) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def to_rgb(image: Image.Image) -> np.ndarray:
    """(H, W, 3) uint8; transparency composited onto white, as HF's convert_to_rgb."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(background, rgba).convert("RGB"))
    return np.asarray(image.convert("RGB"))


def _resize_normalize(
    rgb: np.ndarray, cfg: VisionProcessorConfig, height: int, width: int
) -> np.ndarray:
    """(H, W, 3) uint8 -> (3, height, width) float32, resized (bicubic), rescaled, normalized."""
    if rgb.shape[:2] != (height, width):
        rgb = np.asarray(
            Image.fromarray(rgb).resize((width, height), resample=Image.Resampling.BICUBIC)
        )
    chw = np.moveaxis(rgb, -1, 0)
    scaled = (chw.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
    return (scaled - mean) / std


def patchify(
    frames: np.ndarray, cfg: VisionProcessorConfig
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(F, C, H, W) -> (grid_t * grid_h * grid_w, C * T * p * p): rows merge-window by merge-window
    (each merge_size x merge_size block of patches is contiguous), frames padded by repeating the
    last one to a multiple of the temporal patch."""
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    if pad := -frames.shape[0] % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    f, c, h, w = frames.shape
    gt, gh, gw = f // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (gt, gh/m, gw/m, m, m, C, T, p, p)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def process_image(image: Image.Image, cfg: VisionProcessorConfig) -> ProcessedVision:
    rgb = to_rgb(image)
    height, width = smart_resize(
        rgb.shape[0], rgb.shape[1], cfg.factor, cfg.min_pixels, cfg.max_pixels
    )
    pixels, grid = patchify(_resize_normalize(rgb, cfg, height, width)[None], cfg)
    return ProcessedVision(pixels, grid)


def process_video(
    frames: list[Image.Image], fps: float, cfg: VisionProcessorConfig
) -> ProcessedVision:
    """Already-sampled frames (`fps` of them per second of video), each resized to the first
    frame's smart_resize size within the video pixel budget."""
    rgbs = [to_rgb(f) for f in frames]
    h0, w0 = rgbs[0].shape[:2]
    height, width = smart_resize(h0, w0, cfg.factor, cfg.video_min_pixels, cfg.video_max_pixels)
    stack = np.stack([_resize_normalize(r, cfg, height, width) for r in rgbs])
    pixels, grid = patchify(stack, cfg)
    return ProcessedVision(pixels, grid, second_per_grid=cfg.temporal_patch_size / fps)
