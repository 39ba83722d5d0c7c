"""`radixkv.native.NativeLibrary`: a kernel's build key covers the files its source includes,
so editing an included header rebuilds it rather than loading a stale library."""

import ctypes

import pytest

from radixkv import native

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def test_editing_an_included_header_builds_the_kernel_again(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "probe.cpp").write_text('#include "sub/value.h"\nextern "C" int radixkv_probe_abi() { return 1; }\n'
                                   'extern "C" int radixkv_probe_value() { return VALUE; }\n')
    (src / "sub" / "value.h").write_text('#include "deeper.h"\n#define VALUE DEEPER\n')
    (src / "sub" / "deeper.h").write_text("#define DEEPER 7\n")
    assert [p.name for p in native._sources(src / "probe.cpp")] == ["probe.cpp", "value.h", "deeper.h"]

    def value() -> int:
        lib = native.NativeLibrary("probe", src / "probe.cpp", 1, lambda lib: None).get()
        assert isinstance(lib, ctypes.CDLL)
        return lib.radixkv_probe_value()

    assert value() == 7
    (src / "sub" / "deeper.h").write_text("#define DEEPER 8\n")  # two includes down
    assert value() == 8
    assert len(list((tmp_path / "cache" / "kernels").glob("probe-*.so"))) == 2
