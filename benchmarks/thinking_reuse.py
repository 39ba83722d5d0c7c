"""What a thinking model's template costs the prefix cache across turns.

Qwen3's chat template (and DeepSeek-R1's) drops the reasoning of earlier assistant turns when it
renders the next turn: the next prompt holds each earlier answer but not its `<think>` block,
so it diverges from what the cache holds (the previous prompt plus everything generated after
it) right where that block began. This replays multi-turn conversations whose assistant turns
think before answering, rendered two ways with the default model's chat template:

    keep   every turn's reasoning stays in the history (a raw prompt kept verbatim)
    drop   earlier turns' reasoning is removed from the history (Qwen3's template rule)

Each turn's prompt runs (its cached tokens counted), then the assistant turn is computed after
it (as a server generating it would: the cache holds prompt + reasoning + answer). Reported:
the hit rate over the turns after the first, the prompt tokens recomputed, and the prefill
time of the turns (one engine, the two renderings in separate cache namespaces).

    python benchmarks/thinking_reuse.py
    python benchmarks/thinking_reuse.py --conversations 8 --turns 6 --thinking-words 400
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from _report import RESULTS, machine, save_json

WORDS = ("the of and to in is that it for on as with was by this be are from at or an which we can step "
         "first then check so if not but all more number value answer because since case let consider "
         "compute sum total result means wait again maybe right yes therefore").split()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=6, help="conversations (default 6)")
    p.add_argument("--turns", type=int, default=5, help="user turns each (default 5)")
    p.add_argument("--thinking-words", type=int, default=250, help="words of reasoning per assistant turn (default 250)")
    p.add_argument("--answer-words", type=int, default=60, help="words of answer per assistant turn (default 60)")
    p.add_argument("--json", type=Path, default=RESULTS / "thinking_reuse.json", help="results file")
    return p.parse_args(argv)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def render(tokenizer, history: list[dict], drop: bool) -> list[int]:
    messages = []
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    for i, m in enumerate(history):
        if m["role"] == "assistant" and drop and i < last_user:
            messages.append({"role": "assistant", "content": m["answer"]})
        elif m["role"] == "assistant":
            messages.append({"role": "assistant", "content": f"<think>\n{m['thinking']}\n</think>\n\n{m['answer']}"})
        else:
            messages.append({"role": m["role"], "content": m["content"]})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def run(core, rid: str, ids: list[int], namespace: str) -> tuple[int, float]:
    from radixkv.sampling_params import SamplingParams
    from radixkv.sched.request import Req

    start = time.perf_counter()
    core.add_request(Req(rid, list(ids), SamplingParams(max_new_tokens=0), namespace=namespace))
    cached = 0
    while core.has_work:
        for o in core.step():
            if o.finished:
                cached = o.cached_tokens
    return cached, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from radixkv.config import EngineConfig
    from radixkv.core.engine_core import EngineCore

    core = EngineCore.load(EngineConfig.from_kwargs(max_total_tokens=1 << 17, log_level="warning"), progress=False)
    tok = core.tokenizer.hf
    results = {}
    try:
        for mode in ("keep", "drop"):
            rng = random.Random(0)
            prompt_tokens = cached_tokens = 0
            seconds = 0.0
            for c in range(args.conversations):
                history = [{"role": "system", "content": f"You are assistant {c}. Think step by step."},
                           {"role": "user", "content": words(rng, 30)}]
                for t in range(args.turns):
                    ids = render(tok, history, mode == "drop")
                    cached, took = run(core, f"{mode}-{c}-{t}", ids, mode)
                    if t > 0:
                        prompt_tokens, cached_tokens, seconds = prompt_tokens + len(ids), cached_tokens + cached, seconds + took
                    turn = {"role": "assistant", "thinking": words(rng, args.thinking_words),
                            "answer": words(rng, args.answer_words)}
                    generated = f"<think>\n{turn['thinking']}\n</think>\n\n{turn['answer']}"
                    run(core, f"{mode}-{c}-{t}-gen", ids + tok.encode(generated, add_special_tokens=False), mode)
                    history += [turn, {"role": "user", "content": words(rng, 30)}]
            results[mode] = {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
                             "recomputed_tokens": prompt_tokens - cached_tokens,
                             "hit_rate": cached_tokens / prompt_tokens, "prefill_seconds": seconds}
            print(mode, results[mode], flush=True)
    finally:
        core.close()
    keep, drop = results["keep"], results["drop"]
    report = {**machine(), "workload": vars(args) | {"json": str(args.json)}, "results": results,
              "drop_recomputes_x": drop["recomputed_tokens"] / max(1, keep["recomputed_tokens"]),
              "drop_prefill_seconds_x": drop["prefill_seconds"] / keep["prefill_seconds"]}
    print(f"hit rate after turn 1: keep {keep['hit_rate']:.1%}, drop {drop['hit_rate']:.1%}; drop recomputes "
          f"{report['drop_recomputes_x']:.1f}x the tokens and spends {report['drop_prefill_seconds_x']:.1f}x the "
          "prefill time")
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
