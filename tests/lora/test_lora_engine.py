"""LoRA adapters in the engine (the tiny llama, random PEFT adapters with non-zero B): a batch
mixing two adapters and the base model gives each row the greedy tokens of transformers with
that row's adapter merged; each adapter's cache is its own; adapters load and unload while
requests run."""

import time

import pytest
import torch

pytest.importorskip("peft")

from radixkv.config import EngineConfig  # noqa: E402
from radixkv.core.engine_core import EngineCore  # noqa: E402
from radixkv.errors import ConfigError, InvalidRequestError, LoRAInUse  # noqa: E402
from radixkv.kernels.reference import lora_sgmv_reference  # noqa: E402
from radixkv.lora.adapter import LoRAError  # noqa: E402
from radixkv.sampling_params import SamplingParams  # noqa: E402
from radixkv.sched.request import Req  # noqa: E402
from tests.lora.helpers import make_adapter, merged_greedy  # noqa: E402

pytestmark = pytest.mark.timeout(300)
N = 8
PROMPTS = [[5, 9, 23, 41, 7, 77, 12, 3, 19, 60, 33], [101, 4, 8, 15, 16, 23, 42, 99], [7, 7, 8, 9, 10, 11, 12, 13, 14]]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    base = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("loras")
    a = make_adapter(base, root / "a", seed=1, rank=4)
    b = make_adapter(base, root / "b", seed=2, rank=8, targets=["q_proj", "v_proj", "down_proj"])
    return base, a, b


def load(base, *paths, **options):
    opts = dict(model=str(base), max_total_tokens=2048, log_level="debug", page_size=4, enable_lora=True,
                lora_paths=[list(paths)] if paths else None)
    return EngineCore.load(EngineConfig.from_kwargs(**{**opts, **options}), progress=False)


def run(core, reqs, timeout=60):
    for r in reqs:
        core.add_request(r)
    got, deadline = {}, time.monotonic() + timeout
    while core.has_work and time.monotonic() < deadline:
        for o in core.step():
            assert o.error is None, o.error
            got.setdefault(o.rid, []).extend(o.new_ids)
            if o.finished:
                got.setdefault(("cached", o.rid), o.cached_tokens)
    return got


def req(rid, prompt, lora=None, n=N):
    return Req(rid, list(prompt), SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True), lora=lora)


@pytest.mark.parametrize("backend", ["torch", "triton"])  # triton: the SGMV kernels (interpreted on CPU)
def test_a_mixed_batch_gives_each_row_its_merged_models_tokens(adapters, backend):
    base, a, b = adapters
    core = load(base, f"a={a}", f"b={b}", attention_backend=backend)
    try:
        assert core.runner.lora.slots.use_triton == (backend == "triton")
        ids = core.lora_adapters()
        rows = [("base0", PROMPTS[0], None), ("a0", PROMPTS[0], "a"), ("b0", PROMPTS[0], "b"),
                ("a1", PROMPTS[1], "a"), ("b2", PROMPTS[2], "b"), ("base1", PROMPTS[1], None)]
        got = run(core, [req(rid, p, ids[name] if name else None) for rid, p, name in rows])
        for rid, prompt, name in rows:
            want = merged_greedy(base, {"a": a, "b": b}.get(name), prompt, N)
            assert got[rid] == want, (rid, got[rid], want)
        assert got["a0"] != got["base0"] and got["b0"] != got["base0"]  # the adapters matter
        core.check_invariants()
    finally:
        core.close()


def test_the_same_prompt_under_two_adapters_never_hits_across_them(adapters):
    base, a, b = adapters
    core = load(base, f"a={a}", f"b={b}")
    try:
        ids = core.lora_adapters()
        prompt = list(range(30, 70))
        first = run(core, [req("a-first", prompt, ids["a"])])
        assert first[("cached", "a-first")] == 0
        assert run(core, [req("b-first", prompt, ids["b"])])[("cached", "b-first")] == 0
        assert run(core, [req("base-first", prompt)])[("cached", "base-first")] == 0
        again = run(core, [req("a-again", prompt, ids["a"])])
        assert again[("cached", "a-again")] >= 36 and again["a-again"] == first["a-first"]
    finally:
        core.close()


def test_more_adapters_than_slots_take_turns_and_stay_exact(adapters, tmp_path):
    base, a, b = adapters
    c = make_adapter(base, tmp_path / "c", seed=3, rank=2)
    core = load(base, f"a={a}", f"b={b}", f"c={c}", max_loras_per_batch=2)
    try:
        ids = core.lora_adapters()
        rows = [(f"{name}{i}", PROMPTS[i], name) for i in range(2) for name in ("a", "b", "c")]
        got = run(core, [req(rid, p, ids[name]) for rid, p, name in rows])
        for rid, prompt, name in rows:
            assert got[rid] == merged_greedy(base, {"a": a, "b": b, "c": c}[name], prompt, N), rid
        assert core.runner.lora.slots.loads >= 3
    finally:
        core.close()


def test_load_and_unload_while_requests_run(adapters):
    base, a, b = adapters
    core = load(base, f"a={a}", max_lora_rank=8)  # b's rank: the slots are sized at start-up
    try:
        ids = core.lora_adapters()
        core.add_request(req("running", PROMPTS[0], ids["a"], n=40))
        core.step()
        with pytest.raises(LoRAInUse, match="1 request"):
            core.unload_lora("a")
        assert set(core.load_lora("b", str(b))) == {"a", "b"}
        got = run(core, [req("b-new", PROMPTS[1], core.lora_adapters()["b"])])
        assert got["b-new"] == merged_greedy(base, b, PROMPTS[1], N)
        assert len(got["running"]) == 39  # (one token came from the step above) nothing was lost
        assert set(core.unload_lora("a")) == {"b"}
        with pytest.raises(InvalidRequestError, match="not loaded"):
            core.add_request(req("gone", PROMPTS[0], ids["a"]))
        with pytest.raises(LoRAError, match="no adapter of that name"):
            core.unload_lora("a")
        core.check_invariants()
    finally:
        core.close()


def test_malformed_adapters_are_refused_by_name_and_the_engine_goes_on(adapters, tmp_path):
    base, a, _ = adapters
    core = load(base)
    try:
        with pytest.raises(LoRAError, match="needs adapter_config.json"):
            core.load_lora("x", str(tmp_path))
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "adapter_config.json").write_text("{not json")
        (broken / "adapter_model.safetensors").write_bytes(b"junk")
        with pytest.raises(LoRAError, match="not JSON"):
            core.load_lora("x", str(broken))
        (broken / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "use_dora": true}')
        with pytest.raises(LoRAError, match="DoRA"):
            core.load_lora("x", str(broken))
        (broken / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
        with pytest.raises(LoRAError, match="cannot be read"):
            core.load_lora("x", str(broken))
        with pytest.raises(LoRAError, match="rank 32 exceeds"):
            core.load_lora("big", str(make_adapter(base, tmp_path / "big", seed=4, rank=32)))
        core.load_lora("a", str(a))
        with pytest.raises(LoRAError, match="already|is loaded"):
            core.load_lora("a", str(a))
        assert run(core, [req("ok", PROMPTS[0], core.lora_adapters()["a"])])["ok"] == merged_greedy(base, a, PROMPTS[0], N)
    finally:
        core.close()


def test_lora_flags_are_checked(tiny_model_dir):
    with pytest.raises(ConfigError, match="max_loras_per_batch"):
        EngineConfig.from_kwargs(enable_lora=True, max_loras_per_batch=0)
    with pytest.raises(ConfigError, match="lora_target_modules"):
        EngineConfig.from_kwargs(enable_lora=True, lora_target_modules=[["embed_tokens"]])
    with pytest.raises(ConfigError, match="compile='on'"):
        load(tiny_model_dir("llama"), compile="on")
    core = load(tiny_model_dir("llama"), enable_lora=False)
    try:
        with pytest.raises(InvalidRequestError, match="no LoRA adapters"):
            core.add_request(req("x", PROMPTS[0], "abc"))
    finally:
        core.close()


def test_sgmv_kernel_matches_the_torch_reference():
    """The Triton shrink/expand kernels (interpreted on CPU) against the torch twin, over
    segments of several slots, the base model (-1) and ranks below the slots' rank."""
    from radixkv.kernels.lora_sgmv import lora_sgmv

    torch.manual_seed(0)
    T, K, N, S, R = 37, 48, 80, 3, 12
    x = torch.randn(T, K)
    a, b = torch.randn(S, R, K), torch.randn(S, N, R)
    a[1, 6:] = 0  # slot 1 holds a rank-6 adapter
    scaling = torch.tensor([0.5, 2.0, 1.0])
    segments = [(0, 5, 0), (5, 1, -1), (6, 17, 1), (23, 3, 2), (26, 11, 0)]
    y0 = torch.randn(T, N)
    want = lora_sgmv_reference(y0.clone(), x, a, b, scaling, segments)
    seg = [torch.tensor([s[i] for s in segments]) for i in range(3)]
    got = lora_sgmv(y0.clone(), x, a, b, scaling, *seg, max_len=17)
    assert torch.allclose(got, want, atol=1e-3, rtol=1e-4), (got - want).abs().max()


def test_grouped_path_matches_the_per_run_reference():
    """The CPU path (rows grouped by adapter, batched matmuls) against the per-run torch twin,
    rows alternating adapters one by one, the base model between them."""
    from radixkv.lora.grouped import Groups, lora_grouped

    torch.manual_seed(1)
    T, K, N, S, R = 29, 40, 72, 4, 8
    x, a, b = torch.randn(T, K), torch.randn(S, R, K), torch.randn(S, N, R)
    scaling = torch.tensor([0.5, 2.0, 1.0, 3.0])
    segments = [(i, 1, [0, 1, -1, 3, 1][i % 5]) for i in range(20)] + [(20, 9, 2)]
    y0 = torch.randn(T, N)
    want = lora_sgmv_reference(y0.clone(), x, a, b, scaling, segments)
    got = lora_grouped(y0.clone(), x, a, b, scaling, Groups.of(segments, x.device, x.dtype))
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert Groups.of([(0, 3, -1)], x.device, x.dtype) is None


def test_a_recorded_trace_plans_each_adapters_hit_rate(adapters, tmp_path):
    """`--record-trace` names each request's adapter; `radixkv plan` reports each adapter's hit
    rate (the same prompt under another adapter is a miss: the caches are apart)."""
    from radixkv.plan_cli import format_plan
    from radixkv.workloads.plan import PlanConfig, plan
    from radixkv.workloads.trace import load_trace

    base, a, b = adapters
    path = tmp_path / "served.jsonl"
    core = load(base, f"a={a}", f"b={b}", record_trace=str(path), record_trace_block_size=4)
    try:
        ids = core.lora_adapters()
        prompt = list(range(30, 70))
        for rid, name in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("base1", None), ("base2", None), ("a3", "a")):
            run(core, [req(rid, prompt, ids[name] if name else None, n=2)])
    finally:
        core.close()
    trace = load_trace(path)
    assert [t.adapter for t in trace] == ["a", "a", "b", None, None, "a"]
    report = plan(trace, PlanConfig(page_size=4, block_size=4), capacities=[4096, 8])
    assert report["adapters"] == {
        "a": {"requests": 3, "prompt_tokens": 120, "working_set_hit_rate": pytest.approx(2 / 3)},
        "b": {"requests": 1, "prompt_tokens": 40, "working_set_hit_rate": 0.0},
        "base": {"requests": 2, "prompt_tokens": 80, "working_set_hit_rate": 0.5}}
    roomy, tiny = sorted(report["curve"], key=lambda p: -p["capacity_tokens"])
    assert roomy["adapter_hit_rates"] == {"a": pytest.approx(2 / 3), "b": 0.0, "base": 0.5}
    assert tiny["adapter_hit_rates"]["a"] < 0.2  # 8 tokens of pool keep none of a's prompt
    text = format_plan({"trace": str(path), **report})
    assert "a hit rate" in text and "adapter b: 1 requests" in text and "66.7%" in text
