"""Remote media never reaches the host: schemes, credentials, private / loopback / link-local /
multicast destinations (refused before any connection: only literal addresses and localhost
are used, nothing leaves this machine), redirects re-checked and bounded, one deadline per item,
and only the allowed image formats, agreeing with their declared type.

Fetches go to a loopback server of the test's own, named in the allow-list."""

from __future__ import annotations

import http.server
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from inflight.errors import ParamError
from inflight.multimodal.fetch import fetch
from inflight.multimodal.media import MediaOptions, decode_video, open_image


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(buf, format=fmt)
    return buf.getvalue()


PNG = _image("PNG")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        routes = {
            "/img.png": lambda: self._send(200, PNG, "image/png"),
            "/to-ftp": lambda: self._redirect("ftp://127.0.0.1/x.png"),
            "/to-private": lambda: self._redirect("http://10.1.2.3/x.png"),
            "/to-metadata": lambda: self._redirect("http://169.254.169.254/latest/meta-data"),
            "/to-img": lambda: self._redirect("/img.png"),
            "/loop": lambda: self._redirect("/loop"),
            "/trickle": self._trickle,
        }
        routes.get(self.path, lambda: self._send(404, b"", "text/plain"))()

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str) -> None:
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _trickle(self) -> None:
        """1 byte per 0.1 s: each read is quick, the whole is not (a per-read timeout never fires)."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        try:
            for b in PNG[:60]:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


LOOPBACK = ("127.0.0.1",)


def _get(url: str, allowed: tuple[str, ...] = LOOPBACK, timeout: float = 5.0) -> Any:
    return fetch(url, "image_url", 1 << 20, timeout, allowed)


def _refused(url: str, words: str, allowed: tuple[str, ...] = LOOPBACK, timeout: float = 5.0) -> None:
    with pytest.raises(ParamError) as e:
        _get(url, allowed, timeout)
    assert e.value.param == "image_url" and words in str(e.value), str(e.value)


def test_allow_listed_loopback_fetch_and_relative_redirect(base: str) -> None:
    got = _get(base + "/img.png")
    assert got.data == PNG and got.content_type == "image/png"
    assert _get(base + "/to-img").data == PNG


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/x.png", "http://localhost:9/x.png", "http://[::1]:9/x.png", "http://10.0.0.7/x.png",
        "http://192.168.1.1/x.png", "http://172.16.0.1/x.png", "http://169.254.169.254/latest/meta-data",
        "http://100.64.0.1/x.png", "http://224.0.0.1/x.png", "http://0.0.0.0:9/x.png", "http://[::ffff:127.0.0.1]:9/x",
        "http://[fe80::1]/x.png", "http://[fd00::1]/x.png", "https://10.0.0.7/x.png",
    ],
)  # fmt: skip
def test_private_destinations_refused_before_connecting(url: str) -> None:
    _refused(url, "--allowed-media-domains", allowed=())


def test_schemes_credentials_and_allow_list(base: str) -> None:
    _refused("ftp://127.0.0.1/x.png", "only http(s)")
    _refused(base.replace("http://", "http://user:pw@") + "/img.png", "credentials")
    _refused(base + "/img.png", "not in --allowed-media-domains", allowed=("media.example",))


def test_redirects_are_rechecked_and_bounded(base: str) -> None:
    _refused(base + "/to-ftp", "only http(s)")
    _refused(base + "/to-private", "not in --allowed-media-domains")
    _refused(base + "/to-metadata", "not in --allowed-media-domains")
    _refused(base + "/loop", "more than 5 redirects")


def test_the_timeout_is_one_deadline_not_per_read(base: str) -> None:
    start = time.monotonic()
    _refused(base + "/trickle", "timed out", timeout=1.0)
    assert time.monotonic() - start < 5.0  # 60 bytes at 0.1 s each would take 6 s


def test_only_allowed_formats_agreeing_with_their_type() -> None:
    for fmt, kind in (("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif"), ("BMP", "image/bmp")):
        assert open_image(_image(fmt), "image_url", kind).format == fmt
        assert open_image(_image(fmt), "image_url", None).format == fmt
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n"
    for data, kind, words in (
        (eps, None, "accepted format"),
        (_image("TIFF"), None, "accepted format"),
        (_image("PNG"), "image/jpeg", "declared as 'image/jpeg' but the data is PNG"),
        (_image("PNG"), "text/html", "not an image"),
    ):
        with pytest.raises(ParamError) as e:
            open_image(data, "image_url", kind)
        assert e.value.param == "image_url" and words in str(e.value), str(e.value)


def test_videos_only_in_accepted_containers() -> None:
    """FFmpeg never probes: an HLS or concat playlist would make it open the URLs and files it
    names (SSRF, local file reads)."""
    for data in (b"#EXTM3U\n#EXTINF:1,\nhttp://169.254.169.254/latest/meta-data\n", b"ffconcat version 1.0\nfile /etc/passwd\n"):
        with pytest.raises(ParamError) as e:
            decode_video(data, "video_url", 2.0, 8, MediaOptions())
        assert e.value.param == "video_url" and "accepted container" in str(e.value)
