"""A KV store shared by replicas (`--kv-storage-backend mooncake`): what it is worth.

1. Two real replicas on this machine, one Mooncake master (`mooncake_master` from the
   `mooncake` extra, on loopback, tcp). Replica A serves a `--prompt-tokens` prompt (default
   2,000); then replica B, which never saw it, serves it (`store`: read from the store), next to
   B serving a prompt of the same length nobody has seen (`cold`). TTFT of each (median of
   `--repeats` prompts), the tokens B read from the store, and the read bandwidth its loads got.
   Both replicas run the defaults plus `--host-kv-size` (the storage tier sits under the host
   tier) and the mooncake backend.
2. The Mooncake conversation trace over N replicas (the simulator: real trees and LRU, page
   512) behind round-robin and cache-aware routing: each replica alone (device + host tier),
   and all of them over one shared store: hit rate, and how much of it the store served.

    python benchmarks/shared_store.py
    python benchmarks/shared_store.py --skip-replicas --workers 2,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from _report import RESULTS, machine, save_json
from _servers import free_port, start_radixkv

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-tokens", type=int, default=2000, help="replica prompt length (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="prompts per case (median; default 3)")
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first K requests")
    p.add_argument("--workers", default="2,4", help="replica counts in the replay (default 2,4)")
    p.add_argument("--capacity-tokens", type=int, default=500_000, help="replay: device tokens per replica")
    p.add_argument("--host-tokens", type=int, default=500_000, help="replay: host tier tokens per replica")
    p.add_argument("--store-tokens", type=int, default=8_000_000, help="replay: shared store tokens")
    p.add_argument("--skip-replicas", action="store_true", help="leave out the real replicas")
    p.add_argument("--skip-replay", action="store_true", help="leave out the trace replay")
    p.add_argument("--json", type=Path, default=RESULTS / "shared_store.json", help="results file")
    args = p.parse_args(argv)
    try:
        args.workers = [int(x) for x in args.workers.split(",") if x]
    except ValueError:
        p.error(f"--workers: not a list of integers: {args.workers!r}")
    if not args.workers or min(args.workers) < 1 or args.repeats < 1 or args.prompt_tokens < 128:
        p.error("--workers >= 1, --repeats >= 1, --prompt-tokens >= 128")
    return args


# -- 1. two real replicas ------------------------------------------------------------------------
def mooncake_master(log: Path) -> tuple[subprocess.Popen, str]:
    binary = Path(sys.executable).parent / "mooncake_master"
    binary = str(binary) if binary.exists() else shutil.which("mooncake_master")
    if binary is None:
        raise RuntimeError("mooncake_master not found: pip install 'radixkv[mooncake]'")
    port = free_port()
    proc = subprocess.Popen([binary, f"--rpc_port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mooncake_master did not start: {log.read_text()[-1000:]}") from None
            time.sleep(0.05)


def prompt_ids(tokenizer, n: int, salt: str) -> list[int]:
    text = " ".join(f"{salt} section {i}: the keeper climbed the tower, lit the lamp and logged the ships."
                    for i in range(n // 8 + 8))
    return tokenizer.encode(text)[:n]


def first_token(server, ids: list[int]) -> dict:
    r = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 1, "temperature": 0.0}}, timeout=600)
    r.raise_for_status()
    return r.json()["meta_info"]


def wait_written(server, pages: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = httpx.get(server.url + "/server_info", timeout=10).json()["kv_storage"]
        if s["storage_pending_pages"] == 0 and s["storage_written_pages"] >= pages:
            return
        time.sleep(0.1)
    raise RuntimeError(f"replica A did not write {pages} page(s) in {timeout} s")


def replicas(args) -> dict:
    from transformers import AutoTokenizer

    from radixkv.model.model_dir import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    with tempfile.TemporaryDirectory() as tmp:
        master, address = mooncake_master(Path(tmp) / "master.log")
        config = json.dumps({"master_server_address": address})
        flags = ("--host-kv-size", str(8 * args.prompt_tokens), "--kv-storage-backend", "mooncake",
                 "--kv-storage-config", config)
        servers = []
        try:
            a = start_radixkv(*flags)
            servers.append(a)
            b = start_radixkv(*flags)
            servers.append(b)
            for s in servers:  # start-up work is not counted
                first_token(s, prompt_ids(tokenizer, 64, "warm-up"))
            store, cold, read = [], [], []
            for i in tqdm(range(args.repeats), desc="replica prompts"):
                ids = prompt_ids(tokenizer, args.prompt_tokens, f"shared-{i}")
                written = httpx.get(a.url + "/server_info", timeout=10).json()["kv_storage"]["storage_written_pages"]
                first_token(a, ids)
                wait_written(a, written + args.prompt_tokens // 64)
                store.append(first_token(b, ids))
                cold.append(first_token(b, prompt_ids(tokenizer, args.prompt_tokens, f"fresh-{i}")))
            info = httpx.get(b.url + "/server_info", timeout=10).json()["kv_storage"]
        finally:
            for s in servers:
                s.stop()
            master.terminate()
            master.wait(10)
    store_ttft = statistics.median(m["ttft"] for m in store)
    cold_ttft = statistics.median(m["ttft"] for m in cold)
    return {"prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "flags": list(flags[:4]),
            "store_ttft_s": store_ttft, "cold_ttft_s": cold_ttft, "ratio": store_ttft / cold_ttft,
            "store_tokens": [m["cached_tokens_details"]["storage"] for m in store],
            "store_fraction": statistics.median(m["cached_tokens_details"]["storage"] / args.prompt_tokens
                                                for m in store),
            "cold_cached_tokens": [m["cached_tokens"] for m in cold],
            "read_gbs": info.get("storage_read_gbs"), "bytes_read": info.get("storage_bytes_read")}


# -- 2. the trace over N replicas ----------------------------------------------------------------
def replay(args) -> list[dict]:
    from radixkv.workloads.routing import replay_routed
    from radixkv.workloads.trace import load_trace

    trace = load_trace(args.trace, args.limit)
    rows = []
    cases = [(n, policy, store) for n in args.workers for policy in ("round_robin", "cache_aware")
             for store in (0, args.store_tokens)]
    with tqdm(total=len(trace) * len(cases), desc="replays", unit="request", unit_scale=True) as bar:
        for n, policy, store in cases:
            r = replay_routed(trace, policy, n, args.capacity_tokens, page_size=512, progress=bar.update,
                              host_tokens=args.host_tokens, store_tokens=store)
            rows.append({"workers": n, "policy": policy, "shared_store_tokens": store, "hit_rate": r.hit_rate,
                         "store_hit_share": r.store_hit_tokens / max(1, r.hit_tokens),
                         "host_hit_tokens": r.host_hit_tokens, "store_hit_tokens": r.store_hit_tokens,
                         "requests": r.requests})
    return rows


def table(report: dict, when: str) -> str:
    """The docs' table (`<!-- shared-store -->` in docs/cache-tiers.md; `run_all.py` writes it)."""
    out = ""
    r = report.get("replicas")
    if r:
        out += (f"| two replicas, one Mooncake master (tcp, loopback), {r['prompt_tokens']:,}-token prompts | "
                f"TTFT ms | vs cold | from the store |\n|---|---|---|---|\n"
                f"| replica B, a prompt nobody has seen (cold) | {r['cold_ttft_s'] * 1e3:,.0f} | 1.00x | |\n"
                f"| replica B, the prompt replica A served (reads {r['read_gbs']} GB/s) | {r['store_ttft_s'] * 1e3:,.0f} | "
                f"{r['ratio']:.2f}x | {100 * r['store_fraction']:.0f}% |\n\n")
    rows = report.get("replay")
    if rows:
        a = report["args"]
        out += (f"| replicas | routing | shared store | hit rate | of it from the store |\n|---|---|---|---|---|\n"
                + "".join(f"| {x['workers']} | {x['policy'].replace('_', ' ')} | "
                          f"{'%.0f M tokens' % (x['shared_store_tokens'] / 1e6) if x['shared_store_tokens'] else 'none'} | "
                          f"{x['hit_rate']:.1%} | {x['store_hit_share']:.0%} |\n" for x in rows)
                + f"\nReplay: the Mooncake conversation trace, each replica {int(a['capacity_tokens']):,} device + "
                  f"{int(a['host_tokens']):,} host tokens, page 512, LRU. ")
    return out + f"Median of {r['repeats'] if r else '-'} prompts per case. `python benchmarks/shared_store.py`, {when}.\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    report = {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"}}
    if not args.skip_replicas:
        r = report["replicas"] = replicas(args)
        print(f"\ntwo replicas, one Mooncake master (tcp, loopback), {r['prompt_tokens']}-token prompts, "
              f"median of {r['repeats']}:")
        print(f"  B's first request for A's prompt: TTFT {r['store_ttft_s']:.3f} s, "
              f"{100 * r['store_fraction']:.0f}% of it from the store")
        print(f"  B's first request for an unseen prompt (cold): TTFT {r['cold_ttft_s']:.3f} s")
        print(f"  store / cold = {r['ratio']:.2f}x; loads read at {r['read_gbs']} GB/s")
    if not args.skip_replay:
        rows = report["replay"] = replay(args)
        print(f"\nMooncake trace over N replicas (device {args.capacity_tokens:,} + host {args.host_tokens:,} "
              f"tokens each; shared store {args.store_tokens:,}; page 512, LRU)")
        print(f"{'replicas':>8}  {'routing':<12}{'store':>8}{'hit %':>8}{'from store':>12}")
        for r in rows:
            print(f"{r['workers']:>8}  {r['policy']:<12}{'yes' if r['shared_store_tokens'] else 'no':>8}"
                  f"{100 * r['hit_rate']:>8.2f}{100 * r['store_hit_share']:>11.1f}%")
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "1")
    sys.exit(main())
