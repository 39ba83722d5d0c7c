"""mkdocs hook: the layer diagram of docs/architecture.md, read from pyproject.toml.

The import-linter contract `[tool.importlinter]` is the one statement of the layers (the test
suite holds the code to it); this hook draws it in place of the `<!-- layers -->` marker, so the
page cannot disagree with the contract.
"""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from mkdocs.exceptions import PluginError

MARKER = "<!-- layers -->"
PAGE = "architecture.md"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def layers() -> list[str]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["type"] == "layers")["layers"]


def diagram(top_to_bottom: list[str]) -> str:
    """The layers as one stack of boxes, top to bottom, each as the contract spells it."""
    width = max(map(len, top_to_bottom)) + 2
    out = ["   ┌" + "─" * width + "┐"]
    for i, layer in enumerate(top_to_bottom):
        arrow = " │ " if i < len(top_to_bottom) - 1 else " ▼ "
        out.append(arrow + "│ " + layer.ljust(width - 1) + "│")
        if i < len(top_to_bottom) - 1:
            out.append(" │ ├" + "─" * width + "┤")
    out.append("   └" + "─" * width + "┘")
    return "```text\n" + "\n".join(out) + "\n```\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} lost its {MARKER} marker")
    return markdown.replace(MARKER, diagram(layers()))
