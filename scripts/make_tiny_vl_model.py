"""Write a tiny random-weight Qwen2-VL (or Qwen2.5-VL) checkpoint to serve and try the image API:

    python scripts/make_tiny_vl_model.py /tmp/tiny-qwen2-vl [--arch qwen2_5_vl]
    inflight serve --model /tmp/tiny-qwen2-vl --allowed-local-media-path ~/Pictures

Random weights: the answers are gibberish, but every path (chat image parts, /v2 image parts,
video, limits, the encoder and prefix caches) runs as it does for a real checkpoint. A few MB;
built in seconds from the real configs' layout (see inflight.testing.make_tiny_vl_checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight.testing import VL_ARCHS, make_tiny_vl_checkpoint  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--arch", choices=VL_ARCHS, default="qwen2_vl")
    args = p.parse_args()
    print(make_tiny_vl_checkpoint(args.arch, args.out_dir))


if __name__ == "__main__":
    main()
