"""KV-cache quantisation: what each `kv_cache_dtype` saves and what it costs, on the default model.

For every format, in one run, on the same weights (the model is loaded once; each format gets
its own KV pool):
- tokens that fit one byte budget (`--budget`, default 1 GiB), and bytes per token;
- greedy agreement with full precision: `--prompts` chat prompts, 128 generated tokens each;
  the share of tokens generated before the first one that differs (1.0: identical output);
- mean KL divergence KL(full || quantised) of the next-token distributions along the
  full-precision continuations (teacher-forced, so one early difference does not snowball);
- perplexity of `benchmarks/data/prose.txt` (about 2,900 tokens of prose written for the
  project), every token attending to the K/V as the pool stores them, and its change from full
  precision (the "quality cost" quoted for KV quantisation: int8 about 0.3 %, int4 about 1.5 %);
- decode tokens/s of the greedy run (batch of all prompts; the dequantising gather is on the
  CPU's critical path, so quantised formats trade speed for memory here).

    python benchmarks/kv_quant.py
    python benchmarks/kv_quant.py --formats auto,int8,int4 --new-tokens 32
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from _report import RESULTS, machine, save_figure, save_json

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"
PROMPTS = ["Explain how a lighthouse lens concentrates light, step by step.",
           "Write a short story about a keeper who stays on the rock through a winter storm.",
           "List five practical tips for someone learning to cook rice well.",
           "What are the main differences between a comet and an asteroid?",
           "Describe a walk through a city market early on a Saturday morning.",
           "Give three arguments for and against homework in primary school."]


def parse_args(argv):
    from radixkv.mem.kv_quant import KV_CACHE_DTYPES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default=",".join(KV_CACHE_DTYPES),
                   help="comma-separated kv_cache_dtype values (default: all)")
    p.add_argument("--prompts", type=int, default=4, help=f"chat prompts, 1-{len(PROMPTS)} (default 4)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    p.add_argument("--text-tokens", type=int, default=4096, help="perplexity text, at most this many tokens")
    p.add_argument("--budget", default="1GiB", help="byte budget for the tokens-that-fit column (default 1GiB)")
    p.add_argument("--json", type=Path, default=RESULTS / "kv_quant.json", help="results file")
    args = p.parse_args(argv)
    args.formats = [f for f in args.formats.split(",") if f]
    bad = [f for f in args.formats if f not in KV_CACHE_DTYPES]
    if bad or not args.formats:
        p.error(f"--formats: unknown {bad}; choose from {list(KV_CACHE_DTYPES)}")
    if not 1 <= args.prompts <= len(PROMPTS) or args.new_tokens < 1 or args.text_tokens < 16:
        p.error(f"--prompts in 1..{len(PROMPTS)}, --new-tokens >= 1, --text-tokens >= 16")
    from radixkv.mem.host_tier import parse_host_size

    try:
        kind, args.budget_bytes = parse_host_size(args.budget)
    except Exception as e:  # noqa: BLE001 - reported as a flag error
        p.error(f"--budget: {e}")
    if kind != "bytes":
        p.error("--budget: give a size with a unit, e.g. 1GiB")
    return args


class Harness:
    """One loaded model; a fresh KV pool (page size 1) per format."""

    def __init__(self):
        from radixkv.config import EngineConfig
        from radixkv.model.runner import ModelRunner

        self.config = EngineConfig.from_kwargs(max_total_tokens=64, log_level="warning")
        self.base = ModelRunner.load(self.config, progress=False)
        from radixkv.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(self.base.model_dir)

    def runner(self, fmt: str, tokens: int):
        from radixkv.mem import KVLayout
        from radixkv.mem.kv_memory import KVMemory
        from radixkv.model.runner import ModelRunner

        b = self.base
        layout = dataclasses.replace(b.layout, page_size=1, kv_cache_dtype=fmt)
        memory = KVMemory(layout, tokens, max_reqs=len(PROMPTS) + 1, max_context_len=tokens + 1, device=b.device)
        config = self.config.with_options(kv_cache_dtype=fmt, page_size=1)
        return ModelRunner(config, b.model, memory, b.model_dir, b.context_length)


def all_logits(runner, ids: list[int]) -> torch.Tensor:
    """(n, V) logits of every position of `ids`, run as one extend from an empty cache."""
    from radixkv.attention.forward_batch import ForwardMode

    table = runner.memory.req_table
    row = table.alloc()
    slots = list(range(1, len(ids) + 1))
    table.write(row, 0, slots)
    try:
        with torch.inference_mode():
            return runner.forward(runner.build_batch(ForwardMode.EXTEND, [ids], [row], [0], slots, logits="all"))
    finally:
        table.free(row)


def greedy(runner, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy continuations of every prompt (decoded together); returns them and decode tokens/s."""
    from radixkv.attention.forward_batch import ForwardMode

    table, next_slot, rows, slots, outs = runner.memory.req_table, 1, [], [], []
    with torch.inference_mode():
        for ids in prompts:  # prefill one by one
            row = table.alloc()
            s = list(range(next_slot, next_slot + len(ids) + new_tokens))
            next_slot += len(s)
            table.write(row, 0, s)
            rows.append(row)
            slots.append(s)
            logits = runner.forward(runner.build_batch(ForwardMode.EXTEND, [ids], [row], [0], s[: len(ids)]))
            outs.append([int(logits[0].argmax())])
        start = time.perf_counter()
        for step in range(new_tokens - 1):
            pos = [len(ids) + step for ids in prompts]
            fb = runner.build_batch(ForwardMode.DECODE, [[o[-1]] for o in outs], rows, pos,
                                    [s[p] for s, p in zip(slots, pos)])
            for o, tok in zip(outs, runner.forward(fb).argmax(-1).tolist()):
                o.append(tok)
        seconds = time.perf_counter() - start
    for row in rows:
        table.free(row)
    return outs, len(prompts) * (new_tokens - 1) / seconds


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["format"] for r in rows]
    a.bar(names, [r["tokens_in_budget"] / 1e3 for r in rows])
    a.set_ylabel("thousand tokens in the budget")
    a.set_title("capacity (higher is better)")
    b.bar(names, [r["perplexity_change_pct"] for r in rows], label="perplexity change (%)")
    b.plot(names, [100 * (1 - r["greedy_agreement"]) for r in rows], "ko-", label="greedy tokens lost (%)")
    b.set_title("quality cost (lower is better)")
    b.legend()
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=20, labelsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    h = Harness()
    tok = h.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS[: args.prompts]]
    text = tok.encode_segment(PROSE.read_text())[: args.text_tokens]
    pool_tokens = max(len(text), sum(len(p) for p in prompts) + len(prompts) * args.new_tokens) + 8
    formats = ["auto", *[f for f in args.formats if f != "auto"]]  # full precision first: the reference
    rows, ref = [], {}
    with tqdm(total=len(formats) * 3, desc="kv formats", unit="pass") as bar:
        for fmt in formats:
            runner = h.runner(fmt, pool_tokens)
            outs, tok_s = greedy(runner, prompts, args.new_tokens)
            bar.update(1)
            if fmt == "auto":
                ref["outs"] = outs
                ref["logp"] = [torch.log_softmax(all_logits(runner, p + o[:-1])[len(p) - 1:], -1)
                               for p, o in zip(prompts, outs)]
            kl = []
            for p, o, ref_logp in zip(prompts, ref["outs"], ref["logp"]):
                logp = torch.log_softmax(all_logits(runner, p + o[:-1])[len(p) - 1:], -1)  # (new, V)
                kl.append(float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean()))
            bar.update(1)
            logits = all_logits(runner, text)  # (n, V)
            nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(text[1:]), reduction="mean")
            bar.update(1)
            agree = [first_difference(o, r) / args.new_tokens for o, r in zip(outs, ref["outs"])]
            layout = runner.layout
            rows.append({"format": fmt, "bytes_per_token": layout.bytes_per_token,
                         "tokens_in_budget": layout.num_pages_for(max_bytes=args.budget_bytes) * layout.page_size,
                         "greedy_agreement": sum(agree) / len(agree), "greedy_agreement_per_prompt": agree,
                         "mean_kl": sum(kl) / len(kl), "perplexity": math.exp(float(nll)), "decode_tok_s": tok_s})
            del runner, logits
    base = rows[0]
    for r in rows:
        r["perplexity_change_pct"] = 100 * (r["perplexity"] / base["perplexity"] - 1)
        r["capacity_x"] = r["tokens_in_budget"] / base["tokens_in_budget"]
        r["decode_speed_x"] = r["decode_tok_s"] / base["decode_tok_s"]
    rows = [r for r in rows if r["format"] in args.formats]
    print(f"\nSmolLM2-135M ({h.base.dtype}), {len(prompts)} prompts x {args.new_tokens} greedy tokens, "
          f"perplexity over {len(text)} tokens of prose, budget {args.budget}")
    print(f"{'format':<10}{'B/token':>9}{'tokens':>11}{'x':>6}{'greedy':>8}{'mean KL':>10}{'ppl':>8}"
          f"{'ppl +%':>8}{'decode tok/s':>14}")
    for r in rows:
        print(f"{r['format']:<10}{r['bytes_per_token']:>9,}{r['tokens_in_budget']:>11,}{r['capacity_x']:>6.2f}"
              f"{r['greedy_agreement']:>8.0%}{r['mean_kl']:>10.2e}{r['perplexity']:>8.3f}"
              f"{r['perplexity_change_pct']:>8.2f}{r['decode_tok_s']:>9.1f} ({r['decode_speed_x']:.2f}x)")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "text_tokens": len(text), "rows": rows})
    plot(rows, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
