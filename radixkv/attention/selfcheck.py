"""A start-up check of the compiled attention path: the kernels this configuration would use
(store, extend, decode, in its KV format and head shape) run once on a small paged batch, and
must agree with the torch reference. A kernel that fails to compile or disagrees is reported,
so the runner can serve with the torch backend instead of serving wrong tokens.

No GPU may ever have run these kernels before a user's does; this makes the first start on one
the test, not the first answers.
"""

from __future__ import annotations

import dataclasses

import torch

from radixkv.attention.backend import AttentionBackend, ReferenceBackend
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.mem.kv_pool import KVLayout, make_kv_pool

TOKENS_PER_REQUEST = 8  # the most any request below holds
STEPS = (  # (mode, cached tokens per request, new tokens per request): store prefixes, extend, decode
    (ForwardMode.EXTEND, (0, 0), (1, 4)),
    (ForwardMode.EXTEND, (1, 4), (5, 3)),
    (ForwardMode.DECODE, (6, 7), (1, 1)),
)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype == torch.float32 else 3e-2


def check_backend(backend_type: type[AttentionBackend], layout: KVLayout, num_heads: int, device: torch.device,
                  sliding_window: int | None = None) -> str | None:
    """None if `backend_type` agrees with the reference backend on one layer of `layout` with
    `num_heads` query heads, else what went wrong (a compile error, or how far it was off)."""
    one = dataclasses.replace(layout, num_layers=1)
    try:
        runs = [_run(cls, one, num_heads, device, sliding_window) for cls in (backend_type, ReferenceBackend)]
    except Exception as e:  # noqa: BLE001 - a kernel that does not compile or launch
        return f"{backend_type.name} attention failed to run: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    tol = tolerance(layout.dtype)
    for what, got, want in zip(("store", "extend", "decode"), runs[0], runs[1]):
        if got is None:
            continue
        err = (got.float() - want.float()).abs().max().item()
        scale = max(1.0, want.float().abs().max().item())
        if not err <= tol * scale:  # NaN fails too
            return (f"{backend_type.name} {what} ({layout.kv_cache_dtype} KV, {num_heads} heads of "
                    f"{layout.head_dim}) differs from the torch reference by {err:.3g} (tolerance {tol * scale:.3g})")
    return None


def _run(cls: type[AttentionBackend], layout: KVLayout, num_heads: int, device: torch.device,
         sliding_window: int | None) -> list[torch.Tensor | None]:
    """[what the pool holds after the first store (a plain pool only), extend output, decode
    output] of `cls` over a fresh pool, on the same random inputs each time."""
    gen = torch.Generator(device="cpu").manual_seed(1234)
    rows = len(STEPS[0][1])
    width = -(-TOKENS_PER_REQUEST // layout.page_size) * layout.page_size  # slots of each request's pages
    pool = make_kv_pool(layout, rows * width // layout.page_size, device)
    slots = [[layout.page_size + r * width + p for p in range(width)] for r in range(rows)]  # past the padding page
    table = torch.tensor(slots, dtype=torch.int32).to(device)  # (R, L)
    backend = cls(pool, table)
    outputs: list[torch.Tensor | None] = []
    for mode, cached, new in STEPS:
        loc = [slots[r][p] for r in range(rows) for p in range(cached[r], cached[r] + new[r])]
        fb = ForwardBatch.build(mode, [[1] * n for n in new], list(range(rows)), list(cached), loc, device=device)
        q, k, v = (torch.randn((sum(new), h, layout.head_dim), generator=gen).to(device, layout.dtype)
                   for h in (num_heads, layout.num_kv_heads, layout.num_kv_heads))  # (T, H, D)
        backend.begin_forward(fb)
        out = backend.forward(q, k, v, 0, layout.head_dim ** -0.5, sliding_window, fb)  # (T, Hq, D)
        if not outputs:
            view = pool.k_view(0)
            outputs.append(view.index_select(0, fb.out_cache_loc) if isinstance(view, torch.Tensor) else None)
        else:  # a latent attention's values are its first columns (the rest are RoPE keys)
            outputs.append(out[..., : layout.latent_values] if layout.latent else out)
    return outputs
