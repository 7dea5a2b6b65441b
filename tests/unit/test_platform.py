"""inflight/platform.py: detection, the override, and every decision the fast paths ask of it.

Decisions are checked on synthetic CPUs (a Platform built from a feature set), so each branch is
covered on whatever CPU runs the suite; tests/model/test_cpu_dispatch.py runs them end to end.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from pathlib import Path

import pytest
import torch

from inflight import memory, platform
from inflight.config import resolve_dtype, resolve_weight_dtype
from inflight.models import cbuild, cpu_kernel
from inflight.models.cpu_linear import UnsupportedFastPath, cpu_packing_available, pack_weight

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq

processor\t: 1
"""
SPR = """vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: sse4_2 avx fma f16c avx2 avx512f avx512dq avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni amx_bf16 avx512_fp16 amx_tile amx_int8
"""
GRAVITON3 = """processor\t: 0
Features\t: fp asimd evtstrm aes asimddp sha512 sve asimdfhm svei8mm svebf16 i8mm bf16 rng
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def _cpu(features: tuple[str, ...] | frozenset[str], arch: str = "x86_64") -> platform.Platform:
    """A machine that really has `features` (nothing clamped)."""
    feats = frozenset(features)
    return platform.Platform(platform.CpuInfo(arch, "test", feats, 2), feats)


def test_cpuinfo_parsing() -> None:
    feats, name = platform.parse_cpuinfo(ZEN3, "x86_64")
    assert (name, feats) == ("zen3", frozenset({"avx", "avx2", "fma", "f16c"}))
    feats, name = platform.parse_cpuinfo(SPR, "x86_64")
    assert name == "intel-amx" and {"avx512_bf16", "amx_bf16", "avx512bw", "avx_vnni"} <= feats
    feats, name = platform.parse_cpuinfo(GRAVITON3, "aarch64")
    assert (name, feats) == ("neoverse-v1", frozenset({"neon", "dotprod", "sve", "i8mm", "bf16"}))


# profile -> (dtype auto of a bf16 checkpoint, kernel flavour, oneDNN packs bf16, packs fp32)
DECISIONS = {
    "avx2": (torch.float32, "avx2", False, True),
    "avx512": (torch.float32, "avx2", True, True),
    "avx512_bf16": (torch.bfloat16, "avx512bf16", True, True),
    "amx": (torch.bfloat16, "avx512bf16", True, True),
    "portable": (torch.float32, "portable", False, False),
}


@pytest.mark.parametrize("profile", DECISIONS)
def test_decisions_per_x86_profile(profile: str) -> None:
    dtype, flavour, bf16_packs, fp32_packs = DECISIONS[profile]
    p = _cpu(platform.PROFILES[profile])
    assert p.native_bf16 == (dtype == torch.bfloat16)
    assert p.kernel_flavour() == p.kernel_flavour(runnable=False) == flavour
    assert (p.onednn_refusal(torch.bfloat16) is None) == (bf16_packs and platform._torch_onednn_bf16())
    assert (p.onednn_refusal(torch.float32) is None) == fp32_packs
    assert p.onednn_refusal(torch.float16) is not None
    assert "march=native" not in " ".join(p.kernel_flags(flavour))


def test_avx_vnni_client_cores_take_their_own_flavour() -> None:
    """An AVX2 core with AVX-VNNI (Alder Lake on: no AVX-512) gets the avxvnni flavour in both the
    decode kernel and the quantized products (their 256-bit vpdpbusd), float32 as any AVX2 core;
    without the feature, the AVX2 flavour as before."""
    alder = _cpu((*platform.PROFILES["avx2"], "avx_vnni"))
    assert alder.kernel_flavour() == alder.quant_flavour() == "avxvnni" and not alder.native_bf16
    assert "-mavxvnni" in alder.kernel_flags("avxvnni") and "-mavx512vnni" not in alder.quant_flags("avxvnni")
    assert _cpu(platform.PROFILES["avx2"]).quant_flavour() == "avx2"
    assert _cpu(platform.PROFILES["amx"] + ("avx_vnni",)).quant_flavour() == "avx512vnni"


def test_arm_takes_the_portable_kernel_and_no_packing() -> None:
    graviton = _cpu(("neon", "bf16", "sve"), arch="aarch64")
    assert graviton.native_bf16 and graviton.kernel_flavour() == "portable"
    assert graviton.kernel_flags("portable") == [] and not graviton.can_build("avx2")
    assert graviton.onednn_refusal(torch.float32) is not None
    assert not _cpu(("neon",), arch="aarch64").native_bf16


def test_a_profile_above_the_hardware_is_clamped_where_code_runs() -> None:
    """AVX512-BF16 claimed on an AVX2 CPU: the dtype decision follows the claim, every
    instruction-set path falls back to what the CPU runs, and the summary says both."""
    zen3 = platform.CpuInfo("x86_64", "zen3", frozenset(platform.PROFILES["avx2"]), 2)
    p = platform.Platform(zen3, platform.parse_override("avx512_bf16", zen3.features), "avx512_bf16")
    assert p.native_bf16
    assert p.kernel_flavour(runnable=False) == "avx512bf16" and p.kernel_flavour() == "avx2"
    assert not p.can_run("avx512bf16") and p.can_run("avx2")
    assert "not runnable" in (p.onednn_refusal(torch.bfloat16) or "")
    assert "INFLIGHT_CPU_FEATURES=avx512_bf16; hardware: avx2 fma" in p.summary()
    assert "bf16: native (forced; this CPU emulates it)" in p.summary()


def test_override_syntax(caplog: pytest.LogCaptureFixture) -> None:
    hw = frozenset(platform.PROFILES["avx512_bf16"])
    assert platform.parse_override("native,-avx512_bf16", hw) == hw - {"avx512_bf16"}
    assert platform.parse_override("avx2 avx_ne_convert", hw) == {*platform.PROFILES["avx2"], "avx_ne_convert"}
    with caplog.at_level(logging.WARNING, logger="inflight.platform"):
        assert platform.parse_override("portable,avx9000", hw) == frozenset()
    assert "avx9000" in caplog.text
    with platform.forced("portable") as p:
        assert platform.current() is p and p.features == frozenset() and p.override == "portable"
    assert platform.current().override == (os.environ.get(platform.ENV) or None)  # what was set before (CI: none)


def test_summary_line_of_this_machine() -> None:
    line = platform.current().summary()
    assert re.fullmatch(r"cpu: \S+ .+ \(\d+ cores\) \| bf16: (native|emulated)", line), line


BF16_CKPT = {"torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    ("profile", "device", "ckpt", "want"),
    [
        ("avx2", "cpu", "bfloat16", torch.float32),
        ("avx512", "cpu", "bfloat16", torch.float32),
        ("avx512_bf16", "cpu", "bfloat16", torch.bfloat16),
        ("avx2", "cpu", "float16", torch.float32),
        ("amx", "cpu", "float16", torch.bfloat16),
        ("avx2", "cpu", "float32", torch.float32),
        ("avx2", "cuda", "bfloat16", torch.bfloat16),  # CUDA keeps the checkpoint's dtype
        ("avx2", "cuda", "float16", torch.float16),
    ],
)
def test_dtype_auto(profile: str, device: str, ckpt: str, want: torch.dtype, caplog: pytest.LogCaptureFixture) -> None:
    with platform.forced(profile), caplog.at_level(logging.INFO, logger="inflight.config"):
        assert resolve_dtype("auto", {"dtype": ckpt}, torch.device(device)) == want
    served_as_fp32 = device == "cpu" and ckpt != "float32" and want == torch.float32
    assert ("served in float32" in caplog.text) == served_as_fp32


def test_explicit_bfloat16_without_native_bf16_warns_with_the_faster_choice(caplog: pytest.LogCaptureFixture) -> None:
    with platform.forced("avx2"), caplog.at_level(logging.WARNING, logger="inflight.config"):
        assert resolve_dtype("bfloat16", BF16_CKPT, torch.device("cpu")) == torch.bfloat16
    assert "float32 here) is faster" in caplog.text
    caplog.clear()
    with platform.forced("avx512_bf16"), caplog.at_level(logging.WARNING, logger="inflight.config"):
        assert resolve_dtype("bfloat16", BF16_CKPT, torch.device("cpu")) == torch.bfloat16
    assert caplog.text == ""


@pytest.mark.parametrize(("profile", "dtype"), [("avx2", torch.bfloat16), ("portable", torch.float32),
                                                ("amx", torch.float16)])  # fmt: skip
def test_packer_refuses_what_the_platform_refuses(profile: str, dtype: torch.dtype) -> None:
    """Forced down, the packer raises even on a CPU where oneDNN would have packed: it asks the
    platform module, not oneDNN and not the hardware."""
    w = torch.randn(64, 32).to(dtype)
    with platform.forced(profile):
        assert not cpu_packing_available(torch.device("cpu"), dtype)
        with pytest.raises(UnsupportedFastPath, match="oneDNN weight packing"):
            pack_weight(w)


def test_packer_packs_what_the_platform_allows() -> None:
    """On this CPU: every dtype the platform allows packs and computes F.linear's product."""
    allowed = [d for d in (torch.bfloat16, torch.float32) if platform.current().onednn_refusal(d) is None]
    assert allowed or not {"avx2", "fma"} <= platform.detect().features  # fp32 packs on every AVX2 CPU
    for dtype in allowed:
        w, x = torch.randn(64, 32).to(dtype), torch.randn(3, 32).to(dtype)
        y = torch.ops.mkldnn._linear_pointwise(x, pack_weight(w), None, "none", [], "")
        torch.testing.assert_close(y, torch.nn.functional.linear(x, w))


def test_every_kernel_flavour_compiles_but_only_runnable_ones_load(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The AVX512-BF16 build is compiled (not run) on CPUs without it, so its C is checked everywhere."""
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path))
    for flavour in filter(platform.current().can_build, platform.KERNEL_FLAVOURS):
        variant = cpu_kernel.Variant(flavour)
        assert cpu_kernel.build_library(variant).exists()
        if platform.current().can_run(flavour):
            assert cpu_kernel.load_library(variant).ifl_gemv_path() == variant.gemv_path()
        else:
            with pytest.raises(cpu_kernel.KernelUnavailable, match="not runnable on this CPU"):
                cpu_kernel.load_library(variant)


def test_extra_defines_build_their_own_library_beside_the_default() -> None:
    """load_library(variant, extra_defines): decode_kernel.c built with -DIFL_PROFILE (its profiling
    counters on: ifl_profile hands out PH_N phases, the default build 0), its own .so and cache
    entry; the default build is the same object as before; a flag in a define's place is refused."""
    variant = cpu_kernel.Variant(platform.current().kernel_flavour())
    plain = cpu_kernel.load_library(variant)
    profiled = cpu_kernel.load_library(variant, ("IFL_PROFILE",))
    assert cpu_kernel.build_library(variant) != cpu_kernel.build_library(variant, extra_defines=("IFL_PROFILE",))
    out = (ctypes.c_double * 1024)()
    assert plain.ifl_profile(out, 1) == 0 and profiled.ifl_profile(out, 1) > 0
    assert cpu_kernel.load_library(variant) is plain and cpu_kernel.load_library(variant, ("IFL_PROFILE",)) is profiled
    for bad in ("-DIFL_PROFILE", "IFL_PROFILE -O0", "-march=native"):
        with pytest.raises(ValueError, match="not a define"):
            cpu_kernel.load_library(variant, (bad,))
    flags = cbuild.quant_compile_flags("avx2", ["TQ_CHUNK=8"])
    assert "-DTQ_CHUNK=8" in flags and flags[1:-4] == [*platform.current().quant_flags("avx2"), "-DTQ_CHUNK=8"]


# Only platform.py may ask the hardware; these are the ways to ask (a compiler flag in a string
# literal: the kernel's instruction set must come from the platform module's flavour).
_HARDWARE_QUERIES = re.compile(
    r"/proc/cpuinfo|get_cpu_capability|sysctl|_is_mkldnn_bf16_supported|hw\.optional|cpuid"
    r"|get_device_capability|[\"'](-march|-mcpu|-mtune)=|__builtin_cpu_supports"
)


def test_fast_paths_ask_the_platform_module_not_the_hardware() -> None:
    root = Path(platform.__file__).parent
    offenders = [
        f"{path.relative_to(root)}: {m.group(0)}"
        for path in sorted([*root.rglob("*.py"), *root.rglob("*.c")])
        if path.name != "platform.py"
        for m in _HARDWARE_QUERIES.finditer(path.read_text())
    ]
    assert not offenders, offenders


# ------------------------------------------------------------------ process memory (inflight/memory.py)
def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_memory_configure_bounds_the_onednn_caches_unless_set() -> None:
    env = {"LRU_CACHE_CAPACITY": "7"}
    assert memory.configure(env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(memory.CACHE_CAPACITY)}
    assert env["LRU_CACHE_CAPACITY"] == "7"  # the operator's own value stays


@pytest.mark.skipif(memory._LIBC is None, reason="glibc only")
def test_memory_trim_gives_freed_heap_pages_back() -> None:
    """64 KiB blocks come from the heap (under the mmap threshold); freed below a live one, glibc
    keeps their pages until malloc_trim."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(800)]  # 50 MiB
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    for b in blocks[:-1]:
        libc.free(b)
    held = _rss_mb()
    assert memory.trim()
    assert _rss_mb() < held - 30
    libc.free(blocks[-1])


def test_memory_trimmer_schedule_and_the_fallback(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: calls.append(1) or True)
    monkeypatch.setattr(memory, "_LIBC", object())
    t = memory.Trimmer(interval_s=10)
    t0 = t.last
    assert not t.idle(now=t0 + 100)  # no step ran: nothing to give back
    assert not t.after_step(busy=True, now=t0 + 5)  # busy: every 10 s at most
    assert t.after_step(busy=True, now=t0 + 11)
    assert not t.after_step(busy=False, now=t0 + 11.5)  # idle: once a second at most
    assert t.idle(now=t0 + 12.5) and not t.idle(now=t0 + 20)  # then not again until a step runs
    assert len(calls) == 2 == t.num_trims
    monkeypatch.setenv("INFLIGHT_MALLOC_TRIM_S", "0")  # the operator's switch
    assert not memory.Trimmer().enabled
    monkeypatch.undo()
    monkeypatch.setattr(memory, "_LIBC", None)  # musl, macOS, Windows: no malloc_trim
    assert memory.trim() is False
    t = memory.Trimmer(interval_s=10)
    assert not t.enabled and not t.after_step(busy=False, now=t.last + 100)


def test_bf16_weights_stay_bf16_only_on_avx2_without_bf16() -> None:
    """dtype auto keeps a bf16 checkpoint's linear weights bf16 (widened in the kernels) on AVX2;
    with AVX-512 (oneDNN's float32 GEMM measured faster), native bf16 or no AVX2, it does not."""
    got = {name: _cpu(PROFILES_FOR_WIDEN[name]).widens_bf16 for name in PROFILES_FOR_WIDEN}
    assert got == {"avx2": True, "avx512": False, "avx512_bf16": False, "portable": False, "neon": False}
    with platform.forced("avx2"):
        ckpt = {"torch_dtype": "bfloat16"}
        cpu = torch.device("cpu")
        assert resolve_weight_dtype("auto", ckpt, cpu, torch.float32) == torch.bfloat16
        assert resolve_weight_dtype("float32", ckpt, cpu, torch.float32) is None  # explicit: float32 copies
        assert resolve_weight_dtype("auto", {"torch_dtype": "float32"}, cpu, torch.float32) is None


PROFILES_FOR_WIDEN = {name: platform.PROFILES[name] for name in ("avx2", "avx512", "avx512_bf16", "portable", "neon")}
