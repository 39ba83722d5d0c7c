"""The start-up check of the compiled attention kernels: they must agree with the torch
reference on a small paged batch, or the runner serves with the torch backend and says why
(the Triton kernels had only ever run under the interpreter before a user's GPU)."""

import pytest
import torch

import radixkv.kernels as kernels
from radixkv.attention.backend import TritonBackend
from radixkv.attention.selfcheck import check_backend
from radixkv.mem.kv_pool import KVLayout


@pytest.mark.parametrize("fmt", ["auto", "bf16", "fp8_e4m3", "int8", "int4"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_the_triton_kernels_pass_their_check_in_every_kv_format(fmt, page_size):
    assert check_backend(TritonBackend, KVLayout(2, 2, 64, page_size, torch.float32, fmt), 8, torch.device("cpu")) is None
    assert check_backend(TritonBackend, KVLayout(2, 2, 64, page_size, torch.float32, fmt), 8, torch.device("cpu"),
                         sliding_window=3) is None


@pytest.mark.parametrize("kernel", ["extend_attention", "decode_attention"])
def test_a_kernel_that_is_off_is_caught(monkeypatch, kernel):
    real = getattr(kernels, kernel)
    monkeypatch.setattr(kernels, kernel, lambda *a, **k: real(*a, **k) * 1.01)
    problem = check_backend(TritonBackend, KVLayout(2, 2, 64, 1, torch.float32, "auto"), 8, torch.device("cpu"))
    assert problem and kernel.split("_")[0] in problem and "differs from the torch reference" in problem


def test_a_kernel_that_does_not_compile_is_caught(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("PTX compilation failed\n(details)")

    monkeypatch.setattr(kernels, "decode_attention", broken)
    problem = check_backend(TritonBackend, KVLayout(2, 2, 64, 1, torch.float32, "int8"), 8, torch.device("cpu"))
    assert problem == "triton attention failed to run: RuntimeError: PTX compilation failed"


@pytest.mark.slow  # 20 s (an engine start); the check's failure paths run in CI in the tests above
def test_the_engine_falls_back_to_torch_and_says_so(monkeypatch, tiny_model_dir):
    from radixkv.engine import Engine
    from radixkv.server.runtime.scheduler_process import scheduler_info

    monkeypatch.setattr(kernels, "decode_attention", lambda *a, **k: torch.zeros(1))
    with Engine(str(tiny_model_dir("llama")), attention_backend="triton", max_total_tokens=256, progress=False,
                log_level="error") as engine:
        assert engine.runner.backend.name == "torch"
        assert "triton decode" in engine.runner.backend_fallback
        info = scheduler_info(engine.core, engine.config)
        assert info["attention_backend"] == "torch" and "triton decode" in info["attention_backend_fallback"]
        out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert len(out["output_ids"]) == 4
    monkeypatch.undo()  # kernels that agree: the configured backend serves
    with Engine(str(tiny_model_dir("llama")), attention_backend="triton", max_total_tokens=256, progress=False,
                log_level="error") as engine:
        assert engine.runner.backend.name == "triton" and engine.runner.backend_fallback is None
