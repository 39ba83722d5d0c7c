"""The model split over two ranks computes the logits of the whole model.

Each rank is a spawned process running the model directly over a real gloo group (the
collectives and the sharded loader are what is tested here; `test_tp_engine.py` runs the whole
engine)."""

import multiprocessing
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from radixkv.attention import ForwardBatch, ForwardMode, make_backend
from radixkv.mem.kv_memory import KVMemory
from radixkv.mem.kv_pool import KVLayout
from radixkv.model.loader import load_model
from radixkv.parallel.group import SingleRank, TPGroup
from radixkv.parallel.shard import TPShard

PROMPTS = [[1, 17, 42, 300, 5, 9, 250], [1, 400, 401, 402], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def run(model_dir, shard: TPShard, comm) -> list[torch.Tensor]:
    """Logits of a prefill of PROMPTS, then of two decode steps, on this rank."""
    model = load_model(model_dir, progress=False, shard=shard, comm=comm)
    mc = model.config
    layout = KVLayout(mc.num_layers, shard.local(mc.num_kv_heads), mc.head_dim, 1, torch.float32)
    memory = KVMemory(layout, 256, max_reqs=4, max_context_len=64)
    backend = make_backend("torch", memory.pool, memory.req_table.table)
    lens = [len(p) for p in PROMPTS]
    slots = torch.arange(1, 1 + sum(lens) + 2 * len(PROMPTS))
    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    for row, (s, n) in enumerate(zip(starts, lens)):
        memory.req_table.write(row, 0, slots[s:s + n])
    fb = ForwardBatch.build(ForwardMode.EXTEND, PROMPTS, [0, 1, 2], [0, 0, 0], slots[:sum(lens)])
    out = [model(fb, backend)]
    next_slot = sum(lens)
    for step in range(2):
        tokens = [[int(t)] for t in out[-1].argmax(-1)]
        new = slots[next_slot:next_slot + len(PROMPTS)]
        next_slot += len(PROMPTS)
        for row, slot in enumerate(new):
            memory.req_table.write(row, lens[row] + step, [int(slot)])
        fb = ForwardBatch.build(ForwardMode.DECODE, tokens, [0, 1, 2], [n + step for n in lens], new)
        out.append(model(fb, backend))
    return out


def rank(r: int, port: int, model_dirs: list) -> list[tuple[list[torch.Tensor], dict]]:
    """Rank r's logits and collective counts for each model, in one group."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
    out = []
    for i, model_dir in enumerate(model_dirs):
        group = TPGroup(dist.PrefixStore(str(i), store), r, 2, torch.device("cpu"))
        out.append((run(model_dir, TPShard(r, 2), group), group.stats.to_dict()))
    return out


# llama-tp runs as a whole engine in test_tp_engine.py; these add q/k/v bias, a tied and padded
# vocabulary (qwen2-tp-tied) and sliding-window layers (mistral-window)
MODELS = ["qwen2-tp-tied", "mistral-window"]


@pytest.fixture(scope="module")
def split_runs(tiny_model_dir):
    """Per model: (rank 0's results, rank 1's results), from one pair of spawned ranks."""
    dirs = [tiny_model_dir(name) for name in MODELS]
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        rank0, rank1 = pool.starmap(rank, [(0, store.port, dirs), (1, store.port, dirs)])
    return dict(zip(MODELS, zip(rank0, rank1)))


@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_compute_the_logits_of_the_whole_model(tiny_model_dir, split_runs, name):
    whole = run(tiny_model_dir(name), TPShard(), comm=SingleRank())
    (split, stats), (split1, _) = split_runs[name]
    for a, b, c in zip(whole, split, split1):
        assert a.shape == b.shape  # (N, V): the padded vocabulary rows are cut off
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4)
        assert torch.equal(b, c)  # every rank gathers the same logits
    # one all-reduce for the embedding, one after attention and one after the MLP of each layer
    assert stats["tp_all_reduces"] == 3 * (1 + 2 * 2) and stats["tp_all_gathers"] == 3
