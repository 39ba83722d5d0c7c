"""ModelRunner: the model, its KV memory (pool, page allocator, request table) and one forward.

The runner sizes the KV pool from a token budget (`max_total_tokens`) or a share of free
memory, and runs forwards for batches of extend or decode requests described by their request
table rows and prefix lengths. It keeps no per-request state: the scheduler owns requests.
"""

from __future__ import annotations

import logging

import torch

from radixkv.attention import ForwardBatch, ForwardMode, make_backend
from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.mem import KVLayout, KVPool, PageAllocator, ReqToTokenTable
from radixkv.model.cpu_runtime import choose_num_threads, packing_supported, tune_malloc, usable_cores
from radixkv.model.loader import load_model, resolve_model_dir

logger = logging.getLogger(__name__)


def available_memory(device: torch.device) -> int:
    """Free bytes on `device` (GPU memory for CUDA, host memory otherwise)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


class ModelRunner:
    def __init__(self, config: EngineConfig, progress: bool = True):
        self.config = config
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        self.num_threads = choose_num_threads(config.num_threads)
        if self.device.type == "cpu":
            tune_malloc()
        self.model_dir = resolve_model_dir(config.model, config.cache_dir)
        self.model = load_model(self.model_dir, self.device, self.dtype, progress=progress)
        packed = self.model.prepack_for_cpu() if packing_supported(self.device, self.dtype) else 0
        self.model_config = mc = self.model.config
        self.context_length = config.context_length or mc.max_position_embeddings
        if self.context_length > mc.max_position_embeddings:
            raise ConfigError(
                f"context_length={self.context_length} exceeds the model's "
                f"max_position_embeddings={mc.max_position_embeddings}"
            )
        self.layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.page_size, self.dtype)
        num_pages = self._num_pages()
        self.pool = KVPool(self.layout, num_pages, self.device)
        self.allocator = PageAllocator(num_pages, config.page_size)
        self.req_table = ReqToTokenTable(config.max_running_requests, self.context_length, self.device)
        self.backend = make_backend(config.attention_backend_name, self.pool, self.req_table.table)
        logger.info(
            "model %s: %d layers, %d/%d heads, %s on %s; KV pool %d tokens (%d pages of %d), "
            "%.1f MiB, %d bytes/token; attention backend %s",
            mc.architecture, mc.num_layers, mc.num_heads, mc.num_kv_heads, str(self.dtype).replace("torch.", ""),
            self.device, self.allocator.total_tokens, num_pages, config.page_size,
            self.pool.nbytes / 2**20, self.layout.bytes_per_token, self.backend.name,
        )
        logger.info("%d torch threads (%s; %d usable cores); %s", self.num_threads,
                    "--num-threads" if config.num_threads is not None else "from CPU affinity",
                    usable_cores(), f"{packed} linear layers prepacked for oneDNN" if packed
                    else "linear layers not prepacked (needs CPU + float32)")

    def _num_pages(self) -> int:
        cfg = self.config
        if cfg.max_total_tokens is not None:
            return self.layout.num_pages_for(max_tokens=cfg.max_total_tokens)
        budget = int(cfg.kv_mem_fraction * available_memory(self.device))
        pages = self.layout.num_pages_for(max_bytes=budget)
        # no use for more than every running request at full context
        cap = -(-cfg.max_running_requests * self.context_length // cfg.page_size)
        return min(pages, cap)

    @property
    def max_total_tokens(self) -> int:
        return self.allocator.total_tokens

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
