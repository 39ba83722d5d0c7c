"""mkdocs hook: the benchmark plots, served from where the benchmarks write them.

`benchmarks/run_all.py` and each benchmark script save their plots to `benchmarks/results/*.png`;
this hook adds every one of them to the site as `img/NAME.png`, so a page shows the current plot
without a copy under docs/ that could go stale.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files, config):
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"img/{png.name}", abs_src_path=str(png)))
    return files
