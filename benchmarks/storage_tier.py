"""The storage tier (`--kv-storage-dir`): what a prefix on local disk is worth.

1. This machine's disk: write (fsync'd) and read bandwidth, reads both from the page cache and
   cold (the file's pages dropped from it first with posix_fadvise).
2. Warm restart: time to first token of one `--prompt-tokens` prompt (default 2,000) in a new
   process whose storage directory a previous process filled (`restart`), next to a new process
   without the tier (`cold`), the same prompt again in one process (`warm`, a device hit) and
   after another prompt pushed it to the host tier (`host`). The restart runs the defaults a
   user gets (`--host-kv-size` and `--kv-storage-dir`, nothing else) first, then each
   `--restart-flags` row (default: the `best_effort` prefetch policy, the default before).
   Every process first serves an unrelated prompt, so start-up work is not counted; the
   storage files are dropped from the page cache before each restart. Goals: restart <= 0.3x
   cold with >= 90% of the prompt from storage; a host hit <= 0.2x cold. The load bandwidth the
   tier's reads got (checks included) is reported next to the raw disk read.
3. Break-even: TTFT of prompts of several lengths computed (`recompute`) and read back from
   disk (`storage`, cold page cache), in one process: the shortest prefix for which loading
   beats recomputing.
4. The Mooncake conversation trace through three tiers (the simulator: the real tree and LRU on
   every tier, page 512): device only, + host, + host + storage; what the storage hits would
   cost to read at the measured cold bandwidth next to recomputing them.

    python benchmarks/storage_tier.py
    python benchmarks/storage_tier.py --skip-replay --prompt-tokens 1000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _replay_cli import add_replay_args, check_replay_args, number_list
from _report import RESULTS, machine, save_json

HERE = Path(__file__).resolve()
WARMUP = "Tell me one short fact about the moon."


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_replay_args(p, [2_560_000])
    p.add_argument("--prompt-tokens", type=int, default=2000, help="warm-restart prompt length (default 2000)")
    p.add_argument("--lengths", type=number_list(int, positive=True), default=[64, 256, 1024, 2000],
                   help="break-even prompt lengths (default 64,256,1024,2000)")
    p.add_argument("--repeats", type=int, default=3, help="processes per warm-restart case (median; default 3)")
    p.add_argument("--restart-flags", nargs="*", default=['{"kv_storage_prefetch_policy": "best_effort"}'],
                   help="extra warm-restart rows, each engine options as JSON beside the defaults")
    p.add_argument("--disk-mib", type=int, default=256, help="bandwidth test file size (default 256 MiB)")
    p.add_argument("--dir", type=Path, default=None, help="where to put storage (default: a temporary folder)")
    p.add_argument("--host-multiplier", type=float, default=2.0, help="replay: host tier / device (default 2)")
    p.add_argument("--storage-multipliers", type=number_list(float), default=[4, 16],
                   help="replay: storage tier sizes / device (default 4,16)")
    p.add_argument("--tflops", type=float, default=0.1, help="replay: prefill compute rate, TFLOP/s (default 0.1)")
    p.add_argument("--skip-replay", action="store_true", help="leave out the trace replay")
    p.add_argument("--json", type=Path, default=RESULTS / "storage_tier.json", help="results file")
    p.add_argument("--child", choices=("serve", "host", "break-even"), help=argparse.SUPPRESS)
    p.add_argument("--child-storage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-options", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_replay_args(p, args)
    if args.prompt_tokens < 16 or args.repeats < 1 or args.disk_mib < 1:
        p.error("--prompt-tokens must be >= 16, --repeats and --disk-mib >= 1")
    return args


# -- 1. the disk -----------------------------------------------------------------------------------
def drop_page_cache(path: Path) -> None:
    """Drop `path`'s pages from the OS page cache, so the next read goes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_bandwidth(directory: Path, mib: int) -> dict:
    path = directory / "bandwidth.bin"
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    write = time.perf_counter() - start

    def read() -> float:
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
        return time.perf_counter() - t

    drop_page_cache(path)
    cold = read()
    warm = read()
    path.unlink()
    gb = mib * 2**20 / 1e9
    return {"mib": mib, "write_gbs": gb / write, "read_cold_gbs": gb / cold, "read_warm_gbs": gb / warm}


# -- 2, 3. through the real engine -----------------------------------------------------------------
def prompt_ids(tokenizer, n: int, salt: str = "") -> list[int]:
    text = " ".join(f"{salt}Section {i}: the keeper climbed the tower, lit the lamp and logged the ships."
                    for i in range(n // 8 + 8))
    return tokenizer.encode(text)[:n]


def child(args) -> None:
    """One process: print one JSON line of what it measured."""
    from radixkv.engine import Engine

    storage = args.child_storage
    pool = max(8192, 2 * max([args.prompt_tokens, *args.lengths]))
    if args.child == "host":  # a pool for one prompt: the next one pushes it to the host tier
        pool = args.prompt_tokens + 64
    options = dict(max_total_tokens=pool, progress=False, log_level="warning")
    if storage or args.child == "host":
        options.update(host_kv_size=str(4 * pool))
    if storage:
        options.update(kv_storage_dir=storage)
    options.update(json.loads(args.child_options))
    engine = Engine(**options)
    one = {"max_new_tokens": 1, "temperature": 0.0}
    try:
        engine.generate(WARMUP, one)
        tok = engine.core.tokenizer
        if args.child == "serve":
            ids = prompt_ids(tok, args.prompt_tokens)
            first = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]
            again = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]
            print(json.dumps({"first": first, "again": again, "stats": engine.get_stats()}))
            return
        if args.child == "host":
            ids, other = prompt_ids(tok, args.prompt_tokens), prompt_ids(tok, args.prompt_tokens, salt="other-")
            first = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]
            engine.generate(input_ids=other, sampling_params=one)  # pushes the first to the host tier
            again = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]
            print(json.dumps({"first": first, "again": again}))
            return
        rows = []
        for n in args.lengths:
            ids = prompt_ids(tok, n, salt=f"{n}-")
            computed = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]

            def to_disk_only(s):
                s.cache.persist()
                s.cache.storage.flush()
                return s.flush_cache()

            assert engine._call(to_disk_only)
            for path in Path(storage).glob("*.kvp"):
                drop_page_cache(path)
            loaded = engine.generate(input_ids=ids, sampling_params=one)["meta_info"]
            rows.append({"tokens": n, "recompute_ttft": computed["ttft"], "storage_ttft": loaded["ttft"],
                         "storage_tokens": loaded["cached_tokens_details"]["storage"]})
        print(json.dumps({"rows": rows}))
    finally:
        engine.shutdown()


def run_child(args, mode: str, storage: Path | None, options: str = "{}") -> dict:
    cmd = [sys.executable, str(HERE), "--child", mode, "--prompt-tokens", str(args.prompt_tokens),
           "--lengths", ",".join(map(str, args.lengths)), "--child-options", options]
    if storage is not None:
        cmd += ["--child-storage", str(storage)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warm_restart(args, root: Path) -> dict:
    rows = ["{}", *args.restart_flags]  # the defaults first
    cases = {"cold": [], "warm": [], "host": [], **{f"restart {flags}": [] for flags in rows}}
    storage_tokens = {flags: [] for flags in rows}
    load_gbs = {flags: [] for flags in rows}
    for i in range(args.repeats):
        cold = run_child(args, "serve", None)
        cases["cold"].append(cold["first"]["ttft"])
        cases["warm"].append(cold["again"]["ttft"])
        cases["host"].append(run_child(args, "host", None)["again"]["ttft"])
        for j, flags in enumerate(rows):
            directory = root / f"restart-{i}-{j}"
            run_child(args, "serve", directory, flags)  # fills the directory, then shuts down cleanly
            for path in directory.glob("*.kvp"):
                drop_page_cache(path)
            restarted = run_child(args, "serve", directory, flags)
            cases[f"restart {flags}"].append(restarted["first"]["ttft"])
            storage_tokens[flags].append(restarted["first"]["cached_tokens_details"]["storage"])
            load_gbs[flags].append(restarted["stats"].get("storage_read_gbs"))
    med = {k: statistics.median(v) for k, v in cases.items()}
    return {"prompt_tokens": args.prompt_tokens, "ttft_seconds": cases, "median": med,
            "restart_over_cold": {flags: med[f"restart {flags}"] / med["cold"] for flags in rows},
            "warm_over_cold": med["warm"] / med["cold"], "host_over_cold": med["host"] / med["cold"],
            "storage_hit_tokens": storage_tokens, "load_gbs": load_gbs}


def break_even(args, root: Path) -> dict:
    rows = run_child(args, "break-even", root / "break-even")["rows"]
    faster = [r["tokens"] for r in rows if r["storage_ttft"] < r["recompute_ttft"]]
    return {"rows": rows, "shortest_faster_from_disk": min(faster) if faster else None}


# -- 4. the trace ----------------------------------------------------------------------------------
def trace_replay(args, read_gbs: float) -> list[dict]:
    from host_tier_replay import model_costs
    from tqdm import tqdm

    from radixkv.workloads.replay import replay
    from radixkv.workloads.trace import load_trace

    trace = load_trace(args.trace, args.limit)
    costs = model_costs()
    rows = []
    cases = [(0, 0), (args.host_multiplier, 0)] + [(args.host_multiplier, m) for m in args.storage_multipliers]
    with tqdm(total=len(args.capacity_tokens) * len(cases) * len(trace), desc="replays", unit="request",
              unit_scale=True) as bar:
        for cap in args.capacity_tokens:
            for host, storage in cases:
                r = replay(trace, "lru", capacity_tokens=cap, page_size=args.page_size, progress=bar.update,
                           host_capacity_tokens=int(host * cap), storage_capacity_tokens=int(storage * cap))
                mean_depth = r.prompt_tokens / max(1, r.requests) / 2
                flops = r.storage_hit_tokens * (costs["linear_flops_per_token"]
                                                + costs["attention_flops_per_token_per_depth"] * mean_depth)
                read_bytes = r.storage_hit_tokens * costs["bytes_per_token"]
                rows.append({**r.to_json(), "device_hit_tokens": r.device_hit_tokens, "host_multiplier": host,
                             "storage_multiplier": storage, "storage_read_bytes": read_bytes,
                             "storage_read_seconds": read_bytes / (read_gbs * 1e9),
                             "storage_recompute_seconds": flops / (args.tflops * 1e12)})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        disk = disk_bandwidth(root, args.disk_mib)
        print(f"disk: write {disk['write_gbs']:.2f} GB/s (fsync'd), read {disk['read_cold_gbs']:.2f} GB/s cold, "
              f"{disk['read_warm_gbs']:.2f} GB/s from the page cache")
        restart = warm_restart(args, root)
        med = restart["median"]
        print(f"TTFT of a {args.prompt_tokens}-token prompt (median of {args.repeats} processes): cold "
              f"{med['cold'] * 1e3:.0f} ms; warm in process {med['warm'] * 1e3:.0f} ms "
              f"({restart['warm_over_cold']:.2f}x cold); host-tier hit {med['host'] * 1e3:.0f} ms "
              f"({restart['host_over_cold']:.2f}x)")
        for flags, ratio in restart["restart_over_cold"].items():
            gbs = [g for g in restart["load_gbs"][flags] if g]
            print(f"  restart {'(defaults)' if flags == '{}' else flags}: {med[f'restart {flags}'] * 1e3:.0f} ms "
                  f"({ratio:.2f}x cold), from storage {restart['storage_hit_tokens'][flags]} tokens, load "
                  f"{statistics.median(gbs) if gbs else 0:.2f} GB/s (disk read {disk['read_cold_gbs']:.2f} cold)")
        even = break_even(args, root)
    print(f"{'tokens':>8}{'recompute ms':>14}{'from disk ms':>14}")
    for r in even["rows"]:
        print(f"{r['tokens']:>8}{r['recompute_ttft'] * 1e3:>14.1f}{r['storage_ttft'] * 1e3:>14.1f}")
    print(f"shortest prefix faster from disk: {even['shortest_faster_from_disk']}")
    rows = [] if args.skip_replay else trace_replay(args, disk["read_cold_gbs"])
    if rows:
        print(f"\n{'device':>10}{'host':>6}{'storage':>9}{'hit %':>8}{'device %':>10}{'host %':>8}{'storage %':>11}"
              f"{'read s':>9}{'recompute s':>13}")
        for r in rows:
            p = r["prompt_tokens"]
            print(f"{r['capacity_tokens'] / 1e6:>9.2f}M{r['host_multiplier']:>5g}x{r['storage_multiplier']:>8g}x"
                  f"{100 * r['hit_rate']:>8.1f}{100 * r['device_hit_tokens'] / p:>10.1f}"
                  f"{100 * r['host_hit_tokens'] / p:>8.1f}{100 * r['storage_hit_tokens'] / p:>11.1f}"
                  f"{r['storage_read_seconds']:>9.0f}{r['storage_recompute_seconds']:>13.0f}")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k not in ("json", "child")},
                          "disk": disk, "warm_restart": restart, "break_even": even, "replay": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
