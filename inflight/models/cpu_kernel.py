"""CPU decode kernel: a whole small-batch decode step in one C call.

At batch 1 a decode step through PyTorch spends ~230 us per layer outside the GEMVs
(dispatch, allocation, Python; ~5.5 ms of a 29 ms Qwen2.5-0.5B step) and each oneDNN GEMV
call has a fixed cost that the small q/k/v and o projections feel most. inflight/csrc/
decode_kernel.c runs embedding -> layers -> final norm in one OpenMP parallel region over the
plain (N, K) weights, and the lm_head GEMV in the same region when every row samples (`head`),
else in a second call.

Which build runs is the platform module's call (inflight/platform.py): the flavour
(`avx512bf16`, `avx2`, `portable`) and its compiler flags come from there, never from
-march=native, and a flavour is only loaded where the CPU runs it. A model is bfloat16 or
float32 ("storage"); its GEMV weights are bf16 or fp32: a float32 model whose weights are all
exact in bf16 (a bf16 checkpoint served in float32) gives the kernel bf16 copies, half the bytes
per token for the same products; a float32 model whose weights are kept f16 (an f16 checkpoint
or GGUF F16 file on AVX2) gives it those. Quantized models (every decoder layer a QuantWeight
it takes, models/cpu_kernel_quant.py: integer layouts and f16 / bf16 / f8c) pass descriptors. Each variant is compiled on first use with the system C
compiler (~1 s) into ~/.cache/inflight/kernels (or $INFLIGHT_CACHE_DIR) and loaded with ctypes;
it resolves libgomp to the copy torch already loaded, so it shares torch's thread team (a second
OpenMP runtime would oversubscribe the cores; see docs/ARCHITECTURE.md).

No compiler, a build or load that fails (logged with the reason), a float16 model, or
INFLIGHT_CPU_KERNEL=0: the PyTorch path runs, unchanged. The kernel never takes the engine down.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from inflight import memory, platform
from inflight.models.cbuild import (
    KernelUnavailable,
    cache_dir,
    compile_cached,
    compile_flags,
    compiler,
    open_checked,
)
from inflight.models.cpu_kernel_quant import (
    descriptor,
    embed_dequantizer,
    layer_quant,
    quant_head,
    quant_weights,
)
from inflight.models.linear import linear_layers
from inflight.quant.weight import QuantWeight
from inflight.sample.sampler import GreedyRows

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "decode_kernel.c"
ABI_VERSION = 8
# Steps of at most this many rows, in at most MAX_PIECES pieces, take the kernel: a speculating
# request's K + 1 verification rows (causal among themselves), a few decodes, a short prompt.
# Measured (Zen 4 VM, 123M-parameter bf16 model, 1 thread, CPU time per step, benchmarks/
# decode_rows.py): rows of one sequence 1 / 2 / 5 / 8: 12 / 12 / 21 / 30 ms, eager 24 / 28 / 22 /
# 28 ms; 2 / 4 / 8 decodes of 2 / 4 / 8 sequences 13 / 23 / 39 ms, eager 27 / 23 / 32 ms. Past 8
# rows the GEMVs are compute-bound (vdpbf16ps) and oneDNN's GEMM gains; past 4 pieces, eager.
MAX_ROWS = 8
MAX_PIECES = 4
# ifl_gemv_path() of each flavour's build (an avx512bf16 build of a float32 model uses AVX2 GEMVs)
_GEMV_PATH = {"portable": 0, "avx2": 1, "avxvnni": 1, "avx512bf16": 2}
KERNEL_DTYPES = (torch.bfloat16, torch.float32)

_CFG = ("hidden", "heads", "kv_heads", "head_dim", "rot_dim", "inter", "layers", "qk_norm",
        "block_size", "slots", "window", "vocab", "quant")  # fmt: skip  # order of the C enum C_*
_LAYER_PTRS = 13  # L_N in the C source
_GEMV_PTRS = (1, 5, 8, 10)  # L_QKV_W, L_O_W, L_GU_W, L_DOWN_W: the plain weights' dtype
_P = ctypes.c_void_p


@dataclass(frozen=True)
class Variant:
    """One build of decode_kernel.c: instruction-set flavour x model dtype x GEMV weight dtype."""

    flavour: str  # a key of platform.KERNEL_FLAVOURS
    storage: torch.dtype = torch.bfloat16  # the model's dtype: activations, norms, KV cache
    weights: torch.dtype = torch.bfloat16  # the GEMV weights' dtype

    def defines(self) -> list[str]:
        return [f"IFL_STORAGE_BF16={int(self.storage == torch.bfloat16)}",
                f"IFL_WEIGHTS_BF16={int(self.weights == torch.bfloat16)}",
                f"IFL_WEIGHTS_F16={int(self.weights == torch.float16)}"]  # fmt: skip

    def gemv_path(self) -> int:
        path = _GEMV_PATH[self.flavour]
        return 1 if path == 2 and self.storage != torch.bfloat16 else path

    def describe(self) -> str:
        return f"{self.flavour}, {short_name(self.weights)} weights"


def short_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "fp32"}.get(dtype, str(dtype).replace("torch.", ""))


def enabled() -> bool:
    return os.environ.get("INFLIGHT_CPU_KERNEL", "1").lower() not in ("0", "false", "no", "off")


def build_library(variant: Variant, cc: str | None = None, extra_defines: tuple[str, ...] = ()) -> Path:
    """Compile `variant` (or find it in the cache); the .so's path. Building a flavour this CPU
    cannot run is allowed (tests compile every flavour); loading one is not (`load_library`).
    Raises KernelUnavailable with the compiler's message."""
    flags = compile_flags(platform.current().kernel_flags(variant.flavour), [*variant.defines(), *extra_defines])
    return compile_cached(SOURCE, f"decode-{variant.flavour}", flags, cc)


def load_library(variant: Variant, extra_defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The built and loaded kernel; raises KernelUnavailable (say why) instead of failing later.
    `extra_defines` ("IFL_PROFILE", "TQ_CHUNK=8"; no -D): a build with them, its own cache entry (tests, benchmarks)."""
    return _load(variant, compiler(), str(cache_dir()), tuple(extra_defines))  # a list: hashable


@functools.cache
def _load(variant: Variant, cc: str | None, cache_dir: str, extra_defines: tuple[str, ...]) -> ctypes.CDLL:  # noqa: ARG001 (cache key)
    if not platform.current().can_run(variant.flavour):
        raise KernelUnavailable(f"{variant.flavour} is not runnable on this CPU")
    path = build_library(variant, cc, extra_defines)
    want = (ABI_VERSION, variant.gemv_path(), variant.storage.itemsize * 8, variant.weights.itemsize * 8,
            int(variant.weights == torch.float16))  # fmt: skip
    probes = ("ifl_abi_version", "ifl_gemv_path", "ifl_storage_bits", "ifl_weight_bits", "ifl_weight_f16")
    lib = open_checked(path, probes, want)
    lib.ifl_decode_step.argtypes = [_P, _P, _P, _P, ctypes.c_int, _P, _P, _P, _P, ctypes.c_int, _P, _P, ctypes.c_int, _P,
                                    _P, _P, _P, _P, ctypes.c_int]  # fmt: skip
    lib.ifl_logits.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P, _P, _P, ctypes.c_int]
    lib.ifl_logits_q.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, _P, _P, _P, ctypes.c_int]
    logger.debug("CPU decode kernel %s loaded from %s", variant.describe(), path)
    return lib


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class DecodeKernel:
    """Binds one loaded model and its KV cache to the C kernel. The C step's buffers are public (`args`,
    `argmax`, `logprob`, their `*_ptr`, `step_ptrs`, `global_ptrs_np`, `embed_q`, `embedded`; `fused`:
    the last forward's lm_head output): worker/one_decode.py's batch-1 call reads and writes them itself."""

    variant: Variant | None = None  # what `build` loaded `lib` as (None: handed in): kernel.lib = load_library(variant, extra)

    def __init__(self, lib: ctypes.CDLL, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int) -> None:
        self.lib = lib
        self.max_rows = MAX_ROWS
        spec = model.spec  # type: ignore[attr-defined]
        inner = model.model  # type: ignore[attr-defined]
        rotary = inner.rotary
        self._keep: list[torch.Tensor] = []  # everything whose pointer C holds
        self.dtype = inner.norm.weight.dtype  # the model's: activations, norms, KV cache
        self.quant = quant_weights(model) is not None  # GEMV weights are QuantWeight descriptors
        self.quant_bytes = 0  # quantized bytes a batch-1 step reads (layers and lm_head): the roofline's
        if self.quant:
            self.weight_dtype = self.dtype
        else:
            self.weight_dtype = inner.layers[0].mlp.down_proj.plain_weight().dtype  # type: ignore[union-attr]
        values = {
            "hidden": spec.hidden, "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "rot_dim": rotary.rot_dim, "inter": spec.intermediate,
            "layers": spec.num_layers, "qk_norm": int(spec.qk_norm), "block_size": block_size,
            "slots": kv_caches[0].shape[2], "window": spec.sliding_window or 0, "vocab": spec.vocab_size,
            "quant": int(self.quant),
        }  # fmt: skip
        self.cfg = torch.tensor([values[k] for k in _CFG], dtype=torch.int64)
        self.fcfg = torch.tensor([spec.eps, spec.head_dim**-0.5], dtype=torch.float64)
        self.layer_ptrs = self._layer_table(inner.layers, kv_caches)
        cos = rotary.cos.to(self.dtype).contiguous()  # the eager path rounds the same table per step
        sin = rotary.sin.to(self.dtype).contiguous()
        # a quantized embedding (quant/embedding.py), or a bf16 one in a float32 model, has no rows of
        # the model's dtype to index: forward embeds the step's rows into a table of their own first
        embed = inner.embed_tokens
        own = not hasattr(embed, "lookup_rows") and embed.weight.dtype == self.dtype
        self.embed_rows = None if own else embed
        self.embed_q = embed_dequantizer(embed, self.dtype) if not own else None
        self.embedded = None if self.embed_q is None else torch.empty(MAX_ROWS, spec.hidden, dtype=self.dtype)
        table = embed.weight if own else None
        glob = [table, inner.norm.weight, cos, sin]
        self.global_ptrs = torch.tensor([_ptr(self._check(t)) for t in glob], dtype=torch.int64)
        self.global_ptrs_np = self.global_ptrs.numpy()  # the same memory: G_EMBED set per step without a torch op
        # per step, reused (numpy: right after the previous step's C call a torch op runs cache-cold,
        # 20-90 us against 5 warm; Zen 4): the rows' ids, positions and slots; the greedy rows' stats
        self.args = np.zeros((3, MAX_ROWS), dtype=np.int64)
        self.fused: tuple[torch.Tensor, torch.Tensor, GreedyRows | None] | None = None  # forward's out, its logits
        self.argmax = np.zeros(MAX_ROWS, dtype=np.int64)
        self.logprob = np.zeros(MAX_ROWS, dtype=np.float64)
        # their addresses (numpy's .ctypes builds an object a call, ~1 us)
        self.args_ptr, self.argmax_ptr, self.logprob_ptr = (a.ctypes.data for a in (self.args, self.argmax, self.logprob))
        self._quant_kernels = None  # inflight.quant.kernels, for a quantized model: read per step by _quant_on
        if self.quant:
            from inflight.quant import kernels

            self._quant_kernels = kernels
        self.model = model
        if not self.quant:
            self.lm_head: int | None = self._gemv(model.lm_head)  # type: ignore[arg-type]
        else:
            self.lm_head = quant_head(model, self._descriptor, self._keep)
        self.hidden, self.vocab, self.block_size = spec.hidden, spec.vocab_size, block_size
        self.step_ptrs = (self.cfg.data_ptr(), self.fcfg.data_ptr(), self.layer_ptrs.data_ptr(), self.global_ptrs.data_ptr())
        self.num_layers = spec.num_layers
        self.aux_hidden: torch.Tensor | None = None
        self.set_aux_layers(())

    def set_aux_layers(self, layers: tuple[int, ...]) -> None:
        """Hand back, with every step from now on, the input of each of `layers` (the residual
        stream, Hugging Face's hidden_states[l]: 0 the embeddings, num_layers the last layer's
        output before the final norm) in `aux_hidden` (len(layers), M, hidden), in the order
        given: what EAGLE heads read (models/llama.py's aux_hidden, layer by layer)."""
        if any(not 0 <= layer <= self.num_layers for layer in layers):
            raise ValueError(f"aux layers {layers} outside 0..{self.num_layers}")
        self.aux_layers: tuple[int, ...] = tuple(layers)
        self._aux_ptr = torch.tensor(list(layers) or [0], dtype=torch.int64)

    def _gemv(self, layer: nn.Module) -> int:
        """The C pointer of a layer's GEMV weight: its plain weight, or its QuantWeights' descriptor."""
        if not self.quant:
            return _ptr(self._check(layer.plain_weight(), gemv=True))  # type: ignore[operator]
        weights = layer_quant(layer)
        if weights is None:
            raise ValueError(f"decode kernel: {type(layer.method).__name__} weights the kernel cannot multiply")  # type: ignore[union-attr]
        return self._descriptor(weights).data_ptr()

    def _layer_table(self, layers: nn.ModuleList, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """(layers, L_N) int64: each layer's tensors in the order of the C enum L_*."""
        rows = []
        for layer, kv in zip(layers, kv_caches):
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            tensors = [
                layer.input_layernorm.weight, attn.qkv_proj, attn.qkv_proj.bias,
                q_norm.weight if q_norm is not None else None, k_norm.weight if k_norm is not None else None,
                attn.o_proj, attn.o_proj.bias, layer.post_attention_layernorm.weight,
                mlp.gate_up_proj, mlp.gate_up_proj.bias, mlp.down_proj, mlp.down_proj.bias, kv,
            ]  # fmt: skip
            rows.append([self._gemv(t) if i in _GEMV_PTRS else _ptr(self._check(t)) for i, t in enumerate(tensors)])
        table = torch.tensor(rows, dtype=torch.int64)
        assert table.shape[1] == _LAYER_PTRS
        return table

    def _descriptor(self, weights: list[QuantWeight]) -> torch.Tensor:
        self.quant_bytes += sum(qw.nbytes for qw in weights)
        return descriptor(weights, self._keep)

    def _check(self, t: torch.Tensor | None, gemv: bool = False) -> torch.Tensor | None:
        """t, kept alive while C holds its pointer; a GEMV weight has the plain weights' dtype,
        every other tensor the model's."""
        if t is None:
            return None
        want = self.weight_dtype if gemv else self.dtype
        if t.dtype != want or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"decode kernel: tensor {tuple(t.shape)} {t.dtype} is not contiguous CPU {want}")
        self._keep.append(t)
        return t

    @classmethod
    def build(
        cls, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int, lib: ctypes.CDLL | None = None
    ) -> DecodeKernel | None:
        """The kernel bound to this model, or None: its linear methods keep no plain weights for
        it (the loader decided against the kernel, see `choose`), or the kernel cannot run it (logged)."""
        if not enabled() or not hasattr(model, "spec"):  # INFLIGHT_CPU_KERNEL=0: quantized models too
            return None
        if getattr(model, "tp", None) is not None and model.tp.size > 1:  # type: ignore[union-attr]
            return None  # one C call runs every layer: no point for the all-reduces (a rank's quantized shard was bound)
        plain = [layer.plain_weight() for layer in linear_layers(model)]
        quant = quant_weights(model) is not None
        if not quant and any(w is None for w in plain):
            return None
        try:
            storage = model.model.norm.weight.dtype  # type: ignore[attr-defined,union-attr]
            weights = storage if quant else plain[0].dtype  # type: ignore[union-attr]
            variant = Variant(platform.current().kernel_flavour(), storage, weights) if lib is None else None
            lib = load_library(variant) if variant is not None else lib
            memory.pack_into_huge_pages(model, skip=kv_caches)  # the small weights it streams: in 2 MiB pages
            kernel = cls(lib, model, kv_caches, block_size)  # type: ignore[arg-type]
            kernel.variant = variant
            return kernel
        except (ValueError, KernelUnavailable) as e:
            logger.info("CPU decode kernel off: %s", e)
            return None

    def accepts(self, num_rows: int, decode_only: bool = True, embeds: bool = False, num_pieces: int = 1) -> bool:
        """Whether the kernel runs a step of `num_rows` rows in `num_pieces` pieces: at most
        MAX_ROWS and MAX_PIECES, none embedded from a prompt-embedding table. A piece of several
        rows (a verification, a prompt chunk) attends causally over its own rows: the kernel
        writes every row's K/V before any row attends."""
        return not embeds and num_rows <= self.max_rows and num_pieces <= MAX_PIECES and self._quant_on()

    def takes_logits(self, num_rows: int) -> bool:
        """Whether the kernel's lm_head GEMV runs the logits of `num_rows` rows."""
        return num_rows <= self.max_rows and self._quant_on()

    def holds_logits(self, hidden: torch.Tensor) -> bool:
        """Whether `hidden` is the output of a `forward` that ran the lm_head (`logits` returns them)."""
        return self.fused is not None and self.fused[0] is hidden

    def _quant_on(self) -> bool:
        """INFLIGHT_QUANT_KERNEL=0 turns every C product over quantized bytes off, this kernel's
        too (read per step, as QuantLinear reads it): the eager path then multiplies by exactly the
        reference dequantization."""
        return self._quant_kernels is None or self._quant_kernels.enabled()

    def forward(
        self, ids: list[int], positions: list[int], slots: torch.Tensor, block_table: torch.Tensor,
        head: GreedyRows | bool = False,
    ) -> torch.Tensor:  # fmt: skip
        """Final-normed hidden states (M, hidden) of M rows; writes their K/V. Each row attends to
        positions 0..its own (a sequence's consecutive rows: causally, its new rows included).
        `block_table`: (M, width) ints, each row's blocks up to its position (entries after are
        never read). With aux layers set, `aux_hidden` is (len(aux_layers), M, hidden) after.
        `head` (every row samples): the lm_head runs in the same C call, and `logits(out)` hands its
        logits back; a GreedyRows is filled in then, as `logits` fills it."""
        m = len(ids)
        table = np.ascontiguousarray(block_table.numpy(), dtype=np.int64)
        args = self.args if m <= MAX_ROWS else np.zeros((3, m), dtype=np.int64)
        args[1, :m] = positions
        args[2, :m] = slots.numpy()
        embedded = None  # C embeds row m from row m of the step's own rows, or token ids[m] of the model's table
        if self.embed_q is not None and self.embedded is not None and m <= MAX_ROWS:
            args[0, :m] = ids
            if self.embed_q(self.args_ptr, m, self.embedded.data_ptr()) != 0:
                raise ValueError(f"decode kernel: token ids {ids} outside the embedding")
            self.global_ptrs_np[0] = self.embedded.data_ptr()
            args[0, :m] = range(m)
        elif self.embed_rows is not None:  # dequantized (or widened) in torch
            embedded = self.embed_rows(torch.tensor(ids, dtype=torch.int64)).contiguous()
            self.global_ptrs_np[0] = embedded.data_ptr()
            args[0, :m] = range(m)
        else:
            args[0, :m] = ids
        out = torch.empty(m, self.hidden, dtype=self.dtype)
        n_aux = len(self.aux_layers)
        aux = torch.empty(n_aux, m, self.hidden, dtype=self.dtype) if n_aux else None
        logits, greedy = None, head if isinstance(head, GreedyRows) else None
        if head is not False and self.lm_head is not None and m <= MAX_ROWS:
            logits = torch.empty(m, self.vocab, dtype=torch.float32)
        arg, row = self.args_ptr if args is self.args else args.ctypes.data, args.strides[0]
        pa, pl = self._stats_ptrs(greedy) if logits is not None else (0, 0)
        rc = self.lib.ifl_decode_step(
            *self.step_ptrs, m, arg, arg + row, arg + 2 * row, table.ctypes.data, table.shape[1], out.data_ptr(),
            self._aux_ptr.data_ptr(), n_aux, _ptr(aux), self.lm_head if logits is not None else 0, _ptr(logits), pa, pl,
            torch.get_num_threads(),
        )  # fmt: skip
        del embedded  # alive until here: C read it
        self.aux_hidden = aux
        if rc != 0:
            raise RuntimeError(f"decode kernel failed ({rc})")
        self.fused = None if logits is None else (out, logits, greedy)
        if greedy is not None and logits is not None:
            self._fill(greedy, m, pl)
        return out

    def _stats_ptrs(self, greedy: GreedyRows | None) -> tuple[int, int]:
        """The argmax and logprob outputs' pointers for `greedy` (0: none)."""
        if greedy is None:
            return 0, 0
        return self.argmax_ptr, self.logprob_ptr if greedy.want_logprobs else 0

    def _fill(self, greedy: GreedyRows, m: int, logprobs: int) -> None:
        greedy.token_ids = self.argmax[:m].tolist()
        greedy.logprobs = self.logprob[:m].tolist() if logprobs else None

    def logits(self, hidden: torch.Tensor, greedy: GreedyRows | None = None) -> torch.Tensor:
        """(M, hidden) -> (M, vocab) float32, rounded through the model dtype like the eager lm_head.
        With `greedy`, also fills in each row's argmax and (if it asks) that token's logprob,
        computed while the logits are in cache (decode_kernel.c ifl_logits); left empty (None)
        where the lm_head runs in torch."""
        fused, self.fused = self.fused, None
        if fused is not None and hidden is fused[0]:  # run in forward's C call (`head`)
            if greedy is not None and greedy is not fused[2]:
                raise ValueError("logits: the step's lm_head ran with another GreedyRows")
            return fused[1]
        if hidden.dtype != self.dtype or not hidden.is_contiguous():
            hidden = hidden.to(self.dtype).contiguous()
        m = hidden.shape[0]
        if self.lm_head is None:
            return self.model.compute_logits(hidden).float()  # type: ignore[operator,no-any-return]
        out = torch.empty(m, self.vocab, dtype=torch.float32)
        pa, pl = self._stats_ptrs(greedy if m <= MAX_ROWS else None)  # the stats hold MAX_ROWS rows: else the sampler's
        if self.quant:
            rc = self.lib.ifl_logits_q(self.lm_head, hidden.data_ptr(), m, self.vocab, out.data_ptr(), pa, pl,
                                       torch.get_num_threads())  # fmt: skip
        else:
            rc = self.lib.ifl_logits(self.lm_head, hidden.data_ptr(), m, self.vocab, self.hidden, out.data_ptr(), pa, pl,
                                     torch.get_num_threads())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"decode kernel logits failed ({rc})")
        if pa:
            self._fill(greedy, m, pl)  # type: ignore[arg-type]
        return out
