"""Configuration as data: one tree of frozen dataclasses, validated at construction.

`EngineConfig` composes the model, cache and scheduler configs. The server
config (issue: the server) wraps it; the CLI and the JSON config file are
generated from / read into this tree.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.checkpoint import Checkpoint, ConfigFields, flatten_text_config  # noqa: F401 - flatten_text_config: qwen2_vl's
from inflight.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:  # torch loads where a device or dtype is resolved: the start-up checks build these configs without it
    import torch

logger = logging.getLogger(__name__)

# --dtype spellings -> torch's name
DTYPES = {
    "float32": "float32", "float": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "half": "float16", "fp16": "float16",
}  # fmt: skip
DEVICES = ("auto", "cpu", "cuda")  # and cuda:N


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, DTYPES[name])  # type: ignore[no-any-return]


# Where a GPU driver shows itself without torch: NVIDIA's device nodes and proc entry, WSL2's
# /dev/dxg, ROCm's /dev/kfd. None of them: torch.cuda would find no device either.
GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


def gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in GPU_DRIVER_NODES)


def check_device_and_dtype(device: str, dtype: str) -> None:
    """The spellings `resolve_device` / `resolve_dtype` take, and a GPU driver for `cuda`,
    checked without torch (importing it takes seconds; the CLI answers a mistake in under one)."""
    kind, _, index = device.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device: {device!r}; use auto | cpu | cuda | cuda:N")
    if kind == "cuda" and not gpu_driver_present():
        raise ValueError(f"device: {device!r}, but this machine has no GPU driver (none of "
                         f"{', '.join(GPU_DRIVER_NODES)}); use cpu or auto")  # fmt: skip
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")


def resolve_device(device: str) -> torch.device:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def checkpoint_dtype(hf_config: dict[str, Any]) -> torch.dtype | None:
    """The dtype config.json names (`torch_dtype`, or transformers 5's `dtype`); None if none."""
    name = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "").replace("torch.", "")
    return _torch_dtype(name) if name in DTYPES else None


def resolve_dtype(dtype: str | torch.dtype, hf_config: dict[str, Any], device: torch.device) -> torch.dtype:
    """The dtype the model runs in: what is fast and correct on this hardware for "auto".

    "auto": CUDA keeps the checkpoint's dtype. On a CPU a bf16 (or fp16) checkpoint stays
    bfloat16 only where the CPU has native bf16 arithmetic (the platform module says); elsewhere
    it is served in float32 (exact: every bf16 value is a float32 value; eager bf16 ops there run
    ~7x slower than float32 GEMMs at 32-512 rows, measured on a Zen 3) and the log says so. An
    explicit bfloat16 on such a CPU is honoured (unpacked weights, eager bf16 ops) with a warning
    naming the faster choice.
    """
    import torch

    from inflight import platform

    if isinstance(dtype, str) and dtype != "auto":
        check_device_and_dtype("auto", dtype)
        dtype = _torch_dtype(dtype)
    if isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16 and device.type == "cpu" and not platform.current().native_bf16:
            logger.warning(
                "dtype bfloat16 on a CPU without native bf16 arithmetic (%s): bf16 ops are emulated; "
                "--dtype auto (float32 here) is faster",
                platform.current().summary(),
            )
        return dtype
    ckpt = checkpoint_dtype(hf_config) or torch.float32
    if device.type != "cpu" or ckpt == torch.float32:
        return ckpt
    if platform.current().native_bf16:
        return torch.bfloat16  # float16 too: CPUs have no fast fp16 GEMM
    logger.info(
        "dtype auto: the %s checkpoint is served in float32: this CPU has no native bf16 arithmetic (%s)",
        str(ckpt).replace("torch.", ""), platform.current().summary(),
    )  # fmt: skip
    return torch.float32


def resolve_weight_dtype(dtype: str | torch.dtype, hf_config: dict[str, Any], device: torch.device,
                         resolved: torch.dtype) -> torch.dtype | None:  # fmt: skip
    """The checkpoint's bfloat16 / float16 where dtype "auto" serves it in float32 (no bf16
    arithmetic) on a CPU whose kernels widen 16-bit weights as fast as float32 GEMMs run
    (`platform.widens_bf16`: AVX2 without AVX-512; f16 by F16C, as fast as bf16's shift): the
    linear weights stay 16-bit, half the memory, multiplied by inflight/quant/float_kernels.py
    (batched) and the decode kernel (batch 1). None otherwise."""
    import torch

    from inflight import platform

    if dtype != "auto" or device.type != "cpu" or resolved != torch.float32:
        return None
    ckpt = checkpoint_dtype(hf_config)
    if ckpt not in (torch.bfloat16, torch.float16) or not platform.current().widens_bf16:
        return None
    return ckpt


@dataclass(frozen=True)
class ModelConfig(ConfigFields):
    """A loaded checkpoint's architecture plus how we run it."""

    path: str
    hf_config: dict[str, Any]
    dtype: torch.dtype
    device: torch.device
    max_model_len: int  # prompt + output tokens of one request
    eos_token_ids: tuple[int, ...]
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # oneDNN-prepacked weights on CPU (models/cpu_linear.py); off only to compare against plain F.linear
    cpu_fast_path: bool = True
    # "auto": Triton paged attention on CUDA, the gather + matmul path on CPU; "torch" | "triton" force one
    attention_backend: str = "auto"
    # no CUDA graphs for decode steps (vLLM's flag): every step runs the model eagerly
    enforce_eager: bool = False
    # "auto": the checkpoint's safetensors; "dummy": random weights of the checkpoint's shapes (benchmarks)
    load_format: str = "auto"
    # None | "int8" | "fp8": quantize a full-precision checkpoint at load (inflight/quant/formats.py)
    quantization: str | None = None
    # linear weights kept in this dtype when it is not `dtype` (None: `dtype`): dtype auto on a CPU
    # without bf16 arithmetic keeps a bf16 / f16 checkpoint's (or GGUF F16 / BF16 file's) weights
    # 16-bit, widened to float32 in the kernels (resolve_weight_dtype)
    weight_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.quantization not in (None, "int8", "fp8"):
            raise ValueError(f"quantization: {self.quantization!r}; use int8 or fp8")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend: {self.attention_backend!r}; use auto, torch or triton")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format: {self.load_format!r}; use auto or dummy")

    @property
    def architecture(self) -> str:
        archs = self.hf_config.get("architectures") or ["LlamaForCausalLM"]
        return archs[0]

    @property
    def is_multimodal(self) -> bool:
        """A vision-language checkpoint (takes images / video)."""
        return bool(self.hf_config.get("vision_config"))

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def head_dim(self) -> int:
        hd = self.hf_config.get("head_dim")
        return int(hd) if hd else int(self.hf_config["hidden_size"]) // self.num_heads

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        cpu_fast_path: bool = True,
        attention_backend: str = "auto",
        enforce_eager: bool = False,
        load_format: str = "auto",
        quantization: str | None = None,
    ) -> ModelConfig:
        ckpt = Checkpoint.read(path)
        ckpt.check_quantization_config()  # refused at start-up, before any weight is read
        return cls.from_checkpoint(ckpt, dtype, device, ckpt.max_model_len(max_model_len), cpu_fast_path,
                                   attention_backend, enforce_eager, load_format, quantization)  # fmt: skip

    @classmethod
    def from_checkpoint(
        cls, ckpt: Checkpoint, dtype: str | torch.dtype, device: str, max_model_len: int, *args: Any
    ) -> ModelConfig:
        """`ckpt` (its checks passed) run on `device` in `dtype`: where torch is first needed.
        `args`: cpu_fast_path, attention_backend, enforce_eager, load_format, quantization."""
        gen = ckpt.generation
        eos = gen.get("eos_token_id", ckpt.hf_config.get("eos_token_id"))
        eos_ids = tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        dev = resolve_device(device)
        resolved = resolve_dtype(dtype, ckpt.hf_config, dev)
        # a GGUF of F16 / BF16 weights (llama.cpp's model-f16.gguf) has float layers, kept 16-bit like safetensors
        quantized = (ckpt.quantized is not None and ckpt.gguf_float is None) or (len(args) > 4 and args[4])
        weights = None if quantized else resolve_weight_dtype(dtype, ckpt.hf_config, dev, resolved)
        return cls(ckpt.path, ckpt.hf_config, resolved, dev, max_model_len, eos_ids, gen, *args, weight_dtype=weights)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    # Bytes for the whole KV pool; None = a fraction of free memory (see worker/kv_cache.py).
    kv_cache_memory_bytes: int | None = None
    num_blocks: int | None = None  # overrides the memory budget (tests use tiny pools)
    enable_prefix_caching: bool = True
    # vision-language models: encoder outputs kept across requests by image hash (LRU), MiB
    mm_cache_mib: int = 256

    def __post_init__(self) -> None:
        if self.mm_cache_mib < 0:
            raise ValueError("mm_cache_size: must be >= 0 MiB")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size: must be a power of two >= 1")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ValueError("num_blocks: must be >= 2")


def default_step_tokens(device: torch.device, offline: bool = False) -> int:
    """max_num_batched_tokens when none is given: 512 on CPU; on a GPU 2048 served, 8192 for a
    batch run (`offline`: `LLM`, `inflight generate`, `inflight bench offline`; EngineArgs.for_offline).

    On 2 CPU cores a 512-token step takes ~0.6 s for a 0.5B model: running decodes stall at most
    that long while a prompt prefills (2048: ~2.3 s), a burst's TTFT p50 drops ~12 % (its
    prompts finish one chunk at a time), and output throughput is unchanged (measured,
    32 x 128 -> 128 bf16: 304 vs 302-311 tok/s).

    On an H100 (docs/GPU.md, first run, under the profiler) 256 x (512 -> 256) took 12.25 s at
    8192 against 14.6 s at 2048: a quarter of the steps, each GEMM over more rows. A server keeps
    2048: a long prompt's chunk stalls the running streams for one step. vLLM's LLM class likewise
    batches more tokens a step than its server.
    """
    if device.type == "cpu":
        return 512
    return 8192 if offline else 2048


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running requests per step
    # Tokens per step: decodes take 1 each, prefill chunks fill the rest.
    # 2048 keeps a CPU step near 1-2 s on 0.5B models while amortising weight reads.
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    # LoRA adapters resident on the device at once (the runner's slots); running requests use at
    # most this many distinct adapters
    max_loras: int = 4
    # decode steps per engine step for all-decode steps of plain greedy requests (docs/MULTISTEP.md):
    # the token sampled in pass i feeds pass i + 1 on the device, one host sync per N tokens
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        if self.num_scheduler_steps < 1:
            raise ValueError("num_scheduler_steps: must be >= 1")
        if self.max_loras < 1:
            raise ValueError("max_loras: must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs: must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens: must be >= max_num_seqs")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: how many ranks shard the model and where they run (worker/distributed.py).

    One node: the engine starts every rank itself. Several nodes: node 0 runs the front end and
    its share of the ranks; every other node runs `inflight serve --node-rank K` (or torchrun),
    which starts only its ranks; all meet at master_addr:master_port (rank 0's TCP store).
    """

    tensor_parallel_size: int = 1  # ranks in the model's process group (all nodes together)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (one node only)
    # a collective (an all-reduce) that waits longer than this fails the step: a hung or lost rank
    # turns into an error instead of a front end waiting forever
    collective_timeout_s: float = 120.0
    # engine replicas behind one server (engine/router.py); each runs in its own worker process(es)
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size: must be >= 1")
        if self.nnodes < 1 or self.tensor_parallel_size % self.nnodes:
            raise ValueError(f"nnodes: {self.nnodes} must be >= 1 and divide tensor_parallel_size {self.tensor_parallel_size}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank: {self.node_rank} not in [0, nnodes={self.nnodes})")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("master_port: required with nnodes > 1 (every node must meet rank 0 there)")
        if self.collective_timeout_s <= 0:
            raise ValueError("collective_timeout_s: must be > 0")
        if self.data_parallel_size < 1:
            raise ValueError("data_parallel_size: must be >= 1")
        if self.data_parallel_size > 1 and self.nnodes > 1:
            raise ValueError("data_parallel_size: replicas run on one node; nnodes > 1 is for one tensor-parallel replica")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def core_sharers(self) -> int:
        """Model processes splitting this node's CPU cores: every replica's ranks here."""
        return self.ranks_per_node * self.data_parallel_size

    def check_model(self, model: Checkpoint | ModelConfig) -> None:
        """A clear error at start for a model the ranks cannot share evenly (models/parallel.py
        splits the same way): heads and intermediate rows divisible by the ranks, KV heads too or
        replicated (ranks a multiple of them). The vocabulary is padded, never refused."""
        n = self.tensor_parallel_size
        if n > 1 and not model.architecture.endswith("ForCausalLM"):
            raise ValueError(f"tensor_parallel_size: {model.architecture} runs unsharded (its vision tower is not tensor-parallel)")
        hf = model.hf_config
        counts = {"num_attention_heads": model.num_heads, "intermediate_size": int(hf["intermediate_size"])}
        for what, total in counts.items():
            if total % n:
                ok = [k for k in range(1, total + 1) if total % k == 0]
                raise ValueError(f"tensor_parallel_size: {n} does not divide {what} ({total}); use one of {ok}")
        kv = model.num_kv_heads
        if (kv >= n and kv % n) or (kv < n and n % kv):
            raise ValueError(
                f"tensor_parallel_size: {n} ranks cannot share {kv} KV heads (num_key_value_heads): "
                f"it must divide them, or be a multiple of them (each KV head replicated)"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    default_timeout_s: float = 600.0  # SPEC §1: (0, 3600], default 600
    max_input_tokens: int | None = None  # prompt tokens at most (MindIE maxInputTokenLen)
    max_iter_times: int | None = None  # generated tokens at most (MindIE maxIterTimes)
    seed: int = 0
    # "uni": the runner in the engine thread; "mp": in a worker process (worker/executor.py);
    # tensor_parallel_size > 1 always runs one worker process per rank
    distributed_executor_backend: str = "uni"
    # with "mp" or the runner thread of "uni" on a GPU: schedule step N+1 while the runner runs step N (engine/step_loop.py)
    async_scheduling: bool = True
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # LoRA (inflight/lora/): adapters served over the base weights; ranks up to max_lora_rank,
    # max_cpu_loras adapters kept in host memory (None: 4 x max_loras)
    enable_lora: bool = False
    max_lora_rank: int = 64
    max_cpu_loras: int | None = None
    speculative: SpeculativeConfig | None = None  # the engine proposes drafts (spec_decode/)

    def __post_init__(self) -> None:
        check_lora(self.enable_lora, self.max_lora_rank, self.max_cpu_loras, self.scheduler, self.parallel)

    @property
    def lora_host_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else 4 * self.scheduler.max_loras


def check_lora(enable: bool, max_rank: int, max_cpu_loras: int | None, sched: SchedulerConfig, par: ParallelConfig) -> None:
    """EngineConfig's LoRA fields against the rest (also run by `EngineArgs.check`, before torch)."""
    if max_rank < 1:
        raise ValueError("max_lora_rank: must be >= 1")
    if max_cpu_loras is not None and max_cpu_loras < sched.max_loras:
        raise ValueError("max_cpu_loras: must be >= max_loras (an adapter in a device slot is in host memory too)")
    if enable and par.tensor_parallel_size > 1:
        raise ValueError("enable_lora: not supported with tensor_parallel_size > 1 yet (adapters are not sharded)")
