"""Several API keys on one server (issue 41): each key is its own cache namespace by default,
sees only its own nodes in /cache_tree, never another's text or salt; only the admin key may
flush; `--cache-sharing all` shares the cache by the operator's choice. Counted, not timed:
a cross-key repeat computes every prompt token (`cached_tokens` 0)."""

import httpx
import pytest

from tests.server_helpers import start_server, stop_server
from tests.tiny_models import tiny_chat_model_dir

K1, K2, ADMIN = "tenant-one-key", "tenant-two-key", "the-admin-key"
SECRET = "my password is hunter2 and my SSN is 078-05-1120"
SALT = "k1-private-salt"
PROMPT = [{"role": "user", "content": f"{SECRET}. " + "Remember it, please. " * 12}]


def start(tmp_path_factory, *extra):
    model = tiny_chat_model_dir(tmp_path_factory)
    return start_server("--model", str(model), "--max-total-tokens", "4096", "--page-size", "4", *extra,
                        api_key=K1, extra_keys=(K2,))


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    server = start(tmp_path_factory, "--admin-key", ADMIN)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    server = start(tmp_path_factory, "--cache-sharing", "all")
    yield server
    stop_server(server)


def as_key(server, key):
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def chat(server, key, messages=PROMPT, **extra):
    with as_key(server, key) as c:
        r = c.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 1,
                                                 "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def model_name(server):
    with as_key(server, K1) as c:
        return c.get("/v1/models").json()["data"][0]["id"]


def test_a_key_hits_its_own_cache_and_never_another_keys(isolated):
    name = model_name(isolated)
    prompt, _ = chat(isolated, K1, model=name)
    assert chat(isolated, K1, model=name)[1] >= prompt - 4  # its own repeat hits (all but the last page)
    assert chat(isolated, K2, model=name)[1] == 0  # k2 sending k1's prompt computes every token
    assert chat(isolated, ADMIN, model=name)[1] == 0  # the admin is a tenant of its own too
    assert chat(isolated, K2, model=name)[1] >= prompt - 4  # and k2 then hits its own


def test_a_salt_is_bound_to_its_key(isolated):
    name = model_name(isolated)
    prompt, _ = chat(isolated, K1, model=name, cache_salt=SALT)
    assert chat(isolated, K1, model=name, cache_salt=SALT)[1] >= prompt - 4
    assert chat(isolated, K2, model=name, cache_salt=SALT)[1] == 0  # k1's salt opens nothing for k2


def test_cache_tree_shows_each_key_only_its_own_nodes_and_never_a_salt(isolated):
    name = model_name(isolated)
    only_k1 = [{"role": "user", "content": "swordfish is the door code, " * 6}]
    chat(isolated, K1, only_k1, model=name, cache_salt=SALT)
    chat(isolated, K1, only_k1, model=name)
    with as_key(isolated, K2) as c:
        theirs = c.get("/cache_tree", params={"limit": 2000})
    with as_key(isolated, K1) as c:
        mine = c.get("/cache_tree", params={"limit": 2000})
    with as_key(isolated, ADMIN) as c:
        everything = c.get("/cache_tree", params={"limit": 2000})
    assert theirs.status_code == mine.status_code == everything.status_code == 200
    assert "swordfish" not in theirs.text and SALT not in theirs.text
    assert "swordfish" in mine.text and SALT not in mine.text  # a salt is shown as its digest only
    assert "swordfish" in everything.text and SALT not in everything.text
    spaces = {n["namespace"] for n in mine.json()["nodes"]}
    assert spaces and spaces.isdisjoint({n["namespace"] for n in theirs.json()["nodes"]})
    assert everything.json()["total_nodes"] >= mine.json()["total_nodes"] + theirs.json()["total_nodes"]


def test_only_the_admin_key_may_flush(isolated):
    for key in (K1, K2):
        with as_key(isolated, key) as c:
            r = c.post("/flush_cache")
        assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
    with as_key(isolated, ADMIN) as c:
        assert c.post("/flush_cache").json() == {"flushed": True}


def test_sharing_by_the_operators_choice(shared):
    name = model_name(shared)
    prompt, _ = chat(shared, K1, model=name)
    assert chat(shared, K2, model=name)[1] >= prompt - 4  # one cache for every key
    with as_key(shared, K2) as c:
        tree = c.get("/cache_tree").json()
        assert c.post("/flush_cache").status_code == 403  # several keys and no admin: nobody flushes
    assert tree["nodes"] and all(n["preview"] is None for n in tree["nodes"])  # no other key's text


def test_the_events_name_each_tenants_blocks_by_a_digest_never_the_key_or_salt(tmp_path_factory):
    """Each block the KV events announce carries its namespace's digest: two keys' blocks are told
    apart, the same prompt under two keys is two sets of blocks, no key or salt is on the wire."""
    import json
    import time

    from radixkv.mem.cache_events import PagesStored
    from radixkv.sched.kv_event_wire import decode_batch
    from tests.kv_events_helpers import Subscriber, free_port

    config = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv", "buffer_steps": 64}
    server = start(tmp_path_factory, "--kv-events-config", json.dumps(config))
    try:
        with as_key(server, K1) as c:
            block = c.get("/server_info").json()["kv_events"]
        sub = Subscriber(block["endpoint"], None, "kv", 4)
        try:
            name = model_name(server)
            time.sleep(0.5)  # the subscription is live
            chat(server, K1, model=name)
            chat(server, K2, model=name)
            chat(server, K2, model=name, cache_salt=SALT)
            time.sleep(1.0)
            sub.receive(500)
            stored = [e for payload in sub.live.values() for e in decode_batch(payload)[1]
                      if isinstance(e, PagesStored)]
            raw = b"".join(sub.live.values())
        finally:
            sub.close()
    finally:
        stop_server(server)
    spaces = {e.namespace for e in stored}
    assert len(spaces) == 3 and None not in spaces  # k1's, k2's, and k2's salted one
    for secret in (K1, K2, SALT):
        assert secret.encode() not in raw
    by_space = {s: {h for e in stored if e.namespace == s for h in e.hashes} for s in spaces}
    sets = list(by_space.values())
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])  # one prompt, never one block
