"""Prefix-cache hit rate on a real request trace, replayed through the real RadixCache.

Replays a Mooncake-format trace (default: the conversation trace in benchmarks/data) request
by request through `RadixCache` + `PageAllocator` at several capacities and eviction policies,
prints a table, saves JSON and draws hit rate vs capacity, one line per policy, with the
unlimited-cache ceiling.

    python benchmarks/trace_hit_rate.py                                # default sweep + plot
    python benchmarks/trace_hit_rate.py --policy lru,belady --capacity-tokens 5120000
    python benchmarks/trace_hit_rate.py --trace my.jsonl --page-size 16 --limit 2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _report import RESULTS, machine, save_json
from tqdm import tqdm

from radixkv.mem import POLICIES
from radixkv.workloads.replay import BOUNDS, OFFLINE_POLICIES, ReplayResult, replay
from radixkv.workloads.trace import load_trace

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO / "benchmarks" / "data" / "mooncake_conversation_trace.jsonl"
DEFAULT_CAPACITIES = "500000,1000000,2560000,5120000,10240000"
ALL_POLICIES = [*POLICIES, *OFFLINE_POLICIES, *BOUNDS]
DEFAULT_POLICIES = [*POLICIES, *OFFLINE_POLICIES, "inf"]
ONCE = ("inf", "none")  # bounds that do not depend on capacity


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"capacities must be positive, got {text!r}")
    return values


def policy_list(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {bad}; choose from {ALL_POLICIES}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                   help="Mooncake-format JSONL trace (default: %(default)s)")
    p.add_argument("--page-size", type=int, default=512,
                   help="tokens per KV page; matches and evictions are page-aligned (default 512)")
    p.add_argument("--block-size", type=int, default=512,
                   help="tokens per hash block in the trace (512 for Mooncake traces)")
    p.add_argument("--capacity-tokens", type=positive_ints, default=positive_ints(DEFAULT_CAPACITIES),
                   help=f"comma-separated KV pool sizes in tokens (default {DEFAULT_CAPACITIES})")
    p.add_argument("--policy", type=policy_list, default=DEFAULT_POLICIES,
                   help=f"comma-separated policies from {ALL_POLICIES}; 'belady' is the offline "
                        "optimum, 'inf' an unlimited cache and 'none' no cache (each run once) "
                        f"(default: {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--limit", type=int, default=None, help="replay only the first K requests")
    p.add_argument("--attention-scale", type=int, default=8192,
                   help="context length at which a token's attention cost equals its linear-layer "
                        "cost: sets the prefill-work figures and reuse-cost's cost model (default 8192)")
    p.add_argument("--json", type=Path, default=RESULTS / "trace_hit_rate.json",
                   help="where to save the results (default: %(default)s)")
    p.add_argument("--plot", type=Path, default=RESULTS / "trace_hit_rate.png",
                   help="where to draw hit rate vs capacity; 'none' to skip (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.trace.is_file():
        p.error(f"--trace: no such file: {args.trace}")
    if args.page_size < 1 or args.block_size < 1:
        p.error("--page-size and --block-size must be >= 1")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if args.attention_scale < 1:
        p.error("--attention-scale must be >= 1")
    return args


def plot(results: list[ReplayResult], path: Path, title: str) -> None:
    """Hit rate (left) and prefill work saved (right) vs capacity, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    metrics = [("hit rate (% of prompt tokens)", lambda r: 100 * r.hit_rate),
               ("prefill work saved (% of recompute cost)", lambda r: 100 * r.prefill_work_saved / r.prefill_work)]
    for ax, (label, value) in zip(axes, metrics):
        for name in dict.fromkeys(r.policy for r in results):
            runs = sorted((r for r in results if r.policy == name), key=lambda r: r.capacity_tokens)
            if name in ONCE:
                bound = "unlimited cache" if name == "inf" else "no cache"
                ax.axhline(value(runs[0]), color="black" if name == "inf" else "grey", ls="--", lw=1,
                           label=f"{bound} ({value(runs[0]):.1f}%)")
                continue
            style = {"belady": dict(color="black", marker="s")}.get(name, {})
            ax.plot([r.capacity_tokens for r in runs], [value(r) for r in runs],
                    marker=style.pop("marker", "o"), label=name, **style)
        ax.set_xscale("log")
        ax.set_xlabel("KV cache capacity (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trace = load_trace(args.trace, args.limit)
    runs = [(pol, cap) for pol in args.policy if pol not in ONCE for cap in args.capacity_tokens]
    runs += [(pol, 0) for pol in ONCE if pol in args.policy]
    total = len(runs) * len(trace)
    print(f"{args.trace.name}: {len(trace)} requests, "
          f"{sum(r.input_length for r in trace):,} prompt tokens; {len(runs)} runs", flush=True)
    results: list[ReplayResult] = []
    with tqdm(total=total, unit="req", disable=None, mininterval=1.0) as bar:
        for pol, cap in runs:
            bar.set_description(f"{pol}@{cap:,}" if pol not in ONCE else pol)
            results.append(replay(trace, pol, cap, args.page_size, args.block_size,
                                  args.attention_scale, progress=bar.update))
            bar.write(f"{pol:<10} {cap:>12,} tokens: hit rate {100 * results[-1].hit_rate:.2f}%")
    print(f"\n{'policy':<8} {'capacity':>12} {'hit rate':>9} {'work saved':>11} "
          f"{'evicted':>14} {'Mtok/s':>8}")
    for r in results:
        print(f"{r.policy:<8} {r.capacity_tokens:>12,} {100 * r.hit_rate:>8.2f}% "
              f"{100 * r.prefill_work_saved / r.prefill_work:>10.2f}% {r.evicted_tokens:>14,} "
              f"{r.tokens_per_second / 1e6:>8.2f}")
    report = {
        **machine(), "trace": str(args.trace), "page_size": args.page_size,
        "block_size": args.block_size, "attention_scale": args.attention_scale, "limit": args.limit,
        "runs": [r.to_json() for r in results],
    }
    save_json(args.json, report)
    if str(args.plot).lower() != "none":
        plot(results, args.plot, f"{args.trace.name}, page size {args.page_size}")
        print(f"saved {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
