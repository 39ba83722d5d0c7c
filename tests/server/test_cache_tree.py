"""`GET /cache_tree` and miss attribution on the real server: after a known workload the tree
shows the shared system prompt as one node, hit by every request after the first, with its
text; `meta_info.cache` splits each prompt by cause, and `/metrics` counts the causes."""

from tests.server_helpers import API_KEY  # noqa: F401  (the session server takes it)

SYSTEM = "You are the lighthouse keeper's assistant. Answer in one short sentence about lamps and ships. "


def test_the_tree_after_a_known_workload(server):
    with server.client() as c:
        causes = []
        for question in ("What is a lens?", "Who keeps the log?", "When is the lamp lit?"):
            r = c.post("/generate", json={"text": SYSTEM + question, "sampling_params": {"max_new_tokens": 2,
                                                                                      "temperature": 0}})
            assert r.status_code == 200
            meta = r.json()["meta_info"]
            assert sum(meta["cache"].values()) == meta["prompt_tokens"]
            causes.append(meta["cache"])
        assert causes[2]["device"] >= 15 and causes[2]["device"] == r.json()["meta_info"]["cached_tokens"]
        metrics = c.get("/metrics").text
        assert 'radixkv_prompt_tokens_by_cause_total{cause="device"}' in metrics
        assert 'radixkv_prompt_tokens_by_cause_total{cause="new"}' in metrics
        tree = c.get("/cache_tree", params={"limit": 2000}).json()
        info = c.get("/server_info").json()
        assert tree["total_tokens"] == info["kv_pool"]["cached_tokens_in_tree"] + info["stats"].get(
            "host_used_tokens", 0)
        shared = [n for n in tree["nodes"] if "lighthouse keeper's assistant" in n["preview"]]
        assert shared, [n["preview"] for n in tree["nodes"][:5]]
        node = max(shared, key=lambda n: n["hits"])
        assert node["hits"] >= 2 and node["tier"] == "device" and node["lock_ref"] == 0
        below = [n for n in tree["nodes"] if n["parent"] == node["id"]]
        assert len(below) >= 3 and all(n["depth"] == node["depth"] + node["tokens"] for n in below)
        assert len(c.get("/cache_tree", params={"limit": 1}).json()["nodes"]) == 1
        for bad in (0, 2001, "x"):
            r = c.get("/cache_tree", params={"limit": bad})
            assert r.status_code in (400, 422) and "limit" in r.text
