"""http(s) media fetches (`--allow-remote-media`): the server fetches what a client names, so
nothing it fetches may reach the host's own network.

Rules, checked on the first URL and again on every redirect (at most MAX_REDIRECTS):
- http and https only; no credentials in the URL;
- the host resolves (getaddrinfo) to public addresses only: loopback, private, link-local,
  shared (100.64/10), multicast, reserved and unspecified addresses are refused unless the host
  is named in `--allowed-media-domains` (vLLM's flag; when set, only those hosts are fetched);
- the connection goes to the address that was checked (the host name is kept for the Host
  header and TLS), so a DNS answer that changes between check and connect (rebinding) never
  reaches an address that was not checked;
- one deadline per item (`--media-fetch-timeout`) for connect, redirects, headers and body
  together: a watchdog shuts the socket at the deadline, so a server trickling a byte at a time
  cannot hold a fetch past it.
Every refusal is a ParamError naming the field, raised before any connection is made.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from inflight.errors import ParamError

MAX_REDIRECTS = 5  # as browsers' lower bound; each hop re-checked
REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 << 10


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str | None  # the response's declared MIME type, lower-case, no parameters


@dataclass(frozen=True)
class _Target:
    https: bool
    host: str
    port: int
    path: str  # path + query, as sent
    address: str  # the checked IP the connection goes to


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str, field: str, allowed_domains: tuple[str, ...]) -> _Target:
    """The URL's target, or a ParamError if any rule refuses it (no connection is made)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ParamError(f"{field}: not a valid URL ({e})", field) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ParamError(f"{field}: only http(s) URLs are fetched, not {scheme or 'no scheme'}:", field)
    if "@" in parts.netloc:
        raise ParamError(f"{field}: URLs with credentials (user:password@) are refused", field)
    host = (parts.hostname or "").lower()
    if not host:
        raise ParamError(f"{field}: the URL names no host", field)
    listed = host in allowed_domains
    if allowed_domains and not listed:
        raise ParamError(f"{field}: {host!r} is not in --allowed-media-domains", field)
    port = port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ParamError(f"{field}: cannot resolve {host!r} ({e})", field) from None
    addresses = [str(info[4][0]).split("%")[0] for info in infos]
    for address in addresses:
        if not listed and not _public(ipaddress.ip_address(address)):
            raise ParamError(
                f"{field}: {host!r} resolves to {address}, a loopback / private / link-local / multicast address; "
                "name the host in --allowed-media-domains to fetch from it",
                field,
            )
    if not addresses:
        raise ParamError(f"{field}: cannot resolve {host!r}", field)
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return _Target(scheme == "https", host, port, path, addresses[0])


def fetch(url: str, field: str, limit: int, timeout_s: float, allowed_domains: tuple[str, ...]) -> Fetched:
    """GET `url` under the rules above: at most `limit` bytes, within `timeout_s` in all."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        target = check_url(url, field, allowed_domains)
        status, location, fetched = _get(target, field, limit, deadline, timeout_s)
        if status in REDIRECTS:
            if not location:
                raise ParamError(f"{field}: HTTP {status} without a Location", field)
            url = urllib.parse.urljoin(url, location)
            continue
        if status != 200:
            raise ParamError(f"{field}: fetching the URL failed: HTTP {status}", field)
        assert fetched is not None
        return fetched
    raise ParamError(f"{field}: more than {MAX_REDIRECTS} redirects", field)


def _get(target: _Target, field: str, limit: int, deadline: float, timeout_s: float) -> tuple[int, str | None, Fetched | None]:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ParamError(f"{field}: fetching the URL timed out after {timeout_s:g} s", field)
    cls = http.client.HTTPSConnection if target.https else http.client.HTTPConnection
    conn: Any = cls(target.host, target.port, timeout=remaining)
    conn._create_connection = lambda _addr, t, src: socket.create_connection((target.address, target.port), t, src)
    watchdog = threading.Timer(remaining, _shut, (conn,))
    watchdog.start()
    try:
        conn.request("GET", target.path, headers={"User-Agent": "inflight", "Accept": "image/*, video/*"})
        resp = conn.getresponse()
        if resp.status in REDIRECTS:
            return resp.status, resp.getheader("Location"), None
        if resp.status != 200:
            return resp.status, None, None
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ParamError(f"{field}: {length} bytes; at most {limit} are accepted", field)
        chunks, size = [], 0
        while size <= limit:
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                break
        if time.monotonic() > deadline:
            raise ParamError(f"{field}: fetching the URL timed out after {timeout_s:g} s", field)
        kind = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower() or None
        return 200, None, Fetched(b"".join(chunks)[: limit + 1], kind)
    except ParamError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:
        if time.monotonic() >= deadline:
            raise ParamError(f"{field}: fetching the URL timed out after {timeout_s:g} s", field) from None
        raise ParamError(f"{field}: fetching the URL failed: {e}", field) from None
    finally:
        watchdog.cancel()
        conn.close()


def _shut(conn: Any) -> None:
    """The deadline: wake a read blocked on a slow server (the fetching thread sees EOF or an error)."""
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
