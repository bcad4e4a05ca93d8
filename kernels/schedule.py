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
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

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
):
    """TMA producer (one thread): stream the tiles [t_begin, t_end) into the ``pipe`` ring.

    ``tma_x`` views x hidden-major (N, M); a tile is (tile_cols, TILE_ROWS) at column
    ``col_tile * tile_cols`` and at the row where its group's row tile starts (not a multiple of
    the tile height: groups start anywhere), hence the domain offset. Rows past the group's end
    are loaded too (they belong to the next group or are zero-filled past M) and are masked by
    the consumers.
    """
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, pipe.num_stages)
    row_tile = t_begin // col_tiles
    col_tile = t_begin - row_tile * col_tiles
    g = find_group(tables, num_groups, row_tile)
    next_start = tables[ROWTILE_START, g + 1]
    for _ in range(t_begin, t_end):
        while row_tile >= next_start:
            g += 1
            next_start = tables[ROWTILE_START, g + 1]
        row0 = tables[ROW_START, g] + (row_tile - tables[ROWTILE_START, g]) * TILE_ROWS
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
        cute.copy(
            tma_atom,
            t_gmem,
            t_smem[(None, state.index)],
            tma_bar_ptr=pipe.producer_get_barrier(state),
        )
        pipe.producer_commit(state)
        state.advance()
        col_tile += 1
        if col_tile == col_tiles:
            col_tile = Int32(0)
            row_tile += 1
    pipe.producer_tail(state)
