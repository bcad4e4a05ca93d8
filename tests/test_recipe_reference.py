"""CPU: the recipe reference (grouped dequantize, inverse RHT) against independent formulations."""

import pytest
import torch
from recipe_util import grouped_buffer

from cutequant import recipe_reference as RR
from cutequant import reference as R


@pytest.mark.parametrize("sign_mask", [0, 0xD7E8, 0xFFFF])
def test_inverse_rht_exact_inverts_exactly_representable(sign_mask, rng):
    """Small integers: the forward RHT (multiples of 1/4) and the inverse are exact, so the
    round trip gives x back bit for bit."""
    x = torch.randint(-64, 64, (96, 48), generator=rng).to(torch.bfloat16)
    y = R.rht_along_tokens(x, sign_mask, round_to_bf16=False)
    back = RR.inverse_rht_exact(y, sign_mask)
    assert back.dtype == torch.float32 and back.shape == x.shape
    assert torch.equal(back, x.float())


def test_inverse_rht_exact_matches_float64(rng):
    y = torch.randn(32, 160, generator=rng) * torch.exp2(
        torch.randint(-20, 20, (32, 160), generator=rng)
    )
    r = R._sign_matrix(0xD7E8, "cpu") * 0.25
    want = (y.double().reshape(32, 10, 16) @ r.t()).reshape(32, 160).t()
    got = RR.inverse_rht_exact(y, 0xD7E8).double()
    scale = y.double().abs().reshape(32, 10, 16).amax(-1, keepdim=True).expand(32, 10, 16)
    assert ((got - want).abs() <= 1e-6 * scale.reshape(32, 160).t()).all()


def test_inverse_rht_exact_order_is_the_butterfly():
    """The fp32 order is part of the definition: y = (2^30, 1, -2^30, 1, 0, ...) sums to 2
    exactly, to 1 left to right, and to 0 in the butterfly order (stage 0 rounds 2^30 + 1 and
    -2^30 + 1 to +-2^30), which the kernels reproduce."""
    y = torch.zeros(1, 16)
    y[0, :4] = torch.tensor([2.0**30, 1.0, -(2.0**30), 1.0])
    got = RR.inverse_rht_exact(y, 0)
    seq = torch.zeros((), dtype=torch.float32)
    for v in y[0]:
        seq = seq + v
    assert float(seq) == 1.0
    assert float(got[0, 0]) == 0.0


def _quantized_groups(splits, n, rng, swizzled):
    x = (torch.randn(sum(splits), n, generator=rng) * 3).to(torch.bfloat16)
    return x, R.nvfp4_group_quantize(x, splits, swizzled_scales=swizzled)


@pytest.mark.parametrize("swizzled", [False, True])
def test_nvfp4_group_dequantize_matches_per_group(swizzled, rng):
    splits = [48, 0, 128, 16, 80]
    n = 160
    x, groups = _quantized_groups(splits, n, rng, swizzled)
    for columnwise in (False, True):
        side = "col" if columnwise else "row"
        data = grouped_buffer(groups, f"{side}_data")
        if not columnwise:
            data = data.view(-1, n // 2)
        scales = grouped_buffer(groups, f"{side}_scales")
        amax = torch.stack([d[f"amax_{side}"] for d in groups])
        for out_dtype in (torch.bfloat16, torch.float32):
            got = RR.nvfp4_group_dequantize(
                data,
                scales,
                amax,
                splits,
                n,
                columnwise=columnwise,
                swizzled=swizzled,
                out_dtype=out_dtype,
            )
            row0 = 0
            for g, m_g in enumerate(splits):
                d = groups[g]
                if m_g:
                    shape = (n, m_g) if columnwise else (m_g, n)
                    want = R.nvfp4_dequantize(
                        d[f"{side}_data"],
                        d[f"{side}_scales"],
                        d[f"amax_{side}"],
                        shape=shape,
                        swizzled=swizzled,
                    )
                    want = want.t() if columnwise else want
                    assert torch.equal(got[row0 : row0 + m_g], want.to(out_dtype))
                row0 += m_g


def test_nvfp4_group_dequantize_undo_rht_recovers_x(rng):
    splits = [64, 32, 0, 96]
    x, groups = _quantized_groups(splits, 128, rng, False)
    data = grouped_buffer(groups, "col_data")
    scales = grouped_buffer(groups, "col_scales")
    amax = torch.stack([d["amax_col"] for d in groups])
    back = RR.nvfp4_group_dequantize(
        data, scales, amax, splits, 128, columnwise=True, undo_rht=True, out_dtype=torch.float32
    )
    rel = (back - x.float()).norm() / x.float().norm()
    assert rel < 0.2, rel
    raw = RR.nvfp4_group_dequantize(data, scales, amax, splits, 128, columnwise=True)
    assert (raw.float() - x.float()).norm() / x.float().norm() > 0.5  # still in the RHT domain


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_group_dequantize(fp8, rng):
    splits = [32, 0, 48]
    n = 64
    x = torch.randn(80, n, generator=rng).to(torch.bfloat16)
    groups = R.fp8_group_quantize(x, splits, fp8_dtype=fp8)
    scale_inv = torch.stack([d["scale_inv"] for d in groups])
    row = torch.cat([d["row_data"] for d in groups])
    col = grouped_buffer(groups, "col_data")
    got_row = RR.fp8_group_dequantize(row, scale_inv, splits, n, out_dtype=torch.float32)
    got_col = RR.fp8_group_dequantize(
        col, scale_inv, splits, n, columnwise=True, out_dtype=torch.float32
    )
    assert torch.equal(got_row, got_col)
    row0 = 0
    for g, m_g in enumerate(splits):
        want = R.fp8_dequantize(groups[g]["row_data"], groups[g]["scale_inv"])
        assert torch.equal(got_row[row0 : row0 + m_g], want)
        row0 += m_g


@pytest.mark.parametrize("shape", [(64, 48), (144, 272), (16, 16)])
@pytest.mark.parametrize("swizzled", [False, True])
def test_2d_matches_1d_on_block_constant_amax(shape, swizzled, rng):
    """Where every row of a 16x16 block has the block's amax (a 1x16 amax equal to the 16x16
    one), 2D quantization is 1D quantization of the rows, and of the columns; the columnwise
    data is the exact transpose and both scale buffers hold the same bytes."""
    rows, cols = shape
    w = torch.randn(rows, cols, generator=rng) * 4
    bmax = w.abs().reshape(rows // 16, 16, cols // 16, 16).amax(dim=(1, 3))
    # put the block maximum (sign +) at a distinct column and row of each 16x16 block
    for i in range(16):
        w.view(rows // 16, 16, cols // 16, 16)[:, i, :, i] = bmax
    w = w.to(torch.bfloat16)
    amax = w.float().abs().amax()
    rd, rs, cd, cs = RR.nvfp4_quantize_2d(w, amax, swizzled=swizzled)
    d1, s1 = R.nvfp4_quantize_rows(w, amax)
    dc, sc = R.nvfp4_quantize_rows(w.t().contiguous(), amax)
    if swizzled:
        s1, sc = R.swizzle_scales(s1), R.swizzle_scales(sc)
    assert torch.equal(rd, d1) and torch.equal(rs, s1)
    assert torch.equal(cd, dc) and torch.equal(cs, sc)
    assert torch.equal(R.unpack_fp4(cd), R.unpack_fp4(rd).t())


def test_2d_block_amax_and_dequantize(rng):
    """One outlier raises its whole 16x16 block's scale (not only its row), and dequantizing
    the rowwise and columnwise halves gives the same matrix (transposed)."""
    w = torch.randn(32, 32, generator=rng).to(torch.bfloat16)
    w[3, 5] = 100.0
    amax = w.float().abs().amax()
    rd, rs, cd, cs = RR.nvfp4_quantize_2d(w, amax)
    assert int(rs[0, 0]) == int(rs[15, 0]) and int(rs[0, 0]) > int(rs[16, 0])
    assert torch.equal(rs[:32, :2], cs[0:32:16, :2].t().repeat_interleave(16, 0))
    row = R.nvfp4_dequantize(rd, rs, amax, shape=(32, 32))
    col = R.nvfp4_dequantize(cd, cs, amax, shape=(32, 32))
    assert torch.equal(row, col.t())
    assert (row - w.float()).norm() / w.float().norm() < 0.3


def test_2d_experts_stacked_equals_list(rng):
    w = (torch.randn(3, 32, 64, generator=rng)).to(torch.bfloat16)
    w[1] *= 1000
    a = RR.nvfp4_quantize_2d_experts(w)
    b = RR.nvfp4_quantize_2d_experts(list(w.unbind(0)))
    for k in a:
        assert torch.equal(a[k], b[k])
    assert torch.equal(a["amax"], w.float().abs().amax(dim=(1, 2)))
    assert a["row_data"].shape == (3, 32, 32) and a["col_data"].shape == (3, 64, 16)
    assert a["row_scales"].shape == (3, 128, 4) and a["col_scales"].shape == (3, 128, 4)


def test_2d_extremes():
    """All zeros (sf 0, codes 0) and a NaN (its block gets sf 448 and code 7, as 1D)."""
    z = torch.zeros(16, 32, dtype=torch.bfloat16)
    rd, rs, cd, cs = RR.nvfp4_quantize_2d(z, torch.tensor(0.0))
    assert not rd.any() and not rs.any() and not cd.any() and not cs.any()
    w = torch.ones(16, 32, dtype=torch.bfloat16)
    w[2, 20] = float("nan")
    amax = torch.tensor(float("nan"))
    rd, rs, cd, cs = RR.nvfp4_quantize_2d(w, amax)
    assert int(rs[0, 1]) == 0x7E  # 448
    codes = R.unpack_fp4(rd)
    assert int(codes[2, 20]) == 7


def test_fake_quant_references_emulate_the_recipe_gemms(rng):
    """The recipe on Hopper with the fake-quant references: dgrad from the rowwise SR
    fake-quant of dy and the 2D fake-quant of W, wgrad from the two columnwise fake-quants in
    the RHT domain (the RHT cancels in the product), both close to the exact products."""
    m, k, n = 128, 256, 192
    x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=rng) / 20).to(torch.bfloat16)
    dy = torch.randn(m, n, generator=rng).to(torch.bfloat16)
    wq, amax_w = RR.nvfp4_fake_quantize_2d_experts(w[None])
    assert torch.equal(amax_w, w.float().abs().amax()[None])
    seed = torch.randint(0, 2**62, (2,), generator=rng)
    dyq = RR.nvfp4_fake_quantize_rows(dy, [m], dy.float().abs().amax()[None], rng_state=seed)
    dx = dyq.float() @ wq[0].float()
    exact_dx = dy.float() @ w.float()
    assert (dx - exact_dx).norm() / exact_dx.norm() < 0.3
    a_dy = R.group_amax(dy, [m], rht=True)[1]
    a_x = R.group_amax(x, [m], rht=True)[1]
    dy_c = RR.nvfp4_fake_quantize_columnwise(dy, [m], a_dy, rng_state=seed + 1).view(n, m)
    x_c = RR.nvfp4_fake_quantize_columnwise(x, [m], a_x).view(k, m)
    dw = dy_c.float() @ x_c.float().t()
    exact_dw = dy.float().t() @ x.float()
    assert (dw - exact_dw).norm() / exact_dw.norm() < 0.3
    # one side left in the RHT domain alone does not give the product
    x_plain = RR.nvfp4_fake_quantize_columnwise(x, [m], a_x, rht=False).view(k, m)
    wrong = dy_c.float() @ x_plain.float().t()
    assert (wrong - exact_dw).norm() / exact_dw.norm() > 0.5
