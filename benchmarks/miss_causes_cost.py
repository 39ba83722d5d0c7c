"""What miss attribution costs per admission, against the lookup every admission does anyway.

Replays the vendored Mooncake trace through the real cache (as `radixkv.workloads.replay`
does), with the ghost index on, and times for every request, side by side: the prefix lookup
(`peek`), `explain` (the causes of `radixkv.mem.miss_causes`: evicted pages looked up in the
ghost index, other namespaces, page tails) and `retokenized` (the text comparison where the
prompt parts from a cached sequence, with the default model's real tokenizer decoding; the
trace's token ids are synthetic, taken modulo the vocabulary). Prints and saves mean and p99
per request, and the ratios to the lookup.

    python benchmarks/miss_causes_cost.py
    python benchmarks/miss_causes_cost.py --limit 3000 --capacity-tokens 2000000 --page-size 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _report import RESULTS, machine, save_json

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--limit", type=int, default=4000, help="requests replayed (default 4000)")
    p.add_argument("--capacity-tokens", type=int, default=1_000_000, help="device cache (default 1,000,000)")
    p.add_argument("--page-size", type=int, default=16, help="(default 16)")
    p.add_argument("--json", type=Path, default=RESULTS / "miss_causes_cost.json")
    args = p.parse_args(argv)
    if args.limit < 1 or args.capacity_tokens < args.page_size or args.page_size < 1:
        p.error("--limit >= 1, --page-size >= 1, --capacity-tokens >= one page")
    from radixkv.mem.miss_causes import GhostIndex, explain, retokenized
    from radixkv.model.loader import resolve_model_dir
    from radixkv.tokenizer import Tokenizer
    from radixkv.workloads.replay import build_cache
    from radixkv.workloads.trace import expand_tokens, load_trace

    trace = load_trace(args.trace, limit=args.limit)
    cache, _ = build_cache("lru", args.capacity_tokens, args.page_size, trace)
    cache.ghosts = GhostIndex()
    tok = Tokenizer(resolve_model_dir(None))
    vocab = len(tok.hf)

    def decode(ids):
        return tok.decode([i % vocab for i in ids])

    peek_s, explain_s, retok_s, totals = [], [], [], {}
    for req in trace:
        key = expand_tokens(req)
        t0 = time.perf_counter()
        match = cache.peek(key)
        t1 = time.perf_counter()
        causes = explain(cache, key, None, match.num_tokens)
        t2 = time.perf_counter()
        causes = retokenized(cache, key, None, causes, decode)
        t3 = time.perf_counter()
        peek_s.append(t1 - t0)
        explain_s.append(t2 - t1)
        retok_s.append(t3 - t2)
        for k, v in causes.items():
            totals[k] = totals.get(k, 0) + v
        cache.serve_and_cache(key, cache.match_prefix(key))

    def summary(xs):
        xs = sorted(xs)
        return {"mean_us": 1e6 * statistics.fmean(xs), "p99_us": 1e6 * xs[int(0.99 * (len(xs) - 1))]}

    result = {**machine(), "requests": len(trace), "page_size": args.page_size,
              "capacity_tokens": args.capacity_tokens, "mean_prompt_tokens": statistics.fmean(r.input_length for r in trace),
              "peek": summary(peek_s), "explain": summary(explain_s), "retokenized": summary(retok_s),
              "explain_over_peek": statistics.fmean(explain_s) / statistics.fmean(peek_s),
              "retokenized_over_peek": statistics.fmean(retok_s) / statistics.fmean(peek_s),
              "ghost_pages": len(cache.ghosts), "causes": totals}
    print(f"{len(trace)} requests (mean {result['mean_prompt_tokens']:,.0f} prompt tokens), page {args.page_size}, "
          f"{args.capacity_tokens:,}-token cache, {len(cache.ghosts):,} ghost pages at the end")
    for name in ("peek", "explain", "retokenized"):
        print(f"  {name:11s} mean {result[name]['mean_us']:8.1f} us   p99 {result[name]['p99_us']:8.1f} us")
    print(f"  explain / peek: {result['explain_over_peek']:.2f}x; retokenized / peek: "
          f"{result['retokenized_over_peek']:.2f}x;  causes: {totals}")
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
