"""A scripted multi-turn chat: every turn re-sends the whole conversation, and the radix cache
serves everything the previous turn computed, so only the new tokens are prefilled.

    python examples/multi_turn_chat.py
"""

import radixkv

QUESTIONS = ["What is the capital of France?", "And of Germany?", "Which of the two is larger?"]

with radixkv.Engine(log_level="warning") as engine:
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        out = engine.chat(messages, {"max_new_tokens": 48, "temperature": 0})
        messages.append({"role": "assistant", "content": out["text"]})
        meta = out["meta_info"]
        print(f"user: {question}\nassistant: {out['text']}")
        print(f"    [{meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens from the cache]\n")
