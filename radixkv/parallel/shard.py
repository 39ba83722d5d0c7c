"""Which slice of the model one tensor-parallel rank holds.

Megatron-style splitting, the one SGLang and vLLM use for Llama-family models:

- attention: rank r holds query heads `[r * Hq/N, (r+1) * Hq/N)` and the KV heads they read,
  `[r * Hkv/N, (r+1) * Hkv/N)` (column-parallel q/k/v), and the matching input columns of
  `o_proj` (row-parallel); its KV pool holds only its own KV heads;
- MLP: rows `[r * I/N, (r+1) * I/N)` of gate and up (column-parallel), the same columns of down
  (row-parallel);
- vocabulary: rows `[r * Vp, (r+1) * Vp)` of the embedding and the output layer, `Vp = ceil(V/N)`;
  the last rank's slice is zero-padded so every rank's logits have the same width.

A row-parallel output is a partial sum: one all-reduce after attention and one after the MLP
complete each layer. Norms and rotary tables are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True, slots=True)
class TPShard:
    """Rank `rank` of `size` tensor-parallel ranks (the default: the whole model, one rank)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is not in [0, {self.size})")

    def part(self, n: int) -> slice:
        """This rank's contiguous 1/size of `n` (which `size` divides)."""
        assert n % self.size == 0, f"{n} does not split over {self.size} ranks"
        k = n // self.size
        return slice(self.rank * k, (self.rank + 1) * k)

    def local(self, n: int) -> int:
        """How many of `n` this rank holds."""
        return self.part(n).stop - self.part(n).start

    def vocab_rows(self, vocab_size: int) -> tuple[int, int, int]:
        """(first, stop, padded): this rank's vocabulary rows `[first, stop)`, and the padded
        per-rank width `ceil(V / size)` every rank allocates."""
        padded = -(-vocab_size // self.size)
        first = min(self.rank * padded, vocab_size)
        return first, min(first + padded, vocab_size), padded
