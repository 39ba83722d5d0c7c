"""Speed against this machine's limits, side by side with transformers, in one run.

1. The machine: fp32 matmul rate (2048^3) and memory bandwidth (read-only and copy), measured
   first, in the same process, with the same threads.
2. Cold prefill of a ~2,000-token prompt: tokens/s, and the fraction of the matmul limit
   (the prompt's linear + causal attention FLOPs at the measured rate).
3. Warm time to first token: ~2,000 tokens cached + ~90 new. radixkv through its radix cache;
   transformers with the prefix's KV computed once and reused by hand (a copy per run).
4. Decode at batch 1, 8, 32, short and ~2k contexts: tokens/s, and the fraction of the
   read-bandwidth limit (weights + every request's KV read once per step). The long contexts
   share a cached 2k prefix (radixkv: prefix cache; transformers: one prefill, expanded).
5. Multi-turn chat: 8 conversations x 4 turns (~340-token first prompts, ~65-token follow-ups,
   32-token answers, closed loop: each turn's prompt is the conversation so far + the model's
   own answer + the next message). Wall time against the machine's limit for it (uncached
   prefill FLOPs at the matmul rate + weight and KV bytes of every decode step at the read
   bandwidth), and transformers batched per turn.

Every figure is the median of `--repeats` alternating runs (radixkv, transformers, ...), so
machine noise hits both alike. Prints a table, writes results/roofline.json and roofline.png.

    python benchmarks/roofline.py                      # SmolLM2 fp32, every section
    python benchmarks/roofline.py --skip multiturn --repeats 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from _report import RESULTS, machine, save_figure, save_json

PROSE = Path(__file__).resolve().parent / "data" / "prose.txt"
SECTIONS = ("prefill", "warm", "decode", "multiturn")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or .gguf (default: embedded SmolLM2)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per figure (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="cold/warm prompt length (default 2048)")
    p.add_argument("--new-tokens", type=int, default=90, help="warm: uncached tokens (default 90)")
    p.add_argument("--batch-sizes", default="1,8,32", help="decode batch sizes (default 1,8,32)")
    p.add_argument("--contexts", default="32,2048", help="decode context lengths (default 32,2048)")
    p.add_argument("--decode-steps", type=int, default=16, help="decode steps timed (default 16)")
    p.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--skip-hf", action="store_true", help="leave transformers out")
    p.add_argument("--json", type=Path, default=RESULTS / "roofline.json", help="results file (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
        args.contexts = [int(c) for c in args.contexts.split(",") if c]
    except ValueError:
        p.error("--batch-sizes and --contexts take comma-separated integers")
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(SECTIONS):
        p.error(f"--skip: unknown section(s) {sorted(args.skip - set(SECTIONS))}; choose from {SECTIONS}")
    if min([args.repeats, args.prompt_tokens, args.new_tokens, args.decode_steps, *args.batch_sizes,
            *args.contexts]) < 1 or args.new_tokens >= args.prompt_tokens:
        p.error("every count must be >= 1, and --new-tokens below --prompt-tokens")
    return args


# -- the machine -------------------------------------------------------------------------------
def best_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_machine(repeats: int = 5) -> dict:
    """Peak fp32 matmul rate and memory bandwidth with the current torch threads."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    matmul = 2 * 2048**3 / best_seconds(lambda: a @ b, repeats)
    big = torch.randn(256 * 2**20)  # 1 GiB, far beyond any cache
    read = big.numel() * 4 / best_seconds(big.sum, repeats)
    out = torch.empty_like(big)
    copy_bw = 2 * big.numel() * 4 / best_seconds(lambda: out.copy_(big), repeats)
    return {"matmul_flops": matmul, "read_bytes_per_s": read, "copy_bytes_per_s": copy_bw}


# -- what the model costs ------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCost:
    """FLOPs and bytes of the Llama-family model in `config` (ModelConfig), fp32."""

    layer_linear_params: int  # q/k/v/o + gate/up/down, per layer
    num_layers: int
    lm_head_params: int
    attn_width: int  # num_heads * head_dim
    kv_bytes_per_token: int
    weight_bytes: int  # everything a decode step reads: every linear layer + the output layer

    @classmethod
    def of(cls, mc, kv_bytes_per_token: int, dtype_bytes: int = 4) -> ModelCost:
        h, q, kv, inter = mc.hidden_size, mc.q_size, mc.kv_size, mc.intermediate_size
        layer = h * (q + 2 * kv) + q * h + 3 * h * inter
        lm_head = h * mc.vocab_size
        return cls(layer, mc.num_layers, lm_head, mc.num_heads * mc.head_dim, kv_bytes_per_token,
                   (layer * mc.num_layers + lm_head) * dtype_bytes)

    def prefill_flops(self, new: int, prefix: int = 0, logits_rows: int = 1) -> float:
        """`new` tokens after `prefix` cached ones: linear layers, causal attention, output rows."""
        linear = 2 * new * self.layer_linear_params * self.num_layers + 2 * logits_rows * self.lm_head_params
        keys = new * prefix + new * (new + 1) / 2  # (query, key) pairs attended
        attention = 4 * keys * self.attn_width * self.num_layers  # QK^T and PV
        return linear + attention

    def decode_step_bytes(self, contexts: list[int]) -> float:
        """One decode step: every weight once, plus each request's KV."""
        return self.weight_bytes + sum(contexts) * self.kv_bytes_per_token


# -- the two engines ---------------------------------------------------------------------------
def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


class Ours:
    def __init__(self, engine):
        self.engine = engine

    def prefill(self, prompt: list[int]) -> float:
        """Seconds to the first token with nothing cached."""
        self.engine.flush_cache()
        return self.engine.generate(input_ids=prompt, sampling_params=greedy(1))["meta_info"]["ttft"]

    def warm(self, prompt: list[int], cached: int) -> float:
        self.engine.flush_cache()
        self.engine.generate(input_ids=prompt[:cached], sampling_params=greedy(1))
        out = self.engine.generate(input_ids=prompt, sampling_params=greedy(1))
        assert out["meta_info"]["cached_tokens"] >= cached - 1, out["meta_info"]
        return out["meta_info"]["ttft"]

    def decode_step(self, prompts: list[list[int]], steps: int) -> float:
        """Seconds per pure-decode step for this batch (prompt prefill excluded)."""
        self.engine.flush_cache()
        self.engine.generate(input_ids=prompts[0][:-8], sampling_params=greedy(1))  # the shared prefix
        before = self.engine.get_stats()
        self.engine.generate(input_ids=prompts, sampling_params=greedy(steps + 1))
        after = self.engine.get_stats()
        n = after["decode_steps"] - before["decode_steps"]
        return (after["step_seconds"]["decode"] - before["step_seconds"]["decode"]) / n

    def multiturn(self, firsts, follow_ups, answer_tokens) -> tuple[float, list, dict]:
        self.engine.flush_cache()
        before = self.engine.get_stats()
        start = time.perf_counter()
        convs = [list(p) for p in firsts]
        turns = []
        for t in range(len(follow_ups[0]) + 1):
            if t:
                convs = [c + f[t - 1] for c, f in zip(convs, follow_ups)]
            outs = self.engine.generate(input_ids=convs, sampling_params=greedy(answer_tokens))
            turns.append([list(c) for c in convs])
            convs = [c + o["output_ids"] for c, o in zip(convs, outs)]
        wall = time.perf_counter() - start
        after = self.engine.get_stats()
        hits = (after["cached_prompt_tokens"] - before["cached_prompt_tokens"]) / max(
            1, after["prompt_tokens"] - before["prompt_tokens"])
        return wall, turns, {"hit_rate": hits}


class Theirs:
    """transformers: the same checkpoint, dtype and threads; caches handled by hand."""

    def __init__(self, model_dir, dtype):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    @torch.inference_mode()
    def prefill(self, prompt: list[int]) -> float:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        logits = self.model(ids, logits_to_keep=1).logits
        logits.argmax(-1)
        return time.perf_counter() - start

    @torch.inference_mode()
    def prefix_cache(self, prefix: list[int]):
        return self.model(torch.tensor([prefix]), logits_to_keep=1, use_cache=True).past_key_values

    @torch.inference_mode()
    def warm(self, prompt: list[int], cache) -> float:
        cache = copy.deepcopy(cache)  # reused by hand: not timed
        cached = cache.get_seq_length()
        start = time.perf_counter()
        self.model(torch.tensor([prompt[cached:]]), past_key_values=cache, logits_to_keep=1).logits.argmax(-1)
        return time.perf_counter() - start

    @torch.inference_mode()
    def decode_step(self, prompts: list[list[int]], prefix_cache, steps: int) -> float:
        """Seconds per decode step: the shared prefix expanded to the batch, then the suffixes."""
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(len(prompts))
        cached = cache.get_seq_length()
        out = self.model(torch.tensor([p[cached:] for p in prompts]), past_key_values=cache, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        start = time.perf_counter()
        for _ in range(steps):
            out = self.model(tok, past_key_values=out.past_key_values)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        return (time.perf_counter() - start) / steps

    @torch.inference_mode()
    def multiturn_batched(self, turns: list[list[list[int]]], answer_tokens: int) -> float:
        """Each turn's prompts (the ones radixkv saw) as one left-padded batch, nothing reused."""
        start = time.perf_counter()
        for prompts in turns:
            width = max(map(len, prompts))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            self.model.generate(ids, attention_mask=mask, max_new_tokens=answer_tokens,
                                min_new_tokens=answer_tokens, do_sample=False, pad_token_id=0)
        return time.perf_counter() - start


def alternate(fns: dict, repeats: int, bar) -> dict:
    """Median seconds of each function, run in alternation `repeats` times."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(fn())
            bar.update(1)
    return {k: statistics.median(v) for k, v in times.items()}


# -- workloads ---------------------------------------------------------------------------------
def prose_ids(tokenizer) -> list[int]:
    ids = tokenizer.encode(PROSE.read_text())
    return ids * 8  # long enough for every slice below


def multiturn_workload(ids: list[int], conversations=8, turns=4, first=340, follow=65):
    firsts = [ids[i * 211: i * 211 + first] for i in range(conversations)]
    follow_ups = [[ids[3000 + (i * turns + t) * 97: 3000 + (i * turns + t) * 97 + follow]
                   for t in range(turns - 1)] for i in range(conversations)]
    return firsts, follow_ups


def multiturn_limit(cost: ModelCost, turns: list[list[list[int]]], answer_tokens: int, m: dict) -> float:
    """Seconds the machine needs at least: prefill of what no earlier turn computed (at the
    matmul rate) + every decode step's weight and KV bytes (at the read bandwidth)."""
    flops, bytes_ = 0.0, 0.0
    done = [0] * len(turns[0])  # tokens of each conversation computed so far
    for prompts in turns:
        for i, p in enumerate(prompts):
            flops += cost.prefill_flops(len(p) - done[i], prefix=done[i])
        for step in range(answer_tokens - 1):  # the first answer token comes from the prefill
            bytes_ += cost.decode_step_bytes([len(p) + step + 1 for p in prompts])
        done = [len(p) + answer_tokens - 1 for p in prompts]
    return flops / m["matmul_flops"] + bytes_ / m["read_bytes_per_s"]


# -- report ------------------------------------------------------------------------------------
def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["workload"] for r in rows]
    ours = [r["radixkv_of_limit"] for r in rows]
    theirs = [r.get("transformers_of_limit") or 0 for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    ax.bar([i - 0.2 for i in x], ours, 0.4, label="radixkv")
    ax.bar([i + 0.2 for i in x], theirs, 0.4, label="transformers")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("fraction of the machine's limit")
    ax.set_title("Speed as a fraction of this machine's matmul / bandwidth limit (higher is better)")
    ax.legend()
    save_figure(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.engine import Engine

    engine = Engine(args.model, max_total_tokens=max(args.batch_sizes) * (max(args.contexts) + 64) + 8192,
                    max_running_requests=max(max(args.batch_sizes), 8), chunked_prefill_size=4096,
                    log_level="warning")
    runner = engine.runner
    cost = ModelCost.of(runner.model_config, runner.layout.bytes_per_token)
    ours = Ours(engine)
    theirs = None if args.skip_hf else Theirs(runner.model_dir, runner.dtype)
    print(f"measuring the machine ({torch.get_num_threads()} threads) ...", flush=True)
    m = measure_machine()
    print(f"  fp32 matmul {m['matmul_flops'] / 1e9:.0f} GFLOP/s, read {m['read_bytes_per_s'] / 1e9:.1f} GB/s, "
          f"copy {m['copy_bytes_per_s'] / 1e9:.1f} GB/s; weights read per decode step "
          f"{cost.weight_bytes / 1e6:.0f} MB", flush=True)
    ids = prose_ids(engine.tokenizer)
    rows: list[dict] = []
    n_runs = args.repeats * (1 if args.skip_hf else 2)
    total = n_runs * (("prefill" not in args.skip) + ("warm" not in args.skip)
                      + ("decode" not in args.skip) * len(args.batch_sizes) * len(args.contexts))
    bar = tqdm(total=total, desc="roofline", unit="run")

    def row(workload, seconds, limit, unit_count=None, unit=None, extra=None):
        r = {"workload": workload, "radixkv_s": seconds["radixkv"], "limit_s": limit,
             "radixkv_of_limit": limit / seconds["radixkv"]}
        if "transformers" in seconds:
            r |= {"transformers_s": seconds["transformers"],
                  "transformers_of_limit": limit / seconds["transformers"],
                  "radixkv_vs_transformers_speed": seconds["transformers"] / seconds["radixkv"]}
        if unit_count:
            r[f"radixkv_{unit}"] = unit_count / seconds["radixkv"]
            if "transformers" in seconds:
                r[f"transformers_{unit}"] = unit_count / seconds["transformers"]
        rows.append(r | (extra or {}))

    prompt = ids[: args.prompt_tokens]
    if "prefill" not in args.skip:
        fns = {"radixkv": lambda: ours.prefill(prompt)}
        if theirs:
            fns["transformers"] = lambda: theirs.prefill(prompt)
        row(f"cold prefill {len(prompt)}", alternate(fns, args.repeats, bar),
            cost.prefill_flops(len(prompt)) / m["matmul_flops"], len(prompt), "tok_s")
    if "warm" not in args.skip:
        cached = len(prompt) - args.new_tokens
        fns = {"radixkv": lambda: ours.warm(prompt, cached)}
        if theirs:
            hf_cache = theirs.prefix_cache(prompt[:cached])
            fns["transformers"] = lambda: theirs.warm(prompt, hf_cache)
        row(f"warm TTFT {cached}+{args.new_tokens}", alternate(fns, args.repeats, bar),
            cost.prefill_flops(args.new_tokens, prefix=cached) / m["matmul_flops"])
    if "decode" not in args.skip:
        for ctx in args.contexts:
            shared = ids[5000: 5000 + max(1, ctx - 8)]
            hf_cache = theirs.prefix_cache(shared) if theirs else None
            for b in args.batch_sizes:
                prompts = [shared + ids[9000 + 8 * i: 9000 + 8 * i + 8] for i in range(b)]
                fns = {"radixkv": lambda: ours.decode_step(prompts, args.decode_steps)}
                if theirs:
                    fns["transformers"] = lambda: theirs.decode_step(prompts, hf_cache, args.decode_steps)
                contexts = [len(p) + args.decode_steps // 2 for p in prompts]  # mid-run context
                row(f"decode b={b} ctx={len(prompts[0])}", alternate(fns, args.repeats, bar),
                    cost.decode_step_bytes(contexts) / m["read_bytes_per_s"], b, "tok_s")
    bar.close()
    if "multiturn" not in args.skip:
        firsts, follow_ups = multiturn_workload(ids)
        print("multi-turn chat: radixkv ...", flush=True)
        wall, turns, extra = ours.multiturn(firsts, follow_ups, 32)
        seconds = {"radixkv": wall}
        if theirs:
            print("multi-turn chat: transformers, batched per turn ...", flush=True)
            seconds["transformers"] = theirs.multiturn_batched(turns, 32)
        row("multi-turn 8x4", seconds, multiturn_limit(cost, turns, 32, m), extra=extra)

    print(f"\n{'workload':<28}{'radixkv':>10}{'transf.':>10}{'limit':>9}{'ours/limit':>11}"
          f"{'HF/limit':>10}{'speedup':>9}")
    for r in rows:
        hf_s = f"{r['transformers_s']:.3f}" if "transformers_s" in r else "-"
        hf_f = f"{r['transformers_of_limit']:.0%}" if "transformers_of_limit" in r else "-"
        sp = f"{r['radixkv_vs_transformers_speed']:.2f}x" if "radixkv_vs_transformers_speed" in r else "-"
        print(f"{r['workload']:<28}{r['radixkv_s']:>10.3f}{hf_s:>10}{r['limit_s']:>9.3f}"
              f"{r['radixkv_of_limit']:>11.0%}{hf_f:>10}{sp:>9}")
    print("(seconds: prefill/TTFT per request, decode per step, multi-turn wall; speedup = "
          "transformers time / radixkv time)")
    report = {**machine(), **{k: v for k, v in m.items()}, "model": str(runner.model_dir),
              "dtype": str(runner.dtype), "weight_bytes_per_decode_step": cost.weight_bytes,
              "kv_bytes_per_token": cost.kv_bytes_per_token, "repeats": args.repeats, "rows": rows}
    save_json(args.json, report)
    plot(rows, args.json.with_suffix(".png"))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
