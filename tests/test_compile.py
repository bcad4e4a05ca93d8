"""CPU: every kernel variant compiles, for every arch it exists on (``cli.all_specs(arch)``),
without a GPU into one TVM-FFI kernel whose exported object carries a cubin of that arch;
compiles are counted. sm_90a is tested on hardware; sm_100a / sm_120a are compile-checked only
(README, Hardware). The RHT's instruction (spec field ``rht_mma``) is checked in the PTX: wgmma
on sm_90a by default, mma.sync m16n8k16 on sm_100a and in the sm_90a mma.sync variants the GPU
tests run (``CUTEQUANT_RHT_MMA=mma_sync``)."""

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


LONG_TILES = [
    dataclasses.replace(s, col_tokens=tokens, col_ring=ring, col_scale_words=words, col_regs=0)
    for s in ALL
    if s.family == "dequantize" and s.columnwise and not s.transposed_out
    for tokens, ring, words in [(t, 0, False) for t in S.DEQUANT_COL_TOKENS[1:]]
    + [(256, r, False) for r in S.DEQUANT_COL_RINGS[1:]]
    + [(256, r, True) for r in S.DEQUANT_COL_RINGS if s.fmt == "nvfp4" and not s.swizzled]
    # precompiled ones are in ALL; the shared-memory staging of the FP8 ring (col_regs 0) is
    # an A/B variant (dequant_ab_variants)
    if ring == 0 or s.fmt == "nvfp4" or s.out_dtype == "f32"
    if dataclasses.replace(s, col_tokens=tokens, col_ring=ring, col_scale_words=words, col_regs=0)
    != s
]


@pytest.mark.parametrize("spec", LONG_TILES, ids=lambda s: s.describe())
def test_longer_columnwise_dequantize_tiles_compile(spec, tmp_path, launch_smem):
    """The columnwise dequantize's 128- / 256-token tiles (``DequantizeSpec.col_tokens``), the
    256-token sub-tile ring (``col_ring``) and scale words (``col_scale_words``), the A/B
    variants not in ``all_specs``, compile within the shared memory of a CTA."""
    _check_compiled(jit.compile_spec(spec), tmp_path)
    assert len(launch_smem) == 1 and int(launch_smem[0]) <= 64 * 1024 + 1024


@pytest.mark.parametrize("spec", S.dequant_ab_variants(), ids=lambda s: s.describe())
def test_dequantize_hint_and_tail_variants_compile(spec, tmp_path, launch_smem):
    """The dequantize A/B variants (``specs.dequant_ab_variants``: ``cache_hints``, ``col_tail``,
    ``col_regs``, module flags ``dequant.CACHE_HINTS`` / ``COLUMNWISE_TAIL`` /
    ``COLUMNWISE_REGS``) compile, within 16 KB of shared memory as their bases."""
    _check_compiled(jit.compile_spec(spec), tmp_path)
    assert len(launch_smem) == 1 and int(launch_smem[0]) <= 16 * 1024 + 1024


@pytest.mark.parametrize("spec", cli.fma_encoder_variants(), ids=lambda s: s.describe())
def test_fma_encoder_variants_compile(spec, tmp_path):
    """The A/B side of ``nvfp4.FMA_ENCODER`` (default on: ``cli.fma_encoder_variants``, every
    RN alu_trim kernel without the FMA-pipe encoder) compiles."""
    _check_compiled(jit.compile_spec(spec), tmp_path)


@pytest.mark.parametrize("spec", cli.stsm_restage_variants(), ids=lambda s: s.describe())
def test_stsm_restage_variants_compile(spec, tmp_path):
    """The A/B side of ``nvfp4.STSM_RESTAGE`` (default off: ``cli.stsm_restage_variants``, fast
    math's wgmma kernels with the restage from accumulator register pairs) compiles."""
    _check_compiled(jit.compile_spec(spec), tmp_path)


@pytest.mark.parametrize("spec", cli.sr_trim_variants(), ids=lambda s: s.describe())
def test_sr_trim_variants_compile(spec, tmp_path):
    """The A/B side of ``nvfp4.SR_TRIM`` (default on: ``cli.sr_trim_variants``, every SR
    alu_trim kernel without the trimmed SR encoder) compiles."""
    _check_compiled(jit.compile_spec(spec), tmp_path)


@pytest.mark.parametrize("spec", cli.fake_quant_sr_trim_variants(), ids=lambda s: s.describe())
def test_fake_quant_sr_trim_variants_compile(spec, tmp_path):
    """The other side of ``fake_quant.SR_TRIM`` (default on: ``cli.fake_quant_sr_trim_variants``,
    the stochastic fake-quant kernels with ``sr_trim`` flipped) compiles."""
    _check_compiled(jit.compile_spec(spec), tmp_path)


@pytest.mark.parametrize(
    "spec",
    [dataclasses.replace(s, pdl=False) for s in (ALL[0], ALL[2], ALL[-1], ALL[-37])],
    ids=lambda s: s.describe(),
)
def test_compiles_without_pdl(spec, tmp_path):
    assert not spec.pdl
    _check_compiled(jit.compile_spec(spec), tmp_path)


def test_every_family_on_hopper_and_the_blackwell_families():
    """sm_90a and sm_100a have every family (the RHT kernels with mma.sync on sm_100a); sm_120a
    (99 KB of shared memory per CTA) not the persistent kernels."""
    families = {s.family for s in ALL}
    assert families == set(cli.FAMILIES)
    blackwell = {
        "sm_100a": families,
        "sm_120a": families - {"nvfp4_quantize", "group_amax", "fp8_quantize"},
    }
    for arch, expected in blackwell.items():
        specs = cli.all_specs(arch)
        assert {s.family for s in specs} == expected
        assert all(s.arch == arch for s in specs)

    def rht_kernels(arch):  # nvfp4_quantize (43 variants x with / without alu_trim), the RHT
        # amax (3: splits given, device int32 / int64 splits)
        rht_families = ("nvfp4_quantize", "group_amax")
        return [s for s in cli.all_specs(arch) if s.family in rht_families and s.uses_rht_mma()]

    assert [s.rht_mma_kind() for s in rht_kernels("sm_90a")] == ["wgmma"] * 89
    assert [s.rht_mma_kind() for s in rht_kernels("sm_100a")] == ["mma_sync"] * 89


# The sm_90a mma.sync variants the GPU tests run (CUTEQUANT_RHT_MMA=mma_sync): one per branch of
# the templates (restaging bf16 / fp32, SR, compact / swizzled, round-robin chunks, no RHT),
# checked in the PTX; the rest differ from sm_100a's (compiled above) by the e2m1 encoder only.
_CHUNKED = S.TilePlan(chunk=S.Nvfp4QuantizeSpec.MEMORY_BOUND_CHUNK)
MMA_SYNC_ON_HOPPER = [
    S.Nvfp4QuantizeSpec(rht_mma="mma_sync"),
    S.Nvfp4QuantizeSpec(
        rht_mma="mma_sync", rowwise=False, swizzled=True, fast_math=True, stochastic=True
    ),
    S.Nvfp4QuantizeSpec(rht_mma="mma_sync", plan=_CHUNKED),
    S.Nvfp4QuantizeSpec(rht_mma="mma_sync", rowwise=False, rht=False, swizzled=True),
    S.GroupAmaxSpec(rht_mma="mma_sync"),
]
MMA_SYNC = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
LDMATRIX = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"


@pytest.mark.parametrize(
    "spec",
    [*MMA_SYNC_ON_HOPPER, S.Nvfp4QuantizeSpec(), S.Nvfp4QuantizeSpec(arch="sm_100a")],
    ids=lambda s: f"{s.arch}-{s.describe()}",
)
def test_rht_instruction_in_the_ptx(spec, tmp_path):
    compiled = jit.compile_spec(spec, f"--keep-ptx --dump-dir={tmp_path}")
    _check_compiled(compiled, tmp_path, spec.arch)
    ptx = compiled.artifacts.PTX
    assert f".target {spec.arch}" in ptx
    if not spec.rht:
        assert MMA_SYNC not in ptx and LDMATRIX not in ptx and "wgmma" not in ptx
    elif spec.rht_mma_kind() == "wgmma":
        assert "wgmma.mma_async" in ptx and MMA_SYNC not in ptx
    else:
        # one ldmatrix.x4 per 16-token block feeds two MMAs (n = 0..7, 8..15), whose C is -0.0
        # (D = A B + (-0) = A B, as wgmma without C)
        assert "wgmma" not in ptx
        assert ptx.count(MMA_SYNC) == 2 * ptx.count(LDMATRIX) > 0
        assert "0f80000000" in ptx
