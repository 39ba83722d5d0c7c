"""A classifier with `select`: the model scores each label after the prompt (its
log-likelihood) and the most likely one is chosen -- no parsing of free text. The few-shot
examples are a shared prefix, computed once for the whole batch.

Each choice starts with the space that separates it from "Topic:": a program's pieces are
tokenised one by one (see `radixkv.frontend.state`), so a piece carries its own leading space.

    python examples/dsl_select_classifier.py
"""

import radixkv as rk

SHOTS = ("Text: Snow will fall on the hills by morning.\nTopic: weather\n\n"
         "Text: She won the final in straight sets.\nTopic: sports\n\n"
         "Text: Simmer the onions until soft and golden.\nTopic: cooking\n\n"
         "Text: Our train to Lisbon was delayed by an hour.\nTopic: travel\n\n")
TEXTS = ["Heavy rain and strong winds are expected along the coast tonight.",
         "The home team scored twice in the last ten minutes to win the cup.",
         "Whisk the eggs with sugar until pale, then fold in the flour.",
         "The ferry to the island leaves every morning at nine."]


@rk.function
def topic(s, text):
    s += SHOTS
    s += f"Text: {text}\nTopic:"
    s += rk.select("label", choices=[" weather", " sports", " cooking", " travel"])


if __name__ == "__main__":
    rk.set_default_backend(rk.Runtime(log_level="warning"))
    for text, state in zip(TEXTS, topic.run_batch([{"text": t} for t in TEXTS])):
        meta = state.meta("label")
        print(f"{state['label'].strip():>8}  (log-likelihood {max(meta['scores'].values()):.2f}; "
              f"{min(meta['cached_tokens'])} of {meta['prompt_tokens']} prompt tokens from the cache)  {text}")
