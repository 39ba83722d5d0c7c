"""Tree of thought: one question, three branches of reasoning that share the question's
prefix (computed once, then read from the cache by every branch), a vote with `select`.

    python examples/dsl_fork_tree_of_thought.py
"""

import radixkv as rk


@rk.function
def tree_of_thought(s, question):
    s += rk.system("You are a careful thinker.")
    s += rk.user(question + " Think step by step in one sentence.")
    branches = s.fork(3)
    for i, branch in enumerate(branches):
        branch += rk.assistant(rk.gen("thought", max_tokens=40, temperature=0.8, seed=i))
    branches.join()
    s += rk.user("Here are three thoughts:\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(s["thought"]))
                 + "\nWhich thought is the most helpful? Answer 1, 2 or 3.")
    s += rk.assistant(rk.select("best", choices=["1", "2", "3"]))


if __name__ == "__main__":
    rk.set_default_backend(rk.Runtime(log_level="warning"))
    state = tree_of_thought.run(question="Why do lighthouses flash instead of shining steadily?")
    for i, (thought, meta) in enumerate(zip(state["thought"], state.meta("thought"))):
        print(f"thought {i + 1}: {thought}")
        print(f"    [{meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens from the cache]")
    print(f"best: {state['best']}  (log-likelihoods {state.meta('best')['scores']})")
