"""KV memory efficiency, measured: the tables the paged-attention and prefix-cache papers quote.

Three parts, each printed as a table and saved in one JSON file (`--json`), with a plot:

1. **Paged pool vs static max-length allocation**, on the request lengths (prompt + output) of
   the vendored Mooncake trace. `StaticKVCache` below reserves `--max-len` tokens per request
   (what a server without paging must, to admit its longest request); the paged pool is the real
   `PageAllocator`, one page of `--page-sizes` tokens at a time. Requests are admitted in trace
   order until the byte budget is full, starting at `--windows` places in the trace; per page
   size: memory utilisation (tokens stored / tokens reserved), internal fragmentation (the
   unused part of each request's last page) and how many requests the budget holds at once.
2. **Shared-prefix savings**: N requests at once on one system prompt, their KV pages counted by
   the real allocator with the radix cache (the system prompt's pages once, locked by every
   request) and without (each request its own copy).
3. **KV formats under a binding byte budget**, on the real engine: for each `--formats` value
   the pool gets as many tokens as the budget holds in that format, and `--requests` distinct
   prompts arrive at once; memory, not compute, limits how many run together. Per format: bytes
   per token, pool tokens, the most requests running at once (from the scheduler's timeline),
   and output tokens/s.

    python benchmarks/memory_efficiency.py
    python benchmarks/memory_efficiency.py --skip-engine            # parts 1 and 2 only (seconds)
    python benchmarks/memory_efficiency.py --formats auto,fp16,int8,int4 --requests 96
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from _report import RESULTS, machine, save_figure, save_json

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"
PAGE_SIZES = (1, 8, 16, 32, 128)
FORMATS = ("auto", "fp16", "fp8_e4m3", "int8", "int4")
WORDS = ("amber basil cedar delta ember fjord grove harbor iris juniper kelp lantern meadow nectar orchid "
         "pebble quartz river saffron thistle umber violet willow yarrow zephyr").split()


class StaticKVCache:
    """KV slots of `max_len` tokens each, one per request, reserved whole at admission (the
    layout of a server that preallocates each request's maximum length)."""

    def __init__(self, budget_tokens: int, max_len: int):
        self.max_len = max_len
        self.slots = budget_tokens // max_len
        self.used = 0

    def admit(self, length: int) -> bool:
        if length > self.max_len or self.used >= self.slots:
            return False
        self.used += 1
        return True

    @property
    def reserved_tokens(self) -> int:
        return self.used * self.max_len


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace whose lengths part 1 uses")
    p.add_argument("--budget", default="16GiB", help="part 1: KV memory (default 16GiB)")
    p.add_argument("--kv-dtype", default="fp16", help="part 1: the format that turns the budget into tokens "
                                                       "(default fp16)")
    p.add_argument("--model", default="default", help="model (directory, config.json or 'default') whose KV "
                                                      "sizes are used (default: the default model)")
    p.add_argument("--max-len", type=int, default=None,
                   help="part 1: the static cache's tokens per request (default: the trace's longest request)")
    p.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)), help="part 1 (default 1,8,16,32,128)")
    p.add_argument("--windows", type=int, default=20, help="part 1: admission runs, at places spread over "
                                                           "the trace (default 20)")
    p.add_argument("--system-tokens", type=int, default=1024, help="part 2: shared system prompt (default 1024)")
    p.add_argument("--own-tokens", type=int, default=512, help="part 2: each request's own prompt and output "
                                                               "tokens (default 512)")
    p.add_argument("--concurrency", default="1,8,32,128", help="part 2: requests at once (default 1,8,32,128)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"part 3 (default {','.join(FORMATS)})")
    p.add_argument("--engine-budget", default="96MiB", help="part 3: KV byte budget (default 96MiB)")
    p.add_argument("--requests", type=int, default=96, help="part 3: requests arriving at once (default 96)")
    p.add_argument("--prompt-words", type=int, default=60, help="part 3: words per prompt (default 60)")
    p.add_argument("--new-tokens", type=int, default=32, help="part 3: tokens generated each (default 32)")
    p.add_argument("--skip-engine", action="store_true", help="parts 1 and 2 only (no model run)")
    p.add_argument("--json", type=Path, default=RESULTS / "memory_efficiency.json", help="results file")
    p.add_argument("--plot", type=Path, default=None, help="plot file (default: beside --json, .png)")
    args = p.parse_args(argv)
    from radixkv.errors import ConfigError
    from radixkv.kv_size import canonical_kv_dtype, parse_size

    try:
        args.budget_bytes = parse_size(args.budget)
        args.engine_budget_bytes = parse_size(args.engine_budget)
        args.kv_dtype = canonical_kv_dtype(args.kv_dtype)
        args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        for f in args.formats:
            if f != "auto":
                canonical_kv_dtype(f)
    except ConfigError as e:
        p.error(str(e))
    for name in ("page_sizes", "concurrency"):
        try:
            values = [int(v) for v in getattr(args, name).split(",") if v.strip()]
        except ValueError:
            p.error(f"--{name.replace('_', '-')}: comma-separated positive integers")
        if not values or min(values) < 1:
            p.error(f"--{name.replace('_', '-')}: comma-separated positive integers")
        setattr(args, name, values)
    for name in ("windows", "system_tokens", "own_tokens", "requests", "prompt_words", "new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if args.max_len is not None and args.max_len < 1:
        p.error("--max-len: must be >= 1")
    if not args.trace.is_file():
        p.error(f"--trace: {args.trace} not found")
    args.plot = args.plot or args.json.with_suffix(".png")
    return args


# -- part 1 ------------------------------------------------------------------------------------
def admit_paged(lengths: list[int], budget_tokens: int, page_size: int) -> dict:
    """Admit `lengths` in order into a real PageAllocator of the budget until one does not fit."""
    from radixkv.mem import PageAllocator

    pool = PageAllocator(budget_tokens // page_size, page_size)
    stored = held = 0
    for n in lengths:
        need = math.ceil(n / page_size)
        if need > pool.free_pages:
            break
        pool.alloc(need)
        stored, held = stored + n, held + 1
    reserved = pool.used_pages * page_size
    return {"requests": held, "stored_tokens": stored, "reserved_tokens": reserved}


def admit_static(lengths: list[int], budget_tokens: int, max_len: int) -> dict:
    cache, stored = StaticKVCache(budget_tokens, max_len), 0
    for n in lengths:
        if not cache.admit(n):
            break
        stored += n
    return {"requests": cache.used, "stored_tokens": stored, "reserved_tokens": cache.reserved_tokens}


def part_allocation(args, bytes_per_token: int) -> dict:
    from radixkv.workloads.trace import load_trace

    trace = load_trace(args.trace)
    lengths = [r.input_length + r.output_length for r in trace]
    max_len = args.max_len or max(lengths)
    budget_tokens = args.budget_bytes // bytes_per_token
    starts = [i * len(lengths) // args.windows for i in range(args.windows)]
    rows = {}

    def summarise(runs):
        stored = sum(r["stored_tokens"] for r in runs)
        reserved = sum(r["reserved_tokens"] for r in runs)
        return {"utilisation": stored / max(reserved, 1), "fragmentation": 1 - stored / max(reserved, 1),
                "mean_concurrent_requests": sum(r["requests"] for r in runs) / len(runs),
                "min_concurrent_requests": min(r["requests"] for r in runs)}

    rows["static"] = {"max_len": max_len, **summarise([admit_static(lengths[s:] + lengths[:s], budget_tokens, max_len)
                                                      for s in starts])}
    for size in args.page_sizes:
        rows[f"paged-{size}"] = {"page_size": size, **summarise(
            [admit_paged(lengths[s:] + lengths[:s], budget_tokens, size) for s in starts])}
    return {"budget_bytes": args.budget_bytes, "kv_dtype": args.kv_dtype, "bytes_per_token": bytes_per_token,
            "budget_tokens": budget_tokens, "requests_in_trace": len(lengths),
            "mean_request_tokens": sum(lengths) / len(lengths), "max_request_tokens": max(lengths), "rows": rows}


# -- part 2 ------------------------------------------------------------------------------------
def pages_held(n: int, system: int, own: int, shared: bool, page_size: int = 16) -> int:
    """Pages `n` running requests on one system prompt hold, measured on the real cache."""
    from radixkv.mem import NoCache, PageAllocator, RadixCache

    total = n * (system + own) // page_size + 8
    pool = PageAllocator(total, page_size)
    cache = RadixCache(pool, "lru") if shared else NoCache(pool)
    prompt = list(range(1, system + 1))
    held = []
    for i in range(n):
        key = prompt + [system + 1 + i] * own  # one system prompt, then the request's own tokens
        match = cache.match_prefix(key)
        if match.last_node is not None:
            cache.lock(match.last_node)
        rest = math.ceil((len(key) - match.num_tokens) / page_size)
        pages = pool.alloc(rest)  # (the pool has room for every request unshared)
        held.append((match, pages))
        if shared and i == 0:  # the first request's prompt goes into the tree for the others
            cache.insert(prompt, pages[: system // page_size])
    return pool.used_pages


def part_sharing(args) -> dict:
    rows = []
    for n in args.concurrency:
        alone = pages_held(n, args.system_tokens, args.own_tokens, shared=False)
        shared = pages_held(n, args.system_tokens, args.own_tokens, shared=True)
        rows.append({"requests": n, "pages_unshared": alone, "pages_shared": shared, "saved": 1 - shared / alone})
    return {"system_tokens": args.system_tokens, "own_tokens": args.own_tokens, "page_size": 16, "rows": rows}


# -- part 3 ------------------------------------------------------------------------------------
def prompts(n: int, words: int) -> list[str]:
    """`n` prompts that share no prefix (each starts with its own number)."""
    out = []
    for i in range(n):
        body = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words))
        out.append(f"Request {i}: continue this list of words: {body}")
    return out


def part_formats(args, geometry) -> dict:
    from radixkv.engine import Engine

    rows = []
    texts = prompts(args.requests, args.prompt_words)
    for fmt in args.formats:
        per_token = geometry.size(fmt).bytes_per_token
        tokens = args.engine_budget_bytes // per_token
        with tempfile.TemporaryDirectory() as tmp:
            timeline = Path(tmp) / "timeline.jsonl"
            engine = Engine(kv_cache_dtype=fmt, max_total_tokens=tokens, max_running_requests=256, page_size=1,
                            progress=False, log_level="warning", timeline_file=str(timeline),
                            disable_radix_cache=True)
            try:
                engine.generate(texts[0], {"max_new_tokens": 2, "temperature": 0})  # warm-up
                start = time.perf_counter()
                outs = engine.generate(texts, {"max_new_tokens": args.new_tokens, "temperature": 0,
                                               "ignore_eos": True})
                seconds = time.perf_counter() - start
                stats = engine.get_stats()
            finally:
                engine.shutdown()
            steps = [json.loads(line) for line in timeline.read_text().splitlines()]
            running = max(len(s["rids"]) for s in steps if s.get("event") == "step")
        generated = sum(o["meta_info"]["completion_tokens"] for o in outs)
        rows.append({"format": fmt, "bytes_per_token": per_token, "pool_tokens": tokens,
                     "max_running_requests": running, "output_tokens_per_second": generated / seconds,
                     "seconds": seconds, "retractions": stats["retractions"]})
        print(f"  {fmt}: {running} at once, {generated / seconds:.1f} output tok/s", file=sys.stderr)
    return {"budget_bytes": args.engine_budget_bytes, "requests": args.requests, "new_tokens": args.new_tokens,
            "rows": rows}


# -- report ------------------------------------------------------------------------------------
def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def report_text(result: dict) -> str:
    a, s = result["allocation"], result["sharing"]
    out = [f"1. {a['requests_in_trace']:,} Mooncake requests (mean {a['mean_request_tokens']:,.0f} tokens, longest "
           f"{a['max_request_tokens']:,}); budget {a['budget_tokens']:,} tokens ({a['kv_dtype']})",
           table([["layout", "utilisation", "reserved, unused", "requests at once (mean)", "(min)"]] +
                 [[name, f"{r['utilisation']:.1%}", f"{r['fragmentation']:.2%}", f"{r['mean_concurrent_requests']:.1f}",
                   str(r["min_concurrent_requests"])] for name, r in a["rows"].items()]),
           f"2. one {s['system_tokens']}-token system prompt + {s['own_tokens']} own tokens per request",
           table([["requests", "pages unshared", "pages shared", "saved"]] +
                 [[str(r["requests"]), f"{r['pages_unshared']:,}", f"{r['pages_shared']:,}", f"{r['saved']:.1%}"]
                  for r in s["rows"]])]
    f = result.get("formats")
    if f:
        out += [f"3. KV formats in {f['budget_bytes'] / 2**20:.0f} MiB, {f['requests']} requests at once",
                table([["format", "bytes/token", "pool tokens", "running at once", "output tok/s"]] +
                      [[r["format"], f"{r['bytes_per_token']:,}", f"{r['pool_tokens']:,}", str(r["max_running_requests"]),
                        f"{r['output_tokens_per_second']:.1f}"] for r in f["rows"]])]
    return "\n".join(out)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = 3 if result.get("formats") else 2
    fig, axes = plt.subplots(1, parts, figsize=(4.2 * parts, 3.6))
    a = result["allocation"]["rows"]
    axes[0].bar(list(a), [r["mean_concurrent_requests"] for r in a.values()], color="#2f6fde")
    axes[0].set_title("requests one budget holds")
    axes[0].tick_params(axis="x", rotation=30, labelsize=8)
    s = result["sharing"]["rows"]
    axes[1].plot([r["requests"] for r in s], [100 * r["saved"] for r in s], "o-")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("requests on one system prompt")
    axes[1].set_ylabel("KV memory saved by sharing (%)")
    axes[1].set_title("shared-prefix savings")
    if parts == 3:
        f = result["formats"]["rows"]
        axes[2].bar([r["format"] for r in f], [r["max_running_requests"] for r in f], color="#5aa0f0")
        axes[2].set_title("running at once, one byte budget")
        axes[2].tick_params(axis="x", rotation=30, labelsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv import kv_size

    geometry = kv_size.read_kv_geometry(args.model)
    result = {**machine(), "model": geometry.source,
              "allocation": part_allocation(args, geometry.size(args.kv_dtype).bytes_per_token),
              "sharing": part_sharing(args)}
    if not args.skip_engine:
        result["formats"] = part_formats(args, geometry)
    print(report_text(result))
    save_json(args.json, result)
    plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
