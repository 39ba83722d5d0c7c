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


@pytest.fixture
def fresh_compile(monkeypatch, tmp_path):
    """No compiled forward of this process or of earlier runs: the next runner compiles its own,
    and saves it in the returned directory (inductor's cache, here `tmp_path`)."""
    monkeypatch.setattr(compiled_mod, "_loaded", {})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    yield tmp_path
    torch._dynamo.reset()


def test_a_failing_compiler_leaves_the_runner_eager(tiny_model_dir, monkeypatch, caplog, fresh_compile):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler today")

    monkeypatch.setattr(compiled_mod, "_counting_inductor", broken)
    with caplog.at_level(logging.ERROR, logger="radixkv.model.compiled"):
        runner = make_runner(tiny_model_dir("qwen2"), compile="on")
    stats = runner.compile_stats()
    assert not stats["compiled"] and "no C++ compiler today" in stats["compile_fallback"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"compiled forward disabled, running eager: {stats['compile_fallback']}"]
    res = generate_static(runner, PROMPTS, 4)  # eager from here on
    assert [len(o) for o in res.output_ids] == [4, 4, 4]
    assert not list(fresh_compile.rglob("*.pt2"))  # nothing saved for the next start


def test_compiled_logits_that_disagree_are_refused_at_start(tiny_model_dir, monkeypatch, fresh_compile):
    """A graph that computes something else (here: every logit doubled) fails the start-up check."""
    real = compiled_mod._traced

    def wrong(model, input_ids, positions, logits_index):
        return real(model, input_ids, positions, logits_index) * 2

    monkeypatch.setattr(compiled_mod, "_traced", wrong)
    runner = make_runner(tiny_model_dir("llama"), compile="on")
    stats = runner.compile_stats()
    assert not stats["compiled"] and "logits differ from eager mode" in stats["compile_fallback"]


def test_a_saved_forward_is_loaded_by_the_next_start(tiny_model_dir, monkeypatch, fresh_compile, caplog):
    """The first runner traces, compiles and saves; a new process (here: an emptied in-process
    table) loads the saved forward without compiling, and it gives eager mode's tokens."""
    first = make_runner(tiny_model_dir("qwen3"), compile="on")
    assert first.compile_stats()["compile_source"] == "compiled"
    assert first.compile_stats()["compile_graphs"] == 1
    saved = list(fresh_compile.rglob("*.pt2"))
    assert [p.stem for p in saved] == [compiled_mod.graph_key(first.model)]
    again = make_runner(tiny_model_dir("qwen3"), compile="on")
    assert again.compile_stats()["compile_source"] == "process"  # the same process: no load either
    monkeypatch.setattr(compiled_mod, "_loaded", {})
    with caplog.at_level(logging.WARNING, logger="radixkv.model.compiled"):
        runner = make_runner(tiny_model_dir("qwen3"), compile="on")
    stats = runner.compile_stats()
    assert (stats["compiled"], stats["compile_source"], stats["compile_graphs"]) == (True, "saved", 0), stats
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    got, want = eager_and_compiled(runner, lambda r: generate_static(r, PROMPTS, 8, return_prefill_logits=True))
    assert got.output_ids == want.output_ids
    assert (got.prefill_logits - want.prefill_logits).abs().max() <= 1e-4 * max(1.0, want.prefill_logits.abs().max())
    assert runner.compile_stats()["recompilations"] == 0


def test_a_damaged_or_foreign_saved_forward_is_compiled_again(tiny_model_dir, monkeypatch, fresh_compile, caplog):
    """A file that does not load, and a loadable file of another model under this model's key
    (its guards refuse this model), each cost one warning and a compile, never the start."""
    other = make_runner(tiny_model_dir("llama-tp"), compile="on")  # 4 KV heads, 509 tokens
    foreign = next(fresh_compile.rglob("*.pt2"))
    model = make_runner(tiny_model_dir("llama"), compile="off").model  # 2 KV heads, 512 tokens
    mine = foreign.with_name(f"{compiled_mod.graph_key(model)}.pt2")
    for content, said in ((b"not a compiled forward", "does not load"), (foreign.read_bytes(), "does not fit")):
        mine.write_bytes(content)
        monkeypatch.setattr(compiled_mod, "_loaded", {})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="radixkv.model.compiled"):
            runner = make_runner(tiny_model_dir("llama"), compile="on")
        stats = runner.compile_stats()
        assert (stats["compiled"], stats["compile_source"]) == (True, "compiled"), stats
        assert [said in r.getMessage() for r in caplog.records] == [True], caplog.records
        assert mine.read_bytes() != content  # replaced by this model's own
    assert other.compile_stats()["compiled"]


def test_graph_key_follows_what_the_trace_depends_on(tiny_model_dir):
    a = make_runner(tiny_model_dir("llama"), compile="off").model
    b = make_runner(tiny_model_dir("llama"), compile="off").model
    assert compiled_mod.graph_key(a) == compiled_mod.graph_key(b)  # another load: same graph
    assert compiled_mod.graph_key(a) != compiled_mod.graph_key(make_runner(tiny_model_dir("qwen2"), compile="off").model)
    bf16 = make_runner(tiny_model_dir("llama"), compile="off", dtype="bfloat16").model
    assert compiled_mod.graph_key(a) != compiled_mod.graph_key(bf16)


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


@pytest.mark.parametrize("preset", [None, "inductor's default", "the user's"])
def test_the_forward_is_saved_in_radixkvs_cache_unless_the_user_chose_a_directory(monkeypatch, tmp_path, preset):
    """Importing inductor sets TORCHINDUCTOR_CACHE_DIR to its default under /tmp (a machine's
    first start does, converting the model): that is no choice, and a forward saved there was
    compiled again by the next start, which looks in radixkv's cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    mine = tmp_path / "mine"
    if preset is None:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir() if preset == "inductor's default" else str(mine))
    forward = compiled_mod.CompiledForward(None, tmp_path / "root")
    want = mine if preset == "the user's" else compile_cache_dir(tmp_path / "root")
    assert forward.aot_dir == want / "aot"
