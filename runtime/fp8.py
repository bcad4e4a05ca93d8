"""``cutequant.fp8_group_quantize`` / ``fp8_group_dequantize``: grouped FP8 per-tensor scaling."""

from __future__ import annotations

import functools

import torch

from cutequant import _checks, _launch, groups, packing, replay
from cutequant.amax import IN_DTYPES as _IN_DTYPES
from cutequant.amax import _num_groups, launch_group_amax, new_amax
from cutequant.amax import _spec as _amax_spec
from cutequant.codegen.specs import Fp8QuantizeSpec, Fp8TileCastSpec

_FP8_DTYPES = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_IN_DTYPE_LIST = tuple(_IN_DTYPES)


class Fp8GroupedTensor(groups.GroupedViews):
    """All groups' FP8 tensors as views into one contiguous buffer per kind.

    * ``row_data``: fp8 [M, N] (group g = rows [row_start_g, row_start_g + M_g));
    * ``col_data``: fp8 flat, group g an [N, M_g] block (the transpose Hopper FP8 GEMMs need);
    * ``scale``, ``scale_inv``, ``amax``: fp32 [G];
    * ``offsets``: int64 [2, G + 1] device tensor of element offsets of every group's block in
      (row_data, col_data).
    The buffers are views of one allocation, built on first access (``packing.PackedOutputs``).
    """

    def __init__(self, *, n_cols, fp8_dtype, outputs, amax, layout):
        self.n_cols = n_cols
        self.fp8_dtype = fp8_dtype
        self._outputs = outputs  # packing.PackedOutputs, or a dict of tensors (traced path)
        self._amax_t = amax  # None: the outputs buffer's "amax" part, viewed on use
        self._offsets = None
        self._layout = layout

    row_data = property(lambda self: self._outputs.get("row_data"))
    col_data = property(lambda self: self._outputs.get("col_data"))
    scale = property(lambda self: self._outputs.get("scales")[0])
    scale_inv = property(lambda self: self._outputs.get("scales")[1])
    amax = property(lambda self: self._amax[0])

    @property
    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = groups.element_offsets(self._layout, self.n_cols, self._amax.device)
        return self._offsets

    def group(self, g: int) -> dict:
        _, m_g, row0 = self._group_rows(g)
        n = self.n_cols
        out = {"scale": self.scale[g], "scale_inv": self.scale_inv[g], "amax": self.amax[g]}
        if self.row_data is not None:
            out["row_data"] = self.row_data[row0 : row0 + m_g]
        if self.col_data is not None:
            out["col_data"] = self.col_data[n * row0 : n * (row0 + m_g)].view(n, m_g)
        return out


# Both outputs of 16-bit inputs, current or delayed scaling, run the one-CTA-per-tile cast
# (kernels/templates/fp8_tile_cast.py.j2): faster than the persistent TMA-ring kernel on every
# measured shape of both GPUs (perf/NOTES.md attempt 64: the delayed cast H200 85-91% of copy vs
# 78-84%, H100 91-96% vs 82-87%). fp32 inputs and one-output casts run the TMA-ring kernel (a
# first tile version of those was 14-20% slower, attempt 63), as do all of them with TILE_CAST
# off (how tests and plan sweeps reach that kernel's plans).
TILE_CAST = True


def uses_tile_cast(in_dtype: str, rowwise: bool, columnwise: bool) -> bool:
    """Whether this call's cast runs the one-CTA-per-tile kernel (see TILE_CAST)."""
    return TILE_CAST and in_dtype != "f32" and rowwise and columnwise


@functools.cache
def _tile_spec(arch, in_dtype, fp8_dtype, delayed) -> Fp8TileCastSpec:
    return Fp8TileCastSpec(
        arch=arch,
        in_dtype=in_dtype,
        fp8_dtype=fp8_dtype,
        delayed=delayed,
        tile_cols=Fp8TileCastSpec.default_tile_cols(delayed),
    )


def _tile_grid(spec, layout, m_rows: int, n_cols: int, num_groups: int) -> int:
    """CTAs of the tile cast: one per tile (an upper bound when the splits are on the device:
    each group adds at most one partial tile; the extra CTAs only write scales), and enough to
    write every group's scale (one per thread)."""
    row_tiles = layout.row_tiles if layout.row_tiles >= 0 else m_rows // 64 + num_groups
    threads = 2 * spec.tile_cols
    return max(row_tiles * -(-n_cols // spec.tile_cols), -(-num_groups // threads), 1)


@functools.cache
def _spec(arch, in_dtype, fp8_dtype, delayed, rowwise, columnwise) -> Fp8QuantizeSpec:
    return Fp8QuantizeSpec(
        arch=arch,
        in_dtype=in_dtype,
        fp8_dtype=fp8_dtype,
        delayed=delayed,
        rowwise=rowwise,
        columnwise=columnwise,
    )


def fp8_group_quantize(
    x: torch.Tensor,
    splits,
    *,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    scaling: str = "current",
    scale: torch.Tensor | None = None,
    rowwise: bool = True,
    columnwise: bool = True,
    amax_epsilon: float = 0.0,
    force_pow2_scales: bool = False,
) -> Fp8GroupedTensor:
    """Grouped FP8 per-tensor quantization of ``x[sum(splits), N]`` (bf16, fp16 or fp32).

    ``scaling="current"``: a grouped amax pass, then per group TE's compute_scale_from_amax
    (``amax_epsilon``, ``force_pow2_scales``) and the cast. ``scaling="delayed"``: ``scale``
    (fp32 [G] on x's device) is used as is, and the cast records each group's amax of this
    input (for the amax history). Both write ``scale_inv = 1 / scale``. Outputs: rowwise fp8
    [M_g, N] and/or columnwise (transposed) [N, M_g] per group, RNE with saturation.
    """
    if torch.compiler.is_compiling():
        from cutequant import ops

        return ops.fp8_group_quantize_traced(
            x, splits, fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon,
            force_pow2_scales,
        )  # fmt: skip
    flags = (fp8_dtype, scaling, rowwise, columnwise, amax_epsilon, force_pow2_scales)
    key, hit = replay.find(_RECORDS, x, splits, flags, (scale,))
    if hit is not None:  # replay.py: the checked call's launches again
        record, amax_shape, total, spans, layout = hit
        dev = x.device
        # a host-split call's amax is the outputs buffer's "amax" part (run_fp8_quantize)
        amax = None if amax_shape is None else _launch.output_allocator(amax_shape, _F32, dev)
        outputs = packing.PackedOutputs(_launch.output_allocator(total, _U8, dev), spans)
        device_splits = replay.device_splits(splits)
        record.launch((x, amax, outputs.buf, scale, device_splits))
        tables = spans.get("tables")
        if tables is not None:  # device splits: this call's tables, in its outputs buffer
            layout = groups.device_layout(outputs.buf, *layout, tables[0])
        return Fp8GroupedTensor(
            n_cols=x.shape[1], fp8_dtype=fp8_dtype, outputs=outputs, amax=amax, layout=layout
        )
    m_rows, n_cols, num_groups, splits, scale, arch = check_fp8_quantize(
        x, splits, fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon, force_pow2_scales
    )
    with replay.recording() as rec:
        outputs, amax, layout = run_fp8_quantize(
            x, splits, m_rows, n_cols, num_groups, arch, fp8_dtype, scaling, scale, rowwise,
            columnwise, amax_epsilon, force_pow2_scales, packing.PackedOutputs,
        )  # fmt: skip
    if key is not None and rec.replayable(m_rows):
        device_splits = replay.device_splits(splits)
        bases = [x, amax, outputs.buf, scale, device_splits]
        record = replay.Replay(rec.launches, bases, rec.scratch)
        amax_shape = None if amax is None else tuple(amax.shape)
        # a device-split layout's tables are its call's outputs buffer: the record keeps
        # (G, M) only, not a reference that would hold that buffer as long as the record
        kept = (layout.num_groups, m_rows) if "tables" in outputs.spans else layout
        entry = (record, amax_shape, outputs.buf.numel(), outputs.spans, kept)
        _RECORDS.put(key, entry)
    return Fp8GroupedTensor(
        n_cols=n_cols, fp8_dtype=fp8_dtype, outputs=outputs, amax=amax, layout=layout
    )


_RECORDS = replay.CallMemo()  # fp8_group_quantize's replayable calls (replay.py)
_U8 = torch.uint8
_F32 = torch.float32


def check_fp8_quantize(
    x, splits, fp8_dtype, scaling, scale, rowwise, columnwise, amax_epsilon, force_pow2_scales
):
    """Every argument check of ``fp8_group_quantize`` (host only, before any launch).
    Returns (M, N, G, splits (the validated tuple for host splits), scale (contiguous,
    delayed scaling) or None, arch)."""
    m_rows, n_cols = _checks.check_x(x, dtypes=_IN_DTYPE_LIST)
    if fp8_dtype not in _FP8_DTYPES:
        raise TypeError(
            f"fp8_dtype: must be torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype}"
        )
    if scaling not in ("current", "delayed"):
        raise ValueError(f"scaling: must be 'current' or 'delayed', got {scaling!r}")
    for name, flag in (
        ("rowwise", rowwise),
        ("columnwise", columnwise),
        ("force_pow2_scales", force_pow2_scales),
    ):
        _checks.check_flag(flag, name)
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: nothing to compute")
    if isinstance(amax_epsilon, bool) or not isinstance(amax_epsilon, (int, float)):
        raise TypeError(f"amax_epsilon: expected a float, got {type(amax_epsilon).__name__}")
    if not amax_epsilon >= 0.0:
        raise ValueError(f"amax_epsilon: must be >= 0, got {amax_epsilon}")
    num_groups = _num_groups(splits)
    host = groups.check_splits(splits, m_rows)
    dev = x.device
    if scaling == "delayed":
        if scale is None:
            raise ValueError("scale: required with scaling='delayed' (fp32 [G] on x's device)")
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"scale: expected a tensor, got {type(scale).__name__}")
        if scale.dtype != torch.float32:
            raise TypeError(f"scale: must be float32, got {scale.dtype}")
        if scale.device != dev:
            raise ValueError(f"scale: must be on x's device {dev}, got {scale.device}")
        if tuple(scale.shape) != (num_groups,):
            raise ValueError(f"scale: expected shape ({num_groups},), got {tuple(scale.shape)}")
        scale = scale.contiguous()
    elif scale is not None:
        raise ValueError("scale: only used with scaling='delayed'")
    splits = splits if host is None else host
    arch = _checks.check_device(x)
    delayed = scaling == "delayed"
    _check_arch(arch, _IN_DTYPES[x.dtype], _FP8_DTYPES[fp8_dtype], delayed, rowwise, columnwise)
    return m_rows, n_cols, num_groups, splits, scale, arch


def _check_arch(arch, in_dtype, fp8_dtype, delayed, rowwise, columnwise) -> None:
    """UnsupportedArchError (before any allocation or launch) when a kernel this call needs
    does not exist on ``arch``: the cast, and with current scaling the amax pass (sm_120a has
    neither persistent kernel: codegen/specs.py)."""
    if uses_tile_cast(in_dtype, rowwise, columnwise):
        _tile_spec(arch, in_dtype, fp8_dtype, delayed)
    else:
        _spec(arch, in_dtype, fp8_dtype, delayed, rowwise, columnwise)
    if not delayed:
        _amax_spec(arch, False, in_dtype)


def output_parts(m_rows, n_cols, num_groups, fp8_dtype, rowwise: bool, columnwise: bool) -> dict:
    """name -> (shape, dtype) of every output buffer (None: not computed); also used by the
    torch.library fake implementation."""
    return {
        "row_data": ((m_rows, n_cols), fp8_dtype) if rowwise else None,
        "col_data": ((m_rows * n_cols,), fp8_dtype) if columnwise else None,
        "scales": ((2, num_groups), torch.float32),  # scale, scale_inv
    }


def _parts(m_rows, n_cols, num_groups, fp8_dtype, rowwise, columnwise, amax_rows, packed, carve):
    """``output_parts`` of a call (cached), with the computed amax (``packed``) and a
    device-split call's snapshot and tables (``carve``) as parts of the one allocation."""
    key = ("fp8", m_rows, n_cols, num_groups, fp8_dtype, rowwise, columnwise, amax_rows, packed,
           carve)  # fmt: skip
    return packing.carved_parts(
        key,
        lambda: output_parts(m_rows, n_cols, num_groups, fp8_dtype, rowwise, columnwise),
        num_groups,
        amax_rows if packed else 0,
        carve,
    )


def run_fp8_quantize(
    x, splits, m_rows, n_cols, num_groups, arch, fp8_dtype, scaling, scale, rowwise, columnwise,
    amax_epsilon, force_pow2_scales, output_kind,
):  # fmt: skip
    """Launch the amax pass (current scaling) and the cast on validated arguments.
    ``output_kind``: ``packing.PackedOutputs`` or ``packing.SeparateOutputs``. Returns
    (outputs, amax [1 or 2, G] or None when it is the outputs' "amax" part, layout)."""
    dev = x.device
    delayed = scaling == "delayed"
    # written by the amax pass (current scaling; rows = row and, unused here, col amax) or by the
    # cast kernel itself (delayed); both zero it at their head (kernels/launch_zeroing.py)
    amax_rows = 1 if delayed else 2
    # device splits: the snapshot and tables are parts of the outputs allocation too
    carve = packing.carves_device_tables(output_kind, m_rows, splits)
    packed = carve or packing.carves_amax(output_kind, m_rows, splits)
    amax = None if packed else new_amax(amax_rows, num_groups, m_rows, dev)
    in_dtype = _IN_DTYPES[x.dtype]
    tile = uses_tile_cast(in_dtype, rowwise, columnwise)
    parts = _parts(m_rows, n_cols, num_groups, fp8_dtype, rowwise, columnwise, amax_rows,
                   packed, carve)  # fmt: skip
    if carve:  # the outputs' sizes do not depend on the split values: allocate first
        outputs = output_kind.allocate(parts, dev)
        layout = groups.prepare_groups(
            splits, m_rows, dev, poison=(outputs.addr("amax", 0), amax_rows * num_groups),
            tile_records=tile, validated=True, into=(outputs.buf, outputs.spans["tables"][0]),
            defer_tables=not delayed,
        )  # fmt: skip
    else:
        layout = groups.prepare_groups(
            splits, m_rows, dev, poison=amax, tile_records=tile, validated=True,
            defer_tables=not delayed,
        )  # fmt: skip
        outputs = output_kind.allocate(parts, dev)
    amax_addr = outputs.addr("amax", 0) if packed else _launch.ptr(amax, 4)
    stream = _launch.raw_stream(dev)
    if tile:
        spec = _tile_spec(arch, in_dtype, _FP8_DTYPES[fp8_dtype], delayed)
    else:
        spec = _spec(arch, in_dtype, _FP8_DTYPES[fp8_dtype], delayed, rowwise, columnwise)
    if not delayed:
        # A cast on contiguous tile ranges with a transposed output (TilePlan.chunk = 0): the
        # amax pass walks like it and leaves the cast's first tiles in L2. The default cast
        # walks in round-robin chunks (kernels/schedule.cta_runs), which the hand-off cannot
        # follow: the amax pass then takes its own (faster) walk.
        band = 1 if tile else spec.walk_band()
        handoff = not tile and spec.round_robin_chunk() == 0 and band > 1
        launch_group_amax(
            x,
            layout,
            amax_addr,
            rht=False,
            sign_mask=0,
            arch=arch,
            in_dtype=in_dtype,
            stream=stream,
            cast_walk_band=band if handoff else None,
        )
    scales_addr = outputs.addr("scales", 0)
    dummy_t = groups.dummy_buffer(dev)
    dummy = dummy_t.data_ptr()
    if m_rows > 0 or num_groups > 0:
        if tile:
            num_ctas = _tile_grid(spec, layout, m_rows, n_cols, num_groups)
            # the group-fold words (delayed: kernels/group_fold.py); current scaling uses none
            sync = groups.workspace(dev, num_groups, stream).fold if delayed else dummy_t
        else:
            num_ctas = _launch.grid_size(spec, dev)
            sync = groups.launch_counter(dev, stream, num_ctas)  # kernels/launch_zeroing.py
        _launch.run_grouped(
            spec,
            _launch.ptr(x) if m_rows > 0 else dummy,
            max(m_rows, 1),
            n_cols,
            layout,
            amax_addr,
            _launch.ptr(scale, 4) if delayed else amax_addr,
            scales_addr,
            scales_addr + 4 * num_groups,
            outputs.addr("row_data", dummy),
            outputs.addr("col_data", dummy),
            _launch.ptr(sync, 8),
            float(amax_epsilon),
            int(force_pow2_scales),
            layout.early_level(after_amax_pass=not delayed and m_rows > 0),
            num_ctas=num_ctas,
            stream=stream,
            tables=layout.tile_tables,  # None: the layout's own (device splits, TMA ring)
        )
    return outputs, amax, layout
