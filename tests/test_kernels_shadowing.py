"""Our `kernels/` folder must never stand in for Hugging Face's `kernels` package.

The folder installs as `radixkv.kernels`, but from the repository root (`python -m pytest`,
`python -c` children such as the grammar worker) it is also importable as a top-level `kernels`.
transformers 5.25 imports Hugging Face's `kernels` when it builds a model, and got ours:
`ImportError: cannot import name 'CUDAProperties' from 'kernels'`. These run fresh interpreters
with the repository root as the working directory, as those commands do."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_here(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def hugging_face_kernels_installed() -> bool:
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not hugging_face_kernels_installed(), reason="Hugging Face's kernels package is not installed")
def test_top_level_kernels_from_the_repository_root_is_hugging_faces():
    proc = run_here("import kernels, radixkv.kernels as ours\n"
                    "from kernels import CUDAProperties\n"
                    "print(kernels.__file__)\n"
                    "print(ours.__file__, callable(ours.decode_attention))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs, ours = proc.stdout.split("\n")[:2]
    assert not theirs.startswith(str(ROOT / "kernels")), theirs
    assert ours.startswith(str(ROOT / "kernels")) and ours.endswith("True")


def test_transformers_builds_a_model_from_the_repository_root():
    proc = run_here("from transformers import LlamaConfig, LlamaForCausalLM\n"
                    "cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,\n"
                    "                  num_attention_heads=4, num_key_value_heads=2)\n"
                    "print(type(LlamaForCausalLM(cfg)).__name__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "LlamaForCausalLM"


def test_without_another_kernels_package_transformers_check_reads_it_as_absent():
    # -S: no site-packages, so nothing but the repository root offers a `kernels`. What
    # transformers' `_is_package_available("kernels")` does when no distribution is installed
    # (5.19-5.24): find it, import it, and read a module with neither version nor file as a
    # folder shadowing a package that is not there. Raising there broke `import transformers`.
    check = ("import importlib, importlib.util\n"
             "assert importlib.util.find_spec('kernels') is not None\n"
             "package = importlib.import_module('kernels')\n"
             "absent = getattr(package, '__version__', 'N/A') == 'N/A' and getattr(package, '__file__', None) is None\n"
             "print(absent, [n for n in vars(package) if not n.startswith('__')])")
    proc = run_here(check, "-S")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True []"  # nothing of ours under the name
    proc = run_here("from kernels import decode_attention", "-S")
    assert proc.returncode != 0 and "ImportError" in proc.stderr
