import torch

from radixkv.config import EngineConfig
from radixkv.model.runner import ModelRunner
from tests.tiny_models import TINY  # noqa: F401  (re-exported for the tests here)


def make_runner(model_dir, **kw):
    cfg = dict(model=str(model_dir), max_total_tokens=4096, max_running_requests=8)
    return ModelRunner.load(EngineConfig.from_kwargs(**{**cfg, **kw}), progress=False)


def hf_greedy(hf_model, prompt, n):
    """transformers generate, greedy, exactly n new tokens."""
    ids = torch.tensor([prompt])
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()
