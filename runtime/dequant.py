"""Grouped dequantize of NVFP4 and FP8 data in one launch, with no host synchronization.

Public: ``nvfp4_group_dequantize(result, ...)`` / ``fp8_group_dequantize(result, ...)`` (the
grouped results of ``cutequant.nvfp4_group_quantize`` / ``fp8_group_quantize``), built on the
op-level functions ``nvfp4_group_dequantize_impl`` / ``fp8_group_dequantize_impl`` (plain
tensors and ints, outputs as a tuple: what ``torch.library`` registers) and their argument
checks ``_check_nvfp4_dequantize`` / ``_check_fp8_dequantize``.

Kernels: ``kernels/templates/dequantize.py.j2``, one CTA per 64-token x 128-column tile.
Numerics (bit-exact with ``cutequant.recipe_reference``): NVFP4 ``f32(f32(e2m1 * sf) * S_dec)``,
FP8 ``f32(f32(fp8) * scale_inv)``, then RNE to the output dtype; the inverse RHT in the fixed
fp32 order of ``recipe_reference.inverse_rht_exact``.

Output shapes depend only on input shapes: [M, N] with M = rows of the data (NVFP4: data bytes
* 2 / N, FP8: data elements / N), for host and device splits alike. With device splits the
scale buffers must have the upper-bound sizes ``nvfp4_group_quantize`` allocates for them
(rowwise (M + 127 G) x roundup(N/16, 4), columnwise roundup(N, 128) x (M/16 + 3 G) bytes), so
that no split values can make the kernel read past them; bad device splits write nothing.
"""

from __future__ import annotations

import functools

import torch

from cutequant import _checks, _launch, groups, packing, replay
from cutequant.amax import _num_groups
from cutequant.codegen.specs import (
    DEQUANT_COL_REGS,
    DEQUANT_DEFAULT_CACHE_HINTS,
    DEQUANT_TAIL_SUBTILES,
    DequantizeSpec,
    dequant_col_regs_default,
    dequant_columnwise_defaults,
)

OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
FP8_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
# the columnwise kernels' CTA order (a kernel argument, no compile variant): False, column tiles
# fastest (row-major tiles, the rowwise kernels' order); True, a column strip's row tiles one
# after the other, so that consecutive CTAs read consecutive pieces of each token run of the
# [N, M_g] data (perf/NOTES.md, issue 20 attempt 5; perf/probes/dequant_walk.py measures both)
COLUMNWISE_ROW_TILES_FIRST = False
# tokens per tile of the columnwise kernels transposed back (a compile variant,
# DequantizeSpec.col_tokens, read when the spec is built): 64, the 64 x 128 tiles; 128 / 256,
# tiles of 2 / 4 consecutive 64-row tiles x 64 columns that read 64 / 128 contiguous bytes of
# each NVFP4 column row (FP8: 128 / 256) per tile: the read side's DRAM locality limits these
# kernels (perf/NOTES.md, "longer runs per column row"). H200, eighth session run 8
# (perf/probes/dequant_walk.py, % of copy, 64 / 128 / 256, dense .. 256 groups): NVFP4
# 62.2-78.7 / 64.2-80.9 / 65.5-82.0, with the inverse RHT 59.4-74.8 / 66.9-79.9 / 62.7-77.9,
# FP8 66.9-74.5 / 66.7-73.1 / 72.7-78.8. None (each of the three flags): the default of the
# specs `cutequant precompile` builds (specs.dequant_columnwise_defaults: 256 tokens, ring 8,
# scale words for NVFP4 compact scales); a value: that for every kind (the A/B probe, the GPU
# tests).
COLUMNWISE_TOKENS = None
# shared-memory staging of the 256-token tiles (a compile variant, DequantizeSpec.col_ring, read
# when the spec is built; other lengths ignore it): 0, the whole 32 KB tile (6 CTAs per SM);
# 8, a ring of two 64-token sub-tile buffers (16 KB) with the registers bounded for 8 CTAs per
# SM (perf/NOTES.md, "sub-tile ring"; perf/probes/dequant_walk.py --ab ring).
COLUMNWISE_RING = None
# NVFP4 compact scales of the 256-token tiles (a compile variant, DequantizeSpec.col_scale_words):
# True, one scale word per lane and column group plus a byte transpose over the quad where the
# tile lies in one group, instead of one LDG.U8 per 16 tokens (perf/NOTES.md, "scale words";
# perf/probes/dequant_walk.py --ab scales)
COLUMNWISE_SCALE_WORDS = None
# Cache hints of every dequantize kernel (a compile variant, DequantizeSpec.cache_hints, read when
# the spec is built; perf/NOTES.md, "short calls"): "" none; "ld", data and scale loads
# ld.global.nc.L1::no_allocate.L2::256B; "st", output stores st.global.cs; "ldst", both (the
# default: H200 runs 55-56, 1-5 points of copy more on every NVFP4 / FP8 case, the inverse RHT
# within +-1; codegen.specs.DEQUANT_DEFAULT_CACHE_HINTS) (perf/probes/dequant_walk.py --ab hints)
CACHE_HINTS = DEQUANT_DEFAULT_CACHE_HINTS
# Short CTAs at the ends of the 256-token ring kernels' walk (a compile variant,
# DequantizeSpec.col_tail, plus three kernel arguments; perf/NOTES.md, "short calls"): 0, off
# (the default); 1 or 2, the 64-row sub-tiles of each short CTA. The walk's last row tiles,
# about COLUMNWISE_TAIL_WAVES of a wave of full CTAs' work (``tail_plan``), go to short CTAs, so
# that the slots that free up while the last full CTAs run fill with short CTAs; with
# COLUMNWISE_HEAD_WAVES > 0 also the first row tiles (that many waves of short CTAs: the first
# wave's read burst is 1/4 or 1/2 as large and its CTAs end at different times)
# (perf/probes/dequant_walk.py --ab tail)
COLUMNWISE_TAIL = 0
COLUMNWISE_TAIL_WAVES = 0.5
COLUMNWISE_HEAD_WAVES = 0.0
# The FP8 columnwise 256-token ring tiles transposed in registers (a compile variant,
# DequantizeSpec.col_regs, read when the spec is built; 16-bit outputs only, other kernels
# ignore it): 0, shared-memory staging through the sub-tile ring (4 barriers per tile); 128 or
# 256, the threads per CTA of the register transpose (a lane decodes 8 adjacent columns x 16
# or 8 tokens and stores each token's 8 columns; no shared memory, no barrier); None, the
# default of the specs precompile builds (specs.dequant_col_regs_default: 128, 5-8 points of
# copy more than the ring on the H200) (perf/NOTES.md, "FP8 transposed dequantize in
# registers"; perf/probes/dequant_walk.py --ab regs)
COLUMNWISE_REGS = None
# the plan's resident CTAs (None: SMs x the kernel's CTAs per SM); the GPU tests set a few, so
# that their small cases get tail CTAs too
COLUMNWISE_TAIL_SLOTS = None


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _spec(arch, fmt, columnwise, undo_rht, swizzled, out_dtype, transposed_out=False):
    tokens, ring, words, tail, regs = 64, 0, False, False, 0
    if columnwise and not transposed_out:
        tokens, ring, words = dequant_columnwise_defaults(fmt, swizzled)
        tokens = tokens if COLUMNWISE_TOKENS is None else COLUMNWISE_TOKENS
        ring = ring if COLUMNWISE_RING is None else COLUMNWISE_RING
        words = words if COLUMNWISE_SCALE_WORDS is None else COLUMNWISE_SCALE_WORDS
        ring = ring if tokens == 256 else 0
        words = words and tokens == 256 and fmt == "nvfp4" and not swizzled
        if COLUMNWISE_TAIL not in (0, *DEQUANT_TAIL_SUBTILES):
            raise ValueError(f"COLUMNWISE_TAIL: 0 or one of {DEQUANT_TAIL_SUBTILES}")
        tail = bool(COLUMNWISE_TAIL) and ring != 0
        if COLUMNWISE_REGS not in (None, *DEQUANT_COL_REGS):
            raise ValueError(f"COLUMNWISE_REGS: None or one of {DEQUANT_COL_REGS}")
        regs = dequant_col_regs_default(fmt, out_dtype)
        regs = regs if COLUMNWISE_REGS is None or not regs else COLUMNWISE_REGS
        regs = regs if ring != 0 else 0
    flags = (tokens, ring, words, CACHE_HINTS, tail, regs)
    return _cached_spec(arch, fmt, columnwise, undo_rht, swizzled, out_dtype, transposed_out, flags)


@functools.cache
def _cached_spec(arch, fmt, columnwise, undo_rht, swizzled, out_dtype, transposed_out, flags):
    tokens, ring, words, hints, tail, regs = flags
    return DequantizeSpec(
        arch=arch,
        fmt=fmt,
        columnwise=columnwise,
        undo_rht=undo_rht,
        swizzled=swizzled,
        out_dtype=out_dtype,
        transposed_out=transposed_out,
        col_tokens=tokens,
        col_ring=ring,
        col_scale_words=words,
        cache_hints=hints,
        col_tail=tail,
        col_regs=regs,
    )


def tail_plan(
    row_tiles: int, col_tiles: int, slots: int, sub: int, waves: float = 0.5, head: float = 0.0
):
    """(head, tail_from, row CTAs) of a 256-token ring kernel with short CTAs
    (DequantizeSpec.col_tail) over ``row_tiles`` 64-row tiles: row CTAs below ``head`` take
    ``sub`` tiles each, then up to ``tail_from`` 4 each, then ``sub`` each. ``slots``: CTAs
    resident at once (SMs x CTAs per SM). The tail gets the last rows of the grid (dispatched
    last: x is the column tile) holding about ``waves`` of a wave of full CTAs' work, whole rows
    of the grid: while the last full CTAs run, the slots that free up before them take short
    CTAs instead of idling (a full CTA runs up to ~4x as long, and slots free up evenly over its
    lifetime: half a wave of work fills them). The head: the first rows, about ``head`` waves
    of short CTAs. A grid of full CTAs that is resident at once is left as it is."""
    full = -(-row_tiles // 4)
    if full * col_tiles <= slots or sub >= 4:
        return 0, full, full
    tail = min(row_tiles, -(-int(4 * waves * slots) // col_tiles))
    head_tiles = min(-(-int(head * slots) // col_tiles) * sub, (row_tiles - tail) // sub * sub)
    tail += (row_tiles - tail - head_tiles) % 4  # the full CTAs take whole runs of 4
    tail_from = head_tiles // sub + (row_tiles - tail - head_tiles) // 4
    return head_tiles // sub, tail_from, tail_from + -(-tail // sub)


# ------------------------------------------------------------------------------ checks


def _check_tensor(t, name: str, dtypes: tuple) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: dtype must be one of ({allowed}), got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    return t


def _check_n_cols(n_cols) -> int:
    if isinstance(n_cols, bool) or not isinstance(n_cols, int):
        raise TypeError(f"n_cols: expected an int, got {type(n_cols).__name__}")
    if n_cols <= 0 or n_cols % 16:
        raise ValueError(f"n_cols: must be a positive multiple of 16, got {n_cols}")
    return n_cols


def _check_out_dtype(out_dtype) -> str:
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"out_dtype: must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}"
        )
    return OUT_DTYPES[out_dtype]


def _check_devices(tensors: dict, splits) -> None:
    """Every tensor on the first one's CUDA device (16-byte-aligned where the kernel loads
    wide words); device splits there too."""
    first_name, first = next(iter(tensors.items()))
    _checks.check_device(first, first_name)
    for name, t in tensors.items():
        if t.device != first.device:
            raise ValueError(f"{name}: on {t.device}, but {first_name} is on {first.device}")
        if t.data_ptr() % (4 if t.dtype == torch.float32 else 16):
            raise ValueError(f"{name}: data pointer is not aligned for the kernel's loads")
    if isinstance(splits, torch.Tensor) and splits.is_cuda and splits.device != first.device:
        raise ValueError(f"splits: on {splits.device}, but {first_name} is on {first.device}")


def _check_nvfp4_dequantize(
    data,
    scales,
    amax,
    splits,
    n_cols,
    columnwise,
    swizzled,
    undo_rht,
    sign_mask,
    out_dtype,
    transposed_out=False,
):
    """Validate the NVFP4 dequantize arguments (before any launch); returns (M, host splits
    or None). Raises TypeError / ValueError naming the argument and the rule."""
    for name, flag in (
        ("columnwise", columnwise),
        ("swizzled", swizzled),
        ("undo_rht", undo_rht),
        ("transposed_out", transposed_out),
    ):
        _checks.check_flag(flag, name)
    if undo_rht and not columnwise:
        raise ValueError("undo_rht: the RHT is on the columnwise data only (columnwise=False)")
    if transposed_out and (not columnwise or undo_rht or swizzled):
        raise ValueError(
            "transposed_out: columnwise data with compact scales and without undo_rht only"
        )
    if transposed_out and out_dtype == torch.float32:
        raise TypeError("out_dtype: transposed_out writes bfloat16 or float16")
    _checks.check_sign_mask(sign_mask)
    _check_out_dtype(out_dtype)
    n = _check_n_cols(n_cols)
    _check_tensor(data, "data", (torch.uint8,))
    _check_tensor(scales, "scales", (torch.uint8,))
    _check_tensor(amax, "amax", (torch.float32,))
    if columnwise:
        if data.dim() != 1 or data.numel() % (n // 2):
            raise ValueError(
                f"data: columnwise data must be flat with a multiple of N/2 = {n // 2} bytes, "
                f"got shape {tuple(data.shape)}"
            )
        m_rows = data.numel() // (n // 2)
    else:
        if data.dim() != 2 or data.shape[1] != n // 2:
            raise ValueError(
                f"data: rowwise data must be [M, N/2 = {n // 2}], got shape {tuple(data.shape)}"
            )
        m_rows = data.shape[0]
    num_groups, host = _groups_of(splits, m_rows)
    if tuple(amax.shape) != (num_groups,):
        raise ValueError(f"amax: expected shape ({num_groups},), got {tuple(amax.shape)}")
    totals = groups.host_totals(host) if host is not None else None
    if columnwise:
        extent = totals[3] if totals else m_rows // 16 + 3 * num_groups
        need = _round_up(n, 128) * extent
    else:
        extent = totals[2] if totals else m_rows + 127 * num_groups
        need = _round_up(n // 16, 4) * extent
    if scales.numel() < need:
        kind = "exact" if host is not None else "device-split upper-bound"
        raise ValueError(f"scales: {scales.numel()} bytes, the {kind} layout needs {need}")
    _check_devices({"data": data, "scales": scales, "amax": amax}, splits)
    return m_rows, host


def _check_fp8_dequantize(data, scale_inv, splits, n_cols, columnwise, out_dtype):
    """Validate the FP8 dequantize arguments (before any launch); returns (M, host splits or
    None)."""
    _checks.check_flag(columnwise, "columnwise")
    _check_out_dtype(out_dtype)
    n = _check_n_cols(n_cols)
    _check_tensor(data, "data", tuple(FP8_FORMATS))
    _check_tensor(scale_inv, "scale_inv", (torch.float32,))
    if columnwise:
        if data.dim() != 1 or data.numel() % n:
            raise ValueError(
                f"data: columnwise data must be flat with a multiple of N = {n} elements, "
                f"got shape {tuple(data.shape)}"
            )
        m_rows = data.numel() // n
    else:
        if data.dim() != 2 or data.shape[1] != n:
            raise ValueError(f"data: rowwise data must be [M, N = {n}], got {tuple(data.shape)}")
        m_rows = data.shape[0]
    num_groups, host = _groups_of(splits, m_rows)
    if tuple(scale_inv.shape) != (num_groups,):
        raise ValueError(f"scale_inv: expected shape ({num_groups},), got {tuple(scale_inv.shape)}")
    _check_devices({"data": data, "scale_inv": scale_inv}, splits)
    return m_rows, host


# ------------------------------------------------------------------------------ launch


def _launch_dequantize(spec, data, scales, gscale, out, splits, m_rows, n_cols, sign_mask):
    dev = data.device
    if isinstance(splits, groups.GroupLayout):
        layout = splits
        if layout.row_tiles >= 0 and layout.tile_tables is None:
            # host tables: the kernels read the tile and scale records after them
            layout = groups.prepare_groups(
                layout.host_splits, m_rows, dev, tile_records=True, validated=True
            )
    else:
        layout = groups.prepare_groups(splits, m_rows, dev, tile_records=True)
    # one CTA per tile (the kernel's grid: column tiles x row tiles): with device splits an
    # upper bound of the row tiles (each group adds at most one partial 64-row tile); CTAs past
    # the last tile exit
    row_ctas = layout.row_tiles if layout.row_tiles >= 0 else m_rows // 64 + layout.num_groups
    if row_ctas == 0:
        return
    # the template's TILE_COLS: 128, or the fewest columns of >= 128-byte output rows
    out_bytes = 4 if spec.out_dtype == "f32" else 2
    tile_cols = max(128 * 64 // spec.col_tokens, 128 // out_bytes)
    col_tiles = -(-n_cols // tile_cols)
    tail = ()
    if spec.col_tail:
        slots = COLUMNWISE_TAIL_SLOTS
        if slots is None:
            slots = _launch.sm_count(dev) * spec.col_ring  # compiled for col_ring CTAs per SM
        sub, waves = COLUMNWISE_TAIL, (COLUMNWISE_TAIL_WAVES, COLUMNWISE_HEAD_WAVES)
        head, tail_from, row_ctas = tail_plan(row_ctas, col_tiles, slots, sub, *waves)
        tail = (head, tail_from, sub)
    else:
        # a CTA of the longer columnwise tiles takes col_tokens / 64 consecutive 64-row tiles
        row_ctas = -(-row_ctas // (spec.col_tokens // 64))
    walk = spec.columnwise and not spec.transposed_out and COLUMNWISE_ROW_TILES_FIRST
    walk = walk and col_tiles < 1 << 16  # the grid's y extent
    _launch.run(
        spec,
        _launch.ptr(data),
        _launch.ptr(scales),
        _launch.ptr(gscale, 4),
        _launch.ptr(out),
        layout.tables_addr(),
        layout.num_groups,
        layout.row_tiles,
        n_cols,
        sign_mask,
        layout.early_level(),
        int(walk),
        row_ctas,
        *tail,
        stream=_launch.raw_stream(dev),
    )


def nvfp4_group_dequantize_impl(
    data: torch.Tensor,
    scales: torch.Tensor,
    amax: torch.Tensor,
    splits,
    n_cols: int,
    columnwise: bool,
    swizzled: bool,
    undo_rht: bool,
    sign_mask: int,
    out_dtype: torch.dtype,
    transposed_out: bool = False,
) -> tuple[torch.Tensor]:
    """(out,) from validated arguments (``_check_nvfp4_dequantize``): [M, N] ``out_dtype``, or
    with ``transposed_out`` flat [M * N] holding group g's [N, M_g] block at element
    row_start_g * N (the columnwise values as they are, e.g. in the RHT domain).
    ``data``: rowwise uint8 [M, N/2] or columnwise flat uint8 [M * N / 2]; ``scales``: that
    direction's uint8 scale buffer (compact or swizzled); ``amax``: fp32 [G] of that direction;
    ``splits``: host tuple or int32/int64 device tensor."""
    m_rows = data.numel() * 2 // n_cols
    shape = (m_rows * n_cols,) if transposed_out else (m_rows, n_cols)
    out = _launch.output_allocator(shape, out_dtype, data.device)
    if m_rows:
        arch = _launch.device_arch(data.device)
        spec = _spec(
            arch, "nvfp4", columnwise, undo_rht, swizzled, OUT_DTYPES[out_dtype], transposed_out
        )
        _launch_dequantize(spec, data, scales, amax, out, splits, m_rows, n_cols, sign_mask)
    return (out,)


def fp8_group_dequantize_impl(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    splits,
    n_cols: int,
    columnwise: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor]:
    """(out [M, N] ``out_dtype``,) from validated arguments (``_check_fp8_dequantize``).
    ``data``: fp8 rowwise [M, N] or the transposed groups flat [M * N]; ``scale_inv``: fp32 [G]."""
    m_rows = data.numel() // n_cols
    out = _launch.output_allocator((m_rows, n_cols), out_dtype, data.device)
    if m_rows:
        arch = _launch.device_arch(data.device)
        fmt = FP8_FORMATS[data.dtype]
        spec = _spec(arch, fmt, columnwise, False, False, OUT_DTYPES[out_dtype])
        raw = data.view(torch.uint8)
        _launch_dequantize(spec, raw, raw, scale_inv, out, splits, m_rows, n_cols, 0)
    return (out,)


# ------------------------------------------------------------------------------ friendly API


def _result_splits(layout: groups.GroupLayout):
    """A grouped result's splits without a host synchronization: the host tuple; with device
    splits the result's own layout (its call built the tables into a buffer the result keeps:
    no table kernel to run again), or while torch.compile traces (the op takes tensors) the
    split sizes from the snapshot of row starts."""
    if layout.host_splits is not None:
        return layout.host_splits
    if torch.compiler.is_compiling():
        return torch.diff(layout.snapshot[: layout.num_groups + 1])
    return layout


def _groups_of(splits, m_rows: int):
    """(G, host splits or None) of a dequantize call's ``splits`` (checked)."""
    if isinstance(splits, groups.GroupLayout):  # a device-split result's own tables
        if splits.m_rows != m_rows:
            raise ValueError(f"data: {m_rows} rows, but its result has {splits.m_rows}")
        return splits.num_groups, splits.host_splits
    return _num_groups(splits), groups.check_splits(splits, m_rows)


def nvfp4_group_dequantize(
    result,
    *,
    columnwise: bool = False,
    undo_rht: bool = True,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """High-precision [M, N] tensor back from an ``Nvfp4GroupedTensor``, in one launch and with
    no host synchronization. Rowwise, or ``columnwise``: from the columnwise data, transposed
    back, and (if it was quantized with the RHT and ``undo_rht``) inverse-transformed, giving x
    back instead of RHT(x^T). Inside ``torch.compile`` this runs as the
    ``cutequant::nvfp4_group_dequantize`` op."""
    from cutequant.nvfp4 import Nvfp4GroupedTensor

    if not isinstance(result, Nvfp4GroupedTensor):
        raise TypeError(f"result: expected an Nvfp4GroupedTensor, got {type(result).__name__}")
    _checks.check_flag(columnwise, "columnwise")
    _checks.check_flag(undo_rht, "undo_rht")
    side = "col" if columnwise else "row"
    data = getattr(result, f"{side}_data")
    if data is None:
        kind = "columnwise" if columnwise else "rowwise"
        raise ValueError(f"result: has no {kind} data (it was quantized without it)")
    args = (
        data,
        getattr(result, f"{side}_scales").reshape(-1) if columnwise else result.row_scales,
        getattr(result, f"amax_{side}"),
        _result_splits(result._layout),
        result.n_cols,
        columnwise,
        result.swizzled_scales,
        columnwise and undo_rht and result.rht,
        result.sign_mask,
        out_dtype,
    )
    if torch.compiler.is_compiling():
        from cutequant import ops

        return ops.nvfp4_group_dequantize_op(*ops.split_arg(args, 3))
    flags = (result.swizzled_scales, result.rht, result.sign_mask, columnwise, undo_rht)
    return _replayed(result, flags, out_dtype, lambda: _nvfp4_checked(args))


def _nvfp4_checked(args) -> torch.Tensor:
    _check_nvfp4_dequantize(*args)
    return nvfp4_group_dequantize_impl(*args)[0]


_RECORDS = replay.CallMemo()  # both dequantize ops' replayable calls (replay.py)


def _replayed(result, flags: tuple, out_dtype, checked) -> torch.Tensor:
    """The dequantize of an eager grouped result: a replay of a recorded call (replay.py) when
    one matches (the same result buffers' spans and layout, flags, dtype and stream), else
    ``checked()``, recorded when it may be replayed. The result's own buffers (one allocation
    of outputs, the amax / scale tensor) are the record's bases, and so are the split tables
    when they are the result's own (device splits, or a host list seen for the first time):
    such a record serves every result that shares the spans (a replayed quantize's results
    do) and the group count, whatever the split values; a record of cached host tables
    serves that layout only."""
    outputs, layout = result._outputs, result._layout
    if (
        not replay.enabled
        or outputs.__class__ is not packing.PackedOutputs
        or out_dtype.__class__ is not torch.dtype
    ):
        return checked()
    buf, stats = outputs.buf, result.stats_tensor()
    dev = buf.device
    stream = torch._C._cuda_getCurrentRawStream(dev.index)
    own = layout.host_totals is None or layout.per_call_tables  # the kernel reads layout.tables
    which = (layout.num_groups, layout.m_rows) if own else id(layout)
    # the columnwise layout switches too: a record holds the kernel they chose
    layout_flags = (
        COLUMNWISE_TOKENS,
        COLUMNWISE_RING,
        COLUMNWISE_SCALE_WORDS,
        COLUMNWISE_ROW_TILES_FIRST,
        CACHE_HINTS,
        COLUMNWISE_TAIL,
        COLUMNWISE_TAIL_WAVES,
        COLUMNWISE_HEAD_WAVES,
        COLUMNWISE_TAIL_SLOTS,
        COLUMNWISE_REGS,
    )
    key = (id(outputs.spans), which, flags, tuple(map(type, flags)), out_dtype, stream,
           layout_flags)  # fmt: skip
    hit = _RECORDS.get(key)
    if hit is not None and hit[1] is outputs.spans and (own or hit[2] is layout):
        record, _, _, shape = hit
        out = _launch.output_allocator(shape, out_dtype, dev)
        record.launch((buf, stats, out, layout.tables if own else None))
        return out
    with replay.recording() as rec:
        out = checked()
    if rec.replayable(layout.m_rows):
        bases = [buf, stats, out, layout.tables if own else None]
        # a layout with its own tables is not kept: they may be a whole outputs buffer (device
        # splits, NVFP4), which a reference here would hold as long as the record
        _RECORDS.put(key, (replay.Replay(rec.launches, bases), outputs.spans,
                           None if own else layout, tuple(out.shape)))  # fmt: skip
    return out


def fp8_group_dequantize(
    result, *, columnwise: bool = False, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """High-precision [M, N] tensor back from an ``Fp8GroupedTensor`` (rowwise, or the
    transposed copies transposed back), in one launch, no host synchronization. Inside
    ``torch.compile`` this runs as the ``cutequant::fp8_group_dequantize`` op."""
    from cutequant.fp8 import Fp8GroupedTensor

    if not isinstance(result, Fp8GroupedTensor):
        raise TypeError(f"result: expected an Fp8GroupedTensor, got {type(result).__name__}")
    _checks.check_flag(columnwise, "columnwise")
    data = result.col_data if columnwise else result.row_data
    if data is None:
        kind = "columnwise" if columnwise else "rowwise"
        raise ValueError(f"result: has no {kind} data (quantized with {kind}=False)")
    args = (
        data,
        result.scale_inv,
        _result_splits(result._layout),
        result.n_cols,
        columnwise,
        out_dtype,
    )
    if torch.compiler.is_compiling():  # fp8 crosses the op boundary as uint8
        from cutequant import ops

        raw = (data.view(torch.uint8), data.dtype, *args[1:])
        return ops.fp8_group_dequantize_op(*ops.split_arg(raw, 3))
    return _replayed(result, (columnwise,), out_dtype, lambda: _fp8_checked(args))


def _fp8_checked(args) -> torch.Tensor:
    _check_fp8_dequantize(*args)
    return fp8_group_dequantize_impl(*args)[0]


__all__ = [
    "nvfp4_group_dequantize",
    "fp8_group_dequantize",
    "nvfp4_group_dequantize_impl",
    "fp8_group_dequantize_impl",
]
