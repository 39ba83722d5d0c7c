"""Batch generation with the offline Engine and the embedded default model.

    python examples/offline_generate.py
"""

import radixkv

PROMPTS = [
    "The capital of France is",
    "The three primary colors are",
    "A radix tree is",
]

with radixkv.Engine(log_level="warning") as engine:
    outputs = engine.generate(PROMPTS, {"max_new_tokens": 24, "temperature": 0})
    for prompt, out in zip(PROMPTS, outputs):
        meta = out["meta_info"]
        print(f"{prompt!r} -> {out['text']!r}")
        print(f"    {meta['prompt_tokens']} prompt tokens ({meta['cached_tokens']} cached), "
              f"{meta['completion_tokens']} generated, finish: {meta['finish_reason']}")
    stats = engine.get_stats()
    print(f"cache hit rate {stats['cache_hit_rate']:.1%}, {stats['used_tokens']} KV tokens in use")
