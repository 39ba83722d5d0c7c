"""Tensor parallelism: one model split over N processes (ranks) joined by torch.distributed.

    shard.py     which slice of every weight a rank holds, and the tp_size check
    group.py     the collectives (all-reduce, all-gather) and rank 0's broadcast channel
    messages.py  what rank 0 sends: TPStart, TPForward (batch + KV journal), TPStop
    journal.py   rank 0's record of KV-memory changes the other ranks replay
    ranks.py     rank 0's side: start ranks 1..N-1, send each forward, stop them
    worker.py    ranks 1..N-1: load a shard, mirror rank 0's KV memory, run its forwards

The scheduler (and its radix cache) lives on rank 0 only; the other ranks hold their share of
every KV page at the same slot ids, kept identical by replaying rank 0's journal.
"""
