"""CPU: numpy emulations of the fake-quant rounding helpers of ``kernels/fake_quant.py``, which
round x * enc straight to the e2m1 grid value instead of encoding a code and decoding it:

* ``e2m1_rn_value``: a = min(|s|, 6); p = 2^floor(log2(max(a, 1))); t = RN(a + p 2^22) (the
  fp32 ulp there is the e2m1 step of a's binade: 0.5 below 2, 1 below 4, 2 up to 6); q = t -
  p 2^22 (exact); the sign of s. Against ``e2m1_decode(e2m1_encode(s))`` of the reference;
* the SR floor as an rz product: the code bits ``bits(rz(t 2^-126)) >> 22`` (checked in
  tests/test_e2m1_packed.py) kept in place (& 0xFFC00000) and scaled back by 2^126 are the
  code's value; ``e2m1_sr_value_rz``'s fma.rz floor (the fake-quant kernels') equals it.

Both fmas of the RN helper are exact sums of an exactly representable product (p 2^22), so a
float32 add in numpy is the same single rounding. CI runs the specials and nine 2^20-pattern
chunks; all 2^32 patterns (a few minutes): ``CUTEQUANT_E2M1_FULL=1 pytest
tests/test_e2m1_value.py -k full``. The GPU runs the real instructions over all 2^32 patterns in
tests/test_gpu_e2m1_exhaustive.py.
"""

import os

import numpy as np
import torch
from test_e2m1_packed import special_patterns, sweep_tests

from cutequant import reference

U32 = np.uint32
MAGIC = np.float32(2.0**22)


def rn_value(s_bits: np.ndarray) -> np.ndarray:
    """The exact instruction sequence of ``fake_quant.e2m1_rn_value`` on fp32 bit patterns;
    returns the result's bit patterns."""
    s = s_bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        a = np.fmin(np.abs(s), np.float32(6.0))  # min.f32: NaN -> 6
    p = (np.maximum(a.view(U32), U32(0x3F800000)) & U32(0x7F800000)).view(np.float32)
    m = p * MAGIC  # exact: a power of 2
    t = (a + m).astype(np.float32)  # fma.rn(p, 2^22, a): one rounding of the exact sum
    q = (t - m).astype(np.float32)  # fma.rn(p, -2^22, t): exact
    return q.view(U32) | (s_bits & U32(0x80000000))


def expected_value_bits(s_bits: np.ndarray) -> np.ndarray:
    """``e2m1_decode(e2m1_encode(s))`` as bits, except a NaN with the sign bit set: the device
    takes the sign from bit 31 (-6; the kernels only ever see the canonical NaN of x * enc)."""
    s = torch.from_numpy(s_bits.view(np.float32).copy())
    want = reference.e2m1_decode(reference.e2m1_encode(s)).numpy().view(U32)
    neg_nan = np.isnan(s_bits.view(np.float32)) & (s_bits >> U32(31) == 1)
    return np.where(neg_nan, np.float32(-6.0).view(U32), want)


def check_chunk(s_bits: np.ndarray) -> int:
    return int(np.count_nonzero(rn_value(s_bits) != expected_value_bits(s_bits)))


def test_special_values():
    assert check_chunk(special_patterns()) == 0


def test_ties_and_signed_zero():
    """Every tie goes to the even code; negative values rounding to 0 keep the sign (-0)."""
    s = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.0, 0.0, -1e-30, 7.0], np.float32)
    want = np.array([0, 1, 1, 2, 2, 4, 4, -0.0, -0.0, 0, -0.0, 6], np.float32)
    assert np.array_equal(rn_value(s.view(U32)), want.view(U32))


# the sampled sweep (and, on request, all 2^32 patterns) of tests/test_e2m1_packed.py
test_sampled_chunk, test_full_space = sweep_tests(check_chunk)


def test_sr_value_of_code():
    """The rz-product floor's bits in place, bits(t 2^-126 rz) & 0xFFC00000 = code << 22
    (a subnormal for codes 0-1, else exponent + top mantissa bit), times 2^126, is the code's
    grid value, for every code."""
    codes = np.arange(8, dtype=U32)
    got = (codes << U32(22)).view(np.float32) * np.float32(2.0**126)
    want = reference.e2m1_decode(torch.arange(8)).numpy()
    assert np.array_equal(got, want)


def test_sr_value_floor():
    """The whole SR value step for t in [0, 8): mask of the rz product, times 2^126, equals TE's
    min(floor(t / step(t)) * step(t), 6) (stride 61 over every fp32 in range)."""
    t = np.arange(0, 0x41000000, 61, dtype=np.int64).astype(U32)
    t = np.concatenate([t, np.array([0x40BFFFFF, 0x40C00000, 0x40FFFFFF], U32)])
    tf = t.view(np.float32)
    # rz(t * 2^-126): t >= 1 an exponent shift (exact); t < 1 the subnormal floor(t 2^23) 2^-149
    sub = (np.floor(tf.astype(np.float64) * 2.0**23).astype(np.int64)).astype(U32)
    rz = np.where(tf >= 1, t - U32(126 << 23), sub)
    got = (rz & U32(0xFFC00000)).view(np.float32) * np.float32(2.0**126)
    step = np.where(tf < 2, 0.5, np.where(tf < 4, 1.0, 2.0)).astype(np.float32)
    want = np.fmin(np.floor(tf / step) * step, np.float32(6.0))
    assert np.array_equal(got, want)


def _rz126_value(t: np.ndarray) -> np.ndarray:
    """The rz-product floor of t (fp32, [0, 8)): rz(t 2^-126) & 0xFFC00000, times 2^126."""
    tb = t.view(U32)
    sub = (np.floor(t.astype(np.float64) * 2.0**23).astype(np.int64)).astype(U32)
    rz = np.where(t >= 1, tb - U32(126 << 23), sub)
    return (rz & U32(0xFFC00000)).view(np.float32) * np.float32(2.0**126)


def _fma_rz_value(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``e2m1_sr_value_rz``'s floor: rz(p 2^22 + t) - p 2^22. The exact sum lies in [p 2^22,
    p 2^23) (asserted), where fp32's ulp is p / 2, so rounding toward zero is p 2^22 + floor(t /
    (p / 2)) (p / 2), done exactly in float64; the subtraction is exact."""
    m = p.astype(np.float64) * 2.0**22
    t64 = t.astype(np.float64)
    assert bool(np.all(t64 < m)), "p 2^22 + t left the binade"
    half = p.astype(np.float64) / 2
    return ((m + np.floor(t64 / half) * half) - m).astype(np.float32)


def _reachable(t: np.ndarray):
    """(t, p) for every p under which t = fma(rb, p, a) can occur: p = 1 (a < 2) gives t <
    2 + 255/512, p = 2 (2 <= a < 4) t in [2, 5), p = 4 (4 <= a <= 6) t in [4, 8)."""
    ts, ps = [], []
    for p, lo, hi in ((1, 0.0, 2.5), (2, 2.0, 5.0), (4, 4.0, 8.0)):
        sel = t[(t >= lo) & (t < hi)]
        ts.append(sel)
        ps.append(np.full(sel.shape, p, np.float32))
    return np.concatenate(ts), np.concatenate(ps)


def _edges():
    """fp32 t within 300 ulps of every grid point, binade edge and 2.5 p bound in [0, 8]."""
    points = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 0.25, 0.125]
    bits = np.array([np.float32(v).view(U32) for v in points], np.int64)
    out = (bits[:, None] + np.arange(-300, 301)[None, :]).reshape(-1)
    out = out[(out >= 0) & (out < 0x41000000)].astype(U32)
    return out.view(np.float32)


def test_sr_value_rz_floor():
    """``e2m1_sr_value_rz``: rz(p 2^22 + t) - p 2^22 equals the rz-product floor (and so
    TE's min(floor(t / step(t)) * step(t), 6), ``test_sr_value_floor``) for every p t can occur
    with: stride 61 over every fp32 t in [0, 8) plus the edges; all of [2^-3, 8) with
    CUTEQUANT_E2M1_FULL=1 (below 2^-3 both are 0 for every p)."""
    stride = np.arange(0, 0x41000000, 61, dtype=np.int64).astype(U32).view(np.float32)
    chunks = [stride, _edges()]
    if os.environ.get("CUTEQUANT_E2M1_FULL"):
        lo, end = int(np.float32(0.125).view(U32)), 0x41000000
        for a in range(lo, end, 1 << 24):
            chunks.append(np.arange(a, min(a + (1 << 24), end), dtype=np.int64).astype(U32))
            chunks[-1] = chunks[-1].view(np.float32)
    for t in chunks:
        tt, pp = _reachable(t)
        assert np.array_equal(_fma_rz_value(tt, pp), _rz126_value(tt))


def _sr_values(s: np.ndarray, byte: np.ndarray, floor) -> np.ndarray:
    """The SR value path on fp32 ``s`` (x * enc) and random bytes: a = min(|s|, 6) (NaN -> 6),
    p, t = RN(a + (byte / 512) p) (the product is exact, so numpy's add is the fma's one
    rounding), the floor, then s's sign bit; returns bit patterns."""
    with np.errstate(invalid="ignore"):
        a = np.fmin(np.abs(s), np.float32(6.0))
    p = (np.maximum(a.view(U32), U32(0x3F800000)) & U32(0x7F800000)).view(np.float32)
    t = (a + (byte.astype(np.float32) / np.float32(512)) * p).astype(np.float32)
    mag = floor(t, p)
    return mag.view(U32) | (s.view(U32) & U32(0x80000000))


def test_sr_value_rz_equals_the_rz126_value():
    """The whole per-value SR step, old floor against the fma.rz floor, bit for bit: specials,
    the grid / binade edges scaled into every binade of [2^-3, 6] and 2^15 random patterns,
    each with every random byte, both signs."""
    gen = np.random.default_rng(1)
    s = np.concatenate([
        special_patterns().view(np.float32),
        _edges(),
        gen.integers(0, 2**32, 2**15, dtype=np.uint64).astype(U32).view(np.float32),
        (gen.random(2**14) * 7).astype(np.float32),
    ])  # fmt: skip
    s = np.concatenate([s, -s])
    byte = np.arange(256, dtype=U32)
    ss = np.repeat(s, 256)
    bb = np.tile(byte, s.size)
    old = _sr_values(ss, bb, lambda t, p: _rz126_value(t))
    new = _sr_values(ss, bb, _fma_rz_value)
    assert np.array_equal(old, new)


def test_value_times_sf_then_s_dec_is_the_dequantize():
    """The value path of the fake-quant kernels (columnwise, rowwise SR, 2D since issue 20):
    f32(f32(q * sf) * S_dec) with two fp32 multiplies is the dequantize kernel's result, which
    takes e2m1 * sf in f16 (HMUL2), widens it and multiplies by S_dec: q * sf has at most 2 + 4
    significant bits and lies in [2^-10, 2688], exact in both f16 and fp32, so the one rounding
    left is the S_dec multiply in both. Every signed e2m1 value x every finite non-negative e4m3
    scale x S_dec over the whole range (subnormal results and overflow included)."""
    q = reference.e2m1_decode(torch.arange(16)).numpy().astype(np.float32)
    sf = reference.e4m3_to_float(torch.arange(127, dtype=torch.uint8)).numpy().astype(np.float32)
    gen = np.random.default_rng(0)
    s_dec = np.concatenate([
        np.float32(2.0) ** np.arange(-149, 128, dtype=np.float32),
        (gen.random(4000) * 2.0 ** gen.integers(-140, 120, 4000)).astype(np.float32),
        np.array([np.finfo(np.float32).max, np.finfo(np.float32).tiny], np.float32),
    ])  # fmt: skip
    prod32 = q[:, None] * sf[None, :]
    assert np.array_equal(prod32.astype(np.float64), q[:, None].astype(np.float64) * sf[None, :])
    prod16 = (q[:, None].astype(np.float16) * sf[None, :].astype(np.float16)).astype(np.float32)
    assert np.array_equal(prod16.view(U32), prod32.view(U32))  # signed zeros included
    with np.errstate(over="ignore"):
        got = prod32[:, :, None] * s_dec[None, None, :]
        want = prod16[:, :, None] * s_dec[None, None, :]
    assert np.array_equal(got.view(U32), want.view(U32))
