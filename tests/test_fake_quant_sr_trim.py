"""CPU emulation of ``fake_quant.e2m1_sr_sub`` (``sr_trim`` of the fake-quant specs): the exact
instruction sequence in numpy (AND, signed wrapped add-max for p', PRMT of the byte into bits
16-23 of zero, IEEE fp32 FFMA with the exact product, the rz floor against p' * 2^-102, the
exact subtraction, min.f32 with 6 (NaN -> 6), the sign OR) against an emulation of the
sequence it replaces (``e2m1_sr_value_rz`` / ``e2m1_sr_mag_rz`` with
``stochastic.random_bytes_f32_prmt``'s byte / 512), for every random byte on specials, every
e2m1 grid / binade edge +-3 ulps, every exponent (both ends of each binade, where p' overflows
or wraps) and random fp32 patterns. ``CUTEQUANT_SR_FULL=1``: 2^18 random patterns more."""

import os

import numpy as np
import pytest
from test_nvfp4_sr import MASK, U32, bits, f32

from cutequant.codegen import specs as S
from cutequant.kernels import fake_quant as fq
from cutequant.kernels import nvfp4_sr as srq


def floor_rz(t: np.ndarray, big: np.ndarray) -> np.ndarray:
    """fma.rz(p, M, t) - p M (exact) with big = p M = p 2^22 (a power of two >= 2^22): the fp32
    numbers of [big, 2 big) are the multiples of big 2^-23, so for finite 0 <= t < big the rz
    sum is big + floor(t / ulp) ulp; else NaN (the caller's min turns it into 6: from t >= big
    on the result is >= big > 6, inf - inf or NaN is NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        ulp = big.astype(np.float64) * 2.0**-23
        ok = np.isfinite(t) & np.isfinite(big) & (t.astype(np.float64) < big)
        val = np.floor(t.astype(np.float64) / np.where(ok, ulp, 1.0)) * ulp
    return np.where(ok, val, np.nan).astype(np.float32)


def fmin6(x: np.ndarray) -> np.ndarray:
    """min.f32(x, 6): the non-NaN operand when one is NaN."""
    return np.where(np.isnan(x), np.float32(6.0), np.minimum(x, np.float32(6.0))).astype(np.float32)


def old_mag(v: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """``e2m1_sr_mag_rz(v, byte / 512)``: a = fmin(|v|, 6), p = (max(bits a, 1.0)) & exponent,
    t = fma(rb, p, a), the rz floor against p 2^22."""
    a = fmin6(np.abs(v))
    p = f32(np.maximum(bits(a), U32(0x3F800000)) & U32(0x7F800000))
    rb = (byte.astype(np.float32) / np.float32(512.0)).astype(np.float32)
    t = (a + rb * p).astype(np.float32)  # product exact, one fp32 rounding
    return floor_rz(t, p * np.float32(fq.RHT_MAGIC))


def new_mag(v: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """``fake_quant._sr_sub_ptx``'s sequence, without the sign."""
    e = (bits(v) & U32(0x7F800000)).astype(np.int64)
    s = (e + srq.P_BIAS) & MASK
    s = np.where(s >= 1 << 31, s - (1 << 32), s)  # the add wraps, the max is signed
    p = f32(np.maximum(s, srq.P_MIN).astype(U32))
    r = f32(byte.astype(U32) << U32(16))  # PRMT: byte * 2^-133, a subnormal
    with np.errstate(invalid="ignore", over="ignore"):
        t = (np.abs(v) + r * p).astype(np.float32)  # exact product (or inf / NaN), one rounding
        big = (p * f32(U32(fq.SUB_MAGIC))).astype(np.float32)  # exact: p 2^22
    return fmin6(floor_rz(t, big))


def signed(mag: np.ndarray, v: np.ndarray) -> np.ndarray:
    return bits(mag) | (bits(v) & U32(0x80000000))


def check(v: np.ndarray):
    v = np.asarray(v, dtype=np.float32).reshape(-1)
    v = np.concatenate([v, -v])
    vv = np.repeat(v, 256)
    byte = np.tile(np.arange(256, dtype=U32), v.size)
    want, got = old_mag(vv, byte), new_mag(vv, byte)
    bad = bits(want) != bits(got)
    assert not bad.any(), (vv[bad][:8], byte[bad][:8], want[bad][:8], got[bad][:8])
    assert (signed(want, vv) == signed(got, vv)).all()


def _edges() -> np.ndarray:
    grid = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0]
    grid += [16.0, 32.0, 64.0, 2.0**22, 2.0**23, 2.0**100, 2.0**126, 3.4e38]
    base = bits(np.array(grid, dtype=np.float32)).astype(np.int64)
    out = [np.clip(base + d, 0, 0x7F7FFFFF) for d in range(-3, 4)]
    exps = np.arange(0, 255, dtype=np.int64) << 23  # every binade's first and last value
    out += [exps, exps + 0x7FFFFF, np.array([1, 2, 0x7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001])]
    return f32(np.concatenate(out).astype(U32))


def test_specials_and_edges():
    check(_edges())


def test_random_patterns():
    gen = np.random.default_rng(20)
    check(gen.uniform(0, 8, 4096).astype(np.float32))
    check(gen.uniform(0, 1, 2048).astype(np.float32))
    check(f32(gen.integers(0, 0x7F800000, 2048, dtype=np.int64).astype(U32)))


@pytest.mark.skipif(os.environ.get("CUTEQUANT_SR_FULL") != "1", reason="CUTEQUANT_SR_FULL=1")
def test_random_patterns_full():
    gen = np.random.default_rng(21)
    for _ in range(64):
        check(f32(gen.integers(0, 0x80000000, 4096, dtype=np.int64).astype(U32)))


def test_mutations_fail():
    """The emulation notices a wrong constant (the test is not vacuous)."""
    v = np.repeat(_edges(), 256)
    byte = np.tile(np.arange(256, dtype=U32), _edges().size)
    want = bits(old_mag(v, byte))
    saved = srq.P_BIAS
    try:
        srq.P_BIAS = 123 << 23
        assert (bits(new_mag(v, byte)) != want).any()
    finally:
        srq.P_BIAS = saved
    saved = fq.SUB_MAGIC
    try:
        fq.SUB_MAGIC = 0x0D000000  # 2^-101
        assert (bits(new_mag(v, byte)) != want).any()
    finally:
        fq.SUB_MAGIC = saved


def test_spec_rules_and_switch(monkeypatch):
    from cutequant import fake_quant

    for cls in (S.FakeQuantRowsSpec, S.FakeQuantColsSpec):
        with pytest.raises(ValueError, match="sr_trim"):
            cls(sr_trim=True)
        assert '"sr_trim": true' in cls(stochastic=True, sr_trim=True).key()
        assert "sr_trim" not in cls(stochastic=True).key()
    assert fake_quant.SR_TRIM is True  # the default (H200 run 67: 2-3% less time)
    assert fake_quant._sr_trim(True, 1024, 1024)
    assert not fake_quant._sr_trim(True, 1024, 1024, "sm_100a")  # tested on sm_90a only
    monkeypatch.setattr(fake_quant, "SR_TRIM", False)
    assert not fake_quant._sr_trim(True, 1024, 1024)
    monkeypatch.setattr(fake_quant, "SR_TRIM", True)
    assert not fake_quant._sr_trim(False, 1024, 1024)
    assert not fake_quant._sr_trim(True, 1 << 20, 1 << 16)  # 2^32 blocks: 64-bit ids
