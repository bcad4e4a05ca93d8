"""CPU: the dequantize kernels' bit tricks and layouts, emulated instruction by instruction
(``kernels/dequant.py``, ``kernels/templates/dequantize.py.j2``; the GPU tests in
test_gpu_dequant.py check the outputs bit for bit):

* the e2m1 -> e4m3 decode (``e2m1x8_to_e4m3``: PRMT LUT + sign PRMT + LOP3), every 16-bit half;
* the columnwise transpose in registers (``staging`` "registers", the default): the 8 x 8
  nibble transpose, the FP8 column-pair PRMT, the inverse RHT's per-token sign masks, and the
  thread pieces (every (token, column) once; every load and store instruction of a warp covers
  whole 32-byte sectors; output words pair adjacent columns);
* the columnwise staging tile (``staging`` "shared"): ``stmatrix.x4.trans`` (16-bit outputs) or
  STS.32 (fp32) stores of every lane land each (token, column) value on its own bytes, the
  16-byte loads of the store-out read back output row pieces in order, and no shared phase has
  a bank conflict;
* the device-split warp search of ``find_tile`` against a linear scan.
"""

import collections
import random

import pytest
import torch

from cutequant import jit
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


def _stage_stores(m, elem: int) -> dict:
    """Byte offset -> (token, column) of every staging store of one tile, checking bank
    conflicts and that no byte is written twice."""
    owner = {}

    def put(addr, token, col):
        for b in range(elem):
            assert addr + b not in owner, "two stores share a byte"
            owner[addr + b] = (token, col)

    for warp in range(m.THREADS // 32):
        for k in range(m.GROUPS_PER_WARP):
            kg = m.GROUPS_PER_WARP * warp + k  # 8-column group of the tile
            if elem == 4:  # STS.32 of lane 4c + q, token 16q + i
                for i in range(16):
                    addrs = []
                    for lane in range(32):
                        c, q = lane // 4, lane % 4
                        token, col = 16 * q + i, 8 * kg + c
                        chunk = m.stage_chunk(token, col >> 2)
                        addrs.append(token * m.ROW_BYTES + 16 * chunk + 4 * (col & 3))
                        put(addrs[-1], token, col)
                    assert _bank_ways(addrs, 4) == 1
                continue
            for s in range(2):  # stmatrix.x4.trans
                tokens = [m.stsm_token(lane, s) for lane in range(32)]
                addrs = [t * m.ROW_BYTES + 16 * m.stage_chunk(t, kg) for t in tokens]
                for i in range(4):  # matrix i: rows from lanes 8i .. 8i + 7
                    rows = addrs[8 * i : 8 * i + 8]
                    assert _bank_ways(rows, 16) == 1
                    for j, addr in enumerate(rows):
                        assert addr % 16 == 0
                        for r in range(8):  # stored element r: fragment (r, j)
                            lane = 4 * r + j // 2  # holds register i = tokens of 16q + 8s + 2i
                            c, q = lane // 4, lane % 4
                            token = 16 * q + 8 * s + 2 * i + j % 2
                            assert token == tokens[8 * i + j]
                            put(addr + 2 * r, token, 8 * kg + c)
    return owner


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
def test_columnwise_staging_tile(out_dtype):
    spec = specs.DequantizeSpec(columnwise=True, out_dtype=out_dtype, staging="shared")
    m = jit.load_module(spec)
    elem = m.OUT_BYTES
    owner = _stage_stores(m, elem)
    assert len(owner) == m.TILE_ROWS * m.TILE_COLS * elem
    assert min(owner) == 0 and max(owner) == m.TILE_ROWS * m.ROW_BYTES - 1
    # store-out: thread tidx reads chunk tidx % CHUNKS of row tidx / CHUNKS + rows per pass * p
    per_chunk = 16 // elem
    seen = set()
    for warp in range(m.THREADS // 32):
        for p in range(m.TILE_ROWS * m.CHUNKS // m.THREADS):
            addrs = []
            for lane in range(32):
                tidx = 32 * warp + lane
                ch = tidx & (m.CHUNKS - 1)
                r = (tidx >> (m.CHUNKS.bit_length() - 1)) + m.THREADS // m.CHUNKS * p
                addr = r * m.ROW_BYTES + 16 * m.stage_chunk(r, ch)
                addrs.append(addr)
                for e in range(per_chunk):
                    assert owner[addr + elem * e] == (r, per_chunk * ch + e)
                seen.add((r, ch))
            assert _bank_ways(addrs, 16) == 1
    assert len(seen) == m.TILE_ROWS * m.CHUNKS


def nibble_transpose8(words: list) -> list:
    """``dequant.nibble_transpose8`` on Python ints (same selectors and masks)."""
    w = list(words)
    (lo2, hi2), (lo1, hi1) = dq.NIBBLE_T_SEL
    for i in range(4):
        a, b = w[i], w[i + 4]
        w[i], w[i + 4] = prmt(a, b, lo2), prmt(a, b, hi2)
    for i in (0, 1, 4, 5):
        a, b = w[i], w[i + 2]
        w[i], w[i + 2] = prmt(a, b, lo1), prmt(a, b, hi1)
    m = 0x0F0F0F0F
    for i in range(0, 8, 2):
        a, b = w[i], w[i + 1]
        w[i] = (a & m) | ((b << 4) & ~m & 0xFFFFFFFF)
        w[i + 1] = ((a >> 4) & m) | (b & ~m & 0xFFFFFFFF)
    return w


def test_nibble_transpose():
    rng = random.Random(3)
    for _ in range(2000):
        words = [rng.getrandbits(32) for _ in range(8)]
        got = nibble_transpose8(words)
        for t in range(8):
            for i in range(8):
                assert (got[t] >> (4 * i)) & 0xF == (words[i] >> (4 * t)) & 0xF


def test_fp8_column_pairs():
    """PRMT of two columns' words: bytes (a_k, b_k, a_k+1, b_k+1), k = 0 and 2."""
    a, b = 0x33221100, 0x77665544
    for k, sel in zip((0, 2), dq.FP8_PAIR_SEL, strict=True):
        want = [k, 4 + k, k + 1, 5 + k]  # byte values 0x00 + 0x11 * index
        got = prmt(a, b, sel)
        assert [(got >> (8 * i)) & 0xFF for i in range(4)] == [0x11 * x for x in want]


def test_rht_token_signs():
    """``rht_sign_bytes`` + ``rht_token_sign``: all ones exactly for the negated tokens."""
    rng = random.Random(4)
    masks = [0, 0xFFFF, 0xD7E8, 0x8001] + [rng.getrandbits(16) for _ in range(3000)]
    for m in masks:
        words = [(((m >> (4 * k)) & 0xF) * 0x10204080) & 0x80808080 for k in range(4)]
        for t in range(16):
            sel = (8 | (t & 3)) * 0x1111
            got = prmt(words[t >> 2], words[t >> 2], sel)
            assert got == (0xFFFFFFFF if (m >> t) & 1 else 0), (hex(m), t)


def _whole_sectors(pieces) -> None:
    """(line, first byte, bytes) of one warp instruction: every 32-byte sector it touches is
    covered entirely, each byte once."""
    seen = collections.defaultdict(set)
    for line, start, size in pieces:
        for b in range(start, start + size):
            assert b not in seen[line], "two lanes on one byte"
            seen[line].add(b)
    for line, got in seen.items():
        for sector in {b // 32 for b in got}:
            assert set(range(32 * sector, 32 * sector + 32)) <= got, (line, sector)


REGISTER_VARIANTS = [
    ("nvfp4", False, "bf16"),
    ("nvfp4", False, "f32"),
    ("nvfp4", True, "bf16"),
    ("nvfp4", True, "f32"),
    ("e4m3", False, "bf16"),
    ("e4m3", False, "f32"),
]


@pytest.mark.parametrize("fmt, undo_rht, out_dtype", REGISTER_VARIANTS)
def test_columnwise_register_pieces(fmt, undo_rht, out_dtype):
    """Thread pieces of the register transpose, as the kernel computes them (``thread_piece``,
    ``piece_column``): loads of column piece_column(i) (instruction i), one store per token and
    column pair (RHT) or per token (whole-sector instructions), each value once."""
    spec = specs.DequantizeSpec(fmt=fmt, columnwise=True, undo_rht=undo_rht, out_dtype=out_dtype)
    assert spec.staging_kind() == "registers"
    m = jit.load_module(spec)
    elem = m.OUT_BYTES
    token_bytes = 0.5 if fmt == "nvfp4" else 1
    per_pair = m.COLS // m.PAIRS  # adjacent columns per store
    owner = collections.Counter()
    for warp in range(m.THREADS // 32):
        lanes = [m.thread_piece(32 * warp + lane) for lane in range(32)]
        for c0, t0 in lanes:
            cols = [c0 + m.piece_column(i) for i in range(m.COLS)]
            for i in range(0, m.COLS, per_pair):  # a store's columns are adjacent, in order
                assert cols[i : i + per_pair] == list(range(cols[i], cols[i] + per_pair))
            owner.update((t0 + t, c) for t in range(m.TOKENS) for c in cols)
            assert t0 % 16 + m.TOKENS <= 16 or m.TOKENS == 16  # one scale block
            assert t0 % m.TOKENS == 0
        for i in range(m.COLS):  # load instruction i: column i of every lane's piece
            _whole_sectors(
                [
                    (c0 + m.piece_column(i), int(t0 * token_bytes), int(m.TOKENS * token_bytes))
                    for c0, t0 in lanes
                ]
            )
        for t in range(m.TOKENS):  # store instruction (token t, pair p)
            for p in range(m.PAIRS):
                first = [c0 + m.piece_column(p * per_pair) for c0, _ in lanes]
                _whole_sectors(
                    [
                        (t0 + t, elem * c, elem * per_pair)
                        for (_, t0), c in zip(lanes, first, strict=True)
                    ]
                )
    assert len(owner) == m.TILE_ROWS * m.TILE_COLS and set(owner.values()) == {1}
    assert max(c for _, c in owner) == m.TILE_COLS - 1


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
