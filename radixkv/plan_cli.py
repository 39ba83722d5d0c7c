"""`radixkv plan`: how much KV memory a traced workload needs (see `radixkv.workloads.plan`).

    radixkv serve --record-trace served.jsonl              # record what a server served
    radixkv plan served.jsonl --json plan.json             # its curve, knee and memory per KV format
    radixkv plan mooncake --page-size 512 --policy lru --capacity-tokens 262144 1048576 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VENDORED = Path("benchmarks") / "data" / "mooncake_conversation_trace.jsonl"
DEFAULT_DTYPES = "auto,fp8_e4m3,int8,int4"


def add_plan_parser(sub, flag_type, positive_int, kv_dtypes) -> None:
    """`radixkv plan` (`flag_type` turns a ConfigError into a usage error naming the flag)."""
    from radixkv.config import EVICTION_POLICIES
    from radixkv.workloads.replay import OFFLINE_POLICIES

    p = sub.add_parser(
        "plan", help="how much KV memory a traced workload needs for the hit rate you want",
        description="Replay a Mooncake-format trace (what `radixkv serve --record-trace` writes, or the "
                    "vendored Mooncake conversation trace: TRACE = 'mooncake') through the real radix cache "
                    "at a series of KV capacities, and print, per capacity: the prefix hit rate, the share "
                    "of prefill compute saved, the memory it takes in each KV format (from the model's "
                    "config, as `radixkv kv-size`) and, for a trace naming LoRA adapters, each adapter's hit "
                    "rate; the knee of the curve; the working set (the most any "
                    "capacity can hit); and, with --target-hit-rate, the least memory reaching each target.")
    p.add_argument("trace", metavar="TRACE", help="a JSONL trace (timestamp, input_length, output_length, "
                                                  "hash_ids per line), or 'mooncake' for the vendored one")
    p.add_argument("--model", default="default", metavar="MODEL_OR_CONFIG",
                   help="the model whose KV sizes turn tokens into bytes: a model directory, a config.json, or "
                        "'default' (SmolLM2-135M-Instruct) (default: %(default)s)")
    p.add_argument("--kv-dtype", type=flag_type(kv_dtypes, "KV dtype list"), default=DEFAULT_DTYPES,
                   metavar="DTYPE[,DTYPE...]|all",
                   help=f"KV formats to size the memory in (default: {DEFAULT_DTYPES})")
    p.add_argument("--page-size", type=flag_type(positive_int, "token count"), default=None, metavar="N",
                   help="the cache's page size in tokens (default: the trace's block size, 512 for Mooncake)")
    p.add_argument("--block-size", type=flag_type(positive_int, "token count"), default=None, metavar="N",
                   help="tokens per hash id in the trace (default: its lines' block_size, else 512)")
    p.add_argument("--policy", default="lru", choices=(*EVICTION_POLICIES, *OFFLINE_POLICIES),
                   help="eviction policy; belady and reuse-oracle read the future (bounds) (default: %(default)s)")
    p.add_argument("--capacity-tokens", type=flag_type(token_count, "token count"), nargs="+", default=None,
                   metavar="C", help="device KV capacities to replay, in tokens (default: a sweep spanning the "
                                     "trace's working set)")
    p.add_argument("--points", type=flag_type(positive_int, "count"), default=12, metavar="N",
                   help="capacities in the default sweep (default: %(default)s)")
    p.add_argument("--target-hit-rate", type=float, nargs="+", default=[], metavar="R",
                   help="hit rates (0..1) to find the least capacity and memory for (default: none)")
    p.add_argument("--host-tokens", type=flag_type(token_count, "token count"), default=0,
                   metavar="H", help="a host tier of H tokens under every capacity (default: none)")
    p.add_argument("--storage-tokens", type=flag_type(token_count, "token count"), default=0,
                   metavar="S", help="a storage tier of S tokens under the host tier (default: none)")
    p.add_argument("--limit", type=flag_type(positive_int, "count"), default=None, metavar="N",
                   help="replay only the trace's first N requests (default: all)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the plan as JSON to OUT")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also draw the curve (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def token_count(text: str) -> int:
    """A token count: a plain integer, or with a k / M suffix (64k, 2M)."""
    from radixkv.errors import ConfigError

    t = text.strip().lower()
    scale = {"k": 1000, "m": 1000**2}.get(t[-1:], 1)
    body = t[:-1] if scale != 1 else t
    if not body.isdigit():
        raise ConfigError(f"expected a token count (e.g. 65536, 64k, 2M), got {text!r}")
    return int(body) * scale


def resolve_trace(name: str) -> Path:
    """TRACE as a path; 'mooncake' is the vendored trace, looked for beside the package's source
    and in the working directory."""
    from radixkv.errors import ConfigError

    if name != "mooncake":
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"TRACE {name!r}: no such file")
        return path
    here = Path(__file__).resolve().parents[1]
    for root in (here, Path.cwd()):
        if (root / VENDORED).is_file():
            return root / VENDORED
    raise ConfigError(f"TRACE 'mooncake': the vendored trace ({VENDORED}) is in the radixkv repository, not "
                      "in an installed wheel; run from a checkout or give the file's path")


def trace_block_size(path: Path) -> int | None:
    """The `block_size` a recorded trace's first line names, if any."""
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    size = json.loads(line).get("block_size")
                except (ValueError, AttributeError):
                    return None
                return int(size) if isinstance(size, int) and size >= 1 else None
    return None


def run_plan(args: argparse.Namespace) -> int:
    from radixkv import kv_size
    from radixkv.errors import ConfigError
    from radixkv.workloads.plan import PlanConfig, plan
    from radixkv.workloads.trace import BLOCK_SIZE, load_trace

    for t in args.target_hit_rate:
        if not 0 <= t <= 1:
            raise ConfigError(f"--target-hit-rate {t}: must be a hit rate in [0, 1]")
    path = resolve_trace(args.trace)
    block = args.block_size or trace_block_size(path) or BLOCK_SIZE
    page = args.page_size or block
    geometry = kv_size.read_kv_geometry(args.model)
    per_token = {name: geometry.size(name).bytes_per_token for name in args.kv_dtype}  # (argparse types the default too)
    try:
        trace = load_trace(path, limit=args.limit)
        config = PlanConfig(page, args.policy, args.host_tokens, args.storage_tokens, block)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(desc="replays", unit="replay", file=sys.stderr, leave=False)
    try:
        report = plan(trace, config, args.capacity_tokens, args.target_hit_rate, per_token, args.points,
                      progress=bar.update if bar is not None else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    finally:
        if bar is not None:
            bar.close()
    report = {"trace": str(path), "model": geometry.source, **report}
    print(format_plan(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot_plan(report, Path(args.plot))
    return 0


def format_plan(report: dict[str, Any]) -> str:
    """The plan as a few header lines and one table row per capacity."""
    from radixkv.kv_size import format_bytes

    dtypes = list(report["bytes_per_token"])
    ws = report["working_set"]
    lines = [f"{report['trace']}: {report['requests']:,} requests, {report['prompt_tokens']:,} prompt tokens; "
             f"page {report['page_size']}, policy {report['policy']}"
             + (f", host tier {report['host_capacity_tokens']:,} tokens" if report["host_capacity_tokens"] else "")
             + (f", storage {report['storage_capacity_tokens']:,} tokens" if report["storage_capacity_tokens"]
                else ""),
             f"working set: {ws['capacity_tokens']:,} tokens, hit rate {ws['hit_rate']:.1%} at most "
             f"(prefill saved {ws['prefill_saved']:.1%})"]
    header = ["capacity (tokens)", *[f"{d} memory" for d in dtypes], "hit rate", "prefill saved"]
    tiers = report["host_capacity_tokens"] > 0
    if tiers:
        header += ["host hits", "storage hits"]
    adapters = list(report.get("adapters") or {})
    header += [f"{name} hit rate" for name in adapters]
    rows = [header]
    knee = report["knee"]
    for p in report["curve"]:
        row = [f"{p['capacity_tokens']:,}", *[format_bytes(p["memory_bytes"][d]) for d in dtypes],
               f"{p['hit_rate']:.1%}", f"{p['prefill_saved']:.1%}"]
        if tiers:
            row += [f"{p['host_hit_tokens']:,}", f"{p['storage_hit_tokens']:,}"]
        row += [f"{p['adapter_hit_rates'].get(name, 0.0):.1%}" for name in adapters]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, r in enumerate(rows):
        at_knee = i and knee is not None and report["curve"][i - 1]["capacity_tokens"] == knee["capacity_tokens"]
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)) + ("  <- knee" if at_knee else ""))
    for name, use in (report.get("adapters") or {}).items():
        lines.append(f"adapter {name}: {use['requests']:,} requests, {use['prompt_tokens']:,} prompt tokens, "
                     f"hit rate {use['working_set_hit_rate']:.1%} at most")
    for t in report["targets"]:
        if t["capacity_tokens"] is None:
            lines.append(f"hit rate {t['hit_rate']:.1%}: not reachable (at most {ws['hit_rate']:.1%})")
        else:
            mem = ", ".join(f"{d} {format_bytes(t['memory_bytes'][d])}" for d in dtypes)
            lines.append(f"hit rate {t['hit_rate']:.1%}: {t['capacity_tokens']:,} tokens ({mem}); "
                         f"reaches {t['reached_hit_rate']:.1%}")
    return "\n".join(lines)


def plot_plan(report: dict[str, Any], path: Path) -> None:
    """Hit rate and prefill saved against capacity, log scale, with the knee marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [p["capacity_tokens"] for p in report["curve"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(caps, [p["hit_rate"] for p in report["curve"]], "o-", label="hit rate")
    ax.plot(caps, [p["prefill_saved"] for p in report["curve"]], "s--", label="prefill compute saved")
    ax.axhline(report["working_set"]["hit_rate"], color="grey", lw=0.8, ls=":", label="working set (ceiling)")
    if report["knee"] is not None:
        ax.axvline(report["knee"]["capacity_tokens"], color="red", lw=0.8, label="knee")
    ax.set_xscale("log")
    ax.set_xlabel(f"device KV capacity (tokens; page {report['page_size']})")
    ax.set_ylabel("share of prompt tokens / prefill")
    ax.set_ylim(0, min(1.0, max(0.1, 1.25 * report["working_set"]["hit_rate"])))
    ax.set_title(f"{Path(report['trace']).name}: {report['policy']}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
