"""CPU: every kernel variant compiles for sm_90a (no GPU needed), and compiles are counted."""

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


def test_memory_and_disk_cache_without_gpu(monkeypatch, tmp_path):
    """A CPU-only machine writes a TVM-FFI object that a fresh lookup loads instead of
    compiling (what ``cutequant precompile`` on a build box relies on)."""
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(tmp_path))
    jit.clear_memory_cache()
    spec = ALL[-1]
    compiles, writes, loads = jit.stats.compiles, jit.stats.disk_writes, jit.stats.disk_loads
    first = jit.get_kernel(spec, use_disk=True)
    assert jit.get_kernel(spec, use_disk=True) is first
    assert jit.stats.compiles == compiles + 1
    assert jit.stats.disk_writes == writes + 1
    obj, meta, _ = jit._disk_paths(spec)
    assert obj.stat().st_size > 1000 and meta.exists()
    jit.clear_memory_cache()
    again = jit.get_kernel(spec, use_disk=True)
    assert jit.stats.compiles == compiles + 1, "recompiled although the disk held the entry"
    assert jit.stats.disk_loads >= loads + 1
    assert type(again).__name__ == "Function"  # a tvm_ffi.Function
    jit.clear_memory_cache()
