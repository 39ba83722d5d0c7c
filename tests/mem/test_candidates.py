"""EvictionCandidates on its own: unretained leaves first by the policy, retained ones after them
by deadline, and flags that went stale are re-ranked by `expire`."""

from radixkv.mem.candidates import EvictionCandidates
from radixkv.mem.eviction import make_policy
from radixkv.mem.tree_node import NOT_RETAINED, TreeNode
from tests.mem.conftest import FakeClock


def leaf(last_access: int, retain_until: float = 0.0) -> TreeNode:
    node = TreeNode((1, 2), [7, 8], None, last_access)
    node.last_access, node.retain_until = last_access, retain_until
    return node


def test_unretained_leaves_go_first_then_the_earliest_deadline():
    clock = FakeClock(0.0)
    queue = EvictionCandidates(make_policy("lru"), clock)
    late, early, old, new = leaf(1, 50.0), leaf(2, 20.0), leaf(3), leaf(4)
    for node in (late, early, new, old):
        queue.add(node)
    assert [entry[2] for entry in queue] == [old, new, early, late]
    assert queue.pop_lowest() is old and old.candidate is None and len(queue) == 3
    queue.drop(new)
    assert queue.lowest() is early and new.candidate is None


def test_expire_reranks_deadlines_that_passed_and_reads_the_clock_only_when_flags_exist():
    clock = FakeClock(0.0)
    reads = []
    queue = EvictionCandidates(make_policy("lru"), lambda: reads.append(1) or clock())
    plain = leaf(5)
    queue.add(plain, now=0.0)
    assert queue.expire() is None and not reads  # nothing flagged: no clock read
    kept = leaf(1, 30.0)
    queue.add(kept, now=0.0)
    assert queue.lowest() is plain
    clock.advance(31.0)
    assert queue.expire() == 31.0
    assert kept.candidate[0][0] == NOT_RETAINED and queue.lowest() is kept  # now LRU's oldest
