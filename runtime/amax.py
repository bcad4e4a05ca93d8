"""``cutequant.group_amax``: per-group amax, optionally post-RHT (TE's
``nvte_group_hadamard_transform_amax``), in one persistent launch."""

from __future__ import annotations

import dataclasses
import functools

import torch

from cutequant import _checks, _launch, groups, replay
from cutequant.codegen.specs import GroupAmaxSpec

DEFAULT_SIGN_MASK = 0xD7E8
IN_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def group_amax(
    x: torch.Tensor, splits, *, rht: bool = True, sign_mask: int = DEFAULT_SIGN_MASK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group amax of ``x[sum(splits), N]`` (bf16; fp16 / fp32 too when ``rht`` is False).

    Returns ``(amax_row, amax_col)``, fp32 ``[G]`` each: ``amax_row[g] = max |x_g|`` and
    ``amax_col[g] = max |bf16(RHT(x_g^T))|`` (the 16x16 random Hadamard transform along tokens,
    16-token blocks, ``sign_mask`` selecting the sign flips) or ``max |x_g|`` when ``rht`` is
    False. A zero-token group gives 0. ``splits``: host ints or an int32/int64 CUDA tensor (no
    host synchronization); each a multiple of 16, summing to ``x.shape[0]``. Bad device splits
    are caught on the device: the outputs are set to NaN (``CUTEQUANT_SYNC_CHECKS=1`` raises).
    """
    if torch.compiler.is_compiling():
        from cutequant import ops

        return ops.group_amax_traced(x, splits, rht, sign_mask)
    key, hit = replay.find(_RECORDS, x, splits, (rht, sign_mask, _launch.rht_mma()))
    if hit is not None:  # replay.py: the checked call's launches again
        record, shape, num_groups = hit
        amax = _launch.output_allocator(shape, torch.float32, x.device)
        record.launch((x, amax, replay.device_splits(splits)))
        return _rows(amax, num_groups)
    m_rows, num_groups, splits, arch = check_group_amax(x, splits, rht, sign_mask)
    with replay.recording() as rec:
        amax, _ = run_group_amax(x, splits, m_rows, num_groups, rht, sign_mask, arch, True)
    if key is not None and rec.replayable(m_rows):
        device_splits = replay.device_splits(splits)
        record = replay.Replay(rec.launches, [x, amax, device_splits], rec.scratch)
        _RECORDS.put(key, (record, tuple(amax.shape), num_groups))
    return _rows(amax, num_groups)


def _rows(amax: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax_row, amax_col) of ``run_group_amax``'s output: a [2, G] tensor, or the flat
    buffer of an eager call with device splits (the two rows first, then the call's tables)."""
    if amax.dim() == 1:
        return amax[:num_groups], amax[num_groups : 2 * num_groups]
    return tuple(amax.unbind(0))


_RECORDS = replay.CallMemo()  # group_amax's replayable calls (replay.py)


_IN_DTYPE_LIST = tuple(IN_DTYPES)


def check_group_amax(x, splits, rht, sign_mask):
    """Every argument check of ``group_amax`` (host only); returns (M, G, splits, arch), the
    splits as the validated tuple (host) or the tensor (device)."""
    m_rows, _ = _checks.check_x(x, dtypes=_IN_DTYPE_LIST)
    _checks.check_flag(rht, "rht")
    _checks.check_sign_mask(sign_mask)
    if rht and x.dtype != torch.bfloat16:
        raise TypeError(f"x: the RHT amax needs torch.bfloat16 input, got {x.dtype}")
    num_groups = _num_groups(splits)
    host = groups.check_splits(splits, m_rows)
    arch = _checks.check_device(x)
    # UnsupportedArchError before any allocation or launch
    _spec(arch, rht, IN_DTYPES[x.dtype], rht_mma=_launch.rht_mma())
    return m_rows, num_groups, splits if host is None else host, arch


def run_group_amax(x, splits, m_rows, num_groups, rht, sign_mask, arch, carve=False):
    """(fp32 [2, G] (row, col) amax, the call's layout) of validated arguments
    (``check_group_amax``'s). ``carve`` (eager calls) with device splits and rows: the amax is
    the head of one flat fp32 buffer whose tail holds the call's snapshot and tables (one
    allocation less: ~2.5 us of host time)."""
    if carve and m_rows and isinstance(splits, torch.Tensor):
        at = -(-8 * num_groups // 16) * 16  # the tables' byte offset: 16-byte aligned
        words = at // 4 + groups.device_tables_words(num_groups)
        amax = _launch.output_allocator((words,), torch.float32, x.device)
        layout = groups.prepare_groups(
            splits, m_rows, x.device, (amax.data_ptr(), 2 * num_groups), into=(amax, at),
            defer_tables=True,
        )  # fmt: skip
    else:
        amax = new_amax(2, num_groups, m_rows, x.device)
        layout = groups.prepare_groups(
            splits, m_rows, x.device, poison=amax, validated=True, defer_tables=True
        )
    launch_group_amax(
        x, layout, amax, rht=rht, sign_mask=sign_mask, arch=arch, in_dtype=IN_DTYPES[x.dtype]
    )
    return amax, layout


def _num_groups(splits) -> int:
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError(f"splits: expected a 1-D tensor, got shape {tuple(splits.shape)}")
        return splits.numel()
    try:
        return len(splits)
    except TypeError as exc:
        raise TypeError(
            f"splits: expected a sequence of ints or a tensor, got {type(splits).__name__}"
        ) from exc


def new_amax(rows: int, num_groups: int, m_rows: int, device: torch.device) -> torch.Tensor:
    """Output for ``launch_group_amax``: uninitialized when the kernel runs (it zeroes its
    outputs itself), zeros when there are no rows (no launch)."""
    if m_rows == 0:
        return torch.zeros(rows, num_groups, dtype=torch.float32, device=device)
    return _launch.output_allocator((rows, num_groups), torch.float32, device)


@functools.cache
def _spec(
    arch: str, rht: bool, in_dtype: str, walk_band: int = 0, rht_mma: str = "auto"
) -> GroupAmaxSpec:
    plan = GroupAmaxSpec().plan
    return GroupAmaxSpec(
        arch=arch,
        rht=rht,
        in_dtype=in_dtype,
        plan=dataclasses.replace(plan, walk_band=walk_band),
        rht_mma=rht_mma,
    )


# Share of L2 that an amax pass leaves for the cast kernel right after it (see ``l2_resident``).
L2_HANDOFF_SHARE = 0.5


@functools.cache
def _l2_bytes(index: int) -> int:
    return torch.cuda.get_device_properties(index).L2_cache_size


def l2_resident(device: torch.device, num_ctas: int) -> int:
    """Tiles per CTA that stay in L2 after an amax pass: that pass then arranges its walk so
    that they are the first tiles of the cast kernel's CTA of the same index (same grid, same
    walk band). x is read twice (amax, then cast); this turns part of the second read into L2
    hits. FP8 current scaling on an H200, share 0.3 / 0.5 / 0.65 / off (two interleaved
    rounds): dense 74.3-74.6 / 74.0 / 74.7-75.4 / 75.4-75.5 us; 64 groups 242.9 / 242.6-243.2 /
    242.7-243.1 / 244.3-244.5 us."""
    tile_bytes = 64 * 2 * 128  # a grouped tile: 64 rows x 2 x 128 bytes, for every dtype
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(int(L2_HANDOFF_SHARE * _l2_bytes(index)) // (tile_bytes * num_ctas), 0)


def launch_group_amax(
    x: torch.Tensor,
    layout: groups.GroupLayout,
    amax: torch.Tensor | int,
    *,
    rht: bool,
    sign_mask: int,
    arch: str,
    in_dtype: str = "bf16",
    col_scale: float = 1.0,
    stream: int | None = None,
    cast_walk_band: int | None = None,
) -> None:
    """Write ``amax[2, G]`` (contiguous fp32, or its 4-byte-aligned device address; zeroed by
    the kernel, so it may hold anything when ``x`` has rows; left as is when it has none: see
    ``new_amax``). No checks: callers validated. ``col_scale`` multiplies ``amax[1]``
    (post-RHT amax estimation; only without ``rht``). ``cast_walk_band`` (a band > 1): a cast
    kernel with that walk band and this grid follows on the stream; the amax pass then walks
    that way too and leaves the cast's first tiles in L2 (``l2_resident``)."""
    m_rows, n_cols = x.shape
    if m_rows == 0:
        return
    if cast_walk_band is not None and cast_walk_band <= 1:
        raise ValueError("cast_walk_band: the L2 hand-off needs a band > 1 (token-fastest walk)")
    dev = x.device
    if stream is None:
        stream = _launch.raw_stream(dev)
    rht_mma = _launch.rht_mma()
    key = (dev.index, stream, arch, rht, in_dtype, cast_walk_band, rht_mma)
    hit = _LAUNCH_FACTS.get(key)
    if hit is None:  # spec, grid, the stream's launch counter, L2-resident tiles: fixed per key
        spec = _spec(arch, rht, in_dtype, cast_walk_band or 0, rht_mma)
        num_ctas = _launch.grid_size(spec, dev)
        counter = groups.launch_counter(dev, stream, num_ctas)
        resident = l2_resident(dev, num_ctas) if cast_walk_band is not None else 0
        hit = _LAUNCH_FACTS[key] = (spec, num_ctas, _launch.ptr(counter, 8), resident)
    spec, num_ctas, counter_addr, resident = hit
    pending = layout.pending_tables
    if pending is not None:  # device splits: this pass builds the tables (kernels/tables.py)
        spec = _with_device_splits(spec, pending[0])
        layout.pending_tables = None
        layout.tables_by_amax_pass = True
    _launch.run_grouped(
        spec,
        _launch.ptr(x),
        m_rows,
        n_cols,
        layout,
        amax if isinstance(amax, int) else _launch.ptr(amax, 4),
        counter_addr,
        sign_mask,
        float(col_scale),
        resident,
        layout.early_level(),
        *(() if pending is None else pending[1]),
        num_ctas=num_ctas,
        stream=stream,
    )
    if pending is not None:
        groups.sync_check(layout)


@functools.cache
def _with_device_splits(spec: GroupAmaxSpec, dtype: str) -> GroupAmaxSpec:
    return dataclasses.replace(spec, device_splits=dtype)


# (device, stream, arch, rht, dtype, band, rht_mma) -> (spec, grid, launch counter address,
# resident); the counters live as long as the process (groups._COUNTERS), so their addresses
# stay valid
_LAUNCH_FACTS: dict = {}
