"""`run_batch` over a shared few-shot prefix: the examples are computed once, every program of
the batch reads them from the cache.

    python examples/dsl_few_shot_batch.py
"""

import radixkv as rk

FEW_SHOT = """Classify the sentiment of each review as positive or negative.

Review: The keeper's cottage was warm and the view was stunning.
Sentiment: positive

Review: The stairs were broken and the guide never showed up.
Sentiment: negative

Review: A wonderful afternoon by the sea, we will come back.
Sentiment: positive

"""

REVIEWS = ["The lantern room was closed and the cafe was cold.", "Breathtaking sunset from the gallery!",
           "Too crowded, too expensive, too windy.", "Our children loved the museum of lenses.",
           "The tour was short but the staff were lovely.", "Nothing to see, a waste of a day.",
           "Beautiful walk along the cliffs to the tower.", "The parking was full and the road was flooded."]


@rk.function
def classify(s, review):
    s += FEW_SHOT
    s += f"Review: {review}\nSentiment:"
    s += rk.gen("sentiment", max_tokens=3, stop=["\n"])


if __name__ == "__main__":
    rk.set_default_backend(rk.Runtime(log_level="warning"))
    states = classify.run_batch([{"review": r} for r in REVIEWS], num_threads=8, progress_bar=True)
    cached = prompt = 0
    for review, state in zip(REVIEWS, states):
        meta = state.meta("sentiment")
        cached, prompt = cached + meta["cached_tokens"], prompt + meta["prompt_tokens"]
        print(f"{state['sentiment'].strip():>9}  {review}  [{meta['cached_tokens']}/{meta['prompt_tokens']} cached]")
    print(f"batch: {cached} of {prompt} prompt tokens from the cache ({cached / prompt:.0%})")
