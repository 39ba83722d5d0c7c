"""The router: one HTTP front over N `radixkv serve` workers (`app.py`), and `radixkv router` /
`radixkv serve --dp N` (`launch.py`). Its routing policies are `radixkv.routing`, which the trace
simulator (`radixkv.workloads.routing`) shares."""
