"""Decode attention read straight from the paged pool on the CPU (`csrc/paged_decode.cpp`).

The SDPA path of `sdpa_paged.decode_rows` first gathers every row's K/V into a padded copy
(`index_select` over the slots), then runs one SDPA call over it: at 8 rows of ~500 tokens that
is most of a decode step's attention (2.9 ms a layer, against 0.5 ms for this kernel, measured
by `tests/attention/test_cpu_decode.py`'s shapes on 2 cores). The kernel reads each row's K/V
rows where the pool keeps them, one work item per (row, KV head) so a GQA group's query heads
share every read, and returns log-sum-exps too, so the cascade path can merge a shared prefix.

It is plain C++ (no torch headers), compiled on first use with the machine's C++ compiler (the
one torch's inductor needs already) at `-O3 -march=native -fopenmp`, into
`<cache root>/kernels/` keyed by source, compiler and CPU; later starts load the built library
(a few ms). OpenMP resolves to the runtime torch already loaded (same soname), so both share one
thread pool. Without a compiler, or with `RADIXKV_CPU_KERNELS=0`, `library()` is None and the
SDPA path runs; correctness never depends on it (tests compare the two).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from radixkv.cache_dirs import cache_root
from radixkv.errors import CacheInvariantError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
ENV_SWITCH = "RADIXKV_CPU_KERNELS"  # "0": never build or use the kernel

_lock = threading.Lock()
_state: dict[str, ctypes.CDLL | None] = {}


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build(cxx: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / out.name
        cmd = [cxx, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(target), str(SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
        os.replace(target, out)  # atomic: a concurrent builder's copy is as good


def library() -> ctypes.CDLL | None:
    """The built kernel library, building it on first use; None when it cannot be had."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        _state["lib"] = lib = _load()
        return lib


def _load() -> ctypes.CDLL | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    cxx = _compiler()
    if cxx is None:
        logger.info("no C++ compiler: decode attention gathers K/V for SDPA")
        return None
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256(SOURCE.read_bytes() + version.encode() + _cpu_id().encode()).hexdigest()[:16]
        path = cache_root() / "kernels" / f"paged_decode-{key}.so"
        if not path.exists():
            logger.info("building the paged decode attention kernel (%s)", path)
            _build(cxx, path)
        lib = ctypes.CDLL(str(path))
        if lib.radixkv_paged_decode_abi() != 2:
            raise RuntimeError(f"{path}: unexpected ABI")
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("paged decode attention kernel unavailable, using SDPA: %s", e)
        return None
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.radixkv_paged_decode.argtypes = [p, p, p, p, p, p, p, i, i, i, i, i, i, ctypes.c_float]
    lib.radixkv_paged_decode.restype = ctypes.c_int64
    return lib


def usable(q: torch.Tensor, k_buffer, v_buffer) -> bool:
    """Whether the kernel can serve these tensors: CPU fp32, contiguous pool buffers."""
    return (isinstance(k_buffer, torch.Tensor) and isinstance(v_buffer, torch.Tensor) and q.device.type == "cpu"
            and q.dtype == k_buffer.dtype == v_buffer.dtype == torch.float32
            and k_buffer.is_contiguous() and v_buffer.is_contiguous() and library() is not None)


def paged_decode(
    q: torch.Tensor,  # (B, Hq, D) fp32
    k_buffer: torch.Tensor,  # (S, Hkv, D) fp32, contiguous
    v_buffer: torch.Tensor,  # (S, Hkv, D)
    slots: torch.Tensor,  # (B, L) int64: row b reads its first lens[b] slots
    lens: torch.Tensor,  # (B,) int64
    sm_scale: float,
    with_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, Hq, D), (B, Hq) or None
    """Each row's query over its slots' K/V, read in place (see the module docstring)."""
    B, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    assert Dk == D and Hq % Hkv == 0 and slots.shape[0] == B and lens.shape == (B,), (q.shape, k_buffer.shape)
    assert slots.dtype == lens.dtype == torch.int64
    q = q.contiguous()
    slots = slots.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32) if with_lse else None
    bad = library().radixkv_paged_decode(q.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), slots.data_ptr(),
                                         lens.data_ptr(), out.data_ptr(), None if lse is None else lse.data_ptr(),
                                         B, Hq, Hkv, D, slots.shape[1], S, float(sm_scale))
    if bad:
        raise CacheInvariantError(f"paged decode: {bad} of {B} rows list slots outside the pool's {S} "
                                  f"or more than their {slots.shape[1]} columns")
    return out, lse
