"""Planning paged attention for `sdpa_paged`: which rows of a forward take which path.

Built once per forward (and window) from the request table and the batch's layout, on the
host, before any layer runs: extend spans with the prefix slots each reads, groups of spans
and decode rows that share a cached prefix (read once per step), short extend rows attended
together, and the padded gather of decode-shaped rows. `sdpa_paged` executes a plan in every
layer; see its docstring for why each path exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.attention.cpu_extend import ExtendRows

SHARED_MIN_SAVED_TOKENS = 1024
"""A shared prefix is read once when that saves reading at least this many KV tokens per layer
(below it, the extra kernel calls cost more than the bytes they save)."""
SHORT_NEW = 16  # extend rows of at most this many new tokens go through `short_rows` (two or more of them)


@dataclass(frozen=True)
class ExtendSpan:
    """One request with 2+ new tokens: where they sit in T and which prefix slots it reads."""

    start: int  # offset of its new tokens in T
    num_new: int
    prefix_slots: torch.Tensor | None  # (P,) int64 KV slots of the cached prefix; None if P == 0


@dataclass(frozen=True)
class SharedPrefix:
    """Decode rows reading the same cached prefix, attended once for all of them."""

    rows: torch.Tensor  # (n,) int64 indices into the decode rows
    slots: torch.Tensor  # (P,) int64 the prefix's KV slots


@dataclass(frozen=True)
class DecodeRows:
    """Single-token rows, attended together through one padded gather (of what follows each
    row's shared prefix, if it has one)."""

    rows: torch.Tensor  # (B,) int64 their positions in T
    slots: torch.Tensor  # (B * L,) int64 KV slots, row-major over (request, position); padding -> 0
    mask: torch.Tensor | None  # (B, 1, 1, L): bool, or additive float with shared prefixes; None: no padding
    max_len: int  # L
    all_rows: bool  # the rows are exactly 0..B-1 of T (a pure decode batch)
    first_slot: int | None  # one row whose slots are first_slot .. first_slot + L - 1: read in place
    shared: list[SharedPrefix]
    lens: torch.Tensor  # (B,) int64 how many of its L slots each row reads


@dataclass(frozen=True)
class SharedExtend:
    """Extend spans (indices into `SdpaPlan.spans`) whose prefixes start with the same slots,
    attended over those once for all of their new tokens."""

    spans: list[int]
    slots: torch.Tensor  # (P,) int64 the shared part of their prefixes


@dataclass(frozen=True)
class ShortRows:
    """Extend rows of a few new tokens each, attended in one padded call."""

    queries: torch.Tensor  # (B, N) positions in T of each row's new tokens (padding -> its first)
    valid: torch.Tensor  # (B, N) bool: a real new token
    slots: torch.Tensor  # (B * L,) KV slots of each row's whole sequence, padding -> 0
    mask: torch.Tensor  # (B, 1, N, L) bool: causal within the row, no padding
    max_len: int  # L


@dataclass(frozen=True)
class SdpaPlan:
    """Per-forward work shared by every layer: which rows take which path, gather indices."""

    spans: list[ExtendSpan]
    decode: DecodeRows | None
    shared_extends: tuple[SharedExtend, ...] = ()
    short: ShortRows | None = None
    short_spans: frozenset[int] = frozenset()  # indices into `spans` that `short` attends
    kernel_rows: ExtendRows | None = None  # for `cpu_extend`: every request but the shared groups'


def plan(
    req_to_token: torch.Tensor,  # (R, max_context) int32
    req_pool_indices: torch.Tensor,  # (B,)
    seq_lens: torch.Tensor,  # (B,) KV length after this forward
    prefix_lens: torch.Tensor,  # (B,)
    extend_start_loc: torch.Tensor,  # (B,)
    num_tokens: int,  # T
) -> SdpaPlan:
    rows, lens = req_pool_indices.tolist(), seq_lens.tolist()
    prefixes, starts = prefix_lens.tolist(), extend_start_loc.tolist()
    spans, dec, info, span_b = [], [], [], []
    for b, (row, seq_len, prefix_len, start) in enumerate(zip(rows, lens, prefixes, starts)):
        n = seq_len - prefix_len
        if n == 1:
            dec.append(b)
        elif n > 1:
            slots = req_to_token[row, :prefix_len].long() if prefix_len else None  # (P,)
            spans.append(ExtendSpan(start, n, slots))
            info.append((row, seq_len, prefix_len, start))
            span_b.append(b)
    shared, spans = _shared_extends(spans)
    grouped = {i for g in shared for i in g.spans}  # a shared prefix read once beats the short path
    short = [i for i, (_, n, p, _) in enumerate(info) if i not in grouped and p and n - p <= SHORT_NEW]
    if len(short) < 2:  # one row alone: the flash path
        short = []
    kernel = sorted([b for i, b in enumerate(span_b) if i not in grouped] + dec)
    return SdpaPlan(spans, _plan_decode(req_to_token, req_pool_indices, seq_lens,
                                        extend_start_loc, dec, num_tokens) if dec else None, tuple(shared),
                    _plan_short(req_to_token, [info[i] for i in short]) if short else None, frozenset(short),
                    _plan_kernel_rows(req_to_token, req_pool_indices, seq_lens, prefix_lens, extend_start_loc, kernel)
                    if spans and kernel else None)


def _plan_kernel_rows(req_to_token, req_pool_indices, seq_lens, prefix_lens, extend_start_loc,
                      batch_rows: list[int]) -> ExtendRows:
    """The `cpu_extend` kernel's view of these rows of the batch: slots, lengths, where their
    new tokens sit."""
    idx = torch.tensor(batch_rows, dtype=torch.int64, device=seq_lens.device)
    kv_len = seq_lens.index_select(0, idx).long()  # (B,)
    slots = req_to_token.index_select(0, req_pool_indices.index_select(0, idx))[:, :int(kv_len.max())].long()  # (B, L)
    return ExtendRows(slots.contiguous(), kv_len, extend_start_loc.index_select(0, idx).long(),
                      kv_len - prefix_lens.index_select(0, idx).long())


def _plan_short(req_to_token: torch.Tensor, short: list[tuple[int, int, int, int]]) -> ShortRows:
    """Gather indices and the causal mask of short extend rows: (row, seq_len, prefix_len, start) each."""
    dev = req_to_token.device
    rows = torch.tensor([r for r, _, _, _ in short], device=dev)
    lens = torch.tensor([n for _, n, _, _ in short], device=dev)  # (B,)
    prefix = torch.tensor([p for _, _, p, _ in short], device=dev)  # (B,)
    starts = torch.tensor([s for _, _, _, s in short], device=dev)  # (B,)
    new = lens - prefix  # (B,)
    max_len, max_new = int(lens.max()), int(new.max())
    i = torch.arange(max_new, device=dev)[None, :]  # (1, N)
    valid = i < new[:, None]  # (B, N)
    queries = starts[:, None] + torch.where(valid, i, 0)  # (B, N)
    kv_pos = torch.arange(max_len, device=dev)[None, :]  # (1, L)
    in_seq = kv_pos < lens[:, None]  # (B, L)
    slots = torch.where(in_seq, req_to_token.index_select(0, rows)[:, :max_len].long(), 0)  # (B, L)
    q_pos = prefix[:, None] + i  # (B, N) absolute position of each new token
    mask = (kv_pos[:, None, :] <= q_pos[:, :, None]) & in_seq[:, None, :]  # (B, N, L)
    return ShortRows(queries, valid, slots.reshape(-1), mask[:, None], max_len)


def _shared_extends(spans: list[ExtendSpan]) -> tuple[list[SharedExtend], list[ExtendSpan]]:
    """Groups of extend spans whose prefixes start on the same slot, and the spans with each
    member's prefix cut to what follows the group's shared part."""
    with_prefix = [i for i, s in enumerate(spans) if s.prefix_slots is not None]
    shared, spans = [], list(spans)
    for members in _same_first(with_prefix, [int(spans[i].prefix_slots[0]) for i in with_prefix]):
        common = min(spans[i].prefix_slots.shape[0] for i in members)
        block = torch.stack([spans[i].prefix_slots[:common] for i in members])  # (n, common)
        prefix = _common_run(block)
        if (len(members) - 1) * prefix < SHARED_MIN_SAVED_TOKENS:
            continue
        shared.append(SharedExtend(members, block[0, :prefix].clone()))
        for i in members:
            rest = spans[i].prefix_slots[prefix:]
            spans[i] = ExtendSpan(spans[i].start, spans[i].num_new, rest if rest.numel() else None)
    return shared, spans


def _plan_decode(req_to_token, req_pool_indices, seq_lens, extend_start_loc, dec, num_tokens) -> DecodeRows:
    idx = torch.tensor(dec, dtype=torch.int64, device=seq_lens.device)
    lens = seq_lens.index_select(0, idx).long()  # (B,)
    full_len = int(lens.max())
    slots = req_to_token.index_select(0, req_pool_indices.index_select(0, idx))[:, :full_len].long()  # (B, L)
    rows = extend_start_loc.index_select(0, idx).long()  # (B,)
    all_rows = len(dec) == num_tokens
    if len(dec) == 1 and (full_len == 1 or bool((slots[0, 1:] - slots[0, :-1] == 1).all())):
        # a lone sequence on consecutive slots needs no gather
        return DecodeRows(rows, slots.reshape(-1), None, full_len, all_rows, int(slots[0, 0]), [], lens)
    shared, offsets = _shared_prefixes(slots, lens)
    if shared:
        lens = lens - offsets  # what each row reads beyond its shared prefix
        max_len = int(lens.max())
        pos = offsets[:, None] + torch.arange(max_len, device=lens.device)[None, :]  # (B, L')
        slots = slots.gather(1, pos.clamp(max=full_len - 1))  # (B, L')
    else:
        max_len = full_len
    mask = None
    if int(lens.min()) != max_len:
        valid = torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]  # (B, L)
        slots = torch.where(valid, slots, 0)  # positions past a row's length read the padding slot
        mask = valid[:, None, None, :]  # (B, 1, 1, L)
    if shared:  # the flash kernel that returns log-sum-exps takes an additive float mask
        mask = None if mask is None else torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
    return DecodeRows(rows, slots.reshape(-1), mask, max_len, all_rows, None, shared, lens)


def _shared_prefixes(slots: torch.Tensor, lens: torch.Tensor) -> tuple[list[SharedPrefix], torch.Tensor]:
    """Groups of rows that start on the same slot, with the prefix they all share.

    slots: (B, L) each row's KV slots; lens: (B,). Returns the groups worth reading once and
    each row's offset past its group's prefix ((B,), 0 outside any group).
    """
    offsets = torch.zeros_like(lens)
    shared = []
    for members in _same_first(range(slots.shape[0]), slots[:, 0].tolist()):
        ix = torch.tensor(members, dtype=torch.int64, device=slots.device)
        common = int(lens.index_select(0, ix).min()) - 1  # a row's newest token is its own
        block = slots.index_select(0, ix)[:, :common]  # (n, common)
        prefix = _common_run(block)
        if (len(members) - 1) * prefix >= SHARED_MIN_SAVED_TOKENS:
            shared.append(SharedPrefix(ix, block[0, :prefix].clone()))
            offsets[ix] = prefix
    return shared, offsets


def _same_first(items, firsts: list[int]) -> list[list[int]]:
    """`items` grouped by their first KV slot, groups of two or more only."""
    groups: dict[int, list[int]] = {}
    for item, first in zip(items, firsts):
        groups.setdefault(first, []).append(item)
    return [members for members in groups.values() if len(members) > 1]


def _common_run(block: torch.Tensor) -> int:
    """How many leading columns of block (n, L) are equal in every row."""
    same = (block == block[:1]).all(0)  # (L,)
    return block.shape[1] if bool(same.all()) else int(same.to(torch.int8).argmin())
