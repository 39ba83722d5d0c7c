"""`radixkv::packed_linear(_add)`, the compiled forward's linear layers (`radixkv.model.linear_ops`):
the C++ kernel equals `F.linear` at every row count (its own GEMM up to `MAX_ROWS`, oneDNN
beyond), with bias, residual and strided rows; the Python implementation gives the same; a key
names one live layer, and a collected layer's weight leaves the registry."""

import gc

import pytest
import torch
import torch.nn.functional as F

from radixkv.model import linear_ops, packed_gemm
from radixkv.model.cpu_runtime import PackedLinear

pytestmark = pytest.mark.skipif(linear_ops.implementation() != "native", reason="no C++ compiler to build the kernel")


@pytest.mark.parametrize("N,K,bias", [(960, 576, False), (64, 48, True), (100, 64, True)])  # (100, 64): padded, oneDNN only
def test_the_operators_equal_f_linear_at_every_row_count(N, K, bias):
    torch.manual_seed(N)
    w, b = torch.randn(N, K) * 0.1, torch.randn(N) if bias else None
    layer = PackedLinear(w, b)
    for M in [1, 2, 7, 8, 16, packed_gemm.MAX_ROWS, packed_gemm.MAX_ROWS + 1, 100]:
        x, residual = torch.randn(M, K), torch.randn(M, N)
        expect = F.linear(x, w, b)
        torch.testing.assert_close(torch.ops.radixkv.packed_linear(x, layer.key, N), expect, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.ops.radixkv.packed_linear_add(x, residual, layer.key), expect + residual,
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(linear_ops._python_linear_add(x, residual, layer.key), expect + residual,
                                   atol=1e-4, rtol=1e-4)


def test_strided_rows_and_a_strided_residual():
    torch.manual_seed(1)
    w = torch.randn(192, 64)
    layer = PackedLinear(w)
    x = torch.randn(5, 200)[:, 10:74]  # rows 200 apart
    residual = torch.randn(192, 5).t()  # not contiguous
    torch.testing.assert_close(torch.ops.radixkv.packed_linear_add(x, residual, layer.key), x @ w.T + residual,
                               atol=1e-4, rtol=1e-4)


def test_a_key_names_one_live_layer():
    a, b = PackedLinear(torch.randn(64, 32)), PackedLinear(torch.randn(128, 32))
    assert int(a.key) != int(b.key)
    with pytest.raises(RuntimeError, match="has 64 outputs, not 128"):
        torch.ops.radixkv.packed_linear(torch.randn(1, 32), a.key, 128)
    key = b.key.clone()
    before = torch.ops.radixkv.packed_registered()
    del b
    gc.collect()
    assert torch.ops.radixkv.packed_registered() == before - 1
    with pytest.raises(RuntimeError, match="no live PackedLinear owns key"):
        torch.ops.radixkv.packed_linear(torch.randn(1, 32), key, 128)
