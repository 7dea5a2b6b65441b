"""A server process started by a test or a benchmark (`inflight serve` on loopback): waiting for it
to answer /health, and stopping it."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 180) -> None:
    """Return once `url`/health answers 200; AssertionError with the log's tail if the process exits
    or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no /health within {timeout_s:g} s:\n{log.read_text()[-3000:]}"
        try:
            with NO_PROXY.open(f"{url}/health", timeout=2.0) as resp:
                if resp.status == 200:
                    return
        except OSError:  # refused while starting, or an HTTP error status (503 while loading)
            pass
        time.sleep(0.3)


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; its exit code."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
