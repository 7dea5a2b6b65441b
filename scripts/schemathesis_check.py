#!/usr/bin/env python
"""Run schemathesis with every check against /openapi.json of a real server on a tiny model.

    pip install schemathesis        # not a suite dependency (a run takes minutes)
    python scripts/schemathesis_check.py --max-examples 25

Starts `inflight serve` on a tiny random qwen2 checkpoint on a loopback port, runs
`schemathesis run URL/openapi.json --checks all`, prints its report and exits with its status.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-examples", type=int, default=25)
    p.add_argument("--api-key", help="start the server with this key (checks auth too)")
    p.add_argument("extra", nargs="*", help="after --: more schemathesis arguments")
    args = p.parse_args()
    from inflight.testing import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_checkpoint("qwen2", Path(tmp) / "tiny")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        keys = ["--api-key", args.api_key] if args.api_key else []
        log = (Path(tmp) / "server.log").open("wb")
        server = subprocess.Popen([sys.executable, "-m", "inflight.cli", "serve", "--model", str(model), "--dtype", "float32",
                                   "--port", str(port), "--log-level", "warning", *keys], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 600  # imports and the model take minutes on a loaded 2-core machine
            while True:
                try:
                    if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
                if server.poll() is not None or time.time() > deadline:
                    print((Path(tmp) / "server.log").read_text()[-3000:])
                    return 1
            auth = ["-H", f"Authorization: Bearer {args.api_key}"] if args.api_key else []
            cmd = ["schemathesis", "run", url + "/openapi.json", "--checks", "all", "--workers", "1",
                   "--max-examples", str(args.max_examples), "--request-timeout", "120",
                   # a tiny model on a shared 2-core machine: a 500-token chat takes 10-20 s; not a latency test
                   "--max-response-time", "120", *auth, *args.extra]  # fmt: skip
            return subprocess.run(cmd, env={**os.environ, "NO_COLOR": "1"}).returncode
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
