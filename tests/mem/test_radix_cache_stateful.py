"""Random insert/match/lock/unlock/evict sequences against a naive reference.

The reference is a dict of every cached page-aligned prefix (per namespace) to the page id that
stores its last page, and one of each prefix's retention deadline (finished requests carry
random retention hints; the clock moves). After every step the cache's own invariants must
hold, including the page balance `free + cached + in-flight == total`, and no eviction may take
a retained page while an unretained unlocked leaf is left.
"""

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv.mem import POLICIES, BeladyPolicy, PageAllocator, RadixCache, SeqPages
from radixkv.mem.tree_node import NOT_RETAINED
from radixkv.retention import WHOLE, Retention
from tests.mem.conftest import FakeClock

NUM_PAGES = 12
keys = st.lists(st.integers(0, 3), min_size=0, max_size=14)
namespaces = st.sampled_from([None, "ns-a"])
retentions = st.none() | st.builds(
    lambda spans: Retention(tuple(spans)),
    st.lists(st.tuples(st.sampled_from([WHOLE, 0, 1, 2, 3, 5, 8]), st.sampled_from([0.0, 2.0, 5.0, 30.0])),
             min_size=1, max_size=2))


def tree_prefixes(cache):
    """{(namespace, prefix): page id of the prefix's last page} as stored in the tree."""
    out = {}
    size = cache.page_size

    def walk(node, ns, prefix):
        for ck, child in node.children.items():
            child_ns = ck[0] if node is cache.root else ns
            for i, page in enumerate(child.pages):
                out[(child_ns, prefix + child.key[: (i + 1) * size])] = page
            walk(child, child_ns, prefix + child.key)

    walk(cache.root, None, ())
    return out


def tree_deadlines(cache):
    """{(namespace, prefix): retain_until of the node holding the prefix's last page}, over
    device and host pages alike."""
    out = {}
    size = cache.page_size

    def walk(node, ns, prefix):
        for ck, child in node.children.items():
            child_ns = ck[0] if node is cache.root else ns
            for end in range(size, len(child.key) + 1, size):
                out[(child_ns, prefix + child.key[:end])] = child.retain_until
            walk(child, child_ns, prefix + child.key)

    walk(cache.root, None, ())
    return out


class CacheMachine(RuleBasedStateMachine):
    policy = "lru"

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size):
        self.size = page_size
        policy = self.policy
        if policy == "belady-synthetic":  # exercises page-granular eviction with a fake future
            policy = BeladyPolicy(lambda node, end: float((node.depth + end) * 7919 % 13))
        self.clock = FakeClock()
        self.cache = RadixCache(PageAllocator(NUM_PAGES, page_size), policy, clock=self.clock)
        self.ref: dict = {}  # (ns, prefix) -> page
        self.until: dict = {}  # (ns, prefix) -> retention deadline (absent: 0.0)
        self.running: list = []  # (key, ns, seq, last_node)
        self.peeked: list = []  # (key, ns, match) of peeks a scheduler has not acted on yet

    # -- the reference ---------------------------------------------------------------------
    def expected_match(self, key, ns):
        n, pages = 0, []
        while n + self.size <= len(key) and (ns, tuple(key[: n + self.size])) in self.ref:
            n += self.size
            pages.append(self.ref[(ns, tuple(key[:n]))])
        return n, pages

    def check_match(self, key, ns):
        m = self.cache.match_prefix(key, ns)
        assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        return m

    def locked_prefixes(self):
        out = set()
        for key, ns, seq, node in self.running:
            depth = 0
            while node is not None and node is not self.cache.root:
                depth += len(node.key)
                node = node.parent
            for n in range(self.size, depth + 1, self.size):
                out.add((ns, tuple(key[:n])))
        return out

    # -- rules -----------------------------------------------------------------------------
    @rule(key=keys, ns=namespaces)
    def match(self, key, ns):
        self.check_match(key, ns)

    @rule(key=keys, ns=namespaces)
    def start_request(self, key, ns):
        self.admit(key, ns, self.check_match(key, ns))

    @precondition(lambda self: self.ref)
    @rule(data=st.data())
    def match_inside(self, data):
        """A match ending a page before a cached prefix does: inside its edge, if it is longer
        (the split keeps both parts' statistics and retention)."""
        ns, prefix = data.draw(st.sampled_from(sorted(self.ref, key=repr)))
        self.check_match(list(prefix[: -self.size]) + [9] * self.size, ns)

    def admit(self, key, ns, m):
        self.cache.lock(m.last_node)
        seq = SeqPages.from_prefix(self.cache.allocator, m.pages, m.num_tokens)
        need = seq.pages_needed(len(key) - m.num_tokens)
        alloc = self.cache.allocator
        if alloc.free_pages < need:
            self.evict_checked((need - alloc.free_pages) * self.size)
            if alloc.free_pages < need:  # only when everything evictable is gone
                assert self.cache.evictable_tokens == 0
                self.cache.unlock(m.last_node)
                seq.release()
                self.sync_after_eviction()
                return False
            self.sync_after_eviction()
        seq.extend(len(key) - m.num_tokens)
        self.running.append((key, ns, seq, m.last_node))
        return True

    def expected_host_tokens(self, key, ns, device_tokens):
        return 0

    def snapshot(self):
        return (tree_prefixes(self.cache), self.cache.num_candidates, sum(1 for _ in self.cache.nodes()),
                [(n.last_access, n.hit_count) for n in self.cache.nodes()])

    @rule(key=keys, ns=namespaces)
    def peek(self, key, ns):
        """The scheduling policy's look: the right answer, and nothing in the tree moves."""
        before = self.snapshot()
        m = self.cache.peek(key, ns)
        assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        assert m.host_tokens == self.expected_host_tokens(key, ns, m.num_tokens)
        assert self.snapshot() == before, "a peek changed the tree"
        self.peeked.append((key, ns, m))

    @precondition(lambda self: self.peeked)
    @rule(data=st.data())
    def admit_peeked(self, data):
        """Admission acting on a peek made earlier: evictions, inserts, splits and resets may
        have happened since, and settling must still give the current match."""
        key, ns, m = self.peeked.pop(data.draw(st.integers(0, len(self.peeked) - 1)))
        if m.host_tokens or self.expected_host_tokens(key, ns, self.expected_match(key, ns)[0]):
            m = self.cache.load_back(m)
            self.sync_after_eviction()
        m = self.cache.settle(m)
        assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        assert m.last_node is self.cache.root or m.last_node.end == m.num_tokens, "settled inside an edge"
        if self.admit(key, ns, m):
            self.cache.record_use(m)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), retention=retentions)
    def finish_request(self, data, retention):
        self.finish(data.draw(st.integers(0, len(self.running) - 1)), retention)

    def finish(self, i, retention):
        key, ns, seq, node = self.running.pop(i)
        before = self.expected_match(key, ns)[0]
        n = len(key) - len(key) % self.size
        pages = list(seq.pages)
        self.cache.cache_finished(key, seq, node, ns, retention)
        for end in range(before + self.size, n + 1, self.size):
            self.ref[(ns, tuple(key[:end]))] = pages[end // self.size - 1]
        self.expect_retained(key, ns, retention)
        assert seq.num_tokens == 0

    def expect_retained(self, key, ns, retention):
        """The reference of what `retention` does to the just-cached `key`: each span's whole
        pages are kept until now + its seconds, if that is later than before."""
        if retention is None:
            return
        n = len(key) - len(key) % self.size
        for end, seconds in retention.ends(n):
            for j in range(self.size, end - end % self.size + 1, self.size):
                prefix = (ns, tuple(key[:j]))
                self.until[prefix] = max(self.until.get(prefix, 0.0), self.clock.now + seconds)

    @rule(key=keys, ns=namespaces, retention=retentions)
    def serve_retained(self, key, ns, retention):
        """A whole request at once (admitted, computed, finished) carrying a retention hint."""
        running = len(self.running)
        self.start_request(key, ns)
        if len(self.running) > running:
            self.finish(running, retention)

    @rule(seconds=st.sampled_from([1.0, 3.0, 10.0, 40.0]))
    def advance_clock(self, seconds):
        self.clock.advance(seconds)

    def evict_checked(self, num_tokens):
        """`cache.evict`, checking that a retained page went only once no unretained unlocked
        leaf was left (and none is left after: a retained leaf's parent is retained too)."""
        now = self.clock.now
        device = tree_prefixes(self.cache)
        retained = {p for p, until in tree_deadlines(self.cache).items() if until > now and p in device}
        freed = self.cache.evict(num_tokens)
        if num_tokens:  # an eviction re-ranks first every candidate whose retention ran out
            assert all(hold == NOT_RETAINED or hold > now for (hold, _), _, _ in self.cache.candidates)
        if retained - set(tree_prefixes(self.cache)):
            left = [n for n in self.cache.nodes() if n.on_device and n.lock_ref == 0
                    and self.cache._is_device_leaf(n) and n.retain_until <= now]
            assert not left, "a retained page was evicted while an unretained leaf was left"
        return freed

    @rule(num_tokens=st.integers(0, 3 * NUM_PAGES))
    def evict(self, num_tokens):
        evictable = self.cache.evictable_tokens
        freed = self.evict_checked(num_tokens)
        assert freed >= min(num_tokens, evictable) or self.cache.evictable_tokens == 0
        if freed < num_tokens:
            assert self.cache.evictable_tokens == 0
        self.sync_after_eviction()

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self):
        self.cache.reset()
        self.ref.clear()
        self.until.clear()
        assert self.cache.allocator.free_pages == NUM_PAGES

    def sync_after_eviction(self):
        now = tree_prefixes(self.cache)
        assert set(now.items()) <= set(self.ref.items()), "eviction invented a prefix"
        assert self.locked_prefixes() <= set(now), "a locked prefix was evicted"
        self.ref = now
        self.until = {p: u for p, u in self.until.items() if p in now}  # gone: a new copy starts unretained

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        assert tree_prefixes(self.cache) == self.ref
        tree_pages = set(self.ref.values())
        inflight = set()
        for _, _, seq, _ in self.running:
            inflight.update(p for p in seq.pages if p not in tree_pages)
        self.cache.check_invariants(inflight_pages=len(inflight))
        locked = len(self.locked_prefixes()) * self.size
        assert self.cache.protected_tokens == locked
        assert self.cache.evictable_tokens == len(self.ref) * self.size - locked
        deadlines = tree_deadlines(self.cache)
        assert deadlines == {p: self.until.get(p, 0.0) for p in deadlines}


@pytest.mark.parametrize("policy", [*sorted(POLICIES), "belady-synthetic"])
def test_radix_cache_matches_naive_reference(policy):
    machine = type(f"CacheMachine_{policy}", (CacheMachine,), {"policy": policy})
    machine.TestCase.settings = settings(
        max_examples=60, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()


# -- with a host tier ------------------------------------------------------------------------------
HOST_PAGES = 8


class LabelledHostTier:
    """A host tier whose "bytes" are labels: device and host pages carry the prefix they store,
    and save/load move labels, so the test sees exactly what data went where."""

    def __new__(cls, page_size, write_policy):
        from radixkv.mem.host_tier import HostTier, HostTierConfig

        class _Tier(HostTier):
            def __init__(self):
                super().__init__(HostTierConfig(HOST_PAGES, page_size, write_policy))
                self.device: dict[int, tuple] = {}
                self.host: dict[int, tuple] = {}

            def save(self, device_pages, host_pages):
                super().save(device_pages, host_pages)
                for d, h in zip(device_pages, host_pages):
                    self.host[h] = self.device[d]

            def load(self, host_pages, device_pages):
                super().load(host_pages, device_pages)
                for h, d in zip(host_pages, device_pages):
                    self.device[d] = self.host[h]

        return _Tier()


def host_prefixes(cache):
    """{(namespace, prefix): host page} of host-only nodes."""
    out = {}
    size = cache.page_size

    def walk(node, ns, prefix):
        for ck, child in node.children.items():
            child_ns = ck[0] if node is cache.root else ns
            if not child.on_device:
                for i, page in enumerate(child.host_pages):
                    out[(child_ns, prefix + child.key[: (i + 1) * size])] = page
            walk(child, child_ns, prefix + child.key)

    walk(cache.root, None, ())
    return out


class HostCacheMachine(CacheMachine):
    """The same rules with a host tier: evicted prefixes move one tier down, requests load them
    back; the reference tracks which prefixes live on which tier and what each page holds."""

    @initialize(page_size=st.sampled_from([1, 2]), write_policy=st.sampled_from(["write-back", "write-through"]))
    def setup(self, page_size, write_policy):
        self.size = page_size
        self.tier = LabelledHostTier(page_size, write_policy)
        self.clock = FakeClock()
        self.cache = RadixCache(PageAllocator(NUM_PAGES, page_size), "lru", host_tier=self.tier,
                                     clock=self.clock)
        self.ref, self.host_ref, self.running, self.history, self.peeked = {}, {}, [], [], []
        self.until = {}

    def check_match(self, key, ns):
        m = self.cache.match_prefix(key, ns)
        assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        assert m.host_tokens == self.expected_host_tokens(key, ns, m.num_tokens)
        return m

    def expected_host_tokens(self, key, ns, device_tokens):
        h = device_tokens
        while h + self.size <= len(key) and (ns, tuple(key[: h + self.size])) in self.host_ref:
            h += self.size
        return h - device_tokens

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def start_again(self, data):
        """A request for a prompt seen before (a conversation's next turn): its prefix is
        likely on the host by now."""
        self.start_request(*data.draw(st.sampled_from(self.history)))

    @rule(key=keys, ns=namespaces)
    def start_request(self, key, ns):
        self.history.append((key, ns))
        m = self.check_match(key, ns)
        if m.host_tokens:
            m = self.cache.load_back(m, key, ns)
            self.sync_after_eviction()
            assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        self.admit(key, ns, m)

    def admit(self, key, ns, m):
        self.cache.lock(m.last_node)
        seq = SeqPages.from_prefix(self.cache.allocator, m.pages, m.num_tokens)
        need = seq.pages_needed(len(key) - m.num_tokens)
        alloc = self.cache.allocator
        if alloc.free_pages < need:
            self.evict_checked((need - alloc.free_pages) * self.size)
            self.sync_after_eviction()
            if alloc.free_pages < need:
                self.cache.unlock(m.last_node)
                seq.release()
                return False
        seq.extend(len(key) - m.num_tokens)
        for end in range(m.num_tokens + self.size, len(key) + 1, self.size):  # "compute" the new pages
            self.tier.device[seq.pages[end // self.size - 1]] = (ns, tuple(key[:end]))
        self.running.append((key, ns, seq, m.last_node))
        return True

    def finish(self, i, retention):
        key, ns, seq, node = self.running.pop(i)
        self.cache.cache_finished(key, seq, node, ns, retention)
        self.expect_retained(key, ns, retention)
        self.sync_after_eviction()  # inserting may revive host-only prefixes and write through

    def sync_after_eviction(self):
        device, host = tree_prefixes(self.cache), host_prefixes(self.cache)
        assert not set(device) & set(host), "a prefix is both device-resident and host-only"
        assert self.locked_prefixes() <= set(device), "a locked prefix left the device"
        self.ref, self.host_ref = device, host
        self.until = {p: u for p, u in self.until.items() if p in device or p in host}
        self.seen["loaded"] += self.cache.stats_host_loaded_tokens
        self.seen["host_evicted"] += self.cache.stats_host_evicted_tokens
        self.seen["saved"] += self.tier.saved_tokens

    seen = {"loaded": 0, "host_evicted": 0, "saved": 0}

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self):
        self.cache.reset()
        self.ref.clear()
        self.host_ref.clear()
        self.until.clear()
        assert self.cache.allocator.free_pages == NUM_PAGES
        assert self.tier.allocator.free_pages == HOST_PAGES

    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        assert tree_prefixes(self.cache) == self.ref and host_prefixes(self.cache) == self.host_ref
        tree_pages = set(self.ref.values())
        inflight = set()
        for _, _, seq, _ in self.running:
            inflight.update(p for p in seq.pages if p not in tree_pages)
        self.cache.check_invariants(inflight_pages=len(inflight))
        for prefix, page in self.ref.items():  # every page holds the KV of the prefix it stands for
            assert self.tier.device[page] == prefix
        for prefix, page in self.host_ref.items():
            assert self.tier.host[page] == prefix
        locked = len(self.locked_prefixes()) * self.size
        assert self.cache.protected_tokens == locked
        assert self.cache.evictable_tokens == len(self.ref) * self.size - locked
        deadlines = tree_deadlines(self.cache)
        assert deadlines == {p: self.until.get(p, 0.0) for p in deadlines}


def test_radix_cache_with_host_tier_matches_naive_reference():
    HostCacheMachine.TestCase.settings = settings(
        max_examples=150, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    HostCacheMachine.TestCase().runTest()
    assert all(HostCacheMachine.seen.values()), HostCacheMachine.seen  # every host-tier path ran


# -- with a host tier and a storage tier under it --------------------------------------------------
STORAGE_PAGES = 10


class LabelledTiers:
    """A host tier and a storage tier whose "bytes" are labels (see `LabelledHostTier`): pages
    written to storage keep the label of the host or device page they came from, reads return
    it, and installing puts it on the host page."""

    def __new__(cls, page_size, write_policy, per_block=1):
        from radixkv.mem.storage_tier import StorageTier, StorageTierConfig

        host = LabelledHostTier(page_size, "write-back")
        host.rows = lambda pages: [host.host[p] for p in pages]
        host.device_rows = lambda pages: [host.device[p] for p in pages]

        def join_blocks(parts, k):  # a stored page: the labels of its device pages
            assert k == per_block
            flat = [label for part in parts for label in part]
            assert len(flat) % k == 0
            return [tuple(flat[i:i + k]) for i in range(0, len(flat), k)]

        def put_blocks(pages, blocks, skip):
            flat = [label for block in blocks for label in block][skip:]
            assert len(flat) >= len(pages)
            for p, label in zip(pages, flat):
                host.host[p] = label
        host.join_blocks, host.put_blocks = join_blocks, put_blocks

        class _Storage(StorageTier):
            def __init__(self):
                super().__init__(StorageTierConfig(STORAGE_PAGES, page_size * per_block, write_policy,
                                                   hit_threshold=2))
                self.labels: dict[bytes, tuple] = {}

            def _store(self, keys, rows, picked, wait=False):
                for key, i in zip(keys, picked):
                    self.labels[key] = rows[i]
                return super()._store(keys, rows, picked, wait)

            def _delete(self, run):
                for key in run.keys:
                    self.labels.pop(key, None)

            def fetch(self, keys):
                fetch = super().fetch(keys)
                fetch.pages = [self.labels[k] for k in fetch.keys[: fetch.arrived]]
                return fetch

        return host, _Storage()


class StorageCacheMachine(HostCacheMachine):
    """The host machine's rules over three tiers: what the host tier lets go is written to
    storage, requests read it back through the host tier; the reference knows which prefixes
    storage holds, and every page read back holds the KV of the prefix it stands for."""

    @initialize(page_size=st.sampled_from([1, 2]), per_block=st.sampled_from([1, 2, 3]),
                write_policy=st.sampled_from(["write-back", "write-through-selective"]))
    def setup(self, page_size, per_block, write_policy):
        from radixkv.mem import RadixCache

        self.size, self.block = page_size, page_size * per_block
        self.tier, self.storage = LabelledTiers(page_size, write_policy, per_block)
        self.clock = FakeClock()
        self.cache = RadixCache(PageAllocator(NUM_PAGES, page_size), "lru", host_tier=self.tier,
                                        storage=self.storage, clock=self.clock)
        self.ref, self.host_ref, self.running, self.history, self.peeked = {}, {}, [], [], []
        self.until = {}

    def stored(self):
        """The prefixes whose last stored page (block) storage holds."""
        return {block[-1] for block in self.storage.labels.values()}

    def expected_storage_tokens(self, key, ns, start):
        """Whole blocks from the one `start` is in, as far as storage holds them."""
        stored, n = self.stored(), start // self.block * self.block
        while n + self.block <= len(key) and (ns, tuple(key[: n + self.block])) in stored:
            n += self.block
        return max(0, n - start)

    @rule(key=keys, ns=namespaces)
    def peek(self, key, ns):
        super().peek(key, ns)
        m = self.peeked[-1][2]
        assert m.storage_tokens == self.expected_storage_tokens(key, ns, m.num_tokens + m.host_tokens)

    @rule(key=keys, ns=namespaces)
    def start_request(self, key, ns):
        self.history.append((key, ns))
        m = self.cache.peek(key, ns)
        assert m.storage_tokens == self.expected_storage_tokens(key, ns, m.num_tokens + m.host_tokens)
        if m.storage_tokens:
            m = self.cache.load_from_storage(m)
            self.sync_after_eviction()
            self.seen_storage["installed"] += 1
        m = self.cache.settle(m)
        self.cache.record_use(m)
        assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        if m.host_tokens:
            m = self.cache.load_back(m, key, ns)
            self.seen_storage["hit"] += m.from_storage > 0
            self.seen_storage["block_hit"] += m.from_storage > 0 and self.block > self.size  # blocks of pages
            self.sync_after_eviction()
            assert (m.num_tokens, m.pages) == self.expected_match(key, ns)
        self.admit(key, ns, m)

    @precondition(lambda self: not self.running)
    @rule()
    def persist(self):
        """A clean shutdown's write of everything cached; then everything is found in storage
        (as far as its budget goes)."""
        self.cache.persist()
        self.seen_storage["persisted"] += 1

    seen_storage = {"installed": 0, "hit": 0, "block_hit": 0, "persisted": 0}

    @invariant()
    def storage_consistent(self):
        if not hasattr(self, "cache"):
            return
        from radixkv.mem.block_hash import chain, root

        assert self.storage.stored_pages <= STORAGE_PAGES
        assert self.storage.stored_pages == len(self.storage.labels)
        for key, block in self.storage.labels.items():  # a key names its prefix's KV, page by page
            ns, prefix = block[-1]
            assert len(prefix) % self.block == 0
            assert list(chain(root(ns), prefix, self.block))[-1] == key
            k = len(block)
            assert block == tuple((ns, prefix[: len(prefix) - (k - 1 - i) * self.size]) for i in range(k))


def test_radix_cache_with_host_and_storage_tiers_matches_naive_reference():
    # Derandomized: the same 150 programs every run, among them ones that reach every storage
    # path (`seen_storage`); random ones missed the storage hit about one run in five.
    StorageCacheMachine.TestCase.settings = settings(
        max_examples=150, stateful_step_count=50, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    StorageCacheMachine.TestCase().runTest()
    assert all(StorageCacheMachine.seen_storage.values()), StorageCacheMachine.seen_storage
