"""Routing over replicas on the Mooncake conversation trace: hit rate of 2 and 4 workers of
capacity C behind cache-aware, round-robin and least-load routing, next to one cache of N x C;
and the load balance (max / mean requests per worker). Same replay as `trace_hit_rate.py` (real
`RadixCache`s, LRU, page 512, file order); see `radixkv/workloads/routing.py`.

    python benchmarks/routing_replay.py
    python benchmarks/routing_replay.py --capacity-tokens 1000000 --workers 2,4,8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from _report import RESULTS, machine, save_figure, save_json

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first K requests")
    p.add_argument("--capacity-tokens", type=int, default=2_560_000, help="per worker (default 2560000)")
    p.add_argument("--workers", default="2,4", help="worker counts (default 2,4)")
    p.add_argument("--policies", default="cache_aware,round_robin,least_load", help="routing policies")
    p.add_argument("--page-size", type=int, default=512, help="tokens per page (default 512)")
    p.add_argument("--json", type=Path, default=RESULTS / "routing_replay.json", help="results file")
    args = p.parse_args(argv)
    from radixkv.routing import POLICIES

    try:
        args.workers = [int(x) for x in args.workers.split(",") if x]
    except ValueError:
        p.error(f"--workers: not a list of integers: {args.workers!r}")
    args.policies = [x for x in args.policies.split(",") if x]
    if not args.workers or min(args.workers) < 1:
        p.error("--workers: give counts >= 1")
    if not args.policies or set(args.policies) - set(POLICIES):
        p.error(f"--policies: choose from {list(POLICIES)}")
    if not args.trace.is_file():
        p.error(f"--trace: no such file: {args.trace}")
    if args.capacity_tokens < args.page_size:
        p.error("--capacity-tokens: at least one page")
    return args


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def label(r):
        return "one cache of N x C" if r["policy"].startswith("one cache") else r["policy"]

    ns = sorted({r["workers"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(dict.fromkeys(label(r) for r in rows))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([k + i * width for k in range(len(ns))],
               [100 * next(r["hit_rate"] for r in rows if r["workers"] == n and label(r) == name) for n in ns],
               width, label=name)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(ns))], [f"{n} workers" for n in ns])
    ax.set_ylabel("token hit rate (%)")
    ax.set_title("routing over workers of capacity C vs one cache of N x C")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.workloads.replay import replay
    from radixkv.workloads.routing import replay_routed
    from radixkv.workloads.trace import load_trace

    trace = load_trace(args.trace, args.limit)
    rows = []
    with tqdm(total=len(trace) * len(args.workers) * (len(args.policies) + 1), desc="replays", unit="request",
              unit_scale=True) as bar:
        for n in args.workers:
            one = replay(trace, "lru", capacity_tokens=n * args.capacity_tokens, page_size=args.page_size,
                         progress=bar.update)
            rows.append({"workers": n, "policy": f"one cache of {n} x C", "hit_rate": one.hit_rate, "imbalance": 1.0})
            for name in args.policies:
                r = replay_routed(trace, name, n, args.capacity_tokens, page_size=args.page_size, progress=bar.update)
                rows.append({**r.to_json(), "one_cache_hit_rate": one.hit_rate,
                             "gap_points": 100 * (r.hit_rate - one.hit_rate)})
    print(f"\n{len(trace)} requests, C = {args.capacity_tokens:,} tokens per worker, page {args.page_size}, LRU")
    print(f"{'workers':>8}  {'policy':<22}{'hit %':>8}{'vs one cache':>14}{'imbalance':>11}")
    for r in rows:
        gap = f"{r['gap_points']:+.2f} pt" if "gap_points" in r else ""
        print(f"{r['workers']:>8}  {r['policy']:<22}{100 * r['hit_rate']:>8.2f}{gap:>14}{r['imbalance']:>11.3f}")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "rows": rows})
    plot(rows, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
