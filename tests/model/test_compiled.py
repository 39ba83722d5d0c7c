"""The compiled forward (`compile` option) against eager mode: same tokens, logits within 1e-4
of the largest logit, one graph for every batch shape, and an eager fallback that never fails a
load."""

import logging

import pytest
import torch

from radixkv.attention import ForwardMode
from radixkv.errors import ConfigError
from radixkv.model import compiled as compiled_mod
from radixkv.model.compiled import choose_compile, compile_cache_dir
from radixkv.model.static_batch import generate_static
from tests.model.conftest import make_runner

PROMPTS = [[1, 17, 230, 5, 88, 402, 9, 61, 300, 12, 7], [1, 44, 3], [1, 250, 251, 252, 253, 90, 91]]


def eager_and_compiled(runner, fn):
    """fn(runner) run compiled, then eager on the same runner."""
    assert runner.compiled is not None and runner.compiled.active, runner.compile_stats()
    got = fn(runner)
    compiled, runner.compiled = runner.compiled, None
    try:
        want = fn(runner)
    finally:
        runner.compiled = compiled
    return got, want


@pytest.mark.parametrize("name", ["llama", "llama3-rope-tied", "qwen2", "qwen3", "mistral-window"])
def test_compiled_greedy_tokens_and_logits_match_eager(tiny_model_dir, name):
    runner = make_runner(tiny_model_dir(name), compile="on")
    got, want = eager_and_compiled(
        runner, lambda r: generate_static(r, PROMPTS, 10, return_prefill_logits=True, keep_step_logits=True))
    assert got.output_ids == want.output_ids
    for a, b in zip([got.prefill_logits, *got.step_logits], [want.prefill_logits, *want.step_logits]):
        assert (a - b).abs().max() <= 1e-4 * max(1.0, b.abs().max().item())
    assert runner.memory.allocator.free_pages == runner.memory.allocator.num_pages


def test_no_recompiles_over_batch_sizes_and_prompt_lengths(tiny_model_dir):
    """After warm-up, decode batches of 1-64 rows and prompts of 1-4,096 tokens reuse the graph."""
    runner = make_runner(tiny_model_dir("llama-long"), compile="on", max_total_tokens=70 * 64 + 4096,
                         max_running_requests=64, context_length=4096 + 8)
    mem = runner.memory
    assert runner.compile_stats()["compile_graphs"] <= 1 and runner.compile_stats()["recompilations"] == 0

    def forward(mode, token_lists, prefixes, rows, seqs):
        slots = []
        for row, seq, toks, pre in zip(rows, seqs, token_lists, prefixes):
            s = seq.extend(len(toks))
            mem.req_table.write(row, pre, s)
            slots.extend(s)
        runner.forward(runner.build_batch(mode, token_lists, rows, prefixes, slots))

    for batch in (1, 2, 3, 5, 8, 13, 31, 64):
        rows = [mem.req_table.alloc() for _ in range(batch)]
        seqs = [mem.new_sequence() for _ in range(batch)]
        forward(ForwardMode.EXTEND, [[5, 6, 7]] * batch, [0] * batch, rows, seqs)
        forward(ForwardMode.DECODE, [[8]] * batch, [3] * batch, rows, seqs)
        for row, seq in zip(rows, seqs):
            seq.release()
            mem.req_table.free(row)
    for length in (1, 2, 17, 300, 1024, 4096):
        row, seq = mem.req_table.alloc(), mem.new_sequence()
        forward(ForwardMode.EXTEND, [[3] * length], [0], [row], [seq])
        seq.release()
        mem.req_table.free(row)
    assert runner.compile_stats()["recompilations"] == 0, runner.compile_stats()
    assert runner.compile_stats()["compiled"]


def test_a_failing_compiler_leaves_the_runner_eager(tiny_model_dir, monkeypatch, caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler today")

    monkeypatch.setattr(compiled_mod, "_compiled_fn", None)  # a fresh wrapper around the broken backend
    monkeypatch.setattr(compiled_mod, "_counting_inductor", broken)
    torch._dynamo.reset()
    with caplog.at_level(logging.ERROR, logger="radixkv.model.compiled"):
        runner = make_runner(tiny_model_dir("qwen2"), compile="on")
    stats = runner.compile_stats()
    assert not stats["compiled"] and "no C++ compiler today" in stats["compile_fallback"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"compiled forward disabled, running eager: {stats['compile_fallback']}"]
    res = generate_static(runner, PROMPTS, 4)  # eager from here on
    assert [len(o) for o in res.output_ids] == [4, 4, 4]
    torch._dynamo.reset()


def test_compiled_logits_that_disagree_are_refused_at_start(tiny_model_dir, monkeypatch):
    """A graph that computes something else (here: every logit doubled) fails the start-up check."""
    real = compiled_mod._counting_inductor

    def wrong(gm, example_inputs):
        fn = real(gm, example_inputs)
        return lambda *args: [out * 2 for out in fn(*args)]

    monkeypatch.setattr(compiled_mod, "_compiled_fn", None)
    monkeypatch.setattr(compiled_mod, "_counting_inductor", wrong)
    torch._dynamo.reset()
    runner = make_runner(tiny_model_dir("llama"), compile="on")
    stats = runner.compile_stats()
    assert not stats["compiled"] and "logits differ from eager mode" in stats["compile_fallback"]
    torch._dynamo.reset()


def test_choose_compile():
    cpu = torch.device("cpu")
    assert choose_compile("auto", cpu, 1).enabled
    assert not choose_compile("off", cpu, 1).enabled
    assert not choose_compile("auto", cpu, 2).enabled
    assert not choose_compile("auto", torch.device("cuda"), 1).enabled
    with pytest.raises(ConfigError, match="tp_size"):
        choose_compile("on", cpu, 2)
    with pytest.raises(ConfigError, match="compile='maybe'"):
        choose_compile("maybe", cpu, 1)


def test_compile_option_is_validated(run_cli):
    from radixkv.config import EngineConfig

    with pytest.raises(ConfigError, match="compile='fast'"):
        EngineConfig.from_kwargs(compile="fast")
    with pytest.raises(ConfigError, match="tp_size"):
        EngineConfig.from_kwargs(compile="on", tp_size=2)
    out = run_cli("serve", "--help").stdout
    assert "--compile" in out


def test_compiled_graphs_are_cached_under_the_model_cache(tmp_path):
    where = compile_cache_dir(tmp_path)
    assert where.parent == tmp_path / "compiled"
    assert torch.__version__ in where.name and torch.backends.cpu.get_cpu_capability().lower() in where.name
