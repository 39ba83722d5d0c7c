"""`GET /dashboard` in a real headless browser: the page loads with no resource from outside,
draws the nodes of a known workload (the shared prefix as one node hit by the later requests),
the tiers and the miss causes, and redraws after new requests, on its own."""

import httpx
import pytest

from tests.browser import missing, open_browser, wait_for
from tests.server_helpers import API_KEY

SYSTEM = "Dashboard check: you are the beekeeper's almanac. Answer in one line about hives and honey. "


@pytest.fixture(scope="module")
def browser():
    why = missing()
    if why is not None:
        pytest.skip(why)
    driver = open_browser()
    yield driver
    driver.quit()


def generate(server, text):
    r = httpx.post(f"{server.url}/generate", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                   json={"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text


def test_the_page_is_self_contained_and_needs_no_key(server):
    r = httpx.get(f"{server.url}/dashboard", timeout=30)  # no key: the page holds no data
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<script>" in page and "src=" not in page and "http://" not in page.replace("http://www.w3.org", "")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert httpx.get(f"{server.url}/cache_tree", timeout=30).status_code == 401  # its data still needs the key


def test_the_dashboard_draws_a_known_workload_and_follows_new_requests(server, browser):
    for question in ("What is a frame?", "Who is the queen?", "When is the harvest?"):
        generate(server, SYSTEM + question)
    browser.get(f"{server.url}/dashboard?interval=0.5&nodes=2000#key={API_KEY}")

    # The page redraws every refresh: read what it shows in one script call, never through
    # element handles a redraw may have replaced.
    def shown(selector):
        return browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => Object.assign({}, e.dataset))",
            selector)

    def refreshes():
        return int(browser.execute_script("return document.getElementById('updated').dataset.refreshes"))

    def text_of(element_id):
        return browser.execute_script("return document.getElementById(arguments[0]).textContent", element_id)

    def nodes_with(text):
        return [n for n in shown("rect[data-node-id]") if text in n.get("preview", "")]

    wait_for(lambda: refreshes() >= 1)
    assert text_of("error") == ""
    shared = wait_for(lambda: nodes_with("beekeeper's almanac"))
    assert max(int(n["hits"]) for n in shared) >= 2
    assert all(n["tier"] == "device" for n in shared)
    hit_rate = text_of("hit-rate")
    assert hit_rate.endswith("%") and float(hit_rate[:-1]) > 0
    device = shown("rect[data-tier='device'][data-used]")[0]
    assert int(device["used"]) > 0 and int(device["total"]) > 0
    causes = {n["cause"]: int(n["tokens"]) for n in shown("rect[data-cause]")}
    assert causes["device"] > 0 and causes["new"] > 0 and set(causes) >= {"evicted", "page_tail", "retokenized"}
    assert not nodes_with("zebra crossing")
    seen = refreshes()
    generate(server, "Dashboard check two: a zebra crossing is where people cross the road. Why stripes?")
    wait_for(lambda: nodes_with("zebra crossing"))  # drawn by a later refresh of the same page
    assert refreshes() > seen
    logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs
    assert "key=" not in browser.current_url  # moved out of the address bar (and history)
    browser.get(f"{server.url}/dashboard?interval=soon&nodes=many")  # bad settings: the defaults
    wait_for(lambda: refreshes() >= 1 and nodes_with("zebra crossing"))  # the tab kept its key
    assert text_of("error") == ""


def test_a_node_whose_parent_was_not_sent_hangs_under_an_elided_marker(server, browser):
    """Found from outside: with ~900 cached nodes, the deep nodes among the top ones (their parents
    not sent) were drawn as top-level columns beside the real root."""
    browser.get(f"{server.url}/dashboard?interval=3600#key={API_KEY}")
    wait_for(lambda: int(browser.execute_script("return document.getElementById('updated').dataset.refreshes")) >= 1)

    def node(id, parent, tokens, depth):
        return {"id": id, "parent": parent, "depth": depth, "tokens": tokens, "preview": f"node {id}", "hits": 1,
                "last_access": 0, "tier": "device", "lock_ref": 0, "namespace": None, "retained_until": 0}

    tree = {"nodes": [node(1, None, 40, 0), node(2, 1, 10, 40), node(7, 5, 8, 90), node(8, 5, 6, 90),
                      node(9, 6, 4, 120)], "total_nodes": 9, "total_tokens": 100, "page_size": 1}
    drawn = browser.execute_script(
        "drawTree(arguments[0]); const rows = {};"
        "document.querySelectorAll('#tree rect.node').forEach(r => {"
        "  rows[r.dataset.nodeId || ('elided ' + r.dataset.elided)] = Number(r.getAttribute('y')); });"
        "return [rows, document.getElementById('tree-legend').textContent];", tree)
    rows, legend = drawn
    top = rows["1"]
    assert rows["elided 5"] == top and rows["elided 6"] == top  # one marker per parent not sent, at the top
    assert rows["7"] > top and rows["8"] > top and rows["9"] > top  # the nodes hang under them
    assert rows["2"] > top
    assert "2 marker(s)" in legend
