"""Multi-head latent attention: the absorbed form against the up-projected one, the latent pool's
bytes against `kv-size`, and the latent through every part of the cache (formats, pages shared
and copied, eviction, retraction, the host tier)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv.attention import ForwardMode
from radixkv.engine import Engine
from radixkv.kv_size import kv_bytes_per_token
from radixkv.model.mla import MLAAttention, up_projected_attention
from tests.model.conftest import hf_greedy, make_runner
from tests.sched.conftest import greedy, workload

MLA_MODELS = ["deepseek-v2", "deepseek-v3"]  # no q low-rank path; q_lora_rank + YaRN


@pytest.mark.parametrize("name", MLA_MODELS)
def test_absorbed_attention_equals_the_up_projected_form(tiny_model_dir, name):
    """Every layer of a prefill and of a decode step: the output the model computed from the
    latents alone equals per-head K/V expanded from the same latents and attended the textbook way."""
    runner = make_runner(tiny_model_dir(name), compile="off", page_size=4)
    seen = []

    def hook(module, args, kwargs, output):
        x, cos_sin, _, fb = args
        residual = kwargs["residual"]
        seen.append((module, x.clone(), cos_sin, fb, residual.clone(), output.clone()))

    hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in runner.model.layers]
    prompt = [1, 17, 230, 5, 88, 402, 9, 61, 300, 12, 7]
    seq = runner.memory.new_sequence()
    row = runner.memory.req_table.alloc()
    slots = seq.extend(len(prompt))
    runner.memory.req_table.write(row, 0, slots)
    runner.forward(runner.build_batch(ForwardMode.EXTEND, [prompt], [row], [0], slots))
    slot = seq.extend(1)
    runner.memory.req_table.write(row, len(prompt), slot)
    runner.forward(runner.build_batch(ForwardMode.DECODE, [[42]], [row], [len(prompt)], slot))
    for h in hooks:
        h.remove()
    assert len(seen) == 2 * len(runner.model.layers)
    all_slots = torch.tensor(list(slots) + list(slot))
    torch.set_grad_enabled(False)
    for i, (attn, x, cos_sin, fb, residual, output) in enumerate(seen):
        assert isinstance(attn, MLAAttention)
        decode = fb.mode is ForwardMode.DECODE
        latents = runner.memory.pool.k_view(attn.layer).index_select(0, all_slots)[:, 0]  # (L, rank + rope)
        q_nope, q_pe, _ = attn.project(x, cos_sin)
        offset = len(prompt) if decode else 0
        o = up_projected_attention(attn, q_nope, q_pe, latents[: offset + x.shape[0]], offset)  # (n, H, v)
        want = residual + attn.o_proj(o.reshape(x.shape[0], -1))
        assert torch.allclose(output, want, atol=1e-4, rtol=0), (i, (output - want).abs().max())
    torch.set_grad_enabled(True)
    seq.release()


@pytest.mark.parametrize("fmt", ["auto", "fp16", "bf16", "fp8_e4m3", "int8", "int4"])
def test_latent_pool_bytes_per_token_are_what_kv_size_says(tiny_model_dir, fmt):
    path = tiny_model_dir("deepseek-v3")
    runner = make_runner(path, kv_cache_dtype=fmt, compile="off")
    layout = runner.memory.layout
    assert layout.latent and layout.num_kv_heads == 1 and layout.head_dim == 32 + 8
    pool = runner.memory.pool
    assert len(pool.storage[0]) == (1 if fmt in ("auto", "fp16", "bf16", "fp8_e4m3") else 2)  # no V tensors
    measured = pool.nbytes // ((pool.num_pages + 1) * pool.page_size)
    assert measured == layout.bytes_per_token == kv_bytes_per_token(path, "float32" if fmt == "auto" else fmt)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3", "int8", "int4"])
def test_a_quantised_latent_gives_the_same_tokens_from_the_cache_as_computed_fresh(tiny_model_dir, fmt):
    path = tiny_model_dir("deepseek-v2")
    outs = {}
    for cache in (True, False):
        with Engine(str(path), kv_cache_dtype=fmt, disable_radix_cache=not cache, max_total_tokens=2048,
                    page_size=4, progress=False, log_level="warning") as engine:
            for _ in range(2):  # the second time, the prompts are in the cache
                outs[cache] = [o["output_ids"] for o in engine.generate(input_ids=workload(), sampling_params=greedy())]
            if cache:
                assert engine.get_stats()["cached_prompt_tokens"] > 0
    assert outs[True] == outs[False]


def test_latents_survive_eviction_retraction_copy_on_write_and_the_host_tier(tiny_model_dir):
    """A pool too small for the batch (evicts and retracts), pages of 4 (partial pages shared
    and copied on write), and a host tier that takes what is evicted: greedy = transformers."""
    path = tiny_model_dir("deepseek-v2")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = workload()
    want = [hf_greedy(hf, p, 12) for p in prompts]
    with Engine(str(path), max_total_tokens=64, page_size=4, retract_decode_steps=2, host_kv_size="1MiB",
                progress=False, log_level="warning") as engine:
        first = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        again = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        stats = engine.get_stats()
    assert first == want and again == want
    assert stats["retractions"] > 0 and stats["evicted_tokens"] > 0
    assert stats["host_hit_tokens"] > 0


@pytest.mark.parametrize("fmt", ["auto", "int8"])  # the MLA decode kernel; the general kernels on int8 codes
def test_triton_backend_on_latents_matches_the_torch_backend(tiny_model_dir, fmt):
    from radixkv.model.static_batch import generate_static

    path = tiny_model_dir("deepseek-v2")
    prompts = [[1, 17, 230, 5, 88, 402, 9], [1, 44, 3]]
    runs = [generate_static(make_runner(path, page_size=4, attention_backend=backend, kv_cache_dtype=fmt,
                                        compile="off"), prompts, 4, keep_step_logits=True)
            for backend in ("torch", "triton")]
    assert runs[0].output_ids == runs[1].output_ids
    for a, b in zip(runs[0].step_logits, runs[1].step_logits):
        assert torch.allclose(a, b, atol=1e-4, rtol=0)


def test_a_dense_mla_model_runs_compiled_with_the_eager_logits(tiny_model_dir):
    from radixkv.model.static_batch import generate_static

    path = tiny_model_dir("deepseek-v3-dense")
    prompts = [[1, 17, 230, 5, 88, 402, 9], [1, 44, 3]]
    compiled = make_runner(path, compile="on")
    assert compiled.compile_stats()["compiled"] and compiled.compile_stats()["compile_fallback"] is None
    runs = [generate_static(r, prompts, 4, keep_step_logits=True) for r in (compiled, make_runner(path, compile="off"))]
    assert runs[0].output_ids == runs[1].output_ids
    for a, b in zip(runs[0].step_logits, runs[1].step_logits):
        assert torch.allclose(a, b, atol=1e-4, rtol=0)
