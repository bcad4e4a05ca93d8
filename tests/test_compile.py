"""CPU: every kernel variant compiles, for every arch it exists on (``cli.all_specs(arch)``),
without a GPU into one TVM-FFI kernel whose exported object carries a cubin of that arch;
compiles are counted. sm_90a is tested on hardware; sm_100a / sm_120a are compile-checked only
(README, Hardware)."""

import dataclasses

import cutlass.memory
import pytest
from cubins import embedded_cubin_archs
from cutlass.cutlass_dsl import cutlass as dsl

from cutequant import cli, jit
from cutequant.codegen import specs as S

ALL = cli.all_specs("sm_90a")
EVERY_ARCH = [s for arch in S.ARCHS for s in cli.all_specs(arch)]


def _check_compiled(compiled, tmp_path, arch="sm_90a"):
    assert type(compiled).__name__ == "TVMFFIJitCompiledFunctionWithKwargs"
    assert compiled.has_gpu_module and len(compiled.kernel_info) == 1  # one kernel per spec
    obj = tmp_path / "kernel.o"
    compiled.export_to_c(str(obj), function_name="probe_fn")
    data = obj.read_bytes()
    assert embedded_cubin_archs(data) == [arch]
    assert b"__tvm_ffi_probe_fn" in data  # the symbol load_module(enable_tvm_ffi=True) looks up


@pytest.fixture
def launch_smem(monkeypatch):
    """The dynamic shared memory of every kernel launch traced while compiling."""
    seen: list = []
    launch = dsl.KernelLauncher.launch

    def record(self, *args, **kwargs):
        seen.append(kwargs.get("smem", 0))
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(dsl.KernelLauncher, "launch", record)
    return seen


@pytest.mark.parametrize("spec", EVERY_ARCH, ids=lambda s: f"{s.arch}-{s.describe()}")
def test_compiles_for_arch(spec, tmp_path, launch_smem):
    before = jit.stats.compiles
    compiled = jit.compile_spec(spec)
    assert jit.stats.compiles == before + 1
    _check_compiled(compiled, tmp_path, spec.arch)
    # a launch asking for more shared memory than the arch gives a CTA compiles but fails
    capacity = cutlass.memory.get_smem_capacity_in_bytes(spec.arch.rstrip("a"))
    assert len(launch_smem) == 1
    assert int(launch_smem[0] or 0) <= capacity, (spec.arch, launch_smem[0], capacity)


@pytest.mark.parametrize(
    "spec",
    [dataclasses.replace(s, pdl=False) for s in (ALL[0], ALL[2], ALL[-1], ALL[-37])],
    ids=lambda s: s.describe(),
)
def test_compiles_without_pdl(spec, tmp_path):
    assert not spec.pdl
    _check_compiled(jit.compile_spec(spec), tmp_path)


def test_every_family_on_hopper_and_the_blackwell_families():
    """sm_90a has every family; sm_100a everything but the wgmma-RHT kernels; sm_120a (99 KB of
    shared memory per CTA) neither the persistent kernels."""
    families = {s.family for s in ALL}
    assert families == set(cli.FAMILIES)
    blackwell = {
        "sm_100a": families - {"nvfp4_quantize"},
        "sm_120a": families - {"nvfp4_quantize", "group_amax", "fp8_quantize"},
    }
    for arch, expected in blackwell.items():
        specs = cli.all_specs(arch)
        assert {s.family for s in specs} == expected
        assert not any(s.family == "group_amax" and s.rht for s in specs)
        assert all(s.arch == arch for s in specs)
