"""GPU: NVFP4 fake-quant (rowwise fused kernel, columnwise in the RHT domain, 2D weights) is
bit-identical to dequantize(quantize(x)): against cutequant.recipe_reference and against the
quantize + dequantize kernels themselves; and the straight-through Linear."""

import pytest
import torch
from recipe_util import assert_same_bits

import cutequant
from cutequant import dequant, fake_quant, nvfp4_2d, recipe_reference, reference, replay
from cutequant.testing import grouped_input, poisoned_outputs, random_splits

pytestmark = pytest.mark.gpu

# tests that run SR without a ``stochastic`` parameter (the Linear's backward)
_SR_WITHOUT_PARAM = ("test_fake_quant_linear",)


@pytest.fixture(autouse=True, params=[False, True], ids=["srt-off", "srt-on"])
def sr_trim(request, monkeypatch):
    """Every SR test twice: ``fake_quant.SR_TRIM`` off and on (the default: the sr_trim
    kernels; ``-k srt-on`` runs only those, the RN-only tests skip there)."""
    if request.param:
        params = getattr(request.node, "callspec", None)
        stochastic = params.params.get("stochastic") if params else None
        if stochastic is False or (
            stochastic is None and request.node.originalname not in _SR_WITHOUT_PARAM
        ):
            pytest.skip("RN only: sr_trim changes the SR kernels")
    monkeypatch.setattr(fake_quant, "SR_TRIM", request.param)
    replay.invalidate()  # recorded launches hold the kernel of the other side
    yield
    replay.invalidate()


def _rng_state(gen):
    return torch.randint(0, 2**62, (2,), generator=gen, dtype=torch.int64).cuda()


def _splits_arg(splits, device):
    return torch.tensor(splits, dtype=torch.int32, device="cuda") if device else tuple(splits)


@pytest.mark.parametrize("carve", [False, True], ids=["op-outputs", "carved"])
@pytest.mark.parametrize("device", [False, True], ids=["host-splits", "device-splits"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
def test_rows(stochastic, out_dtype, device, carve, rng):
    """``carve``: the eager call's one allocation (y and the amax part, with device splits the
    tables too: fake_quant._outputs); else the op's separate outputs."""
    splits = random_splits(7, None, rng, zero_at=("front", "middle"), mean_rows=150)
    x = grouped_input(splits, 272, rng)
    rng_state = _rng_state(rng) if stochastic else None
    args = (x, _splits_arg(splits, device), None, stochastic, rng_state, out_dtype)
    fake_quant._check_fake_quantize(*args)
    with poisoned_outputs():
        y, amax = fake_quant.nvfp4_fake_quantize_rows_impl(*args, carve)
    torch.cuda.synchronize()
    want_amax = reference.group_amax(x, splits, rht=False)[0]
    assert_same_bits(amax, want_amax, "amax_row")
    want = recipe_reference.nvfp4_fake_quantize_rows(
        x, splits, want_amax, rng_state=rng_state, out_dtype=out_dtype
    )
    assert_same_bits(y, want, "fake rows vs reference")
    # the real pipeline: quantize kernel, then dequantize kernel
    q = cutequant.nvfp4_group_quantize(
        x, splits, columnwise=False, rht=False, stochastic_rounding=stochastic, rng_state=rng_state
    )
    assert_same_bits(y, dequant.nvfp4_group_dequantize(q, out_dtype=out_dtype), "vs kernels")


@pytest.mark.parametrize("case", ["one-group", "300-groups", "given-amax"])
def test_rows_groups_and_given_amax(case, rng):
    if case == "one-group":
        splits = [2048]
    else:
        splits = random_splits(300, None, rng, zero_at=("front", "middle", "end"), mean_rows=48)
    x = grouped_input(splits, 256, rng)
    amax = None
    if case == "given-amax":
        amax = torch.rand(len(splits), generator=rng).cuda() * 100
    y, a = fake_quant.nvfp4_fake_quantize_rows_impl(
        x, tuple(splits), amax, False, None, torch.bfloat16
    )
    want_amax = reference.group_amax(x, splits, rht=False)[0] if amax is None else amax
    assert_same_bits(a, want_amax, "amax")
    want = recipe_reference.nvfp4_fake_quantize_rows(x, splits, want_amax)
    assert_same_bits(y, want, case)


@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
def test_rows_extremes(stochastic, rng):
    rng_state = _rng_state(rng) if stochastic else None
    splits = [64, 0, 64, 64]
    x = torch.zeros(192, 128, dtype=torch.bfloat16, device="cuda")
    x[64:128] = torch.finfo(torch.bfloat16).max
    x[64:128:2] *= -1
    x[128:] = torch.randn(64, 128, device="cuda").to(torch.bfloat16)
    x[130, 17] = float("nan")
    x[140, 100] = float("inf")
    y, a = fake_quant.nvfp4_fake_quantize_rows_impl(
        x, tuple(splits), None, stochastic, rng_state, torch.bfloat16
    )
    want = recipe_reference.nvfp4_fake_quantize_rows(x, splits, a, rng_state=rng_state)
    assert_same_bits(y, want, "extremes")


@pytest.mark.parametrize("carve", [False, True], ids=["op-outputs", "carved"])
@pytest.mark.parametrize("device", [False, True], ids=["host-splits", "device-splits"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("rht", [True, False], ids=["rht", "no-rht"])
def test_columnwise(rht, stochastic, device, carve, rng):
    splits = random_splits(6, None, rng, zero_at=("middle",), mean_rows=160)
    x = grouped_input(splits, 256, rng)
    rng_state = _rng_state(rng) if stochastic else None
    args = (
        x,
        _splits_arg(splits, device),
        None,
        stochastic,
        rng_state,
        torch.bfloat16,
        rht,
        0xD7E8,
    )
    fake_quant._check_fake_quantize(*args)
    with poisoned_outputs():
        y, amax = fake_quant.nvfp4_fake_quantize_columnwise_impl(
            x, _splits_arg(splits, device), None, rht, 0xD7E8, stochastic, rng_state,
            torch.bfloat16, carve,
        )  # fmt: skip
    torch.cuda.synchronize()
    want_amax = reference.group_amax(x, splits, rht=rht)[1]
    assert_same_bits(amax, want_amax, "amax_col")
    want = recipe_reference.nvfp4_fake_quantize_columnwise(
        x, splits, want_amax, rht=rht, sign_mask=0xD7E8, rng_state=rng_state
    )
    assert y.shape == (x.numel(),)
    assert_same_bits(y, want, "fake columnwise")


def _two_kernel_columnwise(x, splits, amax_col, rht, sign_mask, rng_state, out_dtype):
    """The columnwise fake-quant as it was before the fused kernel: the columnwise quantize
    kernel, then the dequantize kernel's transposed_out mode (e2m1 data through memory)."""
    q = cutequant.nvfp4_group_quantize(
        x, splits, rowwise=False, rht=rht, sign_mask=sign_mask,
        amax=torch.stack([amax_col, amax_col]), stochastic_rounding=rng_state is not None,
        rng_state=rng_state,
    )  # fmt: skip
    dq_splits = splits if isinstance(splits, torch.Tensor) else tuple(splits)
    (y,) = dequant.nvfp4_group_dequantize_impl(
        q.col_data, q.col_scales, q.amax_col, dq_splits, x.shape[1], True, False, False,
        sign_mask, out_dtype, True,
    )  # fmt: skip
    return y


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("rht", [True, False], ids=["rht", "no-rht"])
def test_columnwise_fused_equals_quantize_then_dequantize(rht, stochastic, out_dtype, rng):
    """The fused kernel against the two kernels it replaced, and against the reference: N = 400
    (a partial 256-column tile, a 16-column piece), groups of 16..1000 rows (partial 64-row
    tiles), zero-token groups; sign mask 0xD7E8 and, with the RHT, 0 (all-positive column 0)."""
    splits = [48, 0, 1008, 16, 272, 0, 64, 528]
    x = grouped_input(splits, 400, rng)
    rng_state = _rng_state(rng) if stochastic else None
    for mask in (0xD7E8, 0) if rht else (0xD7E8,):
        with poisoned_outputs():
            y, amax = fake_quant.nvfp4_fake_quantize_columnwise_impl(
                x, tuple(splits), None, rht, mask, stochastic, rng_state, out_dtype
            )
        want_amax = reference.group_amax(x, splits, rht=rht, sign_mask=mask)[1]
        assert_same_bits(amax, want_amax, "amax_col")
        old = _two_kernel_columnwise(x, splits, want_amax, rht, mask, rng_state, out_dtype)
        assert_same_bits(y, old, f"fused vs quantize + dequantize, mask {mask:#x}")
        want = recipe_reference.nvfp4_fake_quantize_columnwise(
            x, splits, want_amax, rht=rht, sign_mask=mask, rng_state=rng_state, out_dtype=out_dtype
        )
        assert_same_bits(y, want, f"fused vs reference, mask {mask:#x}")


@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize(
    "case", ["one-group", "300-groups", "given-amax", "device-300", "device-given-carved"]
)
def test_columnwise_groups_and_given_amax(case, stochastic, rng):
    if case == "one-group":
        splits = [2048]
    else:
        splits = random_splits(300, None, rng, zero_at=("front", "middle", "end"), mean_rows=48)
    x = grouped_input(splits, 256, rng)
    amax = None
    if "given" in case:
        amax = torch.rand(len(splits), generator=rng).cuda() * 100
    arg = torch.tensor(splits, device="cuda") if case.startswith("device") else tuple(splits)
    rng_state = _rng_state(rng) if stochastic else None
    with poisoned_outputs():  # carved: the table kernel writes the tables into the outputs
        y, a = fake_quant.nvfp4_fake_quantize_columnwise_impl(
            x, arg, amax, True, 0xD7E8, stochastic, rng_state, torch.bfloat16, "carved" in case
        )
    want_amax = reference.group_amax(x, splits)[1] if amax is None else amax
    assert_same_bits(a, want_amax, "amax")
    want = recipe_reference.nvfp4_fake_quantize_columnwise(
        x, splits, want_amax, rng_state=rng_state
    )
    assert_same_bits(y, want, case)


@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("rht", [True, False], ids=["rht", "no-rht"])
def test_columnwise_extremes(rht, stochastic, rng):
    """All-zero groups, +-bf16 max (saturated scales), NaN / inf entries (the NaN and inf
    groups' amax is NaN / inf), blocks whose scale rounds to 0 beside an outlier, and a given
    amax below the data's (values saturate at 6)."""
    splits = [64, 0, 64, 64, 32, 48]
    x = torch.zeros(272, 256, dtype=torch.bfloat16, device="cuda")
    big = torch.finfo(torch.bfloat16).max
    x[64:128] = big
    x[64:128:2] *= -1
    x[128:192] = torch.randn(64, 256, device="cuda").to(torch.bfloat16)
    x[130, 17] = float("nan")
    x[140, 100] = float("inf")
    x[192:224] = torch.randn(32, 256, device="cuda").to(torch.bfloat16)
    x[200, 3] = -float("inf")
    x[224:272] = (torch.randn(48, 256, device="cuda") * 1e-3).to(torch.bfloat16)
    x[224, 0] = 1e4  # the group's other blocks get scale 0 (amax * S_enc / 6 < 2^-10)
    rng_state = _rng_state(rng) if stochastic else None
    for amax in (None, torch.full((6,), 0.01, device="cuda")):
        y, a = fake_quant.nvfp4_fake_quantize_columnwise_impl(
            x, tuple(splits), amax, rht, 0xD7E8, stochastic, rng_state, torch.bfloat16
        )
        if amax is None:
            assert_same_bits(a, reference.group_amax(x, splits, rht=rht)[1], "amax")
        want = recipe_reference.nvfp4_fake_quantize_columnwise(
            x, splits, a, rht=rht, rng_state=rng_state
        )
        assert_same_bits(y, want, f"extremes, given amax {amax is not None}")


def test_columnwise_is_one_launch_after_the_amax_pass(rng):
    """A given amax: one kernel; none: the amax pass and the fused kernel (was three)."""
    splits = [128, 64, 192]
    x = grouped_input(splits, 512, rng)
    amax = torch.ones(3, device="cuda")
    for given, launches in ((amax, 1), (None, 2)):
        fake_quant.nvfp4_fake_quantize_columnwise_impl(  # compile / load outside the profile
            x, tuple(splits), given, True, 0xD7E8, False, None, torch.bfloat16
        )
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fake_quant.nvfp4_fake_quantize_columnwise_impl(
                x, tuple(splits), given, True, 0xD7E8, False, None, torch.bfloat16
            )
            torch.cuda.synchronize()
        assert cutequant_kernels(prof) == launches


@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "cols"])
def test_given_amax_is_copied_by_the_kernel(columnwise, rng):
    """A given amax: the op returns a copy of it, which the fake-quant kernel's CTA 0 writes
    (no torch clone: one launch in all, checked and replayed), bit-equal to the given one."""
    splits = [128, 0, 64, 192]
    x = grouped_input(splits, 512, rng)
    amax = torch.rand(4, generator=rng).cuda() * 10
    for _ in range(3):  # first sighting, cached, then replayed
        with poisoned_outputs():
            y, a = cutequant.nvfp4_fake_quantize(x, splits, columnwise=columnwise, amax=amax)
        assert a.data_ptr() != amax.data_ptr()
        assert_same_bits(a, amax, "amax copy")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with poisoned_outputs():
            y2, a2 = cutequant.nvfp4_fake_quantize(x, splits, columnwise=columnwise, amax=amax)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    launched = [n for n in names if "fill" not in n.lower()]  # the poisoning fills
    assert len(launched) == 1 and launched[0].startswith("kernel_cutlass"), names
    assert_same_bits(a2, amax, "replayed amax copy")
    assert_same_bits(y2, y, "replayed y")


def cutequant_kernels(prof) -> int:
    """CuTe DSL kernels a profile saw."""
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # CuTe DSL kernels are named kernel_cutlass_*: torch's copies and fills (a given amax's
    # clone, a runtime buffer made on first use) and memcpys are not counted
    return len([n for n in names if n.startswith("kernel_cutlass")])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("listed", [False, True], ids=["stacked", "list"])
def test_weights_2d(listed, dtype, rng):
    w = (torch.randn(3, 144, 272, generator=rng) * 3).to(dtype).cuda()
    weights = [w[e].clone() for e in range(3)] if listed else w
    with poisoned_outputs():
        y, amax = nvfp4_2d.nvfp4_fake_quantize_2d_impl(weights, None, torch.bfloat16)
    torch.cuda.synchronize()
    want, want_amax = recipe_reference.nvfp4_fake_quantize_2d_experts(w.cpu())
    assert_same_bits(amax, want_amax, "amax")
    assert_same_bits(y, want, "fake 2D")
    q = nvfp4_2d.nvfp4_quantize_weights_2d(weights)  # the real 2D kernel, dequantized
    for e in range(3):
        d = reference.nvfp4_dequantize(
            q.col_data[e].cpu(), q.col_scales[e].cpu(), q.amax[e].cpu(), shape=(272, 144)
        )
        assert_same_bits(y[e].t(), d.to(torch.bfloat16), f"expert {e} columnwise")


def test_fake_quant_linear(rng):
    """Forward bit-exact (fake-quant of x and W, bf16 GEMM); gradients close to the exact ones
    (straight-through; stochastic rounding keeps them unbiased)."""
    m, k, n = 256, 512, 384
    x = (torch.randn(m, k, generator=rng)).to(torch.bfloat16).cuda().requires_grad_()
    w = (torch.randn(n, k, generator=rng) / 20).to(torch.bfloat16).cuda().requires_grad_()
    b = torch.randn(n, generator=rng).to(torch.bfloat16).cuda().requires_grad_()
    y = fake_quant.nvfp4_fake_quant_linear(x, w, b)
    xq, _ = fake_quant.nvfp4_fake_quantize_rows_impl(
        x.detach(), (m,), None, False, None, torch.bfloat16
    )
    wq, _ = nvfp4_2d.nvfp4_fake_quantize_2d_impl(w.detach()[None], None, torch.bfloat16)
    assert torch.equal(y, xq @ wq[0].t() + b)
    dy = torch.randn(m, n, generator=rng).to(torch.bfloat16).cuda()
    y.backward(dy)
    exact_dx = dy.float() @ w.detach().float()
    exact_dw = dy.float().t() @ x.detach().float()
    for got, ref in ((x.grad, exact_dx), (w.grad, exact_dw)):
        assert got.shape == ref.shape and got.dtype == torch.bfloat16
        assert (got.float() - ref).norm() / ref.norm() < 0.35  # a wiring bug gives > 1
    assert torch.equal(b.grad, dy.sum(0))
