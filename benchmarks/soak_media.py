"""The soak's loopback media server (benchmarks/soak.py --vision): good images, and the hostile
sources the server must refuse with a 400 (a trickling body, redirects to a private address and
to ftp, an EPS declared as PNG, a redirect loop). Only 127.0.0.1 is ever connected to: the
private address is refused by the server under test before any connection."""

from __future__ import annotations

import http.server
import io
import random
import threading
import time
from typing import Any

import httpx
from PIL import Image

# path -> weight in the remote_media kind's draw
PATHS = {"/img/0.png": 4, "/img/1.png": 4, "/img/2.png": 4, "/to-img": 2, "/to-private": 1, "/to-ftp": 1, "/eps": 1,
         "/loop": 1, "/slow": 1, "/missing": 1}  # fmt: skip


def _png(seed: int) -> bytes:
    rng = random.Random(seed)
    size = (28 + 8 * seed, 28 + 4 * seed)
    img = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))  # type: ignore[arg-type]
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    images = {f"/img/{i}.png": _png(i) for i in range(3)}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        redirects = {"/to-img": "/img/1.png", "/to-private": "http://10.0.0.1/x.png", "/to-ftp": "ftp://127.0.0.1/x.png",
                     "/loop": "/loop"}  # fmt: skip
        if self.path in self.images:
            self._send(self.images[self.path], "image/png")
        elif self.path in redirects:
            self.send_response(302)
            self.send_header("Location", redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/eps":
            self._send(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n", "image/png")
        elif self.path == "/slow":  # a byte every 0.5 s: past the server's fetch deadline
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for b in self.images["/img/0.png"][:100]:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
        else:
            self._send(b"", "text/plain", 404)

    def _send(self, body: bytes, kind: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class MediaServer:
    def __init__(self) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()


async def remote_media(c: httpx.AsyncClient, rng: random.Random, base: str, model: str) -> int:
    """A chat with 1-3 images from the media server: 200 for good ones, 400 for the rest."""
    paths = rng.choices(list(PATHS), weights=list(PATHS.values()), k=rng.randint(1, 3))
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": base + p}} for p in paths]
    body = {"model": model, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}],
            "max_tokens": rng.randint(1, 8), "temperature": 0}  # fmt: skip
    return (await c.post("/v1/chat/completions", json=body)).status_code
