"""Many LoRA adapters in one batch (S-LoRA's comparison, at this machine's scale).

The same batch -- `--requests` requests of `--prompt-tokens` prompt tokens, `--new-tokens`
greedy tokens each, all submitted at once -- run by one engine per setup on the default model
(SmolLM2-135M-Instruct), each setup alone on the machine:

    base        the base model, no adapters (radixkv's defaults: compiled forward)
    merged      one adapter merged into the weights (transformers + peft `merge_and_unload`,
                saved as a checkpoint): what serving one fine-tune costs without LoRA
    merged-eager  the same with --compile off (a LoRA engine runs eager)
    lora-1      --enable-lora, every request under the same adapter
    lora-N      --enable-lora, the requests spread round-robin over N adapters (one batch)

Tokens per second of the whole batch (prefill + decode), and each setup over `merged`. The
adapters are random PEFT adapters of rank `--rank` over all seven projections.

    python benchmarks/lora.py
    python benchmarks/lora.py --adapters 1,2,4,8 --requests 32
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from _report import RESULTS, bar_plot, machine, save_json

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=16, help="requests in the batch (default 16)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt tokens each (default 128)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated each (default 64)")
    p.add_argument("--rank", type=int, default=16, help="adapter rank (default 16)")
    p.add_argument("--adapters", default="1,2,4,8", help="adapter counts mixed in the batch (default 1,2,4,8)")
    p.add_argument("--json", type=Path, default=RESULTS / "lora.json", help="results file")
    args = p.parse_args(argv)
    try:
        args.adapters = [int(x) for x in args.adapters.split(",") if x]
    except ValueError:
        p.error(f"--adapters: not a list of integers: {args.adapters!r}")
    if not args.adapters or min(args.adapters) < 1 or max(args.adapters) > 64 or args.requests < 1:
        p.error("--adapters in [1, 64], --requests >= 1")
    return args


def make_adapter(base: Path, out: Path, seed: int, rank: int) -> Path:
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=ALL, init_lora_weights=False, lora_dropout=0.0)
    peft.get_peft_model(model, config).save_pretrained(str(out))
    return out


def merge(base: Path, adapter: Path, out: Path) -> Path:
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (base / name).is_file() and not (out / name).exists():
            shutil.copy(base / name, out / name)
    return out


def run(options: dict, prompts: list[list[int]], loras: list[str | None], new_tokens: int) -> dict:
    from radixkv.config import EngineConfig
    from radixkv.core.engine_core import EngineCore
    from radixkv.sampling_params import SamplingParams
    from radixkv.sched.request import Req

    core = EngineCore.load(EngineConfig.from_kwargs(max_total_tokens=16384, log_level="warning", **options),
                           progress=False)
    try:
        ids = core.lora_adapters()
        warm = Req("warm", prompts[0][:16], SamplingParams(max_new_tokens=4, temperature=0.0),
                   lora=ids.get(loras[0]) if loras[0] else None)
        core.add_request(warm)
        while core.has_work:
            core.step()
        start = time.perf_counter()
        for i, (p, name) in enumerate(zip(prompts, loras)):
            core.add_request(Req(f"r{i}", list(p), SamplingParams(max_new_tokens=new_tokens, temperature=0.0,
                                                                  ignore_eos=True), lora=ids[name] if name else None))
        tokens = 0
        while core.has_work:
            tokens += sum(len(o.new_ids) for o in core.step())
        seconds = time.perf_counter() - start
        stats = core.get_stats()
        return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                "compiled": bool(stats.get("compiled")),
                "slot_loads": core.runner.lora.slots.loads if core.runner.lora is not None else 0}
    finally:
        core.close()


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from radixkv.model.gguf import default_model_dir

    base = default_model_dir()
    rng = random.Random(0)
    prompts = [[rng.randrange(200, 20000) for _ in range(args.prompt_tokens)] for _ in range(args.requests)]
    most = max(args.adapters)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        adapters = [make_adapter(base, tmp / f"a{i}", i, args.rank) for i in tqdm(range(most), desc="adapters")]
        merged = merge(base, adapters[0], tmp / "merged")
        paths = [[f"a{i}={p}" for i, p in enumerate(adapters)]]
        setups = [("base", {}, [None] * args.requests), ("merged", {"model": str(merged)}, [None] * args.requests),
                  ("merged-eager", {"model": str(merged), "compile": "off"}, [None] * args.requests)]
        for n in args.adapters:
            setups.append((f"lora-{n}", {"lora_paths": paths, "max_loras_per_batch": max(args.adapters)},
                           [f"a{i % n}" for i in range(args.requests)]))
        for name, options, loras in tqdm(setups, desc="setups"):
            results[name] = {"flags": options_text(options), **run(options, prompts, loras, args.new_tokens)}
            print(name, results[name], flush=True)
    for r in results.values():
        r["over_merged"] = r["tokens_per_s"] / results["merged"]["tokens_per_s"]
        r["over_merged_eager"] = r["tokens_per_s"] / results["merged-eager"]["tokens_per_s"]
    report = {**machine(), "workload": {k: getattr(args, k) for k in ("requests", "prompt_tokens", "new_tokens", "rank")},
              "results": results}
    print(table(report))
    save_json(args.json, report)
    bar_plot(args.json.with_suffix(".png"), "LoRA adapters mixed in one batch", "tokens/s",
             {k: v["tokens_per_s"] for k, v in results.items()})
    return 0


def options_text(options: dict) -> str:
    if "lora_paths" in options:
        return f"--lora-paths ... --max-loras-per-batch {options['max_loras_per_batch']}"
    return " ".join(f"--{k.replace('_', '-')} {'MERGED' if k == 'model' else v}" for k, v in options.items()) or "defaults"


def table(report: dict, measured: str = "") -> str:
    w = report["workload"]
    rows = [f"{w['requests']} requests x ({w['prompt_tokens']} prompt + {w['new_tokens']} new tokens) in one batch, "
            f"adapters of rank {w['rank']} on all seven projections.\n",
            "| setup | flags | tokens/s | vs merged | vs merged, eager | adapter slot loads |", "|---|---|---|---|---|---|"]
    for name, r in report["results"].items():
        rows.append(f"| {name} | {r['flags']} | {r['tokens_per_s']:.1f} | {r['over_merged']:.2f}x | "
                    f"{r['over_merged_eager']:.2f}x | {r['slot_loads']} |")
    tail = f"\n\n`python benchmarks/lora.py`, {measured}.\n" if measured else "\n"
    return "\n".join(rows) + tail


if __name__ == "__main__":
    sys.exit(main())
