"""Device helpers for NVFP4 stochastic rounding (SR): the Philox4x32-10 generator and the
software SR e2m1 encoder (sm_90a has no ``cvt.rs.satfinite.e2m1x4.f32``).

Random bits are a pure function of (seed, offset, direction, block id), not of the thread
mapping, so ``cutequant.reference`` reproduces them bit for bit:

    counter = (id & 0xFFFFFFFF, (id >> 32) | direction << 31, offset lo32, offset hi32)
    key     = (seed lo32, seed hi32)
    words   = philox4x32_10(counter, key)        # 16 random bytes for the 16-element block
    byte i  = (words[i // 4] >> 8 (i % 4)) & 0xFF  # element i's byte

with ``id`` = global token row * (N / 16) + block column (rowwise, direction 0) or
hidden index * (M / 16) + global 16-token block (columnwise, direction 1).

Element rounding is TE's software emulation (docs/numerics.md §1.4, ``util/ptx.cuh``):
``u = byte / 256``, ``t = |v| + u * step(|v|)`` (one fp32 rounding), step 0.5 / 1 / 2 below 2 /
below 4 / above, then ``q = min(floor(t / step(t)) * step(t), 6)``; sign copied, NaN -> +6.
"""

import cutlass.cute as cute
from cutlass import Float32, Uint32

from cutequant.kernels import device as dev

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10


def philox4x32_10(c0: Uint32, c1: Uint32, c2: Uint32, c3: Uint32, k0: Uint32, k1: Uint32) -> list:
    """Philox4x32 with 10 rounds (Salmon et al. 2011; the Random123 / cuRAND constants)."""
    m0, m1 = Uint32(PHILOX_M0), Uint32(PHILOX_M1)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = k0 + Uint32(PHILOX_W0)
            k1 = k1 + Uint32(PHILOX_W1)
        hi0, lo0 = dev.mul_hi_u32(m0, c0), m0 * c0
        hi1, lo1 = dev.mul_hi_u32(m1, c2), m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def block_random_words(block_id, direction: int, rng: tuple) -> list:
    """The four random words of one 16-element block (``block_id``: Int64)."""
    seed_lo, seed_hi, off_lo, off_hi = rng
    lo = Uint32(block_id & 0xFFFFFFFF)
    hi = Uint32(block_id >> 32) | Uint32(direction << 31)
    return philox4x32_10(lo, hi, off_lo, off_hi, seed_lo, seed_hi)


def e2m1_sr_code_bits(v: Float32, rb: Float32) -> Uint32:
    """Bit pattern whose bits 0-2 hold the stochastically rounded e2m1 magnitude code of ``v``
    (``rb`` = the element's random byte / 512, exact: ``random_bytes_f32``); bits 3+ are zero.

    With a = min(|v|, 6) (same result as TE's unclamped form: both give 6 from 6 up),
    step(a) / 2 = p = 2^floor(log2(max(a, 1))) (0.5 / 1 / 2 below 2 / below 4 / up to 6: a <= 6
    needs no upper clamp) and t = fma(rb, p, a) = a + byte / 256 * step(a) (exact product, one
    fp32 rounding, as TE), t < 8. p costs a max and an AND on the bit pattern (non-negative
    floats order like integers). The floor onto the e2m1 grid: t * 2^-126 rounded toward zero
    puts 1.0 at the smallest normal, so [0, 1) becomes subnormal with the grid step 0.5 as its
    top mantissa bit, and from 1 up the grid is {exponent, top mantissa bit}: the code is
    bits(rz(t * 2^-126)) >> 22 (truncation = floor; [6, 8) -> 7 = 6, TE's clamp). 6
    instructions per value; min(floor(2t), floor(t) + 2, floor(t / 2) + 4) took 9
    (perf/NOTES.md, "Issue 17")."""
    a = cute.arch.fmin(cute.math.absf(v), Float32(6.0))  # NaN -> 6, as the RN path
    p = dev.bits_f32(dev.max_u32(dev.f32_bits(a), Uint32(0x3F800000)) & Uint32(0x7F800000))
    t = dev.fma_rn(rb, p, a)
    return dev.f32_bits(dev.mul_rz(t, Float32(SR_GRID_SCALE))) >> Uint32(22)


SR_GRID_SCALE = 2.0**-126  # 1.0 -> the smallest normal fp32


# Random bytes as exact fp32 byte / 512 without a PRMT: OR the byte in place into a magic
# float whose ulp there is 2^-9 / 256^k, then subtract the magic. Byte 0 (bits 0-7) under
# 2^14 (ulp 2^-9), byte 1 (bits 8-15) under 2^6 (ulp 2^-17); bytes 2 and 3 the same after one
# shift. 9 instructions per word; the PRMT form (8) kept its four selectors in registers that
# ptxas re-materialized from uniform registers at the 96-register cap: 47 extra IMAD.U32 per
# 32 values in the columnwise SR loop (perf/NOTES.md, "Issue 17").
_BYTE_MAGIC = ((0xFF, 0x46800000, 16384.0), (0xFF00, 0x42800000, 64.0))


def random_bytes_f32(word: Uint32) -> list:
    """The four bytes of a random word, each divided by 512, as exact fp32 (byte 0 first)."""
    out = []
    for half in (word, word >> 16):
        for mask, magic_bits, magic in _BYTE_MAGIC:
            biased = dev.and_or(half, Uint32(mask), Uint32(magic_bits))
            out.append(dev.bits_f32(biased) - Float32(magic))
    return out


BYTE_MAGIC = 0x46800000  # 2^14, ulp 2^-9: byte b in bits 0-7 reads 2^14 + b / 512


def random_bytes_f32_prmt(word: Uint32, magic: Uint32) -> list:
    """``random_bytes_f32`` with one PRMT + FADD per byte: byte k of ``word`` into byte 0 of
    ``magic`` (= BYTE_MAGIC, but held in a register that ptxas cannot see through, e.g. loaded
    from shared memory: with a constant operand ptxas moves the constant into the immediate and
    the selector into a register, the re-materialization the LOP3 form avoided), minus 2^14.
    8 instructions per word instead of 9 (no shift), one live register instead of three magics."""
    return [dev.bits_f32(dev.prmt(word, magic, 0x7650 | k)) - Float32(16384.0) for k in range(4)]


def e2m1x8_sr(v, words: list, first: int) -> Uint32:
    """Eight fp32 values (already times enc) -> eight stochastically rounded e2m1 nibbles
    (element 0 in bits 0-3); element j uses random byte ``first + j`` of the block's ``words``."""
    rb = random_bytes_f32(words[first // 4]) + random_bytes_f32(words[first // 4 + 1])
    return dev.pack_e2m1x8(v, [e2m1_sr_code_bits(v[j], rb[j]) for j in range(8)])
