"""Our model code on the paged pool against transformers on tiny random checkpoints."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv.attention import ForwardMode
from radixkv.model.static_batch import generate_static
from tests.model.conftest import TINY, hf_greedy, make_runner

LOGIT_ATOL = 1e-4  # fp32, same math in another order
PROMPTS = [[1, 17, 230, 5, 88, 402, 9, 61, 300, 12, 7], [1, 44, 3], [1, 250, 251, 252, 253, 90, 91]]


@pytest.mark.parametrize("name", sorted(TINY))
def test_greedy_tokens_and_logits_match_transformers(tiny_model_dir, name):
    path = tiny_model_dir(name)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = make_runner(path, compile="auto")  # compiled on CPU, as served: every architecture's graph
    res = generate_static(runner, PROMPTS, 12, return_prefill_logits=True)
    for prompt, ours in zip(PROMPTS, res.output_ids):
        assert ours == hf_greedy(hf, prompt, 12)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPTS[0]])).logits[0]  # (L, V)
    got = res.prefill_logits[: len(PROMPTS[0])]
    assert torch.allclose(got, ref, atol=LOGIT_ATOL, rtol=0), (got - ref).abs().max()
    assert runner.memory.allocator.free_pages == runner.memory.allocator.num_pages


def fragment(runner):
    """Leave the allocator's free list shuffled so sequences get scattered pages."""
    pages = runner.memory.allocator.alloc(runner.memory.allocator.free_pages)
    perm = torch.randperm(len(pages), generator=torch.Generator().manual_seed(0)).tolist()
    runner.memory.allocator.decref([pages[i] for i in perm])


@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_at_once_equals_prefix_then_extend_equals_token_by_token(tiny_model_dir, page_size):
    runner = make_runner(tiny_model_dir("qwen2"), page_size=page_size)
    fragment(runner)
    prompt = list(range(3, 40))  # 37 tokens: the split point below falls mid-page
    row = runner.memory.req_table.alloc()

    def run(chunks):
        """Feed `prompt` in chunks (one forward each); return logits of every position."""
        seq = runner.memory.new_sequence()
        rows = []
        for chunk in chunks:
            start = seq.num_tokens
            slots = seq.extend(len(chunk))
            runner.memory.req_table.write(row, start, slots)
            mode = ForwardMode.DECODE if len(chunk) == 1 and start else ForwardMode.EXTEND
            fb = runner.build_batch(mode, [chunk], [row], [start], slots, logits="all")
            rows.append(runner.forward(fb))
        seq.release()
        return torch.cat(rows)  # (L, V)

    at_once = run([prompt])
    prefix_then_extend = run([prompt[:21], prompt[21:]])
    one_by_one = run([[t] for t in prompt])
    assert torch.allclose(prefix_then_extend, at_once, atol=LOGIT_ATOL, rtol=0)
    assert torch.allclose(one_by_one, at_once, atol=LOGIT_ATOL, rtol=0)


def test_extend_reads_a_prefix_computed_by_another_request(tiny_model_dir):
    """Two requests share prefix pages (as the radix cache arranges): same logits as alone."""
    runner = make_runner(tiny_model_dir("llama"), page_size=4)
    prompt = list(range(5, 30))
    shared = runner.memory.new_sequence()
    r0, r1 = runner.memory.req_table.alloc(), runner.memory.req_table.alloc()
    slots = shared.extend(16)
    runner.memory.req_table.write(r0, 0, slots)
    runner.forward(runner.build_batch(ForwardMode.EXTEND, [prompt[:16]], [r0], [0], slots))
    child = runner.memory.sequence_from_prefix(shared.pages, 16)
    runner.memory.req_table.write(r1, 0, child.slots())
    tail = child.extend(len(prompt) - 16)
    runner.memory.req_table.write(r1, 16, tail)
    fb = runner.build_batch(ForwardMode.EXTEND, [prompt[16:]], [r1], [16], tail, logits="all")
    reused = runner.forward(fb)
    fresh = generate_static(runner, [prompt], 1, return_prefill_logits=True).prefill_logits
    assert torch.allclose(reused, fresh[16:], atol=LOGIT_ATOL, rtol=0)
    child.release()
    shared.release()


def test_triton_backend_matches_torch_backend(tiny_model_dir):
    """The Triton kernels (interpreted on CPU) inside the real model give the same tokens."""
    path = tiny_model_dir("llama")
    prompts = [PROMPTS[0][:7], PROMPTS[1]]
    torch_out = generate_static(make_runner(path, page_size=4), prompts, 4, keep_step_logits=True)
    triton_out = generate_static(make_runner(path, page_size=4, attention_backend="triton"),
                                 prompts, 4, keep_step_logits=True)
    assert triton_out.output_ids == torch_out.output_ids
    for a, b in zip(triton_out.step_logits, torch_out.step_logits):
        assert torch.allclose(a, b, atol=LOGIT_ATOL, rtol=0)


def test_every_backend_gives_the_same_tokens_on_mixed_batches(tiny_model_dir):
    """Decode rows riding beside prefill chunks: torch, Triton (interpreted) and reference agree."""
    from radixkv.engine import Engine

    prompts = [[5, 6, 7], list(range(40, 70))]  # the short one decodes while the long one prefills

    def run(backend):
        with Engine(str(tiny_model_dir("llama")), attention_backend=backend, chunked_prefill_size=8,
                    max_total_tokens=512, progress=False, log_level="warning") as engine:
            outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 6, "temperature": 0})
            assert engine.get_stats()["mixed_steps"] >= 3
            return [o["output_ids"] for o in outs]

    assert run("triton") == run("torch") == run("reference")
