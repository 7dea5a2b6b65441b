"""The one place that knows the hardware: CPU architecture and features, cores, CUDA devices.

Every fast path asks this module what the machine can do (dtype `auto`, oneDNN weight packing,
the C decode kernel's instruction set and compile flags) and never reads /proc/cpuinfo, sysctl or
torch's CPU capability itself; tests/unit/test_platform.py fails if one does. Detection runs once
per process: /proc/cpuinfo on Linux, `sysctl` on macOS, torch's CPU capability as a fallback.

Override (tests, or a user who wants a slower but safer path): INFLIGHT_CPU_FEATURES, a
comma-separated list of profiles and feature names, `-name` removing one:

    INFLIGHT_CPU_FEATURES=avx2                 # decide as on an AVX2 + FMA laptop
    INFLIGHT_CPU_FEATURES=native,-avx512_bf16  # this CPU without its bf16 instructions

The override decides what the fast paths *choose* (dtype, which packing and kernel flavour), but
code that executes special instructions only ever runs what the real CPU has: a profile that
claims more than the hardware (AVX512-BF16 on an AVX2 machine) keeps its dtype decision, and each
instruction-set path it would pick is clamped to the best one this CPU runs, which the summary
line says. Forcing a profile *down* (AVX2 on an AVX-512 server) therefore runs for real.
"""

from __future__ import annotations

import functools
import logging
import os
import platform as _py_platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

ENV = "INFLIGHT_CPU_FEATURES"

_AVX2 = ("avx", "avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
_AVX512_BF16 = (*_AVX512, "avx512_vnni", "avx512_bf16")
# Named feature sets for the override; `portable` is the baseline instruction set of the arch.
PROFILES: dict[str, tuple[str, ...]] = {
    "portable": (),
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512_bf16": _AVX512_BF16,
    "amx": (*_AVX512_BF16, "amx_tile", "amx_bf16", "amx_int8"),
    "neon": ("neon",),
    "neon_bf16": ("neon", "bf16", "i8mm", "dotprod"),
}
# The features this module knows (Linux /proc/cpuinfo spelling); others are ignored.
X86_FEATURES = (*PROFILES["amx"], "avx_vnni", "avx_ne_convert")
ARM_FEATURES = ("neon", "dotprod", "bf16", "i8mm", "sve", "sve2")
_ARM_ALIASES = {"asimd": "neon", "asimddp": "dotprod"}

# The decode kernel's instruction-set flavours, best first, with what each needs and its gcc flags.
# Explicit -m flags instead of -march=native: the flavour (and so the override) decides, and a
# forced-down flavour must not pick up this CPU's wider instructions in the compiled C.
KERNEL_FLAVOURS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "avx512bf16": (frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                              "avx512_vnni"}),  # every AVX512-BF16 CPU has VNNI: the quantized GEMVs use it
                   ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mavx512bf16", "-mavx512vnni")),
    # AVX-VNNI client cores (Alder Lake on): the AVX2 GEMVs, the quantized products' 256-bit vpdpbusd
    "avxvnni": (frozenset({"avx2", "fma", "f16c", "avx_vnni"}), ("-mavx2", "-mfma", "-mf16c", "-mavxvnni")),
    "avx2": (frozenset({"avx2", "fma"}), ("-mavx2", "-mfma", "-mf16c")),
    "portable": (frozenset(), ()),
}  # fmt: skip
# The quantized-weight kernels' flavours (inflight/csrc/quant_kernels.c), best first: integer dot
# products of uint8 weights and int8 activations, vpdpbusd where AVX-512 VNNI is, maddubs on AVX2.
QUANT_FLAVOURS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "avx512vnni": (frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
                   ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")),
    # AVX-VNNI (Intel Alder Lake and later client cores: AVX2 with a 256-bit VEX vpdpbusd, no AVX-512)
    "avxvnni": (frozenset({"avx2", "fma", "f16c", "avx_vnni"}), ("-mavx2", "-mfma", "-mf16c", "-mavxvnni")),
    "avx2": (frozenset({"avx2", "fma", "f16c"}), ("-mavx2", "-mfma", "-mf16c")),
    "portable": (frozenset(), ()),
}  # fmt: skip
# Software prefetch of the 1-row quantized GEMVs' weight streams, bytes ahead, by vendor: csrc/
# quant_gemv_q8.h's q8_0 rows, quant_gemv_q32_pair.h's interleaved q4_0 / q5_0 pair, and
# quant_gemv.h's K-quant rows from K = 4096 on (Zen: 8192 on, 8 KB ahead). Zen 3 / 4's hardware
# prefetchers keep up alone (the hints were neutral or slower there: quant_history.md); on a
# Sapphire-Rapids-class Xeon they do not, the pair's two interleaved streams least. There, CPU ms a
# step of the GEMVs (benchmarks/stream_ab.py, QUANTIZATION.md): 0.5B Q4_K_M 28.6 -> 16.5, Q8_0
# 22.3 -> 19.6 (2 KB: a further ~7 %), 8B Q4_K_M 302 -> 242. The K-quant rows' hint into L1 (T0) 2 KB
# ahead rather than Zen's L2 (T2): the 8B Q4_K_M's GEMVs 197 -> 181 CPU ms a step, its down
# projection (q4_k / q6_k, K = 14336) 59.5 -> 54.1, the 0.5B's (K = 4864) 3.08 -> 2.76 (stream_ab.py,
# interleaved; quant_history.md, "Tiles by bytes, and T0 for the K-quants on Intel").
_STREAM_PREFETCH = {"intel": ("-DIFLV_Q32_PF=1024", "-DIFLV_Q8_PF=2048", "-DIFLV_PF_K=4096", "-DIFLV_PF=2048",
                              "-DIFLV_PF_HINT=_MM_HINT_T0", "-DIFLV_PF2=5120")}
# oneDNN's bf16 GEMM needs one of these sets (torch: "bf16 path needs the cpu support
# avx_ne_convert or avx512bw, avx512vl and avx512dq"); below that it refuses to reorder weights.
_ONEDNN_BF16 = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx2", "avx_ne_convert"}))
# fp32 packing is measured on AVX2 (2.2x F.linear at 32 rows on Zen 3) and AVX-512; not below.
_ONEDNN_FP32 = frozenset({"avx2", "fma"})


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as detected: never overridden."""

    arch: str  # "x86_64" or "aarch64"
    name: str  # best-effort microarchitecture label: "zen3", "intel-amx", "neoverse-v1", ...
    features: frozenset[str]
    num_cores: int  # cores this process may run on
    model_name: str = ""  # "AMD EPYC 7B13", as the OS names it


@dataclass(frozen=True)
class CudaDevice:
    name: str
    capability: tuple[int, int]
    total_memory: int
    sm_count: int = 0  # streaming multiprocessors: how many programs a kernel's grid needs to fill the GPU


@dataclass(frozen=True)
class Platform:
    """What the fast paths may assume. `features` is the override when one is set, else the CPU's."""

    cpu: CpuInfo
    features: frozenset[str]
    override: str | None = None

    @property
    def x86(self) -> bool:
        return self.cpu.arch in ("x86_64", "amd64", "i686")

    @property
    def runnable(self) -> frozenset[str]:
        """Features that code may actually execute: claimed by the profile and present in hardware."""
        return self.features & self.cpu.features

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware (dot products, not only conversions): what dtype `auto` asks.
        AVX512-BF16 or AMX-BF16 on x86, the BF16 extension on ARM (the names never overlap, so an
        x86 profile forced on an ARM machine decides as that x86 CPU would)."""
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & self.features)

    @property
    def widens_bf16(self) -> bool:
        """dtype auto keeps a bf16 checkpoint's linear weights bf16 (float32 arithmetic, widened in
        the kernels) rather than float32 copies: on AVX2 CPUs without native bf16. Measured on a
        Zen 4 forced to AVX2 (docs/QUANTIZATION.md): the widening GEMM runs 32 rows as fast as
        oneDNN's float32 one limited to AVX2, batch 1 reads bf16 either way, memory halves. Not with
        AVX-512 (oneDNN's float32 GEMM there measured ~1.2x faster) nor without AVX2 (portable C)."""
        return not self.native_bf16 and {"avx2", "fma", "f16c"} <= self.features and "avx512f" not in self.features

    def onednn_refusal(self, dtype: torch.dtype) -> str | None:
        """Why oneDNN weight packing is not used for `dtype` on this CPU; None when it is."""
        name = str(dtype).replace("torch.", "")
        if not self.x86:
            return f"oneDNN packing is x86-only here ({self.cpu.arch})"
        if dtype == torch.float32:
            need: tuple[frozenset[str], ...] = (_ONEDNN_FP32,)
        elif dtype == torch.bfloat16:
            need = _ONEDNN_BF16
        else:
            return f"no oneDNN packing for {name}"
        if not any(n <= self.features for n in need):
            return f"{name} packing needs {' or '.join('+'.join(sorted(n)) for n in need)}"
        if not any(n <= self.cpu.features for n in need):
            return f"{name} packing not runnable: this CPU lacks {' or '.join('+'.join(sorted(n)) for n in need)}"
        if dtype == torch.bfloat16 and not _torch_onednn_bf16():
            return "bfloat16 packing: torch's oneDNN reports no bf16 support on this CPU"
        return None

    def kernel_flavour(self, runnable: bool = True) -> str:
        """The decode kernel's instruction-set flavour: chosen from the claimed features, or from
        those the CPU can run (`runnable`, what is built and loaded)."""
        have = self.runnable if runnable else self.features
        return next(name for name, (need, _) in KERNEL_FLAVOURS.items() if need <= have)

    def can_run(self, flavour: str) -> bool:
        return KERNEL_FLAVOURS[flavour][0] <= self.cpu.features

    def can_build(self, flavour: str) -> bool:
        """Whether this machine's compiler targets the flavour (x86 builds every x86 flavour, also
        one the CPU cannot run: tests compile them all; it is only loaded where it runs)."""
        return flavour == "portable" or self.x86

    def kernel_flags(self, flavour: str) -> list[str]:
        """The compiler flags of a flavour."""
        return [*KERNEL_FLAVOURS[flavour][1], *self.stream_prefetch(flavour)]

    def stream_prefetch(self, flavour: str) -> tuple[str, ...]:
        """The -D flags of this CPU's weight-stream prefetch (_STREAM_PREFETCH); none in portable C."""
        return () if flavour == "portable" else _STREAM_PREFETCH.get(self.cpu.name.split("-")[0], ())

    def quant_flavour(self, runnable: bool = True) -> str:
        """The quantized kernels' flavour (QUANT_FLAVOURS), as `kernel_flavour` chooses."""
        have = self.runnable if runnable else self.features
        return next(name for name, (need, _) in QUANT_FLAVOURS.items() if need <= have)

    def can_run_quant(self, flavour: str) -> bool:
        return QUANT_FLAVOURS[flavour][0] <= self.cpu.features

    def quant_flags(self, flavour: str) -> list[str]:
        return [*QUANT_FLAVOURS[flavour][1], *self.stream_prefetch(flavour)]

    def summary(self) -> str:
        """`cpu: zen3 avx2 fma (2 cores) | bf16: emulated`: the start of the engine's log line."""
        text = f"cpu: {self.cpu.name} {_short(self.features)} ({self.cpu.num_cores} cores)"
        if self.override is not None:
            text += f" [{ENV}={self.override}; hardware: {_short(self.cpu.features)}]"
        bf16 = "native" if self.native_bf16 else "emulated"
        if self.native_bf16 and not Platform(self.cpu, self.cpu.features).native_bf16:
            bf16 += " (forced; this CPU emulates it)"
        return f"{text} | bf16: {bf16}"


def _short(features: frozenset[str]) -> str:
    """Features for a log line, AVX-512's four base sets folded into one word."""
    order = [f for f in (*X86_FEATURES, *ARM_FEATURES) if f in features and f not in ("avx", "f16c")]
    base = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
    if all(b in order for b in base):
        order = [("avx512" if f == "avx512f" else f) for f in order if f not in base[1:]]
    return " ".join(dict.fromkeys(order)) or "baseline"


@functools.cache
def _torch_onednn_bf16() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else True


# ------------------------------------------------------------------ detection
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_cpuinfo(text: str, arch: str) -> tuple[frozenset[str], str]:
    """(features, microarchitecture label) from the text of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip() and fields:
            break  # the first processor's block is enough
    words = set((fields.get("flags") or fields.get("Features") or "").split())
    if arch.startswith(("x86", "amd64", "i686")):
        feats = frozenset(f for f in X86_FEATURES if f in words)
        return feats, _x86_name(fields.get("vendor_id", ""), fields.get("cpu family", ""), fields.get("model", ""), feats)
    feats = frozenset({_ARM_ALIASES.get(w, w) for w in words} & set(ARM_FEATURES))
    return feats, _ARM_PARTS.get(fields.get("CPU part", "").lower(), "arm")


def _x86_name(vendor: str, family: str, model: str, feats: frozenset[str]) -> str:
    try:
        fam, mod = int(family), int(model)
    except ValueError:
        fam, mod = 0, 0
    if vendor == "AuthenticAMD" and fam in (23, 25, 26):
        if fam == 23:
            return "zen2" if mod >= 0x30 else "zen"
        if fam == 26:
            return "zen5"
        return "zen4" if (0x10 <= mod <= 0x1F or 0x60 <= mod <= 0xAF) else "zen3"
    prefix = "intel" if vendor == "GenuineIntel" else "x86"
    for feat, label in (("amx_bf16", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if feat in feats:
            return f"{prefix}-{label}"
    return f"{prefix}-64"


_ARM_PARTS = {"0xd0c": "neoverse-n1", "0xd40": "neoverse-v1", "0xd49": "neoverse-n2", "0xd4f": "neoverse-v2"}
_MAC_ARM = {"FEAT_BF16": "bf16", "FEAT_I8MM": "i8mm", "FEAT_DotProd": "dotprod", "FEAT_SVE": "sve"}


def _detect_macos(arch: str) -> tuple[frozenset[str], str]:
    if arch == "arm64":
        feats = {"neon"} | {f for key, f in _MAC_ARM.items() if _sysctl(f"hw.optional.arm.{key}") == "1"}
        brand = _sysctl("machdep.cpu.brand_string").lower()  # "apple m2 pro"
        return frozenset(feats), "-".join(brand.split()[:2]) or "apple"
    words = (_sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")).lower().split()
    feats = frozenset(f for f in X86_FEATURES if f in words or f.replace("_", "") in words)  # AVX512BF16
    return feats, _x86_name("", "", "", feats)


def _from_torch_capability() -> frozenset[str]:
    cap = torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512", "DEFAULT", ...
    if cap.startswith("AVX512"):
        return frozenset(_AVX512)
    return frozenset(_AVX2) if cap == "AVX2" else frozenset()


@functools.cache
def detect() -> CpuInfo:
    """The CPU this process runs on (cached: read once)."""
    machine = _py_platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if _py_platform.system() == "Darwin":
        feats, name = _detect_macos(machine)
    else:
        feats, name = parse_cpuinfo(_read("/proc/cpuinfo"), arch)
        if not feats and arch == "x86_64":
            feats = _from_torch_capability()
            name = _x86_name("", "", "", feats)
        elif not feats and arch == "aarch64":
            feats = frozenset({"neon"})  # AdvSIMD is mandatory on AArch64
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return CpuInfo(arch=arch, name=name, features=feats, num_cores=cores, model_name=_model_name())


def _model_name() -> str:
    if _py_platform.system() == "Darwin":
        return _sysctl("machdep.cpu.brand_string")
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return _py_platform.processor()


def parse_override(spec: str, hardware: frozenset[str]) -> frozenset[str]:
    """INFLIGHT_CPU_FEATURES text -> the claimed feature set (unknown words are warned about)."""
    known = set(X86_FEATURES) | set(ARM_FEATURES)
    claimed: set[str] = set()
    for word in (w.strip().lower() for w in spec.replace(" ", ",").split(",")):
        if not word:
            continue
        if word == "native":
            claimed |= hardware
        elif word in PROFILES:
            claimed |= set(PROFILES[word])
        elif word.startswith("-") and word[1:] in known:
            claimed.discard(word[1:])
        elif word in known:
            claimed.add(word)
        else:
            logger.warning("%s: unknown word %r ignored (profiles: %s)", ENV, word, ", ".join(PROFILES))
    return frozenset(claimed)


@functools.cache
def _platform(override: str | None) -> Platform:
    cpu = detect()
    if override is None:
        return Platform(cpu=cpu, features=cpu.features)
    return Platform(cpu=cpu, features=parse_override(override, cpu.features), override=override)


def current() -> Platform:
    """The platform the fast paths ask (the override is read on every call; detection once)."""
    return _platform(os.environ.get(ENV) or None)


@contextmanager
def forced(spec: str) -> Iterator[Platform]:
    """Decide as if the CPU had `spec` (an INFLIGHT_CPU_FEATURES value) inside the block."""
    old = os.environ.get(ENV)
    os.environ[ENV] = spec
    try:
        yield current()
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


@functools.cache
def cuda_devices() -> tuple[CudaDevice, ...]:
    if not torch.cuda.is_available():
        return ()
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append(CudaDevice(p.name, (p.major, p.minor), p.total_memory, p.multi_processor_count))
    return tuple(devices)


def cuda_summary() -> str:
    devices = cuda_devices()
    if not devices:
        return "cuda: none"
    d = devices[0]
    return f"cuda: {len(devices)} x {d.name} (sm_{d.capability[0]}{d.capability[1]}, {d.total_memory / 2**30:.0f} GiB)"
