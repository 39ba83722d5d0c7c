"""MKL's kernel choice (`radixkv.model.mkl_dispatch`): AVX-512 on non-Intel AVX-512 CPUs, only
when asked before MKL's first call, and the same fp32 results as MKL's own choice.

MKL decides once per process, so each case runs in a fresh interpreter."""

import json
import subprocess
import sys

import pytest

from radixkv.model import mkl_dispatch
from radixkv.model.mkl_dispatch import cpu_info, why_not

APPLIES = why_not(*cpu_info()) is None
needs_amd_avx512 = pytest.mark.skipif(not APPLIES, reason=f"MKL is left alone here: {why_not(*cpu_info())}")

PROBE = r"""
import json, sys, torch
from radixkv.model import mkl_dispatch
torch.manual_seed(0)
if sys.argv[1] == "mkl-first":
    torch.ones(4, 4) @ torch.ones(4, 4)
status = mkl_dispatch.enable()
again = mkl_dispatch.enable()
a, b = torch.randn(257, 300), torch.randn(300, 129)
q, k, v = torch.randn(1, 9, 100, 64), torch.randn(1, 3, 700, 64), torch.randn(1, 3, 700, 64)
out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
kr, vr = k.double().repeat_interleave(3, 1), v.double().repeat_interleave(3, 1)
ref = torch.softmax(q.double() @ kr.transpose(-1, -2) / 8, -1) @ vr
print(json.dumps({"status": status, "again": again,
                  "mm_err": ((a @ b).double() - a.double() @ b.double()).abs().max().item(),
                  "attn_err": (out.double() - ref).abs().max().item()}))
"""


def probe(mode: str, **env: str) -> dict:
    import os

    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@needs_amd_avx512
def test_before_mkls_first_call_its_avx512_kernels_run_with_fp32_results():
    r = probe("fresh")
    assert r["status"] == r["again"] == "AVX-512 kernels (vendor check patched)"
    assert r["mm_err"] < 1e-4 and r["attn_err"] < 1e-5, r  # fp32 sums of 300 products; attention


@needs_amd_avx512
def test_after_mkls_first_call_its_choice_stands_and_the_status_says_so():
    r = probe("mkl-first")
    assert r["status"] == "AVX2 kernels (MKL had chosen them before this process loaded the model)"
    assert r["mm_err"] < 1e-4 and r["attn_err"] < 1e-5, r


def test_the_switch_leaves_mkl_alone():
    r = probe("fresh", RADIXKV_MKL_AVX512="0")
    assert r["status"] == "left alone (RADIXKV_MKL_AVX512=0)"


def test_without_the_cpu_kernels_mkl_keeps_its_choice():
    if not APPLIES:
        pytest.skip("MKL is left alone here before the helper is needed")
    r = probe("fresh", RADIXKV_CPU_KERNELS="0")
    assert r["status"].startswith("AVX2 kernels (the dispatch helper is not built")


@pytest.mark.parametrize(("vendor", "flags", "want"), [
    ("GenuineIntel", set(mkl_dispatch.NEEDED_FLAGS), "its own choice (an Intel CPU)"),
    ("AuthenticAMD", {"avx2", "fma"}, "its own choice (no avx512f)"),
    ("AuthenticAMD", set(mkl_dispatch.NEEDED_FLAGS) - {"avx512vl"}, "its own choice (no avx512vl)"),
])
def test_only_non_intel_cpus_with_every_avx512_subset_mkl_needs_are_patched(monkeypatch, vendor, flags, want):
    monkeypatch.delenv(mkl_dispatch.ENV_SWITCH, raising=False)
    monkeypatch.setattr(mkl_dispatch.platform, "system", lambda: "Linux")
    monkeypatch.setattr(mkl_dispatch.platform, "machine", lambda: "x86_64")
    assert why_not(vendor, flags) == want
    assert why_not("AuthenticAMD", set(mkl_dispatch.NEEDED_FLAGS)) in (None, "not in this torch build")


def test_cpu_info_reads_the_vendor_and_flags():
    vendor, flags = cpu_info()
    if sys.platform == "linux":
        assert vendor and "fpu" in flags
