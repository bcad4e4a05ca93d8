"""The grouped lookup tables (kernels/schedule.py) built on the device from device split sizes.

One warp scans ``splits[G]`` in chunks of 32 and writes ``tables[4, G + 1]`` (row, 64-row
tile, rowwise-scale-row and columnwise-scale-column prefix sums) and, when it leads, the
``snapshot[G + 2]`` (the row starts, then the status: 0 when every split is a non-negative
multiple of 16 and they sum to ``m_rows``, else 1) and the NaN poison of the call's amax outputs
on bad splits. On bad splits the tile total is 0, so every grouped kernel that reads these
tables writes nothing.

Two users: the table kernel (``group_tables.py.j2``: one warp, the leader) and the amax pass
with ``device_splits`` (``group_amax.py.j2``), where one warp of *every* CTA builds the tables
at the kernel's head, the same values into the same words, and CTA 0 leads. Each CTA then reads
back what its own warp wrote (visible to the CTA after a CTA-wide barrier), so no CTA waits for
another and the call needs no table kernel: one launch (~4.5 us of host time) less.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from cutequant.kernels import schedule as sched

INT32_MAX = 2**31 - 1


@cute.jit
def warp_inclusive_sum(v: Int32, lane: Int32) -> Int32:
    for i in cutlass.range_constexpr(5):
        up = cute.arch.shuffle_sync_up(v, offset=1 << i)
        if lane >= (1 << i):
            v = v + up
    return v


@cute.jit
def build_tables(
    splits: cute.Tensor,
    tables: cute.Tensor,
    snapshot: cute.Tensor,
    poison: cute.Tensor,
    num_groups: Int32,
    m_rows: Int32,
    lead: Int32,
):
    """Run by one whole warp (see the module docstring). ``lead`` != 0: also write the snapshot
    and, on bad splits, the poison (one warp of the grid must lead)."""
    lane = cute.arch.lane_idx()
    rows = Int32(0)
    row_tiles = Int32(0)
    scale_rows = Int32(0)
    scale_cols = Int32(0)
    bad = Int32(0)
    for base in range(0, num_groups, 32):
        g = base + lane
        raw = Int64(0)
        if g < num_groups:
            raw = Int64(splits[g])
        if raw < 0 or raw > INT32_MAX:
            bad = Int32(1)
            raw = Int64(0)
        split = Int32(raw)
        if split % 16 != 0:
            bad = Int32(1)
        counts = (
            split,
            (split + sched.TILE_ROWS - 1) // sched.TILE_ROWS,
            (split + 127) // 128 * 128,
            (split // 16 + 3) // 4 * 4,
        )
        carries = (rows, row_tiles, scale_rows, scale_cols)
        totals = []
        for k in cutlass.range_constexpr(sched.TABLE_ROWS):
            inclusive = warp_inclusive_sum(counts[k], lane)
            if g < num_groups:
                start = carries[k] + inclusive - counts[k]
                tables[k, g] = start
                if k == sched.ROW_START and lead != 0:
                    snapshot[g] = start
            totals.append(carries[k] + cute.arch.shuffle_sync(inclusive, offset=31))
        rows, row_tiles, scale_rows, scale_cols = totals
    bad = Int32(cute.arch.vote_any_sync(bad != 0))
    if rows != m_rows:
        bad = Int32(1)
    if lane == 0:
        tables[sched.ROW_START, num_groups] = rows
        tables[sched.ROWTILE_START, num_groups] = row_tiles
        tables[sched.ROWSCALE_START, num_groups] = scale_rows
        tables[sched.COLSCALE_START, num_groups] = scale_cols
        if bad != 0:
            tables[sched.ROWTILE_START, num_groups] = Int32(0)
        if lead != 0:
            snapshot[num_groups] = rows
            snapshot[num_groups + 1] = bad
    if bad != 0 and lead != 0:
        for i in range(lane, cute.size(poison), 32):
            poison[i] = Float32(float("nan"))
