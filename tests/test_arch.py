"""CPU: the arch dimension. Which capability maps to which arch (the rest: a clear error before
any compile), which families exist on which arch, and the encoder switch in the rendered source."""

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


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_wgmma_families_refuse_blackwell_with_a_clear_error(arch):
    before = jit.stats.compiles
    with pytest.raises(S.UnsupportedArchError, match=f"nvfp4_quantize is not available on {arch}"):
        nvfp4._spec(arch, True, True, True, False, False, False)
    with pytest.raises(
        S.UnsupportedArchError, match=f"rht=true is not available on {arch}.*sm_90a"
    ):
        amax._spec(arch, True, "bf16")
    if arch == "sm_100a":
        assert amax._spec(arch, False, "bf16").arch == arch  # the plain amax exists there
    else:  # a persistent kernel: more shared memory than an sm_120a CTA gets
        with pytest.raises(S.UnsupportedArchError, match="exists on sm_90a, sm_100a"):
            amax._spec(arch, False, "bf16")
    assert jit.stats.compiles == before
    with pytest.raises(ValueError, match="nvfp4_quantize is not available"):
        cli.spec_from_args("nvfp4_quantize", [], arch=arch)


def test_unknown_arch_is_refused():
    with pytest.raises(ValueError, match="arch must be one of"):
        S.GroupTablesSpec(arch="sm_89")
    with pytest.raises(ValueError, match="arch must be one of"):
        cli.all_specs("sm_89")


def test_family_archs():
    assert S.ARCHS[0] == "sm_90a"
    assert S.Nvfp4QuantizeSpec.ARCHS == ("sm_90a",)
    assert S.GroupAmaxSpec(rht=True).supported_archs() == ("sm_90a",)
    assert S.GroupAmaxSpec(rht=False).supported_archs() == ("sm_90a", "sm_100a")
    persistent = ("group_amax", "fp8_quantize")  # >= 115 KB of smem: not on sm_120a
    for family, cls in cli.FAMILIES.items():
        if family in persistent:
            assert cls.ARCHS == ("sm_90a", "sm_100a"), family
        elif family != "nvfp4_quantize":
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
    rn = [s for s in cli.all_specs(arch) if s.family in ("fake_quant_rows", "nvfp4_quantize_2d")]
    rn = [s for s in rn if not getattr(s, "stochastic", False) and not getattr(s, "amax_pass", 0)]
    assert rn
    for spec in rn:
        source = render(spec)
        assert ("dev.e2m1x8_cvt(" in source) == hw, spec.describe()
        assert ("dev.e2m1x8(" in source) == (not hw), spec.describe()
    sr = render(S.FakeQuantRowsSpec(arch=arch, stochastic=True))
    assert "sr.e2m1x8_sr(" in sr and "e2m1x8_cvt" not in sr
    if arch == "sm_90a":  # the Hopper-only NVFP4 quantize kernel keeps the software encoder
        assert "dev.e2m1x8(" in render(S.Nvfp4QuantizeSpec(stochastic=False))


def test_hardware_encoder_packs_like_the_software_one():
    """cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the upper nibble: the cvt of element pair
    (2j + 1, 2j) fills byte j, so element 0 lands in bits 0-3 as in ``device.e2m1x8``."""
    from cutequant.kernels import device

    lines = [ln for ln in device._E2M1X8_CVT.split("\n") if "cvt.rn.satfinite" in ln]
    for j, line in enumerate(lines):
        assert f"b{j}, ${2 * j + 2}, ${2 * j + 1};" in line
    assert "mov.b32 $0, {b0, b1, b2, b3};" in device._E2M1X8_CVT


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_ops_refuse_missing_families_before_any_launch(monkeypatch, arch):
    """The host checks of the NVFP4 quantize and amax ops raise UnsupportedArchError for a
    family the device's arch lacks (CPU: the device check is replaced by the arch)."""
    from cutequant import _checks

    monkeypatch.setattr(_checks, "check_device", lambda x, name="x": arch)
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    with pytest.raises(S.UnsupportedArchError, match=f"nvfp4_quantize is not available on {arch}"):
        nvfp4.check_quantize(
            x, [16, 16], True, True, True, amax.DEFAULT_SIGN_MASK, False, False, None, False,
            None, None,
        )  # fmt: skip
    with pytest.raises(S.UnsupportedArchError, match=f"not available on {arch}"):
        amax.check_group_amax(x, [16, 16], True, amax.DEFAULT_SIGN_MASK)
    if arch == "sm_100a":
        assert amax.check_group_amax(x, [16, 16], False, amax.DEFAULT_SIGN_MASK)[-1] == arch
    else:
        with pytest.raises(S.UnsupportedArchError, match="group_amax is not available on sm_120a"):
            amax.check_group_amax(x, [16, 16], False, amax.DEFAULT_SIGN_MASK)


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
