"""The layer order (docs/architecture.md, "Layers") holds: `lint-imports` checks the contracts in
pyproject.toml (an import only points down; no circle between the modules of any package).

import-linter reads the package from where it is installed, and `kernels/` and `frontend/`
install inside radixkv (as radixkv.kernels and radixkv.frontend), so the check runs over a copy
of the package laid out as it installs."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "radixkv", dest / "radixkv", ignore=ignore)
    shutil.copytree(ROOT / "kernels", dest / "radixkv" / "kernels", ignore=ignore)
    shutil.copytree(ROOT / "frontend", dest / "radixkv" / "frontend", ignore=ignore)
    return dest


def test_import_contracts_are_kept(tmp_path):
    pytest.importorskip("importlinter")
    site = installed_layout(tmp_path / "site")
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout, done.stdout


def test_every_top_level_module_has_a_layer():
    """A module the layers contract does not name is not checked at all (`retention` was left out)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    modules = {p.stem for p in (ROOT / "radixkv").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert modules | {"kernels", "frontend"} == named, (modules | {"kernels", "frontend"}) ^ named
