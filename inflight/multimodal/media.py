"""Fetch and decode media named by a request: `data:` URLs, local files under an allowed directory,
and http(s) URLs when enabled. Every failure is a ParamError naming the field (a 400), never a 500.

Blocking (file and network reads, image decoding): the server calls `load_media` from a worker
thread, never on its event loop. No torch.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from inflight.errors import ParamError
from inflight.multimodal.fetch import Fetched, fetch

MAX_MEDIA_ITEMS = 20  # MindIE: image_url + video_url + audio_url parts per request


@dataclass(frozen=True)
class MediaOptions:
    """Where media may come from and how big it may be (server flags)."""

    allowed_local_media_path: str | None = (
        None  # local files only under this directory; None: refused
    )
    allow_remote_media: bool = False  # fetch http(s) URLs
    allowed_media_domains: tuple[str, ...] = ()  # only these hosts (private ones included); (): any public host
    media_fetch_timeout_s: float = 10.0
    max_image_bytes: int = 20 * 2**20  # MindIE: images up to 20 MB
    max_video_bytes: int = 512 * 2**20  # MindIE: videos up to 512 MB
    max_image_pixels: int = 64 * 2**20  # decoded width * height (a decompression bomb is a 400)
    # all images of a request together, from their headers before any is decoded: one maximal
    # image (decoding 20 near-limit 8000x8000 images cost 91 s of CPU)
    max_pixels_per_request: int = 64 * 2**20
    max_images: int = MAX_MEDIA_ITEMS  # per request
    max_videos: int = 4  # per request
    video_fps: float = 2.0  # frames sampled per second of video
    video_max_frames: int = 32  # at most this many frames per video


def _limit(kind: str, opts: MediaOptions) -> int:
    return opts.max_video_bytes if kind == "video" else opts.max_image_bytes


def load_bytes(url: str, kind: str, field: str, opts: MediaOptions) -> bytes:
    """The raw bytes behind `url` (a data: URL, file:// URL or path, or http(s) URL)."""
    return load_typed(url, kind, field, opts).data


def load_typed(url: str, kind: str, field: str, opts: MediaOptions) -> Fetched:
    """The raw bytes behind `url` and the MIME type the source declared (data: URL or HTTP)."""
    limit = _limit(kind, opts)
    if not isinstance(url, str) or not url:
        raise ParamError(f"{field}: must be a non-empty URL string", field)
    declared = None
    if url.startswith("data:"):
        data = _data_url(url, field)
        declared = url[5:].partition(",")[0].split(";")[0].strip().lower() or None
    elif url.lower().startswith(("http://", "https://")):
        fetched = _fetch(url, field, opts, limit)
        data, declared = fetched.data, fetched.content_type
    elif "://" in url and not url.startswith("file://"):
        raise ParamError(f"{field}: only data:, file:// and http(s) URLs are accepted", field)
    else:
        data = _local_file(url, field, opts, limit)
    if len(data) > limit:
        raise ParamError(f"{field}: {len(data)} bytes; at most {limit} are accepted", field)
    if not data:
        raise ParamError(f"{field}: the {kind} is empty", field)
    return Fetched(data, declared)


def _data_url(url: str, field: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep:
        raise ParamError(f"{field}: a data: URL needs a ',' before its payload", field)
    if not head.endswith(";base64"):
        return urllib.parse.unquote_to_bytes(payload)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ParamError(f"{field}: the data: URL is not valid base64 ({e})", field) from e


def _local_file(url: str, field: str, opts: MediaOptions, limit: int) -> bytes:
    if opts.allowed_local_media_path is None:
        raise ParamError(
            f"{field}: local files are not served; start the server with --allowed-local-media-path DIR",
            field,
        )
    path_str = (
        urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file://") else url
    )
    root = Path(opts.allowed_local_media_path).resolve()
    path = Path(path_str)
    path = (path if path.is_absolute() else root / path).resolve()  # symlinks and .. resolved first
    if path != root and root not in path.parents:
        raise ParamError(f"{field}: {path_str!r} is outside the allowed local media path", field)
    try:
        size = path.stat().st_size
        if size > limit:
            raise ParamError(f"{field}: {size} bytes; at most {limit} are accepted", field)
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ParamError(f"{field}: no such file {path_str!r}", field) from None
    except PermissionError:
        raise ParamError(f"{field}: {path_str!r} is not readable", field) from None


def _fetch(url: str, field: str, opts: MediaOptions, limit: int) -> Fetched:
    if not opts.allow_remote_media:
        raise ParamError(
            f"{field}: http(s) URLs are not fetched; start the server with --allow-remote-media",
            field,
        )
    return fetch(url, field, limit, opts.media_fetch_timeout_s, opts.allowed_media_domains)


# Pillow opens ~40 formats, some through external programs (EPS via Ghostscript): only these
# are ever tried. MIME types the sources declare for them (a data: URL's or HTTP's).
IMAGE_FORMATS = {"PNG": ("image/png",), "JPEG": ("image/jpeg", "image/jpg", "image/pjpeg"),
                 "WEBP": ("image/webp",), "GIF": ("image/gif",), "BMP": ("image/bmp", "image/x-ms-bmp")}  # fmt: skip
_UNTYPED = (None, "application/octet-stream", "binary/octet-stream")


def open_image(data: bytes, field: str, declared: str | None = None) -> Image.Image:
    """The image's header only (lazy: nothing decoded yet), in an allowed format that agrees
    with the declared MIME type; anything else is a ParamError."""
    if declared not in _UNTYPED and not declared.startswith("image/"):  # type: ignore[union-attr]
        raise ParamError(f"{field}: declared as {declared!r}, not an image", field)
    try:
        image = Image.open(io.BytesIO(data), formats=list(IMAGE_FORMATS))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        allowed = ", ".join(IMAGE_FORMATS)
        raise ParamError(f"{field}: not a readable image in an accepted format ({allowed}): {e}", field) from None
    fmt = str(image.format)
    if declared not in _UNTYPED and declared not in IMAGE_FORMATS[fmt]:
        raise ParamError(f"{field}: declared as {declared!r} but the data is {fmt}", field)
    return image


def decode_image(data: bytes, field: str, opts: MediaOptions, declared: str | None = None,
                 image: Image.Image | None = None) -> Image.Image:  # fmt: skip
    """A fully decoded PIL image; a corrupt, truncated, oversized or not-allowed one is a ParamError."""
    image = image if image is not None else open_image(data, field, declared)
    w, h = image.size
    if w * h > opts.max_image_pixels:
        raise ParamError(f"{field}: {w}x{h} pixels; at most {opts.max_image_pixels} are accepted", field)
    try:
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ParamError(f"{field}: not a readable image ({type(e).__name__}: {e})", field) from None
    if w < 1 or h < 1:
        raise ParamError(f"{field}: the image is empty", field)
    return image


def decode_video(
    data: bytes, field: str, fps: float, max_frames: int, opts: MediaOptions
) -> tuple[list[Image.Image], float]:
    """Frames sampled at `fps` (at most `max_frames`, evenly spread, an even count) with PyAV, and
    the rate they represent (frames per second of video). Only the sampled frames are converted
    to images when the container states its frame count."""
    try:
        import av
    except ImportError:
        raise ParamError(f"{field}: video decoding needs PyAV (pip install av)", field) from None
    fmt = video_format(data)
    if fmt is None:  # never let FFmpeg probe: its HLS / concat demuxers open the files and URLs a playlist names
        raise ParamError(f"{field}: not a video in an accepted container (MP4 / MOV, WebM / Matroska, AVI)", field)
    try:
        with av.open(io.BytesIO(data), format=fmt) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 1.0
            total = int(stream.frames or 0)
            if stream.width * stream.height > opts.max_image_pixels:
                w, h = stream.width, stream.height
                raise ParamError(
                    f"{field}: {w}x{h} pixels per frame; at most {opts.max_image_pixels}", field
                )
            keep = set(sample_indices(total, rate, fps, max_frames)) if total else None
            frames = []
            for i, frame in enumerate(container.decode(stream)):
                if keep is None or i in keep:
                    frames.append(frame.to_image())
                if i >= MAX_DECODED_FRAMES:
                    raise ParamError(f"{field}: more than {MAX_DECODED_FRAMES} frames", field)
    except ParamError:
        raise
    except (av.error.FFmpegError, IndexError, ValueError, OSError) as e:
        raise ParamError(
            f"{field}: not a readable video ({type(e).__name__}: {e})", field
        ) from None
    if not frames:
        raise ParamError(f"{field}: the video has no frames", field)
    if keep is None:  # the container did not state its frame count: sample what was decoded
        total = len(frames)
        frames = [frames[i] for i in sample_indices(total, rate, fps, max_frames)]
    return frames, len(frames) / (total / rate)  # the sampled frames' rate


MAX_DECODED_FRAMES = 36_000  # 20 minutes at 30 fps


def video_format(data: bytes) -> str | None:
    """The FFmpeg demuxer for the container the bytes start with, among the accepted ones."""
    if data[4:8] == b"ftyp":
        return "mp4"  # FFmpeg's mov demuxer (external data references off by default)
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"  # and WebM
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    return None


def sample_indices(total: int, rate: float, fps: float, max_frames: int) -> list[int]:
    """Evenly spaced frame indices: duration * fps of them, capped at max_frames, an even count
    of at least 2 (the temporal patch takes 2 frames; one frame is repeated by the processor)."""
    want = min(max(round(total / rate * fps), 2), max_frames, total)
    want = max(2, want - want % 2) if total >= 2 else total
    return [int(i * total / want) for i in range(want)]


def media_root_ok(path: str | None) -> str | None:
    """Validate --allowed-local-media-path at start-up: an existing directory."""
    if path is None:
        return None
    if not os.path.isdir(path):
        raise ValueError(f"allowed_local_media_path: {path!r} is not a directory")
    return str(Path(path).resolve())
