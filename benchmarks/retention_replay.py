"""Retention hints on the Mooncake conversation trace: what a client's `cache_control` ttl /
`prompt_cache_retention` is worth to the prefix cache's hit rate.

Same replay as `trace_hit_rate.py` (the real `RadixCache` + `PageAllocator`, file order, page
512), with the cache's clock set to the trace's time, so a hint of `ttl` seconds runs out when it
would have in the traced service. Runs, at each capacity:

- `lru`: no hints;
- `lru + oracle hints (ttl)`: a request whose cached prompt a later request holds whole (its
  conversation goes on) carries `Retention.whole(ttl)`: what a client that knows its
  conversation continues would send;
- `lru + hints on every request (ttl)`: blanket hints, what hinting everything does;
- `reuse-oracle`: the offline bound of `trace_hit_rate.py` (knows whether each page is used again).

    python benchmarks/retention_replay.py
    python benchmarks/retention_replay.py --capacity-tokens 2560000 --oracle-ttl 60,300 --limit 3000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _replay_cli import add_replay_args, check_replay_args, number_list
from _report import RESULTS, machine, save_json
from tqdm import tqdm

from radixkv.workloads.replay import replay
from radixkv.workloads.trace import load_trace


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_replay_args(p, [2_560_000, 5_120_000])
    p.add_argument("--oracle-ttl", type=number_list(float, positive=True, allow_empty=True), default=[300.0, 3600.0],
                   help="seconds of the oracle hints, one run each (default 300,3600)")
    p.add_argument("--blanket-ttl", type=number_list(float, positive=True, allow_empty=True), default=[300.0],
                   help="seconds of the hints on every request, one run each (default 300)")
    p.add_argument("--json", type=Path, default=RESULTS / "retention_replay.json",
                   help="results file (default: %(default)s)")
    args = p.parse_args(argv)
    check_replay_args(p, args)
    return args


def label(policy: str, hints: str, seconds: float) -> str:
    if hints == "none":
        return policy
    ttl = f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"
    return f"{policy} + {'oracle hints' if hints == 'oracle' else 'hints on every request'} ({ttl})"


def main(argv=None) -> int:
    args = parse_args(argv)
    trace = load_trace(args.trace, args.limit)
    configs = [("lru", "none", 0.0), *(("lru", "oracle", s) for s in args.oracle_ttl),
               *(("lru", "all", s) for s in args.blanket_ttl), ("reuse-oracle", "none", 0.0)]
    span = (trace[-1].timestamp - trace[0].timestamp) / 1000 if trace else 0.0
    print(f"{args.trace.name}: {len(trace)} requests over {span / 60:.0f} min of trace time, "
          f"{sum(r.input_length for r in trace):,} prompt tokens; {len(configs) * len(args.capacity_tokens)} runs",
          flush=True)
    rows = []
    with tqdm(total=len(configs) * len(args.capacity_tokens) * len(trace), unit="req", disable=None,
              mininterval=1.0) as bar:
        for cap in args.capacity_tokens:
            for policy, hints, seconds in configs:
                r = replay(trace, policy, cap, args.page_size, hints=hints, hint_seconds=seconds,
                           progress=bar.update)
                rows.append({**r.to_json(), "label": label(policy, hints, seconds)})
                bar.write(f"{cap:>10,} {rows[-1]['label']:<38} hit rate {100 * r.hit_rate:.2f}%")
    width = max(len(r["label"]) for r in rows)
    print(f"\n{'capacity':>10}  {'run':<{width}} {'hit rate':>9} {'work saved':>11} {'hinted':>8}")
    for r in rows:
        print(f"{r['capacity_tokens']:>10,}  {r['label']:<{width}} {100 * r['hit_rate']:>8.2f}% "
              f"{100 * r['prefill_work_saved'] / r['prefill_work']:>10.2f}% "
              f"{100 * r['hinted_requests'] / max(1, r['requests']):>7.1f}%")
    save_json(args.json, {**machine(), "trace": str(args.trace), "page_size": args.page_size, "limit": args.limit,
                          "trace_seconds": span, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
