"""`inflight serve` as a user runs it: config file + flags, API keys, HTTPS and mutual TLS."""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inflight import LLM, ParamError, SamplingParams
from inflight.server import options


def _parse(argv: list[str]) -> options.ServeOptions:
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    return options.load(p.parse_args(argv))


def test_config_file_then_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "ServerConfig": {"ipAddress": "127.0.0.2", "port": 9000, "fullTextEnabled": True},
        "BackendConfig": {"maxSeqLen": 256, "maxIterTimes": 64, "maxBatchSize": 8},
        "served_model_name": "alpha", "api_keys": ["k"],
    }))  # fmt: skip
    o = _parse(["--config", str(cfg), "--port", "9100", "--max-num-seqs", "4"])
    assert (o.host, o.port, o.full_text_enabled, o.engine.max_model_len, o.engine.max_iter_times) == ("127.0.0.2", 9100, True, 256, 64)
    assert o.engine.max_num_seqs == 4 and o.served_model_name == ["alpha"] and o.api_key == ["k"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no_such_option": 1}))
    with pytest.raises(SystemExit):
        _parse(["--config", str(bad)])


def test_input_and_iteration_limits(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model=str(tiny_model_dir("llama")), dtype="float32", device="cpu", progress=False, max_input_tokens=8, max_iter_times=3)
    with pytest.raises(ParamError) as e:
        llm.generate([list(range(3, 12))], use_tqdm=False)
    assert e.value.param == "prompt"
    out = llm.generate([list(range(3, 10))], SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"


def _cert(tmp: Path, name: str, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    key, crt = tmp / f"{name}.key", tmp / f"{name}.crt"
    subj = f"/CN={'127.0.0.1' if name == 'server' else name}"
    if ca is None:
        cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", subj,
               "-keyout", str(key), "-out", str(crt), "-addext", "subjectAltName=IP:127.0.0.1"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    else:
        csr = tmp / f"{name}.csr"
        subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout", str(key), "-out", str(csr)], check=True, capture_output=True)
        ext = tmp / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\n")  # clients verify the IP against the SAN
        subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
                        "-CAcreateserial", "-days", "1", "-out", str(crt), "-extfile", str(ext)], check=True, capture_output=True)  # fmt: skip
    return key, crt


def _serve(args: list[str], scheme: str, port: int, verify, log: Path) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    # logs go to a file: an unread pipe fills up and blocks the server
    proc = subprocess.Popen([sys.executable, "-m", "inflight.cli", "serve", "--port", str(port), *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"{scheme}://127.0.0.1:{port}/health", verify=verify, timeout=2).status_code == 200:
                return proc
        except (httpx.HTTPError, ssl.SSLError):
            time.sleep(0.3)
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
    proc.kill()
    raise AssertionError("server did not start:\n" + log.read_text()[-3000:])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_https_with_config_file_and_api_key(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    key, crt = _cert(tmp_path, "server")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": str(tiny_model_dir("qwen2")), "served_model_name": ["tiny", "t2"], "dtype": "float32"}))
    port = _port()
    proc = _serve(["--config", str(cfg), "--api-key", "secret", "--ssl-certfile", str(crt), "--ssl-keyfile", str(key)], "https", port, ssl.create_default_context(cafile=str(crt)), tmp_path / "serve.log")
    try:
        url = f"https://127.0.0.1:{port}"
        body = {"model": "t2", "prompt": "hello", "max_tokens": 3}
        assert httpx.post(url + "/v1/completions", json=body, verify=ssl.create_default_context(cafile=str(crt)), timeout=60).status_code == 401
        r = httpx.post(url + "/v1/completions", json=body, verify=ssl.create_default_context(cafile=str(crt)), headers={"Authorization": "Bearer secret"}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3 and r.json()["model"] == "tiny"
        with pytest.raises(httpx.TransportError):  # plain HTTP is not served: the TLS port drops it
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_mutual_tls_requires_a_client_certificate(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca = _cert(tmp_path, "ca")
    skey, scrt = _cert(tmp_path, "server", ca)
    ckey, ccrt = _cert(tmp_path, "client", ca)
    port = _port()
    verify = ssl.create_default_context(cafile=str(ca[1]))
    verify_with_cert = ssl.create_default_context(cafile=str(ca[1]))
    verify_with_cert.load_cert_chain(str(ccrt), str(ckey))
    proc = _serve(["--model", str(tiny_model_dir("qwen2")), "--dtype", "float32", "--ssl-certfile", str(scrt),
                   "--ssl-keyfile", str(skey), "--ssl-ca-certs", str(ca[1])], "https", port, verify_with_cert, tmp_path / "serve.log")  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}/health"
        assert httpx.get(url, verify=verify_with_cert, timeout=10).status_code == 200
        with pytest.raises((httpx.HTTPError, ssl.SSLError)):
            httpx.get(url, verify=verify, timeout=10)  # no client certificate: the handshake fails
    finally:
        proc.terminate()
        proc.wait(timeout=30)
