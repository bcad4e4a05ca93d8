"""Runtime-owned grouping: split sizes -> device lookup tables, plus the per-stream workspace.

Every grouped kernel maps a linear tile index to (group, tile) through ``tables[4, G + 1]``
(layout in ``cutequant.kernels.schedule``). Host splits (list / tuple / CPU tensor) are checked
and turned into tables on the host. A split list seen for the first time gets tables of the
call's own, copied asynchronously from pinned memory on the current stream (a training loop
whose splits change every step never waits on the GPU); from its second call on, a list's
tables are cached per (splits, device), so a repeated call costs one dictionary lookup.
Device splits (int32 / int64 CUDA tensor) are turned into tables by a
one-warp kernel into a buffer of the call's own (which its result keeps), with no host
synchronization; that kernel also validates them and, on bad splits, zeroes the tile count so
that no kernel writes anything (see ``GroupLayout.check``). When the call's first kernel is the
amax pass, that pass builds the tables itself and the table kernel is not launched
(``prepare_groups(..., defer_tables=True)``, ``GroupLayout.pending_tables``).
"""

from __future__ import annotations

import collections
import itertools
import numbers
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from cutequant import _checks, _launch, replay
from cutequant.codegen.specs import GroupTablesSpec
from cutequant.kernels import pdl

ROW_MULTIPLE = 16
TILE_ROWS = 64
_HOST_CACHE: collections.OrderedDict = collections.OrderedDict()  # prepared layouts
_CHECKED: collections.OrderedDict = collections.OrderedDict()  # validated split tuples
_HOST_CACHE_SIZE = 256
# split lists seen once (their tables were the call's own): a second call caches them
_SEEN: collections.OrderedDict = collections.OrderedDict()
_WORKSPACES: dict = {}
_RETIRED: list = []  # grown-out workspaces (never freed: a kernel may still read one)
_COUNTERS: dict = {}
_LOCK = threading.Lock()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


_RUNTIME_STREAMS: dict = {}


def persistent(device: torch.device, make):
    """Run ``make()`` to create device buffers the runtime keeps across calls (tables,
    workspaces, counters), outside any CUDA-graph memory pool.

    torch.compile's CUDA graphs (``mode="reduce-overhead"``) warm up and record with every
    allocation of the calling thread routed to the graph's private pool, and reject pool
    memory that outlives the step. The buffers are therefore made by a short-lived worker
    thread on a runtime-owned stream and synchronized there (once per buffer, so no stream
    of the caller's needs to wait for them). While a stream capture is under way (a plain
    ``torch.cuda.graph``) nothing may synchronize: the buffers are made on the capturing
    stream and live in that graph's pool, which the graph keeps alive.
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    index = device.index if device.index is not None else torch.cuda.current_device()
    # the caller's queued work may still write what ``make`` copies from (host tensors only:
    # every buffer made here is new), so nothing on the caller's streams must be awaited
    out, error = [], []

    def work():
        try:
            with torch.cuda.device(index):
                side = _RUNTIME_STREAMS.get(index)
                if side is None:
                    side = _RUNTIME_STREAMS[index] = torch.cuda.Stream(device=index)
                with torch.cuda.stream(side):
                    out.append(make())
                side.synchronize()
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    worker = threading.Thread(target=work, name="cutequant-persistent")
    worker.start()
    worker.join()
    if error:
        raise error[0]
    return out[0]


_TOTALS: collections.OrderedDict = collections.OrderedDict()


def host_totals(values: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The last column of ``host_tables(values)`` (rows, 64-row tiles, NVFP4 row-scale rows,
    column-scale columns) for validated host splits, cached: buffer-size checks need no
    Python loop over the groups (30-40 us for 256 groups on the GPU hosts)."""
    hit = _TOTALS.get(values)
    if hit is None:
        hit = tuple(host_tables(values)[:, -1].tolist())
        with _LOCK:
            _TOTALS[values] = hit
            while len(_TOTALS) > _HOST_CACHE_SIZE:
                _TOTALS.popitem(last=False)
    return hit


def _retire(*items) -> None:
    """Before an evicted cache entry's device buffers are freed: they were made on the runtime
    stream (``persistent``), so their memory must first wait for the current stream's kernels,
    which may still read them. Replay records (replay.py) may point at them: all are dropped."""
    replay.invalidate()
    for item in items:
        if isinstance(item, GroupLayout):
            item = [item.tables, item.tile_tables]
        for t in item if isinstance(item, list) else [item]:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(torch.cuda.current_stream(t.device))


# Up to this many groups the tables are built from Python lists, above with numpy: 7 vs 13 us
# for 8 groups, 113 vs 21 us for 256 (2-core host; the torch.tensor of a nested list dominates).
_PY_TABLE_GROUPS = 24


def host_tables(splits: tuple[int, ...]) -> torch.Tensor:
    """int32 [4, G+1] prefix sums: rows, 64-row tiles, rowwise scale rows, colwise scale cols
    (validated, non-negative splits). Small CPU-tensor torch ops cost 35-55 us here."""
    if len(splits) <= _PY_TABLE_GROUPS:
        acc = itertools.accumulate
        rows = [
            list(acc(splits, initial=0)),
            list(acc([(v + TILE_ROWS - 1) // TILE_ROWS for v in splits], initial=0)),
            list(acc([(v + 127) // 128 * 128 for v in splits], initial=0)),
            list(acc([(v // 16 + 3) // 4 * 4 for v in splits], initial=0)),
        ]
        # non-negative splits: each row's last prefix sum is its largest
        if max(row[-1] for row in rows) > 2**31 - 1:
            raise ValueError("splits: total size overflows the int32 lookup tables")
        return torch.tensor(rows, dtype=torch.int32)
    a = np.array(splits, dtype=np.int64)
    out = np.zeros((4, len(splits) + 1), dtype=np.int64)
    np.cumsum(a, out=out[0, 1:])
    np.cumsum((a + TILE_ROWS - 1) // TILE_ROWS, out=out[1, 1:])
    np.cumsum((a + 127) // 128 * 128, out=out[2, 1:])
    np.cumsum((a // 16 + 3) // 4 * 4, out=out[3, 1:])
    if out[:, -1].max() > 2**31 - 1:
        raise ValueError("splits: total size overflows the int32 lookup tables")
    return torch.from_numpy(out.astype(np.int32))


def host_tile_records(tables: torch.Tensor) -> torch.Tensor:
    """int32 [row tiles, 4] from ``host_tables``: per 64-row tile (group, group's first row,
    group's rows, tile within the group). Stored right after the tables on the device, so that a
    one-CTA-per-tile kernel finds its tile with one 16-byte load instead of a binary search
    (log2 G dependent loads; kernels/templates/fp8_tile_cast.py.j2). Built only for calls that
    run that kernel (~40 us of CPU per new split list on a 2-core host)."""
    t = tables.to(torch.int64)
    rows = t[0].diff()
    tiles = t[1].diff()
    g = torch.repeat_interleave(torch.arange(rows.numel()), tiles)
    local = torch.arange(g.numel()) - t[1][g]
    return torch.stack([g, t[0][g], rows[g], local], dim=1).to(torch.int32)


def host_scale_records(tables: torch.Tensor) -> torch.Tensor:
    """int32 [row tiles, 2] from ``host_tables``: per 64-row tile its group's first NVFP4
    row-scale row and column-scale column. Stored after ``host_tile_records``, so that the
    dequantize kernel loads the scale block's start together with the tile's record instead of
    one round trip after it (``kernels/dequant.py``, ``find_tile``)."""
    t = tables.to(torch.int64)
    g = torch.repeat_interleave(torch.arange(t.shape[1] - 1), t[1].diff())
    return torch.stack([t[2][g], t[3][g]], dim=1).to(torch.int32)


@dataclass
class GroupLayout:
    """One call's grouping: device tables, the group count and (when known) the host splits."""

    num_groups: int
    m_rows: int
    # host splits: int32 [4, G + 1] (cached, never written again); device splits: the call's
    # own int32 buffer, the snapshot first and the tables ``tables_offset`` bytes in
    tables: torch.Tensor
    host_splits: tuple[int, ...] | None
    # device splits only: this call's int32 [G + 2] (row starts, then the status: 0 valid,
    # 1 bad), written by the table kernel at the head of the call's buffer (``snapshot``: made
    # on first use from ``snapshot_at``, a view costs 1-2 us of host time)
    snapshot_view: torch.Tensor | None = None
    # host splits only: the tables' last column (rows, row tiles, NVFP4 row-scale rows, NVFP4
    # column-scale columns), so callers size buffers without a Python loop over the groups
    host_totals: tuple[int, int, int, int] | None = None
    # host splits, asked for (prepare_groups(tile_records=True)): the tables followed by one
    # record per 64-row tile (host_tile_records), for the one-CTA-per-tile kernels' one-load
    # lookup, then the tiles' scale records (host_scale_records, for the dequantize kernel)
    tile_tables: torch.Tensor | None = None
    # device splits: byte offset of the [4, G + 1] tables in ``tables`` (the call's buffer
    # holds the snapshot first)
    tables_offset: int = 0
    # host splits seen for the first time (or during a CUDA-graph capture): ``tables`` are this
    # call's own, copied on the stream right before its kernels (not cached, no tile records,
    # never read before the kernels' wait for the work ahead of them)
    per_call_tables: bool = False
    # device splits: byte offset of the snapshot in ``tables`` (-1: ``snapshot_view`` or none)
    snapshot_at: int = -1
    # device splits, ``prepare_groups(defer_tables=True)``: the table kernel was not launched;
    # the amax pass must build the tables: (its spec's ``device_splits`` dtype, its extra
    # arguments (the splits, snapshot and poison addresses, the poison count), the splits).
    # ``launch_group_amax`` takes it (and sets ``tables_by_amax_pass``); nothing else may read
    # the tables before that launch
    pending_tables: tuple | None = None
    # the tables are written by the amax pass itself, so the kernel after it may not read them
    # before its wait for that pass (``early_level``)
    tables_by_amax_pass: bool = False

    @property
    def snapshot(self) -> torch.Tensor | None:
        """Device splits: the int32 [G + 2] snapshot (row starts, status); else None."""
        if self.snapshot_view is None and self.snapshot_at >= 0:
            raw = self.tables.view(torch.uint8)
            start = self.snapshot_at
            self.snapshot_view = raw[start : start + 4 * (self.num_groups + 2)].view(torch.int32)
        return self.snapshot_view

    def tables_addr(self) -> int:
        """Device address of the lookup tables the kernels read: the tables followed by the
        tile records when the call has them, else the plain tables."""
        if self.tile_tables is not None:
            return self.tile_tables.data_ptr()
        return self.tables.data_ptr() + self.tables_offset

    def early_level(self, after_amax_pass: bool = False) -> int:
        """How much of a kernel's TMA producer may run before it waits for the kernels before it
        (``kernels/pdl.py``): the loads of x too right after this call's amax
        pass; the table lookups when the tables came from the host cache (copied once,
        synchronously, never written again); else nothing."""
        if after_amax_pass:
            return pdl.EARLY_NONE if self.tables_by_amax_pass else pdl.EARLY_X
        if self.host_totals is not None and not self.per_call_tables:
            return pdl.EARLY_TABLES
        return pdl.EARLY_NONE

    @property
    def row_tiles(self) -> int:
        """Total 64-row tiles when known on the host and the tables are cached (with their
        per-tile records where a kernel wants them), else -1 (the kernels read the tables)."""
        if self.host_totals is None or self.per_call_tables:
            return -1
        return self.host_totals[1]

    def splits(self) -> tuple[int, ...]:
        """Host split sizes (synchronizes once when the splits came as a device tensor)."""
        if self.host_splits is None:
            self.check()
            starts = self.snapshot[: self.num_groups + 1]
            self.host_splits = tuple(int(v) for v in starts.diff().cpu().tolist())
        return self.host_splits

    def check(self) -> None:
        """Raise if device-side validation flagged the splits (synchronizes)."""
        if self.snapshot is not None and int(self.snapshot[-1].item()) != 0:
            raise ValueError(
                "splits: every split must be a non-negative multiple of 16 and they must sum to "
                f"x.shape[0] = {self.m_rows} (device-side check failed; nothing was written)"
            )


class GroupedViews:
    """Per-group access shared by the grouped result classes (they hold ``_layout``, their
    outputs ``_outputs`` and ``_amax_t``: the amax tensor, or None when it is the outputs'
    "amax" part, carved from the one allocation of an eager call with host splits)."""

    _layout: GroupLayout

    @property
    def _amax(self) -> torch.Tensor:
        """fp32 [rows, G] amax (row amax first): its own tensor or a view into the outputs."""
        if self._amax_t is None:
            self._amax_t = self._outputs.get("amax")
        return self._amax_t

    def stats_tensor(self) -> torch.Tensor | None:
        """The amax tensor when it is not part of the outputs buffer, else None (what a
        replayed dequantize addresses: replay.py)."""
        return None if "amax" in getattr(self._outputs, "spans", ()) else self._amax_t

    @property
    def num_groups(self) -> int:
        return self._layout.num_groups

    @property
    def splits(self) -> tuple[int, ...]:
        return self._layout.splits()

    def _group_rows(self, g: int) -> tuple[tuple[int, ...], int, int]:
        """(splits, M_g, first row of group g); IndexError for a bad ``g``."""
        splits = self.splits
        if not 0 <= g < len(splits):
            raise IndexError(f"group index {g} out of range for {len(splits)} groups")
        return splits, splits[g], sum(splits[:g])

    def group(self, g: int) -> dict:
        raise NotImplementedError

    def groups(self) -> list[dict]:
        return [self.group(g) for g in range(self.num_groups)]


def check_splits(splits, m_rows: int) -> tuple[int, ...] | None:
    """Validate host splits (returns them as ints) or the form of device splits (returns None).
    Host-only work: called before anything touches the GPU."""
    if isinstance(splits, torch.Tensor) and splits.is_cuda:
        if splits.dim() != 1:
            raise ValueError(f"splits: expected a 1-D tensor, got shape {tuple(splits.shape)}")
        if splits.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"splits: a device tensor must be int32 or int64, got {splits.dtype}")
        if splits.numel() == 0:
            raise ValueError("splits: need at least one group")
        return None
    cacheable = isinstance(splits, (list, tuple)) and _checks.plain_int_splits(splits)
    if cacheable:
        hit = _CHECKED.get((tuple(splits), m_rows))
        if hit is not None:
            return hit
    values = _validate_host_splits(splits, m_rows)
    if cacheable:
        with _LOCK:
            _CHECKED[(values, m_rows)] = values
            while len(_CHECKED) > _HOST_CACHE_SIZE:
                _CHECKED.popitem(last=False)
    return values


def _validate_host_splits(splits, m_rows: int) -> tuple[int, ...]:
    if isinstance(splits, (list, tuple)) and _checks.plain_int_splits(splits):
        # valid lists pass with C-level builtins (~1 us for 8 groups, ~4 us for 256 vs 5 / 40
        # for the loop below, which runs only to name what is wrong); ROW_MULTIPLE is a power of
        # two and the values are non-negative when the mask is applied
        values = tuple(splits)
        if (
            values
            and min(values) >= 0
            and not any(map((ROW_MULTIPLE - 1).__and__, values))
            and sum(values) == m_rows
        ):
            return values
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError(f"splits: expected a 1-D tensor, got shape {tuple(splits.shape)}")
        if splits.dtype.is_floating_point or splits.dtype == torch.bool:
            raise TypeError(f"splits: expected an integer tensor, got {splits.dtype}")
        values = tuple(int(v) for v in splits.tolist())
    else:
        try:
            items = list(splits)
        except TypeError as exc:
            raise TypeError(
                f"splits: expected a sequence of ints or a tensor, got {type(splits).__name__}"
            ) from exc
        for i, v in enumerate(items):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"splits[{i}] = {v!r} is not an int")
        values = tuple(int(v) for v in items)
    if len(values) == 0:
        raise ValueError("splits: need at least one group")
    for i, v in enumerate(values):
        if v < 0:
            raise ValueError(f"splits[{i}] = {v} is negative")
        if v % ROW_MULTIPLE:
            raise ValueError(f"splits[{i}] = {v} is not a multiple of {ROW_MULTIPLE} rows")
    total = sum(values)
    if total != m_rows:
        raise ValueError(f"splits sum to {total} but x has {m_rows} rows")
    return values


@dataclass
class Workspace:
    """Per (device, stream) scratch, reused by every call on that stream (its kernels run in
    order, so one set suffices): the group-fold words of ``kernels/group_fold.py`` (two per
    group, created zero; every launch leaves them zero, so a grown workspace simply drops the
    old ones) and the grid-barrier words of ``kernels/grid_sync.py`` (an arrival count that
    every launch leaves zero, and a generation), and an fp32 scratch of two words per group
    that a call's first kernel writes and its second reads (the 2D weights' amax pass:
    ``nvfp4_2d``; stream order keeps calls apart, as for the fold words). Device-built lookup
    tables are not kept here but in each call's own buffer (``GroupLayout.snapshot`` and the
    tables after it), which its result keeps."""

    fold: torch.Tensor
    barrier: torch.Tensor
    scratch: torch.Tensor


def _handle(stream) -> int:
    return stream if isinstance(stream, int) else stream.cuda_stream


def workspace(device: torch.device, num_groups: int, stream) -> Workspace:
    """``stream``'s workspace on ``device`` (a torch.cuda.Stream or a raw handle), grown
    geometrically to hold ``num_groups`` groups."""
    key = (device.index, _handle(stream))
    with _LOCK:
        ws = _WORKSPACES.get(key)
        if ws is None or ws.fold.numel() < 2 * num_groups:
            groups_cap = max(num_groups, 1024, 0 if ws is None else ws.fold.numel())
            ws = persistent(
                device,
                lambda: Workspace(
                    fold=torch.zeros(2 * groups_cap, dtype=torch.int32, device=device),
                    barrier=torch.zeros(4, dtype=torch.int32, device=device),
                    scratch=torch.empty(2 * groups_cap, dtype=torch.float32, device=device),
                ),
            )
            if key in _WORKSPACES:  # kernels on the stream may still use the old one
                _RETIRED.append(_WORKSPACES[key])
                replay.invalidate()  # records of calls that used the old one
            _WORKSPACES[key] = ws
    return ws


def launch_counter(device: torch.device, stream, num_ctas: int) -> torch.Tensor:
    """int64 [2] device counter of ``kernels/launch_zeroing.py`` for kernels launched with
    ``num_ctas`` CTAs on ``stream``: created zero, never reset (each launch advances it), one per
    grid size because a launch's number is its ticket // num_ctas."""
    key = (device.index, _handle(stream), num_ctas)
    with _LOCK:
        counter = _COUNTERS.get(key)
        if counter is None:
            counter = _COUNTERS[key] = persistent(
                device, lambda: torch.zeros(2, dtype=torch.int64, device=device)
            )
    return counter


def prepare_groups(
    splits,
    m_rows: int,
    device: torch.device,
    poison=None,
    tile_records: bool = False,
    validated: bool = False,
    into=None,
    defer_tables: bool = False,
) -> GroupLayout:
    """Validate ``splits`` against ``m_rows`` and return the device lookup tables.

    ``validated``: ``splits`` is the tuple ``check_splits`` returned for ``m_rows`` (its
    checks are not repeated: a call pays the per-group hashing and type checks once).

    ``poison`` (fp32, device; a tensor or (address, count)): outputs set to NaN if device-side
    validation fails. ``into``: device splits only, (tensor, byte offset) where the call's
    tables go (``_device_groups``). ``defer_tables``: the caller launches the amax pass next
    (``amax.launch_group_amax``), which then builds a device-split call's tables instead of a
    table kernel (up to ``DEFERRED_TABLES_MAX_GROUPS`` groups; ``layout.pending_tables``).
    ``tile_records``: with host splits, also ``layout.tile_tables`` (the tables followed by
    ``host_tile_records``), built once per cached split list and cached with the tables (a
    first call's own tables have none: ``row_tiles`` is -1 and the kernels search the tables).
    Host splits: a list seen for the first time gets tables of the call's own
    (``_per_call_layout``: asynchronous, nothing waits); from its second call on the layout is
    cached and shared by every call with the same split list (it is never modified), and a
    repeated list costs one dictionary lookup.
    """
    if isinstance(splits, torch.Tensor) and splits.is_cuda:
        return _device_groups(splits, m_rows, device, poison, into, defer_tables)
    entry = None
    cacheable = validated or (
        isinstance(splits, (list, tuple)) and _checks.plain_int_splits(splits)
    )
    if cacheable:  # fast path: a repeated host split list is cached
        entry = _HOST_CACHE.get((tuple(splits), m_rows, device.index))
    if entry is None:
        values = splits if validated else _validate_host_splits(splits, m_rows)
        key = (values, m_rows, device.index)
        with _LOCK:
            entry = _HOST_CACHE.get(key)
            if entry is not None:
                _HOST_CACHE.move_to_end(key)
        if entry is None and device.type == "cuda":
            # a capture's buffers live in its graph's pool: never cached (a later call would
            # read freed memory once the graph is gone)
            capturing = torch.cuda.is_current_stream_capturing()
            if capturing or _first_sighting(key):
                return _per_call_layout(values, m_rows, device, capturing)
        if entry is None:
            host = host_tables(values)
            totals = tuple(int(v) for v in host[:, -1].tolist())
            # [layout without tile records, layout with them (built on first use)]
            entry = [None, None]
            if tile_records:
                buf = _with_tile_records(host, device)
                tables = buf[: host.numel()].view(host.shape)
                entry[1] = GroupLayout(len(values), m_rows, tables, values, host_totals=totals)
                entry[1].tile_tables = buf
            else:
                tables = persistent(device, lambda: _upload(host, device))
            entry[0] = GroupLayout(len(values), m_rows, tables, values, host_totals=totals)
            with _LOCK:
                _HOST_CACHE[key] = entry
                while len(_HOST_CACHE) > _HOST_CACHE_SIZE:
                    _retire(*_HOST_CACHE.popitem(last=False)[1])
    if not tile_records:
        return entry[0]
    if entry[1] is None:  # cached by a call that did not need them
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return _per_call_layout(entry[0].host_splits, m_rows, device, True)
        plain = entry[0]
        layout = GroupLayout(
            plain.num_groups, m_rows, plain.tables, plain.host_splits, host_totals=plain.host_totals
        )
        layout.tile_tables = _with_tile_records(host_tables(plain.host_splits), device)
        entry[1] = layout
    return entry[1]


def _first_sighting(key) -> bool:
    """Whether the host split list of ``key`` is new: its first call gets tables of its own,
    its second caches them (a list that keeps coming back is worth the synchronous copy)."""
    with _LOCK:
        if key in _SEEN:
            del _SEEN[key]
            return False
        _SEEN[key] = None
        while len(_SEEN) > 4 * _HOST_CACHE_SIZE:
            _SEEN.popitem(last=False)
    return True


_CAPTURE_SOURCES: list = []  # pinned sources of copies captured into CUDA graphs (kept forever)


def _per_call_layout(
    values: tuple[int, ...], m_rows: int, device: torch.device, capturing: bool
) -> GroupLayout:
    """Tables of this call's own for a split list seen for the first time (or while a CUDA
    graph is captured), staged in pinned memory and copied on the current stream. Eager: torch's
    pinned allocator keeps the staging block until the copy has run. Captured: the copy is a
    graph node that re-reads its source at every replay, so the source is kept for the life of
    the process (a few hundred bytes per captured split list). No per-tile records: the FP8
    tile cast and the dequantize kernels then find their tiles by a binary search, as with
    device splits (``row_tiles`` is -1). The cached path instead copies synchronously on a
    worker thread (``persistent``): a thread start and a device round trip, 250-900 us per call
    on an H200 host (perf/NOTES.md) that an MoE step whose split sizes change every step would
    pay on every call."""
    replay.taint()  # a replay would not repeat the copy
    host = host_tables(values)
    totals = tuple(host[:, -1].tolist())
    pinned = host.pin_memory()
    if capturing:
        _CAPTURE_SOURCES.append(pinned)
    tables = pinned.to(device, non_blocking=True)
    return GroupLayout(
        len(values), m_rows, tables, values, host_totals=totals, per_call_tables=True
    )


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``, for ``persistent``'s makers (copied synchronously on the runtime
    stream; while a CUDA graph is captured, from a pinned source kept like the tables')."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        pinned = host.pin_memory()
        _CAPTURE_SOURCES.append(pinned)
        return pinned.to(device, non_blocking=True)
    return host.to(device, non_blocking=False)


def _with_tile_records(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """int32 device buffer: ``host`` tables ([4, G + 1]), then ``host_tile_records`` (kernels
    find them 16 * (G + 1) bytes in), then ``host_scale_records`` (16 * (G + 1 + row tiles)
    bytes in). Copied synchronously, like the tables alone."""
    parts = (host, host_tile_records(host), host_scale_records(host))
    buf = torch.cat([p.reshape(-1) for p in parts])
    return persistent(device, lambda: _upload(buf, device))


# Most groups whose tables the amax pass builds itself (``defer_tables``): every CTA scans the
# splits with one warp, 32 groups per step, before its first tile; more groups keep the table
# kernel (one warp, once).
DEFERRED_TABLES_MAX_GROUPS = 512


def _device_groups(
    splits: torch.Tensor, m_rows: int, device: torch.device, poison, into=None, defer=False
) -> GroupLayout:
    check_splits(splits, m_rows)
    if splits.device != device:
        raise ValueError(f"splits: on {splits.device}, but x is on {device}")
    if not splits.is_contiguous():
        replay.taint()  # a copy a replay would not make
    splits = splits.contiguous()
    num_groups = splits.numel()
    # one buffer per call: the snapshot (row starts, status), then the [4, G + 1] tables on a
    # 16-byte boundary; the call's result keeps it, so no later call can overwrite its tables.
    # ``into``: (the call's outputs allocation, byte offset) to write it in (its "tables" part,
    # ``device_tables_words``), else a buffer of its own
    if into is None:
        buf, at = torch.empty(device_tables_words(num_groups), dtype=torch.int32, device=device), 0
        replay.scratch(buf)  # a replay makes a fresh one (and runs the table kernel again)
    else:
        buf, at = into
    if poison is None:
        poison = (buf.data_ptr() + at, 0)
    elif isinstance(poison, torch.Tensor):
        poison = (_launch.ptr(poison, 4), poison.numel())
    splits_addr = _launch.ptr(splits, splits.element_size())
    layout = device_layout(buf, num_groups, m_rows, at)
    if defer and m_rows > 0 and num_groups <= DEFERRED_TABLES_MAX_GROUPS:
        dtype = "int64" if splits.dtype == torch.int64 else "int32"
        # the splits tensor rides along: a contiguous copy made here must live until the launch
        layout.pending_tables = (dtype, (splits_addr, buf.data_ptr() + at, *poison), splits)
        return layout
    spec = GroupTablesSpec(
        arch=_launch.device_arch(device), splits_int64=splits.dtype == torch.int64
    )
    _launch.run(
        spec,
        splits_addr,
        num_groups,
        m_rows,
        layout.tables_addr(),
        buf.data_ptr() + at,
        *poison,
        stream=_launch.raw_stream(device),
    )
    sync_check(layout)
    return layout


def sync_check(layout: GroupLayout) -> None:
    """With ``CUTEQUANT_SYNC_CHECKS=1``: raise now if the device-split call's tables (just
    launched) flagged bad splits (synchronizes)."""
    if os.environ.get("CUTEQUANT_SYNC_CHECKS", "0") == "1":
        replay.taint()  # a replay would not check
        layout.check()


def _device_tables_at(num_groups: int) -> int:
    """int32 offset of the tables in a device-split call's buffer (after the G + 2 snapshot
    words, on a 16-byte boundary)."""
    return -(-(num_groups + 2) // 4) * 4


def device_tables_words(num_groups: int) -> int:
    """int32 words of a device-split call's snapshot and tables (``_device_groups``)."""
    return _device_tables_at(num_groups) + 4 * (num_groups + 1)


def device_layout(buf: torch.Tensor, num_groups: int, m_rows: int, at: int = 0) -> GroupLayout:
    """The layout of a device-split call whose table kernel writes ``buf`` from byte ``at`` on
    (``_device_groups``; a replay's fresh buffer or outputs allocation)."""
    tables_offset = at + 4 * _device_tables_at(num_groups)
    return GroupLayout(num_groups, m_rows, buf, None, tables_offset=tables_offset, snapshot_at=at)


_OFFSET_CACHE: collections.OrderedDict = collections.OrderedDict()


def byte_offsets(layout: GroupLayout, n_cols: int, device=None) -> torch.Tensor:
    """int64 [4, G + 1] device tensor: byte offset of every group's block in the NVFP4
    (row_data, row_scales, col_data, col_scales) buffers (last column = total bytes)."""
    cp = -(-(n_cols // 16) // 4) * 4
    np_ = -(-n_cols // 128) * 128
    return _offsets(layout, (0, 2, 0, 3), (n_cols // 2, cp, n_cols // 2, np_), device)


def element_offsets(layout: GroupLayout, n_cols: int, device=None) -> torch.Tensor:
    """int64 [2, G + 1] device tensor: element offset of every group's block in the FP8
    (row_data, col_data) buffers (both row_start * N)."""
    return _offsets(layout, (0, 0), (n_cols, n_cols), device)


def _offsets(layout: GroupLayout, rows, mult, device=None) -> torch.Tensor:
    """tables[rows] * mult as int64 on the device: from a per-(splits, N) host cache for host
    splits (no launch), else computed on the device from the call's tables."""
    if device is None:
        device = layout.tables.device
    if layout.host_splits is not None:
        key = (layout.host_splits, rows, mult, device.index)
        with _LOCK:
            out = _OFFSET_CACHE.get(key)
        if out is None:
            t = host_tables(layout.host_splits).to(torch.int64)[list(rows)]
            out = t * torch.tensor(mult, dtype=torch.int64)[:, None]
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return _upload(out, device)  # in the graph's pool: not cached
            out = persistent(device, lambda: _upload(out, device))
            with _LOCK:
                _OFFSET_CACHE[key] = out
                while len(_OFFSET_CACHE) > _HOST_CACHE_SIZE:
                    _retire(_OFFSET_CACHE.popitem(last=False)[1])
        return out
    # device splits: from this call's row starts (a result built while torch.compile traced
    # has those but no tables)
    t = _tables_from_starts(layout.snapshot[: layout.num_groups + 1])[list(rows)]
    return t * torch.tensor(mult, dtype=torch.int64, device=t.device)[:, None]


def _tables_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """int64 [4, G + 1] ``host_tables`` computed on the device from int32 row starts [G + 1]."""
    s = starts.to(torch.int64)
    m = s.diff()
    counts = torch.stack(
        [m, (m + TILE_ROWS - 1) // TILE_ROWS, (m + 127) // 128 * 128, (m // 16 + 3) // 4 * 4]
    )
    out = torch.zeros(4, s.numel(), dtype=torch.int64, device=s.device)
    out[:, 1:] = counts.cumsum(dim=1)
    return out


_DUMMIES: dict = {}


def dummy_buffer(device: torch.device) -> torch.Tensor:
    """A 16-byte-aligned placeholder for the pointers of disabled outputs (never written)."""
    buf = _DUMMIES.get(device.index)
    if buf is None:
        buf = _DUMMIES[device.index] = persistent(
            device, lambda: torch.zeros(64, dtype=torch.uint8, device=device)
        )
    return buf
