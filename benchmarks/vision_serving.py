"""Vision-language serving: TTFT and throughput of 16 concurrent chat requests, each with one
448x448 image, with and without the vision-encoder cache (issue: images in chat and generate).

Shape (random weights, built here; stated with the results): a Qwen2-VL vision tower at its real
width (1280, 16 heads, patch 14, merge 2) but --vision-depth blocks instead of 32, in front of a
Qwen2.5-0.5B-shaped decoder (hidden 896, 14 heads / 2 KV heads, intermediate 4864) of
--text-layers layers and the tiny test vocabulary; the real pixel budget, so a 448x448 image is
1024 patches -> 256 image tokens. Runs the engine in-process (LLM.chat), the 16 requests
submitted together; TTFT is each request's arrival -> first token.

Scenarios:
  distinct     16 different images (the encoder runs 16 times whatever the cache)
  same+cache   16 questions about one image (question first, so the prefix cache cannot share
               the image's KV): the encoder runs once, the cache serves the other 15
  same+nocache the same with --mm-cache-size 0: the encoder runs for every request

    python benchmarks/vision_serving.py --vision-depth 2 --text-layers 4 --output-len 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight import LLM, SamplingParams  # noqa: E402
from inflight.testing import make_tiny_vl_checkpoint  # noqa: E402


def _image(seed: int, size: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def run(llm: LLM, images: list[Image.Image], output_len: int) -> dict[str, float]:
    convs = [
        [{"role": "user", "content": [{"type": "text", "text": f"Question {i}: what is in this picture?"},
                                      {"type": "image", "image": img}]}]
        for i, img in enumerate(images)
    ]  # fmt: skip
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    runner = llm.engine.runner
    encoded = runner.vision.num_encoded if runner is not None and runner.vision is not None else 0
    start = time.perf_counter()
    outs = llm.chat(convs, params, use_tqdm=False)
    wall = time.perf_counter() - start
    ttft = sorted(o.metrics.time_to_first_token_ms or 0.0 for o in outs)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if runner is not None and runner.vision is not None:
        encoded = runner.vision.num_encoded - encoded
    return {
        "ttft_p50_ms": statistics.median(ttft),
        "ttft_max_ms": ttft[-1],
        "output_tok_s": tokens / wall,
        "wall_s": wall,
        "encoder_runs": float(encoded),
        "image_tokens": float(len(outs[0].prompt_token_ids)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--vision-depth", type=int, default=2)
    p.add_argument("--text-layers", type=int, default=4)
    p.add_argument("--output-len", type=int, default=16)
    args = p.parse_args()
    path = make_tiny_vl_checkpoint(
        "qwen2_vl", tempfile.mkdtemp(prefix="inflight-vl-"),
        text={"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": args.text_layers,
              "num_attention_heads": 14, "num_key_value_heads": 2, "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}},
        vision={"depth": args.vision_depth, "embed_dim": 1280, "hidden_size": 896, "mlp_ratio": 4, "num_heads": 16},
        preprocessor={"max_pixels": 28 * 28 * 1280},
    )  # fmt: skip
    distinct = [_image(i, args.image_size) for i in range(args.requests)]
    same = [_image(0, args.image_size)] * args.requests
    common = {"dtype": "float32", "progress": False, "max_num_seqs": args.requests}
    print(f"{args.requests} requests x 1 image {args.image_size}x{args.image_size}, {args.output_len} output tokens; "
          f"vision depth {args.vision_depth} x 1280, decoder {args.text_layers} x 896")  # fmt: skip
    for name, images, cache in (("distinct", distinct, 256), ("same+cache", same, 256), ("same+nocache", same, 0)):
        llm = LLM(model=str(path), mm_cache_size=cache, **common)
        run(llm, [_image(10_000, args.image_size)], 2)  # warm-up on an image the measured run never sends
        r = run(llm, images, args.output_len)
        print(f"{name:13s} TTFT p50 {r['ttft_p50_ms']:8.0f} ms  max {r['ttft_max_ms']:8.0f} ms  "
              f"output {r['output_tok_s']:7.1f} tok/s  wall {r['wall_s']:6.1f} s  encoder runs {r['encoder_runs']:.0f}  "
              f"prompt tokens {r['image_tokens']:.0f}")  # fmt: skip
        llm.engine.shutdown()


if __name__ == "__main__":
    main()
