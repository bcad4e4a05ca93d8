"""Persistent grouped tile scheduling shared by every grouped kernel.

The runtime builds, per call, an int32 table ``tables[4, G + 1]`` on the device
(``cutequant.tables``):

* ``tables[ROW_START, g]``      first row of group g (exclusive prefix sum of the splits),
* ``tables[ROWTILE_START, g]``  first 64-row tile of group g (prefix sum of ceil(split / 64)),
* ``tables[ROWSCALE_START, g]`` first row of group g's rowwise NVFP4 scales
  (prefix sum of roundup(split, 128)),
* ``tables[COLSCALE_START, g]`` first column of group g's columnwise NVFP4 scales
  (prefix sum of roundup(split / 16, 4)).

A tile is (64 rows of one group) x (``tile_cols`` columns). Tiles are numbered row-tile major
(all column tiles of a row band are consecutive) and each CTA takes one contiguous range of
that numbering: the group of its first tile is found once by binary search, later tiles only
step forward. Neither the group count nor any split size is a compile-time constant.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

ROW_START = 0
ROWTILE_START = 1
ROWSCALE_START = 2
COLSCALE_START = 3
TABLE_ROWS = 4
TILE_ROWS = 64  # rows per grouped tile: every split is a multiple of 16, so a tile holds 1-4 blocks


@cute.jit
def cta_tile_range(total: Int32):
    """[begin, end) of the linear tiles this CTA owns (balanced contiguous ranges)."""
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    per_cta = (total + gdim - 1) // gdim
    begin = cutlass.min(bidx * per_cta, total)
    end = cutlass.min(begin + per_cta, total)
    return begin, end


@cute.jit
def find_group(tables: cute.Tensor, num_groups: Int32, row_tile: Int32) -> Int32:
    """Largest g < G with tables[ROWTILE_START, g] <= row_tile (skips zero-token groups)."""
    lo = Int32(0)
    hi = num_groups - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if tables[ROWTILE_START, mid] <= row_tile:
            lo = mid
        else:
            hi = mid - 1
    return lo
