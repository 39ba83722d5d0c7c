import pytest

from radixkv.engine import Engine

SYSTEM = list(range(10, 34))  # 24-token shared "system prompt"


def workload():
    """Prompts that share a system prefix, some a longer one, plus an unrelated one."""
    tails = [[100, 101, 102], [100, 101, 103, 104], [200, 7, 8, 9, 10, 11], [300], [100, 101, 102, 55]]
    return [SYSTEM + t for t in tails] + [list(range(400, 420))]


def greedy(n=12, **kw):
    return {"max_new_tokens": n, "temperature": 0, **kw}


@pytest.fixture
def tiny_engine(tiny_model_dir):
    """tiny_engine(**options) -> an Engine on the tiny Llama (no tokenizer: input_ids only)."""
    made = []

    def make(**options):
        opts = dict(max_total_tokens=1024, max_running_requests=8, progress=False, log_level="warning")
        engine = Engine(str(tiny_model_dir("llama")), **{**opts, **options})
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


@pytest.fixture
def tiny_scheduler(tiny_model_dir):
    """tiny_scheduler(**options) -> a bare EngineCore on the tiny Llama, stepped by the test
    itself (an Engine's own thread would race a test that steps its engine core)."""
    from radixkv.config import EngineConfig
    from radixkv.core import EngineCore

    def make(**options):
        opts = dict(max_total_tokens=1024, max_running_requests=8, log_level="warning")
        return EngineCore.load(EngineConfig.from_kwargs(model=str(tiny_model_dir("llama")), **{**opts, **options}),
                               progress=False)

    return make


def assert_idle_and_clean(engine):
    """Nothing running, nothing locked, every page free or evictable, invariants hold (an
    Engine or a bare EngineCore)."""
    s = engine.get_stats()
    assert s["running_requests"] == s["waiting_requests"] == 0
    assert s["protected_tokens"] == 0
    assert s["free_tokens"] + s["evictable_tokens"] == s["total_tokens"]
    engine.check_invariants()
