"""Customer-service scenario through real servers: a ~2,000-token system prompt shared by every
request, ~100-token user messages, short answers.

For each engine -- radixkv with its radix cache on and off, vLLM with automatic prefix caching
at block 32 and 128 (its best settings here: both cores), transformers (in this process) -- in
one run, each alone on the machine:
- TTFT of one request cold (a system prompt it has never seen) and warm (the shared one,
  already cached), medians of `--repeats`;
- 16 concurrent requests on the shared prompt: throughput and TTFT p50 / p90.
The limit for the warm request is the uncached share of its prefill work (the user message,
attending over the cached prompt): the TTFT a perfect cache would give, relative to cold.

    python benchmarks/customer_service.py              # every engine
    python benchmarks/customer_service.py --skip vllm  # without the vLLM peer
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from _load import complete, summary
from _report import RESULTS, machine, same_mkl, save_figure, save_json
from _servers import start_engine

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"
ENGINES = ("radixkv", "radixkv-no-cache", "vllm-b32", "vllm-b128", "transformers")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system-tokens", type=int, default=2000, help="shared system prompt (default 2000)")
    p.add_argument("--user-tokens", type=int, default=100, help="user message (default 100)")
    p.add_argument("--answer-tokens", type=int, default=16, help="answer length (default 16)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent requests (default 16)")
    p.add_argument("--repeats", type=int, default=3, help="cold/warm TTFT samples (default 3)")
    p.add_argument("--skip", default="", help=f"engines to leave out: {','.join(ENGINES)} (or 'vllm')")
    p.add_argument("--json", type=Path, default=RESULTS / "customer_service.json", help="results file")
    args = p.parse_args(argv)
    args.skip = {e for s in args.skip.split(",") if s for e in ENGINES if e.startswith(s)}
    return args


class Workload:
    def __init__(self, tokenizer, args):
        ids = tokenizer.encode_segment(PROSE.read_text()) * 4
        policy = tokenizer.decode(ids[: args.system_tokens])
        self.tokenizer = tokenizer
        self.system = ("You are the customer service assistant of Lighthouse Tours. Answer from the company "
                       "handbook below, briefly and politely.\n\nHandbook:\n" + policy)
        self.users = [tokenizer.decode(ids[3000 + 137 * i: 3000 + 137 * i + args.user_tokens])
                      for i in range(args.concurrency + args.repeats + 1)]
        self.args = args

    def prompt(self, user: str, session: int | None = None) -> list[int]:
        system = self.system if session is None else f"Session {session}. " + self.system  # never seen: cold
        return self.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                   {"role": "user", "content": "Question: " + user}])


async def measure_server(url: str, model: str, w: Workload, cold_sessions: list[int], bar) -> dict:
    a = w.args
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=httpx.Limits(max_connections=64)) as c:
        cold = []
        for s in cold_sessions:
            cold.append((await complete(c, model, w.prompt(w.users[0], session=s), a.answer_tokens)).ttft)
            bar.update(1)
        await complete(c, model, w.prompt(w.users[0]), a.answer_tokens)  # caches the shared prompt
        warm = []
        for i in range(a.repeats):
            warm.append((await complete(c, model, w.prompt(w.users[1 + i]), a.answer_tokens)).ttft)
            bar.update(1)
        prompts = [w.prompt(w.users[1 + a.repeats + i]) for i in range(a.concurrency)]
        start = time.perf_counter()
        replies = await asyncio.gather(*(complete(c, model, p, a.answer_tokens) for p in prompts))
        load = summary(replies, time.perf_counter() - start)
        bar.update(1)
    return {"cold_ttft": statistics.median(cold), "warm_ttft": statistics.median(warm), "cold_ttfts": cold,
            "warm_ttfts": warm, "concurrent": load}


def measure_transformers(model_dir: str, w: Workload, bar) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    a = w.args
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.inference_mode()
    def ttft(ids):
        start = time.perf_counter()
        model(torch.tensor([ids]), logits_to_keep=1).logits.argmax(-1)
        return time.perf_counter() - start

    cold = []
    for i in range(a.repeats):
        cold.append(ttft(w.prompt(w.users[1 + i])))  # no prefix cache: every request is cold
        bar.update(2)
    prompts = [w.prompt(w.users[1 + a.repeats + i]) for i in range(a.concurrency)]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=a.answer_tokens, min_new_tokens=a.answer_tokens,
                       do_sample=False, pad_token_id=0)
    wall = time.perf_counter() - start
    bar.update(1)
    del model
    return {"cold_ttft": statistics.median(cold), "warm_ttft": statistics.median(cold), "cold_ttfts": cold,
            "warm_ttfts": cold, "concurrent": {"requests": a.concurrency, "seconds": wall,
                                               "requests_per_s": a.concurrency / wall,
                                               "output_tok_s": a.concurrency * a.answer_tokens / wall,
                                               "ttft_p50": None, "ttft_p90": None, "hit_rate": None}}


def prefill_limit(model_dir: str, w: Workload) -> dict:
    """The warm request's uncached share of the prefill work (the best warm/cold TTFT ratio)."""
    from roofline import ModelCost

    from radixkv.mem import KVLayout
    from radixkv.model.config import ModelConfig

    mc = ModelConfig.from_file(Path(model_dir) / "config.json")
    cost = ModelCost.of(mc, KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, 1).bytes_per_token)
    full = w.prompt(w.users[1])
    shared = len(w.tokenizer.apply_chat_template([{"role": "system", "content": w.system}], add_generation_prompt=False))
    share = cost.prefill_flops(len(full) - shared, prefix=shared) / cost.prefill_flops(len(full))
    return {"prompt_tokens": len(full), "shared_tokens": shared, "uncached_share_of_prefill_work": share}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(names))
    a.bar([i - 0.2 for i in x], [results[n]["cold_ttft"] for n in names], 0.4, label="cold")
    a.bar([i + 0.2 for i in x], [results[n]["warm_ttft"] for n in names], 0.4, label="warm (prompt cached)")
    a.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    a.set_ylabel("time to first token (s)")
    a.set_title("one request")
    a.legend()
    b.bar(list(x), [results[n]["concurrent"]["output_tok_s"] for n in names])
    b.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    b.set_ylabel("output tokens / s")
    b.set_title("16 concurrent requests")
    fig.suptitle("Customer service: 2,000-token shared system prompt, 100-token questions")
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    same_mkl()  # the transformers peer runs in this process
    from radixkv.model.loader import resolve_model_dir
    from radixkv.tokenizer import Tokenizer

    model_dir = str(resolve_model_dir(None))
    w = Workload(Tokenizer(model_dir), args)
    limit = prefill_limit(model_dir, w)
    engines = [e for e in ENGINES if e not in args.skip]
    results, skipped = {}, {}
    bar = tqdm(total=len(engines) * (2 * args.repeats + 1), desc="customer service", unit="step")
    for k, engine in enumerate(engines):
        sessions = [1000 * k + i for i in range(args.repeats)]
        if engine == "transformers":
            results[engine] = measure_transformers(model_dir, w, bar)
            continue
        server, reason = start_engine(engine, model_dir, "--max-total-tokens", "65536")
        if server is None:
            skipped[engine] = reason
            print(f"\n{engine}: not run: {reason[:400]}", flush=True)
            bar.update(2 * args.repeats + 1)
            continue
        try:
            results[engine] = asyncio.run(measure_server(server.url, server.model, w, sessions, bar))
        finally:
            server.stop()
    bar.close()
    print(f"\n{limit['prompt_tokens']}-token prompts, {limit['shared_tokens']} shared; a perfect cache leaves "
          f"{limit['uncached_share_of_prefill_work']:.1%} of the prefill work for a warm request")
    print(f"{'engine':<18}{'cold TTFT':>10}{'warm TTFT':>10}{'warm/cold':>10}{'16-req tok/s':>13}{'TTFT p50':>9}"
          f"{'TTFT p90':>9}")
    for name, r in results.items():
        c = r["concurrent"]
        p50 = f"{c['ttft_p50']:.2f}" if c["ttft_p50"] is not None else "-"
        p90 = f"{c['ttft_p90']:.2f}" if c["ttft_p90"] is not None else "-"
        print(f"{name:<18}{r['cold_ttft']:>10.3f}{r['warm_ttft']:>10.3f}{r['warm_ttft'] / r['cold_ttft']:>10.1%}"
              f"{c['output_tok_s']:>13.1f}{p50:>9}{p90:>9}")
    best_vllm = min((n for n in results if n.startswith("vllm")), key=lambda n: results[n]["warm_ttft"], default=None)
    ratios = {}
    if best_vllm and "radixkv" in results:
        ours, theirs = results["radixkv"], results[best_vllm]
        ratios = {"vs": best_vllm, "warm_ttft_ratio": ours["warm_ttft"] / theirs["warm_ttft"],
                  "cold_ttft_ratio": ours["cold_ttft"] / theirs["cold_ttft"],
                  "throughput_ratio": ours["concurrent"]["output_tok_s"] / max(
                      results[n]["concurrent"]["output_tok_s"] for n in results if n.startswith("vllm"))}
        print(f"radixkv vs {best_vllm}: warm TTFT {ratios['warm_ttft_ratio']:.2f}x, cold TTFT "
              f"{ratios['cold_ttft_ratio']:.2f}x (goal <= 0.9x each); 16-request throughput "
              f"{ratios['throughput_ratio']:.2f}x vLLM's best (goal >= 1.3x)")
    for name, why in skipped.items():
        print(f"{name}: not run ({why[:200]})")
    save_json(args.json, {**machine(), "args": {k: v for k, v in vars(args).items() if k != "json"},
                          "limit": limit, "results": results, "skipped": skipped, "ratios": ratios})
    if results:
        plot(results, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
