"""GPU: grouped NVFP4 quantize, every byte against cutequant.reference (bit-exact). Every test
runs twice (conftest ``rht_mma``): with the arch's RHT instruction (wgmma on sm_90a) and with
mma.sync (the sm_100a kernels' RHT), the amax pass included; and each of those three times
(``alu_trim``): without the ALU trim, with it (the default), and with it and the FMA-pipe
encoder (``fma_encoder``, the default; ``-k fma-on`` runs only those), once more with fast
math's ``stsm_restage`` (``-k stsm-on``), and the tests with SR calls a fifth time with the SR
trim (``sr_trim``, the default; ``-k sr-on`` runs only those)."""

import itertools

import pytest
import torch

import cutequant
from cutequant import reference
from cutequant.testing import grouped_input, poisoned_outputs, random_splits, rcp_approx_ftz

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("rht_mma", "alu_trim")]


@pytest.fixture(
    params=[
        (False, False, False, False),
        (True, False, False, False),
        (True, True, False, False),
        (True, True, True, False),
        (True, True, False, True),
    ],
    ids=["trim-off", "trim-on", "fma-on", "stsm-on", "sr-on"],
)
def alu_trim(request, monkeypatch):
    """The quantize kernel without and with ``Nvfp4QuantizeSpec.alu_trim`` (runtime/nvfp4.py's
    ALU_TRIM, issue 17 / branch speed4) and with ``fma_encoder`` on top (FMA_ENCODER, the default;
    branch alu5: RN kernels only, SR calls run the trim kernel): the same bits are required of
    all. ``stsm-on``: the defaults plus STSM_RESTAGE (branch trim6: fast math's wgmma restage
    by stmatrix; other kernels as fma-on). ``sr-on``: ``sr_trim`` too (SR_TRIM, the default;
    issue 17 / branch sr5: SR kernels only), for the tests with SR calls (the others would run
    the fma-on kernels again). The flags are in the spec key and the replay key: no cache mixes
    them."""
    from cutequant import nvfp4

    trim, fma, stsm, srt = request.param
    if srt and not ("stochastic" in request.node.name or "round_robin" in request.node.name):
        pytest.skip("sr-on: RN calls run the fma-on kernels")
    monkeypatch.setattr(nvfp4, "ALU_TRIM", trim)
    monkeypatch.setattr(nvfp4, "FMA_ENCODER", fma)
    monkeypatch.setattr(nvfp4, "STSM_RESTAGE", stsm)
    monkeypatch.setattr(nvfp4, "SR_TRIM", srt)
    return trim


VARIANTS = [
    dict(rowwise=r, columnwise=c, rht=h, swizzled_scales=s, fast_math=f)
    for (r, c), h, s, f in itertools.product(
        ((True, True), (True, False), (False, True)), (True, False), (False, True), (False, True)
    )
    if c or not h
]


def _same_f32(got, ref):
    got, ref = got.float().cpu().reshape(-1), ref.float().cpu().reshape(-1)
    nan = torch.isnan(ref)
    return torch.equal(torch.isnan(got), nan) and torch.equal(
        got[~nan].view(torch.int32), ref[~nan].view(torch.int32)
    )


def _first_diff(name, got, ref):
    got, ref = got.reshape(-1).cpu(), ref.reshape(-1).cpu()
    bad = (got != ref).nonzero()
    i = int(bad[0]) if len(bad) else -1
    return f"{name}: {len(bad)} bytes differ; first at {i}: got {got[i]:#x} ref {ref[i]:#x}"


def check_quantize(x, splits, *, device_splits=None, amax=None, **opts):
    with poisoned_outputs():
        res = cutequant.nvfp4_group_quantize(
            x, device_splits if device_splits is not None else splits, amax=amax, **opts
        )
    torch.cuda.synchronize()
    recip = rcp_approx_ftz if opts.get("fast_math") else None
    ref = reference.nvfp4_group_quantize(x, splits, amax=amax, reciprocal=recip, **opts)
    assert res.splits == tuple(splits)
    for g, (got, want) in enumerate(zip(res.groups(), ref, strict=True)):
        assert _same_f32(got["amax_row"], want["amax_row"]), (g, got["amax_row"], want["amax_row"])
        assert _same_f32(got["amax_col"], want["amax_col"]), (g, got["amax_col"], want["amax_col"])
        for key in ("row_data", "row_scales", "col_data", "col_scales"):
            if key not in want:
                assert getattr(res, key) is None
                continue
            a = got[key].reshape(-1)
            b = want[key].reshape(-1).to(a.device)
            assert a.numel() == b.numel(), (g, key, a.numel(), b.numel())
            assert torch.equal(a, b), f"group {g} ({splits[g]} rows): " + _first_diff(key, a, b)
    if device_splits is None:  # exact-size buffers: every byte was written
        for key in ("row_data", "row_scales", "col_data", "col_scales"):
            buf = getattr(res, key)
            if buf is not None:
                total = sum(d[key].numel() for d in ref)
                assert buf.numel() == total, (key, buf.numel(), total)
    return res


@pytest.mark.parametrize("opts", VARIANTS, ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_every_variant(opts, rng):
    splits = random_splits(8, None, rng, zero_at=("middle",), mean_rows=160)
    x = grouped_input(splits, 272, rng)
    check_quantize(x, splits, **opts)


@pytest.mark.parametrize(
    "shape", [(128, 128), (256, 272), (8192, 5120), (16384, 7168), (65536, 2048)]
)
@pytest.mark.parametrize("swizzled", [False, True])
def test_dense_shapes(shape, swizzled, rng):
    m, n = shape
    x = grouped_input([m], n, rng)
    check_quantize(x, [m], swizzled_scales=swizzled)


@pytest.mark.parametrize(
    "groups,zero_at,n_cols",
    [
        (1, (), 2048),
        (8, ("front",), 5120),
        (64, ("front", "middle", "end"), 2048),
        (300, ("middle", "end"), 1024),
        (8, ("all",), 512),
    ],
)
def test_grouped(groups, zero_at, n_cols, rng):
    splits = random_splits(groups, None, rng, zero_at=zero_at)
    x = grouped_input(splits, n_cols, rng)
    check_quantize(x, splits)
    check_quantize(x, splits, swizzled_scales=True, fast_math=True)


def test_device_splits_and_given_amax(rng):
    splits = random_splits(64, None, rng, zero_at=("front", "end"))
    x = grouped_input(splits, 1024, rng)
    dev = torch.tensor(splits, dtype=torch.int64, device="cuda")
    check_quantize(x, splits, device_splits=dev)
    amax = torch.stack(reference.group_amax(x, splits)).cuda() * 1.5
    check_quantize(x, splits, amax=amax)


def test_extremes(rng):
    splits = [16, 64, 128, 48]
    n = 16
    x = grouped_input(splits, n, rng)
    bf16_max = torch.finfo(torch.bfloat16).max
    x[16:80] = 0.0
    x[80:208] = (torch.sign(x[80:208].float()) * bf16_max).to(torch.bfloat16)
    check_quantize(x, splits)
    check_quantize(x, splits, rht=False, swizzled_scales=True)
    zeros = torch.zeros(256, 256, dtype=torch.bfloat16, device="cuda")
    check_quantize(zeros, [128, 128])


@pytest.mark.parametrize("sign_mask", [0xFFFF, 0x0000, 0xD7E8])
def test_signed_zero_blocks(sign_mask, rng):
    """Zero blocks: with every sign flipped (0xFFFF) the 16 products of a +0 block's token-0
    output are all -0, as with no flip (0x0000) for a -0 block; their sum is -0 (code 8) in
    the reference's tensor-core matmul iff the hardware keeps the sign. The mma.sync RHT adds
    C = -0.0 to stay the plain sum (kernels/warp_rht.py). Other tokens mix signs: +0. (Fast
    math: 0 * rcp.approx(0) is NaN, code 7, either sign; that call covers the amax pass.)"""
    zeros = torch.zeros(64, 48, dtype=torch.bfloat16, device="cuda")
    x = torch.cat([zeros, -zeros, grouped_input([64], 48, rng)])
    amax = torch.ones(2, 3, device="cuda")
    check_quantize(x, [64, 64, 64], amax=amax, sign_mask=sign_mask, rowwise=False)
    check_quantize(x, [64, 64, 64], sign_mask=sign_mask, fast_math=True)


def test_ties_and_special_values(rng):
    """Values exactly on e2m1 midpoints: amax 10.5 gives S_enc = 256 (a power of two), so a
    block with max 6 gets sf = 256, sf * S_dec = 1 and enc = 1: the ties survive scaling."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=torch.float32)
    row = torch.cat([ties, -ties])
    x = row.repeat(64, 8).to(torch.bfloat16).cuda()
    amax = torch.full((2, 1), 10.5, device="cuda")
    check_quantize(x, [64], amax=amax, columnwise=False)
    check_quantize(x.t().contiguous()[:, :64].contiguous(), [128], amax=amax, rht=False)
    check_quantize(x, [64])
    y = grouped_input([64, 64], 128, rng)
    y[3, 5] = float("nan")
    y[70, 9] = float("inf")
    y[100, 1] = -0.0
    check_quantize(y, [64, 64], rht=False)
    check_quantize(y, [64, 64])


@pytest.mark.parametrize("swizzled", [False, True])
def test_dequantize_round_trip(swizzled, rng):
    splits = [128, 0, 64, 256]
    x = grouped_input(splits, 512, rng)
    res = cutequant.nvfp4_group_quantize(x, splits, swizzled_scales=swizzled)
    for columnwise in (False, True):
        y = cutequant.nvfp4_group_dequantize(res, columnwise=columnwise, out_dtype=torch.float32)
        for g, (lo, hi) in enumerate(zip([0, 128, 128, 192], [128, 128, 192, 448], strict=True)):
            if hi > lo:
                rel = (y[lo:hi] - x[lo:hi].float()).norm() / x[lo:hi].float().norm()
                assert rel < 0.15, (g, columnwise, rel)
    # rowwise dequantization is elementwise: bit-identical to the reference's
    ref = reference.nvfp4_group_quantize(x, splits, swizzled_scales=swizzled)
    y = cutequant.nvfp4_group_dequantize(res, out_dtype=torch.float32)
    want = reference.nvfp4_dequantize(
        ref[3]["row_data"],
        ref[3]["row_scales"],
        ref[3]["amax_row"],
        shape=(256, 512),
        swizzled=swizzled,
    )
    assert torch.equal(y[192:448].cpu(), want.cpu())


@pytest.mark.parametrize("band", [1, 3])
def test_walk_bands(band, monkeypatch, rng):
    """Other tile-walk band heights (default: see TilePlan) cover every tile exactly once:
    groups of many 64-row tiles, not multiples of the band, a partial last tile, empty groups."""
    from cutequant import nvfp4
    from cutequant.testing import with_plan

    monkeypatch.setattr(nvfp4, "_spec", with_plan(nvfp4._spec, walk_band=band))
    monkeypatch.setattr(nvfp4, "_SPECS", {})  # (spec, grid) of earlier tests: not this plan
    splits = [0, 1008, 64, 0, 448, 16, 2000]
    x = grouped_input(splits, 528, rng)
    check_quantize(x, splits)
    check_quantize(x, splits, swizzled_scales=True, rowwise=False)


@pytest.mark.parametrize("chunk,ctas", [(1, 5), (3, 7), (8, 6)])
def test_round_robin_chunks(chunk, ctas, monkeypatch, rng):
    """Round-robin tile chunks (the plan the runtime picks for compact scales on an H100) on a
    small grid: many full rounds, a balanced tail, runs that end inside a group and inside a
    pair of tiles whose compact column scales leave together, every output set."""
    from cutequant import _launch, nvfp4
    from cutequant.testing import with_plan

    monkeypatch.setattr(nvfp4, "_spec", with_plan(nvfp4._spec, chunk=chunk))
    monkeypatch.setattr(_launch, "grid_size", lambda spec, device: ctas)
    monkeypatch.setattr(nvfp4, "_SPECS", {})  # (spec, grid) of earlier tests: not this plan
    splits = [0, 1008, 64, 0, 448, 16, 2000]
    x = grouped_input(splits, 528, rng)
    check_quantize(x, splits)
    check_quantize(x, splits, swizzled_scales=True)
    check_quantize(x, splits, rowwise=False, rht=False)
    check_quantize(x, splits, columnwise=False, rht=False)
    state = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=rng).cuda()
    check_quantize(x, splits, stochastic_rounding=True, fast_math=True, rng_state=state)
    x = grouped_input([2000], 528, rng)
    check_quantize(x, [2000])


@pytest.mark.parametrize("opts", VARIANTS, ids=lambda o: "-".join(k for k, v in o.items() if v))
def test_stochastic_rounding_every_variant(opts, rng):
    """SR random bits depend only on (seed, offset, block position): bit-exact vs the reference."""
    splits = random_splits(8, None, rng, zero_at=("front", "middle"), mean_rows=160)
    x = grouped_input(splits, 272, rng)
    state = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=rng).cuda()
    res = check_quantize(x, splits, stochastic_rounding=True, rng_state=state, **opts)
    assert res.rng_state is state or torch.equal(res.rng_state, state)


@pytest.mark.parametrize("amax_scale", [1.0, 0.5, 2.0**-12])
def test_stochastic_rounding_special_values(amax_scale, rng):
    """SR on NaN / inf / -0 / bf16-max / zero blocks, and with a given amax below the data's
    (scaled values past 6, 8, 16 and 32: the clamp cases of kernels/nvfp4_sr.py), bit-exact."""
    splits = [64, 128, 64]
    y = grouped_input(splits, 128, rng)
    y[3, 5] = float("nan")
    y[70, 9] = float("inf")
    y[71, 40] = -float("inf")
    y[100, 1] = -0.0
    y[120:136, 32:48] = 0.0
    y[200:208] = (torch.sign(y[200:208].float()) * torch.finfo(torch.bfloat16).max).to(y.dtype)
    amax = torch.stack(reference.group_amax(y, splits)).cuda() * amax_scale
    state = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=rng).cuda()
    for opts in (dict(), dict(rht=False), dict(swizzled_scales=True, fast_math=True)):
        check_quantize(y, splits, stochastic_rounding=True, rng_state=state, **opts)
        check_quantize(y, splits, amax=amax, stochastic_rounding=True, rng_state=state, **opts)


def test_stochastic_rounding_fresh_state_device_splits_and_large(rng):
    splits = random_splits(64, None, rng, zero_at=("front", "end"))
    x = grouped_input(splits, 1024, rng)
    dev = torch.tensor(splits, dtype=torch.int32, device="cuda")
    with poisoned_outputs():
        res = cutequant.nvfp4_group_quantize(x, dev, stochastic_rounding=True)
    assert res.rng_state is not None and res.rng_state.dtype == torch.int64
    check_quantize(x, splits, device_splits=dev, stochastic_rounding=True, rng_state=res.rng_state)
    big = grouped_input([8192], 5120, rng)
    check_quantize(big, [8192], stochastic_rounding=True, rng_state=res.rng_state)
    other = cutequant.nvfp4_group_quantize(x, splits, stochastic_rounding=True)
    assert not torch.equal(other.rng_state, res.rng_state)  # a fresh state per call


def test_stochastic_rounding_is_unbiased(rng):
    """Averaged over 64 SR draws the rowwise dequantization approaches x; RN's bias does not."""
    x = grouped_input([256], 256, rng)
    rn = cutequant.nvfp4_group_dequantize(cutequant.nvfp4_group_quantize(x, [256]))
    acc = torch.zeros(256, 256, device="cuda")
    for _ in range(64):
        res = cutequant.nvfp4_group_quantize(x, [256], stochastic_rounding=True)
        acc += cutequant.nvfp4_group_dequantize(res, out_dtype=torch.float32)
    xf = x.float()
    sr_err = (acc / 64 - xf).abs().mean()
    rn_err = (rn.float() - xf).abs().mean()
    assert sr_err < 0.4 * rn_err, (float(sr_err), float(rn_err))


@pytest.mark.parametrize("scale", [2.0, 1.0, 0.75])
def test_post_rht_amax_estimation(scale, rng):
    """amax_col = pre-RHT amax_row * scale (TE PR #2521), then the usual bit-exact quantize."""
    splits = random_splits(8, None, rng, zero_at=("middle",), mean_rows=160)
    x = grouped_input(splits, 512, rng)
    with poisoned_outputs():
        res = cutequant.nvfp4_group_quantize(x, splits, amax_estimation_scale=scale)
    row, _ = reference.group_amax(x, splits, rht=False)
    col = (row.float() * torch.tensor(scale, dtype=torch.float32)).to(row.device)
    assert _same_f32(res.amax_row, row) and _same_f32(res.amax_col, col)
    want = check_quantize(x, splits, amax=torch.stack([row, col]).cuda())
    for key in ("row_data", "row_scales", "col_data", "col_scales"):
        assert torch.equal(getattr(res, key), getattr(want, key)), key


def test_stochastic_rounding_in_a_cuda_graph(rng):
    """Captured without an rng_state, each replay draws a fresh state (torch.randint is graph
    safe) and the result still matches the reference for the state it used."""
    splits = [128, 0, 64]
    x = grouped_input(splits, 256, rng)
    cutequant.nvfp4_group_quantize(x, splits, stochastic_rounding=True)  # compile outside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = cutequant.nvfp4_group_quantize(x, splits, stochastic_rounding=True)
    outs = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        outs.append((res.rng_state.clone(), res.row_data.clone(), res.col_data.clone()))
        ref = reference.nvfp4_group_quantize(
            x, splits, stochastic_rounding=True, rng_state=res.rng_state
        )
        assert torch.equal(res.group(2)["col_data"], ref[2]["col_data"].to(x.device))
        assert torch.equal(res.group(0)["row_data"], ref[0]["row_data"].to(x.device))
    assert not torch.equal(outs[0][0], outs[1][0])
    assert not torch.equal(outs[0][1], outs[1][1])
