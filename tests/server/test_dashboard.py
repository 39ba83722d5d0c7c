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

    def refreshes():
        return int(browser.find_element("id", "updated").get_attribute("data-refreshes"))

    def nodes_with(text):
        return [e for e in browser.find_elements("css selector", "rect[data-node-id]")
                if text in (e.get_attribute("data-preview") or "")]

    wait_for(lambda: refreshes() >= 1)
    assert browser.find_element("id", "error").text == ""
    shared = wait_for(lambda: nodes_with("beekeeper's almanac"))
    assert max(int(e.get_attribute("data-hits")) for e in shared) >= 2
    assert all(e.get_attribute("data-tier") == "device" for e in shared)
    hit_rate = browser.find_element("id", "hit-rate").text
    assert hit_rate.endswith("%") and float(hit_rate[:-1]) > 0
    device = browser.find_element("css selector", "rect[data-tier='device'][data-used]")
    assert int(device.get_attribute("data-used")) > 0 and int(device.get_attribute("data-total")) > 0
    causes = {e.get_attribute("data-cause"): int(e.get_attribute("data-tokens"))
              for e in browser.find_elements("css selector", "rect[data-cause]")}
    assert causes["device"] > 0 and causes["new"] > 0 and set(causes) >= {"evicted", "page_tail", "retokenized"}
    assert not nodes_with("zebra crossing")
    seen = refreshes()
    generate(server, "Dashboard check two: a zebra crossing is where people cross the road. Why stripes?")
    wait_for(lambda: nodes_with("zebra crossing"))  # drawn by a later refresh of the same page
    assert refreshes() > seen
    logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs
