"""The torch.library ops (``cutequant::*``): fake implementations (CPU, under FakeTensorMode),
``torch.library.opcheck``, torch.compile (fullgraph, reduce-overhead / CUDA graphs) and
streams (GPU)."""

import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cutequant
from cutequant import nvfp4, ops, recipe_reference, reference
from cutequant.testing import grouped_input, random_splits

OPS = torch.ops.cutequant
MASK = cutequant.amax.DEFAULT_SIGN_MASK


def _groups_args(splits, device_splits):
    if device_splits:
        return torch.tensor(splits, dtype=torch.int32, device="cuda"), None
    return None, list(splits)


# --------------------------------------------------------------------------- CPU: schemas, fakes


def test_every_public_op_is_registered():
    for name in ops.OPS:
        op = getattr(OPS, name).default
        assert str(op._schema).startswith(f"cutequant::{name}(")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CUDA")


@pytest.mark.parametrize(
    "rowwise,columnwise,device_splits",
    [(True, True, False), (True, False, True), (False, True, False), (True, True, True)],
)
def test_nvfp4_fake_shapes(rowwise, columnwise, device_splits):
    """The fake implementation's shapes are the eager buffers' (nvfp4.output_parts): exact
    sizes for host splits, upper bounds for device splits."""
    splits = [64, 0, 128, 48]
    m, n = sum(splits), 256
    with FakeTensorMode():
        x = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        dev = torch.empty(len(splits), dtype=torch.int32, device="cuda")
        out = OPS.nvfp4_group_quantize(
            x, dev if device_splits else None, None if device_splits else splits,
            rowwise, columnwise, True, MASK, False, False, None, False, None, None,
        )  # fmt: skip
    host = None if device_splits else splits
    parts = nvfp4.output_parts(m, n, len(splits), rowwise, columnwise, host)
    for got, key in zip(out[:4], ("row_data", "row_scales", "col_data", "col_scales"), strict=True):
        want = parts[key][0] if parts[key] else (0,)
        assert tuple(got.shape) == tuple(want) and got.dtype == torch.uint8, key
    rs = sum(-(-s // 128) * 128 for s in splits) if host else m + 127 * len(splits)
    assert parts["row_scales"] is None or parts["row_scales"][0] == (rs, 16)
    assert tuple(out[4].shape) == (2, 4) and out[4].dtype == torch.float32
    assert tuple(out[5].shape) == ((6,) if device_splits else (0,))


def test_fp8_and_amax_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(96, 64, dtype=torch.float16, device="cuda")
        row, col, scales, amax, snap = OPS.fp8_group_quantize(
            x, None, [32, 64], torch.float8_e5m2, "delayed",
            torch.empty(2, device="cuda"), False, True, 0.0, False,
        )  # fmt: skip
        a = OPS.group_amax(x, torch.empty(5, dtype=torch.int64, device="cuda"), None, False, 0)
        inv = torch.empty(2, device="cuda")
        fp8 = torch.float8_e5m2
        d = OPS.fp8_group_dequantize(col, fp8, inv, None, [32, 64], 64, True, torch.float32)
    assert tuple(row.shape) == (0,) and tuple(col.shape) == (96 * 64,)
    assert col.dtype == torch.uint8 and tuple(scales.shape) == (2, 2)  # fp8 bytes
    assert tuple(amax.shape) == (1, 2) and tuple(snap.shape) == (0,)
    assert tuple(a.shape) == (2, 5) and tuple(d.shape) == (96, 64) and d.dtype == torch.float32


def test_eager_calls_do_not_touch_the_op_boundary(monkeypatch):
    """The eager path never dispatches through torch.ops (its host cost); only tracing does.
    Checked without a GPU: a CPU tensor fails the device check before any op would run."""
    called = []
    monkeypatch.setattr(ops, "nvfp4_group_quantize_traced", lambda *a: called.append(a))
    x = torch.zeros(32, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        cutequant.nvfp4_group_quantize(x, [32])
    assert not called


# --------------------------------------------------------------------------- GPU: opcheck


def _opcheck(op, args, device_splits):
    # With device splits the scale buffers have upper-bound sizes whose tails the kernels
    # never write (uninitialized bytes), so the run-twice-and-compare utility is left out.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if not device_splits:
        utils = (*utils, "test_aot_dispatch_dynamic")
    torch.library.opcheck(op, args, test_utils=utils)


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize("rht", [True, False])
def test_opcheck_group_amax(rht, device_splits, rng):
    splits = random_splits(5, 640, rng, zero_at=("middle",))
    x = grouped_input(splits, 256, rng)
    _opcheck(OPS.group_amax, (x, *_groups_args(splits, device_splits), rht, MASK), device_splits)


NVFP4_FLAGS = [
    # rowwise, columnwise, rht, swizzled, fast_math, stochastic, given amax, estimation
    (True, True, True, False, False, False, False, None),
    (True, True, True, True, True, False, False, None),
    (True, False, False, True, False, False, True, None),
    (False, True, True, False, False, True, False, None),
    (True, True, False, False, False, True, True, None),
    (True, True, True, True, False, False, False, 2.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize("flags", NVFP4_FLAGS, ids=str)
def test_opcheck_nvfp4_quantize(flags, device_splits, rng):
    rowwise, columnwise, rht, swizzled, fast, sr, given, est = flags
    splits = random_splits(4, 512, rng, zero_at=("front",))
    x = grouped_input(splits, 256, rng)
    amax = torch.stack(cutequant.group_amax(x, splits)) if given else None
    rng_state = torch.tensor([11, 3], device="cuda") if sr else None
    args = (
        x, *_groups_args(splits, device_splits), rowwise, columnwise, rht, MASK, swizzled, fast,
        amax, sr, rng_state, est,
    )  # fmt: skip
    _opcheck(OPS.nvfp4_group_quantize, args, device_splits)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "device_splits,columnwise,swizzled", list(itertools.product((False, True), repeat=3))
)
def test_opcheck_nvfp4_dequantize(device_splits, columnwise, swizzled, rng):
    splits = random_splits(4, 512, rng, zero_at=("end",))
    x = grouped_input(splits, 256, rng)
    dev_splits, _ = _groups_args(splits, True)
    res = cutequant.nvfp4_group_quantize(
        x, dev_splits if device_splits else splits, swizzled_scales=swizzled
    )  # device splits: upper-bound scale buffers, as the dequantize checks
    side = "col" if columnwise else "row"
    args = (
        getattr(res, f"{side}_data"), getattr(res, f"{side}_scales"),
        res.amax_col if columnwise else res.amax_row, *_groups_args(splits, device_splits),
        256, columnwise, swizzled, columnwise, MASK, torch.bfloat16,
    )  # fmt: skip
    _opcheck(OPS.nvfp4_group_dequantize, args, False)


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize(
    "scaling,rowwise,columnwise,dtype",
    [
        ("current", True, True, torch.bfloat16),
        ("delayed", True, True, torch.float16),
        ("current", False, True, torch.float32),
        ("delayed", True, False, torch.bfloat16),
    ],
)
def test_opcheck_fp8(scaling, rowwise, columnwise, dtype, device_splits, rng):
    splits = random_splits(3, 384, rng, zero_at=("middle",))
    x = grouped_input(splits, 128, rng).to(dtype)
    scale = torch.full((3,), 2.0, device="cuda") if scaling == "delayed" else None
    fp8 = torch.float8_e4m3fn
    args = (x, *_groups_args(splits, device_splits), fp8, scaling, scale, rowwise, columnwise)
    _opcheck(OPS.fp8_group_quantize, (*args, 0.0, False), device_splits)
    res = cutequant.fp8_group_quantize(x, splits, scaling=scaling, scale=scale)
    data = res.row_data.view(torch.uint8)
    dq = (data, fp8, res.scale_inv, None, splits, 128, False, torch.bfloat16)
    _opcheck(OPS.fp8_group_dequantize, dq, False)


# --------------------------------------------------------------------------- GPU: dequantize


@pytest.mark.gpu
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("device_splits", [False, True])
def test_nvfp4_dequantize_every_group_bit_exact(swizzled, device_splits, rng):
    """Both sides, every group, against the reference's per-group dequantize (bit for bit)."""
    splits = random_splits(6, 1024, rng, zero_at=("front", "end"))
    x = grouped_input(splits, 384, rng)
    s = torch.tensor(splits, device="cuda") if device_splits else splits
    res = cutequant.nvfp4_group_quantize(x, s, swizzled_scales=swizzled)
    ref = reference.nvfp4_group_quantize(x, splits, swizzled_scales=swizzled)
    rows = cutequant.nvfp4_group_dequantize(res, out_dtype=torch.float32).cpu()
    cols = cutequant.nvfp4_group_dequantize(res, columnwise=True, out_dtype=torch.float32).cpu()
    row0 = 0
    for g, m_g in enumerate(splits):
        if m_g:
            r = ref[g]
            want = reference.nvfp4_dequantize(
                r["row_data"], r["row_scales"], r["amax_row"], shape=(m_g, 384), swizzled=swizzled
            )
            assert torch.equal(rows[row0 : row0 + m_g], want.cpu()), g
            col = reference.nvfp4_dequantize(
                r["col_data"], r["col_scales"], r["amax_col"], shape=(384, m_g), swizzled=swizzled
            )
            want_c = recipe_reference.inverse_rht_exact(col, MASK)  # the kernels' fp32 order
            assert torch.equal(cols[row0 : row0 + m_g], want_c.cpu()), g
        row0 += m_g


# --------------------------------------------------------------------------- GPU: torch.compile


def _quantize_dequantize_matmul(x, splits, w):
    q = cutequant.nvfp4_group_quantize(x, splits, swizzled_scales=True)
    y = cutequant.nvfp4_group_dequantize(q)
    f = cutequant.fp8_group_quantize(x, splits)
    z = cutequant.fp8_group_dequantize(f)
    amax_row, _ = cutequant.group_amax(x, splits)
    return (
        y @ w,
        z @ w,
        q.row_data,
        q.row_scales,
        q.col_data,
        f.col_data.view(torch.uint8),
        amax_row,
    )


def _assert_bit_equal(got, want, splits):
    """Every output bit for bit; of the row scales (index 3), the rows the kernel writes (with
    device splits the buffer has M + 127 G rows, of which sum(roundup(M_g, 128)) are used)."""
    used = sum(-(-s // 128) * 128 for s in splits)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        if i == 3:
            a, b = a[:used], b[:used]
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), i


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
def test_compile_fullgraph_matches_eager(device_splits, rng):
    torch._dynamo.reset()
    splits = random_splits(4, 1024, rng, zero_at=("middle",))
    x = grouped_input(splits, 256, rng)
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    s = torch.tensor(splits, device="cuda") if device_splits else splits
    eager = _quantize_dequantize_matmul(x, s, w)
    compiled = torch.compile(_quantize_dequantize_matmul, fullgraph=True)(x, s, w)
    _assert_bit_equal(compiled, eager, splits)


@pytest.mark.gpu
def test_reduce_overhead_changing_device_splits_no_recompile(rng):
    """CUDA graphs (mode="reduce-overhead") with new split values on the device each step:
    bit-identical to eager every time, one compiled graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(_quantize_dequantize_matmul, mode="reduce-overhead", fullgraph=True)
    splits_dev = torch.zeros(4, dtype=torch.int64, device="cuda")
    x = torch.empty(1024, 256, device="cuda", dtype=torch.bfloat16)
    for step in range(5):
        splits = random_splits(4, 1024, rng, zero_at=("front",) if step == 3 else ())
        splits_dev.copy_(torch.tensor(splits))
        x.copy_(grouped_input(splits, 256, rng))
        got = [t.clone() for t in fn(x, splits_dev, w)]
        _assert_bit_equal(got, _quantize_dequantize_matmul(x, splits_dev, w), splits)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


# --------------------------------------------------------------------------- GPU: streams


@pytest.mark.gpu
def test_ops_follow_the_current_stream(rng):
    """Work queued on a side stream is ordered before each op called there: the input is
    written on the side stream behind a long matmul chain, then quantized with no sync; the
    results equal those on the default stream."""
    splits = random_splits(3, 768, rng)
    x_new = grouped_input(splits, 512, rng)
    want = (
        cutequant.nvfp4_group_quantize(x_new, splits).row_data.clone(),
        cutequant.fp8_group_quantize(x_new, splits).col_data.view(torch.uint8).clone(),
        torch.stack(cutequant.group_amax(x_new, splits)).clone(),
    )
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    x = torch.zeros_like(x_new)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):
            big = big @ big * 1e-3  # keeps the side stream busy for milliseconds
        x.copy_(x_new)
        got = (
            cutequant.nvfp4_group_quantize(x, splits).row_data,
            cutequant.fp8_group_quantize(x, splits).col_data.view(torch.uint8),
            torch.stack(cutequant.group_amax(x, splits)),
        )
    side.synchronize()
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- recipe ops


def test_recipe_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(128, 64, dtype=torch.bfloat16, device="cuda")
        y, a = OPS.nvfp4_fake_quantize(
            x, None, [64, 64], True, True, MASK, False, None, None, torch.float16
        )
        w = torch.empty(3, 32, 48, dtype=torch.bfloat16, device="cuda")
        rd, rs, cd, cs, wa = OPS.nvfp4_quantize_weights_2d(w, [], True, False, True, None)
        experts = [torch.empty(32, 48, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        fq, fa = OPS.nvfp4_fake_quantize_weights_2d(None, experts, None, torch.bfloat16)
    assert tuple(y.shape) == (128 * 64,) and y.dtype == torch.float16 and tuple(a.shape) == (2,)
    assert tuple(rd.shape) == (3, 32, 24) and tuple(rs.shape) == (3, 128, 4)
    assert tuple(cd.shape) == (0,) and tuple(cs.shape) == (0,) and tuple(wa.shape) == (3,)
    assert tuple(fq.shape) == (2, 32, 48) and tuple(fa.shape) == (2,)


@pytest.mark.gpu
@pytest.mark.parametrize("device_splits", [False, True])
@pytest.mark.parametrize(
    "columnwise,stochastic", [(False, False), (False, True), (True, False), (True, True)]
)
def test_opcheck_fake_quantize(columnwise, stochastic, device_splits, rng):
    splits = random_splits(3, 384, rng, zero_at=("middle",))
    x = grouped_input(splits, 128, rng)
    rng_state = torch.tensor([5, 9], device="cuda") if stochastic else None
    args = (
        x, *_groups_args(splits, device_splits), columnwise, True, MASK, stochastic, rng_state,
        None, torch.bfloat16,
    )  # fmt: skip
    _opcheck(OPS.nvfp4_fake_quantize, args, False)


@pytest.mark.gpu
@pytest.mark.parametrize("listed", [False, True])
def test_opcheck_weights_2d(listed, rng):
    w = torch.randn(3, 64, 128, generator=rng).to(torch.bfloat16).cuda()
    stacked, experts = (None, list(w.unbind(0))) if listed else (w, [])
    _opcheck(OPS.nvfp4_quantize_weights_2d, (stacked, experts, True, True, True, None), False)
    _opcheck(OPS.nvfp4_fake_quantize_weights_2d, (stacked, experts, None, torch.bfloat16), False)


def _recipe_step(x, splits, w):
    """Activations rowwise and columnwise (RHT domain), weights 2D: the three recipe slots."""
    xr, _ = cutequant.nvfp4_fake_quantize(x, splits)
    xc, amax_col = cutequant.nvfp4_fake_quantize(x, splits, columnwise=True)
    wq, _ = cutequant.nvfp4_fake_quantize_weights_2d(w)
    q = cutequant.nvfp4_quantize_weights_2d(w, swizzled_scales=True)
    return xr @ wq[0], xc, amax_col, q.row_data, q.col_scales, q.amax


@pytest.mark.gpu
def test_compile_recipe_ops_match_eager(rng):
    torch._dynamo.reset()
    splits = random_splits(3, 512, rng)
    x = grouped_input(splits, 128, rng)
    w = torch.randn(2, 128, 64, generator=rng).to(torch.bfloat16).cuda()
    s = torch.tensor(splits, device="cuda")
    eager = _recipe_step(x, s, w)
    compiled = torch.compile(_recipe_step, fullgraph=True)(x, s, w)
    for i, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), i
