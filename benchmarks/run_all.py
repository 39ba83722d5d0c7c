"""Regenerate every figure of the documentation's benchmark tables, then the tables themselves.

Runs each benchmark script in turn (one process each, nothing else on the machine), then reads
their JSON results and rewrites each generated table between its `<!-- NAME:begin -->` /
`<!-- NAME:end -->` markers in the page of docs/ that holds them: the summary table
(`performance`, in docs/benchmarks.md, also written to results/performance.md) and one table
per feature (SECTIONS). A peer that cannot run is left out by its script, which says why; its
cells read "not run".

    bash benchmarks/peers/setup.sh && python benchmarks/run_all.py     # about an hour
    python benchmarks/run_all.py --only-table                            # re-render from results/
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"  # the pages holding the generated tables (mkdocs' docs_dir)
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
SCRIPTS = [  # (script, arguments, what it measures)
    ("roofline.py", [], "speed against the machine's limits, vs transformers"),
    ("compile_forward.py", [], "compiled forward vs eager, cascade extend vs per request"),
    ("startup.py", [], "time to the first answer: eager, compiled first and second start"),
    ("customer_service.py", [], "shared 2k-token system prompt, vs vLLM and transformers"),
    ("multiturn.py", [], "multi-turn chat, closed and open loop, vs vLLM and transformers"),
    ("memory_pressure.py", [], "more conversations than the KV pool holds, equal budgets, vs vLLM"),
    ("frontend_fork.py", [], "fork-and-join program vs independent requests"),
    ("server_throughput.py", [], "server vs in-process Engine"),
    ("mooncake_e2e.py", [], "Mooncake trace end to end vs the simulator"),
    ("trace_hit_rate.py", [], "Mooncake trace through the cache simulator"),
    ("kv_quant.py", [], "KV-cache formats: capacity, quality, decode speed"),
    ("speculative.py", [], "speculative decoding off vs ngram, radix and draft proposers"),
    ("model_families.py", [], "MHA/GQA/MQA/MLA KV bytes and decode speed; Gemma 3 270M beside SmolLM2"),
    ("host_tier_replay.py", [], "Mooncake trace with a host tier"),
    ("storage_tier.py", [], "storage tier: disk bandwidth, warm restart, break-even, three-tier replay"),
    ("constrained.py", [], "constrained decoding: mask cost, jump-forward"),
    ("routing_replay.py", [], "routing policies over replicas on the Mooncake trace"),
    ("shared_store.py", [], "a Mooncake Store shared by replicas: two real replicas, the trace over N"),
    ("disaggregation.py", [], "prefill/decode disaggregation vs one server: decode ITL under long prompts"),
    ("lora.py", [], "LoRA: N adapters mixed in one batch vs one adapter vs merged weights"),
    ("thinking_reuse.py", [], "a thinking model's template dropping earlier reasoning: hit rate and prefill"),
    ("tensor_parallel.py", [], "tensor parallelism: greedy equality, all-reduce cost"),
    ("memory_efficiency.py", [], "paged vs static KV slots, shared-prefix savings, KV formats under one byte budget"),
    ("miss_causes_cost.py", [], "miss attribution per admission vs the prefix lookup"),
    ("plan", [], "capacity planner on the Mooncake trace (`radixkv plan`)"),
]
PLAN = ["-m", "radixkv", "plan", str(HERE / "data" / "mooncake_conversation_trace.jsonl"), "--target-hit-rate", "0.2",
        "0.3", "--no-progress", "--json", str(RESULTS / "plan.json"), "--plot", str(RESULTS / "plan.png")]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only-table", action="store_true", help="only re-render the table from results/")
    p.add_argument("--skip", default="", help="comma-separated scripts to leave out (e.g. trace_hit_rate.py)")
    return p.parse_args(argv)


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def when(d: dict | None) -> str:
    if not d:
        return "not run"
    return f"{d['date'][:10]}, {d.get('cpu') or 'CPU not recorded'}, {d['threads']} threads"


def f(x, fmt="{:.2f}", none="not run"):
    return none if x is None else fmt.format(x)


def speed(x: float | None) -> str:
    """A speed ratio (the other's time / ours) in words: faster above 1, slower below."""
    if x is None:
        return "not run"
    return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"


def table() -> str:
    roof, cs, mt = load("roofline.json"), load("customer_service.json"), load("multiturn.json")
    fork, srv, moon, sim = (load("frontend_fork.json"), load("server_throughput.json"), load("mooncake_e2e.json"),
                            load("trace_hit_rate.json"))
    rows = []  # workload, radixkv, peers, ratio, limit, command, when

    if roof:
        r = {row["workload"]: row for row in roof["rows"]}
        for key, label in (("cold prefill 2048", "Cold prefill, 2,048-token prompt (s)"),
                           ("warm TTFT 1958+90", "Warm TTFT, 1,958 cached + 90 new (s)")):
            if key in r:
                x = r[key]
                rows.append((label, f(x["radixkv_s"], "{:.3f}"), f"transformers {f(x.get('transformers_s'), '{:.3f}')}",
                             speed(x.get("radixkv_vs_transformers_speed")), f(x["limit_s"], "{:.3f}"),
                             "`python benchmarks/roofline.py`", when(roof)))
        for key, label in (("decode b=1 ctx=32", "Decode, batch 1 (tok/s)"), ("decode b=8 ctx=32", "Decode, batch 8 (tok/s)"),
                           ("decode b=32 ctx=2048", "Decode, batch 32 on one 2k-token prompt (tok/s)")):
            if key in r:
                x, b = r[key], int(key.split("b=")[1].split()[0])
                rows.append((label, f(b / x["radixkv_s"], "{:.1f}"),
                             f"transformers {f(b / x['transformers_s'], '{:.1f}') if x.get('transformers_s') else 'not run'}",
                             speed(x.get("radixkv_vs_transformers_speed")), f(b / x["limit_s"], "{:.1f}"),
                             "`python benchmarks/roofline.py`", when(roof)))
    if cs:
        res, limit = cs["results"], cs["limit"]
        vllm = {k: v for k, v in res.items() if k.startswith("vllm")}
        best = min(vllm, key=lambda k: vllm[k]["warm_ttft"]) if vllm else None
        ours = res.get("radixkv")
        if ours:
            share = limit["uncached_share_of_prefill_work"]
            peers = "; ".join([f"{best} {vllm[best]['warm_ttft']:.3f}"] if best else ["vLLM not run"]) + \
                f"; transformers {f(res.get('transformers', {}).get('warm_ttft'), '{:.3f}')} (no cache); " \
                f"radixkv without cache {f(res.get('radixkv-no-cache', {}).get('warm_ttft'), '{:.3f}')}"
            ratio = f"{ours['warm_ttft'] / vllm[best]['warm_ttft']:.2f}x vLLM's" if best else "-"
            rows.append(("Customer service: warm TTFT, 2k-token system prompt cached (s)", f"{ours['warm_ttft']:.3f}",
                         peers, ratio, f"{share * ours['cold_ttft']:.3f} ({share:.1%} of cold)",
                         "`python benchmarks/customer_service.py`", when(cs)))
            top = max(vllm, key=lambda k: vllm[k]["concurrent"]["output_tok_s"]) if vllm else None
            peers = "; ".join([f"{top} {vllm[top]['concurrent']['output_tok_s']:.1f}"] if top else ["vLLM not run"]) + \
                f"; transformers {f(res.get('transformers', {}).get('concurrent', {}).get('output_tok_s'), '{:.1f}')}"
            ratio = f"{ours['concurrent']['output_tok_s'] / vllm[top]['concurrent']['output_tok_s']:.2f}x vLLM's" if top else "-"
            rows.append(("Customer service: 16 concurrent requests (output tok/s)",
                         f"{ours['concurrent']['output_tok_s']:.1f} (TTFT p50 {ours['concurrent']['ttft_p50']:.2f} s)",
                         peers, ratio, "-", "`python benchmarks/customer_service.py`", when(cs)))
    if mt:
        closed, opened = mt["closed_loop"], mt["open_loop"]
        ours = closed.get("radixkv-lpm")
        vllm = {k: v for k, v in closed.items() if k.startswith("vllm")}
        best = min(vllm, key=lambda k: vllm[k]["seconds"]) if vllm else None
        limit = None
        if roof:
            limit = next((row["limit_s"] for row in roof["rows"] if row["workload"].startswith("multi-turn")), None)
        if ours:
            peers = "; ".join([f"{best} {vllm[best]['seconds']:.1f}"] if best else ["vLLM not run"]) + \
                f"; transformers batched per turn {f(closed.get('transformers', {}).get('seconds'), '{:.1f}')}"
            ratio = f"{ours['seconds'] / vllm[best]['seconds']:.2f}x vLLM's" if best else "-"
            rows.append(("Multi-turn chat, 8 users x 4 turns, closed loop (wall s)",
                         f"{ours['seconds']:.1f} (hit {ours['hit_rate']:.0%})", peers, ratio, f(limit, "{:.1f}", "-"),
                         "`python benchmarks/multiturn.py`", when(mt)))
        o = opened.get("radixkv-lpm")
        if o:
            vo = {k: v for k, v in opened.items() if k.startswith("vllm")}
            bo = min(vo, key=lambda k: vo[k]["ttft_p50"]) if vo else None
            peers = f"{bo} {vo[bo]['ttft_p50']:.2f} / {vo[bo]['ttft_p90']:.2f}" if bo else "vLLM not run"
            rows.append(("Multi-turn chat, open loop, Poisson arrivals (TTFT p50 / p90 s)",
                         f"{o['ttft_p50']:.2f} / {o['ttft_p90']:.2f} (hit {o['hit_rate']:.0%})", peers,
                         f"{o['ttft_p50'] / vo[bo]['ttft_p50']:.2f}x vLLM's p50" if bo else "-", "-",
                         "`python benchmarks/multiturn.py`", when(mt)))
    mp, st = load("memory_pressure.json"), load("storage_tier.json")
    if mp and "radixkv (defaults)" in mp["results"]:
        ours = mp["results"]["radixkv (defaults)"]
        vllm = next((k for k in mp["results"] if k.startswith("vllm")), None)
        theirs = mp["results"].get(vllm)
        a = mp["args"]
        rows.append((f"Memory pressure: {a['users']} conversations x {a['turns']} turns in {a['budget']:,} KV tokens "
                     "(output tok/s)", f"{ours['output_tok_s']:.1f} (hit {ours['hit_rate']:.1%}, TTFT p50 "
                     f"{ours['ttft_p50']:.2f} s)",
                     f"vllm-b32 {theirs['output_tok_s']:.1f} (hit {theirs['hit_rate']:.1%}, TTFT p50 "
                     f"{theirs['ttft_p50']:.2f} s)" if theirs else "vLLM not run",
                     f"{ours['output_tok_s'] / theirs['output_tok_s']:.2f}x vLLM's" if theirs else "-", "-",
                     "`python benchmarks/memory_pressure.py`", when(mp)))
    if st and isinstance(st["warm_restart"].get("restart_over_cold"), dict):
        w = st["warm_restart"]
        got = statistics.median(w["storage_hit_tokens"]["{}"])
        rows.append((f"Warm restart from --kv-storage-dir, {w['prompt_tokens']:,}-token prompt, defaults (TTFT s)",
                     f"{w['median']['restart {}']:.3f} ({got:,.0f} tokens from storage)",
                     f"cold {w['median']['cold']:.3f}; host-tier hit {w['median']['host']:.3f}",
                     f"{w['restart_over_cold']['{}']:.2f}x cold", "-", "`python benchmarks/storage_tier.py`", when(st)))
    shared = (load("shared_store.json") or {}).get("replicas")
    if shared:
        rows.append((f"Shared Mooncake store: replica B's first request for the {shared['prompt_tokens']:,}-token prompt "
                     "replica A served (TTFT s)", f"{shared['store_ttft_s']:.3f} ({shared['store_fraction']:.0%} from the "
                     "store)", f"cold on B {shared['cold_ttft_s']:.3f}", f"{shared['ratio']:.2f}x cold", "-",
                     "`python benchmarks/shared_store.py`", when(load("shared_store.json"))))
    pd = load("disaggregation.json")
    pd_rows = {r["setup"]: r for r in (pd or {}).get("results", [])}
    if "pd" in pd_rows and "colocated" in pd_rows:
        a, b, w = pd_rows["pd"], pd_rows["colocated"], pd["workload"]
        rows.append((f"Prefill/decode disaggregation: decode ITL p99 while {w['long_tokens']:,}-token prompts arrive (ms)",
                     f"{a['itl_p99_ms']:.0f} (pd, one core each)", f"one server {b['itl_p99_ms']:.0f}",
                     f"{a['itl_p99_ms'] / b['itl_p99_ms']:.2f}x one server (TTFT {a['ttft_p50_s'] / b['ttft_p50_s']:.2f}x)",
                     "-", "`python benchmarks/disaggregation.py`", when(pd)))
    comp, start = load("compile_forward.json"), load("startup.json")
    if comp:
        for kind, label in (("decode", "decode steps"), ("extend", "extends")):
            sel = [r for r in comp["rows"] if r["case"] == kind]
            if sel:
                lo, hi = min(r["speedup"] for r in sel), max(r["speedup"] for r in sel)
                rows.append((f"Compiled forward vs eager, {label} ({len(sel)} shapes)", f"{lo:.2f}-{hi:.2f}x faster",
                             "eager, same runner", "-", "-", "`python benchmarks/compile_forward.py`", when(comp)))
        sh = comp.get("shared_prefix_extend")
        if sh:
            rows.append((f"Cascade extend: {sh['requests']} x {sh['new']} new tokens on one {sh['shared_cached']:,}-token "
                         "cached prefix (s per forward)", f"{sh['cascade_s']:.2f}", f"per request {sh['per_request_s']:.2f}",
                         f"{sh['speedup']:.2f}x faster", "-", "`python benchmarks/compile_forward.py`", when(comp)))
    if start:
        r = {row["start"]: row for row in start["rows"]}
        eager = next((v for k, v in r.items() if k.startswith("eager")), None)
        first = next((v for k, v in r.items() if "first" in k), None)
        second = next((v for k, v in r.items() if "second" in k), None)
        if eager and first and second:
            vllm = r.get("vllm-b32")
            peers = f"eager {eager['first_answer_s']:.1f}; " + (f"vllm-b32 {vllm['first_answer_s']:.1f}" if vllm
                                                                  else "vLLM not run")
            rows.append(("Start-up to the first answer: compiled first start / second start (s)",
                         f"{first['first_answer_s']:.1f} / {second['first_answer_s']:.1f}", peers,
                         f"{vllm['first_answer_s'] / second['first_answer_s']:.1f}x sooner than vLLM" if vllm else "-",
                         "-", "`python benchmarks/startup.py`", when(start)))
    if fork:
        m = fork["median_seconds"]
        rows.append(("Fork program: 1k-token trunk, 4 branches, join (s)", f"{m['dsl']:.2f} (hit {fork['dsl_hit_rate']:.0%})",
                     f"independent requests, cache off {m['independent, cache off']:.2f}; cache on "
                     f"{m['independent, cache on']:.2f}", f"{fork['speedup_vs_independent_cache_off']:.2f}x faster than "
                     "cache off", "-", "`python benchmarks/frontend_fork.py`", when(fork)))
    if srv:
        rows.append(("Server vs in-process Engine: multi-turn throughput; added latency per request",
                     f"{srv['server_vs_engine_throughput']:.2f}x; {srv['added_latency_median_ms']:.1f} ms",
                     "in-process Engine", "-", "-", "`python benchmarks/server_throughput.py`", when(srv)))
    if moon:
        rows.append(("Mooncake trace end to end: hit rate, server vs simulator",
                     f"{moon['server']['hit_rate']:.1%} (TTFT p50 {moon['server']['ttft_p50']:.2f} s)",
                     f"simulator {moon['predicted_hit_rate']:.1%}", f"{moon['gap_points']:+.2f} points", "-",
                     "`python benchmarks/mooncake_e2e.py`", when(moon)))
    if sim:
        lru = [r for r in sim.get("runs", []) if r.get("policy") == "lru" and abs(r.get("capacity_tokens", 0) - 5_120_000) < 512]
        if lru:
            rows.append(("Mooncake trace, cache simulator: LRU hit rate at 10,000 pages of 512", f"{lru[0]['hit_rate']:.1%}",
                         "reference 21.5 %", "-", "37.4 % (unlimited)", "`python benchmarks/trace_hit_rate.py`", when(sim)))
    head = ("| workload | radixkv | peers | ratio | machine limit | command | measured |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "".join("| " + " | ".join(row) + " |\n" for row in rows)


def kv_quant_table() -> str | None:
    d = load("kv_quant.json")
    if not d:
        return None
    out = ("| kv_cache_dtype | bytes/token | tokens in 1 GiB | capacity | greedy | mean KL | perplexity | "
           "change | decode tok/s |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in d["rows"]:
        out += (f"| {r['format']} | {r['bytes_per_token']:,} | {r['tokens_in_budget']:,} | {r['capacity_x']:.2f}x | "
                f"{r['greedy_agreement']:.0%} | {r['mean_kl']:.1e} | {r['perplexity']:.3f} | "
                f"{r['perplexity_change_pct']:+.2f}% | {r['decode_tok_s']:.1f} ({r['decode_speed_x']:.2f}x) |\n")
    return out + f"\n`python benchmarks/kv_quant.py`, {when(d)}.\n"


def host_tier_table() -> str | None:
    d = load("host_tier_replay.json")
    if not d:
        return None
    out = ("| device capacity | host tier | hit rate | device hits | host hits | reuse-oracle (device only) | "
           "host hits: bytes to copy | copy time | recompute time |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in d["rows"]:
        p = r["prompt_tokens"]
        out += (f"| {r['capacity_tokens'] / 1e6:.2f} M | {r['host_multiplier']:g}x | {r['hit_rate']:.1%} | "
                f"{r['device_hit_tokens'] / p:.1%} | {r['host_hit_tokens'] / p:.1%} | {r['reuse_oracle_hit_rate']:.1%} | "
                f"{r['host_copy_bytes'] / 1e9:,.0f} GB | {r['host_copy_seconds']:,.0f} s | {r['recompute_seconds']:,.0f} s |\n")
    a = d["args"]
    return out + (f"\nCosts for the default model's KV ({d['costs']['bytes_per_token']:,} bytes per token) at "
                  f"{a['link_gbs']} GB/s and {a['tflops']} TFLOP/s. `python benchmarks/host_tier_replay.py`, "
                  f"{when(d)}.\n")


def storage_tier_table() -> str | None:
    d = load("storage_tier.json")
    if not d:
        return None
    disk, w, even = d["disk"], d["warm_restart"], d["break_even"]
    m, n = w["median"], w["prompt_tokens"]
    out = (f"| time to first token, {n:,}-token prompt | ms | vs cold | from storage |\n|---|---|---|---|\n"
           f"| cold: a new process, no storage tier | {m['cold'] * 1e3:,.0f} | 1.00x | |\n")
    for flags, ratio in w["restart_over_cold"].items():
        named = "defaults" if flags == "{}" else ", ".join(f"`--{k.replace('_', '-')} {v}`"
                                                          for k, v in json.loads(flags).items())
        got = statistics.median(w["storage_hit_tokens"][flags])
        gbs = [g for g in w["load_gbs"][flags] if g]
        out += (f"| restart ({named}): a new process on the directory the last one filled (cold page cache; "
                f"reads {statistics.median(gbs) if gbs else 0:.2f} GB/s) | {m[f'restart {flags}'] * 1e3:,.0f} | "
                f"{ratio:.2f}x | {got:,.0f} of {n:,} tokens |\n")
    out += (f"| host-tier hit: the prompt again after another pushed it to the host tier | {m['host'] * 1e3:,.0f} | "
            f"{w['host_over_cold']:.2f}x | |\n"
            f"| warm: the same prompt again in one process (device hit) | {m['warm'] * 1e3:,.0f} | "
            f"{w['warm_over_cold']:.2f}x | |\n\n"
           "| prompt tokens | recompute (TTFT) | read from disk (TTFT) | disk / recompute |\n|---|---|---|---|\n")
    for r in even["rows"]:
        out += (f"| {r['tokens']:,} | {r['recompute_ttft'] * 1e3:,.0f} ms | {r['storage_ttft'] * 1e3:,.0f} ms | "
                f"{r['storage_ttft'] / r['recompute_ttft']:.2f}x |\n")
    if d["replay"]:
        out += ("\n| device | host tier | storage tier | hit rate | device hits | host hits | storage hits | "
                "storage hits: read time | recompute time |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in d["replay"]:
            p = r["prompt_tokens"]
            out += (f"| {r['capacity_tokens'] / 1e6:.2f} M | {r['host_multiplier']:g}x | {r['storage_multiplier']:g}x | "
                    f"{r['hit_rate']:.1%} | {r['device_hit_tokens'] / p:.1%} | {r['host_hit_tokens'] / p:.1%} | "
                    f"{r['storage_hit_tokens'] / p:.1%} | {r['storage_read_seconds']:,.0f} s | "
                    f"{r['storage_recompute_seconds']:,.0f} s |\n")
    return out + (f"\nDisk: write {disk['write_gbs']:.2f} GB/s (fsync'd), read {disk['read_cold_gbs']:.2f} GB/s cold, "
                  f"{disk['read_warm_gbs']:.2f} GB/s from the page cache. Medians of {len(w['ttft_seconds']['cold'])} "
                  f"processes per case. `python benchmarks/storage_tier.py`, {when(d)}.\n")


def constrained_table() -> str | None:
    d = load("constrained.json")
    if not d:
        return None
    out = "| measurement | unconstrained | constrained | change |\n|---|---|---|---|\n"
    for name, r in d["mask_cost"].items():
        out += (f"| decode step, {name}, JSON schema (masks: {r['mask_share_pct']:.2f}% of the step) | "
                f"{r['unconstrained_step_ms']:.1f} ms | {r['json_schema_step_ms']:.1f} ms | {r['slowdown_pct']:+.1f}% |\n")
    j = d["jump_forward"]
    out += (f"| {j['batch']} requests, schema with long fixed keys: wall time | {j['off']['wall']:.2f} s token by token | "
            f"{j['on']['wall']:.2f} s with jump-forward | {j['wall_ratio']:.2f}x faster |\n"
            f"| same: forward steps ({j['on']['forced']:.0f} tokens forced) | {j['off']['steps']:.0f} | "
            f"{j['on']['steps']:.0f} | {j['steps_ratio']:.2f}x fewer |\n")
    return out + f"\n`python benchmarks/constrained.py`, {when(d)}.\n"


def tensor_parallel_table() -> str | None:
    d = load("tensor_parallel.json")
    if not d:
        return None
    out = ("| phase | tp 1 | tp 2 | tp 2 / tp 1 | all-reduces per forward | ms in them per forward | "
           "collectives' share of the forward |\n|---|---|---|---|---|---|---|\n")
    for kind, r in d["phases"].items():
        out += (f"| {kind} | {r['tp1_wall_s']:.2f} s | {r['tp2_wall_s']:.2f} s | {r['tp2_over_tp1']:.2f}x | "
                f"{r['all_reduces_per_forward']:.0f} | {r['all_reduce_ms_per_forward']:.2f} | "
                f"{100 * r['comm_share_of_wall']:.0f}% |\n")
    raw = ", ".join(f"{ms:.3f} ms at {t} rows" for t, ms in d["raw_all_reduce_ms"].items())
    same = "identical" if d["identical_greedy_tokens"] else "DIFFERENT"
    a = d["args"]
    return out + (f"\nGreedy tokens of tp 2 vs tp 1 (fp32): {same}. A raw all-reduce of (rows, 1024) fp32 between "
                  f"two otherwise idle processes: {raw}. Prefill: 4 prompts of {a['prefill_tokens']} tokens; decode: "
                  f"8 requests x {a['decode_tokens']} tokens; a random-initialised {a['layers']}-layer Llama shape "
                  f"(hidden 1024, 16 heads, 4 KV heads). `python benchmarks/tensor_parallel.py`, {when(d)}.\n")


def plan_table() -> str | None:
    d = load("plan.json")
    if not d:
        return None
    dtypes = list(d["bytes_per_token"])
    knee = d["knee"]["capacity_tokens"] if d["knee"] else None
    out = ("| capacity (tokens) | " + " | ".join(f"{t} memory" for t in dtypes) + " | hit rate | prefill saved |\n"
           + "|---" * (len(dtypes) + 3) + "|\n")
    for p in d["curve"]:
        mark = " (knee)" if p["capacity_tokens"] == knee else ""
        out += (f"| {p['capacity_tokens']:,}{mark} | " + " | ".join(f"{p['memory_bytes'][t] / 2**30:,.1f} GiB" for t in dtypes)
                + f" | {p['hit_rate']:.1%} | {p['prefill_saved']:.1%} |\n")
    ws = d["working_set"]
    out += (f"\nWorking set: {ws['capacity_tokens']:,} tokens, hit rate {ws['hit_rate']:.1%} at most. ")
    for t in d["targets"]:
        if t["capacity_tokens"] is None:
            out += f"A {t['hit_rate']:.0%} hit rate is out of reach. "
        else:
            mem = ", ".join(f"{t['memory_bytes'][x] / 2**30:,.1f} GiB in {x}" for x in dtypes)
            out += f"A {t['hit_rate']:.0%} hit rate needs {t['capacity_tokens']:,} tokens ({mem}). "
    return out + f"`radixkv plan mooncake --target-hit-rate 0.2 0.3`.\n"


def memory_table() -> str | None:
    d = load("memory_efficiency.json")
    if not d:
        return None
    a, s = d["allocation"], d["sharing"]
    out = ("| layout | utilisation (stored / reserved) | reserved, unused | requests at once (mean, min) |\n"
           "|---|---|---|---|\n")
    for name, r in a["rows"].items():
        label = f"static, {r['max_len']:,} tokens a slot" if name == "static" else f"paged, page {r['page_size']}"
        out += (f"| {label} | {r['utilisation']:.1%} | {r['fragmentation']:.2%} | "
                f"{r['mean_concurrent_requests']:.1f}, {r['min_concurrent_requests']} |\n")
    out += (f"\nShared prefix: one {s['system_tokens']:,}-token system prompt, {s['own_tokens']} tokens of each "
            f"request's own, page {s['page_size']}:\n\n| requests at once | pages without sharing | with the radix cache "
            "| saved |\n|---|---|---|---|\n")
    for r in s["rows"]:
        out += f"| {r['requests']} | {r['pages_unshared']:,} | {r['pages_shared']:,} | {r['saved']:.1%} |\n"
    f = d.get("formats")
    if f:
        out += (f"\nKV formats in {f['budget_bytes'] / 2**20:.0f} MiB, {f['requests']} requests at once, "
                f"{f['new_tokens']} tokens each:\n\n| format | bytes / token | pool tokens | running at once | "
                "output tokens/s |\n|---|---|---|---|---|\n")
        for r in f["rows"]:
            out += (f"| {r['format']} | {r['bytes_per_token']:,} | {r['pool_tokens']:,} | {r['max_running_requests']} | "
                    f"{r['output_tokens_per_second']:.1f} |\n")
    return out + f"\n`python benchmarks/memory_efficiency.py`, {when(d)}.\n"


def shared_store_table() -> str | None:
    d = load("shared_store.json")
    if not d:
        return None
    import shared_store  # (beside this script: it renders its own table)

    return shared_store.table(d, when(d))


def disaggregation_table() -> str | None:
    d = load("disaggregation.json")
    if not d:
        return None
    import disaggregation  # (beside this script: it renders its own table)

    return disaggregation.table(d, when(d))


def lora_table() -> str | None:
    d = load("lora.json")
    if not d:
        return None
    import lora  # (beside this script: it renders its own table)

    return lora.table(d, when(d))


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def pages_with(name: str) -> list[Path]:
    """The pages under DOCS holding both of `name`'s markers."""
    begin, end = markers(name)
    return [page for page in sorted(DOCS.rglob("*.md")) if begin in (t := page.read_text()) and end in t]


def rewrite_section(name: str, text: str | None) -> None:
    """Replace what is between `<!-- name:begin -->` and `<!-- name:end -->` in the docs page(s)
    holding those markers."""
    if text is None:
        return
    begin, end = markers(name)
    pages = pages_with(name)
    if not pages:
        print(f"no page under {DOCS} has {begin} ... {end} markers: {name} table not written")
    for page in pages:
        head, rest = page.read_text().split(begin, 1)
        _, tail = rest.split(end, 1)
        page.write_text(f"{head}{begin}\n{text}{end}{tail}")
        print(f"{page.name}: {name} table rewritten")


def rewrite_performance(text: str) -> None:
    rewrite_section("performance", text)


# every generated table besides `performance`: its marker name and what renders it from results/
SECTIONS = {
    "kv-quant": kv_quant_table,
    "host-tier": host_tier_table,
    "storage-tier": storage_tier_table,
    "shared-store": shared_store_table,
    "disaggregation": disaggregation_table,
    "lora": lora_table,
    "constrained": constrained_table,
    "tensor-parallel": tensor_parallel_table,
    "plan": plan_table,
    "memory-efficiency": memory_table,
}


def main(argv=None) -> int:
    args = parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if not args.only_table:
        for script, extra, what in SCRIPTS:
            if script in skip:
                continue
            print(f"\n=== {script}: {what}", flush=True)
            start = time.perf_counter()
            argv = PLAN if script == "plan" else [str(HERE / script)]
            code = subprocess.run([sys.executable, *argv, *extra], cwd=HERE).returncode
            print(f"=== {script}: exit {code} after {time.perf_counter() - start:.0f} s", flush=True)
    text = table()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "performance.md").write_text(text)
    print(text)
    rewrite_performance(text)
    for name, render in SECTIONS.items():
        rewrite_section(name, render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
