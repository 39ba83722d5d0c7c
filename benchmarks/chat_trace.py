"""Write a synthetic multi-turn chat trace (Mooncake JSONL format plus token ids).

    python benchmarks/chat_trace.py --out benchmarks/results/chat_trace.jsonl --requests 256
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from radixkv.errors import ConfigError
from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace, write_trace

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    defaults = ChatTraceConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "chat_trace.jsonl",
                   help="output JSONL path (default: %(default)s)")
    p.add_argument("--requests", type=int, default=defaults.num_requests, help="number of requests")
    p.add_argument("--conversations", type=int, default=defaults.num_conversations,
                   help="number of conversations")
    p.add_argument("--groups", type=int, default=defaults.num_groups,
                   help="number of distinct shared system prompts")
    p.add_argument("--system-tokens", type=int, default=defaults.system_tokens,
                   help="tokens per system prompt")
    p.add_argument("--user-tokens", type=int, nargs=2, default=defaults.user_tokens,
                   metavar=("MIN", "MAX"), help="user turn length range")
    p.add_argument("--answer-tokens", type=int, nargs=2, default=defaults.answer_tokens,
                   metavar=("MIN", "MAX"), help="answer length range")
    p.add_argument("--max-turns", type=int, default=defaults.max_turns, help="turns per conversation at most")
    p.add_argument("--zipf-alpha", type=float, default=defaults.zipf_alpha,
                   help="conversation popularity skew (0 = uniform)")
    p.add_argument("--rate", type=float, default=defaults.request_rate, help="arrivals per second (Poisson)")
    p.add_argument("--vocab", type=int, nargs=2, default=(defaults.vocab_low, defaults.vocab_high),
                   metavar=("LOW", "HIGH"), help="token ids are drawn from [LOW, HIGH)")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    args = p.parse_args(argv)
    try:
        config = ChatTraceConfig(
            num_requests=args.requests, num_conversations=args.conversations, num_groups=args.groups,
            system_tokens=args.system_tokens, user_tokens=tuple(args.user_tokens),
            answer_tokens=tuple(args.answer_tokens), max_turns=args.max_turns,
            zipf_alpha=args.zipf_alpha, request_rate=args.rate, vocab_low=args.vocab[0],
            vocab_high=args.vocab[1], seed=args.seed,
        )
    except ConfigError as e:
        p.error(str(e))
    records = generate_chat_trace(config)
    write_trace(records, args.out, config)
    prompt = sum(r["input_length"] for r in records)
    print(f"wrote {len(records)} requests ({prompt:,} prompt tokens) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
