"""NVFP4 columnwise RHT, fast math: encode in the wgmma accumulator layout, restage codes.

The fast-math kernels quantize the fp32 RHT accumulators (TE's fused RHT kernels), so the
restaging of the values (``nvfp4_quantize.py.j2``, ``stage_store_offset``) moved 4 bytes per
value through shared memory, twice the exact path's bf16 (perf/NOTES.md, "Issue 17"). Here
each thread quantizes the values it holds: in the m64n16 accumulator of 16-token block kb, the
four lanes of a quad (q = lane % 4) hold tokens 4q..4q+3 of hidden rows acc_row and
acc_row + 8, so a block's amax is a 4-value max and two butterfly shuffles, every lane of the
quad computes the block's scale and enc (the same instructions on the same values: bit for
bit the thread-per-block result), encodes its four values and stores their 16 code bits; only
the codes (2 KB per warpgroup and tile instead of 16 KB) and the scale bytes pass through
shared memory. The reader (hidden row r, half) then gets the same words and scale pair as
``two_block_codes`` produced.

Layout per buffer: code row r (32 bytes: 64 tokens) at ``code_row_offset(r)`` = 32 r + 16 (r >>
2): a warp's 16-bit stores (8 rows x 4 quads) fall on 16 distinct banks, a quarter-warp's
16-byte loads (4 rows x 2 halves) on 128 contiguous bytes; scale bytes of row r (4 blocks) at
``SCALE_OFFSET`` + 4 r.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from cutequant.kernels import device as dev

CODE_BYTES = 64 * 32 + 16 * 16
SCALE_OFFSET = CODE_BYTES
BUF_BYTES = CODE_BYTES + 64 * 4


def code_row_offset(r: Int32) -> Int32:
    """Byte offset of code row r (tokens 0..63 of hidden row r, 32 bytes)."""
    return r * 32 + (r >> 2) * 16


def store_shared_b16(addr: Int32, half: Uint32):
    """The low 16 bits of ``half`` to 2-byte-aligned shared address ``addr`` (one STS.U16)."""
    cute.make_tensor(
        cute.make_ptr(cutlass.Uint16, addr, cute.AddressSpace.smem, assumed_align=2),
        cute.make_layout(1),
    )[0] = cutlass.Uint16(half & Uint32(0xFFFF))


def load_shared_b16(addr: Int32) -> Uint32:
    """One 16-bit word from 2-byte-aligned shared address ``addr`` (LDS.U16), zero-extended."""
    t = cute.make_tensor(
        cute.make_ptr(cutlass.Uint16, addr, cute.AddressSpace.smem, assumed_align=2),
        cute.make_layout(1),
    )
    return Uint32(t[0])


def f32_block_amax(vals):
    """Non-negative |max| of 16 fp32 values (tree; the fast-math SR kernels, which restage the
    values)."""
    level = list(vals)
    while len(level) > 1:
        level = [dev.absmax(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return cute.math.absf(level[0])


def quad_block_amax(v) -> Float32:
    """Non-negative |max| of a 16-token block whose four lanes of a quad each hold 4 values
    (NaN propagates, as ``f32_block_amax``)."""
    m = dev.absmax(dev.absmax(v[0], v[1]), dev.absmax(v[2], v[3]))
    m = dev.absmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
    m = dev.absmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
    return cute.math.absf(m)


def stage_codes(accs, buf_base: Int32, acc_row: Int32, quad: Int32, lut, buf: Int32, s6: Float32):
    """Quantize this thread's accumulator values (4 blocks x 2 rows x 4 tokens) and store their
    codes and the blocks' scale bytes into the buffer at ``buf_base``."""
    for h in range(2):
        row = acc_row + 8 * h
        row_addr = buf_base + code_row_offset(row) + 2 * quad
        for kp in range(2):  # blocks 2 kp, 2 kp + 1
            v = [
                [accs[kb][2 * h], accs[kb][2 * h + 1], accs[kb][2 * h + 4], accs[kb][2 * h + 5]]
                for kb in (2 * kp, 2 * kp + 1)
            ]
            sf = dev.block_scales2(quad_block_amax(v[0]), quad_block_amax(v[1]), s6)
            enc = [lut[Int32(sf & Uint32(0xFF)), buf], lut[Int32(sf >> 8), buf]]  # sf <= 0xFFFF
            word = dev.e2m1x8([x * enc[0] for x in v[0]] + [x * enc[1] for x in v[1]])
            store_shared_b16(row_addr + 16 * kp, word)
            store_shared_b16(row_addr + 16 * kp + 8, word >> Uint32(16))
            # all four lanes of the quad store the same bytes
            store_shared_b16(buf_base + SCALE_OFFSET + 4 * row + 2 * kp, sf)


def load_codes(buf_base: Int32, row: Int32, half: Int32):
    """(the four code words, the scale pair) of blocks 2 half, 2 half + 1 of hidden row ``row``,
    as ``two_block_codes`` returns them."""
    words = dev.load_shared_v4(buf_base + code_row_offset(row) + 16 * half)
    return words, load_shared_b16(buf_base + SCALE_OFFSET + 4 * row + 2 * half)
