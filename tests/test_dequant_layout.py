"""CPU: the dequantize kernels' bit tricks and layouts, emulated instruction by instruction
(``kernels/dequant.py``, ``kernels/templates/dequantize.py.j2``; the GPU tests in
test_gpu_dequant.py check the outputs bit for bit):

* the e2m1 -> e4m3 decode (``e2m1x8_to_e4m3``: PRMT LUT + sign PRMT + LOP3), every 16-bit half;
* the columnwise staging tile: ``stmatrix.x4.trans`` (16-bit outputs) or STS.32 (fp32) stores
  of every lane land each (token, column) value on its own bytes, the 16-byte loads of the
  store-out read back output row pieces in order, and no shared phase has a bank conflict;
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
    m = jit.load_module(specs.DequantizeSpec(columnwise=True, out_dtype=out_dtype))
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
