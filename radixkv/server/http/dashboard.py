"""The `/dashboard` page, `static/dashboard.html` (package data, read once at import): one
self-contained HTML document (no CDN, no external file: it works offline), drawn by its own script from the server's JSON endpoints, refreshing live.

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

from importlib.resources import files

PAGE = files(__package__).joinpath("static", "dashboard.html").read_text(encoding="utf-8")
