"""GPU: grouped dequantize kernels, every output value against cutequant.recipe_reference
(bit-exact; outputs poisoned first, so an unwritten value shows up). Every test runs with each
columnwise tile length (``dequant.COLUMNWISE_TOKENS``: 64, 128, 256 tokens per tile; 256 also
with the sub-tile ring, ``dequant.COLUMNWISE_RING`` 8, and the NVFP4 scale words,
``dequant.COLUMNWISE_SCALE_WORDS``), with the cache hints (``dequant.CACHE_HINTS``, default
"ldst") and without them (rowwise kernels too), and with short CTAs of 1 / 2 sub-tiles at the
walk's end (and start: ``dequant.COLUMNWISE_TAIL``, ``COLUMNWISE_HEAD_WAVES``; a plan for 4
resident CTAs so that the small cases have them), and with the FP8 tiles transposed in
registers (``dequant.COLUMNWISE_REGS``: 128 threads, the default, 256, and 0, the shared-memory
staging; the ``regs`` ids); tests
parametrized rowwise run with the 64-token ids only."""

import pytest
import torch
from recipe_util import assert_same_bits, random_fp8_bytes, random_nvfp4_buffers

import cutequant
from cutequant import dequant, recipe_reference
from cutequant.testing import grouped_input, poisoned_outputs, random_splits


@pytest.fixture(
    params=[
        64,
        128,
        256,
        (256, 8, False),
        (256, 8, True),  # the default
        (64, 0, False, ""),
        (256, 8, True, ""),
        (256, 8, True, "ldst", 1),
        (256, 8, True, "ldst", 2, 1.0),
        (256, 8, True, "ldst", 0, 0.0, 0),
        (256, 8, True, "ldst", 0, 0.0, 256),
        (256, 8, True, "", 0, 0.0, 128),
        (256, 8, True, "ldst", 2, 1.0, 128),
    ],
    ids=[
        "tok64",
        "tok128",
        "tok256",
        "tok256ring8",
        "tok256ring8words",
        "tok64nohints",
        "tok256ring8wordsnohints",
        "tok256ring8wordstail1",
        "tok256ring8wordstail2head",
        "tok256ring8regs0",
        "tok256ring8regs256",
        "tok256ring8regs128nohints",
        "tok256ring8regs128tail2head",
    ],
)
def col_tokens(request, monkeypatch):
    """The columnwise kernels' tile length, and for 256 tokens the staging (the sub-tile ring,
    ``dequant.COLUMNWISE_RING``) and the NVFP4 scale words (``COLUMNWISE_SCALE_WORDS``; FP8
    and swizzled scales ignore it): compile variants, read when the spec is built; then the
    cache hints (``CACHE_HINTS``, every kernel) and short CTAs at the walk's end (and start:
    ``COLUMNWISE_TAIL``, ``COLUMNWISE_HEAD_WAVES``), planned for 4 resident CTAs
    (``COLUMNWISE_TAIL_SLOTS``) so that the small cases have them too; last, the FP8 tiles
    transposed in registers (``COLUMNWISE_REGS``: threads per CTA, 0 the shared-memory staging,
    None the default; other kernels ignore it)."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    rowwise = params.get("mode", (None,))[0] is False or params.get("columnwise") is False
    param = request.param if isinstance(request.param, tuple) else (request.param,)
    defaults = (0, False, dequant.CACHE_HINTS, 0, 0.0, None)  # the runtime's choices unless given
    tokens, ring, words, hints, tail, head, regs = param + defaults[len(param) - 1 :]
    if tokens != 64 and rowwise:
        pytest.skip("rowwise: one tile layout")
    if regs is not None and "fp8" not in request.node.name:
        pytest.skip("COLUMNWISE_REGS: the FP8 kernels only (the others are the default ones)")
    monkeypatch.setattr(dequant, "COLUMNWISE_TOKENS", tokens)
    monkeypatch.setattr(dequant, "COLUMNWISE_RING", ring)
    monkeypatch.setattr(dequant, "COLUMNWISE_SCALE_WORDS", bool(words))
    monkeypatch.setattr(dequant, "CACHE_HINTS", hints)
    monkeypatch.setattr(dequant, "COLUMNWISE_TAIL", tail)
    monkeypatch.setattr(dequant, "COLUMNWISE_HEAD_WAVES", head)
    monkeypatch.setattr(dequant, "COLUMNWISE_TAIL_SLOTS", 4 if tail else None)
    monkeypatch.setattr(dequant, "COLUMNWISE_REGS", regs)
    return tokens


pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("col_tokens")]

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NVFP4_MODES = [  # (columnwise, undo_rht)
    (False, False),
    (True, False),
    (True, True),
]
SIGN_MASK = 0xD7E8


def _device_splits(splits, dtype=torch.int32):
    return torch.tensor(splits, dtype=dtype, device="cuda")


def check_nvfp4(
    data,
    scales,
    amax,
    splits,
    n,
    *,
    columnwise,
    swizzled,
    undo_rht,
    out_dtype,
    device_splits=None,
    sign_mask=SIGN_MASK,
):
    """Kernel (poisoned output) vs the CPU reference on the same buffers."""
    args = (
        data.cuda(),
        scales.cuda(),
        amax.cuda(),
        tuple(splits) if device_splits is None else device_splits,
        n,
        columnwise,
        swizzled,
        undo_rht,
        sign_mask,
        out_dtype,
    )
    dequant._check_nvfp4_dequantize(*args)
    with poisoned_outputs():
        (got,) = dequant.nvfp4_group_dequantize_impl(*args)
    torch.cuda.synchronize()
    ref = recipe_reference.nvfp4_group_dequantize(
        data.cpu(),
        scales.cpu(),
        amax.cpu(),
        splits,
        n,
        columnwise=columnwise,
        swizzled=swizzled,
        undo_rht=undo_rht,
        sign_mask=sign_mask,
        out_dtype=out_dtype,
    )
    assert_same_bits(got, ref, f"nvfp4 col={columnwise} rht={undo_rht} swz={swizzled}")
    return got


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
@pytest.mark.parametrize("mode", NVFP4_MODES, ids=["row", "col", "col-unrht"])
def test_nvfp4_random_bytes(mode, swizzled, out_dtype, rng):
    """Random data and scale bytes: every e2m1 code and e4m3 scale (NaN included), amaxes over
    many binades; N = 272 leaves a partial column tile, uneven groups partial row tiles."""
    columnwise, undo_rht = mode
    splits = random_splits(8, None, rng, zero_at=("middle",), mean_rows=160)
    n = 272
    data, scales, amax = random_nvfp4_buffers(splits, n, rng, columnwise=columnwise)
    check_nvfp4(
        data,
        scales,
        amax,
        splits,
        n,
        columnwise=columnwise,
        swizzled=swizzled,
        undo_rht=undo_rht,
        out_dtype=out_dtype,
    )


@pytest.mark.parametrize("splits_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("mode", NVFP4_MODES, ids=["row", "col", "col-unrht"])
def test_nvfp4_device_splits(mode, splits_dtype, rng):
    columnwise, undo_rht = mode
    splits = random_splits(12, None, rng, zero_at=("front", "middle", "end"), mean_rows=100)
    n = 384
    data, scales, amax = random_nvfp4_buffers(
        splits, n, rng, columnwise=columnwise, device_bound=True
    )
    check_nvfp4(
        data,
        scales,
        amax,
        splits,
        n,
        columnwise=columnwise,
        swizzled=True,
        undo_rht=undo_rht,
        out_dtype=torch.bfloat16,
        device_splits=_device_splits(splits, splits_dtype),
    )


@pytest.mark.parametrize(
    "case",
    [
        "one-group",
        "300-groups",
        "zero-front-middle-end",
        "all-zero-groups",
        "one-row-block",
        "tiles-straddle-groups",
    ],
)
@pytest.mark.parametrize("mode", NVFP4_MODES, ids=["row", "col", "col-unrht"])
def test_nvfp4_group_shapes(case, mode, rng):
    columnwise, undo_rht = mode
    n = 256
    if case == "one-group":
        splits = [1024]
    elif case == "300-groups":
        splits = random_splits(300, None, rng, zero_at=("front", "end"), mean_rows=48)
    elif case == "zero-front-middle-end":
        splits = random_splits(9, None, rng, zero_at=("front", "middle", "end"))
    elif case == "all-zero-groups":
        splits = [0, 0, 0]
    elif case == "one-row-block":
        splits = [16, 0, 16, 48, 80]
    else:  # 128- and 256-token tiles over up to 4 groups, empty ones between
        splits = [16, 48, 0, 64, 80, 144, 0, 0, 256, 32, 208, 112, 16, 0]
    for device in (False, True):
        data, scales, amax = random_nvfp4_buffers(
            splits, n, rng, columnwise=columnwise, device_bound=device
        )
        check_nvfp4(
            data,
            scales,
            amax,
            splits,
            n,
            columnwise=columnwise,
            swizzled=False,
            undo_rht=undo_rht,
            out_dtype=torch.bfloat16,
            device_splits=_device_splits(splits) if device else None,
        )


@pytest.mark.parametrize("mode", NVFP4_MODES, ids=["row", "col", "col-unrht"])
def test_nvfp4_device_search_of_1000_groups(mode, rng):
    """Device splits of 1000 groups (zero-token ones among them): the kernels' warp-wide table
    search takes two coarse rounds before its last one (more than 960 groups)."""
    columnwise, undo_rht = mode
    splits = random_splits(1000, None, rng, zero_at=("front", "middle", "end"), mean_rows=24)
    splits[1::7] = [0] * len(splits[1::7])
    n = 128
    data, scales, amax = random_nvfp4_buffers(
        splits, n, rng, columnwise=columnwise, device_bound=True
    )
    check_nvfp4(
        data,
        scales,
        amax,
        splits,
        n,
        columnwise=columnwise,
        swizzled=False,
        undo_rht=undo_rht,
        out_dtype=torch.bfloat16,
        device_splits=_device_splits(splits),
    )


@pytest.mark.parametrize("columnwise", [False, True], ids=["row", "col"])
def test_nvfp4_more_than_65535_row_tiles(columnwise, rng):
    """4.2M tokens of 16 columns: 65552 row tiles, more than a grid's y extent, so the grid's z
    dimension carries the rest (host and device splits)."""
    splits = [65536 * 64 - 1024, 2048]
    n = 16
    data, scales, amax = random_nvfp4_buffers(
        splits, n, rng, columnwise=columnwise, device_bound=True
    )
    ref = recipe_reference.nvfp4_group_dequantize(
        data, scales, amax, splits, n, columnwise=columnwise
    )
    for s in (tuple(splits), _device_splits(splits)):
        args = (data.cuda(), scales.cuda(), amax.cuda(), s, n, columnwise, False, False, 0)
        dequant._check_nvfp4_dequantize(*args, torch.bfloat16)
        with poisoned_outputs():
            (got,) = dequant.nvfp4_group_dequantize_impl(*args, torch.bfloat16)
        assert_same_bits(got, ref, f"65552 row tiles, device splits: {torch.is_tensor(s)}")


def test_bad_device_splits_write_nothing(rng):
    """Device splits that do not sum to M: the table kernel flags them and zeroes the tile
    total; every dequantize kernel then leaves its output untouched (the other table entries
    are unordered: the kernels' warp search must stay inside the tables and find no tile)."""
    from cutequant.testing import POISON_BYTE

    n = 256
    splits = [64, 48, 16, 32, 0, 96]  # the buffers' 256 rows
    bad = _device_splits([64, 48, 16, 32, 17, 96])  # 17: not a multiple of 16, sum 273
    for columnwise, undo_rht in NVFP4_MODES:
        data, scales, amax = random_nvfp4_buffers(
            splits, n, rng, columnwise=columnwise, device_bound=True
        )
        args = (data.cuda(), scales.cuda(), amax.cuda(), bad, n, columnwise, False, undo_rht)
        with poisoned_outputs():
            (got,) = dequant.nvfp4_group_dequantize_impl(*args, SIGN_MASK, torch.bfloat16)
        assert (got.view(torch.uint8) == POISON_BYTE).all(), (columnwise, undo_rht)
    for columnwise in (False, True):
        data = random_fp8_bytes(sum(splits) * n, rng, torch.float8_e4m3fn).cuda()
        if not columnwise:
            data = data.view(-1, n)
        scale_inv = torch.ones(len(splits), device="cuda")
        with poisoned_outputs():
            (got,) = dequant.fp8_group_dequantize_impl(
                data, scale_inv, bad, n, columnwise, torch.bfloat16
            )
        assert (got.view(torch.uint8) == POISON_BYTE).all(), columnwise


def test_nvfp4_amax_extremes(rng):
    """Group amaxes 0, inf, NaN, FLT_MAX and a tiny one (S_dec subnormal products)."""
    splits = [64, 32, 48, 16, 128]
    n = 128
    for columnwise, undo_rht in NVFP4_MODES:
        data, scales, _ = random_nvfp4_buffers(splits, n, rng, columnwise=columnwise)
        amax = torch.tensor([0.0, float("inf"), float("nan"), 3.4028234663852886e38, 1e-38])
        check_nvfp4(
            data,
            scales,
            amax,
            splits,
            n,
            columnwise=columnwise,
            swizzled=False,
            undo_rht=undo_rht,
            out_dtype=torch.float32,
        )


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
@pytest.mark.parametrize("device", [False, True], ids=["host-splits", "device-splits"])
def test_nvfp4_round_trip(device, swizzled, rng):
    """The public API on quantize results: both directions bit-exact vs the reference on the
    result's buffers, and the round trip close to x (the inverse RHT really inverts)."""
    splits = random_splits(6, None, rng, zero_at=("middle",), mean_rows=200)
    x = grouped_input(splits, 512, rng)
    s = _device_splits(splits) if device else splits
    q = cutequant.nvfp4_group_quantize(x, s, swizzled_scales=swizzled)
    with poisoned_outputs():
        row = dequant.nvfp4_group_dequantize(q)
        col = dequant.nvfp4_group_dequantize(q, columnwise=True)
        col_raw = dequant.nvfp4_group_dequantize(q, columnwise=True, undo_rht=False)
    torch.cuda.synchronize()
    ref = dict(n_cols=512, swizzled=swizzled, sign_mask=q.sign_mask)
    want_row = recipe_reference.nvfp4_group_dequantize(
        q.row_data.cpu(), q.row_scales.cpu(), q.amax_row.cpu(), splits, **ref
    )
    assert_same_bits(row, want_row, "row")
    for got, unrht in ((col, True), (col_raw, False)):
        want = recipe_reference.nvfp4_group_dequantize(
            q.col_data.cpu(),
            q.col_scales.cpu(),
            q.amax_col.cpu(),
            splits,
            columnwise=True,
            undo_rht=unrht,
            **ref,
        )
        assert_same_bits(got, want, f"col undo_rht={unrht}")
    # NVFP4 error: relative RMS error ~0.1 per group (the undone RHT really inverts)
    row0 = 0
    for m_g in splits:
        if m_g:
            xg = x[row0 : row0 + m_g].float()
            for got in (row, col):
                err = (got[row0 : row0 + m_g].float() - xg).norm() / xg.norm()
                assert err < 0.3, err
        row0 += m_g


def test_nvfp4_all_zero_and_max_inputs():
    """TE's extremes through quantize -> dequantize: all zeros, all +-bf16 max."""
    splits = [128, 0, 64]
    for fill in (0.0, 3.3895313892515355e38):
        x = torch.full((192, 256), fill, dtype=torch.bfloat16, device="cuda")
        x[1::2] = -x[1::2]
        q = cutequant.nvfp4_group_quantize(x, splits)
        for columnwise in (False, True):
            got = dequant.nvfp4_group_dequantize(q, columnwise=columnwise, undo_rht=True)
            side = "col" if columnwise else "row"
            want = recipe_reference.nvfp4_group_dequantize(
                getattr(q, f"{side}_data").cpu(),
                getattr(q, f"{side}_scales").cpu(),
                getattr(q, f"amax_{side}").cpu(),
                splits,
                256,
                columnwise=columnwise,
                undo_rht=columnwise,
                sign_mask=q.sign_mask,
            )
            assert_same_bits(got, want, f"fill={fill} col={columnwise}")


# ------------------------------------------------------------------------------------ FP8


def check_fp8(data, scale_inv, splits, n, *, columnwise, out_dtype, device_splits=None):
    args = (
        data.cuda(),
        scale_inv.cuda(),
        tuple(splits) if device_splits is None else device_splits,
        n,
        columnwise,
        out_dtype,
    )
    dequant._check_fp8_dequantize(*args)
    with poisoned_outputs():
        (got,) = dequant.fp8_group_dequantize_impl(*args)
    torch.cuda.synchronize()
    ref = recipe_reference.fp8_group_dequantize(
        data.cpu(), scale_inv.cpu(), splits, n, columnwise=columnwise, out_dtype=out_dtype
    )
    assert_same_bits(got, ref, f"fp8 col={columnwise} {data.dtype}")


@pytest.mark.parametrize("mode", [*NVFP4_MODES, "fp8"], ids=["row", "col", "col-unrht", "fp8-col"])
def test_back_to_back_calls_on_rewritten_inputs(mode, rng):
    """Calls on one stream without a synchronization (each may start while the one before it
    ends: PDL), each on the same input buffers, rewritten by a copy right before it: every call
    must read its own round's bytes, through the read-only path too (``dequant.CACHE_HINTS``
    "ld": ld.global.nc), and write its own output."""
    splits = random_splits(6, None, rng, zero_at=("middle",), mean_rows=300)
    n = 256
    rounds = []
    for _ in range(4):
        if mode == "fp8":
            data = random_fp8_bytes(sum(splits) * n, rng, torch.float8_e4m3fn)
            rounds.append((data, torch.rand(len(splits), generator=rng) + 0.01))
        else:
            rounds.append(random_nvfp4_buffers(splits, n, rng, columnwise=mode[0]))
    on_gpu = [tuple(t.cuda() for t in r) for r in rounds]
    bufs = tuple(t.clone() for t in on_gpu[0])
    outs = []
    for r in on_gpu:
        for buf, t in zip(bufs, r, strict=True):
            buf.copy_(t)
        if mode == "fp8":
            args = (*bufs, tuple(splits), n, True, torch.bfloat16)
            outs.append(dequant.fp8_group_dequantize_impl(*args)[0])
        else:
            flags = (mode[0], False, mode[1], SIGN_MASK, torch.bfloat16)
            args = (*bufs, tuple(splits), n, *flags)
            outs.append(dequant.nvfp4_group_dequantize_impl(*args)[0])
    torch.cuda.synchronize()
    for i, (r, got) in enumerate(zip(rounds, outs, strict=True)):
        if mode == "fp8":
            ref = recipe_reference.fp8_group_dequantize(
                *r, splits, n, columnwise=True, out_dtype=torch.bfloat16
            )
        else:
            ref = recipe_reference.nvfp4_group_dequantize(
                *r,
                splits,
                n,
                columnwise=mode[0],
                swizzled=False,
                undo_rht=mode[1],
                sign_mask=SIGN_MASK,
                out_dtype=torch.bfloat16,
            )
        assert_same_bits(got, ref, f"round {i} {mode}")


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("columnwise", [False, True], ids=["row", "col"])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_fp8_random_bytes(fp8, columnwise, out_dtype, rng):
    splits = random_splits(8, None, rng, zero_at=("front",), mean_rows=160)
    n = 272
    data = random_fp8_bytes(sum(splits) * n, rng, fp8)
    if not columnwise:
        data = data.view(-1, n)
    scale_inv = torch.exp2(torch.randint(-40, 40, (8,), generator=rng).float())
    scale_inv[3] = float("inf")
    check_fp8(data, scale_inv, splits, n, columnwise=columnwise, out_dtype=out_dtype)


@pytest.mark.parametrize("columnwise", [False, True], ids=["row", "col"])
def test_fp8_group_shapes_and_device_splits(columnwise, rng):
    n = 384
    for splits in (
        [2048],
        random_splits(300, None, rng, zero_at=("front", "middle", "end"), mean_rows=48),
        [0, 16, 0, 48, 0],
        [16, 48, 0, 64, 80, 144, 0, 0, 256, 32, 208, 112, 16, 0],  # long tiles over groups
    ):
        data = random_fp8_bytes(sum(splits) * n, rng, torch.float8_e4m3fn)
        if not columnwise:
            data = data.view(-1, n)
        scale_inv = torch.rand(len(splits), generator=rng) + 0.01
        for device in (None, _device_splits(splits, torch.int64)):
            check_fp8(
                data,
                scale_inv,
                splits,
                n,
                columnwise=columnwise,
                out_dtype=torch.bfloat16,
                device_splits=device,
            )


@pytest.mark.parametrize("device", [False, True], ids=["host-splits", "device-splits"])
def test_fp8_round_trip(device, rng):
    splits = random_splits(5, None, rng, zero_at=("end",), mean_rows=200)
    x = grouped_input(splits, 256, rng)
    s = _device_splits(splits) if device else splits
    q = cutequant.fp8_group_quantize(x, s)
    for columnwise in (False, True):
        got = dequant.fp8_group_dequantize(q, columnwise=columnwise)
        data = q.col_data if columnwise else q.row_data
        want = recipe_reference.fp8_group_dequantize(
            data.cpu(), q.scale_inv.cpu(), splits, 256, columnwise=columnwise
        )
        assert_same_bits(got, want, f"fp8 round trip col={columnwise}")
        amax_rows = torch.repeat_interleave(q.amax, torch.tensor(splits, device="cuda"))
        tol = 0.07 * x.float().abs() + 1e-3 * amax_rows[:, None]
        assert ((got.float() - x.float()).abs() <= tol).all()


def test_no_recompile_for_new_splits(rng):
    """New split sizes and group counts reuse the compiled kernels."""
    from cutequant import jit

    n = 256
    before = None
    for groups in (4, 3, 17):  # the first call compiles; the later split lists must not
        splits = random_splits(groups, None, rng)
        data, scales, amax = random_nvfp4_buffers(splits, n, rng, columnwise=True)
        check_nvfp4(
            data,
            scales,
            amax,
            splits,
            n,
            columnwise=True,
            swizzled=False,
            undo_rht=True,
            out_dtype=torch.bfloat16,
        )
        if before is None:
            before = jit.stats.compiles
    assert jit.stats.compiles == before
