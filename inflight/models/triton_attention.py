"""Paged attention in Triton: one kernel for a whole step, prefill pieces and decodes together.

The GPU attention path (CPU keeps models/attention.py's gather + matmul path). It reads K and V in
place from the paged cache (no gather copy) and needs no per-step mask tensor, so a decode step is
a fixed set of launches over persistent buffers: CUDA graphs capture it (`capture_graphs`, models/cuda_graphs.py).

Inputs of one step, built once by the runner and shared by every layer (`TritonMeta`):

    query_start (S + 1,) int32  the flat batch's pieces: piece s owns tokens [query_start[s], query_start[s+1])
    seq_lens    (S,)     int32  tokens visible to the piece's last query: earlier context + the piece
    block_table (S, B)   int32  the piece's KV blocks (cache layout: models/attention.py)

Query token i of piece s sits at position seq_lens[s] - q_len + i and sees keys <= its position
(and > position - window with a sliding window). A program owns BLOCK_Q query tokens of one piece
and one KV head; its tile rows are (token, query head of that KV head's group), so grouped-query
heads share every K/V load (rows = BLOCK_Q * G_PAD, G_PAD = group size rounded up to a power of 2).
Online softmax in float32 (FlashAttention-2's recurrence), P rounded to the cache dtype before the
P @ V product as FlashAttention does.

Without a GPU the same kernels run in Triton's interpreter on CPU tensors (tests only: slow).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from inflight import platform
from inflight.config import ModelConfig
from inflight.models.cuda_graphs import DecodeGraphs
from inflight.models.step import StepBatch

# Imported on first use (_kernel): the kernels below resolve `tl` from this module's globals when
# they compile, and a CPU-only process never pays for importing Triton.
triton: Any = None
tl: Any = None


def available() -> bool:
    return importlib.util.find_spec("triton") is not None


@dataclass
class TritonMeta:
    query_start: torch.Tensor  # (S + 1,) int32
    seq_lens: torch.Tensor  # (S,) int32
    block_table: torch.Tensor  # (S, max_blocks) int32
    max_query_len: int  # longest piece: sets the grid (1 for a decode step)
    window: int | None = None  # sliding window in tokens, None = full causal
    slot_mapping: torch.Tensor | None = None  # (T,) cache slot of each new token, < 0: padding
    block_size: int = 16
    # split-KV partials of decode steps, by shape (attention): one step's layers share them; a
    # captured graph's stay alive with the backend, which owns them (their addresses are baked in)
    scratch: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        assert self.slot_mapping is not None
        write_kv(k, v, kv_cache, self.slot_mapping)
        return attention(q, kv_cache, self, self.block_size, scale)


class TritonAttention:
    """The GPU backend (models/attention.py's seam): two launches per layer, capturable."""

    name = "triton"

    def __init__(self, block_size: int, window: int | None, device: torch.device) -> None:
        self.block_size = block_size
        self.window = window
        self.device = device
        self.graph_scratch: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # TritonMeta.scratch

    def capture_graphs(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], max_batch: int, max_blocks: int) -> DecodeGraphs | None:
        """CUDA graphs of the model's decode steps over these kernels (models/cuda_graphs.py): a
        fixed set of launches over persistent buffers. None off CUDA."""
        if self.device.type != "cuda":
            return None
        return DecodeGraphs.capture(model, kv_caches, self.block_size, self.graph_meta, max_batch=max_batch, max_blocks=max_blocks)

    def graph_meta(self, query_start: torch.Tensor, seq_lens: torch.Tensor, table: torch.Tensor, slots: torch.Tensor) -> TritonMeta:
        """A captured decode step's metadata over the graphs' persistent buffers: one token a row,
        the split count fixed by (rows, table width), the split partials in the backend's buffers
        (allocated by the warm-up before capture, alive as long as the graphs that use them)."""
        return TritonMeta(query_start, seq_lens, table, 1, self.window, slots, self.block_size, self.graph_scratch)

    def build_metadata(self, step: StepBatch) -> TritonMeta:
        """Piece boundaries, context lengths and block tables, int32, on the device."""
        starts = [0]
        for n in step.query_lens:
            starts.append(starts[-1] + n)

        def tensor(data: list[int]) -> torch.Tensor:
            return torch.tensor(data, dtype=torch.int32).to(self.device, non_blocking=True)

        return TritonMeta(
            query_start=tensor(starts),
            seq_lens=tensor(step.context_lens),
            block_table=step.block_table.to(self.device, non_blocking=True),
            max_query_len=max(step.query_lens),
            window=self.window,
            slot_mapping=step.slots,
            block_size=self.block_size,
        )


def _kv_write(K, V, K_CACHE, V_CACHE, SLOTS,  # noqa: N803, ANN001 - Triton kernel
              stride_kt, stride_kh, stride_vt, stride_vh,
              stride_kch, stride_kcs, stride_vch, stride_vcs,
              HEAD_DIM: tl.constexpr, HD_PAD: tl.constexpr):  # fmt: skip
    """Token t's K and V of KV head h to cache slot SLOTS[t]; a negative slot is padding."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, HD_PAD)
        m = d < HEAD_DIM
        k = tl.load(K + t * stride_kt + h * stride_kh + d, mask=m)
        v = tl.load(V + t * stride_vt + h * stride_vh + d, mask=m)
        tl.store(K_CACHE + h * stride_kch + slot * stride_kcs + d, k, mask=m)
        tl.store(V_CACHE + h * stride_vch + slot * stride_vcs + d, v, mask=m)


def _attend(q, K, V, TABLE, stride_ks, stride_vs, scale, window, q_pos, lo, hi, d, d_ok, m_i, l_i, acc,  # noqa: N803, ANN001, ANN202
            BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """Online softmax of the (M, HD) queries `q` over one KV head's keys [lo, hi) of one row (K, V:
    that head's cache planes; TABLE: the row's block table), BLOCK_N keys a tile, causal (q_pos)
    and windowed. Returns the running (max, sum, weighted V) after the last tile."""
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        page = tl.load(TABLE + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = page * PAGE + n % PAGE  # (N,)
        k = tl.load(K + slot[None, :] * stride_ks + d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # (HD, N)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=PRECISION) * scale  # (M, N) float32
        visible = n_ok[None, :] & (n[None, :] <= q_pos[:, None]) & (n[None, :] > q_pos[:, None] - window)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slot[:, None] * stride_vs + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # (N, HD)
        pv = p.to(v.dtype)
        if UPCAST:
            pv, v = pv.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


def _attention(Q, K_CACHE, V_CACHE, OUT, PART_O, PART_LSE, QUERY_START, SEQ_LENS, BLOCK_TABLE,  # noqa: N803, ANN001
               stride_qt, stride_qh, stride_ot, stride_oh,
               stride_kh, stride_ks, stride_vh, stride_vs, stride_bt, stride_pt, stride_ph,
               scale, window, row_splits,
               G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HD_PAD: tl.constexpr,
               BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """One program: BLOCK_Q query tokens of piece program_id(0) x one KV head's group. SPLIT (decode
    steps only, one token a piece): program_id(1) is a partition of the row's visible keys instead
    of a query block, and its normalised partial output and log-sum-exp go to PART_O / PART_LSE
    (_merge combines them into OUT). A row's partitions follow from its own length and row_splits
    alone, not from the grid, so a row's result is the same in any batch and table width."""
    s = tl.program_id(0)
    if SPLIT:
        qb = 0
        split = tl.program_id(1)
    else:
        qb = tl.program_id(1)
        split = 0
    kvh = tl.program_id(2)
    q_start = tl.load(QUERY_START + s)
    q_len = tl.load(QUERY_START + s + 1) - q_start
    if qb * BLOCK_Q < q_len:
        ctx = tl.load(SEQ_LENS + s) - q_len  # tokens before the piece
        rows = tl.arange(0, BLOCK_Q * G_PAD)
        tok = qb * BLOCK_Q + rows // G_PAD
        head = kvh * G + rows % G_PAD
        row_ok = (tok < q_len) & (rows % G_PAD < G)
        d = tl.arange(0, HD_PAD)
        d_ok = d < HEAD_DIM
        q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
        q = tl.load(Q + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (M, HD)
        if UPCAST:  # the interpreter's dot is wrong on bf16/fp16 operands: exact products in fp32 instead
            q = q.to(tl.float32)
        q_pos = ctx + tok  # (M,) absolute position of each row's query
        m_i = tl.full([BLOCK_Q * G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q * G_PAD], tl.float32)
        acc = tl.zeros([BLOCK_Q * G_PAD, HD_PAD], tl.float32)
        hi = ctx + tl.minimum(q_len, (qb + 1) * BLOCK_Q)  # one past the last query's position
        lo = tl.maximum(ctx + qb * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N
        if SPLIT:  # this partition of [lo, hi): whole tiles, the row's own length cut row_splits ways
            part = tl.cdiv(tl.cdiv(hi - lo, row_splits), BLOCK_N) * BLOCK_N
            lo = lo + split * part
            hi = tl.minimum(hi, lo + part)  # <= lo past the row's keys: an empty partial, lse -inf
        m_i, l_i, acc = _attend(q, K_CACHE + kvh * stride_kh, V_CACHE + kvh * stride_vh, BLOCK_TABLE + s * stride_bt,
                                stride_ks, stride_vs, scale, window, q_pos, lo, hi, d, d_ok, m_i, l_i, acc,
                                BLOCK_N, PAGE, PRECISION, UPCAST)  # fmt: skip
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        if SPLIT:
            p_row = (q_start + tok).to(tl.int64) * stride_pt + head * stride_ph + split  # (M,)
            lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(tl.where(l_i == 0.0, 1.0, l_i)))
            tl.store(PART_LSE + p_row, lse, mask=row_ok)
            tl.store(PART_O + p_row[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        else:
            o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
            tl.store(OUT + o_off, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _merge(OUT, PART_O, PART_LSE, stride_ot, stride_oh, stride_pt, stride_ph, num_splits,  # noqa: N803, ANN001
           HEAD_DIM: tl.constexpr, HD_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):  # fmt: skip
    """Token t's head h: its num_splits partitions' outputs weighted by exp(lse - max lse) (the
    log-sum-exp merge). Empty partitions (lse -inf) weigh exactly 0, and SPLITS_PAD comes from
    row_splits, not the grid, so the sums' order is the same whatever the grid. A row with no
    keys (CUDA-graph padding) writes 0; one with one partition, that partition's output exactly."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HD_PAD)
    row = t.to(tl.int64) * stride_pt + h * stride_ph + j  # (SPLITS_PAD,)
    lse = tl.load(PART_LSE + row, mask=j < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))  # 0 for the empty ones
    o = tl.load(PART_O + row[:, None] * HEAD_DIM + d[None, :], mask=(w > 0.0)[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    total = tl.sum(w, 0)
    acc = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)  # (HD_PAD,)
    tl.store(OUT + t.to(tl.int64) * stride_ot + h * stride_oh + d, acc.to(OUT.dtype.element_ty), mask=d < HEAD_DIM)


_NO_WINDOW = 1 << 30  # "no sliding window": every earlier key is inside it

_KERNELS: dict[str, Any] = {}


def _kernel(name: str) -> Any:
    """Compiled on first use (or interpreted, under TRITON_INTERPRET=1: see interpreted())."""
    global triton, tl
    if name not in _KERNELS:
        import triton
        import triton.language as tl

        if "_attend" not in _KERNELS:  # the attention kernel calls it: jitted under the global name it reads
            _KERNELS["_attend"] = globals()["_attend"] = triton.jit(_attend)
        fn = {"kv_write": _kv_write, "attention": _attention, "merge": _merge}[name]
        # the split count's values: one compiled variant for them all (no "== 1" / "% 16" cases)
        fixed = [p for p in ("stride_pt", "stride_ph", "row_splits", "num_splits") if p in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
        _KERNELS[name] = triton.jit(fn, do_not_specialize=fixed)
    return _KERNELS[name]


def interpreted() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1 before triton was imported; tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, 1 << (max(n, 1) - 1).bit_length())


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v (T, KV, hd) into kv_cache (2, KV, slots, hd) at `slots` (T,); slot < 0 = skip."""
    t, num_kv, hd = k.shape
    if t == 0:
        return
    kc, vc = kv_cache[0], kv_cache[1]
    _kernel("kv_write")[(t, num_kv)](
        k, v, kc, vc, slots,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
        HEAD_DIM=hd, HD_PAD=_pow2(hd),
    )  # fmt: skip


# Split-KV decode ("flash-decoding"). A decode step's grid is rows x KV heads programs: 8 for a
# batch-1 step of Llama-3-8B, on an H100's 132 SMs (19.5 us a layer at 640 tokens, where its
# 2.6 MB of K/V would take ~1 us: docs/GPU.md). Cutting each row's keys into partitions fills the GPU.
PROGRAMS_PER_SM = 2  # a second resident program per SM overlaps one's loads with the other's math
MAX_SPLITS = 64  # the merge's tile is SPLITS_PAD x head_dim floats
INTERPRETED_SMS = 132  # an H100's, for the interpreter: tests see the split counts a GPU would choose
SPLITS_ENV = "INFLIGHT_ATTN_SPLITS"  # 0 / 1: never split, N: at most N, unset: auto


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETED_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return platform.cuda_devices()[index].sm_count


def row_splits(num_kv: int, sms: int) -> int:
    """How many partitions a row's keys are cut into at most (each whole 64-token tiles): enough for
    one row alone to put PROGRAMS_PER_SM programs on every SM, capped by INFLIGHT_ATTN_SPLITS.
    Independent of the batch and the table width: a row's partitions, so its rounding, are the
    same in a captured graph (padded rows, max_model_len-wide table) and an eager step."""
    env = os.environ.get(SPLITS_ENV, "").strip()
    if env and not env.isdigit():
        raise ValueError(f"{SPLITS_ENV}={env!r}: expected a whole number (0 or 1: never split, N: at most N)")
    cap = min(int(env), MAX_SPLITS) if env else MAX_SPLITS
    return max(1, min(cap, -(-sms * PROGRAMS_PER_SM // num_kv)))


def num_splits(rows: int, num_kv: int, max_context: int, sms: int, block_n: int = 64) -> int:
    """The grid's partitions a row of a decode step: 1 (the unsplit kernel) once rows x KV heads
    give every SM a program, else as many as a row can use: row_splits, or fewer when the longest
    context (`max_context`, the block table's width: under CUDA graphs fixed at capture) has fewer
    tiles. A row never has more partitions than this (its tiles, row_splits), so none is cut off."""
    if rows * num_kv >= sms:
        return 1
    return max(1, min(row_splits(num_kv, sms), -(-max_context // block_n)))


def attention(
    q: torch.Tensor,  # (T, H, hd)
    kv_cache: torch.Tensor,  # (2, KV, slots, hd), this step's K/V already written
    meta: TritonMeta,
    block_size: int,
    scale: float,
    out: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """Causal (optionally windowed) attention of every piece over its paged context. (T, H, hd).
    `splits` (tests, benchmarks): a decode row's partitions at most, forced (row_splits' value;
    1: unsplit); None: row_splits and num_splits choose. Prefill pieces never split."""
    t, num_heads, hd = q.shape
    num_kv = kv_cache.shape[1]
    group = num_heads // num_kv
    g_pad = _pow2(group)
    if out is None:
        out = torch.empty_like(q)
    seqs, width = meta.seq_lens.shape[0], meta.block_table.shape[1]
    decode = meta.max_query_len <= 1
    if decode:  # one token per piece, its group's heads pad the tile to 16 rows
        block_q, block_n, warps = max(1, 16 // g_pad), 64, 4
        if splits is None:
            sms = sm_count(q.device)
            per_row, splits = row_splits(num_kv, sms), num_splits(seqs, num_kv, width * block_size, sms, block_n)
        else:
            per_row, splits = splits, min(splits, -(-width * block_size // block_n))
    else:  # prefill: ~64 query rows per program
        block_q, block_n, warps, splits, per_row = max(1, 64 // g_pad), 64, 4, 1, 1
    kc, vc = kv_cache[0], kv_cache[1]
    part_o = part_lse = out  # unused unless split
    if splits > 1:
        key = (t, num_heads, splits, hd)
        if key not in meta.scratch:  # under CUDA graphs: in the warm-up before capture, kept after
            part_o = torch.empty(t, num_heads, splits, hd, dtype=torch.float32, device=q.device)
            meta.scratch[key] = (part_o, torch.empty(t, num_heads, splits, dtype=torch.float32, device=q.device))
        part_o, part_lse = meta.scratch[key]
    grid = (seqs, splits if splits > 1 else -(-meta.max_query_len // block_q), num_kv)
    _kernel("attention")[grid](
        q, kc, vc, out, part_o, part_lse, meta.query_start, meta.seq_lens, meta.block_table,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1), meta.block_table.stride(0),
        num_heads * splits, splits,
        scale, meta.window or _NO_WINDOW, per_row,
        G=group, G_PAD=g_pad, HEAD_DIM=hd, HD_PAD=_pow2(hd, 16),
        BLOCK_Q=block_q, BLOCK_N=block_n, PAGE=block_size,
        PRECISION="ieee" if q.dtype == torch.float32 or interpreted() else "tf32",
        UPCAST=interpreted(), SPLIT=splits > 1,
        num_warps=warps,
    )  # fmt: skip
    if splits > 1:
        _kernel("merge")[(t, num_heads)](
            out, part_o, part_lse, out.stride(0), out.stride(1), num_heads * splits, splits, splits,
            HEAD_DIM=hd, HD_PAD=_pow2(hd, 16), SPLITS_PAD=_pow2(per_row, 2),
        )  # fmt: skip
    return out


def wanted(cfg: ModelConfig) -> bool:
    """Whether this model config runs the Triton backend: auto = on CUDA when Triton is installed."""
    if cfg.attention_backend == "torch":
        return False
    if cfg.attention_backend == "triton":
        if not available():
            raise ValueError("attention_backend: triton is not installed")
        if cfg.device.type != "cuda" and not interpreted():
            raise ValueError("attention_backend: triton needs a CUDA device (on CPU: TRITON_INTERPRET=1, tests only)")
        return True
    return cfg.device.type == "cuda" and available()
