"""The C++ CPU kernels shipped as sources: built on first use, loaded with ctypes (`NativeLibrary`).

Each kernel is one plain C++ file (no torch headers) compiled with the machine's C++ compiler
(the one torch's inductor needs already) at `-O3 -march=native -fopenmp`, into
`<cache root>/kernels/<name>-<key>.so`, the key hashing the source and every file it
`#include "..."`s, the compiler's version and the CPU's flags; later starts load the built
library (a few ms). OpenMP resolves to the runtime torch already loaded (same soname), so a
kernel and torch share one thread pool.

A library that registers torch operators (`torch_ops=True`: a compiled graph calls them without
going through Python) is built the same way against torch's headers (about 10 s, once per
torch version) and loaded with `torch.ops.load_library`.

Without a compiler, when a build fails, or with `RADIXKV_CPU_KERNELS=0`, `get()` is None and the
callers keep their torch path; correctness never depends on a kernel (tests compare the two).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from radixkv.cache_dirs import cache_root

logger = logging.getLogger(__name__)

ENV_SWITCH = "RADIXKV_CPU_KERNELS"  # "0": never build or use a kernel


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def cpu_info() -> tuple[str, str]:
    """The CPU's vendor id and its /proc/cpuinfo flags line ('' each where unreadable)."""
    vendor = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id") and not vendor:
                    vendor = line.partition(":")[2].strip()
                elif line.startswith("flags"):
                    return vendor, line
    except OSError:
        pass
    return vendor, ""


def _cpu_id() -> str:
    return cpu_info()[1] or platform.processor() or platform.machine()


class NativeLibrary:
    """One kernel source, `radixkv_<name>_abi()` returning `abi`; `declare` sets the ctypes
    signatures of the loaded library."""

    def __init__(self, name: str, source: Path, abi: int, declare: Callable[[ctypes.CDLL], None],
                 torch_ops: bool = False):
        """`torch_ops`: the source registers torch operators (`TORCH_LIBRARY_FRAGMENT`), so it is
        built against torch's headers and libraries and loaded with `torch.ops.load_library`."""
        self.name, self.source, self.abi, self.declare = name, source, abi, declare
        self.torch_ops = torch_ops
        self._lock = threading.Lock()
        self._state: dict[str, ctypes.CDLL | None] = {}

    def get(self) -> ctypes.CDLL | None:
        """The built library, building it on first use; None when it cannot be had."""
        with self._lock:
            if "lib" not in self._state:
                self._state["lib"] = self._load()
            return self._state["lib"]

    def set(self, lib: ctypes.CDLL | None) -> None:
        """Use `lib` from now on (None: the torch path), as tests compare the two."""
        with self._lock:
            self._state["lib"] = lib

    def forget(self) -> None:
        """Look again on the next `get()` (the switch, the compiler, the cache root)."""
        with self._lock:
            self._state.clear()

    def _load(self) -> ctypes.CDLL | None:
        if os.environ.get(ENV_SWITCH, "1") == "0":
            return None
        cxx = _compiler()
        if cxx is None:
            logger.info("no C++ compiler: the %s kernel is not built, torch's path runs", self.name)
            return None
        try:
            version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
            h = hashlib.sha256(version.encode() + _cpu_id().encode())
            for source in _sources(self.source):
                h.update(source.read_bytes())
            if self.torch_ops:
                import torch

                h.update(f"torch-{torch.__version__}".encode())  # built against its headers
            path = cache_root() / "kernels" / f"{self.name}-{h.hexdigest()[:16]}.so"
            if not path.exists():
                logger.info("building the %s kernel (%s)", self.name, path)
                self._build(cxx, path)
            if self.torch_ops:
                torch.ops.load_library(str(path))  # runs its operator registrations
            lib = ctypes.CDLL(str(path))
            if getattr(lib, f"radixkv_{self.name}_abi")() != self.abi:
                raise RuntimeError(f"{path}: unexpected ABI")
            self.declare(lib)
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as e:
            logger.warning("the %s kernel is unavailable, torch's path runs: %s", self.name, e)
            return None
        return lib

    def _build(self, cxx: str, out: Path) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            target = Path(tmp) / out.name
            cmd = [cxx, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(target), str(self.source),
                   *(_torch_flags() if self.torch_ops else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300 if self.torch_ops else 120)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
            os.replace(target, out)  # atomic: a concurrent builder's copy is as good


def _sources(source: Path) -> list[Path]:
    """`source` and every file it `#include "..."`s, transitively (relative to the including
    file): what a build's key must hash so that editing any of them rebuilds."""
    found, todo = [], [source.resolve()]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.append(path)
        todo += [(path.parent / m).resolve() for m in _QUOTED_INCLUDE.findall(path.read_text())]
    return found


_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _torch_flags() -> list[str]:
    """What building against torch's C++ API takes: its headers and ABI, its libraries (and
    their directory as the run path, so the library loads outside the build environment)."""
    import torch
    from torch.utils import cpp_extension

    libs = cpp_extension.library_paths()
    return ["-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in cpp_extension.include_paths()), *(f"-L{p}" for p in libs),
            *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch_cpu"]
