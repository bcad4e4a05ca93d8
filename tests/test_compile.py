"""CPU: every kernel variant compiles for sm_90a (no GPU needed), and compiles are counted."""

import contextlib
import ctypes.util
import dataclasses

import pytest

from cutequant import cli, jit

ALL = cli.all_specs("sm_90a")


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.describe())
def test_compiles_for_sm90a(spec):
    before = jit.stats.compiles
    compiled = jit.compile_spec(spec)
    assert compiled is not None
    assert jit.stats.compiles == before + 1


@pytest.mark.parametrize(
    "spec",
    [dataclasses.replace(s, pdl=False) for s in (ALL[0], ALL[2], ALL[-1], ALL[-37])],
    ids=lambda s: s.describe(),
)
def test_compiles_without_pdl(spec):
    assert not spec.pdl
    assert jit.compile_spec(spec) is not None


def test_memory_cache_compiles_once(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(tmp_path))
    jit.clear_memory_cache()
    spec = ALL[-1]
    before = jit.stats.compiles
    # Without a CUDA driver the object export fails: the kernel stays in memory, with a warning.
    no_driver = ctypes.util.find_library("cuda") is None
    with pytest.warns(UserWarning, match="disk cache") if no_driver else contextlib.nullcontext():
        first = jit.get_kernel(spec, use_disk=True)
    assert jit.get_kernel(spec, use_disk=True) is first
    assert jit.stats.compiles == before + 1
