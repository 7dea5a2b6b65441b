"""`inflight bench`: a serving benchmark client (shaped like `vllm bench serve`).

dataset.py   prompts: synthetic token-exact random prompts, or a JSONL file
backends.py  one request body + stream parser per API (completions, chat, generate)
client.py    load generation (Poisson arrivals, concurrency cap) over aiohttp streams
offline.py   the same workload through `inflight.LLM`, no HTTP
metrics.py   per-request results -> throughput and TTFT / TPOT / ITL / E2E statistics
report.py    the result table, --result-json;  plot.py: --plot (matplotlib, lazily)
cli.py       the arguments and `run`; stdlib-only at import so `inflight serve` stays fast
"""
