"""Building the C kernels: the system compiler, the kernel cache, one compile per source x flags.

Shared by every C kernel (csrc/decode_kernel.c through models/cpu_kernel.py, csrc/quant_kernels.c
through quant/kernels.py, the float kernels of quant/float_kernels.py). A build is keyed by the
source, the headers beside it, the compiler's version and the flags, cached in
~/.cache/inflight/kernels (or $INFLIGHT_CACHE_DIR/kernels), and written atomically.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from inflight import platform

_DEFINE = re.compile(r"[A-Za-z_]\w*(=\S*)?")


class KernelUnavailable(RuntimeError):
    """The kernel could not be built or loaded; the message says why (for the log)."""


def compiler() -> str | None:
    """The C compiler: $CC, else gcc, else cc; None when none is on this machine."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("gcc") or shutil.which("cc")


def cache_dir() -> Path:
    root = os.environ.get("INFLIGHT_CACHE_DIR") or Path.home() / ".cache" / "inflight"
    return Path(root) / "kernels"


def compile_flags(arch: list[str] | tuple[str, ...], defines: Iterable[str] = ()) -> list[str]:
    """Every C kernel's compile line: -O3, a flavour's `arch` flags, `defines` ("NAME" or
    "NAME=VALUE", each passed as -D: a build variant for tests and benchmarks), OpenMP, a
    position-independent shared library in GNU C11."""
    return ["-O3", *arch, *define_flags(defines), "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]


def quant_compile_flags(flavour: str, defines: Iterable[str] = ()) -> list[str]:
    """The compile line of a library in a quantized-kernel flavour (platform.QUANT_FLAVOURS:
    quant_kernels.c, float_kernels.c, attention_kernels.c, the benchmarks' probes)."""
    return compile_flags(platform.current().quant_flags(flavour), defines)


def define_flags(defines: Iterable[str]) -> list[str]:
    """("IFL_PROFILE", "TQ_CHUNK=8") -> ["-DIFL_PROFILE", "-DTQ_CHUNK=8"]; a name that is not a C
    identifier (a stray "-D", another flag) raises ValueError instead of reaching the compiler."""
    out = []
    for d in defines:
        if not _DEFINE.fullmatch(d):
            raise ValueError(f"not a define (NAME or NAME=VALUE): {d!r}")
        out.append(f"-D{d}")
    return out


def compile_cached(source: Path, stem: str, flags: list[str], cc: str | None = None) -> Path:
    """`source` compiled with `flags` into the kernel cache (keyed by the source, the headers
    beside it, the compiler's version and the flags); the .so's path. Shared by every C kernel
    (decode_kernel.c, quant_kernels.c). Raises KernelUnavailable with the compiler's message."""
    cc = cc or compiler()
    if cc is None:
        raise KernelUnavailable("no C compiler")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
        key = hashlib.sha256(text + (version + " ".join(flags)).encode()).hexdigest()[:16]
        path = cache_dir() / f"{stem}-{key}.so"
        if not path.exists():
            _compile(cc, source, path, flags)
    except subprocess.CalledProcessError as e:
        raise KernelUnavailable(f"{Path(cc).name} failed: {(e.stderr or e.stdout or '').strip()[-400:]}") from e
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"build failed: {e}") from e
    return path


def _compile(cc: str, source: Path, out: Path, flags: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], check=True, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
        os.replace(tmp, out)  # atomic: concurrent builders (test workers) race harmlessly
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def open_checked(path: Path, probes: tuple[str, ...], want: tuple[int, ...]) -> ctypes.CDLL:
    """The built library at `path`, whose int(void) functions `probes` return `want` (its ABI
    version, the instruction path it was compiled for, ...); raises KernelUnavailable saying why,
    so a stale or foreign build is refused at load instead of failing in a step."""
    try:
        lib = ctypes.CDLL(str(path))
        got = tuple(getattr(lib, name)() for name in probes)
    except (OSError, AttributeError) as e:
        raise KernelUnavailable(f"cannot load {path}: {e}") from e
    if got != want:
        raise KernelUnavailable(f"{path} is ({', '.join(probes)}) {got}, expected {want}")
    return lib



_PICKED: dict[tuple[object, ...], ctypes.CDLL | None] = {}


def platform_library(load: Callable[[str], ctypes.CDLL], flavour: str, what: str) -> ctypes.CDLL | None:
    """load(flavour), or None where it cannot be built or loaded (logged once; the caller's torch
    path runs). Remembered per flavour, $CC and $INFLIGHT_CACHE_DIR: a failed build under a test's
    CC=false is not remembered after it. A dict lookup, not a compiler search: resolving the
    compiler's path (~70 us) in each check cost the C attention ~3 ms a 24-layer batched step."""
    key = (load, flavour, os.environ.get("CC"), os.environ.get("INFLIGHT_CACHE_DIR"))
    if key not in _PICKED:
        try:
            _PICKED[key] = load(flavour)
        except KernelUnavailable as e:
            logging.getLogger(__name__).warning("%s unavailable (%s); the torch path runs", what, e)
            _PICKED[key] = None
    return _PICKED[key]


def library_asked(load: Callable[[str], ctypes.CDLL]) -> bool:
    """Whether platform_library(load, ...) ran in this process (a float model never builds the
    quantized kernels for their small ops)."""
    return any(key[0] is load for key in _PICKED)
