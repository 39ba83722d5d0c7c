"""Compiled Triton paged-attention kernels on CUDA: correctness vs torch, decode bandwidth, extend TFLOP/s.

    python benchmarks/gpu_kernels.py --json benchmarks/results/gpu_kernels.json

Needs a CUDA device; runs in about a minute on an H100-class GPU. Correctness compares the
compiled kernels with `radixkv.kernels.reference` on scattered pages (fp16 and bf16); decode
reports K/V bytes read per second against the bandwidth of a large device-to-device copy; extend
reports causal TFLOP/s next to torch SDPA on the same (contiguous, unpaged) shapes.
"""

import os

# The kernels must be compiled, not interpreted: Triton reads this when they are decorated.
os.environ.pop("TRITON_INTERPRET", None)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = {  # name: (Hq, H_kv, D)
    "llama8b": (32, 8, 128),
    "smollm2": (9, 3, 64),
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ATOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}
PAGE_SIZE = 16
DECODE_CASES = [(1, 4096), (8, 4096), (32, 2048), (128, 1024), (256, 512)]  # (batch, seq_len)
EXTEND_CASES = [(1, 0, 4096), (4, 0, 1024), (8, 1024, 512), (32, 2048, 64)]  # (batch, prefix, extend)


def make_batch(seq_lens, prefix_lens, num_kv_heads, head_dim, dtype, seed=0):
    """Paged KV for the requests, pages shuffled over the pool (as after a long-running server)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per_req = [-(-n // PAGE_SIZE) for n in seq_lens]
    num_pages = sum(pages_per_req)
    num_slots = (num_pages + 1) * PAGE_SIZE
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim, device="cuda", generator=gen).to(dtype)
    v_buffer = torch.randn(num_slots, num_kv_heads, head_dim, device="cuda", generator=gen).to(dtype)
    req_to_token = torch.zeros(len(seq_lens), max(seq_lens), dtype=torch.int32, device="cuda")
    pages = torch.randperm(num_pages, device="cuda", generator=gen) + 1  # (num_pages,)
    offsets = torch.arange(PAGE_SIZE, device="cuda")  # (page_size,)
    first = 0
    for row, (seq_len, n) in enumerate(zip(seq_lens, pages_per_req)):
        slots = (pages[first:first + n, None] * PAGE_SIZE + offsets).flatten()[:seq_len]  # (L,)
        req_to_token[row, :seq_len] = slots.int()
        first += n
    extend_lens = torch.tensor(seq_lens) - torch.tensor(prefix_lens)  # (B,)
    return dict(
        k_buffer=k_buffer, v_buffer=v_buffer, req_to_token=req_to_token,
        req_pool_indices=torch.arange(len(seq_lens), device="cuda"),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device="cuda"),
        extend_start_loc=(extend_lens.cumsum(0) - extend_lens).int().cuda(),
        max_extend_len=int(extend_lens.max()),
        num_tokens=int(extend_lens.sum()),
    )


def extend_call(impl, q, b, window=None):
    return lambda: impl.extend_attention(
        q, b["k_buffer"], b["v_buffer"], b["req_to_token"], b["req_pool_indices"], b["seq_lens"],
        b["prefix_lens"], b["extend_start_loc"], b["max_extend_len"], q.shape[-1] ** -0.5, window)


def decode_call(impl, q, b, window=None):
    return lambda: impl.decode_attention(
        q, b["k_buffer"], b["v_buffer"], b["req_to_token"], b["req_pool_indices"], b["seq_lens"],
        q.shape[-1] ** -0.5, window)


def check_correctness(kernels, reference):
    rows = []
    seq_lens, prefix_lens = [1, 300, 1025, 77, 2048], [0, 0, 513, 70, 1900]
    for model, (hq, hkv, d) in MODELS.items():
        for dtype_name, dtype in DTYPES.items():
            for window in (None, 256):
                b = make_batch(seq_lens, prefix_lens, hkv, d, dtype)
                q = torch.randn(b["num_tokens"], hq, d, device="cuda").to(dtype)  # (T, Hq, D)
                err_ext = (extend_call(kernels, q, b, window)().float()
                           - extend_call(reference, q, b, window)().float()).abs().max().item()
                qd = torch.randn(len(seq_lens), hq, d, device="cuda").to(dtype)  # (B, Hq, D)
                err_dec = (decode_call(kernels, qd, b, window)().float()
                           - decode_call(reference, qd, b, window)().float()).abs().max().item()
                k_new = torch.randn(b["num_tokens"], hkv, d, device="cuda").to(dtype)  # (T, H_kv, D)
                loc = torch.randperm(b["k_buffer"].shape[0], device="cuda")[: b["num_tokens"]]  # (T,)
                kb, vb = b["k_buffer"].clone(), b["v_buffer"].clone()
                kernels.store_kv(kb, vb, loc, k_new, k_new)
                reference.store_kv(b["k_buffer"], b["v_buffer"], loc, k_new, k_new)
                store_ok = torch.equal(kb, b["k_buffer"]) and torch.equal(vb, b["v_buffer"])
                ok = err_ext <= ATOL[dtype] and err_dec <= ATOL[dtype] and store_ok
                rows.append(dict(model=model, dtype=dtype_name, window=window, extend_max_err=err_ext,
                                 decode_max_err=err_dec, store_kv_exact=store_ok, ok=ok))
    return rows


def peak_copy_bandwidth(do_bench):
    """Achievable DRAM bandwidth in GB/s: a 4 GiB device-to-device copy (reads + writes)."""
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    del src, dst
    return 2 * (4 << 30) / (ms * 1e-3) / 1e9


def bench_decode(kernels, do_bench, peak_gbps):
    rows = []
    for model, (hq, hkv, d) in MODELS.items():
        for dtype_name, dtype in DTYPES.items():
            for batch, seq_len in DECODE_CASES:
                b = make_batch([seq_len] * batch, [seq_len - 1] * batch, hkv, d, dtype)
                q = torch.randn(batch, hq, d, device="cuda").to(dtype)  # (B, Hq, D)
                ms = do_bench(decode_call(kernels, q, b))
                kv_bytes = 2 * batch * seq_len * hkv * d * dtype.itemsize  # K and V, read once
                gbps = kv_bytes / (ms * 1e-3) / 1e9
                rows.append(dict(model=model, dtype=dtype_name, batch=batch, seq_len=seq_len, ms=ms,
                                 kv_gbytes_per_s=gbps, fraction_of_copy_peak=gbps / peak_gbps))
    return rows


def sdpa_baseline(q, b, batch, prefix, extend, hq, hkv, d):
    """torch SDPA on contiguous per-request tensors with the same (bottom-right causal) mask."""
    seq_len = prefix + extend
    slots = b["req_to_token"][:, :seq_len].long()  # (B, L)
    k = b["k_buffer"][slots].permute(0, 2, 1, 3).repeat_interleave(hq // hkv, 1)  # (B, Hq, L, D)
    v = b["v_buffer"][slots].permute(0, 2, 1, 3).repeat_interleave(hq // hkv, 1)  # (B, Hq, L, D)
    qb = q.view(batch, extend, hq, d).transpose(1, 2).contiguous()  # (B, Hq, E, D)
    if prefix == 0:
        return lambda: F.scaled_dot_product_attention(qb, k, v, is_causal=True)
    from torch.nn.attention.bias import causal_lower_right
    bias = causal_lower_right(extend, seq_len)
    return lambda: F.scaled_dot_product_attention(qb, k, v, attn_mask=bias)


def bench_extend(kernels, do_bench):
    rows = []
    for model, (hq, hkv, d) in MODELS.items():
        for dtype_name, dtype in DTYPES.items():
            for batch, prefix, extend in EXTEND_CASES:
                b = make_batch([prefix + extend] * batch, [prefix] * batch, hkv, d, dtype)
                q = torch.randn(b["num_tokens"], hq, d, device="cuda").to(dtype)  # (T, Hq, D)
                # Each new token sees its prefix plus, on average, half of the new tokens.
                flops = 4 * b["num_tokens"] * (prefix + (extend + 1) / 2) * hq * d
                ms = do_bench(extend_call(kernels, q, b))
                sdpa_ms = do_bench(sdpa_baseline(q, b, batch, prefix, extend, hq, hkv, d))
                rows.append(dict(model=model, dtype=dtype_name, batch=batch, prefix=prefix,
                                 extend=extend, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                                 sdpa_ms=sdpa_ms, sdpa_tflops=flops / (sdpa_ms * 1e-3) / 1e12))
    return rows


def startup_checks():
    """The runtime's own start-up check (`radixkv.attention.selfcheck`) for every KV format and
    page size, in each model's head shape: the runner falls back to torch if one fails."""
    from radixkv.attention.backend import TritonBackend
    from radixkv.attention.selfcheck import check_backend
    from radixkv.mem.kv_pool import KVLayout
    from radixkv.mem.kv_quant import KV_CACHE_DTYPES

    rows = []
    for model, (hq, hkv, d) in MODELS.items():
        for dtype_name, dtype in DTYPES.items():
            for fmt in KV_CACHE_DTYPES:
                for page_size in (1, PAGE_SIZE):
                    problem = check_backend(TritonBackend, KVLayout(1, hkv, d, page_size, dtype, fmt), hq,
                                            torch.device("cuda"))
                    rows.append(dict(model=model, dtype=dtype_name, kv=fmt, page_size=page_size,
                                     ok=problem is None, problem=problem or ""))
    return rows


def print_table(title, rows):
    print(f"\n{title}")
    keys = list(rows[0])
    cells = [[f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "gpu_kernels.json",
                   help="where to write the results (default: %(default)s)")
    p.add_argument("--rep-ms", type=int, default=100, help="timed milliseconds per measurement")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernels.py needs a CUDA device (torch.cuda.is_available() is False). "
              "On CPU the kernels are tested interpreted: python3 -m pytest tests/kernels",
              file=sys.stderr)
        return 2

    import triton.testing

    from radixkv import kernels
    from radixkv.kernels import reference

    def do_bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=args.rep_ms)

    props = torch.cuda.get_device_properties(0)
    print(props)
    device = dict(name=props.name, total_memory_bytes=props.total_memory,
                  multi_processor_count=props.multi_processor_count,
                  capability=f"{props.major}.{props.minor}", torch=torch.__version__,
                  triton=triton.__version__)

    startup = startup_checks()
    print_table("start-up check (what `radixkv serve` runs before serving with triton)", startup)
    correctness = check_correctness(kernels, reference)
    print_table("correctness (compiled kernels vs torch reference)", correctness)
    peak_gbps = peak_copy_bandwidth(do_bench)
    print(f"\ndevice-to-device copy: {peak_gbps:.0f} GB/s (used as the achievable peak)")
    decode = bench_decode(kernels, do_bench, peak_gbps)
    print_table("decode attention (K/V bytes read / time)", decode)
    extend = bench_extend(kernels, do_bench)
    print_table("extend attention (causal FLOPs / time) vs torch SDPA", extend)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(device=device, copy_peak_gbytes_per_s=peak_gbps, startup=startup,
                                         correctness=correctness, decode=decode, extend=extend),
                                    indent=2))
    print(f"\nwrote {args.json}")
    return 0 if all(r["ok"] for r in correctness + startup) else 1


if __name__ == "__main__":
    sys.exit(main())
