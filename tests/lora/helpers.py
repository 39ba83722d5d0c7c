"""Random PEFT LoRA adapters (non-zero B, so they change the tokens) and transformers' greedy
tokens of the base model with an adapter merged (`merge_and_unload`): the reference."""

from pathlib import Path

import pytest
import torch

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir, out_dir, seed: int, rank: int = 4, targets=ALL, scale: float = 1.0) -> Path:
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), torch_dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False,
                             lora_dropout=0.0)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def merged_greedy(base_dir, adapter_dir, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of `prompt` by the base model with `adapter_dir` merged in
    (None: the base model alone)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), torch_dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()
