"""Command-line pieces the trace-replay benchmarks share: the trace and its replay settings."""

from __future__ import annotations

import argparse
from pathlib import Path

TRACE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"


def number_list(kind, positive: bool = False, allow_empty: bool = False):
    """An argparse type: comma-separated numbers of `kind`, each > 0 (`positive`) or >= 0."""
    def parse(text: str) -> list:
        try:
            values = [kind(float(x)) if kind is int else kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
        if (not values and not allow_empty) or any(v <= 0 if positive else v < 0 for v in values):
            raise argparse.ArgumentTypeError(f"give {'positive' if positive else 'non-negative'} numbers: {text!r}")
        return values
    return parse


def add_replay_args(p: argparse.ArgumentParser, capacities: list[int]) -> None:
    """--trace, --limit, --page-size, --capacity-tokens (checked by `check_replay_args`)."""
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first K requests")
    p.add_argument("--page-size", type=int, default=512, help="tokens per page (default 512)")
    p.add_argument("--capacity-tokens", type=number_list(int, positive=True), default=capacities,
                   help=f"device capacities in tokens (default {','.join(map(str, capacities))})")


def check_replay_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.trace.is_file():
        p.error(f"--trace: no such file: {args.trace}")
    if args.page_size < 1 or min(args.capacity_tokens) < args.page_size:
        p.error("--page-size must be >= 1 and every --capacity-tokens at least one page")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
