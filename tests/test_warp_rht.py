"""CPU: the mma.sync RHT's data movement (kernels/warp_rht.py), emulated with the PTX ISA's
fragment layouts: ``ldmatrix.x4.trans`` from the swizzled TMA tile hands every lane its A
fragment of x_blk^T (conflict-free), the B registers hold the column-permuted RHT matrix, and
the two m16n8k16 MMAs leave each lane the values of the wgmma m64n16k16 accumulator fragment,
in its order: what the NVFP4 epilogue (four consecutive tokens per row half) and the amax
reduction read."""

import random

import pytest

from cutequant import reference
from cutequant.kernels import warp_rht

TOKENS, HIDDEN = 64, 64  # one warpgroup's slice of a tile: 64 tokens x 64 hidden columns


def _tile_bytes(x):
    """The slice as the TMA writes it (128B swizzle, hidden-major): byte address -> element."""
    mem = {}
    for t in range(TOKENS):
        for h in range(HIDDEN):
            addr = t * 128 + (((h >> 3) ^ (t & 7)) * 16) + (h & 7) * 2
            mem[addr] = x[t][h]
            mem[addr + 1] = None  # the element's high byte
    assert len(mem) == 2 * TOKENS * HIDDEN
    return mem


def _ldmatrix_x4_trans(mem, row_addrs):
    """PTX ldmatrix.sync.aligned.m8n8.x4.trans.b16: lane l gives the row address of matrix
    l // 8, row l % 8; with .trans lane T's register j holds (M_j[2 (T % 4)][T // 4],
    M_j[2 (T % 4) + 1][T // 4]) (low half first)."""
    regs = []
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        regs.append(
            [
                tuple(mem[row_addrs[8 * j + 2 * tig + i] + 2 * gid] for i in range(2))
                for j in range(4)
            ]
        )
    return regs


def _bank_ways(row_addrs):
    """Worst bank multiplicity over the four 8-row phases of one ldmatrix.x4."""
    worst = 0
    for j in range(4):
        banks = {}
        for addr in row_addrs[8 * j : 8 * j + 8]:
            assert addr % 16 == 0
            for w in range(addr // 4, addr // 4 + 4):
                banks.setdefault(w % 32, set()).add(w)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


def test_token_permutation_is_the_wgmma_one():
    cols = [warp_rht.token_of_column(n) for n in range(16)]
    assert sorted(cols) == list(range(16))
    # nvfp4_quantize.py.j2's wgmma B: column n holds token (n % 8) // 2 * 4 + (n // 8) * 2 + n % 2
    assert cols == [(n % 8) // 2 * 4 + (n // 8) * 2 + n % 2 for n in range(16)]


@pytest.mark.parametrize("sign_mask", [0xD7E8, 0x0000, 0xFFFF, 0x1234])
def test_fragments_and_mma_give_the_wgmma_accumulators(sign_mask):
    rng = random.Random(sign_mask)
    # small integers: every sum below is exact, so the emulation compares values, not roundings
    x = [[rng.randint(-64, 64) for _ in range(HIDDEN)] for _ in range(TOKENS)]
    mem = _tile_bytes(x)
    r = reference.rht_matrix(sign_mask).float().tolist()  # R[i][j]: y[j] = sum_i x[i] R[i][j]

    # B: per lane, registers b0 b1 (n = 0..7) then b0 b1 (n = 8..15); PTX .col B fragment:
    # b0 = (B[2 tig][gid], B[2 tig + 1][gid]), b1 = (B[2 tig + 8][gid], B[2 tig + 9][gid])
    b = [[[None] * 8 for _ in range(16)] for _ in range(2)]
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        coords = warp_rht.b_coordinates(lane)
        for jj in range(2):
            for kh in range(2):
                k, token = coords[2 * jj + kh]
                assert k == 2 * tig + 8 * kh
                for i in range(2):
                    assert b[jj][k + i][gid] is None
                    b[jj][k + i][gid] = r[k + i][token]
    for jj in range(2):
        for k in range(16):
            for n in range(8):
                assert b[jj][k][n] == r[k][warp_rht.token_of_column(8 * jj + n)]

    for warp in range(4):
        for kb in range(TOKENS // 16):
            rows = [
                warp_rht.a_lane_offset(warp, lane) + kb * warp_rht.BLOCK_BYTES for lane in range(32)
            ]
            assert _bank_ways(rows) == 1, "ldmatrix bank conflict"
            regs = _ldmatrix_x4_trans(mem, rows)
            # PTX m16n8k16 A fragment: reg 0 = A[gid][2 tig + i], reg 1 = A[gid + 8][...],
            # reg 2 = A[gid][2 tig + 8 + i], reg 3 = A[gid + 8][2 tig + 8 + i]
            a = [[None] * 16 for _ in range(16)]
            for lane in range(32):
                gid, tig = lane // 4, lane % 4
                for reg, (dm, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                    for i in range(2):
                        assert a[gid + dm][2 * tig + dk + i] is None
                        a[gid + dm][2 * tig + dk + i] = regs[lane][reg][i]
            for m in range(16):
                for k in range(16):  # A = x_blk^T: hidden row 16 warp + m, token 16 kb + k
                    assert a[m][k] == x[16 * kb + k][16 * warp + m], (warp, kb, m, k)

            for lane in range(32):
                gid, tig = lane // 4, lane % 4
                out = []
                for jj in range(2):  # D fragment: d0 d1 = D[gid][2 tig + c], d2 d3 = D[gid + 8]
                    for dm in (0, 8):
                        for c in range(2):
                            out.append(
                                sum(a[gid + dm][k] * b[jj][k][2 * tig + c] for k in range(16))
                            )
                # what the wgmma fragment holds and the epilogue reads: value 2 h + c + 4 jj is
                # hidden row 16 warp + gid + 8 h, token 4 tig + 2 jj + c of the block
                for h in range(2):
                    hidden = 16 * warp + gid + 8 * h
                    four = [out[2 * h], out[2 * h + 1], out[2 * h + 4], out[2 * h + 5]]
                    want = [
                        sum(x[16 * kb + i][hidden] * r[i][4 * tig + t] for i in range(16))
                        for t in range(4)
                    ]
                    assert four == want, (warp, kb, lane, h)
