"""GPU: the eager fast path (runtime/replay.py). A call whose key (shapes, dtypes, flags, host
split list, stream) was seen with cached tables relaunches the recorded kernels with the new
tensors' addresses instead of running the checks again. Its outputs must be bit-identical to
the checked path's, every byte written (poisoned outputs), on fresh inputs; arguments the key
cannot hold (contiguity, alignment) must still be checked; and a record must never outlive the
runtime buffers it points at."""

import pytest
import torch

import cutequant
from cutequant import _launch, dequant, fake_quant, fp8, groups, nvfp4, nvfp4_2d, replay
from cutequant import amax as amax_mod
from cutequant.testing import grouped_input, poisoned_outputs, random_splits

pytestmark = pytest.mark.gpu

N_COLS = 512


def _bytes(t) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1).cpu()


def _nvfp4_parts(res) -> dict:
    names = ("row_data", "row_scales", "col_data", "col_scales")
    out = {k: getattr(res, k) for k in names if getattr(res, k) is not None}
    if res._layout.host_splits is None:
        # device splits: the scale buffers have upper-bound sizes whose tail no kernel writes;
        # every group's block (its padding included) is written
        for k in ("row_scales", "col_scales"):
            if k in out:
                out[k] = torch.cat([g[k].reshape(-1) for g in res.groups()])
    out["amax"] = res._amax
    return out


def _fp8_parts(res) -> dict:
    out = {"amax": res._amax, "scales": res._outputs.get("scales")}
    for k in ("row_data", "col_data"):
        if getattr(res, k) is not None:
            out[k] = getattr(res, k)
    return out


def _weight_parts(res) -> dict:
    names = ("row_data", "row_scales", "col_data", "col_scales", "amax")
    return {k: getattr(res, k) for k in names if getattr(res, k) is not None}


def _checked(fn):
    """``fn()`` on the checked path (no record is looked up or made)."""
    replay.enabled = False
    try:
        return fn()
    finally:
        replay.enabled = True


class _NoChecks:
    """Within the block, the ops' checked paths raise: only a replay can succeed."""

    NAMES = (
        (amax_mod, "check_group_amax"),
        (nvfp4, "check_quantize"),
        (fp8, "check_fp8_quantize"),
        (dequant, "_check_nvfp4_dequantize"),
        (dequant, "_check_fp8_dequantize"),
        (fake_quant, "fake_quantize_checked"),
        (nvfp4_2d, "_check_nvfp4_quantize_2d"),
    )

    def __enter__(self):
        self.saved = [getattr(m, n) for m, n in self.NAMES]

        def boom(*a, **k):
            raise AssertionError("the checked path ran; expected a replay")

        for m, n in self.NAMES:
            setattr(m, n, boom)

    def __exit__(self, *exc):
        for (m, n), fn in zip(self.NAMES, self.saved, strict=True):
            setattr(m, n, fn)


def _cases(splits, amax, rng_state, scale):
    q = cutequant.nvfp4_group_quantize
    f = cutequant.fp8_group_quantize
    fq = cutequant.nvfp4_fake_quantize
    w2d = cutequant.nvfp4_quantize_weights_2d
    fw2d = cutequant.nvfp4_fake_quantize_weights_2d
    return {
        "group_amax": (lambda x: dict(zip("rc", cutequant.group_amax(x, splits), strict=True))),
        "group_amax_no_rht": (
            lambda x: dict(zip("rc", cutequant.group_amax(x, splits, rht=False), strict=True))
        ),
        "nvfp4": lambda x: _nvfp4_parts(q(x, splits)),
        "nvfp4_given_amax": lambda x: _nvfp4_parts(q(x, splits, amax=amax)),
        "nvfp4_rowwise_swizzled": lambda x: _nvfp4_parts(
            q(x, splits, columnwise=False, swizzled_scales=True)
        ),
        "nvfp4_columnwise_fast_math": lambda x: _nvfp4_parts(
            q(x, splits, rowwise=False, fast_math=True)
        ),
        "nvfp4_estimated": lambda x: _nvfp4_parts(q(x, splits, amax_estimation_scale=2.0)),
        "nvfp4_sr_given_state": lambda x: _nvfp4_parts(
            q(x, splits, stochastic_rounding=True, rng_state=rng_state)
        ),
        "fp8_current": lambda x: _fp8_parts(f(x, splits)),
        "fp8_delayed": lambda x: _fp8_parts(f(x, splits, scaling="delayed", scale=scale)),
        "fp8_rowwise_e5m2": lambda x: _fp8_parts(
            f(x, splits, fp8_dtype=torch.float8_e5m2, columnwise=False)
        ),
        # the dequantize of a replayed result (its buffers' layout is the record's)
        "nvfp4_dequantize_row": lambda x: {"out": dequant.nvfp4_group_dequantize(q(x, splits))},
        "nvfp4_dequantize_col_unrht": lambda x: {
            "out": dequant.nvfp4_group_dequantize(q(x, splits), columnwise=True)
        },
        "fp8_dequantize_row_f32": lambda x: {
            "out": dequant.fp8_group_dequantize(f(x, splits), out_dtype=torch.float32)
        },
        "fp8_dequantize_col": lambda x: {
            "out": dequant.fp8_group_dequantize(f(x, splits), columnwise=True)
        },
        "fake_quant_rows": lambda x: dict(zip("ya", fq(x, splits), strict=True)),
        "fake_quant_rows_sr_given_amax": lambda x: dict(
            zip(
                "ya",
                fq(
                    x,
                    splits,
                    stochastic_rounding=True,
                    rng_state=rng_state,
                    amax=amax[0].contiguous(),
                ),
                strict=True,
            )  # fmt: skip
        ),
        "fake_quant_columnwise_rht": lambda x: dict(
            zip("ya", fq(x, splits, columnwise=True), strict=True)
        ),
        "fake_quant_columnwise_f16": lambda x: dict(
            zip(
                "ya",
                fq(x, splits, columnwise=True, rht=False, out_dtype=torch.float16),
                strict=True,
            )  # fmt: skip
        ),
        # 2D weights: x as E stacked [64, N] experts
        "weights_2d": lambda x: _weight_parts(w2d(x.view(-1, 64, N_COLS))),
        "weights_2d_swizzled_col_only": lambda x: _weight_parts(
            w2d(x.view(-1, 64, N_COLS), rowwise=False, swizzled_scales=True)
        ),
        "weights_2d_given_amax": lambda x: _weight_parts(
            w2d(x.view(-1, 64, N_COLS), amax=torch.ones(x.shape[0] // 64, device="cuda"))
        ),
        "weights_2d_fake": lambda x: dict(zip("ya", fw2d(x.view(-1, 64, N_COLS)), strict=True)),
    }


def _assert_replay_matches_checked(name: str, op, x) -> None:
    """``op(x)`` replayed (the checked path made to raise, every output byte poisoned) equals
    the checked path's result bit for bit."""
    want = _checked(lambda: op(x))
    with poisoned_outputs(), _NoChecks():
        got = op(x)
    assert got.keys() == want.keys(), name
    for k in want:
        assert torch.equal(_bytes(got[k]), _bytes(want[k])), (name, k)


# the ops that take no splits (the 2D weights: experts of equal shape)
_HOST_ONLY = ("weights_2d",)


@pytest.mark.parametrize("device_splits", [False, True], ids=["host_splits", "device_splits"])
@pytest.mark.parametrize("seed", [0, 1])
def test_replay_is_bit_identical(seed, device_splits):
    gen = torch.Generator().manual_seed(seed)
    g = 5 + seed * 40
    splits = random_splits(g, 64 * g, gen, zero_at=("front", "middle", "end"))
    x = grouped_input(splits, N_COLS, gen)
    amax = torch.stack(cutequant.group_amax(x, splits))
    rng_state = torch.tensor([1234 + seed, 99], dtype=torch.int64, device="cuda")
    scale = torch.rand(g, generator=gen).add(0.5).cuda()
    host = splits
    if device_splits:
        splits = torch.tensor(host, dtype=torch.int32 if seed else torch.int64, device="cuda")
    for name, op in _cases(splits, amax, rng_state, scale).items():
        if device_splits and name.startswith(_HOST_ONLY):
            continue
        for _ in range(3):  # first sighting, cached (recorded), replay
            op(x)
        fresh = grouped_input(host, N_COLS, gen)
        _assert_replay_matches_checked(name, op, fresh)


def test_replay_still_checks_what_the_key_cannot_hold():
    gen = torch.Generator().manual_seed(7)
    splits = [128, 0, 256]
    x = grouped_input(splits, N_COLS, gen)
    amax = torch.stack(cutequant.group_amax(x, splits))
    for _ in range(3):
        cutequant.nvfp4_group_quantize(x, splits, amax=amax)
        cutequant.group_amax(x, splits)
    wide = grouped_input(splits, 2 * N_COLS, gen)
    strided = wide[:, ::2]  # same shape and dtype as x, not contiguous
    with pytest.raises(ValueError, match="x: must be contiguous"):
        cutequant.group_amax(strided, splits)
    with pytest.raises(ValueError, match="x: must be contiguous"):
        cutequant.nvfp4_group_quantize(strided, splits, amax=amax)
    # a non-contiguous given amax is accepted (copied) by the checked path: same result
    loose = torch.empty(amax.shape[1], 2, device="cuda").t()
    loose.copy_(amax)
    want = _nvfp4_parts(cutequant.nvfp4_group_quantize(x, splits, amax=amax))
    got = _nvfp4_parts(cutequant.nvfp4_group_quantize(x, splits, amax=loose))
    for k in ("row_data", "row_scales", "col_data", "col_scales"):
        assert torch.equal(_bytes(got[k]), _bytes(want[k])), k
    with pytest.raises((TypeError, ValueError), match="splits"):
        cutequant.group_amax(x, [128.0, 0.0, 256.0])
    with pytest.raises(TypeError, match="rht"):
        cutequant.group_amax(x, splits, rht=1)


def test_replay_follows_the_stream():
    """A record is per stream: a call on a side stream gets its own (its launch counter and
    ordering), and its result is right after the side stream's earlier work."""
    gen = torch.Generator().manual_seed(3)
    splits = [256, 128]
    x = grouped_input(splits, N_COLS, gen)
    for _ in range(3):
        want = cutequant.group_amax(x, splits)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = torch.empty_like(x)
        for _ in range(4):
            y.copy_(x)  # on the side stream, before the op reads y
            got = cutequant.group_amax(y, splits)
    torch.cuda.current_stream().wait_stream(side)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_records_are_dropped_when_runtime_buffers_are_replaced():
    gen = torch.Generator().manual_seed(5)
    splits = [64, 64]
    x = grouped_input(splits, N_COLS, gen)
    for _ in range(3):
        cutequant.group_amax(x, splits)
    key = replay.call_key(x, splits, (True, amax_mod.DEFAULT_SIGN_MASK, _launch.rht_mma()))
    assert amax_mod._RECORDS.get(key) is not None
    groups._retire()  # what evicting a layout or growing a workspace does
    assert amax_mod._RECORDS.get(key) is None
    want = cutequant.group_amax(x, splits)  # checked again, recorded again
    assert amax_mod._RECORDS.get(key) is not None
    with _NoChecks():
        got = cutequant.group_amax(x, splits)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_replayed_device_splits_are_still_checked_on_the_device():
    """Bad device split values after a record: the replay reruns the table kernel, which
    poisons the outputs (NaN amax) exactly as the checked path does."""
    gen = torch.Generator().manual_seed(11)
    splits = [256, 128, 128]
    x = grouped_input(splits, N_COLS, gen)
    good = torch.tensor(splits, dtype=torch.int32, device="cuda")
    for _ in range(3):
        cutequant.group_amax(x, good)
    bad = torch.tensor([256, 128, 112], dtype=torch.int32, device="cuda")  # sum != M
    want = _checked(lambda: torch.stack(cutequant.group_amax(x, bad)))
    with _NoChecks():
        got = torch.stack(cutequant.group_amax(x, bad))
    assert torch.isnan(want).all()
    assert torch.equal(_bytes(got), _bytes(want))


@pytest.mark.parametrize("seed", [2, 3])
def test_replay_with_new_device_split_values(seed):
    """A record made with one set of device split values serves other values of the same
    count and total (the replay reruns the table kernel on the call's tensor): bit-identical to
    the checked path on those values, every output byte written."""
    gen = torch.Generator().manual_seed(seed)
    g = 7 + 30 * (seed % 2)
    first = random_splits(g, 64 * g, gen, zero_at=("front",))
    second = random_splits(g, 64 * g, gen, zero_at=("middle", "end"))
    assert sum(second) == sum(first) and second != first  # same M: the key holds x's shape
    x = grouped_input(first, N_COLS, gen)
    amax = torch.stack(cutequant.group_amax(x, first))
    rng_state = torch.tensor([77, seed], dtype=torch.int64, device="cuda")
    scale = torch.rand(g, generator=gen).add(0.5).cuda()
    splits = torch.tensor(first, dtype=torch.int32, device="cuda")
    for name, op in _cases(splits, amax, rng_state, scale).items():
        if name.startswith(_HOST_ONLY):
            continue
        splits.copy_(torch.tensor(first, dtype=torch.int32))
        for _ in range(3):  # first sighting, then recorded and replayed with `first`
            op(x)
        splits.copy_(torch.tensor(second, dtype=torch.int32))
        fresh = grouped_input(second, N_COLS, gen)
        _assert_replay_matches_checked(name, op, fresh)


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "columnwise"])
def test_dequantize_of_a_first_sighting_result_is_replayed(columnwise):
    """A result whose split tables are its own (a host list seen for the first time) keys its
    dequantize record by its buffers and group count: dequantizing it again replays, bit for
    bit, every output byte written."""
    from test_gpu_fresh_splits import _fresh_lists

    gen = torch.Generator().manual_seed(11 + columnwise)
    lists = _fresh_lists(gen, 2, 1024)
    x = grouped_input(lists[0], N_COLS, gen)
    res = cutequant.nvfp4_group_quantize(x, lists[0])
    fres = cutequant.fp8_group_quantize(x, lists[1])
    assert res._layout.per_call_tables and fres._layout.per_call_tables
    for dq, r in (
        (lambda r: dequant.nvfp4_group_dequantize(r, columnwise=columnwise), res),
        (lambda r: dequant.fp8_group_dequantize(r, columnwise=columnwise), fres),
    ):
        want = _checked(lambda dq=dq, r=r: dq(r))
        dq(r)  # recorded
        with poisoned_outputs(), _NoChecks():
            got = dq(r)
        assert torch.equal(_bytes(got), _bytes(want))


def test_records_do_not_hold_results_alive():
    """A device-split NVFP4 call's tables live in its outputs buffer: neither the quantize
    record nor the record of its dequantize may keep that buffer (a whole result) alive."""
    import gc
    import weakref

    gen = torch.Generator().manual_seed(3)
    host = random_splits(6, 384, gen, zero_at=("middle",))
    splits = torch.tensor(host, dtype=torch.int32, device="cuda")
    x = grouped_input(host, N_COLS, gen)
    refs = []
    for _ in range(3):  # checked and recorded, then replayed
        res = cutequant.nvfp4_group_quantize(x, splits)
        for columnwise in (False, True):
            dequant.nvfp4_group_dequantize(res, columnwise=columnwise)
            dequant.nvfp4_group_dequantize(res, columnwise=columnwise)  # recorded or replayed
        refs.append(weakref.ref(res._outputs.buf))
        del res
    gc.collect()
    assert all(r() is None for r in refs)


def test_stochastic_rounding_without_a_state_is_replayed_and_reproducible():
    """Stochastic rounding without an ``rng_state`` (cutequant/rng.py): after its first calls
    the call is replayed (the checked path made to raise), each call takes a state of its own
    (the next of one torch.randint draw of ``rng.POOL_STATES`` after the seed), every result is
    the checked path's for the state it used, and the same calls after the same
    ``torch.manual_seed`` repeat states and bits."""
    from cutequant import rng

    gen = torch.Generator().manual_seed(11)
    splits = random_splits(6, 384, gen, zero_at=("middle",))
    x = grouped_input(splits, N_COLS, gen)
    q = cutequant.nvfp4_group_quantize
    fq = cutequant.nvfp4_fake_quantize
    for _ in range(3):  # first sighting, cached (recorded)
        q(x, splits, stochastic_rounding=True)
        fq(x, splits, stochastic_rounding=True)
        fq(x, splits, columnwise=True, stochastic_rounding=True)

    def run():
        torch.manual_seed(1234)
        with poisoned_outputs(), _NoChecks():
            res = [q(x, splits, stochastic_rounding=True) for _ in range(3)]
            rows = [fq(x, splits, stochastic_rounding=True) for _ in range(2)]
            cols = fq(x, splits, columnwise=True, stochastic_rounding=True)
        return res, rows, cols

    res, rows, cols = run()
    again = run()
    torch.manual_seed(1234)
    pool = torch.randint(0, 2**62, (rng.POOL_STATES, 2), dtype=torch.int64, device="cuda")
    assert [r.rng_state.tolist() for r in res] == pool[:3].tolist()
    for r, r2 in zip(res, again[0], strict=True):
        want = _nvfp4_parts(_checked(lambda s=r.rng_state: q(x, splits, stochastic_rounding=True,
                                                             rng_state=s.clone())))  # fmt: skip
        got, got2 = _nvfp4_parts(r), _nvfp4_parts(r2)
        for k in want:
            assert torch.equal(_bytes(got[k]), _bytes(want[k])), k
            assert torch.equal(_bytes(got2[k]), _bytes(want[k])), k
    outs = [*rows, cols]
    outs2 = [*again[1], again[2]]
    for i, ((y, a), (y2, a2)) in enumerate(zip(outs, outs2, strict=True)):
        state = pool[3 + i].clone()
        want_y, want_a = _checked(
            lambda s=state, c=(i == 2): fq(
                x, splits, columnwise=c, stochastic_rounding=True, rng_state=s
            )
        )
        for got in ((y, a), (y2, a2)):
            assert torch.equal(_bytes(got[0]), _bytes(want_y)), i
            assert torch.equal(_bytes(got[1]), _bytes(want_a)), i
