"""The `/dashboard` page: one self-contained HTML document (no CDN, no external file: it works
offline), drawn by its own script from the server's JSON endpoints, refreshing live.

- the radix tree as an icicle (`GET /cache_tree`): one row per tree level, each node as wide as
  the tokens it and the nodes below it hold, coloured by its hits (log scale), host-tier nodes
  striped; hovering shows its text preview, tokens, hits, tier, locks and namespace;
- the prefix hit rate over time, per refresh interval and since start (`GET /server_info`);
- tier occupancy: device pool, host tier, storage tier, used of total tokens;
- prompt tokens by why they hit or missed (`cache_causes`, see `radixkv.mem.miss_causes`).

With `--api-key`, give the key in the address's fragment, which the browser never sends to the
server: `/dashboard#key=KEY` (the script moves it to the tab's session storage and out of the
address bar). `?interval=SECONDS` sets the pause between refreshes (default 2; each starts once
the last is done), `?nodes=N` how many nodes the tree draws (default 400); a bad value is the
default. Every element a test reads has an id or a `data-` field.
"""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>radixkv cache dashboard</title>
<link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  :root { --fg: #1d2330; --muted: #6b7385; --line: #d8dce5; --bg: #f7f8fb; --accent: #2f6fde; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
         background: var(--bg); }
  header { display: flex; gap: 24px; align-items: baseline; padding: 12px 20px; background: #fff;
           border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 17px; margin: 0; }
  .kpi { color: var(--muted); } .kpi b { color: var(--fg); font-size: 16px; }
  main { display: grid; grid-template-columns: 2fr 1fr; gap: 16px; padding: 16px 20px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px; }
  section h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted);
               margin: 0 0 8px; }
  #tree-panel { grid-column: 1 / 3; }
  svg { display: block; width: 100%; }
  .node { stroke: #fff; stroke-width: 1; }
  .node:hover { stroke: var(--fg); stroke-width: 1.5; }
  .label { font-size: 11px; pointer-events: none; fill: #111; }
  .axis { font-size: 10px; fill: var(--muted); }
  .bar-label { font-size: 12px; }
  #tooltip { position: fixed; pointer-events: none; background: #1d2330; color: #fff; padding: 6px 8px;
             border-radius: 4px; font-size: 12px; max-width: 420px; display: none; white-space: pre-wrap; }
  #error { color: #b3261e; }
  .legend { color: var(--muted); font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1>radixkv cache</h1>
  <span class="kpi">model <b id="model">…</b></span>
  <span class="kpi">hit rate <b id="hit-rate">…</b></span>
  <span class="kpi">requests running <b id="running">…</b> waiting <b id="waiting">…</b></span>
  <span class="kpi">tree <b id="tree-size">…</b></span>
  <span class="kpi">updated <b id="updated" data-refreshes="0">never</b></span>
  <span id="error"></span>
</header>
<main>
  <section id="tree-panel">
    <h2>Radix tree (icicle: width = tokens held at and below a node, colour = hits)</h2>
    <svg id="tree" height="260" role="img" aria-label="radix tree"></svg>
    <div class="legend" id="tree-legend"></div>
  </section>
  <section>
    <h2>Prefix hit rate over time</h2>
    <svg id="hits" height="180" role="img" aria-label="hit rate over time"></svg>
    <div class="legend">solid: per interval &middot; dashed: since start</div>
  </section>
  <section>
    <h2>Tier occupancy</h2>
    <svg id="tiers" height="120" role="img" aria-label="tier occupancy"></svg>
  </section>
  <section style="grid-column: 1 / 3">
    <h2>Prompt tokens by cause</h2>
    <svg id="causes" height="200" role="img" aria-label="prompt tokens by cause"></svg>
  </section>
</main>
<div id="tooltip"></div>
<script>
"use strict";
const params = new URLSearchParams(location.search);
function setting(name, fallback, low, high) {  // a bad value falls back to the default
  const v = parseFloat(params.get(name));
  return Number.isFinite(v) ? Math.min(high, Math.max(low, v)) : fallback;
}
// The key comes in the fragment (never sent to the server); it moves to this tab's session
// storage and out of the address bar, so it is not left in history or bookmarks.
const given = new URLSearchParams(location.hash.slice(1)).get("key");
if (given) { sessionStorage.setItem("radixkv-key", given); window.history.replaceState(null, "", location.pathname + location.search); }
const KEY = given || sessionStorage.getItem("radixkv-key");
const INTERVAL = setting("interval", 2, 0.2, 3600) * 1000;
const NODES = Math.round(setting("nodes", 400, 1, 2000));
const NS = "http://www.w3.org/2000/svg";
const CAUSES = ["device", "host", "storage", "page_tail", "evicted", "namespace", "retokenized", "new"];
const CAUSE_COLOURS = {device: "#2f6fde", host: "#5aa0f0", storage: "#9cc5f5", page_tail: "#f0b429",
                       evicted: "#e8590c", namespace: "#9c36b5", retokenized: "#c2255c", new: "#adb5bd"};
const series = [];  // the hit rate at each refresh: {t, rate, total}
let previous = null, refreshes = 0;

function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); return svg; }
function width(svg) { return svg.getBoundingClientRect().width || 800; }
function fmt(n) { return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e3 ? (n / 1e3).toFixed(1) + "k" : String(n); }
function pct(x) { return (100 * x).toFixed(1) + "%"; }

async function get(path) {
  const headers = KEY ? {"Authorization": "Bearer " + KEY} : {};
  const r = await fetch(path, {headers, cache: "no-store"});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status + (r.status === 401 ? " (open /dashboard#key=YOUR_KEY)" : ""));
  return r.json();
}

function hitColour(hits, maxHits) {
  const t = maxHits > 0 ? Math.log1p(hits) / Math.log1p(maxHits) : 0;  // 0 .. 1
  const light = 92 - 55 * t;
  return "hsl(217, 75%, " + light.toFixed(0) + "%)";
}

function drawTree(tree) {
  const svg = clear(document.getElementById("tree"));
  const nodes = tree.nodes, byId = new Map(nodes.map(n => [n.id, {...n, kids: [], sum: n.tokens}]));
  const roots = [];
  for (const n of byId.values()) {
    const p = n.parent === null ? null : byId.get(n.parent);
    (p ? p.kids : roots).push(n);
  }
  function total(n) { n.sum = n.tokens + n.kids.reduce((s, k) => s + total(k), 0); return n.sum; }
  let levels = 0;
  function depth(n, d) { n.level = d; levels = Math.max(levels, d + 1); n.kids.forEach(k => depth(k, d + 1)); }
  roots.forEach(r => { total(r); depth(r, 0); });
  const all = roots.reduce((s, r) => s + r.sum, 0);
  const W = width(svg), rowH = Math.max(18, Math.min(44, 240 / Math.max(levels, 1)));
  svg.setAttribute("height", Math.max(60, levels * rowH + 4));
  const defs = el("defs", {}, svg);
  const pat = el("pattern", {id: "host-stripes", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                             patternTransform: "rotate(45)"}, defs);
  el("rect", {width: 6, height: 6, fill: "#eef1f6"}, pat);
  el("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#9aa3b5", "stroke-width": 2}, pat);
  const maxHits = nodes.reduce((m, n) => Math.max(m, n.hits), 0);
  const tip = document.getElementById("tooltip");
  function place(n, x0, w) {
    const g = el("g", {}, svg);
    const r = el("rect", {class: "node", x: x0, y: n.level * rowH, width: Math.max(w - 0.5, 0.5), height: rowH - 1,
                          fill: n.tier === "host" ? "url(#host-stripes)" : hitColour(n.hits, maxHits),
                          "data-node-id": n.id, "data-tokens": n.tokens, "data-hits": n.hits, "data-tier": n.tier,
                          "data-preview": n.preview}, g);
    r.addEventListener("mousemove", ev => {
      tip.style.display = "block"; tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
      tip.textContent = JSON.stringify(n.preview).slice(1, -1).slice(0, 200) + "\n" + n.tokens + " tokens (" + n.sum +
        " at and below) · " + n.hits + " hits · " + n.tier + " · locks " + n.lock_ref +
        (n.namespace !== null ? " · namespace " + n.namespace : "") + " · depth " + n.depth;
    });
    r.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    if (w > 60) {
      const t = el("text", {class: "label", x: x0 + 4, y: n.level * rowH + rowH / 2 + 4}, g);
      t.textContent = n.preview.replace(/\s+/g, " ").slice(0, Math.floor(w / 6.5));
    }
    let x = x0;
    const inner = w * (n.sum - n.tokens) / Math.max(n.sum, 1);  // the node's own tokens: its right part
    for (const k of n.kids.sort((a, b) => b.sum - a.sum)) {
      const kw = inner * k.sum / Math.max(n.sum - n.tokens, 1);
      place(k, x, kw); x += kw;
    }
  }
  let x = 0;
  for (const r of roots.sort((a, b) => b.sum - a.sum)) { const w = W * r.sum / Math.max(all, 1); place(r, x, w); x += w; }
  document.getElementById("tree-size").textContent = tree.total_nodes + " nodes, " + fmt(tree.total_tokens) + " tokens";
  document.getElementById("tree-legend").textContent = "drawn: " + nodes.length + " of " + tree.total_nodes +
    " nodes (the top by tokens x hits) · most hits " + maxHits + " · striped: host tier · page size " + tree.page_size;
}

function drawHits() {
  const svg = clear(document.getElementById("hits"));
  const W = width(svg), H = 180, pad = 28;
  for (const y of [0, 0.5, 1]) {
    el("line", {x1: pad, x2: W - 4, y1: H - pad - y * (H - 2 * pad), y2: H - pad - y * (H - 2 * pad), stroke: "#eceff4"}, svg);
    el("text", {class: "axis", x: 2, y: H - pad - y * (H - 2 * pad) + 3}, svg).textContent = (100 * y) + "%";
  }
  if (series.length < 1) return;
  const t0 = series[0].t, t1 = Math.max(series[series.length - 1].t, t0 + 1);
  const X = t => pad + (W - pad - 4) * (t - t0) / (t1 - t0), Y = r => H - pad - r * (H - 2 * pad);
  const line = (key, dash) => el("polyline", {fill: "none", stroke: "#2f6fde", "stroke-width": 2,
    "stroke-dasharray": dash, points: series.filter(h => h[key] !== null).map(h => X(h.t) + "," + Y(h[key])).join(" ")}, svg);
  line("rate", ""); line("total", "4 3");
  el("text", {class: "axis", x: pad, y: H - 6}, svg).textContent = "last " + Math.round((t1 - t0) / 1000) + " s";
}

function drawTiers(stats) {
  const svg = clear(document.getElementById("tiers"));
  const W = width(svg), rows = [["device", stats.used_tokens, stats.total_tokens],
    ["host", stats.host_used_tokens || 0, stats.host_total_tokens || 0],
    ["storage", stats.storage_used_tokens || 0, stats.storage_total_tokens || 0]];
  rows.forEach(([name, used, totalTokens], i) => {
    const y = 8 + i * 36, bw = W - 150;
    el("text", {class: "bar-label", x: 0, y: y + 14}, svg).textContent = name;
    el("rect", {x: 64, y, width: bw, height: 20, fill: "#eef1f6", rx: 3}, svg);
    const share = totalTokens ? used / totalTokens : 0;
    el("rect", {x: 64, y, width: bw * share, height: 20, fill: CAUSE_COLOURS[name], rx: 3, "data-tier": name,
                "data-used": used, "data-total": totalTokens}, svg);
    el("text", {class: "axis", x: 70 + bw, y: y + 14}, svg).textContent =
      totalTokens ? fmt(used) + " / " + fmt(totalTokens) : "off";
  });
}

function drawCauses(causes) {
  const svg = clear(document.getElementById("causes"));
  const W = width(svg), sum = CAUSES.reduce((s, c) => s + (causes[c] || 0), 0), max = Math.max(1, ...CAUSES.map(c => causes[c] || 0));
  CAUSES.forEach((c, i) => {
    const y = 4 + i * 24, v = causes[c] || 0, bw = (W - 230) * v / max;
    el("text", {class: "bar-label", x: 0, y: y + 14}, svg).textContent = c;
    el("rect", {x: 96, y, width: Math.max(bw, v ? 1 : 0), height: 18, fill: CAUSE_COLOURS[c], rx: 2,
                "data-cause": c, "data-tokens": v}, svg);
    el("text", {class: "axis", x: 102 + bw, y: y + 13}, svg).textContent = fmt(v) + (sum ? " (" + pct(v / sum) + ")" : "");
  });
}

async function refresh() {
  try {
    const [info, tree] = await Promise.all([get("/server_info"), get("/cache_tree?limit=" + NODES)]);
    const s = info.stats, now = Date.now();
    const cur = {prompt: s.prompt_tokens, cached: s.cached_prompt_tokens};
    const d = previous ? cur.prompt - previous.prompt : 0;
    series.push({t: now, rate: previous && d > 0 ? (cur.cached - previous.cached) / d : null,
                  total: cur.prompt ? cur.cached / cur.prompt : null});
    while (series.length > 300) series.shift();
    previous = cur;
    document.getElementById("model").textContent = info.model_name;
    document.getElementById("hit-rate").textContent = cur.prompt ? pct(cur.cached / cur.prompt) : "–";
    document.getElementById("running").textContent = s.running_requests;
    document.getElementById("waiting").textContent = s.waiting_requests;
    drawTree(tree); drawHits(); drawTiers(s); drawCauses(s.cache_causes || {});
    refreshes += 1;
    const u = document.getElementById("updated");
    u.textContent = new Date(now).toLocaleTimeString(); u.dataset.refreshes = refreshes;
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = String(e.message || e);
  }
}
async function loop() {  // the next refresh starts once this one is done: never a pile of requests
  await refresh();
  setTimeout(loop, INTERVAL);
}
loop();
</script>
</body>
</html>
"""
