"""Constrained decoding: what the grammar mask costs, and what jump-forward saves.

In one run, on the default model (in-process Engine, greedy):
1. Mask cost: decode steps of JSON-schema-constrained requests vs unconstrained ones, at batch 1
   and 8, in alternating order: seconds per decode step, and -- the direct measure, free of
   the run-to-run noise of these machines (about 5 %) -- the share of the constrained step spent
   filling and applying masks (jump-forward off, so every token goes through the mask).
   Goal: under 10 %.
2. Jump-forward: a schema with long fixed keys, decoded with and without jump-forward: wall
   time, forward steps, forced tokens, and whether every output validates.

    python benchmarks/constrained.py
    python benchmarks/constrained.py --repeats 1 --batch 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from _report import RESULTS, bar_plot, machine, save_json

FREE = {"type": "object", "properties": {"story": {"type": "string", "minLength": 200, "maxLength": 400}},
        "required": ["story"]}
LONG_KEYS = {"type": "object", "properties": {
    "customer_full_legal_name": {"type": "string", "maxLength": 24},
    "customer_preferred_contact_method": {"enum": ["email", "phone", "post"]},
    "shipping_address_first_line": {"type": "string", "maxLength": 24},
    "shipping_address_postal_code": {"type": "string", "maxLength": 10},
    "requested_delivery_window_description": {"type": "string", "maxLength": 24},
    "order_contains_fragile_glass_items": {"type": "boolean"},
    "total_number_of_items_in_the_order": {"type": "integer", "minimum": 1, "maximum": 99}},
    "required": ["customer_full_legal_name", "customer_preferred_contact_method", "shipping_address_first_line",
                 "shipping_address_postal_code", "requested_delivery_window_description",
                 "order_contains_fragile_glass_items", "total_number_of_items_in_the_order"]}
TOPICS = ["a lighthouse keeper", "a night train", "a lost glove", "a market at dawn", "an old map",
          "a winter garden", "a paper boat", "a quiet library"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="the larger batch size (default 8; 1 is always run)")
    p.add_argument("--tokens", type=int, default=64, help="decode tokens per request for the mask cost (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="alternating repeats, medians reported (default 5)")
    p.add_argument("--json", type=Path, default=RESULTS / "constrained.json", help="results file")
    args = p.parse_args(argv)
    if args.batch < 1 or args.tokens < 8 or args.repeats < 1:
        p.error("--batch >= 1, --tokens >= 8, --repeats >= 1")
    return args


def decode_run(engine, prompts, params) -> dict:
    """Seconds per pure decode step, mask seconds, tokens, for one batch."""
    before = engine.get_stats()
    outs = engine.generate(prompts, params)
    after = engine.get_stats()
    steps = after["decode_steps"] - before["decode_steps"]
    return {"step_s": (after["step_seconds"]["decode"] - before["step_seconds"]["decode"]) / max(1, steps),
            "mask_s": after["grammar_mask_seconds"] - before["grammar_mask_seconds"], "steps": steps,
            "tokens": sum(len(o["output_ids"]) for o in outs), "outs": outs}


def main(argv=None) -> int:
    args = parse_args(argv)
    import jsonschema

    from radixkv import Engine

    engine = Engine(max_total_tokens=16384, progress=False, log_level="warning")
    sizes = sorted({1, args.batch})
    mask = {b: {"free": [], "json": [], "mask_share": []} for b in sizes}
    jf = {"on": [], "off": []}
    with tqdm(total=args.repeats * (2 * len(sizes) + 2), desc="constrained", unit="run") as bar:
        for rep in range(args.repeats):
            for b in sizes:
                prompts = [f"Tell a short story about {TOPICS[i % len(TOPICS)]}, as JSON." for i in range(b)]
                runs = {}
                for kind in (("free", "json") if rep % 2 == 0 else ("json", "free")):
                    params = {"max_new_tokens": args.tokens, "temperature": 0}
                    params.update({"ignore_eos": True} if kind == "free" else {"json_schema": FREE, "jump_forward": False})
                    runs[kind] = decode_run(engine, prompts, params)
                    bar.update(1)
                free, con = runs["free"], runs["json"]
                mask[b]["free"].append(free["step_s"])
                mask[b]["json"].append(con["step_s"])
                mask[b]["mask_share"].append(con["mask_s"] / max(1e-9, con["step_s"] * con["steps"]))
            for mode in ("off", "on"):
                prompts = [f"Write the order of customer {i} as JSON: Ada Byron, 12 Harbour Road, glass lamps."
                           for i in range(args.batch)]
                before = engine.get_stats()
                start = time.perf_counter()
                outs = engine.generate(prompts, {"max_new_tokens": 256, "temperature": 0, "json_schema": LONG_KEYS,
                                                 "jump_forward": mode == "on"})
                wall = time.perf_counter() - start
                after = engine.get_stats()
                for o in outs:
                    jsonschema.validate(json.loads(o["text"]), LONG_KEYS)
                jf[mode].append({"wall": wall, "steps": sum(after[k] - before[k] for k in ("extend_steps", "decode_steps")),
                                 "forced": after["jump_forward_tokens"] - before["jump_forward_tokens"],
                                 "tokens": sum(len(o["output_ids"]) for o in outs)})
                bar.update(1)
    engine.shutdown()
    rows = {}
    for b in sizes:
        free, con = statistics.median(mask[b]["free"]), statistics.median(mask[b]["json"])
        rows[f"batch {b}"] = {"unconstrained_step_ms": free * 1e3, "json_schema_step_ms": con * 1e3,
                              "slowdown_pct": 100 * (con / free - 1),
                              "mask_share_pct": 100 * statistics.median(mask[b]["mask_share"])}
    med = {m: {k: statistics.median(r[k] for r in jf[m]) for k in ("wall", "steps", "forced", "tokens")} for m in jf}
    jump = {"batch": args.batch, "off": med["off"], "on": med["on"],
            "wall_ratio": med["off"]["wall"] / med["on"]["wall"],
            "steps_ratio": med["off"]["steps"] / max(1, med["on"]["steps"])}
    print(f"\nmask cost (decode step, JSON schema vs free text, jump-forward off, median of {args.repeats}):")
    for name, r in rows.items():
        print(f"  {name}: {r['unconstrained_step_ms']:.1f} ms vs {r['json_schema_step_ms']:.1f} ms "
              f"({r['slowdown_pct']:+.1f}%), masks {r['mask_share_pct']:.2f}% of the step")
    print(f"jump-forward, {args.batch} requests with a long-key schema: wall {med['off']['wall']:.2f} s -> "
          f"{med['on']['wall']:.2f} s ({jump['wall_ratio']:.2f}x), forward steps {med['off']['steps']:.0f} -> "
          f"{med['on']['steps']:.0f} ({jump['steps_ratio']:.2f}x), {med['on']['forced']:.0f} tokens forced; "
          f"every output validates")
    save_json(args.json, {**machine(), "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "mask_cost": rows, "jump_forward": jump})
    bar_plot(args.json.with_suffix(".png"), f"jump-forward, {args.batch} JSON requests (lower is better)",
             "wall time (s)", {"token by token": med["off"]["wall"], "jump-forward": med["on"]["wall"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
