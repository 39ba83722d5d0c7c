"""ModelRunner: the model and one forward over the KV memory it is given.

`ModelRunner.load(config)` builds everything a runner needs from one `EngineConfig`: it loads
the checkpoint (prepacking linear layers on CPU), sets the compute threads, sizes a `KVMemory`
for the model (a token budget, or a share of free memory) and hands it to the runner; the
scheduler receives the same `KVMemory`. The runner keeps no per-request state: it runs forwards
for batches of requests described by their request-table rows and prefix lengths.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from radixkv.attention import ForwardBatch, ForwardMode, make_backend
from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.mem import KVLayout
from radixkv.mem.kv_memory import KVMemory
from radixkv.model.cpu_runtime import choose_num_threads, packing_supported, tune_malloc, usable_cores
from radixkv.model.llama import LlamaForCausalLM
from radixkv.model.loader import load_model, resolve_model_dir

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig, model: LlamaForCausalLM, memory: KVMemory, model_dir: Path,
                 context_length: int):
        self.config = config
        self.model = model
        self.model_config = model.config
        self.memory = memory
        self.model_dir = model_dir
        self.context_length = context_length
        self.device = memory.device
        self.dtype = config.torch_dtype
        self.num_threads = None  # torch compute threads, when `load` chose them
        self.backend = make_backend(config.attention_backend_name, memory.pool, memory.req_table.table)

    @classmethod
    def load(cls, config: EngineConfig, progress: bool = True) -> ModelRunner:
        """Load the model named by `config` and give it a KV memory sized by `config`."""
        num_threads = choose_num_threads(config.num_threads)
        device, dtype = config.torch_device, config.torch_dtype
        if device.type == "cpu":
            tune_malloc()
        model_dir = resolve_model_dir(config.model, config.cache_dir)
        model = load_model(model_dir, device, dtype, progress=progress)
        packed = model.prepack_for_cpu() if packing_supported(device, dtype) else 0
        mc = model.config
        context_length = config.context_length or mc.max_position_embeddings
        if context_length > mc.max_position_embeddings:
            raise ConfigError(f"context_length={context_length} exceeds the model's "
                              f"max_position_embeddings={mc.max_position_embeddings}")
        layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.page_size, dtype,
                          config.kv_cache_dtype)
        memory = KVMemory.sized(layout, max_reqs=config.max_running_requests, context_length=context_length,
                                device=device, max_total_tokens=config.max_total_tokens,
                                mem_fraction=config.kv_mem_fraction, host_kv_size=config.host_kv_size,
                                host_write_policy=config.host_write_policy)
        runner = cls(config, model, memory, model_dir, context_length)
        runner.num_threads = num_threads
        logger.info(
            "model %s: %d layers, %d/%d heads, %s on %s; KV pool %d tokens (%d pages of %d), "
            "%.1f MiB, %d bytes/token (kv_cache_dtype %s); attention backend %s",
            mc.architecture, mc.num_layers, mc.num_heads, mc.num_kv_heads, str(dtype).replace("torch.", ""),
            device, memory.total_tokens, memory.allocator.num_pages, config.page_size,
            memory.pool.nbytes / 2**20, layout.bytes_per_token, config.kv_cache_dtype, runner.backend.name,
        )
        logger.info("%d torch threads (%s; %d usable cores); %s", num_threads,
                    "num_threads option" if config.num_threads is not None else "from CPU affinity",
                    usable_cores(), f"{packed} linear layers prepacked for oneDNN" if packed
                    else "linear layers not prepacked (needs CPU + float32)")
        return runner

    @property
    def layout(self) -> KVLayout:
        return self.memory.layout

    @property
    def max_total_tokens(self) -> int:
        return self.memory.total_tokens

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits (N, V) float32 of the rows `fb.logits_index`; stores the new tokens' KV."""
        return self.model(fb, self.backend)

    def build_batch(
        self,
        mode: ForwardMode,
        token_ids: list[list[int]],
        req_rows: list[int],
        prefix_lens: list[int],
        out_cache_loc: list[int] | torch.Tensor,
        logits: str = "last",
    ) -> ForwardBatch:
        return ForwardBatch.build(mode, token_ids, req_rows, prefix_lens, out_cache_loc,
                                  device=self.device, logits=logits)
