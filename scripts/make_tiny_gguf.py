"""Write the bundled demo model (or any small HF checkpoint) as a GGUF file to try quantized serving:

    python scripts/make_tiny_gguf.py /tmp/demo-q8_0.gguf                 # Q8_0
    python scripts/make_tiny_gguf.py /tmp/demo-q4_k_m.gguf --type q4_k_m # Q4_K / Q6_K mix
    inflight serve --model /tmp/demo-q8_0.gguf

The file is written as llama.cpp's converter writes one (metadata, tokenizer.ggml.*, chat template,
q/k rows of llama-arch models permuted); llama.cpp's own tools read it too. A few MB, in seconds.
Types: f16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m (see docs/QUANTIZATION.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight.testing.gguf import make_tiny_gguf  # noqa: E402

TYPES = ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the .gguf file to write")
    p.add_argument("--type", choices=TYPES, default="q8_0", help="weight type of the 2-D weights (default: q8_0)")
    p.add_argument("--model", help="HF checkpoint directory (default: the bundled demo model)")
    args = p.parse_args()
    print(make_tiny_gguf(args.out, args.type, args.model))


if __name__ == "__main__":
    main()
