"""LoRAConfig: many LoRA adapters over one base model (SGLang's `--enable-lora` flags).

Requests name an adapter (`lora_path` on /generate, the OpenAI `model` field); a batch mixes
adapters and the base model, each row computed with its own (`radixkv.lora`). Adapters load at
start-up (`--lora-paths`) or at run time (`POST /load_lora_adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixkv.config.fields import is_int, opt, require

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_LORA_RANK = 16


@dataclass(frozen=True)
class LoRAConfig:
    """Which adapters, how many per batch, and the largest rank and the modules they may target."""

    enable_lora: bool = opt(False, "serve LoRA adapters over the base model (implied by --lora-paths)")
    lora_paths: tuple | None = opt(None, "adapters to load at start-up: NAME=PATH or PATH (named after its "
                                   "directory), each a PEFT checkpoint (adapter_config.json + "
                                   "adapter_model.safetensors)", action="append", nargs="+", metavar="NAME=PATH",
                                   default_in_help=True)
    max_loras_per_batch: int = opt(8, "adapters one batch may mix (the base model not counted); each has a slot "
                                   "of device memory")
    max_lora_rank: int | None = opt(None, "the largest adapter rank the slots hold (default: the largest of "
                                    f"--lora-paths, or {DEFAULT_LORA_RANK})")
    lora_target_modules: tuple | None = opt(None, "the modules adapters may target, from "
                                            f"{', '.join(LORA_TARGETS)} or all (default: those --lora-paths "
                                            "target, or all)", action="append", nargs="+", metavar="MODULE",
                                            default_in_help=True)

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(is_int(self.max_loras_per_batch) and 1 <= self.max_loras_per_batch <= 256, "max_loras_per_batch",
              "must be an integer in [1, 256]")
        check(self.max_lora_rank is None or (is_int(self.max_lora_rank) and 1 <= self.max_lora_rank <= 1024),
              "max_lora_rank", "must be an integer in [1, 1024]")
        bad = [m for m in self.targets_given or () if m not in LORA_TARGETS]
        check(not bad, "lora_target_modules", f"{bad[0] if bad else ''!r} is not one of {list(LORA_TARGETS)} or all")
        for name, _ in self.adapters:
            check(bool(name) and "=" not in name and ":" not in name and len(name) <= 128, "lora_paths",
                  f"adapter name {name!r}: 1-128 characters without '=' or ':'")
        names = [name for name, _ in self.adapters]
        check(len(set(names)) == len(names), "lora_paths", "the same adapter name is given twice")

    @property
    def enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    @property
    def adapters(self) -> list[tuple[str, str]]:
        """(name, path) of each --lora-paths entry."""
        out = []
        for given in self.lora_paths or ():
            for item in [given] if isinstance(given, str) else given:
                name, sep, path = str(item).partition("=")
                if not sep:
                    path = name
                    name = path.rstrip("/").rsplit("/", 1)[-1]
                out.append((name, path))
        return out

    @property
    def targets_given(self) -> list[str] | None:
        if not self.lora_target_modules:
            return None
        flat = [m for given in self.lora_target_modules for m in ([given] if isinstance(given, str) else given)]
        return list(LORA_TARGETS) if "all" in flat else flat
