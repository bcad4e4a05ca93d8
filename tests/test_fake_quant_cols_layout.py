"""CPU: the index maps of the fused columnwise fake-quant (``kernels/fake_quant.py``,
``fake_quant_cols.py.j2``), emulated lane by lane with numpy: the swizzled shared tile and the
ldmatrix addresses read the intended tokens and columns without bank conflicts, the
ldmatrix.trans + mma.sync fragments compute the RHT of every 16-token block with each lane
holding tokens 4q .. 4q + 3 of columns gq and gq + 8, and the staged random words reach the
lanes whose tokens use them. Fragment layouts: PTX ISA, ldmatrix and mma.m16n8k16 (.bf16)."""

import numpy as np
import pytest

from cutequant import reference
from cutequant.kernels import fake_quant as fq

TILE_COLS = 256
ROW_BYTES = TILE_COLS * 2
CHUNKS = ROW_BYTES // 16


def store_slot(t, c):
    """Byte address of chunk c of token t in the shared tile: slot c ^ chunk_key(t) of the
    token row (the swizzle the ldmatrix reads assume)."""
    return t * ROW_BYTES + ((c ^ fq.chunk_key(t)) << 4)


def copy_slot(tidx, k, threads=256):
    """``copy_tile``'s (token, chunk, shared address) of copy k of thread ``tidx``: two base
    addresses (chunk_key(t0) ^ chunk_key(8 k)) and an immediate row offset."""
    pass_rows = threads // CHUNKS
    t0, c = tidx // CHUNKS, tidx % CHUNKS
    slot = (c ^ fq.chunk_key(t0) ^ fq.chunk_key(pass_rows * k)) << 4
    return t0 + pass_rows * k, c, t0 * ROW_BYTES + slot + pass_rows * k * ROW_BYTES


def test_copy_tile_puts_every_chunk_at_its_slot():
    """The cp.async copies (two base addresses and immediate offsets) put every chunk at
    ``store_slot``."""
    loads = 64 * CHUNKS // 256
    for tidx in range(256):
        for k in range(loads):
            idx = tidx + 256 * k
            t, c = idx // CHUNKS, idx % CHUNKS
            assert copy_slot(tidx, k) == (t, c, store_slot(t, c))


def ldmatrix_address(lane, warp, s, blk):
    """The template's ldmatrix row address for ``lane`` (slice s, block blk)."""
    mi, mr = lane >> 3, lane & 7
    c16 = 16 * warp + 128 * s
    lane_row = fq.ldmatrix_token(mi, mr) * ROW_BYTES
    return lane_row + ((((c16 >> 3) + (mi & 1)) ^ mr) << 4) + 16 * ROW_BYTES * blk


def test_tile_stores_are_a_permutation_and_conflict_free():
    slots = {store_slot(t, c) for t in range(64) for c in range(CHUNKS)}
    assert len(slots) == 64 * CHUNKS and max(slots) < 64 * ROW_BYTES
    for t in range(64):  # a quarter-warp stores 8 consecutive chunks of one token row
        for c0 in range(0, CHUNKS, 8):
            banks = {(store_slot(t, c) % 128) // 16 for c in range(c0, c0 + 8)}
            assert len(banks) == 8


@pytest.mark.parametrize("warp", range(8))
def test_ldmatrix_rows_hit_their_tokens_without_conflicts(warp):
    chunk_of = {store_slot(t, c): (t, c) for t in range(64) for c in range(CHUNKS)}
    for s in range(TILE_COLS // 128):
        for blk in range(4):
            addrs = [ldmatrix_address(lane, warp, s, blk) for lane in range(32)]
            for lane, a in enumerate(addrs):
                mi, mr = lane >> 3, lane & 7
                want = (16 * blk + fq.ldmatrix_token(mi, mr), (16 * warp + 128 * s) // 8 + (mi & 1))
                assert chunk_of[a] == want
            for i in range(4):  # one 8x8 matrix = one shared wavefront: 8 distinct 16-byte slots
                assert len({(a % 128) // 16 for a in addrs[8 * i : 8 * i + 8]}) == 8


def _ldmatrix_trans(x, lane_rows):
    """x: [16 tokens, 16 columns]; returns regs[lane][i] = (lo, hi) values of ldmatrix.x4.trans
    whose matrix i rows are the tokens ``lane_rows[i][r]``, columns 8 (i & 1) .. + 7: lane
    (gq, q) receives rows 2q, 2q + 1 of column gq."""
    regs = np.zeros((32, 4, 2))
    for lane in range(32):
        gq, q = lane >> 2, lane & 3
        for i in range(4):
            for e in range(2):
                regs[lane, i, e] = x[lane_rows[i][2 * q + e], 8 * (i & 1) + gq]
    return regs


def test_fragments_give_the_rht_and_the_token_layout():
    rng = np.random.default_rng(0)
    x = rng.integers(-64, 64, size=(16, 16)).astype(np.float64)  # sums are exact
    for sign_mask in (0, 0xD7E8, 0xFFFF, 0x1234):
        r = reference.rht_matrix(sign_mask).float().numpy().astype(np.float64)
        y = x.T @ r  # y[column, token j]
        rows = [[fq.ldmatrix_token(i, rr) for rr in range(8)] for i in range(4)]
        regs = _ldmatrix_trans(x, rows)
        # without the RHT the registers are the values: (r0, r2) column gq, (r1, r3) gq + 8
        for lane in range(32):
            gq, q = lane >> 2, lane & 3
            for c, (ra, rb) in enumerate(((0, 2), (1, 3))):
                got = [*regs[lane, ra], *regs[lane, rb]]
                assert got == list(x[4 * q : 4 * q + 4, gq + 8 * c])
        # A (16 x 16, row-major) from the fragments a0a1 = regs[0], a2a3 = regs[1], ...
        a = np.full((16, 16), np.nan)
        for lane in range(32):
            gq, q = lane >> 2, lane & 3
            places = ((gq, 2 * q), (gq + 8, 2 * q), (gq, 2 * q + 8), (gq + 8, 2 * q + 8))
            for reg, (m, k) in enumerate(places):
                a[m, k : k + 2] = regs[lane, reg]
        assert not np.isnan(a).any()
        for k in range(16):
            assert np.array_equal(a[:, k], x[fq.a_token(k), :])
        for h in range(2):
            b = np.full((16, 8), np.nan)
            for lane in range(32):
                gq, q = lane >> 2, lane & 3
                for reg in range(2):
                    (i0, i1), j = fq.b_indices(lane, h, reg)
                    word = 0x3E80 | (0x3E80 << 16)
                    for half, i in enumerate((i0, i1)):
                        parity = bin(i & j).count("1") + ((sign_mask >> i) & 1)
                        word |= (parity & 1) << (15 + 16 * half)
                    lo = -0.25 if word & 0x8000 else 0.25
                    hi = -0.25 if word & 0x80000000 else 0.25
                    assert (lo, hi) == (r[i0, j], r[i1, j])
                    b[2 * q + 8 * reg, gq] = r[fq.a_token(2 * q + 8 * reg), j]
                    b[2 * q + 8 * reg + 1, gq] = r[fq.a_token(2 * q + 8 * reg + 1), j]
            assert not np.isnan(b).any()
            d = a @ b
            for lane in range(32):
                gq, q = lane >> 2, lane & 3
                # d0, d1: row gq, columns 2q, 2q + 1; d2, d3: row gq + 8
                frag = [d[gq, 2 * q], d[gq, 2 * q + 1], d[gq + 8, 2 * q], d[gq + 8, 2 * q + 1]]
                tok = 4 * q + 2 * h
                assert frag == [y[gq, tok], y[gq, tok + 1], y[gq + 8, tok], y[gq + 8, tok + 1]]


def test_staged_random_words_reach_their_readers_without_conflicts():
    """The stochastic columnwise kernel's staged random words: lane (gq, q) draws block q of
    columns gq, gq + 8 and stores word e of both (one 8-byte store) at
    ``rand_write_offset(lane, e)``; lane (gq, q) then loads, per block blk,
    ``rand_read_offset(lane, blk)``: word q of block blk of its two columns (the bytes of its
    tokens 4q .. 4q + 3). The 8-byte accesses of each half-warp hit 16 distinct 8-byte bank
    pairs (one wavefront each), and the warp's buffer holds ``RAND_WARP_BYTES``."""
    buf = {}
    for lane in range(32):
        gq, q = lane >> 2, lane & 3
        for e in range(4):
            off = fq.rand_write_offset(lane, e)
            assert off % 8 == 0 and off + 8 <= fq.RAND_WARP_BYTES and off not in buf
            buf[off] = ((gq, q, e), (gq + 8, q, e))  # (column, block, word) of the two words
    for lane in range(32):
        gq, q = lane >> 2, lane & 3
        for blk in range(4):
            assert buf[fq.rand_read_offset(lane, blk)] == ((gq, blk, q), (gq + 8, blk, q))
    for half in (range(16), range(16, 32)):
        for e in range(4):
            assert len({fq.rand_write_offset(lane, e) // 8 % 16 for lane in half}) == 16
        for blk in range(4):
            assert len({fq.rand_read_offset(lane, blk) // 8 % 16 for lane in half}) == 16
