"""CPU: every kernel variant compiles for sm_90a without a GPU into one TVM-FFI kernel whose
exported object carries an sm_90a cubin; compiles are counted."""

import dataclasses

import pytest
from cubins import embedded_cubin_archs

from cutequant import cli, jit

ALL = cli.all_specs("sm_90a")


def _check_compiled(compiled, tmp_path):
    assert type(compiled).__name__ == "TVMFFIJitCompiledFunctionWithKwargs"
    assert compiled.has_gpu_module and len(compiled.kernel_info) == 1  # one kernel per spec
    obj = tmp_path / "kernel.o"
    compiled.export_to_c(str(obj), function_name="probe_fn")
    data = obj.read_bytes()
    assert embedded_cubin_archs(data) == ["sm_90a"]
    assert b"__tvm_ffi_probe_fn" in data  # the symbol load_module(enable_tvm_ffi=True) looks up


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.describe())
def test_compiles_for_sm90a(spec, tmp_path):
    before = jit.stats.compiles
    compiled = jit.compile_spec(spec)
    assert jit.stats.compiles == before + 1
    _check_compiled(compiled, tmp_path)


@pytest.mark.parametrize(
    "spec",
    [dataclasses.replace(s, pdl=False) for s in (ALL[0], ALL[2], ALL[-1], ALL[-37])],
    ids=lambda s: s.describe(),
)
def test_compiles_without_pdl(spec, tmp_path):
    assert not spec.pdl
    _check_compiled(jit.compile_spec(spec), tmp_path)
