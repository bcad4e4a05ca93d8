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


def e2m1_sr_code_bits(v: Float32, byte: Float32) -> Uint32:
    """Bit pattern whose bits 0-2 hold the stochastically rounded e2m1 magnitude code of ``v``
    (``byte`` = the element's random byte as an exact fp32 0..255).

    With a = min(|v|, 6) (same result as TE's unclamped form: both give 6 from 6 up) and
    t = fma(byte, step(a) / 256, a), the code is min(floor(2t), floor(t) + 2, floor(t/2) + 4)
    (t < 8 always), each floor one round-down fma against 2^23."""
    a = cute.arch.fmin(cute.math.absf(v), Float32(6.0))  # NaN -> 6, as the RN path
    # step(a) / 256 = clamp(2^floor(log2 a) / 512, 2^-9, 2^-7), branch-free
    pow2 = dev.bits_f32(dev.f32_bits(a) & Uint32(0x7F800000)) * Float32(2.0**-9)
    step = cute.arch.fmin(cute.arch.fmax(pow2, Float32(2.0**-9)), Float32(2.0**-7))
    t = dev.fma_rn(byte, step, a)
    f1 = dev.fma_rm(t, Float32(2.0), Float32(dev.MAGIC))
    f2 = dev.fma_rm(t, Float32(1.0), Float32(dev.MAGIC + 2.0))
    f3 = dev.fma_rm(t, Float32(0.5), Float32(dev.MAGIC + 4.0))
    return dev.f32_bits(cute.arch.fmin(cute.arch.fmin(f1, f2), f3))


def random_byte_f32(words: list, i: int) -> Float32:
    """Byte i of the block's random words as an exact fp32 (one PRMT against 2^23, one FADD)."""
    biased = dev.prmt(words[i // 4], Uint32(0x4B000000), 0x7650 + (i % 4))
    return dev.bits_f32(biased) - Float32(dev.MAGIC)


def e2m1x8_sr(v, words: list, first: int) -> Uint32:
    """Eight fp32 values (already times enc) -> eight stochastically rounded e2m1 nibbles
    (element 0 in bits 0-3); element j uses random byte ``first + j`` of the block's ``words``."""
    return dev.pack_e2m1x8(
        v, [e2m1_sr_code_bits(v[j], random_byte_f32(words, first + j)) for j in range(8)]
    )
