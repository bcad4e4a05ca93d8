"""The public ops as ``torch.library`` custom ops (namespace ``cutequant``).

Every op has a fake (meta) implementation that gives its outputs' shapes and dtypes from the
input shapes and flags alone -- it never compiles or launches anything -- so ``torch.compile``
(``fullgraph=True`` included) and CUDA graphs (``mode="reduce-overhead"``) see through them.

Eager calls do not go through these ops: the custom-op boundary adds ~14 us of CPU per call on
the H100 hosts (the Library define / impl route ~4 us; perf/host_overhead.py primitives, about
as much as the kernel launch itself), so the public functions call the kernels directly
and switch to ``torch.ops.cutequant.*`` only while ``torch.compiler.is_compiling()``. Both
routes run the same checks and launches (``check_*`` / ``run_*`` in each op's module).

Split sizes reach an op as either ``device_splits`` (an int32 / int64 CUDA tensor: no host
synchronization, no recompile when the values change; the scale buffers then have upper-bound
sizes) or ``host_splits`` (a list of ints: exact sizes; torch.compile guards on the values).
Outputs an op does not compute are returned as empty tensors; device-split calls also return
the call's row-start snapshot (int32 [G + 2], last = validity), from which results find their
groups later.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from cutequant import amax as _amax
from cutequant import dequant as _dequant
from cutequant import fake_quant as _fake_quant
from cutequant import fp8 as _fp8
from cutequant import groups, packing
from cutequant import nvfp4 as _nvfp4
from cutequant import nvfp4_2d as _nvfp4_2d

Tensor = torch.Tensor


def _splits(device_splits, host_splits):
    return device_splits if device_splits is not None else list(host_splits)


def _split_args(splits):
    """(device_splits, host_splits) of a public call's ``splits``."""
    if isinstance(splits, torch.Tensor) and splits.is_cuda:
        return splits, None
    if isinstance(splits, torch.Tensor):
        return None, [int(v) for v in splits.tolist()]
    return None, list(splits)


def _num_groups(device_splits, host_splits):
    return device_splits.shape[0] if device_splits is not None else len(host_splits)


def _snapshot(layout, device) -> Tensor:
    """The call's row-start snapshot (device splits) or an empty int32 tensor (host splits)."""
    if layout.snapshot is not None:
        return layout.snapshot
    return torch.empty(0, dtype=torch.int32, device=device)


def _empty_u8(device) -> Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device)


def _traced_layout(x, device_splits, host_splits, snapshot) -> groups.GroupLayout:
    """The GroupLayout a result built from op outputs carries: host splits, or the snapshot."""
    return groups.GroupLayout(
        _num_groups(device_splits, host_splits),
        x.shape[0],
        None,
        None if host_splits is None else tuple(host_splits),
        snapshot if device_splits is not None else None,
    )


# --------------------------------------------------------------------------- group_amax


@custom_op("cutequant::group_amax", mutates_args=(), device_types="cuda")
def group_amax_op(
    x: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    rht: bool,
    sign_mask: int,
) -> Tensor:
    """fp32 [2, G]: (row amax, column amax) per group."""
    splits = _splits(device_splits, host_splits)
    m_rows, num_groups, splits, arch = _amax.check_group_amax(x, splits, rht, sign_mask)
    return _amax.run_group_amax(x, splits, m_rows, num_groups, rht, sign_mask, arch)[0]


@group_amax_op.register_fake
def _(x, device_splits, host_splits, rht, sign_mask):
    return x.new_empty((2, _num_groups(device_splits, host_splits)), dtype=torch.float32)


def group_amax_traced(x, splits, rht, sign_mask):
    device_splits, host_splits = _split_args(splits)
    amax = group_amax_op(x, device_splits, host_splits, rht, sign_mask)
    return amax[0], amax[1]


# --------------------------------------------------------------------------- NVFP4


@custom_op("cutequant::nvfp4_group_quantize", mutates_args=(), device_types="cuda")
def nvfp4_group_quantize_op(
    x: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    rowwise: bool,
    columnwise: bool,
    rht: bool,
    sign_mask: int,
    swizzled_scales: bool,
    fast_math: bool,
    amax: Tensor | None,
    stochastic_rounding: bool,
    rng_state: Tensor | None,
    amax_estimation_scale: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(row_data, row_scales, col_data, col_scales, amax [2, G] (empty when given), snapshot).
    With stochastic rounding ``rng_state`` is required (the traced wrapper draws it)."""
    if stochastic_rounding and rng_state is None:
        raise ValueError("rng_state: required by the op with stochastic_rounding=True")
    splits = _splits(device_splits, host_splits)
    flags = (rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math)
    m_rows, n_cols, num_groups, splits, amax_in, rng_state, arch = _nvfp4.check_quantize(
        x, splits, *flags, amax, stochastic_rounding, rng_state, amax_estimation_scale
    )
    outputs, amax_out, layout, _ = _nvfp4.run_quantize(
        x, splits, m_rows, n_cols, num_groups, arch, *flags, amax_in, stochastic_rounding,
        rng_state, amax_estimation_scale, packing.SeparateOutputs,
    )  # fmt: skip
    parts = [outputs[k] if outputs[k] is not None else _empty_u8(x.device) for k in _NVFP4_PARTS]
    amax_out = amax_out if amax is None else torch.empty(0, dtype=torch.float32, device=x.device)
    return (*parts, amax_out, _snapshot(layout, x.device))


_NVFP4_PARTS = ("row_data", "row_scales", "col_data", "col_scales")


@nvfp4_group_quantize_op.register_fake
def _(
    x, device_splits, host_splits, rowwise, columnwise, rht, sign_mask, swizzled_scales,
    fast_math, amax, stochastic_rounding, rng_state, amax_estimation_scale,
):  # fmt: skip
    m_rows, n_cols = x.shape
    num_groups = _num_groups(device_splits, host_splits)
    parts = _nvfp4.output_parts(m_rows, n_cols, num_groups, rowwise, columnwise, host_splits)
    out = [
        x.new_empty(parts[k][0], dtype=parts[k][1])
        if parts[k]
        else x.new_empty(0, dtype=torch.uint8)
        for k in _NVFP4_PARTS
    ]
    amax_out = x.new_empty((2, num_groups) if amax is None else (0,), dtype=torch.float32)
    snap = (num_groups + 2,) if device_splits is not None else (0,)
    return (*out, amax_out, x.new_empty(snap, dtype=torch.int32))


def nvfp4_group_quantize_traced(
    x, splits, rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math, amax,
    stochastic_rounding, rng_state, amax_estimation_scale,
):  # fmt: skip
    """``nvfp4_group_quantize`` while torch.compile traces: the op, then the result object."""
    device_splits, host_splits = _split_args(splits)
    if isinstance(amax, (tuple, list)):
        amax = torch.stack([amax[0].reshape(-1), amax[1].reshape(-1)])
    if stochastic_rounding and rng_state is None:
        rng_state = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=x.device)
    *parts, amax_out, snapshot = nvfp4_group_quantize_op(
        x, device_splits, host_splits, rowwise, columnwise, rht, sign_mask, swizzled_scales,
        fast_math, amax, stochastic_rounding, rng_state, amax_estimation_scale,
    )  # fmt: skip
    outputs = {
        "row_data": parts[0] if rowwise else None,
        "row_scales": parts[1] if rowwise else None,
        "col_data": parts[2] if columnwise else None,
        "col_scales": parts[3] if columnwise else None,
    }
    return _nvfp4.Nvfp4GroupedTensor(
        n_cols=x.shape[1],
        outputs=outputs,
        amax=amax_out if amax is None else amax,
        swizzled_scales=swizzled_scales,
        rht=rht and columnwise,
        sign_mask=sign_mask,
        fast_math=fast_math,
        rng_state=rng_state,
        layout=_traced_layout(x, device_splits, host_splits, snapshot),
    )


def split_arg(args: tuple, index: int) -> tuple:
    """``args`` with its ``splits`` (at ``index``) as (device_splits, host_splits)."""
    return (*args[:index], *_split_args(args[index]), *args[index + 1 :])


@custom_op("cutequant::nvfp4_group_dequantize", mutates_args=(), device_types="cuda")
def nvfp4_group_dequantize_op(
    data: Tensor,
    scales: Tensor,
    amax: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    n_cols: int,
    columnwise: bool,
    swizzled: bool,
    undo_rht: bool,
    sign_mask: int,
    out_dtype: torch.dtype,
    transposed_out: bool = False,
) -> Tensor:
    """[M, N] ``out_dtype`` (flat [M * N] with ``transposed_out``) from one direction of an
    NVFP4 result (``dequant.nvfp4_group_dequantize_impl``)."""
    args = (
        data, scales, amax, _splits(device_splits, host_splits), n_cols, columnwise, swizzled,
        undo_rht, sign_mask, out_dtype,
    )  # fmt: skip
    _dequant._check_nvfp4_dequantize(*args)
    return _dequant.nvfp4_group_dequantize_impl(*args, transposed_out)[0]


@nvfp4_group_dequantize_op.register_fake
def _(
    data, scales, amax, device_splits, host_splits, n_cols, columnwise, swizzled, undo_rht,
    sign_mask, out_dtype, transposed_out=False,
):  # fmt: skip
    m = data.numel() * 2 // n_cols
    return data.new_empty((m * n_cols,) if transposed_out else (m, n_cols), dtype=out_dtype)


# --------------------------------------------------------------------------- FP8


@custom_op("cutequant::fp8_group_quantize", mutates_args=(), device_types="cuda")
def fp8_group_quantize_op(
    x: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    fp8_dtype: torch.dtype,
    scaling: str,
    scale: Tensor | None,
    rowwise: bool,
    columnwise: bool,
    amax_epsilon: float,
    force_pow2_scales: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(row_data, col_data (both as uint8), scales [2, G] = (scale, scale_inv),
    amax [1 or 2, G], snapshot)."""
    splits = _splits(device_splits, host_splits)
    args = (fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon, force_pow2_scales)
    m_rows, n_cols, num_groups, splits, scale, arch = _fp8.check_fp8_quantize(x, splits, *args)
    outputs, amax, layout = _fp8.run_fp8_quantize(
        x, splits, m_rows, n_cols, num_groups, arch, fp8_dtype, scaling, scale, rowwise,
        columnwise, amax_epsilon, force_pow2_scales, packing.SeparateOutputs,
    )  # fmt: skip
    # fp8 crosses the op boundary as uint8 (torch's schema and aliasing checks do not take fp8)
    row = outputs["row_data"].view(torch.uint8) if rowwise else _empty_u8(x.device)
    col = outputs["col_data"].view(torch.uint8) if columnwise else _empty_u8(x.device)
    return row, col, outputs["scales"], amax, _snapshot(layout, x.device)


@fp8_group_quantize_op.register_fake
def _(
    x, device_splits, host_splits, fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon,
    force_pow2_scales,
):  # fmt: skip
    m_rows, n_cols = x.shape
    num_groups = _num_groups(device_splits, host_splits)
    parts = _fp8.output_parts(m_rows, n_cols, num_groups, fp8_dtype, rowwise, columnwise)
    row = x.new_empty(parts["row_data"][0] if rowwise else (0,), dtype=torch.uint8)
    col = x.new_empty(parts["col_data"][0] if columnwise else (0,), dtype=torch.uint8)
    scales = x.new_empty((2, num_groups), dtype=torch.float32)
    amax = x.new_empty((1 if scaling == "delayed" else 2, num_groups), dtype=torch.float32)
    snap = (num_groups + 2,) if device_splits is not None else (0,)
    return row, col, scales, amax, x.new_empty(snap, dtype=torch.int32)


def fp8_group_quantize_traced(
    x, splits, fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon, force_pow2_scales
):
    device_splits, host_splits = _split_args(splits)
    row, col, scales, amax, snapshot = fp8_group_quantize_op(
        x, device_splits, host_splits, fp8_dtype, scaling, scale, rowwise, columnwise,
        float(amax_epsilon), force_pow2_scales,
    )  # fmt: skip
    outputs = {
        "row_data": row.view(fp8_dtype) if rowwise else None,
        "col_data": col.view(fp8_dtype) if columnwise else None,
        "scales": scales,
    }
    return _fp8.Fp8GroupedTensor(
        n_cols=x.shape[1],
        fp8_dtype=fp8_dtype,
        outputs=outputs,
        amax=amax,
        layout=_traced_layout(x, device_splits, host_splits, snapshot),
    )


@custom_op("cutequant::fp8_group_dequantize", mutates_args=(), device_types="cuda")
def fp8_group_dequantize_op(
    data: Tensor,
    fp8_dtype: torch.dtype,
    scale_inv: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    n_cols: int,
    columnwise: bool,
    out_dtype: torch.dtype,
) -> Tensor:
    """[M, N] ``out_dtype`` from one direction of an FP8 result, the data as uint8 bytes of
    ``fp8_dtype`` (``dequant.fp8_group_dequantize_impl``)."""
    args = (
        data.view(fp8_dtype), scale_inv, _splits(device_splits, host_splits), n_cols,
        columnwise, out_dtype,
    )  # fmt: skip
    _dequant._check_fp8_dequantize(*args)
    return _dequant.fp8_group_dequantize_impl(*args)[0]


@fp8_group_dequantize_op.register_fake
def _(data, fp8_dtype, scale_inv, device_splits, host_splits, n_cols, columnwise, out_dtype):
    return data.new_empty((data.numel() // n_cols, n_cols), dtype=out_dtype)


# --------------------------------------------------------------------------- NVFP4 recipe


@custom_op("cutequant::nvfp4_fake_quantize", mutates_args=(), device_types="cuda")
def nvfp4_fake_quantize_op(
    x: Tensor,
    device_splits: Tensor | None,
    host_splits: list[int] | None,
    columnwise: bool,
    rht: bool,
    sign_mask: int,
    stochastic_rounding: bool,
    rng_state: Tensor | None,
    amax: Tensor | None,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(y [M, N] or, columnwise, y_t flat [M * N], amax [G]): ``fake_quant.nvfp4_fake_quantize``."""
    y, amax_out = _fake_quant.fake_quantize_checked(
        x, _splits(device_splits, host_splits), columnwise, rht, sign_mask,
        stochastic_rounding, rng_state, amax, out_dtype,
    )  # fmt: skip
    # the columnwise amax is row 1 of the quantize call's [2, G] buffer: an op's outputs start
    # their storage (as the fake ones do, and as compiled code's alignment checks expect)
    return y, amax_out.clone() if amax_out.storage_offset() else amax_out


@nvfp4_fake_quantize_op.register_fake
def _(
    x, device_splits, host_splits, columnwise, rht, sign_mask, stochastic_rounding, rng_state,
    amax, out_dtype,
):  # fmt: skip
    m, n = x.shape
    y = x.new_empty((m * n,) if columnwise else (m, n), dtype=out_dtype)
    return y, x.new_empty((_num_groups(device_splits, host_splits),), dtype=torch.float32)


def weight_args(weights):
    """(stacked, experts) op arguments of a public call's ``weights``."""
    if isinstance(weights, torch.Tensor):
        return weights, []
    return None, list(weights)


def _weights(stacked, experts):
    """A stacked [E, R, C] tensor, else the list of experts (the schema has no optional list)."""
    return stacked if stacked is not None else list(experts)


@custom_op("cutequant::nvfp4_quantize_weights_2d", mutates_args=(), device_types="cuda")
def nvfp4_quantize_weights_2d_op(
    stacked: Tensor | None,
    experts: list[Tensor],
    rowwise: bool,
    columnwise: bool,
    swizzled_scales: bool,
    amax: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(row_data, row_scales, col_data, col_scales, amax [E]): ``nvfp4_2d.nvfp4_quantize_2d_impl``
    (a disabled direction's two outputs are empty uint8 tensors)."""
    weights = _weights(stacked, experts)
    _nvfp4_2d._check_nvfp4_quantize_2d(weights, rowwise, columnwise, swizzled_scales, amax)
    return _nvfp4_2d.nvfp4_quantize_2d_impl(weights, rowwise, columnwise, swizzled_scales, amax)


@nvfp4_quantize_weights_2d_op.register_fake
def _(stacked, experts, rowwise, columnwise, swizzled_scales, amax):
    first = stacked if stacked is not None else experts[0]
    num_experts = stacked.shape[0] if stacked is not None else len(experts)
    rows, cols = first.shape[-2:]
    shapes = _nvfp4_2d.output_shapes(num_experts, rows, cols)
    out = []
    for side, on in (("row", rowwise), ("col", columnwise)):
        for kind in ("data", "scales"):
            out.append(first.new_empty(shapes[f"{side}_{kind}"] if on else (0,), dtype=torch.uint8))
    return (*out, first.new_empty((num_experts,), dtype=torch.float32))


@custom_op("cutequant::nvfp4_fake_quantize_weights_2d", mutates_args=(), device_types="cuda")
def nvfp4_fake_quantize_weights_2d_op(
    stacked: Tensor | None,
    experts: list[Tensor],
    amax: Tensor | None,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(w [E, R, C], amax [E]): ``nvfp4_2d.nvfp4_fake_quantize_2d_impl``."""
    weights = _weights(stacked, experts)
    _nvfp4_2d._check_nvfp4_quantize_2d(weights, True, True, False, amax)
    return _nvfp4_2d.nvfp4_fake_quantize_2d_impl(weights, amax, out_dtype)


@nvfp4_fake_quantize_weights_2d_op.register_fake
def _(stacked, experts, amax, out_dtype):
    first = stacked if stacked is not None else experts[0]
    num_experts = stacked.shape[0] if stacked is not None else len(experts)
    rows, cols = first.shape[-2:]
    w = first.new_empty((num_experts, rows, cols), dtype=out_dtype)
    return w, first.new_empty((num_experts,), dtype=torch.float32)


OPS = {
    "group_amax": group_amax_op,
    "nvfp4_group_quantize": nvfp4_group_quantize_op,
    "nvfp4_group_dequantize": nvfp4_group_dequantize_op,
    "fp8_group_quantize": fp8_group_quantize_op,
    "fp8_group_dequantize": fp8_group_dequantize_op,
    "nvfp4_fake_quantize": nvfp4_fake_quantize_op,
    "nvfp4_quantize_weights_2d": nvfp4_quantize_weights_2d_op,
    "nvfp4_fake_quantize_weights_2d": nvfp4_fake_quantize_weights_2d_op,
}
