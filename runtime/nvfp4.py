"""``cutequant.nvfp4_group_quantize`` / ``nvfp4_group_dequantize`` and the grouped result."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from cutequant import _checks, _launch, groups
from cutequant.amax import DEFAULT_SIGN_MASK, _num_groups, launch_group_amax, new_amax
from cutequant.codegen.specs import Nvfp4QuantizeSpec


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


@dataclass
class Nvfp4GroupedTensor(groups.GroupedViews):
    """All groups' NVFP4 tensors as views into one contiguous buffer per kind (TE layouts).

    * ``row_data``: uint8 [M, N/2], group g = rows [row_start_g, row_start_g + M_g) (even element in
      the low nibble); ``row_scales``: uint8 [sum_g roundup(M_g, 128), roundup(N/16, 4)], group g
      a [roundup(M_g, 128), roundup(N/16, 4)] block (cuBLASLt 128x4 byte order when swizzled);
    * ``col_data``: uint8 flat, group g a [N, M_g/2] block = quantized RHT(x_g^T) (or x_g^T);
      ``col_scales``: uint8 flat, group g a [roundup(N, 128), roundup(M_g/16, 4)] block;
    * ``amax_row``, ``amax_col``: fp32 [G];
    * ``offsets``: int64 [4, G + 1] device tensor of byte offsets of every group's block in
      (row_data, row_scales, col_data, col_scales): what a grouped GEMM consumes;
    * ``rng_state``: with stochastic rounding, the int64 [2] (seed, offset) device tensor the
      kernel used (``cutequant.reference`` reproduces the random bits from it), else None.

    Padding bytes of the scale blocks are zero in both layouts. Per-group views (``group(g)``)
    need the split sizes on the host: with device splits the first access synchronizes once.
    """

    n_cols: int
    row_data: torch.Tensor | None
    row_scales: torch.Tensor | None
    col_data: torch.Tensor | None
    col_scales: torch.Tensor | None
    amax_row: torch.Tensor
    amax_col: torch.Tensor
    offsets: torch.Tensor
    swizzled_scales: bool
    rht: bool
    sign_mask: int
    fast_math: bool
    rng_state: torch.Tensor | None
    _layout: groups.GroupLayout

    def group(self, g: int) -> dict:
        """TE-shaped views of group ``g``: row_data, row_scales, col_data, col_scales, amax."""
        splits, m_g, row0 = self._group_rows(g)
        n = self.n_cols
        out = {"amax_row": self.amax_row[g], "amax_col": self.amax_col[g]}
        if self.row_data is not None:
            cp = _round_up(n // 16, 4)
            rs0 = sum(_round_up(s, 128) for s in splits[:g])
            out["row_data"] = self.row_data[row0 : row0 + m_g]
            out["row_scales"] = self.row_scales[rs0 : rs0 + _round_up(m_g, 128)]
            assert out["row_scales"].shape[1] == cp
        if self.col_data is not None:
            np_ = _round_up(n, 128)
            cg = _round_up(m_g // 16, 4)
            cs0 = sum(_round_up(s // 16, 4) for s in splits[:g])
            out["col_data"] = self.col_data[n * row0 // 2 : n * (row0 + m_g) // 2].view(n, m_g // 2)
            out["col_scales"] = self.col_scales[np_ * cs0 : np_ * (cs0 + cg)].view(np_, cg)
        return out


# Round-robin tile chunks (kernels/schedule.py, ``cta_runs``) for the memory-bound variants
# (compact scales, a rowwise output, no fast-math, no stochastic rounding) on GPUs whose DRAM
# delivers fewer than 16 bytes per SM clock (``_launch.memory_rich`` is False): there the grid
# waits on memory, and sweeping one window of x and of the outputs pays. H100 (12.8), chunks of 8
# vs contiguous ranges (perf/NOTES.md attempt 59): compact 64 groups 251 -> 209 us, 16 uneven
# groups of 7168 columns 451 -> 375 us, 64 groups of 1040 rows 266 -> 223 us, the whole call 64
# groups 363 -> 321 us, dense -2..-5%, equal 2048-8192-row groups 5-7% slower; rowwise only 0-6%
# faster. Not chunked, measured worse or mixed there: swizzled scales (-12% .. +16%), fast-math
# (-10% dense, -9% at 256 groups), stochastic rounding (-4 .. -11%), columnwise only (-8.5% ..
# +12%). The H200 (18.4) is instruction bound and chunks cost it 5-15% (attempt 55): contiguous,
# without the run loop.
def device_chunk(
    device: torch.device, rowwise: bool, swizzled: bool, fast_math: bool, stochastic: bool
) -> int:
    """The tile plan's ``chunk`` for this variant on this GPU (-1: the spec's default,
    contiguous ranges)."""
    if swizzled or fast_math or stochastic or not rowwise:
        return -1
    if _launch.memory_rich(device) is not False:  # H200 class, or not known
        return -1
    return Nvfp4QuantizeSpec.MEMORY_BOUND_CHUNK


@functools.cache
def _spec(
    arch, rowwise, columnwise, rht, swizzled, fast_math, stochastic, chunk: int = -1
) -> Nvfp4QuantizeSpec:
    spec = Nvfp4QuantizeSpec(
        arch=arch,
        rowwise=rowwise,
        columnwise=columnwise,
        rht=rht,
        swizzled=swizzled,
        fast_math=fast_math,
        stochastic=stochastic,
    )
    if chunk == -1:
        return spec
    return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, chunk=chunk))


def _check_estimation_scale(scale, amax, columnwise: bool) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"amax_estimation_scale: expected a float, got {type(scale).__name__}")
    if not (0.0 < scale < float("inf")):
        raise ValueError(f"amax_estimation_scale: must be positive and finite, got {scale}")
    if amax is not None:
        raise ValueError("amax_estimation_scale: not with a given amax (it replaces the amax pass)")
    if not columnwise:
        raise ValueError("amax_estimation_scale: estimates the columnwise amax; columnwise=False")


def _check_rng_state(rng_state, stochastic_rounding: bool, device: torch.device):
    if rng_state is None:
        return None
    if not stochastic_rounding:
        raise ValueError("rng_state: only used with stochastic_rounding=True")
    if not isinstance(rng_state, torch.Tensor):
        raise TypeError(f"rng_state: expected a tensor, got {type(rng_state).__name__}")
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
        raise ValueError(
            f"rng_state: must be int64 of shape (2,) = (seed, offset), got {rng_state.dtype} "
            f"{tuple(rng_state.shape)}"
        )
    if rng_state.device != device:
        raise ValueError(f"rng_state: on {rng_state.device}, but x is on {device}")
    return rng_state.contiguous()


def _check_amax(amax, num_groups: int, device: torch.device) -> torch.Tensor:
    if isinstance(amax, (tuple, list)):
        if len(amax) != 2:
            raise ValueError("amax: expected (amax_row, amax_col) or a [2, G] tensor")
        for name, t in zip(("amax[0]", "amax[1]"), amax, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        amax = torch.stack([amax[0].reshape(-1), amax[1].reshape(-1)])
    if not isinstance(amax, torch.Tensor):
        raise TypeError(
            f"amax: expected a [2, G] tensor or a pair of [G] tensors, got {type(amax).__name__}"
        )
    if amax.dtype != torch.float32:
        raise TypeError(f"amax: must be float32, got {amax.dtype}")
    if tuple(amax.shape) != (2, num_groups):
        raise ValueError(f"amax: expected shape (2, {num_groups}), got {tuple(amax.shape)}")
    if amax.device != device:
        raise ValueError(f"amax: on {amax.device}, but x is on {device}")
    return amax.contiguous()


def nvfp4_group_quantize(
    x: torch.Tensor,
    splits,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    rht: bool = True,
    sign_mask: int = DEFAULT_SIGN_MASK,
    swizzled_scales: bool = False,
    fast_math: bool = False,
    amax=None,
    stochastic_rounding: bool = False,
    rng_state: torch.Tensor | None = None,
    amax_estimation_scale: float | None = None,
) -> Nvfp4GroupedTensor:
    """Grouped NVFP4 quantization of bf16 ``x[sum(splits), N]`` (TE numerics, bit-exact).

    rowwise: 1x16-block NVFP4 of each group's rows. columnwise: NVFP4 of RHT(x_g^T) (16x16
    random Hadamard transform along tokens, ``sign_mask`` sign flips) or of x_g^T when ``rht``
    is False. ``amax``: per-group (row, col) amax to use; computed with ``group_amax`` when None.
    ``fast_math``: TE's fast-math (rcp.approx reciprocal, no bf16 rounding of the RHT output).
    ``stochastic_rounding``: the e2m1 values of both directions are rounded stochastically (TE's
    SR rule, docs/numerics.md §1.4; the scales are unchanged) with Philox4x32-10 bits drawn from
    ``rng_state`` (int64 [2] = (seed, offset) on x's device); when None, a fresh state is drawn
    with ``torch.randint`` on x's device (CUDA-graph safe). The bits are a function of the
    state and each block's position only, so a result is reproducible from its ``rng_state``.
    ``amax_estimation_scale``: post-RHT amax estimation (TE PR #2521, docs/numerics.md §3.4): the
    amax pass skips the RHT and sets ``amax_col = amax_row * scale`` (TE's defaults: 2.0 for
    activations, 1.0 for gradients); not with a given ``amax``.
    """
    m_rows, n_cols = _checks.check_x(x)
    for name, flag in (
        ("rowwise", rowwise),
        ("columnwise", columnwise),
        ("rht", rht),
        ("swizzled_scales", swizzled_scales),
        ("fast_math", fast_math),
        ("stochastic_rounding", stochastic_rounding),
    ):
        _checks.check_flag(flag, name)
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: nothing to compute")
    _checks.check_sign_mask(sign_mask)
    num_groups = _num_groups(splits)
    groups.check_splits(splits, m_rows)
    if amax is not None:
        amax = _check_amax(amax, num_groups, x.device)
    rng_state = _check_rng_state(rng_state, stochastic_rounding, x.device)
    if amax_estimation_scale is not None:
        _check_estimation_scale(amax_estimation_scale, amax, columnwise)
    arch = _checks.check_device(x)
    dev = x.device
    if stochastic_rounding and rng_state is None:
        rng_state = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=dev)
    if amax is not None:
        poison = None
    else:
        amax = new_amax(2, num_groups, m_rows, dev)  # the amax pass writes it
        poison = amax
    layout = groups.prepare_groups(splits, m_rows, dev, poison=poison)

    cp = _round_up(n_cols // 16, 4)
    np_ = _round_up(n_cols, 128)
    if layout.host_totals is not None:  # exact sizes, cached with the host tables
        rs_rows, cs_cols = layout.host_totals[2], layout.host_totals[3]
    else:  # upper bounds: the buffers must not depend on device values
        rs_rows = m_rows + 127 * num_groups
        cs_cols = m_rows // 16 + 3 * num_groups
    u8 = torch.uint8
    empty = _launch.output_allocator
    row_data = empty((m_rows, n_cols // 2), u8, dev) if rowwise else None
    row_scales = empty((rs_rows, cp), u8, dev) if rowwise else None
    col_data = empty((m_rows * n_cols // 2,), u8, dev) if columnwise else None
    col_scales = empty((np_ * cs_cols,), u8, dev) if columnwise else None

    stream = torch.cuda.current_stream(dev)
    if poison is not None:
        estimate = amax_estimation_scale is not None
        launch_group_amax(
            x,
            layout,
            amax,
            rht=rht and columnwise and not estimate,
            sign_mask=sign_mask,
            arch=arch,
            col_scale=amax_estimation_scale if estimate else 1.0,
            stream=stream,
        )
    if m_rows > 0:
        spec = _spec(
            arch,
            rowwise,
            columnwise,
            rht and columnwise,
            swizzled_scales,
            fast_math,
            stochastic_rounding,
            device_chunk(dev, rowwise, swizzled_scales, fast_math, stochastic_rounding),
        )
        dummy = groups.dummy_buffer(dev)  # pointer for disabled outputs (never written)
        _launch.run_grouped(
            spec,
            _launch.ptr(x),
            m_rows,
            n_cols,
            layout,
            _launch.ptr(amax, 4),
            _launch.ptr(row_data if rowwise else dummy, 16),
            _launch.ptr(row_scales if rowwise else dummy, 16),
            _launch.ptr(col_data if columnwise else dummy, 16),
            _launch.ptr(col_scales if columnwise else dummy, 16),
            _launch.ptr(
                rng_state.view(torch.int32) if stochastic_rounding else dummy.view(torch.int32), 8
            ),  # the dummy is never read
            sign_mask,
            layout.early_level(after_amax_pass=poison is not None),  # poison: amax pass ran
            num_ctas=_launch.grid_size(spec, dev),
            stream=stream,
        )
    return Nvfp4GroupedTensor(
        n_cols=n_cols,
        row_data=row_data,
        row_scales=row_scales,
        col_data=col_data,
        col_scales=col_scales,
        amax_row=amax[0],
        amax_col=amax[1],
        offsets=groups.byte_offsets(layout, n_cols),
        swizzled_scales=swizzled_scales,
        rht=rht and columnwise,
        sign_mask=sign_mask,
        fast_math=fast_math,
        rng_state=rng_state,
        _layout=layout,
    )


def nvfp4_group_dequantize(
    result: Nvfp4GroupedTensor,
    *,
    columnwise: bool = False,
    undo_rht: bool = True,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """High-precision [M, N] tensor back from ``result`` (on the GPU, in torch).

    Rowwise: ``e2m1 * e4m3 scale * S_dec`` per 16-element block (compact or swizzled scales).
    ``columnwise=True``: from the columnwise data; with an RHT ``undo_rht`` applies the inverse
    transform (the 16x16 RHT is orthogonal), giving x back instead of RHT(x^T). Needs the split
    sizes on the host (one synchronization with device splits).
    """
    from cutequant import reference

    if not isinstance(result, Nvfp4GroupedTensor):
        raise TypeError(f"result: expected an Nvfp4GroupedTensor, got {type(result).__name__}")
    _checks.check_flag(columnwise, "columnwise")
    _checks.check_flag(undo_rht, "undo_rht")
    side = "col" if columnwise else "row"
    if getattr(result, f"{side}_data") is None:
        kind = "columnwise" if columnwise else "rowwise"
        raise ValueError(f"result: has no {kind} data (it was quantized without it)")
    n = result.n_cols
    splits = result.splits
    dev = getattr(result, f"{side}_data").device
    out = torch.empty(sum(splits), n, dtype=out_dtype, device=dev)
    row0 = 0
    for g, m_g in enumerate(splits):
        if m_g:
            parts = result.group(g)
            scales = parts[f"{side}_scales"]
            y = reference.nvfp4_dequantize(
                parts[f"{side}_data"],
                scales.reshape(-1) if result.swizzled_scales else scales,
                parts[f"amax_{side}"],
                shape=(n, m_g) if columnwise else (m_g, n),
                swizzled=result.swizzled_scales,
            )
            if columnwise:
                # y is RHT(x_g^T) (or x_g^T): back to [M_g, N]
                y = (
                    reference.inverse_rht_along_tokens(y, result.sign_mask)
                    if (result.rht and undo_rht)
                    else y.t()
                )
            out[row0 : row0 + m_g] = y.to(out_dtype)
        row0 += m_g
    return out
