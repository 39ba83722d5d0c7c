"""Routing policies: which worker a request goes to."""

import pytest

from radixkv.errors import ConfigError
from radixkv.routing import ApproxTree, CacheAware, LeastLoad, RoundRobin, make_policy


def test_round_robin_cycles_and_least_load_takes_the_idlest():
    rr = RoundRobin(3)
    assert [rr.route((1,), [0, 0, 0]) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert LeastLoad(3).route((1,), [4, 1, 1]) == 1


def test_approx_tree_matches_routed_prefixes_and_forgets_the_least_recent():
    tree = ApproxTree(capacity=8)
    tree.insert((1, 2, 3, 4))
    assert tree.match((1, 2, 3, 9)) == 3
    tree.insert((5, 6, 7, 8))
    tree.insert((9, 9, 9))  # over 8 symbols: the least recently routed prefix goes
    assert tree.size <= 8 and tree.match((1, 2, 3, 4)) < 4 and tree.match((9, 9, 9)) == 3


def test_cache_aware_follows_the_prefix_and_balances_load():
    policy = CacheAware(2, tree_capacity=1000, min_match=0.5, balance_abs=4, balance_rel=1.5)
    a = tuple(range(100))
    first = policy.route(a, [0, 0])
    assert policy.route(a + (7, 8), [0, 3]) == first  # the cached prefix wins over a small imbalance
    other = policy.route(tuple(range(500, 600)), [1, 0] if first == 0 else [0, 1])
    assert other != first  # nothing cached: the least-loaded worker
    loads = [0, 0]
    loads[first] = 20
    assert policy.route(a, loads) != first  # out of balance: load wins over cache
    assert policy.decisions["cache"] == 1 and policy.decisions["balance"] == 1


def test_pins_keep_a_conversation_on_its_worker_until_the_worker_goes():
    policy = CacheAware(3, tree_capacity=1000)
    w = policy.route((1, 2, 3), [0, 0, 0], pin="conv-1")
    assert policy.route((9, 9, 9, 9), [0, 0, 0], pin="conv-1") == w
    policy.forget_worker(w)
    assert "conv-1" not in policy.pins and policy.trees[w].size == 0


def test_bad_policy_settings_are_refused():
    with pytest.raises(ConfigError, match="routing policy"):
        make_policy("random", 2)
    with pytest.raises(ConfigError, match="min_match"):
        CacheAware(2, 100, min_match=2)
    with pytest.raises(ConfigError, match="at least one worker"):
        RoundRobin(0)


def test_router_cli_refuses_bad_flags_naming_them(run_cli):
    def run(*args):
        return run_cli("router", *args)

    proc = run("--worker", "localhost:30001")
    assert proc.returncode == 2 and "--worker" in proc.stderr and "http://" in proc.stderr
    proc = run("--worker", "http://a:1", "--worker", "http://a:1")
    assert proc.returncode == 2 and "twice" in proc.stderr
    proc = run("--worker", "http://a:1", "--policy", "random")
    assert proc.returncode == 2 and "--policy" in proc.stderr
    proc = run()
    assert proc.returncode == 2 and "--worker" in proc.stderr
    assert "--health-interval" in run("--help").stdout


def test_routing_keys_of_the_agent_apis_grow_with_the_conversation():
    """Anthropic messages and Responses input were not routed at all (404 at the router)."""
    from radixkv.router.workers import routing_key

    one = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    two = one + [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    k1, _ = routing_key("/v1/messages", {"system": "Be brief.", "messages": one})
    k2, _ = routing_key("/v1/messages", {"system": [{"type": "text", "text": "Be brief."}], "messages": two})
    assert k1 == "<system>Be brief.<user>Hi" and k2.startswith(k1)
    r1, pin = routing_key("/v1/responses", {"instructions": "Be brief.", "input": "Hi", "prompt_cache_key": "c"})
    r2, _ = routing_key("/v1/responses", {"instructions": "Be brief.", "input": two})
    assert (r1, pin) == ("<system>Be brief.<user>Hi", "c") and r2.startswith("<system>Be brief.<user>Hi")
    assert routing_key("/v1/responses", {"input": 7}) == ("", None)  # the worker answers the 400
