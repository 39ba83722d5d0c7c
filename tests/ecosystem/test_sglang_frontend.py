"""SGLang's own frontend language (`sglang` from PyPI, `sgl.RuntimeEndpoint`) against the real
radixkv server: the programs of its `sglang/test/test_programs.py`.

The programs whose checks hold for any model run as SGLang ships them. The ones that check a
large model's knowledge (the capital of Japan, 257 * 983) run as written, and are checked for
what the server owes them instead: the frontend reads exactly the text a direct greedy request
gives (so nothing is garbled or cut between them)."""

import pytest

sgl = pytest.importorskip("sglang", reason="the SGLang frontend is a test extra: pip install --no-deps sglang==0.5.23")
programs = pytest.importorskip("sglang.test.test_programs")


@pytest.fixture(scope="module")
def backend(server):
    endpoint = sgl.RuntimeEndpoint(server.url, api_key=server.api_key, chat_template_name="chatml")
    sgl.set_default_backend(endpoint)
    yield endpoint
    sgl.set_default_backend(None)


def greedy_text(server, text: str, stop, max_new_tokens: int = 128) -> str:
    with server.client() as c:
        return c.post("/generate", json={"text": text, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0, "stop": stop}}).json()["text"]


def test_its_model_independent_programs_run_as_shipped(backend):
    """(`test_decode_json_regex`, `test_stream` and `test_mt_bench` are left out for time: this
    small model fills their 64- and 128-token budgets; `test_decode_json` and the role-based
    stream test below cover the same paths.)"""
    programs.test_select(check_answer=False)
    programs.test_decode_json()
    programs.test_dtype_gen()
    programs.test_regex()
    programs.test_parallel_encoding(check_answer=False)  # POST /concate_and_append_request


def test_its_stream_logprobs_program_runs_as_shipped(backend):
    """Cumulative text, per-chunk log-probs, `output_token_logprobs_length`. The frontend's own
    iterator races its reader thread: it takes all the text that arrived since it last woke but
    only the latest event's `meta_info` (`StreamExecutor` keeps one), so two events landing
    between two wake-ups fail the program's per-chunk count with nothing wrong on the wire
    (tests/server/test_sglang_api.py checks every event's log-probs there). Seen once in CI on
    a loaded machine; the program gets three tries."""
    for attempt in range(3):
        try:
            programs.test_stream_logprobs()
            return
        except AssertionError:
            if attempt == 2:
                raise


def test_stream_gives_the_text_that_not_streaming_gives(backend):
    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=24, temperature=0))

    streamed = qa.run(question="Describe a lighthouse.", stream=True)
    pieces = list(streamed.text_iter("answer"))
    assert len(pieces) > 1 and "".join(pieces) == qa.run(question="Describe a lighthouse.")["answer"]


def test_few_shot_qa_reads_the_servers_greedy_answer(backend, server):
    @sgl.function
    def few_shot_qa(s, question):  # as test_programs.test_few_shot_qa writes it
        s += "The following are questions with answers.\n\n"
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: What is the capital of Germany?\nA: Berlin\n"
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", temperature=0, max_tokens=16)

    questions = ["What is the capital of Japan?", "What is the capital of Italy?"]
    rets = few_shot_qa.run_batch([{"question": q} for q in questions])
    for q, ret in zip(questions, rets):
        prompt = ret.text()[: -len(ret["answer"]) or None]
        assert ret["answer"] == greedy_text(server, prompt, "\n", 16)


def test_tool_use_and_react_run_with_the_text_and_choices_they_read(backend, server):
    @sgl.function
    def tool_use(s, lhs, rhs):  # test_programs.test_tool_use, its calculator left out
        s += "Please perform computations using a calculator. You can use calculate(expression) to get the results.\n"
        s += "For example,\ncalculate(1+2)=3\ncalculate(3*4)=12\n"
        s += f"Question: What is the product of {lhs} and {rhs}?\n"
        s += "Answer: The answer is calculate(" + sgl.gen("expression", stop=")", temperature=0, max_tokens=16) + ") = "

    ret = tool_use.run(lhs=257, rhs=983)
    prompt = ret.text()[: ret.text().rindex(ret["expression"] + ") = ")]
    assert ret["expression"] == greedy_text(server, prompt, ")", 16)

    @sgl.function
    def react(s, question):  # test_programs.test_react's loop: gen, select, branch on the choice
        s += "Question: Which country does the founder of Microsoft live in?\n"
        s += "Thought 1: I need to search for the founder of Microsoft.\nAction 1: Search [Founder of Microsoft].\n"
        s += "Question: " + question + "\n"
        for i in range(1, 3):
            s += f"Thought {i}:" + sgl.gen(stop=[".", "\n"], temperature=0, max_tokens=16) + ".\n"
            s += f"Action {i}: " + sgl.select(f"action_{i}", ["Search", "Finish"])
            if s[f"action_{i}"] == "Search":
                s += " [" + sgl.gen(stop="]", temperature=0, max_tokens=16) + "].\n"
            else:
                s += " [" + sgl.gen("answer", stop="]", temperature=0, max_tokens=16) + "].\n"
                break

    ret = react.run(question="What country does the creator of Linux live in?")
    assert ret["action_1"] in ("Search", "Finish")


def test_parallel_decoding_forks_and_joins(backend):
    @sgl.function
    def parallel_decoding(s, topic):  # test_programs.test_parallel_decoding, shorter
        s += "Act as a helpful assistant.\nUSER: Give some tips for " + topic + ".\n"
        s += "ASSISTANT: Okay. Here are 3 concise tips, each under 8 words:\n"
        for i in range(1, 4):
            s += f"{i}." + sgl.gen(max_tokens=8, stop=[".", "\n"]) + ".\n"
        forks = s.fork(3)
        for i in range(3):
            forks[i] += f"Now, I expand tip {i + 1} into a detailed paragraph:\nTip {i + 1}:"
            forks[i] += sgl.gen("detailed_tip", 16, stop=["\n\n"])
        forks.join()
        s += "Here are these tips with detailed explanation:\n"
        for i in range(3):
            s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
        s += "\nIn summary," + sgl.gen("summary", max_tokens=16)

    ret = parallel_decoding.run(topic="writing a good blog post", temperature=0.3)
    assert isinstance(ret["summary"], str)
