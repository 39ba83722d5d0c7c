"""A two-turn conversation as a frontend program: the second answer's prompt is the first turn
plus the new question, and the cache serves the whole first turn.

    python examples/dsl_multi_turn.py                      # in-process runtime
    python examples/dsl_multi_turn.py http://127.0.0.1:30000  # a running `radixkv serve`
"""

import sys

import radixkv as rk


@rk.function
def multi_turn(s, question_1, question_2):
    s += rk.system("You are a helpful assistant who answers in one or two sentences.")
    s += rk.user(question_1)
    s += rk.assistant(rk.gen("answer_1", max_tokens=64))
    s += rk.user(question_2)
    s += rk.assistant(rk.gen("answer_2", max_tokens=64, stop=["\n\n"]))


if __name__ == "__main__":
    rk.set_default_backend(rk.RuntimeEndpoint(sys.argv[1]) if len(sys.argv) > 1 else rk.Runtime(log_level="warning"))
    state = multi_turn.run(question_1="What is a lighthouse for?", question_2="Who kept them lit?")
    for message in state.messages():
        print(f"{message['role']}: {message['content']}")
    for name in ("answer_1", "answer_2"):
        meta = state.meta(name)
        print(f"[{name}: {meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens from the cache]")
