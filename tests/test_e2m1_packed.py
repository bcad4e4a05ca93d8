"""CPU: a numpy emulation of the packed e2m1 encoder's exact instruction sequence
(``kernels/device.py``: ``e2m1_bf16x2_codes``, ``e2m1x8``) against the
comparison-based reference ``cutequant.reference.e2m1_encode``.

CI runs every special value (ties, their fp32 and bf16 neighbours, saturation, +-0, +-inf,
NaNs, subnormals) and a few 2^20-pattern chunks spread over the fp32 space. The whole 2^32 space
(~10 min on one core): ``CUTEQUANT_E2M1_FULL=1 pytest tests/test_e2m1_packed.py -k full``. The
GPU runs the real instructions over all 2^32 patterns in tests/test_gpu_e2m1_exhaustive.py.
"""

import os

import numpy as np
import pytest
import torch

from cutequant import reference

U32 = np.uint32


def bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """fp32 values (finite, no NaN) -> bf16 bits, round to nearest even."""
    b = x.astype(np.float32).view(U32)
    return ((b + U32(0x7FFF) + ((b >> U32(16)) & U32(1))) >> U32(16)).astype(U32)


def bf16_to_f32(h: np.ndarray) -> np.ndarray:
    return (h.astype(U32) << U32(16)).view(np.float32)


def rto_bf16(bits: np.ndarray) -> np.ndarray:
    """The round-to-odd half of ``e2m1_bf16x2_codes``: upper 16 bits | min.u16(lower 16 bits, 1)
    (the sign stays here; the LOP3 clears it, ``bf16_codes`` masks it)."""
    return (bits >> U32(16)) | np.minimum(bits & U32(0xFFFF), U32(1))


def bf16_codes(h: np.ndarray) -> np.ndarray:
    """``e2m1_bf16x2_codes`` after the round to odd: abs, min with 6 (NaN -> 6), three
    single-rounding bf16 fmas against 128 / 130 / 132, min of the three; returns the bf16 bits
    (0x4300 + code)."""
    a = bf16_to_f32(h & U32(0x7FFF))
    a = np.fmin(a, np.float32(6.0))  # min.bf16x2: a NaN operand gives the other one
    a64 = a.astype(np.float64)
    # a * k + m is exact in float64 (a has 8 significant bits, |a| <= 6): one rounding to bf16.
    # Every candidate is in [128, 140], so the fp32 step in between is exact.
    t1 = bf16_rne_bits((a64 * 2.0 + 128.0).astype(np.float32))
    t2 = bf16_rne_bits((a64 * 1.0 + 130.0).astype(np.float32))
    t3 = bf16_rne_bits((a64 * 0.5 + 132.0).astype(np.float32))
    return np.minimum(np.minimum(t1, t2), t3)  # positive bf16 in one binade: bits order as values


def packed_nibbles(v_bits: np.ndarray) -> np.ndarray:
    """The nibble ``e2m1x8`` produces for each fp32 bit pattern: code = bits 0-2 of the selected
    candidate, sign = bit 15 of the rounded-to-odd bf16 (bit 31 of the input)."""
    h = rto_bf16(v_bits)
    c = bf16_codes(h)
    assert np.all((c & U32(0xFFF8)) == U32(0x4300)), "candidate left the [128, 136) range"
    return ((c & U32(7)) | (((h >> U32(15)) & U32(1)) << U32(3))).astype(np.uint8)


def prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """PTX prmt.b32 (default mode): result byte k = byte (sel >> 4 k) & 7 of {b, a}, sign-
    replicated when bit 3 of that selector nibble is set."""
    src = [(a >> U32(8 * i)) & U32(0xFF) for i in range(4)]
    src += [(b >> U32(8 * i)) & U32(0xFF) for i in range(4)]
    out = np.zeros_like(a)
    for k in range(4):
        s = (sel >> (4 * k)) & 0xF
        byte = src[s & 7]
        if s & 8:  # sign-replicate the chosen byte
            byte = np.where(byte & U32(0x80), U32(0xFF), U32(0))
        out |= byte << U32(8 * k)
    return out


def pack8(nibbles: np.ndarray) -> np.ndarray:
    """``e2m1x8``'s packing: values j, j + 4 share a bf16x2 pair; even-element codes and signs
    are gathered by PRMT 0x6240 / 0xFBD9, odd ones likewise, merged as lo + (hi << 4)."""
    n = nibbles.reshape(-1, 8).astype(U32)
    code, sign = n & U32(7), n >> U32(3)
    # pair j: lo half = value j, hi half = value j + 4 (0x4300 + code; sign in bits 15 / 31)
    words = [U32(0x43004300) | code[:, j] | (code[:, j + 4] << U32(16)) for j in range(4)]
    pairs = [(sign[:, j] << U32(15)) | (sign[:, j + 4] << U32(31)) for j in range(4)]

    even = prmt(words[0], words[2], 0x6240)
    odd = prmt(words[1], words[3], 0x6240)
    lo = even | (prmt(pairs[0], pairs[2], 0xFBD9) & U32(0x08080808))
    hi = odd | (prmt(pairs[1], pairs[3], 0xFBD9) & U32(0x08080808))
    return (lo + (hi << U32(4))).astype(U32)


def expected_nibbles(v_bits: np.ndarray) -> np.ndarray:
    """``reference.e2m1_encode``, except a NaN with the sign bit set: the device encoders take
    the sign from bit 31 (the kernels only ever see the canonical NaN 0x7FFFFFFF of x * enc)."""
    v = torch.from_numpy(v_bits.view(np.float32).copy())
    ref = reference.e2m1_encode(v).numpy()
    neg_nan = np.isnan(v_bits.view(np.float32)) & (v_bits >> U32(31) == 1)
    return np.where(neg_nan, np.uint8(0xF), ref)


def special_patterns() -> np.ndarray:
    """Every e2m1 grid value and midpoint, +-8 fp32 ulps and +-3 bf16 ulps around each, saturation,
    +-0, +-inf, NaNs (canonical, signalling, negative, low-bit-only), subnormals, FLT_MAX."""
    pts = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0]
    pts += [0.125, 0.375, 5.5, 6.5, 12.0, 1e30, 3.3895e38]
    base = np.array(pts, np.float32).view(U32)
    base = base.astype(np.int64)
    out = [base + d for d in range(-8, 9)]
    out += [base + (d << 16) for d in range(-3, 4)]  # bf16 neighbours
    out += [base + (d << 16) + e for d in range(-2, 3) for e in (-1, 1, 0x7FFF, 0x8000, 0x8001)]
    out = [np.clip(o, 0, 0x7FFFFFFF) for o in out]
    specials = [0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FBFFFFF, 0x7F7FFFFF, 0x00000001]
    specials += [0x007FFFFF, 0x00800000, 0x7F80FFFF, 0x7F810000, 0x0000FFFF, 0x00010000]
    out.append(np.array(specials, np.int64))
    allv = np.concatenate(out).astype(U32)
    allv = np.concatenate([allv, allv | U32(0x80000000)])  # both signs
    pad = (-len(allv)) % 8
    return np.concatenate([allv, allv[:pad]])


def check_chunk(v_bits: np.ndarray) -> int:
    """Mismatches of the emulated encoder against the reference (and of its packing)."""
    got = packed_nibbles(v_bits)
    bad = int(np.count_nonzero(got != expected_nibbles(v_bits)))
    words = pack8(got)
    want = np.zeros(len(words), U32)
    n = got.reshape(-1, 8).astype(U32)
    for i in range(8):
        want |= n[:, i] << U32(4 * i)
    return bad + int(np.count_nonzero(words != want))


def test_special_values():
    v = special_patterns()
    assert check_chunk(v) == 0


# The sweep both encoder emulations run (tests/test_e2m1_value.py imports it): 2^20
# consecutive patterns from ``chunk << 20`` for tiny values, the encoder's range around 0.25-8
# (0x3E8-0x410), the NaN / inf edge (0x7F8) and the negative mirrors; all 2^32 on request.
SAMPLED_CHUNKS = [0, 0x3E8, 0x3F0, 0x400, 0x408, 0x7F8, 0x800, 0xBE8, 0xFF8]
FULL_SPACE = pytest.mark.skipif(
    not os.environ.get("CUTEQUANT_E2M1_FULL"), reason="set CUTEQUANT_E2M1_FULL=1"
)


def sampled_patterns(chunk: int) -> np.ndarray:
    return (np.arange(1 << 20, dtype=np.uint64) + (chunk << 20)).astype(U32)


def full_space_mismatches(check) -> int:
    """``check`` (patterns -> mismatches) summed over all 2^32 fp32 patterns, 2^24 at a time."""
    bad = 0
    for chunk in range(1 << 8):
        bad += check((np.arange(1 << 24, dtype=np.uint64) + (chunk << 24)).astype(U32))
    return bad


def sweep_tests(check):
    """The sampled sweep and the full-space test of an encoder emulation's ``check`` (patterns
    -> mismatches against the reference), for a module to bind as its ``test_sampled_chunk,
    test_full_space`` (this one and tests/test_e2m1_value.py)."""

    @pytest.mark.parametrize("chunk", SAMPLED_CHUNKS)
    def test_sampled_chunk(chunk):
        assert check(sampled_patterns(chunk)) == 0

    @FULL_SPACE
    def test_full_space():
        assert full_space_mismatches(check) == 0

    return test_sampled_chunk, test_full_space


test_sampled_chunk, test_full_space = sweep_tests(check_chunk)


def test_sr_step_bits():
    """``stochastic.e2m1_sr_code_bits``: (byte / 512) * p with p = bits(max(bits(a), 1.0) &
    0x7F800000) equals TE's (byte / 256) * step(a) for every a in [0, 6] (and the clamped NaN)."""
    a = np.arange(0, 0x40C00001, 997, dtype=np.int64).astype(U32)  # 0 .. 6.0, every binade
    a = np.concatenate([a, np.array([0x3F800000, 0x3F7FFFFF, 0x40000000, 0x407FFFFF], U32)])
    p = (np.maximum(a, U32(0x3F800000)) & U32(0x7F800000)).view(np.float32)
    af = a.view(np.float32)
    step = np.where(af < 2, 0.5, np.where(af < 4, 1.0, 2.0))
    for byte in (1, 77, 128, 255):
        assert np.array_equal(np.float32(byte / 512) * p, (byte / 256 * step).astype(np.float32))


def test_sr_random_byte_magic():
    """``stochastic.random_bytes_f32``: (byte | 2^14 bits) - 2^14 and (byte << 8 | 2^6 bits) - 2^6
    are byte / 512 exactly, for every byte."""
    b = np.arange(256, dtype=U32)
    want = b.astype(np.float32) / np.float32(512)
    lo = (b | U32(0x46800000)).view(np.float32) - np.float32(16384.0)
    hi = ((b << U32(8)) | U32(0x42800000)).view(np.float32) - np.float32(64.0)
    assert np.array_equal(lo, want) and np.array_equal(hi, want)


def test_sr_random_byte_prmt():
    """``stochastic.random_bytes_f32_prmt``: byte k of the word into byte 0 of BYTE_MAGIC
    (PRMT selector 0x765k: result byte 0 from the word's byte k, bytes 1-3 from the magic's)
    minus 2^14 is byte k / 512 exactly, for every byte at every position."""
    from cutequant.kernels import stochastic as sr

    assert sr.BYTE_MAGIC & 0xFF == 0
    b = np.arange(256, dtype=U32)
    for k in range(4):
        word = b << U32(8 * k) | U32(0x5A5A5A5A & ~(0xFF << (8 * k)))  # other bytes: noise
        sel = 0x7650 | k
        got_bits = np.zeros_like(word)
        for i in range(4):  # PTX prmt: result byte i = byte (sel >> 4 i) & 7 of {magic, word}
            src = (sel >> (4 * i)) & 7
            byte = (word >> U32(8 * src)) if src < 4 else (U32(sr.BYTE_MAGIC) >> U32(8 * (src - 4)))
            got_bits |= (byte & U32(0xFF)) << U32(8 * i)
        got = got_bits.view(np.float32) - np.float32(16384.0)
        assert np.array_equal(got, b.astype(np.float32) / np.float32(512))


def _sr_floor_code(t):
    """``stochastic.e2m1_sr_code_bits``'s floor: bits(rz(t * 2^-126)) >> 22, emulated (t >= 1:
    an exponent shift; t < 1: the subnormal mantissa floor(t * 2^23): units of 2^-149)."""
    bits = t.view(U32).astype(np.int64)
    normal = bits - (126 << 23)
    sub = np.floor(t.astype(np.float64) * 2.0**23).astype(np.int64)
    return np.where(t >= 1, normal, sub) >> 22


def test_sr_grid_floor():
    """The SR floor onto the e2m1 grid through a subnormal shift equals TE's
    min(floor(t / step(t)) * step(t), 6) for every fp32 t in [0, 8) (stride 61, the binade
    and grid edges and their neighbours), as a code."""
    t = np.arange(0, 0x41000000, 61, dtype=np.int64).astype(U32)
    edges = np.array([0x3F000000, 0x3F800000, 0x3FC00000, 0x40000000, 0x40400000], np.int64)
    edges = np.concatenate([edges, np.array([0x40800000, 0x40C00000], np.int64)])
    near = (edges[:, None] + np.arange(-3, 4)[None, :]).ravel().astype(U32)
    t = np.concatenate([t, near, np.array([0, 1], U32)])
    tf = t.view(np.float32)
    step = np.where(tf < 2, 0.5, np.where(tf < 4, 1.0, 2.0)).astype(np.float32)
    q = np.fmin(np.floor(tf / step) * step, np.float32(6.0))
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    want = np.searchsorted(grid, q)
    assert np.array_equal(grid[want], q)
    assert np.array_equal(_sr_floor_code(tf), want)
