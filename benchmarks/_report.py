"""Shared by the benchmark scripts: where results go and how they are written."""

from __future__ import annotations

import json
import platform
import subprocess
import os
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def same_mkl() -> str:
    """Give what runs in this process (the transformers peer, an in-process engine) the MKL
    kernels radixkv's model process takes (`radixkv.model.mkl_dispatch`: AVX-512 on non-Intel
    AVX-512 CPUs); call before any matmul. What MKL runs, in words."""
    from radixkv.model import mkl_dispatch

    return mkl_dispatch.enable()


def machine() -> dict:
    """What the figures were measured on."""
    from radixkv.model import mkl_dispatch

    return {"machine": platform.platform(), "cpu": _cpu_model(), "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "mkl_in_this_process": mkl_dispatch.status(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S")}


def save_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"saved {path}")


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.SubprocessError, StopIteration):
        return platform.processor() or "unknown"


def bar_plot(path: Path, title: str, ylabel: str, values: dict[str, float]) -> None:
    """One bar per entry of `values`, written as a PNG next to the JSON results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar(range(len(values)), list(values.values()))
    ax.set_xticks(range(len(values)), list(values), rotation=15, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for i, v in enumerate(values.values()):
        ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """Lay out, write as a PNG (120 dpi), close and say where: every benchmark's last step of a plot."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"saved {path}")
