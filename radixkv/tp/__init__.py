"""Tensor parallelism: one model split over N processes (ranks) joined by torch.distributed.

    launch.py    `load_runner`: a ModelRunner, on one rank or as rank 0 of N
    ranks.py     rank 0's side: start ranks 1..N-1, send each forward, stop them
    worker.py    ranks 1..N-1: load a shard, mirror rank 0's KV memory, run its forwards
    messages.py  what rank 0 sends: TPStart, TPForward (batch + KV journal), TPStop
    journal.py   rank 0's record of KV-memory changes the other ranks replay

The scheduler (and its radix cache) lives on rank 0 only; the other ranks hold their share of
every KV page at the same slot ids, kept identical by replaying rank 0's journal. The pieces the
model itself is built from (shards, collectives) are in `radixkv.parallel`.
"""
