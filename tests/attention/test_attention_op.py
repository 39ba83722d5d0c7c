"""`radixkv::attention`'s C++ CPU kernel (`csrc/attention_ops.cpp`): inside a forward context
whose batch the torch backend serves by its direct decode path, each layer's call runs the
paged-decode kernel without Python and equals the Python implementation (outputs and the pool
afterwards); every other batch, and a call that finds slots outside the pool, goes to the
Python implementation, which raises the typed error."""

import pytest
import torch

from radixkv.attention import cpu_decode, graph_op
from radixkv.attention.backend import TorchBackend
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.errors import CacheInvariantError
from tests.attention.test_direct_decode import D, LAYERS, decode_setup, qkv_views

pytestmark = pytest.mark.skipif(not graph_op.native_kernel() or cpu_decode.library() is None,
                                reason="no C++ compiler to build the kernels")


def through_the_op(pool, table, fb, steps, monkeypatch, op="attention"):
    """Each layer through `torch.ops.radixkv.<op>` in a forward context; how many calls reached
    the Python backend."""
    backend = TorchBackend(pool, table)
    python_calls = []
    real = TorchBackend.forward
    monkeypatch.setattr(TorchBackend, "forward", lambda self, *a: python_calls.append(1) or real(self, *a))
    with torch.inference_mode(), graph_op.forward_context(backend, fb):
        outs = [getattr(torch.ops.radixkv, op)(q, k, v, layer, D ** -0.5, None)
                for layer, (q, k, v) in enumerate(steps)]
    monkeypatch.undo()
    return outs, len(python_calls)


@pytest.mark.parametrize("lens", [[1], [9, 30, 17, 64]])
def test_a_direct_decode_batch_runs_in_cpp_and_equals_python(lens, monkeypatch):
    (ours_pool, ref_pool), table, fb = decode_setup(lens)
    steps = qkv_views(len(lens), seed=7)
    ours, python_calls = through_the_op(ours_pool, table, fb, steps, monkeypatch)
    assert python_calls == 0
    ref, python_calls = through_the_op(ref_pool, table, fb, steps, monkeypatch, op="attention_py")
    assert python_calls == LAYERS
    for layer in range(LAYERS):
        torch.testing.assert_close(ours[layer], ref[layer], atol=1e-6, rtol=1e-5)
        assert torch.equal(ours_pool.k_view(layer), ref_pool.k_view(layer))
        assert torch.equal(ours_pool.v_view(layer), ref_pool.v_view(layer))


def test_shared_prefixes_extends_and_windows_go_to_python(monkeypatch):
    (pool, _), table, fb = decode_setup([1100, 1090, 1080], shared=1064)
    _, python_calls = through_the_op(pool, table, fb, qkv_views(3, seed=1), monkeypatch)
    assert python_calls == LAYERS  # the shared prefix is merged in Python

    (pool, _), table, _ = decode_setup([12, 7])
    extend = ForwardBatch.build(ForwardMode.EXTEND, [[1, 1], [1]], [0, 1], [9, 6],
                                [int(table[0, 9]), int(table[0, 10]), int(table[1, 6])])
    _, python_calls = through_the_op(pool, table, extend, qkv_views(3, seed=2), monkeypatch)
    assert python_calls == LAYERS

    (pool, _), table, fb = decode_setup([12, 7])
    backend = TorchBackend(pool, table)
    q, k, v = qkv_views(2, seed=3)[0]
    with torch.inference_mode(), graph_op.forward_context(backend, fb):
        windowed = torch.ops.radixkv.attention(q, k, v, 0, D ** -0.5, 4)
        assert windowed.shape == q.shape


def test_the_context_ends_the_direct_path():
    """After the forward context, a call finds no direct inputs: the Python path says so."""
    (pool, _), table, fb = decode_setup([5])
    q, k, v = qkv_views(1, seed=4)[0]
    with torch.inference_mode(), graph_op.forward_context(TorchBackend(pool, table), fb):
        torch.ops.radixkv.attention(q, k, v, 0, D ** -0.5, None)
    with pytest.raises(RuntimeError, match="outside forward_context"):
        torch.ops.radixkv.attention(q, k, v, 0, D ** -0.5, None)


def test_a_slot_outside_the_pool_raises_the_typed_error():
    (pool, _), table, _ = decode_setup([5, 6])
    bad = ForwardBatch.build(ForwardMode.DECODE, [[1], [1]], [0, 1], [4, 5], [int(table[0, 4]), pool.num_slots + 3])
    q, k, v = qkv_views(2, seed=5)[0]
    with torch.inference_mode(), graph_op.forward_context(TorchBackend(pool, table), bad):
        with pytest.raises(CacheInvariantError, match="1 of 2 new tokens"):
            torch.ops.radixkv.attention(q, k, v, 0, D ** -0.5, None)
