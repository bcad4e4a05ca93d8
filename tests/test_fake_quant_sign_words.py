"""CPU: numpy models of branch fq6's identities in the stochastic rowwise fake-quant kernel
(``kernels/fake_quant.py``, ``fake_quant_rows.py.j2``).

* signs from x's words: the kernel multiplies the *unsigned* e2m1 value by sf and S_dec, packs two
  results into a 16-bit pair and takes the pair's sign bits from x's word in the same place
  (``sign_select``), except in blocks whose scale is NaN (mask 0). Checked against the per-value
  path (s's sign on the magnitude, then the two multiplies, then the pack) on a model of the
  device's fp32 arithmetic (RNE, canonical NaN results, min.f32 returning the non-NaN operand,
  cvt.rn to bf16 / f16 with the canonical 16-bit NaN): every e4m3 scale byte, S_dec of both
  signs and over the range, x from every bf16 special and random patterns, every random byte
  (a random byte per element, plus all 256 bytes on the specials). Left out as
  unreachable: a NaN x with a non-NaN scale (its block's amax is NaN), and a scale whose sign
  differs from S_dec's (the kernels' cvt of amax (>= +0) x S_enc / 6 keeps S_enc's sign,
  zeros included: ``test_scale_sign_follows_s_dec``); there sf S_dec can round to -0, enc is
  -inf and x = +0 gives s = NaN -> +6, whose sign x's word does not carry.
* the block amax: the block |max| by packed bf16x2 trees equals the fp32 FMNMX chain
  (same value, NaN where any element is NaN).
* the random bytes by PRMT reuse ``stochastic.random_bytes_f32_prmt``, which
  tests/test_e2m1_packed.py (``test_sr_random_byte_prmt``) emulates.
"""

import numpy as np
import torch
from test_e2m1_packed import special_patterns

from cutequant import reference

U32 = np.uint32
F32 = np.float32
CANON = U32(0x7FFFFFFF)
FLT_MAX = np.finfo(np.float32).max


def _canon(v: np.ndarray) -> np.ndarray:
    """A device arithmetic result: any NaN is the canonical 0x7FFFFFFF."""
    b = v.astype(F32).view(U32).copy()
    b[np.isnan(v)] = CANON
    return b.view(F32)


def _mul(a, b):
    with np.errstate(all="ignore"):
        return _canon(a.astype(F32) * b.astype(F32))


def _unit(a):
    return (np.maximum(a.view(U32), U32(0x3F800000)) & U32(0x7F800000)).view(F32)


def _mag(s: np.ndarray, byte) -> np.ndarray:
    """The unsigned SR e2m1 value of s (``e2m1_sr_mag_rz``: t = RN(a + byte / 512 p), floored to
    the step p / 2 of a's binade exactly)."""
    with np.errstate(invalid="ignore"):
        a = np.fmin(np.abs(s), F32(6.0))  # min.f32: NaN -> 6
    p = _unit(a)
    t = (a + (byte.astype(F32) / F32(512)) * p).astype(F32)
    half = p.astype(np.float64) / 2
    return (np.floor(t.astype(np.float64) / half) * half).astype(F32)


def _pack16(v: np.ndarray, out_dtype: str) -> np.ndarray:
    """cvt.rn.{bf16,f16}x2.f32 of one half: RNE, overflow to inf, NaN -> 0x7FFF."""
    if out_dtype == "f16":
        with np.errstate(all="ignore"):
            h = v.astype(np.float16).view(np.uint16).astype(U32)
    else:
        b = v.view(U32).astype(np.uint64)
        h = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(U32)
    h[np.isnan(v)] = 0x7FFF
    return h


def _both(x, sf, s_dec, byte, out_dtype):
    """(old, new) 16-bit outputs of the value path for fp32 x (a bf16 value), per-element sf and
    S_dec."""
    with np.errstate(all="ignore"):
        enc = np.fmin(_canon(F32(1.0) / _mul(sf, s_dec)), FLT_MAX)  # fmin(rcp.rn, FLT_MAX)
    s = _mul(x, enc)
    mag = _mag(s, byte)
    signed = (mag.view(U32) | (s.view(U32) & U32(0x80000000))).view(F32)
    old = _pack16(_mul(_mul(signed, sf), s_dec), out_dtype)
    new_p = _pack16(_mul(_mul(mag, sf), s_dec), out_dtype)
    keep = np.where(np.isnan(sf), U32(0), U32(0x8000))  # sign_keep: 0 for the NaN scale
    xs = (x.view(U32) >> U32(16)) & U32(0x8000)
    new = (new_p & ~keep) | (xs & keep)  # sign_select on one half
    # a NaN x makes its block's amax and so sf NaN: other pairings cannot occur
    reach = ~np.isnan(x) | np.isnan(sf)
    return old[reach], new[reach]


def _s_decs():
    gen = np.random.default_rng(2)
    pos = np.concatenate([
        F32(2.0) ** np.arange(-128, 120, 7, dtype=F32),
        (gen.random(24) * 2.0 ** gen.integers(-120, 100, 24)).astype(F32),
        np.array([FLT_MAX / 2688, 1.0 / 2688, 2.0**-128, 1.0], F32),
    ])  # fmt: skip
    return np.concatenate([pos, -pos])


def _xs():
    gen = np.random.default_rng(3)
    sp = special_patterns()
    bf = np.unique(sp & U32(0xFFFF0000))  # bf16 specials (x is bf16)
    rnd = gen.integers(0, 2**16, 3000, dtype=np.uint64).astype(U32) << U32(16)
    x = np.concatenate([bf, rnd])
    return np.concatenate([x, x ^ U32(0x80000000)]).view(F32)


def _check(out_dtype):
    xs = _xs()
    sfs = reference.e4m3_to_float(torch.arange(256, dtype=torch.uint8)).numpy().astype(F32)
    gen = np.random.default_rng(4)
    checked = 0
    for s_dec in _s_decs():
        # every scale byte with S_dec's sign (the kernels' scales have it) and the NaNs
        ok = np.isnan(sfs) | (np.signbit(sfs) == np.signbit(s_dec))
        sf = np.repeat(sfs[ok], xs.size)
        x = np.tile(xs, int(ok.sum()))
        byte = gen.integers(0, 256, x.size).astype(U32)
        old, new = _both(x, sf, np.full(x.size, s_dec, F32), byte, out_dtype)
        bad = np.flatnonzero(old != new)
        assert bad.size == 0, (out_dtype, s_dec, old[bad[:4]], new[bad[:4]])
        checked += old.size
    assert checked > 10**6


def test_sign_words_sr_bf16():
    _check("bf16")


def test_sign_words_sr_f16():
    _check("f16")


def test_sign_words_sr_every_byte_on_specials():
    """Every random byte on the bf16 specials, a few scales and both S_dec signs."""
    xs = np.unique(special_patterns() & U32(0xFFFF0000))
    xs = np.concatenate([xs, xs ^ U32(0x80000000)]).view(F32)
    sfs = reference.e4m3_to_float(
        torch.tensor([0, 1, 8, 0x38, 0x7E, 0x7F, 0x80, 0xB8, 0xFE, 0xFF], dtype=torch.uint8)
    )
    sfs = sfs.numpy().astype(F32)
    for s_dec in (F32(1.0 / 2688), F32(3.5), F32(-0.25)):
        ok = np.isnan(sfs) | (np.signbit(sfs) == np.signbit(s_dec))
        sf = np.repeat(sfs[ok], xs.size * 256)
        x = np.tile(np.repeat(xs, 256), int(ok.sum()))
        byte = np.tile(np.arange(256, dtype=U32), xs.size * int(ok.sum()))
        old, new = _both(x, sf, np.full(x.size, s_dec, F32), byte, "bf16")
        assert np.array_equal(old, new)


def test_scale_sign_follows_s_dec():
    """The kernels' scales: e4m3(fmin(amax * (S_enc / 6), FLT_MAX)) with amax >= +0 (or NaN):
    every non-NaN scale has the sign of S_enc / 6, i.e. S_dec's, zeros included (torch's e4m3
    cast, like the device cvt, keeps the sign of a zero and of an underflow)."""
    amax = torch.tensor([0.0, 1e-30, 1e-10, 1e-3], dtype=torch.float32)
    for s6 in (1e-6, 2.0, -1e-6, -2.0):
        sf = (amax * s6).clamp(max=FLT_MAX).to(torch.float8_e4m3fn).to(torch.float32)
        assert bool((sf == 0).any())
        assert bool((torch.signbit(sf) == (s6 < 0)).all())


def test_rows_block_amax_tree():
    """``fake_quant.rows_block_amax2``'s tree order (pairs of words, then the halves) gives the
    FMNMX chain's |max| of 16 bf16 values: equal values, NaN where any value is NaN."""
    gen = np.random.default_rng(5)
    sp = np.unique(special_patterns() >> U32(16)).astype(np.uint16)
    n = 20000
    vals = gen.integers(0, 2**16, (n, 16), dtype=np.uint64).astype(np.uint16)
    pick = gen.random((n, 16)) < 0.2
    vals[pick] = gen.choice(sp, int(pick.sum()))
    f = (vals.astype(U32) << U32(16)).view(F32)
    chain = np.max(np.abs(f), axis=1)
    chain[np.isnan(f).any(axis=1)] = np.nan
    # words: element 2j in the low half, 2j + 1 in the high half; the tree on halves
    lo = [(vals[:, 2 * j].astype(U32) << U32(16)).view(F32) for j in range(8)]
    hi = [(vals[:, 2 * j + 1].astype(U32) << U32(16)).view(F32) for j in range(8)]

    def tree(level):
        while len(level) > 1:
            nxt = []
            for j in range(len(level) // 2):
                a, b = level[2 * j], level[2 * j + 1]
                m = np.maximum(np.abs(a), np.abs(b))
                m[np.isnan(a) | np.isnan(b)] = np.nan
                nxt.append(m)
            level = nxt
        return level[0]

    top_lo, top_hi = tree(lo), tree(hi)
    got = np.maximum(top_lo, top_hi)
    got[np.isnan(top_lo) | np.isnan(top_hi)] = np.nan
    assert np.array_equal(np.isnan(got), np.isnan(chain))
    ok = ~np.isnan(chain)
    assert np.array_equal(got[ok].view(U32), chain[ok].view(U32))
