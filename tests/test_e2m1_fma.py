"""CPU: a numpy emulation of the FMA-pipe e2m1 encoder's exact instruction sequence
(``kernels/nvfp4_fma.py``: ``pair_codes``, ``e2m1x8``) against ``cutequant.reference.e2m1_encode``
and against the emulation of the encoder it replaces (tests/test_e2m1_packed.py).

The pair step after the round to odd depends on one bf16 pattern per value, so it is emulated
once for all 2^16 patterns (``PAIR_LUT``: the bf16 add / fma rounded once from the exact sum, the
PTX min rule for NaN) and checked exhaustively; the per-value sweeps index it. CI runs the
specials and nine 2^20-pattern chunks (tests/test_e2m1_packed.py's); all 2^32 patterns (a few
minutes on one core): ``CUTEQUANT_E2M1_FULL=1 pytest tests/test_e2m1_fma.py -k full``. The GPU
runs the real instructions over all 2^32 patterns in tests/test_gpu_e2m1_exhaustive.py.
"""

import numpy as np
import torch
from test_e2m1_packed import (
    expected_nibbles,
    pack8,
    packed_nibbles,
    prmt,
    special_patterns,
    sweep_tests,
)

from cutequant import reference
from cutequant.kernels import nvfp4_fma as fma

U32 = np.uint32
M32 = 0xFFFFFFFF


def bf16_from_f64(x: np.ndarray) -> np.ndarray:
    """float64 -> bf16 bits, one RNE rounding (overflow -> inf, NaN -> 0x7FFF); the results here
    are >= 63, so no bf16 subnormal case arises."""
    b = x.view(np.uint64)
    lsb = (b >> np.uint64(45)) & np.uint64(1)  # 52 - 7 mantissa bits dropped
    r = (b + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    y = r.view(np.float64).astype(np.float32)  # exact: 8 significant bits (or inf on overflow)
    out = (y.view(U32) >> U32(16)).astype(U32)
    return np.where(np.isnan(x), U32(0x7FFF), out)


def bf16_f64(h: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN patterns stay NaN
        return (h.astype(U32) << U32(16)).view(np.float32).astype(np.float64)


def bf16_min(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``min.bf16x2`` on one half: a NaN operand gives the other one (both NaN: NaN)."""
    xf, yf = bf16_f64(x), bf16_f64(y)
    return np.where(np.isnan(xf), y, np.where(np.isnan(yf), x, np.where(xf <= yf, x, y)))


def pair_step(a: np.ndarray) -> np.ndarray:
    """``pair_codes`` after the round to odd, on one half: a = |rto| (bf16 bits, sign clear) ->
    min(RN(a + 126), RN(a * 0.5 + 128), 131) as bf16 bits. The sums are exact in float64 for
    a >= 2^-30 (a has 8 significant bits); below, float64 returns 126 / 128 (+ less than 2^-30),
    which rounds like the exact sum (the nearest bf16 midpoint is 0.25 away)."""
    af = bf16_f64(a)
    add_a, mul_b, add_b = (
        bf16_f64(np.array(k & 0xFFFF, U32)) for k in (fma.ADD_A, fma.MUL_B, fma.ADD_B)
    )
    with np.errstate(invalid="ignore", over="ignore"):
        ta = bf16_from_f64(af + add_a)
        tb = bf16_from_f64(af * mul_b + add_b)
    return bf16_min(bf16_min(ta, tb), np.full_like(a, fma.SAT & 0xFFFF))


# the pair step of every bf16 pattern (the sign bit cleared first, as the LOP3 does)
PAIR_LUT = pair_step(np.arange(1 << 16, dtype=U32) & U32(0x7FFF))


def mad(a, b, c):
    """mad.lo.u32: a * b + c (mod 2^32)."""
    return ((a.astype(np.uint64) * np.uint64(b) + c.astype(np.uint64)) & np.uint64(M32)).astype(U32)


def fma_words(v_bits: np.ndarray) -> np.ndarray:
    """``nvfp4_fma.e2m1x8`` on rows of 8 fp32 patterns -> one word per row."""
    b = v_bits.reshape(-1, 8).astype(U32)
    upper = [prmt(b[:, j], b[:, j + 4], 0x7632) for j in range(4)]
    lower = [prmt(b[:, j], b[:, j + 4], 0x5410) for j in range(4)]
    codes = []
    for j in range(4):
        # min.u16x2(lower, 0x00010001): the sticky bit of each half
        s = np.minimum(lower[j] & U32(0xFFFF), U32(1))
        s |= np.minimum(lower[j] >> U32(16), U32(1)) << U32(16)
        a = (upper[j] | s) & U32(0x7FFF7FFF)  # lop3 0xA8
        codes.append(PAIR_LUT[a & U32(0xFFFF)] | (PAIR_LUT[a >> U32(16)] << U32(16)))
    even_sign = prmt(upper[0], upper[2], 0xFBD9)
    odd_sign = prmt(upper[1], upper[3], 0xFBD9)
    w = mad(codes[3], 16, codes[2])
    w = mad(w, 16, codes[1])
    w = mad(w, 16, codes[0])
    w = mad(even_sign, fma.SIGN_EVEN, w)
    w = mad(odd_sign, fma.SIGN_ODD, w)
    return mad(np.ones_like(w), fma.NEG_BASE, w)


def nibble_words(nibbles: np.ndarray) -> np.ndarray:
    n = nibbles.reshape(-1, 8).astype(U32)
    out = np.zeros(len(n), U32)
    for i in range(8):
        out |= n[:, i] << U32(4 * i)
    return out


def check_chunk(v_bits: np.ndarray) -> int:
    """Words that differ from the reference's nibbles, plus words that differ from the replaced
    encoder's emulation (``pack8(packed_nibbles)``)."""
    got = fma_words(v_bits)
    want = nibble_words(expected_nibbles(v_bits))
    old = pack8(packed_nibbles(v_bits))
    return int(np.count_nonzero(got != want)) + int(np.count_nonzero(got != old))


def test_pair_step_every_bf16_pattern():
    """Every non-negative bf16 pattern (NaNs and inf included) -> CODE_BASE + its e2m1 code."""
    a = np.arange(0x8000, dtype=U32)
    codes = PAIR_LUT[a].astype(np.int64) - fma.CODE_BASE
    ref = reference.e2m1_encode(torch.from_numpy((a << U32(16)).view(np.float32).copy()))
    assert np.array_equal(codes, ref.numpy().astype(np.int64))


def test_constants_in_ptx():
    """The emulated constants are the ones in the device PTX (and the sign multipliers invert
    the 0xFF bytes exactly)."""
    ptx = fma._PAIR_CODES
    for k in (fma.ADD_A, fma.ADD_B, fma.SAT):
        assert f"{k:#x}" in ptx
    assert "add.rn.bf16x2" in ptx and "fma.rn.bf16x2" in ptx
    assert (255 * fma.INV255) & M32 == 1
    p = np.array([0, 1, 0x01000100, 0x01010101, 0x00010001], U32)
    assert np.array_equal(mad(p * U32(255), fma.SIGN_EVEN, np.zeros_like(p)), p * U32(8))
    assert np.array_equal(mad(p * U32(255), fma.SIGN_ODD, np.zeros_like(p)), p * U32(128))
    assert fma.encoder_constants.__doc__ and fma.MUL_B == 0x3F003F00


def test_special_values():
    assert check_chunk(special_patterns()) == 0


test_sampled_chunk, test_full_space = sweep_tests(check_chunk)


def test_block_amax_pair_step():
    """``nvfp4_fma.bf16_block_amaxes``' last step: the low half of max.NaN.xorsign.abs.bf16x2(w,
    {hi, hi}), widened and |.|'d, against ``nvfp4_blocks``' fp32 form fabs(max.NaN(lo, hi)), for
    every bf16 lo against 96 hi patterns (both signs: +-0, subnormals, 1, inf, NaNs, random):
    the same value or both NaN (block_scales2's fmin then maps any NaN to FLT_MAX)."""
    assert "max.NaN.xorsign.abs.bf16x2 $0, $1, t" in fma._PAIR_ABSMAX
    assert "mov.b32 t, {hi, hi}" in fma._PAIR_ABSMAX
    his = [0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x7F7F, 0x7F80, 0x7F81, 0x7FC0, 0x7FFF]
    his += [int(h) for h in np.random.default_rng(0).integers(0, 0x8000, 38)]
    his = np.array(his + [h | 0x8000 for h in his], U32)
    lo = np.tile(np.arange(1 << 16, dtype=U32), len(his))
    hi = np.repeat(his, 1 << 16)
    lo_f, hi_f = bf16_f64(lo), bf16_f64(hi)
    nan = np.isnan(lo_f) | np.isnan(hi_f)
    # the instruction on the low half: NaN (canonical) if either is, else max(|lo|, |hi|) with
    # the XOR of the signs; the kernel keeps only its magnitude
    got = np.where(nan, np.nan, np.maximum(np.abs(lo_f), np.abs(hi_f)))
    # the old form: FMNMX.NAN of the widened halves with |.| on both operands, then fabs
    old = np.abs(np.where(nan, np.nan, np.where(np.abs(lo_f) >= np.abs(hi_f), lo_f, hi_f)))
    assert np.array_equal(np.isnan(got), np.isnan(old))
    assert np.array_equal(got[~nan], old[~nan])


def test_switch_and_spec_rules(monkeypatch):
    """``nvfp4.FMA_ENCODER`` reaches only the RN alu_trim kernels of sm_90a; the spec refuses
    the others, and leaves the field out of the key when it is off."""
    import pytest

    from cutequant import nvfp4
    from cutequant.codegen import specs as S

    monkeypatch.setattr(nvfp4, "FMA_ENCODER", True)
    assert nvfp4.fma_encoder(True, False, "sm_90a")
    assert not nvfp4.fma_encoder(False, False, "sm_90a")  # calls of 2^32 elements or more
    assert not nvfp4.fma_encoder(True, True, "sm_90a")  # SR
    assert not nvfp4.fma_encoder(True, False, "sm_100a")  # the hardware cvt
    monkeypatch.setattr(nvfp4, "FMA_ENCODER", False)
    assert not nvfp4.fma_encoder(True, False, "sm_90a")
    on = nvfp4._spec("sm_90a", True, True, True, False, False, False, trim=True, fma=True)
    assert on.fma_encoder and '"fma_encoder": true' in on.key()
    assert "fma_encoder" not in S.Nvfp4QuantizeSpec(alu_trim=True).key()
    for bad in (dict(), dict(alu_trim=True, stochastic=True), dict(alu_trim=True, arch="sm_100a")):
        with pytest.raises(ValueError, match="fma_encoder"):
            S.Nvfp4QuantizeSpec(fma_encoder=True, **bad)
