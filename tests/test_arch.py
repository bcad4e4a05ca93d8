"""CPU: the arch dimension. Which capability maps to which arch (the rest: a clear error before
any compile), which families exist on which arch, and the two switches in the rendered source:
the e2m1 encoder and the RHT's tensor-core instruction (``rht_mma``)."""

import dataclasses

import pytest
import torch

from cutequant import _launch, amax, cli, jit, nvfp4
from cutequant.codegen import module_name, render
from cutequant.codegen import specs as S


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend cuda:0 has the given capability."""

    def install(major, minor, name="Fake GPU"):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
        _launch._arch_of.cache_clear()

    yield install
    _launch._arch_of.cache_clear()


@pytest.mark.parametrize(
    "capability, arch", [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((12, 0), "sm_120a")]
)
def test_capability_maps_to_arch(fake_gpu, capability, arch):
    fake_gpu(*capability)
    assert _launch._arch_of(0) == arch
    assert _launch.device_arch(torch.device("cuda", 0)) == arch
    assert arch in S.ARCHS


@pytest.mark.parametrize(
    "capability, name",
    [
        ((8, 0), "A100"),
        ((8, 6), "RTX 3090"),
        ((8, 9), "L40S"),
        ((10, 3), "B300"),
        ((12, 1), "GB10"),
    ],
)
def test_unsupported_gpu_names_its_arch_and_the_supported_ones(fake_gpu, capability, name):
    fake_gpu(*capability, name=name)
    before = jit.stats.compiles
    with pytest.raises(RuntimeError) as info:
        _launch._arch_of(0)
    msg = str(info.value)
    assert f"sm_{capability[0]}{capability[1]}" in msg and name in msg
    for arch in S.ARCHS:
        assert arch in msg
    assert "tested on hardware" in msg and "compile-checked only" in msg
    assert jit.stats.compiles == before


def test_rht_kernels_on_blackwell_use_mma_sync_and_refuse_wgmma():
    """sm_100a: the NVFP4 quantize and RHT amax kernels exist, with the mma.sync RHT; asking
    for wgmma there is refused by name before any compile. sm_120a: persistent kernels, more
    shared memory than a CTA gets there: refused."""
    before = jit.stats.compiles
    q = nvfp4._spec("sm_100a", True, True, True, False, False, False)
    a = amax._spec("sm_100a", True, "bf16")
    assert q.rht_mma_kind() == a.rht_mma_kind() == "mma_sync"
    assert q.rht_mma == a.rht_mma == "auto"  # the arch's own choice
    assert amax._spec("sm_100a", False, "bf16").arch == "sm_100a"
    match = "rht_mma=wgmma is not available on sm_100a; it exists on sm_90a"
    with pytest.raises(S.UnsupportedArchError, match=match):
        nvfp4._spec("sm_100a", True, True, True, False, False, False, rht_mma="wgmma")
    with pytest.raises(S.UnsupportedArchError, match=match):
        amax._spec("sm_100a", True, "bf16", rht_mma="wgmma")
    with pytest.raises(S.UnsupportedArchError, match="nvfp4_quantize with rht_mma=wgmma"):
        cli.spec_from_args("nvfp4_quantize", ["rht_mma=wgmma"], arch="sm_100a")
    for rht in (True, False):
        with pytest.raises(S.UnsupportedArchError, match="exists on sm_90a, sm_100a"):
            amax._spec("sm_120a", rht, "bf16")
    with pytest.raises(S.UnsupportedArchError, match="nvfp4_quantize is not available on sm_120a"):
        nvfp4._spec("sm_120a", True, True, True, False, False, False)
    with pytest.raises(ValueError, match="nvfp4_quantize is not available on sm_120a"):
        cli.spec_from_args("nvfp4_quantize", [], arch="sm_120a")
    assert jit.stats.compiles == before


def test_rht_mma_switch():
    """``rht_mma``: "auto" is the arch's choice and the only stored form of it, left out of the
    key (the sm_90a default kernels keep theirs); mma_sync on sm_90a is its own kernel and
    key; "auto" follows the arch when a spec is moved to another one."""
    for cls in (S.Nvfp4QuantizeSpec, S.GroupAmaxSpec):
        default = cls()
        assert default.rht_mma == "auto" and default.rht_mma_kind() == "wgmma"
        assert cls(rht_mma="wgmma") == default and cls(rht_mma="wgmma").key() == default.key()
        assert "rht_mma" not in default.key() and "rht_mma" not in default.describe()
        mma = cls(rht_mma="mma_sync")
        assert mma.rht_mma_kind() == "mma_sync" and mma.key() != default.key()
        assert '"rht_mma": "mma_sync"' in mma.key() and "rht_mma=mma_sync" in mma.describe()
        assert module_name(mma) != module_name(default)
        moved = dataclasses.replace(default, arch="sm_100a")
        assert moved.rht_mma_kind() == "mma_sync" and moved == cls(arch="sm_100a")
        assert dataclasses.replace(mma, arch="sm_100a") == moved  # mma_sync is sm_100a's own
        assert cls(arch="sm_100a", rht_mma="mma_sync") == moved
        with pytest.raises(ValueError, match="rht_mma must be one of auto, wgmma, mma_sync"):
            cls(rht_mma="tcgen05")
    # without the RHT the amax kernel has no MMA: one kernel, whatever is asked
    assert S.GroupAmaxSpec(rht=False, rht_mma="mma_sync") == S.GroupAmaxSpec(rht=False)
    # the NVFP4 kernel without the RHT: the wgmma kernels build their unused wgmma operands,
    # the mma.sync ones nothing (the GPU tests run that source on sm_90a too)
    plain = S.Nvfp4QuantizeSpec(rht=False)
    assert S.Nvfp4QuantizeSpec(rht=False, rht_mma="mma_sync").key() != plain.key()
    assert "sm90_utils" in render(plain)
    assert "sm90_utils" not in render(S.Nvfp4QuantizeSpec(rht=False, rht_mma="mma_sync"))


@pytest.mark.parametrize(
    "spec",
    [
        S.Nvfp4QuantizeSpec(),
        S.Nvfp4QuantizeSpec(rht_mma="mma_sync"),
        S.Nvfp4QuantizeSpec(arch="sm_100a", rowwise=False, fast_math=True),
        S.GroupAmaxSpec(),
        S.GroupAmaxSpec(rht_mma="mma_sync"),
        S.GroupAmaxSpec(arch="sm_100a"),
    ],
    ids=lambda s: f"{s.arch}-{s.describe()}",
)
def test_rht_instruction_in_the_rendered_source(spec):
    """One template per kernel: the wgmma renders build a tiled wgmma and a B matrix in shared
    memory, the mma.sync renders neither, but the shared warp_rht helpers."""
    src = render(spec)
    wgmma = spec.rht_mma_kind() == "wgmma"
    assert ("warpgroup.fence()" in src) == wgmma
    assert ("sm90_utils.make_trivial_tiled_mma(" in src) == wgmma
    assert ("warp_rht.rht_block(" in src) == (not wgmma)
    assert ("warp_rht.load_a(" in src) == (not wgmma)
    assert ("dev.release_after_loads(pipe, state)" in src) == (
        not wgmma or spec.family == "nvfp4_quantize" and spec.rowwise
    )


def test_unknown_arch_is_refused():
    with pytest.raises(ValueError, match="arch must be one of"):
        S.GroupTablesSpec(arch="sm_89")
    with pytest.raises(ValueError, match="arch must be one of"):
        cli.all_specs("sm_89")


def test_family_archs():
    assert S.ARCHS[0] == "sm_90a"
    assert S.Nvfp4QuantizeSpec.ARCHS == ("sm_90a", "sm_100a")
    assert S.GroupAmaxSpec(rht=True).supported_archs() == ("sm_90a", "sm_100a")
    assert S.GroupAmaxSpec(rht=False).supported_archs() == ("sm_90a", "sm_100a")
    persistent = ("group_amax", "fp8_quantize", "nvfp4_quantize")  # >= 115 KB: not on sm_120a
    for family, cls in cli.FAMILIES.items():
        if family in persistent:
            assert cls.ARCHS == ("sm_90a", "sm_100a"), family
        else:
            assert cls.ARCHS == S.ARCHS, family


def test_module_names_differ_by_arch():
    """Modules of one spec for two archs render differently (the encoder): their names too."""
    a = S.FakeQuantRowsSpec(arch="sm_90a")
    b = S.FakeQuantRowsSpec(arch="sm_100a")
    assert module_name(a) != module_name(b)


@pytest.mark.parametrize("arch", S.ARCHS)
def test_rn_encoder_follows_the_arch_sr_stays_software(arch):
    """sm_90a renders the software encoder, sm_100a / sm_120a the hardware cvt
    (``device.e2m1x8_cvt``); stochastic rounding is the software rule on every arch."""
    hw = arch in S.HW_E2M1_ARCHS
    families = ("fake_quant_rows", "nvfp4_quantize_2d", "nvfp4_quantize")
    rn = [s for s in cli.all_specs(arch) if s.family in families]
    rn = [s for s in rn if not getattr(s, "stochastic", False) and not getattr(s, "amax_pass", 0)]
    assert rn
    for spec in rn:
        source = render(spec)
        if getattr(spec, "fake_out", "") and not hw:  # issue 20: the e2m1 value in fp32
            assert "fq.e2m1_rn_value(" in source and "e2m1x8" not in source, spec.describe()
            continue
        assert ("dev.e2m1x8_cvt(" in source) == hw, spec.describe()
        assert ("dev.e2m1x8(" in source) == (not hw), spec.describe()
    sr = render(S.FakeQuantRowsSpec(arch=arch, stochastic=True))
    assert "fq.e2m1_sr_mag_rz(" in sr and "e2m1x8_cvt" not in sr


def test_hardware_encoder_packs_like_the_software_one():
    """cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the upper nibble: the cvt of element pair
    (2j + 1, 2j) fills byte j, so element 0 lands in bits 0-3 as in ``device.e2m1x8``."""
    from cutequant.kernels import device

    lines = [ln for ln in device._E2M1X8_CVT.split("\n") if "cvt.rn.satfinite" in ln]
    for j, line in enumerate(lines):
        assert f"b{j}, ${2 * j + 2}, ${2 * j + 1};" in line
    assert "mov.b32 $0, {b0, b1, b2, b3};" in device._E2M1X8_CVT


def _quantize_check(x):
    return nvfp4.check_quantize(
        x, [16, 16], True, True, True, amax.DEFAULT_SIGN_MASK, False, False, None, False, None,
        None,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_ops_refuse_missing_families_before_any_launch(monkeypatch, arch):
    """The host checks of the NVFP4 quantize and amax ops raise UnsupportedArchError for a
    family the device's arch lacks (CPU: the device check is replaced by the arch)."""
    from cutequant import _checks

    monkeypatch.setattr(_checks, "check_device", lambda x, name="x": arch)
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    if arch == "sm_100a":
        assert _quantize_check(x)[-1] == arch
        for rht in (True, False):
            assert amax.check_group_amax(x, [16, 16], rht, amax.DEFAULT_SIGN_MASK)[-1] == arch
        return
    with pytest.raises(S.UnsupportedArchError, match=f"nvfp4_quantize is not available on {arch}"):
        _quantize_check(x)
    for rht in (True, False):
        with pytest.raises(
            S.UnsupportedArchError, match="group_amax.* is not available on sm_120a"
        ):
            amax.check_group_amax(x, [16, 16], rht, amax.DEFAULT_SIGN_MASK)


@pytest.mark.parametrize("value", ["auto", "mma_sync", "wgmma", "bogus"])
def test_runtime_rht_mma_choice(monkeypatch, value):
    """CUTEQUANT_RHT_MMA (read once per process: ``_launch.rht_mma``) reaches every spec the
    runtime builds and its caches' keys: the NVFP4 quantize kernel's (spec, grid) and the amax
    op's checks. wgmma is refused on sm_100a before any launch; a bad value names the variable."""
    from types import SimpleNamespace

    from cutequant import _checks

    monkeypatch.setenv("CUTEQUANT_RHT_MMA", value)
    _launch.rht_mma.cache_clear()
    monkeypatch.setattr(_launch, "grid_size", lambda spec, device: 7)
    monkeypatch.setattr(nvfp4, "device_chunk", lambda *args: -1)
    monkeypatch.setattr(nvfp4, "_SPECS", {})
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    try:
        if value == "bogus":
            with pytest.raises(ValueError, match="CUTEQUANT_RHT_MMA must be"):
                _launch.rht_mma()
            return
        assert _launch.rht_mma() == value
        dev = SimpleNamespace(index=0)
        for arch in ("sm_90a", "sm_100a"):
            monkeypatch.setattr(_checks, "check_device", lambda x, name="x", a=arch: a)
            if arch == "sm_100a" and value == "wgmma":
                with pytest.raises(S.UnsupportedArchError, match="rht_mma=wgmma"):
                    _quantize_check(x)
                with pytest.raises(S.UnsupportedArchError, match="rht_mma=wgmma"):
                    amax.check_group_amax(x, [16, 16], True, amax.DEFAULT_SIGN_MASK)
                continue
            _quantize_check(x)
            amax.check_group_amax(x, [16, 16], True, amax.DEFAULT_SIGN_MASK)
            spec, grid = nvfp4._spec_and_grid(dev, arch, True, True, True, False, False, False)
            assert grid == 7
            want = S.RHT_MMA_DEFAULT[arch] if value == "auto" else value
            assert spec.rht_mma_kind() == want, (arch, value)
        assert len(nvfp4._SPECS) == (1 if value == "wgmma" else 2)
        assert all(value in key for key in nvfp4._SPECS)  # the choice is in the cache key
    finally:
        _launch.rht_mma.cache_clear()


@pytest.mark.parametrize(
    "arch, dtype, scaling, ok",
    [
        ("sm_100a", torch.bfloat16, "current", True),
        ("sm_100a", torch.float32, "delayed", True),
        ("sm_120a", torch.bfloat16, "delayed", True),  # the tile cast alone
        ("sm_120a", torch.bfloat16, "current", False),  # needs the persistent amax pass
        ("sm_120a", torch.float32, "delayed", False),  # fp32: the persistent TMA-ring cast
    ],
)
def test_fp8_op_checks_its_kernels_exist_on_the_arch(monkeypatch, arch, dtype, scaling, ok):
    from cutequant import _checks, fp8

    monkeypatch.setattr(_checks, "check_device", lambda x, name="x": arch)
    x = torch.zeros(32, 64, dtype=dtype)
    scale = torch.ones(2) if scaling == "delayed" else None
    args = (x, [16, 16], torch.float8_e4m3fn, scaling, scale, True, True, 0.0, False)
    if ok:
        assert fp8.check_fp8_quantize(*args)[-1] == arch
    else:
        with pytest.raises(S.UnsupportedArchError, match=f"not available on {arch}"):
            fp8.check_fp8_quantize(*args)
