"""Greedy generation speed of our ModelRunner vs transformers `generate`, side by side.

Same checkpoint, same dtype, same prompts, same number of new tokens; the two alternate for
`--repeats` rounds and the median of each is reported, so machine noise hits both alike.
Ours runs as a static batch on the paged KV pool (`radixkv.model.static_batch`); transformers
runs `generate` with its own KV cache (left-padded for batches).

    python benchmarks/runner_decode.py                    # default model, batch 1 and 8, fp32
    python benchmarks/runner_decode.py --batch-sizes 1,8,32 --new-tokens 64 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from _report import RESULTS, machine, save_json

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
    "Explain what a radix tree is.", "Give me a recipe for pancakes.", "Why is the sky blue?",
    "Translate 'good morning' into Spanish.", "What is 17 times 23?",
]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and KV dtype for both engines (default float32: fastest on CPU)")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds per engine (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", type=Path, default=RESULTS / "runner_decode.json",
                   help="where to save results (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        p.error(f"--batch-sizes: expected comma-separated integers, got {args.batch_sizes!r}")
    if min(args.batch_sizes) < 1 or args.new_tokens < 2 or args.repeats < 1:
        p.error("--batch-sizes must be >= 1, --new-tokens >= 2, --repeats >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixkv.config import EngineConfig
    from radixkv.model.runner import ModelRunner
    from radixkv.model.static_batch import generate_static

    max_b = max(args.batch_sizes)
    runner = ModelRunner.load(EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_running_requests=max_b,
                                      max_total_tokens=max_b * 512))
    tok = AutoTokenizer.from_pretrained(runner.model_dir)
    tok.padding_side = "left"
    hf = AutoModelForCausalLM.from_pretrained(runner.model_dir, dtype=runner.dtype).eval()
    questions = (QUESTIONS * (max_b // len(QUESTIONS) + 1))[:max_b]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for q in questions]
    n = args.new_tokens
    results = []
    for b in args.batch_sizes:
        batch = prompts[:b]
        enc = tok.pad({"input_ids": batch}, return_tensors="pt")

        def ours():
            generate_static(runner, batch, n)

        def theirs():
            with torch.inference_mode():
                hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                            pad_token_id=tok.pad_token_id)

        ours(), theirs()  # warm-up
        times = {"radixkv": [], "transformers": []}
        for _ in range(args.repeats):
            for name, fn in (("radixkv", ours), ("transformers", theirs)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"batch_size": b, "new_tokens": n,
               "radixkv_tok_s": b * n / med["radixkv"], "transformers_tok_s": b * n / med["transformers"],
               "speedup": med["transformers"] / med["radixkv"], "seconds": times}
        results.append(row)
        print(f"batch {b:>3}: radixkv {row['radixkv_tok_s']:7.1f} tok/s   transformers "
              f"{row['transformers_tok_s']:7.1f} tok/s   ratio {row['speedup']:.2f}x", flush=True)
    report = {**machine(), "model": str(runner.model_dir), "dtype": args.dtype,
              "device": str(runner.device), "kv_bytes_per_token": runner.layout.bytes_per_token,
              "results": results}
    print(f"KV bytes per token: {runner.layout.bytes_per_token:,}")
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
