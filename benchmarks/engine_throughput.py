"""End-to-end speed of the Engine on a multi-turn chat workload, and its per-step overhead.

Part 1 (chat): conversations from the synthetic chat-trace generator run in turn rounds; each
turn's prompt is the previous prompt + the model's own answer + the next user turn (closed
loop), so a prefix cache can reuse the whole conversation so far. The same prompts run through
the Engine with the radix cache on, with it off, and through transformers `generate` (batched,
left-padded), in one run: throughput, time to first token and cache hit rate.

Part 2 (overhead): mean decode step time of the Engine (scheduling + batch building + forward +
sampling) vs the model forward inside those same steps (the scheduler times the two around
`ModelRunner.forward`), and, for reference, a bare forward on a prebuilt decode batch of the
same size timed separately.

    python benchmarks/engine_throughput.py                  # SmolLM2, CPU defaults
    python benchmarks/engine_throughput.py --conversations 16 --turns 4 --batch-sizes 1,8,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from _report import RESULTS, machine, save_json

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or .gguf (default: embedded SmolLM2)")
    p.add_argument("--conversations", type=int, default=12, help="conversations (default 12)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    p.add_argument("--system-tokens", type=int, default=256, help="shared system prompt tokens (default 256)")
    p.add_argument("--groups", type=int, default=2, help="distinct system prompts (default 2)")
    p.add_argument("--new-tokens", type=int, default=24, help="tokens generated per turn (default 24)")
    p.add_argument("--batch-sizes", default="1,8,32", help="decode batch sizes for the overhead part")
    p.add_argument("--skip-hf", action="store_true", help="leave transformers out of part 1")
    p.add_argument("--json", type=Path, default=RESULTS / "engine_throughput.json",
                   help="where to save results (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    except ValueError:
        p.error(f"--batch-sizes: expected comma-separated integers, got {args.batch_sizes!r}")
    if min([args.conversations, args.turns, args.new_tokens, *args.batch_sizes]) < 1:
        p.error("--conversations, --turns, --new-tokens and --batch-sizes must be >= 1")
    return args


def chat_rounds(args, vocab_high: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per conversation: its first prompt and the user turns that follow (token ids)."""
    from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace

    cfg = ChatTraceConfig(num_requests=args.conversations * args.turns, num_conversations=args.conversations,
                          num_groups=args.groups, system_tokens=args.system_tokens, user_tokens=(16, 48),
                          answer_tokens=(args.new_tokens, args.new_tokens), max_turns=args.turns,
                          zipf_alpha=0.0, vocab_high=vocab_high, seed=0)
    records = generate_chat_trace(cfg)
    by_conv: dict[int, list[dict]] = {}
    for rec in records:
        by_conv.setdefault(rec["session_id"], []).append(rec)
    firsts, users = [], []
    for conv in sorted(by_conv):
        turns = by_conv[conv]
        firsts.append(turns[0]["input_ids"])
        deltas = []
        for prev, cur in zip(turns, turns[1:]):
            deltas.append(cur["input_ids"][prev["input_length"] + prev["output_length"]:])
        users.append(deltas)
    return firsts, users


def run_engine_chat(engine, firsts, users, new_tokens, bar) -> tuple[dict, list[list[list[int]]]]:
    """Closed loop: returns metrics and the prompts of every round (for the other runs)."""
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    prompts = [list(p) for p in firsts]
    rounds, ttfts, out_tokens, prompt_tokens = [], [], 0, 0
    start = time.perf_counter()
    for turn in range(1 + max(len(u) for u in users)):
        live = [i for i in range(len(prompts)) if turn == 0 or turn - 1 < len(users[i])]
        batch = [prompts[i] for i in live]
        rounds.append(batch)
        outs = engine.generate(input_ids=batch, sampling_params=params)
        for i, out in zip(live, outs):
            ttfts.append(out["meta_info"]["ttft"])
            out_tokens += len(out["output_ids"])
            prompt_tokens += out["meta_info"]["prompt_tokens"]
            if turn < len(users[i]):
                prompts[i] = prompts[i] + out["output_ids"] + users[i][turn]
        bar.update(1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "output_tok_s": out_tokens / seconds, "total_tok_s": (out_tokens + prompt_tokens) / seconds,
            "mean_ttft_s": statistics.mean(ttfts), "p90_ttft_s": sorted(ttfts)[int(0.9 * (len(ttfts) - 1))],
            "cache_hit_rate": engine.get_stats()["cache_hit_rate"]}, rounds


def run_engine_rounds(engine, rounds, new_tokens, bar) -> dict:
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    ttfts, out_tokens, prompt_tokens = [], 0, 0
    start = time.perf_counter()
    for batch in rounds:
        for out in engine.generate(input_ids=batch, sampling_params=params):
            ttfts.append(out["meta_info"]["ttft"])
            out_tokens += len(out["output_ids"])
            prompt_tokens += out["meta_info"]["prompt_tokens"]
        bar.update(1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "output_tok_s": out_tokens / seconds, "total_tok_s": (out_tokens + prompt_tokens) / seconds,
            "mean_ttft_s": statistics.mean(ttfts), "p90_ttft_s": sorted(ttfts)[int(0.9 * (len(ttfts) - 1))],
            "cache_hit_rate": engine.get_stats()["cache_hit_rate"]}


def run_hf_rounds(model_dir, dtype, rounds, new_tokens, bar) -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    out_tokens = prompt_tokens = 0
    start = time.perf_counter()
    for batch in rounds:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        out_tokens += new_tokens * len(batch)
        prompt_tokens += sum(len(p) for p in batch)
        bar.update(1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "output_tok_s": out_tokens / seconds, "total_tok_s": (out_tokens + prompt_tokens) / seconds,
            "mean_ttft_s": None, "p90_ttft_s": None, "cache_hit_rate": 0.0}


def decode_overhead(engine, batch_size: int, prompt_len: int = 32, new_tokens: int = 24) -> dict:
    """Mean engine decode step vs bare forward on a prebuilt decode batch of the same size."""
    from radixkv.attention import ForwardMode

    prompts = [[100 + (7 * b + i) % 900 for i in range(prompt_len)] for b in range(batch_size)]
    engine.flush_cache()
    before = dict(engine.get_stats())
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": new_tokens, "temperature": 0,
                                                         "ignore_eos": True})
    after = engine.get_stats()
    steps = after["decode_steps"] - before["decode_steps"]
    step_s = (after["step_seconds"]["decode"] - before["step_seconds"]["decode"]) / steps
    # the forward inside those same steps, timed by the scheduler around runner.forward
    inner_s = (after["forward_seconds"]["decode"] - before["forward_seconds"]["decode"]) / steps
    runner = engine.runner
    length = prompt_len + new_tokens // 2  # a mid-generation sequence length
    rows = [runner.memory.req_table.alloc() for _ in range(batch_size)]
    seqs = [runner.memory.new_sequence() for _ in range(batch_size)]
    try:
        for row, seq in zip(rows, seqs):
            runner.memory.req_table.write(row, 0, seq.extend(length))
        fb = runner.build_batch(ForwardMode.DECODE, [[5]] * batch_size, rows, [length - 1] * batch_size,
                                [seq.slots(length - 1, length)[0] for seq in seqs])
        runner.forward(fb)
        times = []
        for _ in range(max(5, steps // 2)):
            t = time.perf_counter()
            runner.forward(fb)
            times.append(time.perf_counter() - t)
    finally:
        for row, seq in zip(rows, seqs):
            seq.release()
            runner.memory.req_table.free(row)
    bare = statistics.median(times)
    return {"batch_size": batch_size, "engine_step_ms": 1000 * step_s, "forward_in_step_ms": 1000 * inner_s,
            "overhead_ratio": step_s / inner_s, "bare_forward_ms": 1000 * bare,
            "ratio_vs_separate_bare_forward": step_s / bare}


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.engine import Engine

    opts = dict(model=args.model, max_running_requests=max(64, *args.batch_sizes), log_level="warning")
    report = {**machine(), "args": {k: str(v) for k, v in vars(args).items()}}
    on = Engine(**opts)
    firsts, users = chat_rounds(args, min(32000, on.runner.model_config.vocab_size))
    n_rounds = args.turns
    with tqdm(total=n_rounds * (3 - args.skip_hf), desc="chat workload", unit="round") as bar:
        report["radix_on"], rounds = run_engine_chat(on, firsts, users, args.new_tokens, bar)
        model_dir, dtype = on.runner.model_dir, on.runner.dtype
        on.shutdown()
        off = Engine(disable_radix_cache=True, **opts)
        report["radix_off"] = run_engine_rounds(off, rounds, args.new_tokens, bar)
        off.shutdown()
        if not args.skip_hf:
            report["transformers"] = run_hf_rounds(model_dir, dtype, rounds, args.new_tokens, bar)
    print(f"\nchat workload: {args.conversations} conversations x {args.turns} turns, "
          f"{args.new_tokens} new tokens per turn")
    print(f"{'engine':<14} {'seconds':>8} {'out tok/s':>10} {'total tok/s':>12} {'mean TTFT':>10} {'hit rate':>9}")
    for name in ("radix_on", "radix_off", "transformers"):
        if name in report:
            r = report[name]
            ttft = f"{r['mean_ttft_s']:.3f}s" if r["mean_ttft_s"] is not None else "n/a"
            print(f"{name:<14} {r['seconds']:>8.1f} {r['output_tok_s']:>10.1f} {r['total_tok_s']:>12.1f} "
                  f"{ttft:>10} {r['cache_hit_rate']:>8.1%}")
    base = report["radix_on"]["seconds"]
    report["speedup_vs_radix_off"] = report["radix_off"]["seconds"] / base
    print(f"radix cache on vs off: {report['speedup_vs_radix_off']:.2f}x faster")
    if "transformers" in report:
        report["speedup_vs_transformers"] = report["transformers"]["seconds"] / base
        print(f"radix cache on vs transformers: {report['speedup_vs_transformers']:.2f}x faster")

    engine = Engine(**opts)
    report["decode_overhead"] = []
    print(f"\n{'batch':>5} {'engine step':>12} {'its forward':>12} {'ratio':>6} {'separate bare fwd':>18}")
    for b in args.batch_sizes:
        row = decode_overhead(engine, b)
        report["decode_overhead"].append(row)
        print(f"{b:>5} {row['engine_step_ms']:>10.1f}ms {row['forward_in_step_ms']:>10.1f}ms "
              f"{row['overhead_ratio']:>6.2f} {row['bare_forward_ms']:>16.1f}ms")
    engine.shutdown()
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
