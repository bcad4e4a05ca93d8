"""Device code of the one-CTA-per-tile FP8 cast (``templates/fp8_tile_cast.py.j2``): finding a
64-token tile, loading it with 16-byte loads, the rowwise stores, the transposed stores through
a padded shared tile (with the 16-tokens-back rows of groups with M_g % 32 == 16), the tile's
|max| (the delayed cast's amax, the fused current-scaling cast's amax tiles).

A CTA of ``2 * tile_cols`` threads covers a 64-token x ``tile_cols``-column tile; thread
(t, c) owns tokens 4t .. 4t + 3 and columns 8c .. 8c + 7. Shared tile: per column of x one row
of ``PITCH`` words: ``SHIFT_WORDS`` words of the previous tile's last 16 tokens (shifted rows),
the tile's 64 tokens, one word of padding (fewer bank conflicts).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from cutequant.kernels import device as dev
from cutequant.kernels import schedule as sched

TILE_ROWS = sched.TILE_ROWS
SHIFT_WORDS = 4  # the previous tile's last 16 tokens, for output rows stored 16 tokens back
PITCH = SHIFT_WORDS + TILE_ROWS // 4 + 1  # words per transposed row in shared memory


@cute.jit
def locate_tile(
    tables: cute.Tensor, num_groups: Int32, col_tiles: Int32, row_tiles: Int32, t: Int32
):
    """(1 if tile ``t`` exists else 0, its group, the group's first row, the group's rows, the
    row tile within the group, the column tile). Host splits: one 16-byte load of the row
    tile's record, stored after the tables (``groups.host_tile_records``); device splits: a
    binary search over the groups (log2 G dependent loads before the first load of x)."""
    live = Int32(0)
    g = Int32(0)
    row0 = Int32(0)
    group_rows = Int32(0)
    tile_local = Int32(0)
    col_tile = Int32(0)
    if t < sched.total_tiles(tables, num_groups, col_tiles, row_tiles):
        live = Int32(1)
        if row_tiles >= 0:
            row_tile = t // col_tiles
            col_tile = t - row_tile * col_tiles
            records = tables.iterator.toint() + Int64(16) * Int64(num_groups + 1)
            rec = dev.load_global_v4(records + Int64(16) * Int64(row_tile))
            g = Int32(rec[0])
            row0 = Int32(rec[1])
            group_rows = Int32(rec[2])
            tile_local = Int32(rec[3])
        else:
            g, col_tile, row_tile, _, _, _ = sched.first_tile(tables, num_groups, col_tiles, t, 1)
            row0 = tables[sched.ROW_START, g]
            group_rows = tables[sched.ROW_START, g + 1] - row0
            tile_local = row_tile - tables[sched.ROWTILE_START, g]
    return live, g, row0, group_rows, tile_local, col_tile


def place(where, tile_cols: int):
    """This thread's view of a located tile (``locate_tile``'s tuple): (live, group, group's
    first row, group's rows, tile within the group, tokens left in the group from the tile on,
    shifted rows?, t, c, the tile's first column, the thread's first column, the tile's first
    row of x)."""
    live_tile, g, row0, group_rows, tile_local, col_tile = where
    tidx, _, _ = cute.arch.thread_idx()
    pieces = tile_cols // 8  # 16-byte input pieces per token row of a tile
    t = tidx // pieces
    c = tidx % pieces
    col0 = col_tile * tile_cols
    return (
        live_tile != 0,
        g,
        row0,
        group_rows,
        tile_local,
        group_rows - tile_local * TILE_ROWS,
        group_rows % 32 == 16,  # odd output rows start mid-sector
        t,
        c,
        col0,
        col0 + 8 * c,
        Int64(row0 + tile_local * TILE_ROWS),
    )


@cute.jit
def load_tile(x: Int64, spot, n_cols: Int32, with_prev: cutlass.Constexpr):
    """This thread's 4 tokens x 16 bytes of the tile (zeros outside the group or x) and, with
    ``with_prev`` on a shifted group's later tile, 16 bytes of token t - 16, one of the previous
    row tile's last 16 tokens (the shifted rows' first piece, an L2 hit)."""
    live, _, _, _, tile_local, rows_left, shifted, t, _, _, col, tile_row = spot
    x_words = [[Uint32(0)] * 4 for _ in range(4)]
    prev_words = [Uint32(0)] * 4
    if live:
        for i in cutlass.range_constexpr(4):
            if 4 * t + i < rows_left and col < n_cols:
                off = (tile_row + Int64(4 * t + i)) * Int64(n_cols) + Int64(col)
                x_words[i] = dev.load_global_v4(x + off * 2)
        if cutlass.const_expr(with_prev):
            if shifted and tile_local > 0 and col < n_cols:
                off = (tile_row + Int64(t - 16)) * Int64(n_cols) + Int64(col)
                prev_words = dev.load_global_v4(x + off * 2)
    return x_words, prev_words


def tile_absmax(acc: Uint32, x_words, in_dtype: str) -> Uint32:
    """``acc`` folded with the packed 16-bit |max| of the thread's tokens' words (``load_tile``'s
    list of 4-word lists; masked ones are zeros); NaN-propagating, sign bits garbage."""
    op = dev.bf16x2_absmax if in_dtype == "bf16" else dev.f16x2_absmax
    for i in range(len(x_words)):
        for j in range(4):
            acc = op(acc, x_words[i][j])
    return acc


def packed_absmax(acc: Uint32, in_dtype: str) -> Float32:
    """The larger half of a packed |max| as a non-negative fp32 (NaN stays NaN)."""
    if in_dtype == "bf16":
        return dev.bf16x2_pair_absmax(acc)
    return dev.f16x2_pair_absmax(acc)


def fp8x8(words, s: Float32, in_dtype: str, fp8_dtype: str):
    """16 bytes of input (8 values) times the scale -> two words of fp8 bytes."""
    f = [dev.half_to_f32(words, e, in_dtype) for e in range(8)]
    return dev.fp8x4(f[0:4], s, fp8_dtype), dev.fp8x4(f[4:8], s, fp8_dtype)


@cute.jit
def stage_tile(
    sbase: Int32,
    row_data: Int64,
    x_words,
    prev_words,
    s: Float32,
    spot,
    n_cols: Int32,
    in_dtype: cutlass.Constexpr,
    fp8_dtype: cutlass.Constexpr,
    with_absmax: cutlass.Constexpr,
):
    """Cast the thread's values: each token's 8 bytes to the rowwise output (one 8-byte store),
    the 4 tokens of each of its 8 columns as one word into the shared tile, and on a shifted
    group's later tile the previous tile's token t - 16 (one byte per column). Returns the
    values' packed |max| (``tile_absmax``) with ``with_absmax``, else 0 (folded token by
    token, after each token's cast: fewer registers live than before the casts)."""
    _, _, _, _, tile_local, rows_left, shifted, t, c, _, col, tile_row = spot
    acc = Uint32(0)
    tok_words = []  # per token: 2 words of 4 fp8 bytes (columns 8c .. 8c + 7)
    for i in cutlass.range_constexpr(4):
        pair = fp8x8(x_words[i], s, in_dtype, fp8_dtype)
        if 4 * t + i < rows_left and col < n_cols:
            off = (tile_row + Int64(4 * t + i)) * Int64(n_cols) + Int64(col)
            dev.st_global_v2(row_data + off, pair[0], pair[1])
        if cutlass.const_expr(with_absmax):
            acc = tile_absmax(acc, [x_words[i]], in_dtype)
        tok_words.append(pair)
    put_tokens(sbase, tok_words, c, SHIFT_WORDS + t)
    if shifted and tile_local > 0:
        prev = fp8x8(prev_words, s, in_dtype, fp8_dtype)
        for e in cutlass.range_constexpr(8):  # token t - 16 of column 8c + e: one byte
            byte = prev[e // 4] >> Uint32(8 * (e % 4))
            dev.store_shared_b8(sbase + ((8 * c + e) * PITCH) * 4 + t, byte)
    return acc


@cute.jit
def put_tokens(sbase: Int32, tok_words, c: Int32, word: Int32):
    """Four tokens' fp8 bytes of columns 8c .. 8c + 7 as one word per column, at word ``word``
    of each column's shared row."""
    for e in cutlass.range_constexpr(8):
        # column 8c + e: byte e % 4 of word e // 4 of the four tokens
        b = [tok_words[i][e // 4] for i in range(4)]
        sel = e % 4
        lo = dev.prmt(b[0], b[1], sel | ((4 + sel) << 4))
        hi = dev.prmt(b[2], b[3], sel | ((4 + sel) << 4))
        dev.store_shared_b32(sbase + ((8 * c + e) * PITCH + word) * 4, dev.prmt(lo, hi, 0x5410))


@cute.jit
def store_transposed(
    sbase: Int32, col_data: Int64, spot, n_cols: Int32, threads: cutlass.Constexpr
):
    """After a CTA barrier behind ``stage_tile``: each thread stores two 16-byte pieces of
    transposed output rows (4 threads cover a row's 64 bytes; group g an [N, M_g] block at
    row0 * N). A shifted group's odd rows go 16 tokens back, so that every piece pair is a whole
    32-byte sector."""
    tidx, _, _ = cute.arch.thread_idx()
    _, _, row0, group_rows, tile_local, rows_left, shifted, _, _, col0, _, _ = spot
    base = col_data + Int64(row0) * Int64(n_cols)
    group_tok0 = tile_local * TILE_ROWS  # the tile's first token within the group
    for p in cutlass.range_constexpr(2):
        idx = tidx + threads * p
        r = idx // 4  # transposed row (column of x) within the tile
        k = idx % 4  # its 16-token piece
        slot = k + 1  # piece k of the tile, or (shifted rows) tokens 16k - 16 .. 16k - 1:
        if shifted and r % 2 == 1:  # a shifted group's last tile has 16 or 48 tokens, so
            slot = k  # its pieces end within the 4 stored here
        tok0 = 16 * slot - 16
        word0 = r * PITCH + 4 * slot
        words = [dev.load_shared_b32(sbase + (word0 + q) * 4) for q in range(4)]
        ok = col0 + r < n_cols and tok0 < rows_left and (tok0 >= 0 or tile_local > 0)
        if ok:
            addr = base + Int64(col0 + r) * Int64(group_rows) + Int64(group_tok0 + tok0)
            dev.st_global_v4(addr, *words)


@cute.jit
def cta_absmax(acc: Uint32, wbase: Int32, in_dtype: cutlass.Constexpr, threads: cutlass.Constexpr):
    """The CTA's |max| (>= 0, or NaN) of every thread's packed |max| ``acc``, valid in thread 0:
    a warp butterfly, one shared word per warp (``wbase``), one CTA barrier."""
    tidx, _, _ = cute.arch.thread_idx()
    warp_max = dev.warp_absmax(packed_absmax(acc, in_dtype))
    if tidx % 32 == 0:
        dev.store_shared_b32(wbase + (tidx // 32) * 4, dev.f32_bits(warp_max))
    cute.arch.barrier()
    m = Float32(0.0)
    if tidx == 0:
        m = dev.bits_f32(dev.load_shared_b32(wbase))
        for wi in cutlass.range_constexpr(1, threads // 32):
            m = dev.absmax(m, dev.bits_f32(dev.load_shared_b32(wbase + 4 * wi)))
    return m
