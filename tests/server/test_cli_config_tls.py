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


def test_lora_modules_in_a_config_file_object_or_list(tmp_path: Path) -> None:
    """The documented form {"name": "path"} (docs/SERVING.md) and the list form ["name=path"] read the same."""
    for i, value in enumerate(({"la": "/a", "lb": "/b"}, ["la=/a", "lb=/b"], {"loraModules": ["la=/a", "lb=/b"]})):
        cfg = tmp_path / f"c{i}.json"
        cfg.write_text(json.dumps(value if isinstance(value, dict) and "loraModules" in value else {"lora_modules": value}))
        o = _parse(["--config", str(cfg)])
        assert options.lora_modules(o) == [("la", "/a"), ("lb", "/b")] and o.engine.enable_lora, value


def test_decoder_embeddings_are_on_for_the_demo_model(tmp_path: Path) -> None:
    def pooling(*argv: str) -> str | None:
        return options.server_config(_parse(list(argv)), ("m",)).embedding_pooling

    assert pooling() == "last"  # no --model: the bundled demo model shows every feature
    assert pooling("--embedding-pooling", "none") is None and pooling("--embedding-pooling", "mean") == "mean"
    assert pooling("--model", str(tmp_path)) is None  # a model of one's own: as asked


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


MINDIE_CONFIG = {  # MindIE Server's shipped config.json (mindie-service/conf/config.json), all four sections
    "Version": "1.0.0",
    "LogConfig": {"logLevel": "Warning", "logFileSize": 20, "logFileNum": 20, "logPath": "logs/mindservice.log"},
    "ServerConfig": {
        "ipAddress": "127.0.0.3", "managementIpAddress": "127.0.0.2", "port": 1025, "managementPort": 1026,
        "metricsPort": 1027, "allowAllZeroIpListening": False, "maxLinkNum": 300, "httpsEnabled": False,
        "fullTextEnabled": False, "tlsCaPath": "security/ca/", "tlsCaFile": ["ca.pem"], "tlsCert": "security/certs/server.pem",
        "tlsPk": "security/keys/server.key.pem", "tlsPkPwd": "security/pass/key_pwd.txt", "tlsCrlPath": "security/certs/",
        "tlsCrlFiles": ["server_crl.pem"], "managementTlsCaFile": ["management_ca.pem"],
        "managementTlsCert": "security/certs/management/server.pem", "managementTlsPk": "security/keys/management/server.key.pem",
        "managementTlsPkPwd": "security/pass/management/key_pwd.txt", "managementTlsCrlPath": "security/management/certs/",
        "managementTlsCrlFiles": ["server_crl.pem"], "kmcKsfMaster": "tools/pmt/master/ksfa", "kmcKsfStandby": "tools/pmt/standby/ksfb",
        "inferMode": "standard", "interCommTLSEnabled": True, "interCommPort": 1121, "interCommTlsCaPath": "security/grpc/ca/",
        "interCommTlsCaFiles": ["ca.pem"], "interCommTlsCert": "security/grpc/certs/server.pem",
        "interCommPk": "security/grpc/keys/server.key.pem", "interCommPkPwd": "security/grpc/pass/key_pwd.txt",
        "interCommTlsCrlPath": "security/grpc/certs/", "interCommTlsCrlFiles": ["server_crl.pem"], "openAiSupport": "vllm",
        "tokenTimeout": 600, "e2eTimeout": 600, "distDPServerEnabled": False,
    },
    "BackendConfig": {
        "backendName": "mindieservice_llm_engine", "modelInstanceNumber": 1, "npuDeviceIds": [[0, 1, 2, 3]],
        "tokenizerProcessNumber": 8, "multiNodesInferEnabled": False, "multiNodesInferPort": 1120,
        "interNodeTLSEnabled": True, "interNodeTlsCaPath": "security/grpc/ca/", "interNodeTlsCaFiles": ["ca.pem"],
        "interNodeTlsCert": "security/grpc/certs/server.pem", "interNodeTlsPk": "security/grpc/keys/server.key.pem",
        "interNodeTlsPkPwd": "security/grpc/pass/mindie_server_key_pwd.txt", "interNodeTlsCrlPath": "security/grpc/certs/",
        "interNodeTlsCrlFiles": ["server_crl.pem"], "interNodeKmcKsfMaster": "tools/pmt/master/ksfa",
        "interNodeKmcKsfStandby": "tools/pmt/standby/ksfb",
        "ModelDeployConfig": {
            "maxSeqLen": 2560, "maxInputTokenLen": 2048, "truncation": False,
            "ModelConfig": [{
                "modelInstanceType": "Standard", "modelName": "llama3-8b", "modelWeightPath": "/data/Meta-Llama-3-8B",
                "worldSize": 4, "cpuMemSize": 5, "npuMemSize": -1, "backendType": "atb", "trustRemoteCode": False,
            }],
        },
        "ScheduleConfig": {
            "templateType": "Standard", "templateName": "Standard_LLM", "cacheBlockSize": 128, "maxPrefillBatchSize": 50,
            "maxPrefillTokens": 8192, "prefillTimeMsPerReq": 150, "prefillPolicyType": 0, "decodeTimeMsPerReq": 50,
            "decodePolicyType": 0, "maxBatchSize": 200, "maxIterTimes": 512, "maxPreemptCount": 0,
            "supportSelectBatch": False, "maxQueueDelayMicroseconds": 5000,
        },
    },
}  # fmt: skip


def test_a_mindie_config_file_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every documented MindIE key: mapped to its option, or named in one warning and ignored;
    a key in neither stays an error naming it."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(MINDIE_CONFIG))
    with caplog.at_level("WARNING", logger="inflight.server"):
        o = _parse(["--config", str(cfg)])
    e = o.engine
    assert (o.host, o.port, o.max_connections, o.full_text_enabled, o.log_level) == ("127.0.0.3", 1025, 300, False, "warning")
    assert (e.model, o.served_model_name, e.max_model_len, e.max_input_tokens) == ("/data/Meta-Llama-3-8B", ["llama3-8b"], 2560, 2048)
    assert (e.block_size, e.max_num_batched_tokens, e.max_num_seqs, e.max_iter_times) == (128, 8192, 200, 512)
    assert e.tensor_parallel_size == 1 and o.ssl_certfile is None  # NPU layout and disabled HTTPS: not taken
    (warning,) = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    for key in ("npuDeviceIds", "multiNodesInferEnabled", "worldSize", "managementPort", "interCommTlsCert", "tlsCert", "openAiSupport"):
        assert key in warning
    assert "Version" not in warning and "maxSeqLen" not in warning
    # httpsEnabled: MindIE's certificate files, relative to the config's directory (mutual TLS with its CA)
    https = json.loads(json.dumps(MINDIE_CONFIG))
    https["ServerConfig"]["httpsEnabled"] = True
    cfg.write_text(json.dumps(https))
    o = _parse(["--config", str(cfg)])
    assert (o.ssl_certfile, o.ssl_keyfile, o.ssl_ca_certs) == (
        str(tmp_path / "security/certs/server.pem"), str(tmp_path / "security/keys/server.key.pem"), str(tmp_path / "security/ca/ca.pem"))
    for bad, name in ((["ServerConfig", "noSuchKey"], "noSuchKey"), (["BackendConfig", "ModelDeployConfig", "ModelConfig"], "ModelConfig"),
                      (["ServerConfig", "maxLinkNum"], "maxLinkNum"), (["LogConfig", "logLevel"], "logLevel")):
        broken = json.loads(json.dumps(MINDIE_CONFIG))
        section = broken
        for k in bad[:-1]:
            section = section[k]
        section[bad[-1]] = {"ModelConfig": [{}, {}], "maxLinkNum": "many", "logLevel": "Loud"}.get(name, 1)  # two models, bad values, an unknown key
        cfg.write_text(json.dumps(broken))
        with pytest.raises(options.ConfigError, match=name):
            options._read_config(cfg)


def test_the_dtype_line_is_logged_once_per_start(caplog: pytest.LogCaptureFixture) -> None:
    """`inflight serve` builds the engine config twice (the start-up check, then the load): the
    dtype decision it logs on a CPU without native bf16 is said once, by the load."""
    import logging

    from inflight import platform
    from inflight.engine.args import EngineArgs
    from inflight.server import serve

    with platform.forced("avx2"), caplog.at_level(logging.INFO, logger="inflight.config"):
        args = EngineArgs()  # the bf16 demo model: served in float32 on this profile
        serve.check_engine_config(args)
        assert "served in float32" not in caplog.text
        args.create_engine_config()  # what LLMEngine.from_engine_args does
    assert caplog.text.count("served in float32") == 1
