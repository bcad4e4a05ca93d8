"""CPU: the dequantize kernels' bit tricks and layouts, emulated instruction by instruction
(``kernels/dequant.py``, ``kernels/templates/dequantize.py.j2``; the GPU tests in
test_gpu_dequant.py check the outputs bit for bit):

* the e2m1 -> e4m3 decode (``e2m1x8_to_e4m3``: PRMT LUT + sign PRMT + LOP3), every 16-bit half;
* the columnwise staging tile: ``stmatrix.x4.trans`` (16-bit outputs) or STS.32 (fp32) stores
  of every lane land each (token, column) value on its own bytes, the 16-byte loads of the
  store-out read back output row pieces in order, and no shared phase has a bank conflict;
* the device-split warp search of ``find_tile`` against a linear scan;
* the columnwise tiles of every ``DequantizeSpec.col_tokens`` (64 / 128 / 256) over uneven
  groups: each lane's loads and each thread's output stores, emulated from the template's
  address formulas and ``find_tiles``' rules, read every data and scale byte once, write every
  output value once, in whole 32-byte sectors per warp instruction (but at a partial tile's
  end), and a tile reads 32 (NVFP4) / 64 (FP8) bytes per sub-tile of each column row,
  contiguous within a group.
"""

import collections
import random

import numpy as np
import pytest
import torch

from cutequant import dequant, jit
from cutequant.codegen import specs
from cutequant.kernels import dequant as dq

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): bytes 0-3 of ``a``, 4-7 of ``b``; selector nibble k picks
    output byte k, its bit 3 replicates the picked byte's sign bit."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def e2m1x8_to_e4m3(word: int) -> tuple[int, int]:
    """``dequant.e2m1x8_to_e4m3`` on Python ints, with the module's constants."""
    mag = word & 0x77777777
    w4 = (word << 4) & 0xFFFFFFFF
    lut = (dq.E2M1_AS_E4M3_LO, dq.E2M1_AS_E4M3_HI)
    lo = prmt(*lut, mag & 0xFFFF)
    hi = prmt(*lut, (mag >> 16) & 0xFFFF)
    lo |= prmt(w4, word, dq.E2M1_SIGN_SEL_LO) & 0x80808080
    hi |= prmt(w4, word, dq.E2M1_SIGN_SEL_HI) & 0x80808080
    return lo, hi


def test_e2m1_to_e4m3_every_half_word():
    """Every 4 codes in either half of the word (the other half random) decode to the e4m3
    bytes of their values, -0 included."""
    rng = random.Random(5)
    want = torch.tensor([(-1.0 if c & 8 else 1.0) * E2M1[c & 7] for c in range(16)])
    for half in (0, 1):
        got = []
        codes = []
        for v in range(1 << 16):
            other = rng.getrandbits(16)
            word = (v << 16 | other) if half else (other << 16 | v)
            lo, hi = e2m1x8_to_e4m3(word)
            e4m3 = hi if half else lo
            got += [(e4m3 >> (8 * k)) & 0xFF for k in range(4)]
            codes += [(v >> (4 * k)) & 0xF for k in range(4)]
        vals = torch.tensor(got, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        ref = want[torch.tensor(codes)]
        assert torch.equal(vals, ref)
        assert torch.equal(torch.signbit(vals), torch.signbit(ref))  # -0 for code 8


def _bank_ways(addrs, size: int) -> int:
    """Lane-ordered byte addresses of one warp access of ``size`` bytes each -> the worst bank
    multiplicity over its 128-byte phases (8 lanes per phase for 16 bytes, 32 for 4)."""
    per_phase = 128 // size
    worst = 0
    for p in range(0, len(addrs), per_phase):
        banks = collections.defaultdict(set)
        for a in addrs[p : p + per_phase]:
            for w in range(a // 4, (a + size) // 4):
                banks[w % 32].add(w)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


def _product(*ns):
    return [(a, b, c) for a in range(ns[0]) for b in range(ns[1]) for c in range(ns[2])]


def _stage_stores(m, elem: int, subtiles) -> dict:
    """Byte offset -> (token of the tile, column) of every staging store of the sub-tiles
    ``subtiles`` of one tile (one staging round: all of them, or one with the sub-tile ring),
    checking bank conflicts and that no byte is written twice."""
    owner = {}

    def put(addr, token, col):
        for b in range(elem):
            assert addr + b not in owner, "two stores share a byte"
            owner[addr + b] = (token, col)

    for warp, k, b in _product(m.THREADS // 32, m.GROUPS_PER_WARP, m.SUBTILES):
        if b not in subtiles:
            continue
        kg = m.GROUPS_PER_WARP * warp + k  # 8-column group of the tile
        base = m.stage_base(b)  # the sub-tile's first shared row
        shift = m.SUB_ROWS * b - base  # shared row -> token of the tile
        if elem == 4:  # STS.32 of lane 4c + q, token 16q + i
            for i in range(16):
                addrs = []
                for lane in range(32):
                    c, q = lane // 4, lane % 4
                    token, col = base + 16 * q + i, 8 * kg + c
                    chunk = m.stage_chunk(token, col >> 2)
                    addrs.append(token * m.ROW_BYTES + 16 * chunk + 4 * (col & 3))
                    put(addrs[-1], token + shift, col)
                assert _bank_ways(addrs, 4) == 1
            continue
        for s in range(2):  # stmatrix.x4.trans
            tokens = [base + m.stsm_token(lane, s) for lane in range(32)]
            addrs = [t * m.ROW_BYTES + 16 * m.stage_chunk(t, kg) for t in tokens]
            for i in range(4):  # matrix i: rows from lanes 8i .. 8i + 7
                rows = addrs[8 * i : 8 * i + 8]
                assert _bank_ways(rows, 16) == 1
                for j, addr in enumerate(rows):
                    assert addr % 16 == 0
                    for r in range(8):  # stored element r: fragment (r, j)
                        lane = 4 * r + j // 2  # holds register i = tokens of 16q + 8s + 2i
                        c, q = lane // 4, lane % 4
                        token = base + 16 * q + 8 * s + 2 * i + j % 2
                        assert token == tokens[8 * i + j]
                        put(addr + 2 * r, token + shift, 8 * kg + c)
    return owner


# (col_tokens, col_ring): every tile length with the whole tile staged, 256 with the ring
LAYOUTS = [(t, 0) for t in specs.DEQUANT_COL_TOKENS] + [
    (256, r) for r in specs.DEQUANT_COL_RINGS[1:]
]


@pytest.mark.parametrize(("tokens", "ring"), LAYOUTS)
@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
def test_columnwise_staging_tile(out_dtype, tokens, ring):
    """Per staging round (the whole tile, or one sub-tile with the ring: sub-tile b in the
    ring's slot b % 2, after the barrier that followed every read of sub-tile b - 2), the
    stores fill the round's shared rows once, and the store-out reads back each output row's
    16-byte pieces, conflict-free."""
    spec = specs.DequantizeSpec(
        columnwise=True, out_dtype=out_dtype, col_tokens=tokens, col_ring=ring
    )
    m = jit.load_module(spec)
    assert m.TILE_ROWS == tokens and m.TILE_COLS * m.OUT_BYTES >= 128
    elem = m.OUT_BYTES
    rounds = [[b] for b in range(m.SUBTILES)] if ring else [list(range(m.SUBTILES))]
    assert m.STAGE_ROWS == (2 * m.SUB_ROWS if ring else m.TILE_ROWS)
    per_chunk = 16 // elem
    pass_rows = m.THREADS // m.CHUNKS
    seen = set()
    slots = []
    for subs in rounds:
        owner = _stage_stores(m, elem, subs)
        lo = m.stage_base(subs[0]) * m.ROW_BYTES
        slots.append(lo)
        assert len(owner) == len(subs) * m.SUB_ROWS * m.TILE_COLS * elem
        assert min(owner) == lo and max(owner) == lo + len(subs) * m.SUB_ROWS * m.ROW_BYTES - 1
        assert max(owner) < m.STAGE_ROWS * m.ROW_BYTES
        # store-out: thread tidx reads chunk tidx % CHUNKS of row tidx / CHUNKS + pass_rows * p
        for b in subs:
            for warp in range(m.THREADS // 32):
                for p in range(m.SUB_ROWS // pass_rows):
                    addrs = []
                    for lane in range(32):
                        tidx = 32 * warp + lane
                        ch = tidx & (m.CHUNKS - 1)
                        r = (tidx >> (m.CHUNKS.bit_length() - 1)) + pass_rows * p  # in sub-tile b
                        if ring:  # the template's ring formula: slot + r, chunk of r
                            addr = (m.stage_base(b) + r) * m.ROW_BYTES + 16 * m.stage_chunk(r, ch)
                        else:  # the whole tile's: row R of the tile
                            row = m.SUB_ROWS * b + r
                            addr = row * m.ROW_BYTES + 16 * m.stage_chunk(row, ch)
                        addrs.append(addr)
                        token = m.SUB_ROWS * b + r
                        for e in range(per_chunk):
                            assert owner[addr + elem * e] == (token, per_chunk * ch + e)
                        seen.add((token, ch))
                    assert _bank_ways(addrs, 16) == 1
    assert len(seen) == m.TILE_ROWS * m.CHUNKS
    # consecutive rounds use different slots (the round after next may reuse one)
    assert all(a != b for a, b in zip(slots, slots[1:], strict=False))


def _warp_search(starts: list, row_tile: int, ordered: bool = True):
    """``find_tile``'s device-split search, lane by lane: (group, lane k's table index, lane
    k + 1's). Every table index it reads is in [0, G], ordered tables or not."""
    g_count = len(starts) - 1

    def read(i):
        assert 0 <= i <= g_count
        return starts[i]

    lo, span = 0, g_count + 1
    while span > 31:
        stride = (span + 30) // 31
        ballot = [
            ln < 31 and ln * stride < span and read(lo + ln * stride) <= row_tile
            for ln in range(32)
        ]
        skip = max(sum(ballot) - 1, 0)
        # ordered: lane 0 re-reads the entry the last round chose, the hits are a prefix
        assert (ballot[0] and all(ballot[: skip + 1])) or not ordered
        lo += skip * stride
        span = min(stride, span - skip * stride)
    idx = [min(lo + ln, g_count) for ln in range(32)]
    ballot = [ln < span and read(idx[ln]) <= row_tile for ln in range(32)]
    k = max(sum(ballot) - 1, 0)
    assert k + 1 <= 31
    assert (ballot[0] and all(ballot[: k + 1])) or not ordered
    return lo + k, idx[k], idx[k + 1]


@pytest.mark.parametrize("groups", [1, 2, 30, 31, 32, 33, 300, 961, 962, 5000])
def test_device_split_search(groups):
    rng = random.Random(groups)
    tiles = [rng.choice([0, 0, 1, 2, 3, 7]) for _ in range(groups)]
    starts = [0]
    for t in tiles:
        starts.append(starts[-1] + t)
    total = starts[-1]
    probes = range(total + 3) if total < 3000 else rng.sample(range(total + 3), 3000)
    for row_tile in probes:
        g, at, after = _warp_search(starts, row_tile)
        if row_tile >= total:
            assert g == groups  # no tile: the CTA exits
            continue
        want = max(i for i in range(groups) if starts[i] <= row_tile)  # skips empty groups
        assert g == want and starts[g] <= row_tile < starts[g + 1]
        assert (at, after) == (g, g + 1)  # the row and scale starts come from these lanes


@pytest.mark.parametrize("groups", [5, 300, 5000])
def test_device_split_search_on_bad_tables(groups):
    """Bad device splits: the table kernel sets only the tile total (to 0), the other starts
    may be anything. The search reads only table entries and the kernel's tile test is
    row_tile < total, so no CTA has a tile."""
    rng = random.Random(groups)
    starts = [0] + [rng.randrange(0, 1000) for _ in range(groups - 1)] + [0]
    for row_tile in rng.sample(range(1200), 300):
        _warp_search(starts, row_tile, ordered=False)
        assert not row_tile < starts[-1]


def _find_tiles(splits: list, first: int, count: int, limit: int | None = None) -> list:
    """``dq.find_tiles`` with host splits: (group, first row, rows, tile within the group) of
    the 64-row tiles ``first`` .. ``first + count - 1``, by its rules (the next tile of the
    same group without a lookup; past the end, the previous group's next tile; ``limit``, a
    tail CTA's sub-tiles: tiles from ``limit`` on past their group's rows, rows / 64 + 1)."""
    tiles, row0 = [], 0
    for g, rows in enumerate(splits):
        tiles += [(g, row0, rows, t) for t in range(-(-rows // 64))]
        row0 += rows
    out = [tiles[first]]
    for j in range(1, count):
        g, row0, rows, tl = out[-1]
        nxt = (g, row0, rows, tl + 1)
        if limit is not None and j >= limit:
            nxt = (g, row0, rows, (rows >> 6) + 1)
        elif rows - 64 * tl <= 64 and first + j < len(tiles):
            nxt = tiles[first + j]
        out.append(nxt)
    return out


def _plan_ctas(row_tiles: int, col_tiles: int, sub: int, slots: int, waves=0.5, head=0.0):
    """(first 64-row tile, sub-tiles) of every row CTA of a 256-token columnwise kernel: 4 each,
    or with short CTAs (DequantizeSpec.col_tail, ``sub`` tiles each) the runtime's
    ``tail_plan`` and the template's mapping (head CTAs, full CTAs, tail CTAs)."""
    if not sub:
        return [(4 * r, 4) for r in range(-(-row_tiles // 4))]
    n_head, tail_from, row_ctas = dequant.tail_plan(row_tiles, col_tiles, slots, sub, waves, head)
    out = []
    for r in range(row_ctas):
        first, n = n_head * sub + (r - n_head) * 4, 4
        if r < n_head:
            first, n = r * sub, sub
        if r >= tail_from:
            first, n = n_head * sub + (tail_from - n_head) * 4 + (r - tail_from) * sub, sub
        out.append((first, n))
    return out


def test_tail_plan():
    """``dequant.tail_plan`` with the template's mapping: every row tile in exactly one CTA,
    full CTAs take runs of 4, short ones 1 or 2; about ``waves`` of a wave of full CTAs' work
    goes to the tail, about ``head`` waves of short CTAs to the head; nothing changes when the
    full CTAs are resident at once. (132 SMs x 8 CTAs: the dense bench case, 128 row tiles x 80
    column tiles, gets 28 row tiles of tail CTAs.)"""
    assert dequant.tail_plan(128, 80, 1056, 2) == (0, 25, 39)
    assert dequant.tail_plan(128, 80, 1056, 1) == (0, 25, 53)
    assert dequant.tail_plan(128, 80, 1056, 2, 0.5, 1.0) == (14, 14 + 18, 14 + 18 + 14)
    assert dequant.tail_plan(8, 80, 1056, 1) == (0, 2, 2)  # resident at once
    rng = random.Random(5)
    for _ in range(3000):
        rows, cols = rng.randint(1, 3000), rng.randint(1, 200)
        slots, sub = rng.choice([8, 100, 1056, 1064, 2112]), rng.choice([1, 2])
        waves, head = rng.choice([0.25, 0.5, 1.0]), rng.choice([0.0, 0.5, 1.0])
        ctas = _plan_ctas(rows, cols, sub, slots, waves, head)
        got = [t for first, n in ctas for t in range(first, first + n) if t < rows]
        assert got == list(range(rows)), (rows, cols, slots, sub, waves, head)
        n_head, tail_from, _ = dequant.tail_plan(rows, cols, slots, sub, waves, head)
        full = -(-rows // 4)
        if full * cols <= slots:
            assert ctas == [(4 * r, 4) for r in range(full)]
            continue
        tail_tiles = rows - n_head * sub - 4 * (tail_from - n_head)
        assert 4 * waves * slots <= tail_tiles * cols or tail_tiles + n_head * sub == rows
        assert (tail_tiles - 3) * cols < 4 * waves * slots + cols
        assert n_head * cols < head * slots + cols
        assert n_head * cols >= head * slots or tail_from == n_head  # capped: no full CTAs left


def _sectors_whole(addrs: list, size: int, partial_ok: bool) -> bool:
    """Whether the bytes of one warp instruction (``size`` bytes from each address) fill every
    32-byte sector they touch."""
    cover = collections.Counter()
    for a in addrs:
        for x in range(a, a + size):
            cover[x // 32] += 1
    return partial_ok or all(n == 32 for n in cover.values())


def _quad_transpose(words: list) -> list:
    """``dq.quad_transpose_bytes`` over one quad (lane q's word at index q), on Python ints."""
    x = [prmt(words[q], words[q ^ 1], dq.QUAD_SEL1[q & 1]) for q in range(4)]  # SHFL.BFLY 1 + PRMT
    return [prmt(x[q], x[q ^ 2], dq.QUAD_SEL2[(q >> 1) & 1]) for q in range(4)]


def test_quad_transpose_bytes():
    rng = random.Random(7)
    for _ in range(200):
        words = [rng.getrandbits(32) for _ in range(4)]
        got = _quad_transpose(words)
        for q in range(4):
            for b in range(4):
                assert (got[q] >> (8 * b)) & 0xFF == (words[b] >> (8 * q)) & 0xFF


@pytest.mark.parametrize(
    ("tokens", "ring", "words", "tail"),
    [(t, r, False, 0) for t, r in LAYOUTS]
    + [(256, 0, True, 0), (256, 8, True, 0)]
    + [(256, 8, w, t) for w in (False, True) for t in specs.DEQUANT_TAIL_SUBTILES],
)
@pytest.mark.parametrize(
    ("fmt", "out_dtype"), [("nvfp4", "bf16"), ("nvfp4", "f32"), ("e4m3", "f16"), ("e4m3", "f32")]
)
def test_columnwise_tiles_cover_groups(fmt, out_dtype, tokens, ring, words, tail):
    """Every lane's loads and every thread's stores of a columnwise dequantize (transposed
    back), emulated CTA by CTA from the template's address formulas over uneven groups (every
    M_g a multiple of 16, not of the tile's tokens; empty groups; N = 272: a partial column
    tile): each data and scale byte read once, each output value written once, whole 32-byte
    sectors per warp instruction except at a partial tile's end, and per tile and column row
    the sub-tiles of one group read one contiguous run. ``tail``: short CTAs of 1 or 2
    sub-tiles (DequantizeSpec.col_tail) by the runtime's plan for 24 slots, which gives 8-12
    of this case's 20 row tiles to tail CTAs, with 2 also 2-4 to head CTAs (some start inside
    a group, some cross a group's end)."""
    nvfp4 = fmt == "nvfp4"
    if words and not nvfp4:
        pytest.skip("scale words: NVFP4 only")
    spec = specs.DequantizeSpec(
        fmt=fmt,
        columnwise=True,
        out_dtype=out_dtype,
        col_tokens=tokens,
        col_ring=ring,
        col_scale_words=words,
        col_tail=bool(tail),
    )
    m = jit.load_module(spec)
    splits = [16, 48, 0, 64, 80, 144, 0, 256, 32, 208, 112, 16]
    n = 272
    rows_total = sum(splits)
    cg = [(r // 16 + 3) // 4 * 4 for r in splits]  # scale bytes per column row of each group
    scale_col0 = np.cumsum([0, *cg])
    data_reads = np.zeros(rows_total * n // (2 if nvfp4 else 1), np.int64)
    scale_reads = np.zeros((n + 127) // 128 * 128 * int(scale_col0[-1]), np.int64)
    writes = np.zeros((rows_total, n), np.int64)
    row_tiles = sum(-(-r // 64) for r in splits)
    load_bytes = 8 if nvfp4 else 16  # LDG.64 of 16 e2m1 codes / LDG.128 of 16 fp8 bytes
    sub = m.SUB_ROWS
    col_tiles = -(-n // m.TILE_COLS)
    if m.SUBTILES == 4:
        ctas = _plan_ctas(row_tiles, col_tiles, tail, slots=24, head=0.4 if tail == 2 else 0)
    else:
        ctas = [(m.SUBTILES * r, m.SUBTILES) for r in range(-(-row_tiles // m.SUBTILES))]
    assert not tail or any(n_sub == tail for _, n_sub in ctas)
    for col_tile in range(col_tiles):
        for first, n_sub in ctas:
            where = _find_tiles(splits, first, m.SUBTILES, n_sub if tail else None)
            left = [rows - sub * tl for _, _, rows, tl in where]
            assert all(x <= 0 for x in left[n_sub:])  # a tail CTA's other sub-tiles: nothing
            runs = collections.defaultdict(list)  # (group, column) -> bytes read by the tile
            # scale words: the tile's sub-tiles in one group; lane 4c + q's word (sub-tile q)
            one_group = words and len({w[0] for w in where}) == 1
            word_at = {}  # (warp, k, lane) -> the byte address of its scale word
            if one_group:
                g, _, rows, tl0 = where[0]
                for warp, k, lane in _product(m.THREADS // 32, m.GROUPS_PER_WARP, 32):
                    c, q = lane >> 2, lane & 3
                    col = col_tile * m.TILE_COLS + 8 * m.GROUPS_PER_WARP * warp + 8 * k + c
                    # the template's sub_q_live (tail CTAs: min(left, 64 * subtiles))
                    if col < n and min(left[0], sub * n_sub) > sub * q:
                        assert 4 * (tl0 + q) + 4 <= cg[g]  # inside the group's padded row
                        word_at[warp, k, lane] = (
                            (n + 127) // 128 * 128 * scale_col0[g] + col * cg[g] + 4 * (tl0 + q)
                        )
            for warp, k, b in _product(m.THREADS // 32, m.GROUPS_PER_WARP, m.SUBTILES):
                g, row0, rows, tl = where[b]
                addrs = []
                for lane in range(32):
                    c, q = lane >> 2, lane & 3
                    col = col_tile * m.TILE_COLS + 8 * m.GROUPS_PER_WARP * warp + 8 * k + c
                    if not (col < n and 16 * q < left[b]):
                        continue
                    tok = tl * sub + 16 * q
                    if nvfp4:
                        a = row0 * (n // 2) + col * (rows // 2) + tok // 2
                        want = (n + 127) // 128 * 128 * scale_col0[g] + col * cg[g] + tok // 16
                        if one_group:  # byte q of lane 4c + b's word, after the transpose
                            assert word_at[warp, k, (lane & ~3) | b] + q == want
                        scale_reads[want] += 1
                    else:
                        a = row0 * n + col * rows + tok
                    addrs.append(a)
                    data_reads[a : a + load_bytes] += 1
                    runs[g, col].append((a, a + load_bytes))
                # column rows start on sector boundaries when M_g (bytes) is a multiple of 32
                aligned = (rows // 2 if nvfp4 else rows) % 32 == 0
                assert _sectors_whole(addrs, load_bytes, partial_ok=left[b] < sub or not aligned)
            for pieces in runs.values():  # one contiguous run per group and column row
                pieces.sort()
                assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:], strict=False))
            if min(left) >= sub and len({w[0] for w in where}) == 1:
                # a whole tile in one group: 4 lanes x SUBTILES pieces of each column row, one run
                assert all(len(p) == 4 * m.SUBTILES for p in runs.values())
            # store-out: thread tidx, chunk ch of rows r0 + pass_rows * p of sub-tile b (the
            # whole tile's pass p is the ring's pass p of sub-tile b = pass_rows * p // sub)
            pass_rows = m.THREADS // m.CHUNKS
            per_chunk = 16 // m.OUT_BYTES
            for warp in range(m.THREADS // 32):
                for p in range(m.TILE_ROWS // pass_rows):
                    b = pass_rows * p // sub
                    g, row0, rows, tl = where[b]
                    addrs = []
                    for lane in range(32):
                        tidx = 32 * warp + lane
                        ch = tidx & (m.CHUNKS - 1)
                        r = (tidx >> (m.CHUNKS.bit_length() - 1)) + pass_rows * p
                        if ring:  # dst[b] + pass_step * p of the ring's pass p within sub-tile b
                            assert r - sub * b == (r & (sub - 1))
                        col = col_tile * m.TILE_COLS + ch * per_chunk
                        if not (r - sub * b < left[b] and col < n):
                            continue
                        out_row = row0 + tl * sub + r - sub * b
                        writes[out_row, col : col + per_chunk] += 1
                        addrs.append((out_row * n + col) * m.OUT_BYTES)
                    assert _sectors_whole(addrs, 16, partial_ok=False)  # rows of 544 / 1088 B
    assert (data_reads == 1).all()
    assert (writes == 1).all()
    if nvfp4:  # every block of every group (the padding blocks are not read)
        want = np.zeros_like(scale_reads)
        for g, rows in enumerate(splits):
            for col in range(n):
                at = (n + 127) // 128 * 128 * scale_col0[g] + col * cg[g]
                want[at : at + rows // 16] = 1
        assert (scale_reads == want).all()


@pytest.mark.parametrize("tail", [0, *specs.DEQUANT_TAIL_SUBTILES])
@pytest.mark.parametrize("threads", [t for t in specs.DEQUANT_COL_REGS if t])
def test_columnwise_regs_tiles_cover_groups(threads, tail):
    """The FP8 columnwise tile transposed in registers (``DequantizeSpec.col_regs``), emulated
    lane by lane from the template's ``regs_lane`` and address formulas, ``find_tiles``' rules
    and ``dq.rows_of_columns`` (the pairing ``pack_out`` packs: column 2p low, 2p + 1 high) over
    the uneven groups of ``test_columnwise_tiles_cover_groups``: each data byte read once, each
    output value written once and from the input element of its own (token, column), whole
    32-byte sectors per warp load (where column rows are sector-aligned) and per warp store."""
    spec = specs.DequantizeSpec(
        fmt="e4m3",
        columnwise=True,
        out_dtype="bf16",
        col_tokens=256,
        col_ring=8,
        col_regs=threads,
        col_tail=bool(tail),
    )
    m = jit.load_module(spec)
    assert m.THREADS == threads and m.TOKENS * 4 * (m.THREADS // 32) == m.TILE_ROWS
    splits = [16, 48, 0, 64, 80, 144, 0, 256, 32, 208, 112, 16]
    n = 272
    row_start = np.cumsum([0, *splits])
    data_reads = np.zeros(sum(splits) * n, np.int64)
    writes = np.zeros((sum(splits), n), np.int64)
    row_tiles = sum(-(-r // 64) for r in splits)
    col_tiles = -(-n // m.TILE_COLS)
    ctas = _plan_ctas(row_tiles, col_tiles, tail, slots=24, head=0.4 if tail == 2 else 0)

    def element(addr: int) -> tuple:
        """(row, column) of x whose fp8 byte sits at ``addr`` of the columnwise data."""
        g = int(np.searchsorted(row_start, addr // n, side="right")) - 1
        off = addr - row_start[g] * n  # within group g's [N, M_g] block
        return row_start[g] + off % splits[g], off // splits[g]

    for col_tile in range(col_tiles):
        for first_tile, n_sub in ctas:
            where = _find_tiles(splits, first_tile, m.SUBTILES, n_sub if tail else None)
            loads = collections.defaultdict(list)  # (warp, j) -> the warp's load addresses
            stores = collections.defaultdict(list)  # (warp, token) -> its store addresses
            for tidx in range(m.THREADS):
                sub, tok, col = m.regs_lane(tidx)
                _, row0, rows, tl = where[sub]
                col = col_tile * m.TILE_COLS + col
                first = tl * m.SUB_ROWS + tok
                if not (col < n and first < rows):
                    continue
                assert first + m.TOKENS <= rows  # all of the lane's tokens exist
                src = [row0 * n + (col + j) * rows + first for j in range(8)]
                for j, a in enumerate(src):
                    data_reads[a : a + m.TOKENS] += 1
                    loads[tidx >> 5, j].append(a)
                # cols[j][t]: the input byte (its address) of column j, token t; then the words
                # of token t: pack_out pairs rows[t][2p] (low) and rows[t][2p + 1] (high)
                cols = [[a + t for t in range(m.TOKENS)] for a in src]
                for t, vals in enumerate(dq.rows_of_columns(cols)):
                    out_row = row0 + first + t
                    for p in range(4):
                        for half in range(2):
                            assert element(vals[2 * p + half]) == (out_row, col + 2 * p + half)
                    writes[out_row, col : col + 8] += 1
                    stores[tidx >> 5, t].append((out_row * n + col) * 2)
            for (warp, _), addrs in loads.items():
                # column rows start on sector boundaries when M_g is a multiple of 32; a warp's
                # lanes all work on one sub-tile, full or not
                _, _, rows, tl = where[m.regs_lane(32 * warp)[0]]
                whole = rows % 32 == 0 and rows - tl * m.SUB_ROWS >= m.SUB_ROWS
                assert _sectors_whole(addrs, m.TOKENS, partial_ok=not whole)
            for addrs in stores.values():
                assert _sectors_whole(addrs, 16, partial_ok=False)
    assert (data_reads == 1).all()
    assert (writes == 1).all()
