"""Images and video through the real server with the official `openai` client (tiny random
Qwen2-VL): data: URLs, local files under --allowed-local-media-path, http(s) from a loopback
server behind --allow-remote-media (same bytes, same greedy answer; another image, another
answer), limits and corrupt media as 400s naming the field, streaming, the prefix cache on a
repeated image in /metrics, /v2 generate with MindIE's image sample, video, and a text model
given an image. (Parity with Hugging Face: tests/model/test_qwen2_vl.py.)
"""

from __future__ import annotations

import base64
import http.server
import io
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import uvicorn
from PIL import Image

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.multimodal.media import MediaOptions
from inflight.server.app import build_app
from inflight.server.config import ServerConfig


def _png(h: int, w: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


class _Media(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    hold = threading.Event()  # /hold.png answers once set
    held = 0  # /hold.png requests seen

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/slow.png":
            time.sleep(2.0)
        if self.path == "/hold.png":
            type(self).held += 1
            self.hold.wait(60)
            self.path = "/cat.png"
        body = self.files.get(self.path.split("?")[0])
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(engine: AsyncEngine, cfg: ServerConfig) -> tuple[uvicorn.Server, threading.Thread, str]:
    srv = uvicorn.Server(
        uvicorn.Config(build_app(engine, cfg), host="127.0.0.1", port=0, log_level="warning")
    )
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    return srv, t, f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"


class VL:
    def __init__(
        self, url: str, remote_url: str, media_dir: Path, http_base: str, engine: AsyncEngine
    ) -> None:
        self.url, self.remote_url, self.media_dir, self.http_base, self.engine = (
            url,
            remote_url,
            media_dir,
            http_base,
            engine,
        )
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

    def chat(
        self, parts: list[dict[str, Any]], client: openai.OpenAI | None = None, **kw: Any
    ) -> Any:
        return (client or self.client).chat.completions.create(
            model="vl",
            messages=[{"role": "user", "content": parts}],
            max_tokens=6,
            temperature=0,
            **kw,
        )


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory, tiny_vl_dir: Any) -> Iterator[VL]:
    path = tiny_vl_dir("qwen2_vl")
    media_dir = tmp_path_factory.mktemp("media")
    (media_dir / "cat.png").write_bytes(_png(60, 90, 0))
    (media_dir / "broken.png").write_bytes(_png(60, 90, 0)[:200])
    (tmp_path_factory.getbasetemp() / "secret.png").write_bytes(_png(60, 90, 0))
    engine = AsyncEngine(
        LLMEngine.from_args(str(path), dtype="float32", device="cpu", progress=False)
    )
    _Media.files = {
        "/cat.png": _png(60, 90, 0),
        "/big.png": _png(400, 400, 3),
        "/slow.png": _png(60, 90, 0),
        "/wide.png": _png(20, 600, 4),
    }
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    local = MediaOptions(allowed_local_media_path=str(media_dir), max_images=4)
    remote = MediaOptions(
        allow_remote_media=True,
        allowed_media_domains=("127.0.0.1",),  # the loopback media server; loopback is refused otherwise
        max_pixels_per_request=12_000,
        media_fetch_timeout_s=0.5,
        max_image_bytes=50_000,
        max_image_pixels=10_000,
    )
    s1, t1, url = _serve(engine, ServerConfig(served_model_names=("vl",), media=local))
    s2, t2, remote_url = _serve(engine, ServerConfig(served_model_names=("vl",), media=remote))
    yield VL(url, remote_url, media_dir, f"http://127.0.0.1:{httpd.server_address[1]}", engine)
    for s, t in ((s1, t1), (s2, t2)):
        s.should_exit = True
        t.join(timeout=10)
    httpd.shutdown()
    engine.shutdown()


def _image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


TEXT = {"type": "text", "text": "What is in the picture?"}


def _expect_400(fn: Any, param: str, match: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        fn()
    err = e.value.body if isinstance(e.value.body, dict) else {}
    err = err.get("error", err)
    assert err.get("param") == param, err
    assert re.search(match, err.get("message", "")), err


def test_data_url_local_file_and_http_give_the_same_answer(vl: VL) -> None:
    png = _png(60, 90, 0)
    first = vl.chat([_image_part(_data_url(png)), TEXT])
    tok = vl.engine.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, TEXT]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    img = vl.engine.process_media("image", Image.open(io.BytesIO(png)))
    # one <|image_pad|> in the template became the image's 6 rows (60x90 -> 56x84 -> 4x6 patches / 4)
    assert first.usage.prompt_tokens == len(
        tok.encode(text, add_special_tokens=False)
    ) - 1 + img.num_tokens(2)
    assert img.num_tokens(2) == 6
    assert first.choices[0].message.content
    for url in ("cat.png", str(vl.media_dir / "cat.png"), f"file://{vl.media_dir / 'cat.png'}"):
        again = vl.chat([_image_part(url), TEXT])
        assert again.choices[0].message.content == first.choices[0].message.content
    remote = openai.OpenAI(base_url=vl.remote_url + "/v1", api_key="x", max_retries=0)
    fetched = vl.chat([_image_part(vl.http_base + "/cat.png"), TEXT], client=remote)
    assert fetched.choices[0].message.content == first.choices[0].message.content
    other = vl.chat([_image_part(_data_url(_png(90, 60, 7))), TEXT])
    assert other.usage.prompt_tokens == first.usage.prompt_tokens  # same number of image tokens
    assert other.choices[0].message.content != first.choices[0].message.content


def test_media_errors_are_400s_naming_the_field(
    vl: VL, tmp_path_factory: pytest.TempPathFactory
) -> None:
    secret = tmp_path_factory.getbasetemp() / "secret.png"
    _expect_400(
        lambda: vl.chat([_image_part(str(secret)), TEXT]), "image_url", "outside the allowed"
    )
    _expect_400(
        lambda: vl.chat([_image_part("../" + secret.name), TEXT]),
        "image_url",
        "outside the allowed",
    )
    _expect_400(lambda: vl.chat([_image_part("missing.png"), TEXT]), "image_url", "no such file")
    _expect_400(
        lambda: vl.chat([_image_part("broken.png"), TEXT]), "image_url", "not a readable image"
    )
    _expect_400(
        lambda: vl.chat([_image_part("data:image/png;base64,AAAA"), TEXT]),
        "image_url",
        "not a readable image",
    )
    _expect_400(
        lambda: vl.chat([_image_part("data:image/png;base64,@@@"), TEXT]), "image_url", "base64"
    )
    _expect_400(
        lambda: vl.chat([_image_part(vl.http_base + "/cat.png"), TEXT]),
        "image_url",
        "allow-remote-media",
    )
    _expect_400(lambda: vl.chat([_image_part("cat.png")] * 5 + [TEXT]), "image_url", "at most 4")
    _expect_400(lambda: vl.chat([_image_part("cat.png")] * 21 + [TEXT]), "messages", "at most 20")
    _expect_400(
        lambda: vl.chat([{"type": "audio_url", "audio_url": {"url": "a.mp3"}}, TEXT]),
        "audio_url",
        "no audio",
    )
    _expect_400(
        lambda: vl.chat([{"type": "image_url", "image_url": {"url": "cat.png", "detail": "low"}}]),
        "image_url",
        "detail",
    )
    remote = openai.OpenAI(base_url=vl.remote_url + "/v1", api_key="x", max_retries=0)
    _expect_400(
        lambda: vl.chat([_image_part(vl.http_base + "/big.png"), TEXT], client=remote),
        "image_url",
        "at most 50000",
    )
    _expect_400(
        lambda: vl.chat([_image_part(vl.http_base + "/wide.png"), TEXT], client=remote),
        "image_url",
        "600x20 pixels; at most 10000",
    )
    _expect_400(
        lambda: vl.chat([_image_part(vl.http_base + "/nope.png"), TEXT], client=remote),
        "image_url",
        "HTTP 404",
    )
    _expect_400(
        lambda: vl.chat([_image_part(vl.http_base + "/slow.png"), TEXT], client=remote),
        "image_url",
        "timed out",
    )
    _expect_400(
        lambda: vl.chat([_image_part("cat.png"), TEXT], client=remote),
        "image_url",
        "local files are not served",
    )
    _expect_400(  # 2 x 5,400 pixels fit the request's 12,000; 3 do not (checked before decoding)
        lambda: vl.chat([_image_part(vl.http_base + "/cat.png")] * 3 + [TEXT], client=remote),
        "image_url",
        "more than 12000 pixels",
    )
    assert vl.chat([_image_part(vl.http_base + "/cat.png")] * 2 + [TEXT], client=remote).choices
    _expect_400(  # a loopback URL under another name is not the allow-listed host
        lambda: vl.chat([_image_part(vl.http_base.replace("127.0.0.1", "localhost") + "/cat.png"), TEXT], client=remote),
        "image_url",
        "allowed-media-domains",
    )
    _expect_400(
        lambda: vl.chat([_image_part(_data_url(_png(6, 6, 1), "image/jpeg")), TEXT], client=remote),
        "image_url",
        "but the data is PNG",
    )
    # the server is fine afterwards and leaked nothing
    assert vl.chat([_image_part("cat.png"), TEXT]).choices[0].message.content is not None


def test_streaming_with_an_image_and_prefix_cache_hit_in_metrics(vl: VL) -> None:
    png = _png(84, 84, 11)
    parts = [
        {"type": "text", "text": " ".join(["Look at this carefully."] * 12)},
        _image_part(_data_url(png)),
        TEXT,
    ]
    full = vl.chat(parts)

    def rate() -> float:
        m = re.search(
            r"^inflight_prefix_cache_hit_rate (\S+)$", httpx.get(vl.url + "/metrics").text, re.M
        )
        assert m
        return float(m.group(1))

    before = rate()
    chunks = list(vl.chat(parts, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert rate() > before  # the repeat's prompt blocks, image rows included, came from the cache


def test_v2_generate_with_mindie_image_sample(vl: VL) -> None:
    # MindIE's multimodal sample (reference/mindie-generate-stream.txt), with a real image path
    body = {
        "id": "a123",
        "text_input": [{"type": "text", "text": "My name is Olivier and I"}, {"type": "image_url", "image_url": str(vl.media_dir / "cat.png")}],
        "parameters": {"details": True, "do_sample": True, "max_new_tokens": 5, "repetition_penalty": 1.1, "seed": 123,
                       "temperature": 1, "top_k": 10, "top_p": 0.99, "batch_size": 100, "typical_p": 0.5,
                       "watermark": False, "perf_stat": False, "priority": 5, "timeout": 10},
    }  # fmt: skip
    r = httpx.post(vl.url + "/v2/models/vl/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["details"]["generated_tokens"] == 5
    with httpx.stream("POST", vl.url + "/v2/models/vl/generate_stream", json=body, timeout=60) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    assert len(events) >= 2
    body["text_input"][1]["image_url"] = "/etc/passwd"
    r = httpx.post(vl.url + "/v2/models/vl/generate", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "image_url"


def test_video_url_data_mp4(vl: VL) -> None:
    av = pytest.importorskip("av")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=4)
        stream.width, stream.height = 112, 84
        rng = np.random.default_rng(5)
        for _ in range(8):  # 2 s at 4 fps -> 4 frames sampled at 2 fps
            frame = av.VideoFrame.from_ndarray(
                rng.integers(0, 256, (84, 112, 3), dtype=np.uint8), format="rgb24"
            )
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    video = {"type": "video_url", "video_url": {"url": _data_url(buf.getvalue(), "video/mp4")}}
    r = vl.chat([video, TEXT])
    # 4 frames of 84x112 at the video pixel budget: 2 temporal patches of (6 x 8) patches / 4
    assert r.usage.prompt_tokens > 2 * 12
    _expect_400(lambda: vl.chat([{"type": "video_url", "video_url": {"url": _data_url(b"not a video", "video/mp4")}}, TEXT]),
                "video_url", "not a video in an accepted container")  # fmt: skip
    truncated = buf.getvalue()[:200]  # an MP4 header, then nothing: FFmpeg's error, a 400
    _expect_400(lambda: vl.chat([{"type": "video_url", "video_url": {"url": _data_url(truncated, "video/mp4")}}, TEXT]),
                "video_url", "not a readable video|no frames")  # fmt: skip


def test_text_model_refuses_images(server: Any) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="not supported by this model"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [_image_part("data:,x")]}],
            max_tokens=2,
        )
    with pytest.raises(openai.BadRequestError, match="no audio"):
        client.chat.completions.create(
            model="tiny",
            messages=[
                {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "x"}}]}
            ],
            max_tokens=2,
        )


def test_media_flags(tmp_path: Path) -> None:
    import argparse

    from inflight.server import options

    def parse(argv: list[str]) -> options.ServeOptions:
        p = argparse.ArgumentParser()
        options.add_arguments(p)
        return options.load(p.parse_args(argv))

    o = parse(["--allowed-local-media-path", str(tmp_path), "--allow-remote-media", "--media-fetch-timeout", "2.5",
               "--video-fps", "1", "--max-images-per-request", "3", "--mm-cache-size", "0"])  # fmt: skip
    m = options.media_options(o)
    assert m.allowed_local_media_path == str(tmp_path.resolve()) and m.allow_remote_media
    assert (m.media_fetch_timeout_s, m.video_fps, m.max_images) == (2.5, 1.0, 3)
    assert (
        o.engine.mm_cache_size == 0
        and options.media_options(parse([])).allowed_local_media_path is None
    )
    for bad in (
        ["--allowed-local-media-path", str(tmp_path / "nope")],
        ["--max-images-per-request", "21"],
    ):
        with pytest.raises(SystemExit):
            parse(bad)


def test_slow_media_fetches_do_not_hold_up_grammar_compiles(vl: VL) -> None:
    """Eight image fetches held by a slow server fill the media pool; a json_object request (its
    grammar compiles in its own threads) still completes while they wait."""
    from concurrent.futures import ThreadPoolExecutor

    opts = MediaOptions(allow_remote_media=True, allowed_media_domains=("127.0.0.1",), media_fetch_timeout_s=60)
    srv, t, url = _serve(vl.engine, ServerConfig(served_model_names=("vl",), media=opts))
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    _Media.hold.clear()
    _Media.held = 0
    try:
        with ThreadPoolExecutor(8) as ex:
            slow = [ex.submit(vl.chat, [_image_part(vl.http_base + "/hold.png"), TEXT], client) for _ in range(8)]
            deadline = time.time() + 30
            while _Media.held < 4 and time.time() < deadline:  # the media pool's 4 threads are all waiting
                time.sleep(0.05)
            assert _Media.held >= 4
            r = client.chat.completions.create(
                model="vl", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                response_format={"type": "json_object"}, timeout=30,
            )  # fmt: skip
            assert r.choices[0].finish_reason in ("stop", "length")
            assert not any(f.done() for f in slow)  # answered while the fetches were still held
            _Media.hold.set()
            for f in slow:
                assert f.result().choices
    finally:
        _Media.hold.set()
        srv.should_exit = True
        t.join(timeout=10)
