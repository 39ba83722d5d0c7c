"""CPU execution tuning: threads from the affinity mask, the allocator, prepacked linear layers."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.model import cpu_runtime
from radixkv.model.cpu_runtime import PackedLinear, linear_add, prepack_linears
from radixkv.model.loader import load_model
from tests.model.conftest import make_runner

needs_packing = pytest.mark.skipif(not cpu_runtime.packing_supported(torch.device("cpu"), torch.float32),
                                   reason="oneDNN prepacking unavailable in this torch build")


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_default_to_the_cores_this_process_may_use(restore_threads):
    assert cpu_runtime.choose_num_threads(None) == len(os.sched_getaffinity(0)) == torch.get_num_threads()


def test_num_threads_option_overrides_the_default(restore_threads, tiny_model_dir):
    runner = make_runner(tiny_model_dir("llama"), num_threads=1)
    assert runner.num_threads == 1 == torch.get_num_threads()


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_num_threads_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="num_threads"):
        EngineConfig.from_kwargs(num_threads=bad)


def test_malloc_tuning_takes_effect_on_glibc():
    assert cpu_runtime.tune_malloc() is True


@needs_packing
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_linear_with_and_without_residual(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(rows, 48, generator=gen)
    residual = torch.randn(rows, 80, generator=gen)
    packed = PackedLinear(layer.weight, layer.bias)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear_add(packed, x, residual), layer(x) + residual, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear_add(layer, x, residual), layer(x) + residual)


@needs_packing
def test_prepack_replaces_every_linear_and_keeps_no_dense_copy():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    assert prepack_linears(model) == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert [p.numel() for p in model.parameters()] == []  # the packed copies are all that is left


@needs_packing
@pytest.mark.parametrize("name", ["qwen2", "llama3-rope-tied"])  # q/k/v bias; tied output layer
def test_packed_model_logits_equal_the_unpacked_model(tiny_model_dir, name):
    path = tiny_model_dir(name)
    runner = make_runner(path)  # packs on CPU fp32
    assert not any(isinstance(m, nn.Linear) for m in runner.model.modules())
    dense = load_model(path)
    seq = list(range(3, 40))
    slots = list(range(1, len(seq) + 1))
    row = runner.memory.req_table.alloc()
    runner.memory.req_table.write(row, 0, slots)
    from radixkv.attention import ForwardMode

    fb = runner.build_batch(ForwardMode.EXTEND, [seq], [row], [0], slots, logits="all")
    packed_logits = runner.forward(fb)
    dense_logits = dense(fb, runner.backend)
    torch.testing.assert_close(packed_logits, dense_logits, atol=1e-4, rtol=0)
    assert dense.num_parameters() == runner.model.num_parameters()
