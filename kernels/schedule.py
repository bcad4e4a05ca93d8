"""Persistent grouped tile scheduling shared by every grouped kernel.

The runtime builds, per call, an int32 table ``tables[4, G + 1]`` on the device
(``cutequant.tables``):

* ``tables[ROW_START, g]``      first row of group g (exclusive prefix sum of the splits),
* ``tables[ROWTILE_START, g]``  first 64-row tile of group g (prefix sum of ceil(split / 64)),
* ``tables[ROWSCALE_START, g]`` first row of group g's rowwise NVFP4 scales
  (prefix sum of roundup(split, 128)),
* ``tables[COLSCALE_START, g]`` first column of group g's columnwise NVFP4 scales
  (prefix sum of roundup(split / 16, 4)).

A tile is (64 rows of one group) x (``tile_cols`` columns). Tiles are numbered group by group;
inside a group, in bands of ``band`` row tiles: all tiles of band 0 (token-fastest inside the
band: its row tiles of column tile 0, then of column tile 1, ...), then band 1, ... The last band
of a group may be narrower. ``band = 1`` is the column-fastest order; ``band = WHOLE_GROUP`` is
token-fastest over the whole group. Each CTA takes one contiguous range of that numbering: the
group of its first tile is found once by binary search, later tiles only step forward.
``cta_runs`` can instead hand out the numbering in round-robin chunks (the FP8 cast).
Token-fastest bands make consecutive tiles of a CTA extend the same rows of the transposed
(columnwise) outputs, whose per-tile pieces are only 32-64 bytes of data and 2-4 bytes of compact
scales per row (measured 30-40% faster on grouped shapes than column-fastest for the quantize
kernels); column-fastest reads and writes whole rows of x and of the rowwise outputs, ~3% faster
for the read-only amax kernel and 13% for the rowwise-only quantize kernels.
An amax pass that runs right before a cast kernel (FP8 current scaling) walks like the cast and
shifts its ranges cyclically (``cta_tile_range(..., resident)``, ``wrap_at_end``), so that the
cast finds its first tiles in L2 (1-2% of the FP8 current-scaling call on an H200), when the
cast walks contiguous ranges (``TilePlan.chunk = 0``; the hand-off needs them): by default it
walks in round-robin chunks, and the amax pass takes its own walk.
Neither the group count nor any split size is compile-time.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

from cutequant.kernels import device as dev
from cutequant.kernels.pdl import EARLY_NONE, EARLY_TABLES, EARLY_X  # noqa: F401 (templates)

ROW_START = 0
ROWTILE_START = 1
ROWSCALE_START = 2
COLSCALE_START = 3
TABLE_ROWS = 4
TILE_ROWS = 64  # rows per grouped tile: every split is a multiple of 16, so a tile holds 1-4 blocks
WHOLE_GROUP = 1 << 26  # a walk band wider than any group (row tiles of an int32 row count: < 2^25)

# Programmatic dependent launch (PDL). Every kernel is launched with ``use_pdl`` (unless
# CUTEQUANT_PDL=0): it may start while the kernel before it on the stream is still finishing,
# so its launch and setup (shared-memory barriers, the TMA descriptor prefetch) overlap that
# kernel's tail, and it lets its own successor do the same. H200, two rounds each (perf/NOTES.md
# attempt 48): amax RHT dense 23.8 -> 22.7-23.2 us, FP8 cast 52-54 -> 51.7 us, FP8 current
# scaling 73.6 -> 72.8 us.
#
# A persistent grid has one CTA per SM (``ctas_per_sm``) and equal tile ranges per CTA. Without
# PDL a grid starts on an idle GPU and the hardware spreads its CTAs one per SM. With PDL the
# CTAs are placed while the previous kernel still runs, on whichever SMs have room first: an SM
# freed early took two CTAs of a small-footprint grid (the amax kernel, ~98 KB of shared
# memory) while others took none, and that SM then had twice the work (NVFP4 quantize + amax,
# 64 groups: 277 -> 288 us). So a persistent kernel asks for enough shared memory that
# ``ctas_per_sm + 1`` of its CTAs never fit on one SM.
SM90_SMEM_PER_SM = 228 * 1024  # shared memory of an H100 / H200 SM
SMEM_RESERVED_PER_CTA = 1024  # the system's share of every resident CTA


def persistent_smem_bytes(storage_bytes: int, ctas_per_sm: int) -> int:
    """Dynamic shared memory to launch a persistent kernel with: its storage (plus 1 KB of
    base-alignment slack) and at least enough that ``ctas_per_sm + 1`` CTAs exceed an SM."""
    crowd = ctas_per_sm + 1
    floor = SM90_SMEM_PER_SM // crowd - SMEM_RESERVED_PER_CTA + 1
    return max(storage_bytes + 1024, floor)


def launch_persistent(
    kernel_call,
    num_ctas,
    threads: int,
    storage,
    ctas_per_sm: int,
    pdl: bool,
    stream,
    one_cta_registers: bool = False,
):
    """Launch a persistent grouped kernel (``kernel_call``: the ``@cute.kernel`` applied to its
    arguments): ``num_ctas`` CTAs of ``threads`` threads, the shared memory of
    ``persistent_smem_bytes`` for its ``storage`` struct, programmatic dependent launch if
    ``pdl``. ``one_cta_registers``: tell ptxas one CTA per SM is enough (``.minnctapersm 1``).
    Left to its occupancy heuristic it sized the 384-thread NVFP4 rowwise kernel for three
    CTAs per SM (56 registers, 16 bytes of spills), although a persistent CTA has its SM."""
    kernel_call.launch(
        grid=[num_ctas, 1, 1],
        block=[threads, 1, 1],
        smem=persistent_smem_bytes(storage.size_in_bytes(), ctas_per_sm),
        stream=stream,
        use_pdl=pdl,
        min_blocks_per_mp=1 if one_cta_registers else 0,
    )


@cute.jit
def wait_prior_grids():
    """PDL: every thread of every CTA passes here before its first global-memory access, read
    or write. ``griddepcontrol.wait`` returns once the grids this one depends on have completed
    and flushed memory, so what follows sees every earlier result and writes nothing that an
    earlier kernel may still read. Every CTA waits, even one without tiles: a kernel's
    completion then implies its predecessors' (what the next kernel's wait relies on). The
    trigger right after lets the next PDL kernel launch as soon as SMs have room; its threads
    wait here in turn. Without a programmatic dependency both instructions do nothing."""
    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()


@cute.jit
def total_tiles(tables: cute.Tensor, num_groups: Int32, col_tiles: Int32, row_tiles: Int32):
    """All tiles of the call: ``row_tiles`` (the host's count of 64-row tiles, or -1: read from
    the tables) times ``col_tiles``."""
    total_rows = row_tiles
    if row_tiles < 0:
        total_rows = tables[ROWTILE_START, num_groups]
    return total_rows * col_tiles


@cute.jit
def cta_tile_range(
    tables: cute.Tensor, num_groups: Int32, col_tiles: Int32, row_tiles: Int32, resident=0
):
    """[begin, end) of the linear tiles this CTA owns (balanced contiguous ranges).

    ``resident`` > 0 (an amax pass right before a cast kernel with the same grid and walk):
    every range moves back by ``per_cta - resident`` tiles, cyclically, so that the last
    ``resident`` tiles this CTA reads are the first ones the cast kernel's CTA of the same index
    reads, while they are still in L2. The walk then goes begin, begin + 1, ... modulo the total
    (``wrap_at_end``), and ``end`` may exceed the total.

    ``row_tiles``: the total of 64-row tiles when the host knows it (host splits), else -1 (read
    from the tables): one dependent global load fewer before the first TMA load. (Per-CTA clock
    stamps put the first tile 2.6-3.0 us after the kernel start on an H200, with or without that
    load, so the tile's own latency dominates; it stays because it costs nothing.)
    """
    total = total_tiles(tables, num_groups, col_tiles, row_tiles)
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    per_cta = (total + gdim - 1) // gdim
    begin = cutlass.min(bidx * per_cta, total)
    end = cutlass.min(begin + per_cta, total)
    if resident > 0 and begin < end:
        shift = cutlass.max(per_cta - resident, 0)
        begin = begin - shift
        end = end - shift
        if begin < 0:
            begin += total
            end += total
    return begin, end


@cute.jit
def cta_runs(
    tables: cute.Tensor,
    num_groups: Int32,
    col_tiles: Int32,
    row_tiles: Int32,
    chunk: cutlass.Constexpr = 0,
):
    """This CTA's tiles as runs of consecutive linear tiles: (number of runs, ``runs``), with
    ``run_bounds(r, chunk, runs)`` = (first linear tile, length) of run r. A kernel walks each
    run with ``first_tile`` + ``normalize``; its tile loop is the same as for one range.

    ``chunk`` == 0: one run, the CTA's contiguous range (``cta_tile_range``).
    ``chunk`` > 0, round-robin chunks: in each round the grid takes ``grid * chunk``
    consecutive linear tiles, CTA b the b-th chunk of them (one run each); the tiles left after
    the full rounds (less than a round) are split into balanced contiguous ranges (one more
    run), so no CTA gets more than ``ceil(total / grid)`` tiles, as with contiguous ranges.

    Why (perf/NOTES.md attempt 54): with contiguous ranges the 132 CTAs stream from 132 places
    spread over x and the outputs at once; in rounds the grid sweeps a window of
    ``grid * chunk`` consecutive tiles. H200, FP8 cast with both outputs: 64 groups 168 -> 152
    us, 256 groups 170 -> 152 us, 16 groups of 7168 columns 292 -> 267 us, dense 8192x5120 52.0
    -> 50.7 us; rowwise only 3-6% faster. The per-run ``first_tile`` search is outside the tile
    loop: a per-tile "does a new chunk start here" step cost 2-4% on dense casts.
    """
    if cutlass.const_expr(chunk == 0):
        begin, end = cta_tile_range(tables, num_groups, col_tiles, row_tiles)
        num_runs = Int32(0)
        if begin < end:
            num_runs = Int32(1)
        return num_runs, (begin, end - begin, Int32(0))
    total = total_tiles(tables, num_groups, col_tiles, row_tiles)
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    rounds = total // (gdim * chunk)
    rem = total - rounds * gdim * chunk
    per = (rem + gdim - 1) // gdim
    tail_lo = cutlass.min(bidx * per, rem)
    tail_n = cutlass.min(tail_lo + per, rem) - tail_lo
    num_runs = rounds
    if tail_n > 0:
        num_runs = rounds + 1
    return num_runs, (rounds, rounds * gdim * chunk + tail_lo, tail_n)


def empty_walk_state():
    """Placeholder walk state (group, column tile, row tile, band range, group end) for the
    loop-carried variables of a run loop; every run sets its own with ``first_tile``."""
    return tuple(Int32(0) for _ in range(6))


@cute.jit
def run_bounds(r: Int32, chunk: cutlass.Constexpr, runs):
    """(first linear tile, length) of this CTA's run ``r`` (``cta_runs``)."""
    if cutlass.const_expr(chunk == 0):
        return runs[0], runs[1]
    rounds, tail_begin, tail_n = runs
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    first = (bidx + r * gdim) * chunk
    n = Int32(chunk)
    if r == rounds:
        first = tail_begin
        n = tail_n
    return first, n


@cute.jit
def enter_group(tables: cute.Tensor, g: Int32):
    """The first group with tokens at or after ``g`` and its row-tile range: (g, start, end)."""
    while tables[ROWTILE_START, g + 1] == tables[ROWTILE_START, g]:
        g += 1
    return g, tables[ROWTILE_START, g], tables[ROWTILE_START, g + 1]


@cute.jit
def wrap_at_end(
    tables: cute.Tensor,
    g: Int32,
    col_tile: Int32,
    row_tile: Int32,
    band_lo: Int32,
    band_hi: Int32,
    end: Int32,
    col_tiles: Int32,
    total_rows: Int32,
    band: cutlass.Constexpr,
):
    """After ``row_tile += 1`` on the very last tile (last column tile of the last band of the
    last group with tokens; ``total_rows`` = all row tiles): the walk state of tile 0. Any other
    state passes through unchanged (then ``normalize`` as usual). For shifted ranges only."""
    if row_tile == band_hi and band_hi == total_rows and col_tile == col_tiles - 1:
        g, band_lo, end = enter_group(tables, Int32(0))
        col_tile = Int32(0)
        band_hi = cutlass.min(band_lo + band, end)
        row_tile = band_lo
    return g, col_tile, row_tile, band_lo, band_hi, end


@cute.jit
def first_tile(
    tables: cute.Tensor,
    num_groups: Int32,
    col_tiles: Int32,
    t: Int32,
    band: cutlass.Constexpr,
):
    """Walk state (group, column tile, global row tile, band's first row tile, band's end, group's
    row-tile end) of linear tile ``t`` (binary search over groups; the largest match skips
    zero-token groups). The ranges ride along in registers so the per-tile step needs no global
    load."""
    lo = Int32(0)
    hi = num_groups - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if tables[ROWTILE_START, mid] * col_tiles <= t:
            lo = mid
        else:
            hi = mid - 1
    start = tables[ROWTILE_START, lo]
    end = tables[ROWTILE_START, lo + 1]
    local = t - start * col_tiles
    full_rows = (end - start) // band * band  # row tiles in the group's full bands
    band_lo = start + local // col_tiles // band * band
    band_hi = band_lo + band
    if local >= full_rows * col_tiles:  # the group's last, narrower band
        band_lo = start + full_rows
        band_hi = end
    width = band_hi - band_lo
    rem = local - (band_lo - start) * col_tiles
    col_tile = rem // width
    row_tile = band_lo + rem - col_tile * width
    return lo, col_tile, row_tile, band_lo, band_hi, end


@cute.jit
def normalize(
    tables: cute.Tensor,
    col_tiles: Int32,
    g: Int32,
    col_tile: Int32,
    row_tile: Int32,
    band_lo: Int32,
    band_hi: Int32,
    end: Int32,
    band: cutlass.Constexpr,
):
    """After ``row_tile += 1``: wrap to the band's next column tile, then to the next band, then
    to the next group with tokens (reloading its row-tile range). Only called when another tile
    exists, so it never walks past the last group."""
    if row_tile == band_hi:
        row_tile = band_lo
        col_tile += 1
        if col_tile == col_tiles:
            col_tile = Int32(0)
            band_lo = band_hi
            if band_lo == end:
                g, band_lo, end = enter_group(tables, g + 1)
            band_hi = cutlass.min(band_lo + band, end)
            row_tile = band_lo
    return g, col_tile, row_tile, band_lo, band_hi, end


@cute.jit
def produce_tiles(
    pipe,
    tma_atom: cute.CopyAtom,
    tma_x: cute.Tensor,
    sx: cute.Tensor,
    tables: cute.Tensor,
    num_groups: Int32,
    col_tiles: Int32,
    t_begin: Int32,
    t_end: Int32,
    tile_cols: cutlass.Constexpr,
    band: cutlass.Constexpr,
    evict_first: cutlass.Constexpr = False,
    resident: Int32 = None,
    early: Int32 = None,
    chunk: cutlass.Constexpr = 0,
    runs=None,
):
    """TMA producer (one thread): stream the tiles [t_begin, t_end) into the ``pipe`` ring, or,
    given ``runs`` = ``cta_runs(..., chunk)`` (then t_begin and t_end are unused), its runs.
    ``evict_first``: load x with the L2 evict_first hint (x is read once by the kernel).
    ``resident`` (given for ranges shifted by ``cta_tile_range(..., resident)``): the range may
    pass the last tile and continue at tile 0, and its last ``resident`` tiles, which the next
    kernel reads first, are loaded with the L2 evict_last hint, so that its writes evict them last.
    ``early``: the runtime's ``EARLY_*`` level (None or ``EARLY_NONE``: the producer waited with
    every other thread, at the kernel's start); with ``EARLY_TABLES`` or ``EARLY_X`` the kernel
    let its producer warp skip that wait. ``EARLY_TABLES``: it waits after the first tile's
    table lookups, right before its first load. ``EARLY_X`` (a cast kernel launched right after
    the same call's amax pass over the same x): the first ring's worth of tiles is loaded before
    waiting. Safe: this grid launches only after every CTA of the amax pass has triggered, each
    after its own wait, i.e. after every kernel before the amax pass (x's producer included)
    completed and flushed. Only loads of x and of the tables (both written before the amax
    pass) move ahead; the amax values and every store still wait. The first tiles then arrive
    while the amax pass finishes on other SMs instead of after it.

    ``tma_x`` views x hidden-major (N, M); a tile is (tile_cols, TILE_ROWS) at column
    ``col_tile * tile_cols`` and at the row where its group's row tile starts (not a multiple of
    the tile height: groups start anywhere), hence the domain offset. Rows past the group's end
    are loaded too (they belong to the next group or are zero-filled past M) and are masked by
    the consumers.
    """
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, pipe.num_stages)
    walk = (tma_atom, tma_x, sx, tables, num_groups, col_tiles, tile_cols, band, evict_first)
    produced = Int32(0)
    if cutlass.const_expr(runs is None):
        state, produced = produce_run(pipe, state, walk, t_begin, t_end, produced, resident, early)
    else:
        num_runs, bounds = runs
        for r in range(num_runs):
            first, n = run_bounds(r, chunk, bounds)
            state, produced = produce_run(
                pipe, state, walk, first, first + n, produced, None, early
            )
    if cutlass.const_expr(early is not None):
        if early == EARLY_X and produced < pipe.num_stages:
            wait_prior_grids()
    pipe.producer_tail(state)


@cute.jit
def produce_run(pipe, state, walk, t_begin: Int32, t_end: Int32, produced: Int32, resident, early):
    """``produce_tiles`` for one run of consecutive linear tiles [t_begin, t_end); ``produced``:
    tiles loaded before it (for the early waits). Returns (pipeline state, tiles loaded)."""
    tma_atom, tma_x, sx, tables, num_groups, col_tiles, tile_cols, band, evict_first = walk
    cache_policy = dev.l2_evict_first_policy() if evict_first else None
    g, col_tile, row_tile, band_lo, band_hi, end = first_tile(
        tables, num_groups, col_tiles, t_begin, band
    )
    row0_g = tables[ROW_START, g]
    start = tables[ROWTILE_START, g]
    wrap = resident is not None
    total_rows = tables[ROWTILE_START, num_groups] if wrap else None
    keep_policy = dev.l2_evict_last_policy() if wrap else None
    if cutlass.const_expr(early is not None):
        if early == EARLY_TABLES and produced == 0:
            wait_prior_grids()  # the first tile's lookups above ran before it
    for t in range(t_begin, t_end):
        g_prev = g
        if wrap:
            g, col_tile, row_tile, band_lo, band_hi, end = wrap_at_end(
                tables, g, col_tile, row_tile, band_lo, band_hi, end, col_tiles, total_rows, band
            )
        g, col_tile, row_tile, band_lo, band_hi, end = normalize(
            tables, col_tiles, g, col_tile, row_tile, band_lo, band_hi, end, band
        )
        if g != g_prev:
            row0_g = tables[ROW_START, g]
            start = tables[ROWTILE_START, g]
        row0 = row0_g + (row_tile - start) * TILE_ROWS
        g_tile = cute.local_tile(
            cute.domain_offset((0, row0), tma_x), (tile_cols, TILE_ROWS), (col_tile, 0)
        )
        t_smem, t_gmem = cpasync.tma_partition(
            tma_atom,
            0,
            cute.make_layout(1),
            cute.group_modes(sx, 0, 2),
            cute.group_modes(g_tile, 0, 2),
        )
        pipe.producer_acquire(state)
        if wrap and t >= t_end - resident:
            tma_load(tma_atom, t_gmem, t_smem[(None, state.index)], pipe, state, keep_policy)
        else:
            tma_load(tma_atom, t_gmem, t_smem[(None, state.index)], pipe, state, cache_policy)
        pipe.producer_commit(state)
        state.advance()
        row_tile += 1
        if cutlass.const_expr(early is not None):
            if early == EARLY_X and produced + (t - t_begin) == pipe.num_stages - 1:
                wait_prior_grids()
    return state, produced + (t_end - t_begin)


def tma_load(tma_atom: cute.CopyAtom, src: cute.Tensor, dst: cute.Tensor, pipe, state, policy):
    """One TMA tile load into ``state``'s stage, with an L2 cache-hint policy unless None."""
    kwargs = {} if policy is None else {"cache_policy": policy}
    cute.copy(tma_atom, src, dst, tma_bar_ptr=pipe.producer_get_barrier(state), **kwargs)


# ------------------------------------------------------------------------------ expert tiles
# The 2D weight kernel (nvfp4_quantize_2d.py.j2) numbers the tiles of E same-shaped experts
# item = (e * row_tiles + rt) * col_tiles + ct and walks each CTA's contiguous range forward
# (quantize) or backward (amax). Plain integer arithmetic: the kernel calls ``expert_tile`` on
# Int32 values once per phase; its loops step with the same ``if`` ladders as
# ``next_expert_tile`` / ``prev_expert_tile`` written inline (a branch-free select form, and a
# row-tile count held in a register, each cost spills at the 64-register cap of some variants:
# 7-41 LDL/STL, static), and tests/test_expert_tile_walk.py runs these on Python ints against
# the divisions.


def expert_tile(item, col_tiles, per_expert):
    """(expert, row tile, column tile) of work item ``item`` (two divisions, ~40 instructions
    each with a run-time divisor)."""
    e = item // per_expert
    rem = item - e * per_expert
    rt = rem // col_tiles
    return e, rt, rem - rt * col_tiles


def next_expert_tile(e, rt, ct, col_tiles, rows, tile_rows):
    """(e, rt, ct) of the item after (e, rt, ct), without a division (``rows``: each expert's;
    its row tiles are ``tile_rows`` high: the last one starts below ``rows``)."""
    ct += 1
    if ct == col_tiles:
        ct = 0
        rt += 1
        if rt * tile_rows >= rows:
            rt = 0
            e += 1
    return e, rt, ct


def prev_expert_tile(e, rt, ct, col_tiles, rows, tile_rows):
    """(e, rt, ct) of the item before (e, rt, ct), without a division (a constant divisor only
    when it wraps to the previous expert)."""
    ct -= 1
    if ct < 0:
        ct = col_tiles - 1
        rt -= 1
        if rt < 0:
            rt = (rows - 1) // tile_rows
            e -= 1
    return e, rt, ct
