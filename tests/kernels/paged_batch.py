"""Random paged KV batches for kernel tests: scattered pages, garbage everywhere else."""

from dataclasses import dataclass

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(slots=True)
class PagedBatch:
    k_buffer: torch.Tensor  # (num_slots, H_kv, D)
    v_buffer: torch.Tensor  # (num_slots, H_kv, D)
    req_to_token: torch.Tensor  # (max_reqs, max_context_len) int32
    req_pool_indices: torch.Tensor  # (B,) int64
    seq_lens: torch.Tensor  # (B,) int32
    prefix_lens: torch.Tensor  # (B,) int32
    extend_start_loc: torch.Tensor  # (B,) int32
    out_cache_loc: torch.Tensor  # (T,) int64 slots of the new tokens
    max_extend_len: int

    def extend_args(self) -> tuple:
        """Arguments of `extend_attention` after `q`, up to `max_extend_len`."""
        return (self.k_buffer, self.v_buffer, self.req_to_token, self.req_pool_indices,
                self.seq_lens, self.prefix_lens, self.extend_start_loc, self.max_extend_len)

    def decode_args(self) -> tuple:
        """Arguments of `decode_attention` after `q`, up to `seq_lens`."""
        return (self.k_buffer, self.v_buffer, self.req_to_token, self.req_pool_indices,
                self.seq_lens)


def make_paged_batch(
    seq_lens: list[int],
    prefix_lens: list[int],
    *,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> PagedBatch:
    """A batch whose requests own shuffled, non-contiguous pages of a random KV pool.

    Every other slot, every unused req_to_token entry and every unused req_to_token row holds
    random (in-range) data, so a kernel that reads outside a request's range gets wrong values
    instead of zeros. Page 0 is the padding sink and is never handed out.
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_req) + 3  # a few pages no request owns
    num_slots = (num_pages + 1) * page_size
    max_context_len = max(seq_lens) + 5
    num_rows = len(seq_lens) + 2
    k_pages = torch.randn(num_pages + 1, page_size, num_kv_heads, head_dim, generator=gen)
    v_pages = torch.randn(num_pages + 1, page_size, num_kv_heads, head_dim, generator=gen)
    req_to_token = torch.randint(0, num_slots, (num_rows, max_context_len), generator=gen,
                                 dtype=torch.int32)  # (max_reqs, max_context_len)
    rows = torch.randperm(num_rows, generator=gen)[: len(seq_lens)]  # (B,)
    free_pages = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    out_cache_loc = []
    for row, seq_len, prefix_len, n_pages in zip(rows.tolist(), seq_lens, prefix_lens, pages_per_req):
        pages = torch.tensor([free_pages.pop() for _ in range(n_pages)])  # (n_pages,)
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:seq_len]  # (L,)
        req_to_token[row, :seq_len] = slots.int()
        out_cache_loc.append(slots[prefix_len:])
    extend_lens = torch.tensor(seq_lens) - torch.tensor(prefix_lens)  # (B,)
    return PagedBatch(
        k_buffer=k_pages.to(DEVICE, dtype).view(num_slots, num_kv_heads, head_dim),
        v_buffer=v_pages.to(DEVICE, dtype).view(num_slots, num_kv_heads, head_dim),
        req_to_token=req_to_token.to(DEVICE),
        req_pool_indices=rows.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=DEVICE),
        extend_start_loc=(extend_lens.cumsum(0) - extend_lens).to(DEVICE, torch.int32),
        out_cache_loc=torch.cat(out_cache_loc).to(DEVICE),
        max_extend_len=int(extend_lens.max()),
    )


def randn(*shape: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """Seeded standard-normal tensor on the test device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


# Max |kernel - reference| per dtype. fp32: both accumulate in fp32, differences are rounding
# (~1e-6), 1e-4 leaves room for GPU reduction order. fp16/bf16: outputs are rounded to the
# dtype (ulp 2**-10 / 2**-7 near 1) and compiled kernels round P to it before the PV dot.
ATOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}
RTOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL[expected.dtype], rtol=RTOL[expected.dtype])
