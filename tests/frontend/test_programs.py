"""Frontend programs on the default model, on both backends: the cache hits the program's
structure promises, select against the model, batches, streaming, the token-prefix rule."""

import pytest
import torch

import radixkv as rk
from radixkv.errors import BackendUnreachable, FrontendError, UnknownVariableError

SYSTEM = "You are a helpful assistant who answers in one short sentence."


@rk.function
def multi_turn(s, question_1, question_2):
    s += rk.system(SYSTEM)
    s += rk.user(question_1)
    s += rk.assistant(rk.gen("answer_1", max_tokens=24))
    s += rk.user(question_2)
    s += rk.assistant(rk.gen("answer_2", max_tokens=24, stop=["\n\n"]))


@rk.function
def ideas(s, topic):
    s += rk.system(SYSTEM)
    s += rk.user(f"Give one idea about {topic}.")
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += rk.assistant(rk.gen("idea", max_tokens=12, temperature=0.9, seed=i))
    forks.join()
    s += rk.user("Is the first idea good? Answer yes or no.")
    s += rk.assistant(rk.select("verdict", choices=["yes", "no"]))


def test_second_turn_hits_the_whole_first_turn(backend):
    state = multi_turn.run(question_1="What is the capital of France?", question_2="And of Germany?",
                           backend=backend)
    first, second = state.meta("answer_1"), state.meta("answer_2")
    assert "Paris" in state["answer_1"] and "Berlin" in state["answer_2"]
    # everything the first turn computed: its prompt and its answer (the EOS token is sampled,
    # never computed)
    assert second["cached_tokens"] >= first["prompt_tokens"] + first["completion_tokens"] - 1
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["answer_1"]


def test_both_backends_give_the_same_program_results(runtime, endpoint):
    args = dict(question_1="Name a planet.", question_2="Name another one.")
    a, b = multi_turn.run(backend=runtime, **args), multi_turn.run(backend=endpoint, **args)
    assert (a["answer_1"], a["answer_2"], a.text()) == (b["answer_1"], b["answer_2"], b.text())
    assert a.token_ids() == b.token_ids()


def test_each_fork_branch_hits_the_trunk_and_join_gathers_variables(backend):
    state = ideas.run(topic="lighthouses", backend=backend)
    metas = state.meta("idea")
    assert len(state["idea"]) == 3 and len(metas) == 3
    # each branch's prompt: the trunk, then the assistant's role markup
    trunk = metas[0]["prompt_tokens"] - len(backend.encode(backend.chat_roles().prefixes["assistant"]))
    for meta in metas:  # the trunk was prefilled once, before the branches: each one hits all of it
        assert meta["cached_tokens"] >= trunk > 20
    assert state["verdict"] in ("yes", "no")


def test_select_picks_the_choice_the_model_finds_most_likely(backend, default_engine):
    @rk.function
    def capital(s):
        s += rk.user("What is the capital of France? Answer with one word.")
        s += rk.assistant(rk.select("city", choices=["London", "Paris", "Berlin", "Rome"]))

    state = capital.run(backend=backend)
    prefix = state.token_ids()[: -len(backend.encode(state["city"]) + backend.encode(backend.chat_roles().suffixes["assistant"]))]
    hf = _hf_model(default_engine)
    direct = {}
    for choice in ["London", "Paris", "Berlin", "Rome"]:
        ids = prefix + backend.encode(choice)
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        direct[choice] = sum(float(logp[p - 1, ids[p]]) for p in range(len(prefix), len(ids)))
    assert state["city"] == max(direct, key=direct.get) == "Paris"
    for choice, score in state.meta("city")["scores"].items():
        assert score == pytest.approx(direct[choice], abs=1e-3)


_HF = {}


def _hf_model(engine):
    if "m" not in _HF:
        from transformers import AutoModelForCausalLM

        _HF["m"] = AutoModelForCausalLM.from_pretrained(engine.runner.model_dir, dtype=torch.float32).eval()
    return _HF["m"]


FEW_SHOT = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}\n\n" for a, b in [(2, 3), (10, 7), (4, 4), (8, 1), (6, 9),
                                                                        (12, 30), (5, 5), (21, 2)])


@rk.function
def arithmetic(s, a, b):
    s += FEW_SHOT
    s += f"Q: What is {a} plus {b}?\nA:"
    s += rk.gen("sum", max_tokens=4, stop=["\n"])


def test_a_batch_over_a_shared_few_shot_prefix_hits_above_80_percent(backend):
    states = arithmetic.run_batch([{"a": i, "b": 2 * i + 1} for i in range(16)], backend=backend, num_threads=8)
    assert all(s.error is None for s in states)
    metas = [s.meta("sum") for s in states]
    hit = sum(m["cached_tokens"] for m in metas) / sum(m["prompt_tokens"] for m in metas)
    assert hit > 0.8, hit
    alone = arithmetic.run(a=5, b=11, backend=backend)  # batched or alone, greedy gives the same
    assert states[5]["sum"] == alone["sum"]


def test_streaming_yields_the_same_text_as_not_streaming(backend):
    args = dict(question_1="Name a color.", question_2="Name a fruit.")
    full = multi_turn.run(backend=backend, **args)
    streamed = multi_turn.run(backend=backend, stream=True, **args)
    chunks = list(streamed.text_iter("answer_2"))
    assert "".join(chunks) == full["answer_2"] and len(chunks) > 1
    assert streamed.sync().text() == full.text()
    everything = multi_turn.run(backend=backend, stream=True, **args)
    assert "".join(everything.text_iter()) == full.text()


@rk.function
def boundary(s):
    s += "Write a sentence about the sea"  # + "shore." below: the whole text tokenises "seashore"
    forks = s.fork(2)
    for f in forks:
        f += "shore."
        f += rk.gen("next", max_tokens=4)
    forks.join()


def test_a_boundary_that_merges_still_hits_the_trunk(backend):
    trunk = backend.encode("Write a sentence about the sea")
    whole = backend.encode("Write a sentence about the seashore.")
    assert whole[: len(trunk)] != trunk  # re-tokenising the text would miss the cached trunk
    state = boundary.run(backend=backend)
    for meta in state.meta("next"):
        assert meta["cached_tokens"] >= len(trunk)  # the rule: the trunk's ids are a prefix
    assert state.meta("next")[0]["prompt_tokens"] == len(trunk) + len(backend.encode("shore."))


def test_unknown_variables_misused_roles_and_failing_programs_are_clear_errors(backend):
    state = multi_turn.run(question_1="Hi", question_2="Bye", backend=backend)
    with pytest.raises(UnknownVariableError, match="no variable 'answer_3'.*answer_1"):
        state["answer_3"]

    @rk.function
    def nested(s):
        with s.user():
            s += rk.assistant("hello")

    with pytest.raises(FrontendError, match="inside the open user message"):
        nested.run(backend=backend)

    @rk.function
    def reopened(s):
        block = s.user()
        with block:
            s += "hi"
        with block:
            s += "again"

    with pytest.raises(FrontendError, match="block is closed"):
        reopened.run(backend=backend)

    @rk.function
    def maybe_fails(s, n):
        if n == 2:
            raise ValueError("program 2 fails")
        s += f"Count to {n}:"
        s += rk.gen("count", max_tokens=4)

    states = maybe_fails.run_batch([{"n": i} for i in range(4)], backend=backend)
    assert isinstance(states[2].error, ValueError)
    assert all(states[i].error is None and states[i]["count"] for i in (0, 1, 3))


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(BackendUnreachable, match="cannot reach the runtime at http://127.0.0.1:9"):
        rk.RuntimeEndpoint("http://127.0.0.1:9")
