"""A fork-and-join program as a frontend program vs the same work as independent requests.

The program: a ~1,000-token shared context and a question, `fork(4)` branches that each
generate an answer, then a join turn that generates a summary over the branches' answers. It
runs on an in-process Runtime with the radix cache on; the trunk is computed once and every
branch reads it from the cache. The baseline sends the very same prompts (the token ids the
program sent, the branches together as one batch, then the join) to an Engine with the radix
cache off, so every request recomputes its whole prompt. In one run, alternating, medians of
`--repeats`; also the same independent requests with the cache on, for reference.

    python benchmarks/frontend_fork.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from _report import RESULTS, bar_plot, machine, save_json

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context-tokens", type=int, default=1000, help="shared context length (default 1000)")
    p.add_argument("--branches", type=int, default=4, help="fork width (default 4)")
    p.add_argument("--answer-tokens", type=int, default=32, help="tokens per branch and summary (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs (default 3)")
    p.add_argument("--json", type=Path, default=RESULTS / "frontend_fork.json", help="results file")
    args = p.parse_args(argv)
    if min(args.context_tokens, args.branches, args.answer_tokens, args.repeats) < 1:
        p.error("every count must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import radixkv as rk
    from radixkv.engine import Engine

    cached_engine = Engine(log_level="warning", max_total_tokens=32768)
    plain_engine = Engine(log_level="warning", max_total_tokens=32768, disable_radix_cache=True,
                          progress=False)
    runtime = rk.Runtime(engine=cached_engine)
    tok = cached_engine.tokenizer
    context = tok.decode(tok.encode_segment(PROSE.read_text())[: args.context_tokens])
    n, answer = args.branches, args.answer_tokens

    @rk.function
    def fork_join(s, context, question):
        s += rk.system("You are a helpful assistant. Use the document to answer.")
        s += rk.user(f"Document:\n{context}\n\nQuestion: {question}")
        forks = s.fork(n)
        for i, f in enumerate(forks):
            f += rk.assistant(rk.gen("answer", max_tokens=answer, temperature=0.7, seed=i, ignore_eos=True))
        forks.join()
        s += rk.user("Answers:\n" + "\n".join(f"- {a}" for a in s["answer"]) + "\nSummarize them in one line.")
        s += rk.assistant(rk.gen("summary", max_tokens=answer, ignore_eos=True))

    def dsl():
        cached_engine.flush_cache()
        start = time.perf_counter()
        state = fork_join.run(context=context, question="Why did lighthouses need keepers?", backend=runtime)
        wall = time.perf_counter() - start
        metas = state.meta("answer") + [state.meta("summary")]
        prompts = {"branches": [state.meta("answer")[0]["prompt_tokens"]] * n,
                   "summary": state.meta("summary")["prompt_tokens"]}
        return wall, state, metas, prompts

    # the exact prompts the program sent, for the baseline
    _, state, _, _ = dsl()
    summary_prompt = state.token_ids()
    summary_prompt = summary_prompt[: state.meta("summary")["prompt_tokens"]]
    branch_prompt = summary_prompt[: state.meta("answer")[0]["prompt_tokens"]]

    def independent(engine):
        def run():
            engine.flush_cache()
            start = time.perf_counter()
            params = [{"max_new_tokens": answer, "temperature": 0.7, "seed": i, "ignore_eos": True} for i in range(n)]
            engine.generate(input_ids=[branch_prompt] * n, sampling_params=params)
            engine.generate(input_ids=summary_prompt, sampling_params={"max_new_tokens": answer, "temperature": 0,
                                                                        "ignore_eos": True})
            return time.perf_counter() - start
        return run

    times = {"dsl": [], "independent, cache off": [], "independent, cache on": []}
    hit = None
    with tqdm(total=3 * args.repeats, desc="fork-join", unit="run") as bar:
        for _ in range(args.repeats):
            wall, _, metas, _ = dsl()
            times["dsl"].append(wall)
            hit = sum(m["cached_tokens"] for m in metas) / sum(m["prompt_tokens"] for m in metas)
            bar.update(1)
            times["independent, cache off"].append(independent(plain_engine)())
            bar.update(1)
            times["independent, cache on"].append(independent(cached_engine)())
            bar.update(1)
    med = {k: statistics.median(v) for k, v in times.items()}
    prompt_tokens = n * len(branch_prompt) + len(summary_prompt)
    print(f"\nprogram: {len(branch_prompt)}-token trunk, {n} branches x {answer} tokens, a {len(summary_prompt)}-token "
          f"join prompt ({prompt_tokens} prompt tokens in all)")
    for k, v in med.items():
        print(f"{k:<26}{v:>8.2f} s   {med['independent, cache off'] / v:>5.2f}x")
    print(f"DSL hit rate: {hit:.1%} of its prompt tokens came from the cache")
    save_json(args.json, {**machine(), "context_tokens": args.context_tokens, "branches": n, "answer_tokens": answer,
                          "trunk_tokens": len(branch_prompt), "join_prompt_tokens": len(summary_prompt),
                          "seconds": times, "median_seconds": med, "dsl_hit_rate": hit,
                          "speedup_vs_independent_cache_off": med["independent, cache off"] / med["dsl"]})
    bar_plot(args.json.with_suffix(".png"), "fork-and-join program (lower is better)", "median wall time (s)", med)
    cached_engine.shutdown()
    plain_engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
