"""Shared by the readers of streamed output (tool calls, reasoning): how much of a text's end
may be the start of a marker, and so must be held back until the next text settles it."""


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
