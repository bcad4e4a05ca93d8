"""NVFP4 fake-quant for the three slots of TE's NVFP4 recipe on Hopper, where the GEMMs run in
bf16 on dequantized values, and a straight-through-estimator Linear built on them.

* activations / gradients, rowwise: ``nvfp4_fake_quantize_rows_impl`` (one fused kernel after
  the grouped amax pass; gradients with stochastic rounding);
* activations / gradients, columnwise in the RHT domain, transposed as the wgrad GEMM consumes
  it: ``nvfp4_fake_quantize_columnwise_impl`` (one fused kernel after the grouped amax pass:
  the RHT on the tensor cores, quantize and dequantize in registers);
* weights, 2D: ``nvfp4_2d.nvfp4_fake_quantize_2d_impl`` (the 2D kernel's fake-quant mode).

Every result is bit-identical to dequantize(quantize(x)) (``cutequant.recipe_reference``).
Each op is ``_check_*`` (argument rules, before any launch) plus an ``_impl`` returning a plain
tuple (amax outputs included) for ``torch.library``; ``nvfp4_fake_quant_linear`` is the
autograd wrapper.
"""

from __future__ import annotations

import functools

import torch

from cutequant import _checks, _launch, groups, nvfp4_2d, replay
from cutequant.amax import DEFAULT_SIGN_MASK, _num_groups, launch_group_amax, new_amax
from cutequant.amax import _spec as amax_spec
from cutequant.codegen.specs import FakeQuantColsSpec, FakeQuantRowsSpec
from cutequant.rng import fresh_state

FAKE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
TILE_COLS = 128
# True (the default; issue 20, branch fq7): the SR kernels' ``sr_trim`` (FakeQuantRowsSpec /
# FakeQuantColsSpec: the random byte as a subnormal FFMA operand, 32-bit Philox ids with the
# id-independent rounds once per thread; same bits). H200 run 67 (perf/probes/fake_quant_ab.py
# --flag SR_TRIM --rounds 3, bits identical): columnwise SR kernel 2.0-2.6% and rows SR 2.7-3.2%
# less time. sm_90a only (where it was tested); False for the A/B.
SR_TRIM = True


def _sr_trim(stochastic: bool, m_rows: int, n_cols: int, arch: str = "sm_90a") -> bool:
    """Whether this call's kernel takes ``sr_trim``: the switch, stochastic rounding, sm_90a, and
    every 16-element block id (< M N / 16, both directions) below 2^32 (larger calls, 2^36
    elements and more, compile the kernel without it on first use)."""
    return SR_TRIM and stochastic and arch == "sm_90a" and m_rows * n_cols // 16 < 1 << 32


def _check_fake_quantize(
    x, splits, amax, stochastic_rounding, rng_state, out_dtype, rht=False, sign_mask=0
):
    """Rules shared by the row and column fake-quant ops; returns (M, N, G). ``x``: contiguous
    bf16 [M, N], N % 16 == 0; ``amax``: None or fp32 [G]; ``rng_state``: int64 [2] (seed,
    offset) or None (the public op then draws one) with stochastic rounding, else None;
    ``out_dtype``: bf16 or f16."""
    m_rows, n_cols = _checks.check_x(x)
    _checks.check_flag(stochastic_rounding, "stochastic_rounding")
    _checks.check_flag(rht, "rht")
    _checks.check_sign_mask(sign_mask)
    if out_dtype not in FAKE_DTYPES:
        raise TypeError(f"out_dtype: must be torch.bfloat16 or torch.float16, got {out_dtype}")
    num_groups = _num_groups(splits)
    groups.check_splits(splits, m_rows)
    if amax is not None:
        _checks.check_amax_vector(amax, num_groups)
    if stochastic_rounding and rng_state is not None:  # None: the op draws a fresh one
        if not isinstance(rng_state, torch.Tensor):
            raise TypeError(
                f"rng_state: expected an int64 [2] tensor, got {type(rng_state).__name__}"
            )
        if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
            raise ValueError(
                f"rng_state: must be int64 of shape (2,), got {rng_state.dtype} "
                f"{tuple(rng_state.shape)}"
            )
    elif rng_state is not None:
        raise ValueError("rng_state: only used with stochastic_rounding=True")
    _checks.check_device(x)
    for name, t in (("amax", amax), ("rng_state", rng_state)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: on {t.device}, but x is on {x.device}")
    return m_rows, n_cols, num_groups


def carve_words(m_rows: int, n_cols: int, num_groups: int, given: bool, device: bool):
    """(fp32 words, word offset of the amax part) of an eager call's one outputs allocation
    (``_outputs``): y's M N 16-bit values from byte 0, then on a 256-byte boundary the amax
    part: a given amax's copy (G floats) or the amax pass's (row, column) rows (2 G); with
    device splits room for the two rows and, on the next 16-byte boundary, the call's snapshot
    and tables (``groups.device_tables_words``), which the amax pass or, with a given amax, the
    table kernel writes there."""
    at = -(-m_rows * n_cols // 128) * 64  # M N / 2 words, rounded up to 64 words (256 bytes)
    if device:  # a given amax's copy takes the first of the two rows
        return at + _amax_rows_words(num_groups) + groups.device_tables_words(num_groups), at
    return at + (num_groups if given else 2 * num_groups), at


def _amax_rows_words(num_groups: int) -> int:
    """Words of the two amax rows before a device-split call's tables (which start on a 16-byte
    boundary)."""
    return -(-2 * num_groups // 4) * 4


def _outputs(
    x, splits, amax, num_groups: int, rht: bool, sign_mask: int, arch, stream, direction: int,
    out_dtype, columnwise: bool, carve: bool,
):  # fmt: skip
    """(layout, amax the kernel reads, y, amax output, floats the kernel copies into it) for a
    fake-quant call, the amax pass launched where it runs. A given fp32 [G] ``amax``: the
    kernel reads it and its CTA 0 copies it into the [G] amax output (the op returns a copy;
    ``copy_given_amax``). Else the grouped amax pass's fp32 (row, column) rows (post-RHT with
    ``rht``), of which row ``direction`` is the amax the kernel reads and the op returns (a
    view); with device splits the call's tables follow them (the amax pass builds them).

    ``carve`` (eager calls with rows): y and the amax part are views of one fp32 allocation
    (``carve_words``; y a view of it as ``out_dtype``, at byte 0): one allocation per call
    instead of two. Else (the torch.library op, whose outputs must not share storage) y is an
    allocation of its own, and so is the amax part (with device splits one flat buffer holding
    both rows and the tables)."""
    m_rows, n_cols = x.shape
    dev = x.device
    given = amax is not None
    device = isinstance(splits, torch.Tensor)
    y_shape = (m_rows * n_cols,) if columnwise else (m_rows, n_cols)
    if carve and m_rows:
        words, at = carve_words(m_rows, n_cols, num_groups, given, device)
        buf = _launch.output_allocator(words, torch.float32, dev)
        y = buf.view(out_dtype).as_strided(y_shape, (1,) if columnwise else (n_cols, 1))
        stats, stats_at = buf, at
    else:
        y = _launch.output_allocator(y_shape, out_dtype, dev)
        stats = None
    if given:
        into = None  # device splits, not carved: the tables get a buffer of the call's own
        if stats is not None and device:
            into = (stats, 4 * (stats_at + _amax_rows_words(num_groups)))
        layout = groups.prepare_groups(splits, m_rows, dev, tile_records=True, into=into)
        if stats is None:
            out = _launch.output_allocator((num_groups,), torch.float32, dev)
        else:
            out = stats[stats_at : stats_at + num_groups]
        return layout, _contiguous(amax), y, out, num_groups
    amax_spec(arch, rht, "bf16")  # UnsupportedArchError before any launch
    if m_rows and device:
        if stats is None:
            words = _amax_rows_words(num_groups) + groups.device_tables_words(num_groups)
            stats, stats_at = _launch.output_allocator((words,), torch.float32, dev), 0
        amax_addr = stats.data_ptr() + 4 * stats_at
        layout = groups.prepare_groups(
            splits, m_rows, dev, poison=(amax_addr, 2 * num_groups), defer_tables=True,
            into=(stats, 4 * (stats_at + _amax_rows_words(num_groups))),
        )  # fmt: skip
        launch_group_amax(x, layout, amax_addr, rht=rht, sign_mask=sign_mask, arch=arch,
                          stream=stream)  # fmt: skip
        row = stats[stats_at + direction * num_groups : stats_at + (direction + 1) * num_groups]
        return layout, row, y, row, 0
    if stats is None:
        amax_buf = new_amax(2, num_groups, m_rows, dev)  # the amax pass writes it
        amax_addr, poison = amax_buf, amax_buf
    else:
        amax_addr = stats.data_ptr() + 4 * stats_at
        poison = (amax_addr, 2 * num_groups)
    layout = groups.prepare_groups(
        splits, m_rows, dev, poison=poison, tile_records=True, defer_tables=True
    )
    launch_group_amax(x, layout, amax_addr, rht=rht, sign_mask=sign_mask, arch=arch, stream=stream)
    if stats is None:
        row = amax_buf[direction]
    else:
        row = stats[stats_at + direction * num_groups : stats_at + (direction + 1) * num_groups]
    return layout, row, y, row, 0


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """A tensor argument the kernel addresses: a non-contiguous one is copied, and the call is
    not recorded (a replay would address the copy this call made)."""
    if t.is_contiguous():
        return t
    replay.taint()
    return t.contiguous()


def _copy_without_launch(src: torch.Tensor, out: torch.Tensor, count: int) -> None:
    """A given amax when no fake-quant kernel runs (no rows, no tiles): torch copies it."""
    if count:
        out.copy_(src)


def _tile_grid(layout, m_rows: int, n_cols: int, num_groups: int, tile_cols: int) -> int:
    """One CTA per (64-row tile, column tile): with per-call or device tables an upper bound of
    the row tiles (each group adds at most one partial tile; CTAs past the last tile exit)."""
    row_tiles = layout.row_tiles if layout.row_tiles >= 0 else m_rows // 64 + num_groups
    return row_tiles * -(-n_cols // tile_cols)


def nvfp4_fake_quantize_rows_impl(
    x: torch.Tensor,
    splits,
    amax: torch.Tensor | None,
    stochastic_rounding: bool,
    rng_state: torch.Tensor | None,
    out_dtype: torch.dtype,
    carve: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [M, N] ``out_dtype``, amax_row fp32 [G]) from validated arguments: y = the rowwise
    NVFP4 quantize (1x16 blocks, no RHT; stochastic rounding with ``rng_state``) of each group
    of ``x``, dequantized. ``amax``: the groups' rowwise amax to use (returned as a copy), else
    computed by the grouped amax pass. ``carve``: both outputs views of one allocation
    (``_outputs``; eager calls)."""
    m_rows, n_cols = x.shape
    dev = x.device
    num_groups = splits.numel() if isinstance(splits, torch.Tensor) else len(splits)
    arch = _launch.device_arch(dev)
    stream = _launch.raw_stream(dev)
    layout, amax_in, y, amax_row, copy_count = _outputs(
        x, splits, amax, num_groups, False, 0, arch, stream, 0, out_dtype, False, carve
    )
    num_ctas = _tile_grid(layout, m_rows, n_cols, num_groups, TILE_COLS)
    if m_rows and num_ctas:
        spec = _kernel_spec(FakeQuantRowsSpec, arch, stochastic_rounding, out_dtype, m_rows, n_cols)
        rng = _contiguous(rng_state) if stochastic_rounding else groups.dummy_buffer(dev)
        _launch.run(
            spec,
            _launch.ptr(x),
            _launch.ptr(amax_in, 4),
            _launch.ptr(y),
            layout.tables_addr(),
            num_groups,
            layout.row_tiles,
            n_cols,
            _launch.ptr(rng, 8),
            layout.early_level(),
            _launch.ptr(amax_row, 4),
            copy_count,
            num_ctas,
            stream=stream,
        )
    else:
        _copy_without_launch(amax_in, amax_row, copy_count)
    return y, amax_row


def nvfp4_fake_quantize_columnwise_impl(
    x: torch.Tensor,
    splits,
    amax: torch.Tensor | None,
    rht: bool,
    sign_mask: int,
    stochastic_rounding: bool,
    rng_state: torch.Tensor | None,
    out_dtype: torch.dtype,
    carve: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y_t flat [M * N] ``out_dtype`` (group g's [N, M_g] block at element row_start_g * N),
    amax_col fp32 [G]) from validated arguments: the columnwise NVFP4 quantize of each group
    (of RHT(x_g^T) with ``rht``, else of x_g^T; stochastic rounding with ``rng_state``),
    dequantized and left transposed, as the wgrad GEMM consumes it. ``amax``: the groups'
    columnwise (post-RHT) amax to use (returned as a copy), else computed by the grouped amax
    pass. One fused kernel (``fake_quant_cols.py.j2``) after that pass: the e2m1 values never
    reach memory. ``carve``: both outputs views of one allocation (``_outputs``; eager calls)."""
    m_rows, n_cols = x.shape
    dev = x.device
    num_groups = splits.numel() if isinstance(splits, torch.Tensor) else len(splits)
    arch = _launch.device_arch(dev)
    spec = _kernel_spec(FakeQuantColsSpec, arch, stochastic_rounding, out_dtype, m_rows, n_cols)
    stream = _launch.raw_stream(dev)
    layout, amax_in, y, amax_col, copy_count = _outputs(
        x, splits, amax, num_groups, rht, sign_mask, arch, stream, 1, out_dtype, True, carve
    )
    num_ctas = _tile_grid(layout, m_rows, n_cols, num_groups, FakeQuantColsSpec.TILE_COLS)
    if m_rows and num_ctas:
        rng = _contiguous(rng_state) if stochastic_rounding else groups.dummy_buffer(dev)
        _launch.run(
            spec,
            _launch.ptr(x),
            _launch.ptr(amax_in, 4),
            _launch.ptr(y),
            layout.tables_addr(),
            num_groups,
            layout.row_tiles,
            n_cols,
            _launch.ptr(rng, 8),
            sign_mask,
            int(rht),
            layout.early_level(),
            _launch.ptr(amax_col, 4),
            copy_count,
            num_ctas,
            stream=stream,
        )
    else:
        _copy_without_launch(amax_in, amax_col, copy_count)
    return y, amax_col


def _kernel_spec(cls, arch, stochastic_rounding, out_dtype, m_rows: int, n_cols: int):
    """The rows or columnwise (``cls``) fake-quant kernel for a call: its arch, rounding, output
    dtype and whether it takes ``sr_trim`` (``_sr_trim``: the switch and the call's size)."""
    return _spec(
        cls,
        arch=arch,
        stochastic=stochastic_rounding,
        out_dtype=FAKE_DTYPES[out_dtype],
        sr_trim=_sr_trim(stochastic_rounding, m_rows, n_cols, arch),
    )


@functools.cache
def _spec(cls, **fields):
    """A fake-quant kernel spec, made (and validated) once per variant."""
    return cls(**fields)


# ------------------------------------------------------------------------------ STE Linear


class _Nvfp4FakeQuantLinear(torch.autograd.Function):
    """y = Q_x(x) Q_w(W)^T (+ b), the GEMMs in the inputs' dtype on fake-quantized values
    (TE's NVFP4 recipe on Hopper). Backward, with straight-through gradients through the
    quantizers: dgrad = Q_g(dy) Q_w(W) (rowwise, stochastic rounding), wgrad = C_g(dy) C_x(x)^T
    with C the columnwise fake-quant in the RHT domain (the 16x16 RHT along tokens is
    orthogonal, so it cancels in the product) and stochastic rounding for the gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, sign_mask):
        m = x.shape[0]
        xq, _ = nvfp4_fake_quantize_rows_impl(x, (m,), None, False, None, x.dtype)
        wq = nvfp4_2d.nvfp4_fake_quantize_2d_impl(weight.contiguous()[None], None, x.dtype)[0][0]
        y = xq @ wq.t()
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, wq)
        ctx.sign_mask = sign_mask
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, wq = ctx.saved_tensors
        dy = dy.contiguous()
        m, k = x.shape
        n = dy.shape[1]
        dev = dy.device
        seeds = torch.randint(0, 2**62, (2, 2), dtype=torch.int64, device=dev)
        dyq, _ = nvfp4_fake_quantize_rows_impl(dy, (m,), None, True, seeds[0], dy.dtype)
        dx = dyq @ wq
        dy_col, _ = nvfp4_fake_quantize_columnwise_impl(
            dy, (m,), None, True, ctx.sign_mask, True, seeds[1], dy.dtype
        )
        x_col, _ = nvfp4_fake_quantize_columnwise_impl(
            x, (m,), None, True, ctx.sign_mask, False, None, x.dtype
        )
        dw = dy_col.view(n, m) @ x_col.view(k, m).t()
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw.to(wq.dtype), db, None


def nvfp4_fake_quant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    sign_mask: int = DEFAULT_SIGN_MASK,
) -> torch.Tensor:
    """``F.linear`` under TE's NVFP4 recipe, emulated on Hopper with fake-quant and straight-
    through gradients: x [M, K] (bf16, M % 16 == 0), weight [N, K] (bf16, 2D 16x16 blocks),
    optional bias [N]. See ``_Nvfp4FakeQuantLinear``."""
    m = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
    if m % 16:
        raise ValueError(f"x: M = {m} rows must be a multiple of 16 (NVFP4 16-token blocks)")
    _check_fake_quantize(x, (m,), None, False, None, torch.bfloat16)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("weight: expected a 2-D [N, K] tensor")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight: K = {weight.shape[1]} does not match x's {x.shape[1]}")
    nvfp4_2d._check_nvfp4_quantize_2d(weight[None], True, True, False, None)
    if weight.shape[0] % 16:
        raise ValueError(f"weight: N = {weight.shape[0]} must be a multiple of 16")
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],)
    ):
        raise ValueError(f"bias: expected shape ({weight.shape[0]},)")
    _checks.check_sign_mask(sign_mask)
    return _Nvfp4FakeQuantLinear.apply(x, weight, bias, sign_mask)


# ------------------------------------------------------------------------------ public ops


def nvfp4_fake_quantize(
    x: torch.Tensor,
    splits,
    *,
    columnwise: bool = False,
    rht: bool = True,
    sign_mask: int = DEFAULT_SIGN_MASK,
    stochastic_rounding: bool = False,
    rng_state: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 fake-quant of grouped bf16 ``x[sum(splits), N]``: the values a GEMM on NVFP4 data
    would see, bit-identical to ``nvfp4_group_dequantize(nvfp4_group_quantize(x, ...))``.

    Rowwise (activations for fprop, gradients for dgrad; ``stochastic_rounding`` for the
    gradients): ``(y [M, N], amax_row [G])``. ``columnwise=True`` (the wgrad operands): the
    columnwise quantize of RHT(x_g^T) (or x_g^T without ``rht``), left transposed and in the
    RHT domain as the wgrad GEMM consumes it: ``(y_t, amax_col [G])`` with ``y_t`` flat
    [M * N], group g's [N, M_g] block at element row_start_g * N. ``amax``: fp32 [G] of that
    direction to use, else computed (eager calls: y and the returned amax are views of one
    allocation; ``amax.clone()`` keeps an amax without y's memory). ``rng_state``: int64 [2]
    (seed, offset); when stochastic rounding has none, a fresh one (``cutequant.rng``: from
    torch's CUDA generator, reproducible from torch's seed; a view of a pool of states). Inside
    ``torch.compile`` this runs as the ``cutequant::nvfp4_fake_quantize`` op."""
    fresh = stochastic_rounding is True and rng_state is None
    if _is_compiling():
        from cutequant import ops

        if fresh:
            rng_state = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=x.device)
        device_splits, host_splits = ops.split_arg((splits,), 0)
        return ops.nvfp4_fake_quantize_op(
            x, device_splits, host_splits, columnwise, rht, sign_mask, stochastic_rounding,
            rng_state, amax, out_dtype,
        )  # fmt: skip
    flags = (columnwise, rht, sign_mask, stochastic_rounding, out_dtype, _launch.rht_mma())
    # a call without its state (stochastic rounding) keys as such, and takes a fresh one
    # (cutequant/rng.py) once its arguments are known good: a record exists, or the checks pass
    key, hit = replay.find(_RECORDS, x, splits, flags, (amax, rng_state))
    if fresh:
        if hit is None:
            _check_call(x, splits, columnwise, rht, sign_mask, True, None, amax, out_dtype)
        rng_state = fresh_state(x.device)
    if hit is not None:  # replay.py: the checked call's launches again
        record, words, y_shape, y_stride, a0, a1 = hit
        buf = _launch.output_allocator(words, torch.float32, x.device)
        record.launch((x, amax, buf, rng_state, replay.device_splits(splits)))
        return buf.view(out_dtype).as_strided(y_shape, y_stride), buf[a0:a1]
    with replay.recording() as rec:
        y, out_amax = fake_quantize_checked(
            x, splits, columnwise, rht, sign_mask, stochastic_rounding, rng_state, amax, out_dtype,
            carve=True,
        )  # fmt: skip
    # a call with rows made one fp32 allocation (``_outputs``): y at byte 0, the amax a slice
    buf = out_amax._base
    if key is not None and rec.replayable(x.shape[0]) and buf is not None:
        assert buf.data_ptr() == y.data_ptr() and buf.dtype == torch.float32
        bases = [x, amax, buf, rng_state, replay.device_splits(splits)]
        record = replay.Replay(rec.launches, bases, rec.scratch)
        a0 = out_amax.storage_offset()
        hit = (record, buf.numel(), tuple(y.shape), y.stride(), a0, a0 + out_amax.numel())
        _RECORDS.put(key, hit)
    return y, out_amax


_RECORDS = replay.CallMemo()  # nvfp4_fake_quantize's replayable calls (replay.py)
# torch.compile recognizes the function object, whatever name calls it (a module attribute
# lookup less per eager call)
_is_compiling = torch.compiler.is_compiling


def fake_quantize_checked(
    x, splits, columnwise, rht, sign_mask, stochastic_rounding, rng_state, amax, out_dtype,
    carve=False,
):  # fmt: skip
    """Checks, then the rowwise or columnwise fake-quant (what the op runs too; ``carve``: the
    eager call's one outputs allocation, ``_outputs``)."""
    _check_call(x, splits, columnwise, rht, sign_mask, stochastic_rounding, rng_state, amax,
                out_dtype)  # fmt: skip
    if stochastic_rounding and rng_state is None:  # the torch.library op called without one
        rng_state = fresh_state(x.device)
    if columnwise:
        return nvfp4_fake_quantize_columnwise_impl(
            x, splits, amax, rht, sign_mask, stochastic_rounding, rng_state, out_dtype, carve
        )
    return nvfp4_fake_quantize_rows_impl(
        x, splits, amax, stochastic_rounding, rng_state, out_dtype, carve
    )


def _check_call(x, splits, columnwise, rht, sign_mask, stochastic_rounding, rng_state, amax,
                out_dtype):  # fmt: skip
    """Every argument rule of a fake-quant call (rht and sign_mask only for the columnwise one,
    which uses them)."""
    _checks.check_flag(columnwise, "columnwise")
    if columnwise:
        _check_fake_quantize(x, splits, amax, stochastic_rounding, rng_state, out_dtype, rht,
                             sign_mask)  # fmt: skip
    else:
        _check_fake_quantize(x, splits, amax, stochastic_rounding, rng_state, out_dtype)
