"""Speculative decoding off against each proposer, side by side in one run, greedy.

Workloads, on the default model (SmolLM2-135M-Instruct):
- copy-heavy: edit a given Python file and a given text (answers quote them at length);
- repeated: the same questions asked again by other users (the first round's answers are in
  the radix cache when the second round asks);
- free-form chat: multi-turn conversations on prose (the multi-turn benchmark's shape), where
  drafts mostly fail and speculation must not lose.
Modes: off, ngram, radix, draft (the first 8 of SmolLM2's 30 layers as a self-speculative
draft model, same tokenizer). Each round runs every mode on the same prompts, modes
alternating, on its own Engine (caches flushed between rounds), so machine noise hits them
alike. Reported per workload and mode: wall time and decode tokens/s (medians over rounds),
tokens per verifying forward, acceptance, and whether the outputs equal speculation off.

    python benchmarks/speculative.py
    python benchmarks/speculative.py --rounds 1 --workloads repeated
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _report import RESULTS, machine, save_json
from tqdm import tqdm

DATA = Path(__file__).resolve().parent / "data"
MODES = ("off", "ngram", "radix", "draft")
CODE = '''def parse_size(text):
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    text = text.strip().lower()
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def format_size(n):
    for unit in ("", "k", "m", "g"):
        if n < 1024:
            return f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}t"
'''
QUESTIONS = ["What is the capital of France?", "How do I reverse a list in Python?", "What causes rain?",
             "Give me three tips for better sleep.", "What is a prime number?", "Explain what a CPU does.",
             "How far is the Moon from the Earth?", "What is photosynthesis?"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--workloads", default="copy,repeated,chat", help="which workloads (default all)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default 128)")
    p.add_argument("--json", type=Path, default=RESULTS / "speculative.json", help="results file")
    return p.parse_args(argv)


def make_draft_model(out: Path, layers: int = 8) -> Path:
    """The default model cut to its first `layers` layers (same embeddings, norm, tokenizer)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from radixkv.model.gguf import default_model_dir

    src = default_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    state = load_file(str(src / "model.safetensors"))
    keep = {k: v for k, v in state.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def chat_ids(tok, messages):
    return tok.apply_chat_template(messages)


def workloads(tok, names, max_new):
    """name -> list of batches; each batch is a list of prompt token lists (run in turn)."""
    prose = (DATA / "prose.txt").read_text()
    out = {}
    if "copy" in names:
        text = prose[:1200]
        out["copy"] = [[
            chat_ids(tok, [{"role": "user", "content": "Add a docstring to each function and return the whole "
                            f"file, otherwise unchanged:\n```python\n{CODE}```"}]),
            chat_ids(tok, [{"role": "user", "content": f"Fix any typos in this text and return it in full:\n\n{text}"}]),
        ]]
    if "repeated" in names:
        first = [chat_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
        out["repeated"] = [first, first]  # the first users (untimed) cache answers; others ask again
    if "chat" in names:
        starts = [prose[i * 700: i * 700 + 900] for i in range(4)]
        turns = [[{"role": "user", "content": f"Here is a passage:\n{s}\nWhat is it about?"}] for s in starts]
        out["chat"] = [[chat_ids(tok, t) for t in turns]]  # follow-up turns are added as answers arrive
    return out


def run_mode(engine, batches, max_new, chat: bool, tok):
    """Run the workload's batches, all but the last untimed (they warm the cache); returns
    (outputs of the last batch, its seconds, its tokens, stats)."""
    params = {"max_new_tokens": max_new, "temperature": 0}
    for prompts in batches[:-1]:
        engine.generate(input_ids=prompts, sampling_params=params)
    start, tokens, outs = time.perf_counter(), 0, []
    for prompts in batches[-1:]:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        tokens += sum(len(o["output_ids"]) for o in outs)
        if chat:  # two more turns on each conversation, the model's answers kept
            for _ in range(2):
                prompts = [p + o["output_ids"] + tok.encode_segment("\nTell me more.") for p, o in zip(prompts, outs)]
                outs = engine.generate(input_ids=prompts, sampling_params=params)
                tokens += sum(len(o["output_ids"]) for o in outs)
    seconds = time.perf_counter() - start
    return [o["output_ids"] for o in outs], seconds, tokens, engine.get_stats()


def run_timed(engine, batches, max_new, chat, tok):
    """`run_mode`, with the stats from before its timed part (acceptance of that part only)."""
    params = {"max_new_tokens": max_new, "temperature": 0}
    for prompts in batches[:-1]:
        engine.generate(input_ids=prompts, sampling_params=params)
    before = engine.get_stats()
    ids, seconds, tokens, after = run_mode(engine, batches[-1:], max_new, chat, tok)
    return ids, seconds, tokens, after, before


def main(argv=None) -> dict:
    from radixkv.engine import Engine

    args = parse_args(argv)
    draft_dir = make_draft_model(Path(tempfile.mkdtemp(prefix="radixkv-draft-")))
    options = {"off": {}, "ngram": {"speculative_algorithm": "ngram"}, "radix": {"speculative_algorithm": "radix"},
               "draft": {"speculative_algorithm": "draft", "speculative_draft_model_path": str(draft_dir)}}
    engines = {m: Engine(max_total_tokens=16384, progress=False, log_level="warning", **options[m]) for m in MODES}
    tok = engines["off"].core.tokenizer
    work = workloads(tok, set(args.workloads.split(",")), args.max_new_tokens)
    report = {"machine": machine(), "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "workloads": {}}
    try:
        for name, batches in work.items():
            times = {m: [] for m in MODES}
            rows = {}
            for _ in tqdm(range(args.rounds), desc=name):
                for mode in MODES:
                    engine = engines[mode]
                    engine.flush_cache()
                    ids, seconds, tokens, after, before = run_timed(engine, batches, args.max_new_tokens,
                                                                    name == "chat", tok)
                    times[mode].append((seconds, tokens))
                    verify = after["spec_verify_ct"] - before["spec_verify_ct"]
                    drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
                    kept = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
                    rows[mode] = {"outputs": ids, "verify": verify, "drafted": drafted, "kept": kept}
            base = rows["off"]["outputs"]
            result = {}
            for mode in MODES:
                secs = statistics.median(s for s, _ in times[mode])
                toks = times[mode][0][1]
                r = rows[mode]
                result[mode] = {"seconds": secs, "tokens": toks, "decode_tok_s": toks / secs,
                                "tokens_per_verify": (r["kept"] + r["verify"]) / r["verify"] if r["verify"] else 1.0,
                                "accept_rate": r["kept"] / r["drafted"] if r["drafted"] else 0.0,
                                "identical_to_off": r["outputs"] == base}
            for mode in MODES:
                result[mode]["speedup_vs_off"] = result["off"]["seconds"] / result[mode]["seconds"]
            report["workloads"][name] = result
            for mode, r in result.items():
                print(f"{name:9s} {mode:6s} {r['seconds']:6.2f} s  {r['decode_tok_s']:6.1f} tok/s  "
                      f"{r['speedup_vs_off']:.2f}x  {r['tokens_per_verify']:.2f} tok/verify  "
                      f"accept {r['accept_rate']:.0%}  identical={r['identical_to_off']}")
    finally:
        for engine in engines.values():
            engine.shutdown()
    save_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
