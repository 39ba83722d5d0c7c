"""The small-batch GEMM over oneDNN's packed weights (`radixkv.model.packed_gemm`): it reads the
layout it found, equals `F.linear` (bias, fused residual, strided rows, every row count it
serves), hands other layouts and row counts to oneDNN, and the switch turns it off."""

import ctypes

import pytest
import torch
import torch.nn.functional as F

from radixkv import native
from radixkv.model import packed_gemm
from radixkv.model.cpu_runtime import PackedLinear

pytestmark = pytest.mark.skipif(packed_gemm.library() is None, reason="kernel not built here (no compiler or AVX-512)")


def test_the_probe_reads_the_layout_onednn_chose():
    """Whatever width the probe reports, the packed copy of a random weight is that
    permutation of the weight, value for value."""
    torch.manual_seed(0)
    for N, K in [(960, 576), (192, 64), (64, 1536)]:
        w = torch.randn(N, K)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        nb = packed_gemm.panel_width(packed, N, K)
        assert nb is not None and N % nb == 0
        expect = w.view(N // nb, nb, K).transpose(1, 2).reshape(-1)  # P[N/nb][K][nb]
        assert torch.equal(packed_gemm.raw_buffer(packed), expect)


def test_padded_layouts_are_left_to_onednn():
    for N, K in [(100, 64), (16, 16)]:  # not whole panels: oneDNN pads them
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(N, K))
        assert packed_gemm.panel_width(packed, N, K) is None
        layer = PackedLinear(torch.randn(N, K))
        assert layer.small is None
        x = torch.randn(3, K)
        torch.testing.assert_close(layer(x), x @ layer_weight(layer).T, atol=1e-4, rtol=1e-4)


def layer_weight(layer: PackedLinear) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(torch.eye(layer.in_features), layer.packed, None, "none", [], "").T


@pytest.mark.parametrize("N,K", [(960, 576), (576, 1536), (64, 48), (3072, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_row_count_it_serves_equals_f_linear(N, K, bias):
    torch.manual_seed(N + K)
    w, b = torch.randn(N, K) * 0.1, torch.randn(N) if bias else None
    layer = PackedLinear(w, b)
    assert layer.small is not None, f"oneDNN pads ({N}, {K}) here"
    for M in range(1, packed_gemm.MAX_ROWS + 2):
        x, residual = torch.randn(M, K), torch.randn(M, N)
        assert layer.small.serves(x) == (M <= packed_gemm.MAX_ROWS)
        torch.testing.assert_close(layer(x), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer(x, residual), F.linear(x, w, b) + residual, atol=1e-4, rtol=1e-4)


def test_strided_rows_and_the_kernel_called_directly():
    torch.manual_seed(1)
    w = torch.randn(192, 64)
    layer = PackedLinear(w)
    wide = torch.randn(5, 200)
    x = wide[:, 10:74]  # rows 200 apart
    assert layer.small.serves(x)
    torch.testing.assert_close(layer.small(x), x @ w.T, atol=1e-4, rtol=1e-4)
    assert not layer.small.serves(torch.randn(64, 4).t())  # columns strided: oneDNN
    assert not layer.small.serves(torch.randn(4, 64, dtype=torch.float64))


def test_it_is_used_for_decode_rows(monkeypatch):
    """A decode-sized product goes through the kernel, a prefill-sized one through oneDNN."""
    calls = []
    real = packed_gemm.PanelGemm.__call__
    monkeypatch.setattr(packed_gemm.PanelGemm, "__call__", lambda self, x, r=None: calls.append(len(x)) or real(self, x, r))
    layer = PackedLinear(torch.randn(128, 64))
    layer(torch.randn(8, 64))
    layer(torch.randn(packed_gemm.MAX_ROWS + 1, 64))
    assert calls == [8]


def test_switched_off_there_is_no_kernel_and_products_stay_equal(monkeypatch):
    lib = packed_gemm.KERNEL.get()
    torch.manual_seed(2)
    w = torch.randn(256, 128)
    x = torch.randn(4, 128)
    ours = PackedLinear(w)(x)
    try:
        monkeypatch.setenv(native.ENV_SWITCH, "0")
        packed_gemm.KERNEL.forget()
        assert packed_gemm.library() is None
        off = PackedLinear(w)
        assert off.small is None
        torch.testing.assert_close(off(x), ours, atol=1e-4, rtol=1e-4)
    finally:
        packed_gemm.KERNEL.set(lib)
    assert isinstance(packed_gemm.KERNEL.get(), ctypes.CDLL)
