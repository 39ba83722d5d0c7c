"""The host tier on the Mooncake conversation trace: hit rate with a host tier of 2x and 4x the
device capacity vs none, split into device and host hits, and what a host hit costs (bytes to
copy back) next to what it saves (the prefill it would take to recompute).

The eviction study found LRU 15 points below the reuse-oracle bound at 10,000 pages of 512
tokens: online policies cannot tell which prefixes come back. A host tier does not need to: it
keeps what the device evicts, one tier down. Same replay as `trace_hit_rate.py` (the real
`RadixCache` + `PageAllocator`, file order, page 512), LRU on both tiers.

Costs are per token of the default model (SmolLM2-135M, fp32 KV: 46,080 bytes; about 0.27
GFLOP of linear layers plus attention over the token's depth), turned into time at
`--link-gbs` (host -> device copy) and `--tflops` (prefill rate); the defaults are this
machine's (a memcpy at about 10 GB/s, fp32 matmuls at about 0.1 TFLOP/s).

    python benchmarks/host_tier_replay.py
    python benchmarks/host_tier_replay.py --capacity-tokens 1000000 --host-multipliers 1,2,4,8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _replay_cli import add_replay_args, check_replay_args, number_list
from _report import RESULTS, machine, save_figure, save_json
from tqdm import tqdm


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_replay_args(p, [1_000_000, 5_120_000])
    p.add_argument("--host-multipliers", type=number_list(float), default=[0, 2, 4],
                   help="host tier sizes as multiples of the device capacity (default 0,2,4)")
    p.add_argument("--write-policy", choices=("write-back", "write-through"), default="write-back",
                   help="when prefixes reach the host (default write-back)")
    p.add_argument("--link-gbs", type=float, default=10.0, help="host->device copy rate, GB/s (default 10)")
    p.add_argument("--tflops", type=float, default=0.1, help="prefill compute rate, TFLOP/s (default 0.1)")
    p.add_argument("--json", type=Path, default=RESULTS / "host_tier_replay.json", help="results file")
    args = p.parse_args(argv)
    check_replay_args(p, args)
    if args.link_gbs <= 0 or args.tflops <= 0:
        p.error("--link-gbs and --tflops must be > 0")
    return args


def model_costs() -> dict:
    """KV bytes and prefill FLOPs per token of the default model (from its config)."""
    from radixkv.kv_size import kv_bytes_per_token, load_config
    from radixkv.model.loader import resolve_model_dir

    cfg, _ = load_config(resolve_model_dir(None))
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = h // heads
    linear = 2 * layers * (h * d * (heads + 2 * kv_heads) + heads * d * h + 3 * h * inter) + 2 * h * cfg["vocab_size"]
    return {"bytes_per_token": kv_bytes_per_token(cfg, "float32"), "linear_flops_per_token": linear,
            "attention_flops_per_token_per_depth": 4 * layers * heads * d}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = sorted({r["capacity_tokens"] for r in rows})
    fig, axes = plt.subplots(1, len(caps), figsize=(5.5 * len(caps), 4), squeeze=False)
    for ax, cap in zip(axes[0], caps):
        sub = [r for r in rows if r["capacity_tokens"] == cap]
        labels = [f"host {r['host_multiplier']:g}x" for r in sub]
        dev = [100 * r["device_hit_tokens"] / r["prompt_tokens"] for r in sub]
        host = [100 * r["host_hit_tokens"] / r["prompt_tokens"] for r in sub]
        ax.bar(labels, dev, label="device hits")
        ax.bar(labels, host, bottom=dev, label="host hits")
        ax.axhline(100 * sub[0]["reuse_oracle_hit_rate"], color="k", ls="--", label="reuse-oracle, device only")
        ax.set_title(f"device {cap / 1e6:.2f} M tokens, LRU")
        ax.set_ylabel("token hit rate (%)")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.workloads.replay import replay
    from radixkv.workloads.trace import load_trace

    trace = load_trace(args.trace, args.limit)
    costs = model_costs()
    rows = []
    runs = len(args.capacity_tokens) * (len(args.host_multipliers) + 1)
    with tqdm(total=runs * len(trace), desc="replays", unit="request", unit_scale=True) as bar:
        for cap in args.capacity_tokens:
            oracle = replay(trace, "reuse-oracle", capacity_tokens=cap, page_size=args.page_size, progress=bar.update)
            for mult in args.host_multipliers:
                r = replay(trace, "lru", capacity_tokens=cap, page_size=args.page_size, progress=bar.update,
                           host_capacity_tokens=int(mult * cap), host_write_policy=args.write_policy)
                copy_s = r.host_hit_tokens * costs["bytes_per_token"] / (args.link_gbs * 1e9)
                # recomputing a host hit: its linear layers + attention over its depth (~ its mean position)
                mean_depth = r.prompt_tokens / max(1, r.requests) / 2
                flops = r.host_hit_tokens * (costs["linear_flops_per_token"]
                                             + costs["attention_flops_per_token_per_depth"] * mean_depth)
                rows.append({**r.to_json(), "device_hit_tokens": r.device_hit_tokens, "host_multiplier": mult,
                             "reuse_oracle_hit_rate": oracle.hit_rate, "host_copy_bytes":
                             r.host_hit_tokens * costs["bytes_per_token"], "host_copy_seconds": copy_s,
                             "recompute_flops": flops, "recompute_seconds": flops / (args.tflops * 1e12)})
    print(f"\n{len(trace)} requests, page {args.page_size}, LRU on both tiers ({args.write_policy}); "
          f"costs per token: {costs['bytes_per_token']:,} bytes to copy vs "
          f"{costs['linear_flops_per_token'] / 1e9:.2f} GFLOP + attention to recompute")
    print(f"{'device':>10}{'host':>7}{'hit %':>8}{'device %':>10}{'host %':>8}{'oracle %':>10}"
          f"{'copy GB':>10}{'copy s':>9}{'recompute s':>13}")
    for r in rows:
        p = r["prompt_tokens"]
        print(f"{r['capacity_tokens'] / 1e6:>9.2f}M{r['host_multiplier']:>6g}x{100 * r['hit_rate']:>8.1f}"
              f"{100 * r['device_hit_tokens'] / p:>10.1f}{100 * r['host_hit_tokens'] / p:>8.1f}"
              f"{100 * r['reuse_oracle_hit_rate']:>10.1f}{r['host_copy_bytes'] / 1e9:>10.1f}"
              f"{r['host_copy_seconds']:>9.0f}{r['recompute_seconds']:>13.0f}")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "costs": costs, "rows": rows})
    plot(rows, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
