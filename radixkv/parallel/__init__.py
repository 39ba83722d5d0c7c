"""Tensor-parallel primitives the model code is built from (the layer below the model):

    shard.py     which slice of every weight a rank holds
    group.py     the collectives (all-reduce, all-gather) and rank 0's broadcast channel
    devices.py   which device and how many threads a rank computes on

How ranks are started, fed and stopped sits above the model runner, in `radixkv.tp`.
"""
