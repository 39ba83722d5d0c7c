"""MKL's AVX-512 kernels on AVX-512 CPUs that are not Intel's (`csrc/mkl_dispatch.cpp`).

Torch's fp32 `matmul`/`bmm`, and the block products inside its CPU flash attention, run on MKL.
MKL chooses its kernels once per process, and on a CPU whose vendor is not Intel it takes the
AVX2 ones whatever the CPU offers: on the 2-core AMD EPYC (Zen 5, full AVX-512) this project
measures on, sgemm ran at 214 GFLOP/s where oneDNN's AVX-512 kernels reach 413, and prefill
attention over a cached 2k-token prompt took twice the time it needs. `enable()` points MKL's
vendor check at an answer of "Intel", so MKL chooses by the CPU's feature bits as it does on
Intel's parts: sgemm 500 GFLOP/s; a 2k-token cold prefill 1.33x faster end to end
(`benchmarks/customer_service.py`).

It must run before the process's first MKL call: `ModelRunner.load` calls it first thing. When
something called MKL earlier (a test process, an application that did its own matmuls), MKL's
choice stands, and the status says so. The choice changes the order of floating-point sums
inside a product, not its precision (fp32 throughout).

`RADIXKV_MKL_AVX512=0` leaves MKL alone; so do `RADIXKV_CPU_KERNELS=0` and a missing compiler.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from pathlib import Path

import torch

from radixkv import native

logger = logging.getLogger(__name__)

ENV_SWITCH = "RADIXKV_MKL_AVX512"  # "0": leave MKL's own choice
VENDOR_CHECK = b"mkl_serv_intel_cpu_true"  # MKL's question; what its answer decides is above
NEEDED_FLAGS = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")  # MKL's AVX-512 kernels


def _declare(lib: ctypes.CDLL) -> None:
    lib.radixkv_mkl_dispatch_patch.argtypes = [ctypes.c_char_p]
    lib.radixkv_mkl_dispatch_patch.restype = ctypes.c_int
    lib.radixkv_mkl_dispatch_calls.restype = ctypes.c_int


KERNEL = native.NativeLibrary("mkl_dispatch", Path(__file__).with_name("csrc") / "mkl_dispatch.cpp", 1, _declare)
_lock = threading.Lock()
_status: str | None = None


def cpu_info() -> tuple[str, set[str]]:
    """The CPU's vendor id and feature flags ('' and {} where unreadable)."""
    vendor, flags = native.cpu_info()
    return vendor, set(flags.partition(":")[2].split())


def why_not(vendor: str, flags: set[str]) -> str | None:
    """Why MKL is left to its own choice on this process and CPU, or None if `enable` applies."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"left alone ({ENV_SWITCH}=0)"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return "left alone (not Linux on x86-64)"
    if not torch.backends.mkl.is_available():
        return "not in this torch build"
    if vendor == "GenuineIntel":
        return "its own choice (an Intel CPU)"
    missing = [f for f in NEEDED_FLAGS if f not in flags]
    if missing:
        return f"its own choice (no {missing[0]})"
    return None


def enable() -> str:
    """Let MKL take its AVX-512 kernels here if this CPU has them; what MKL runs, in words.

    Idempotent; the first call in a process decides."""
    global _status
    with _lock:
        if _status is None:
            _status = _enable()
            logger.debug("MKL: %s", _status)
        return _status


def status() -> str | None:
    """What `enable` decided in this process, or None before it ran."""
    return _status


def _enable() -> str:
    reason = why_not(*cpu_info())
    if reason is not None:
        return reason
    lib = KERNEL.get()
    if lib is None:
        return "AVX2 kernels (the dispatch helper is not built: no compiler, or RADIXKV_CPU_KERNELS=0)"
    slots = lib.radixkv_mkl_dispatch_patch(VENDOR_CHECK)
    if slots <= 0:
        return "AVX2 kernels (" + ("its vendor check is not called through a patchable slot" if slots == 0
                                   else "a slot of its vendor check could not be written") + ")"
    probe = torch.ones(8, 8)
    torch.mm(probe, probe)  # MKL's first call, if nothing called it before: it asks the vendor check now
    if lib.radixkv_mkl_dispatch_calls() == 0:
        return "AVX2 kernels (MKL had chosen them before this process loaded the model)"
    return "AVX-512 kernels (vendor check patched)"
