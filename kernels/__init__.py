"""Paged-attention kernels: Triton fast paths and their torch references (same signatures).

`store_kv`, `extend_attention`, `decode_attention` and `mla_decode_attention` (latent attention,
absorbed) are the Triton kernels (CUDA, or the CPU interpreter under `TRITON_INTERPRET=1`);
`reference` holds the torch versions that the `torch` attention backend calls and the tests
compare against.

This folder installs as `radixkv.kernels`. Wherever the repository root is on `sys.path` (`python
-m pytest` or `python -c` run from it), it is also found as a top-level `kernels`, the name of
Hugging Face's package that transformers imports when it builds a model. Imported under that
name, it hands the name on to the next `kernels` on the path and defines nothing of its own.
Where there is none, it stays an empty stand-in without `__file__` or `__version__`, which is
how transformers' availability check recognises a folder shadowing a package that is not
installed (raising there made `import transformers` fail from the repository root wherever
Hugging Face's package is absent, as in transformers before 5.25).
"""

if __name__ == "kernels":
    def _yield_to_the_next_kernels() -> None:
        import importlib.machinery
        import importlib.util
        import os
        import sys

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != root]
        spec = importlib.machinery.PathFinder.find_spec("kernels", rest)
        if spec is None or spec.loader is None:
            globals()["__file__"] = None  # (transformers: "a namespace package shadowing, not a real install")
            globals()["__path__"] = []  # and none of our modules is found as `kernels.<name>`
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernels"] = module  # what `import kernels` returns, since it reads sys.modules
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["kernels"]
            raise

    _yield_to_the_next_kernels()
    del _yield_to_the_next_kernels  # (the stand-in, if it stays, holds nothing)
else:
    from . import reference
    from .decode_attention import decode_attention
    from .extend_attention import extend_attention
    from .mla_decode import mla_decode_attention
    from .store_kv import store_kv

    __all__ = ["decode_attention", "extend_attention", "mla_decode_attention", "reference", "store_kv"]
