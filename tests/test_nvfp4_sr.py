"""CPU emulation of ``kernels/nvfp4_sr.py`` (``Nvfp4QuantizeSpec.sr_trim``): the exact
instruction sequence in numpy (integer ops on bit patterns, IEEE fp32 adds, the rz multiply
emulated exactly) against ``reference.e2m1_encode_sr`` (TE's rule written literally) and against
an emulation of the sequence it replaces (``stochastic.e2m1x8_sr``), for every random byte on
the specials, every e2m1 grid / binade edge +-3 ulps, the exponents where p' wraps, and random
fp32 patterns. ``CUTEQUANT_SR_FULL=1``: also 2^19 random patterns x both signs x every byte."""

import os

import numpy as np
import pytest
import torch

from cutequant import reference
from cutequant.codegen import specs as S
from cutequant.kernels import nvfp4_fma as fma
from cutequant.kernels import nvfp4_sr as srq

U32 = np.uint32
MASK = 0xFFFFFFFF


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=U32).view(np.float32)


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(U32)


def mul_rz_2m126(t: np.ndarray) -> np.ndarray:
    """bits(mul.rz.f32(t, 2^-126)) for t >= 0, inf, NaN (no .ftz: subnormal results kept)."""
    tb = bits(t).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        normal = t >= 1.0
        sub = np.floor(t.astype(np.float64) * 2.0**23)
    out = np.where(normal, tb - (126 << 23), np.where(t < 1.0, sub, 0)).astype(np.int64)
    out = np.where(np.isinf(t), 0x7F800000, out)
    out = np.where(np.isnan(t), 0x7FFFFFFF, out)
    return out.astype(U32)


def value_grid(v: np.ndarray, byte: np.ndarray) -> np.ndarray:
    """``nvfp4_sr.value_grid``: AND, signed add-max, PRMT (byte -> bits 16-23 of 0), FFMA with
    |v| (product exact: a subnormal operand), FMUL.RZ by 2^-126."""
    x = bits(v)
    e = (x & U32(0x7F800000)).astype(np.int64)
    s = ((e + srq.P_BIAS) & MASK).astype(np.int64)
    s = np.where(s >= 1 << 31, s - (1 << 32), s)  # the add wraps, the max is signed
    p = np.maximum(s, srq.P_MIN).astype(U32)
    r = f32(byte.astype(U32) << U32(16))  # byte * 2^-133
    with np.errstate(invalid="ignore", over="ignore"):
        prod = r * f32(p)  # exact: byte * p * 2^-9 (or inf / NaN from p' = +inf)
        t = np.abs(v).astype(np.float32) + prod  # one fp32 rounding, as the FFMA
    return mul_rz_2m126(t)


def pack8(v: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``nvfp4_sr.e2m1x8_sr`` after the value step: pair words, clamp, mask, IMAD gathers."""
    m = []
    for j in range(4):
        q = (g[:, j] >> U32(16)) | (g[:, j + 4] & U32(0xFFFF0000))
        lo = np.minimum(q & U32(0xFFFF), U32(0x1FF))
        hi = np.minimum(q >> U32(16), U32(0x1FF))
        m.append(((hi << U32(16)) | lo) & U32(srq.CODE_MASK))
    w = (m[0] >> U32(6)) + (m[1] >> U32(2)) + (((m[3] * U32(16) + m[2]) * U32(4)) & U32(MASK))
    sign = (bits(v) >> U32(31)).astype(U32) * U32(0xFF)  # sign-replicated top bytes
    even = sign[:, 0] | (sign[:, 2] << U32(8)) | (sign[:, 4] << U32(16)) | (sign[:, 6] << U32(24))
    odd = sign[:, 1] | (sign[:, 3] << U32(8)) | (sign[:, 5] << U32(16)) | (sign[:, 7] << U32(24))
    with np.errstate(over="ignore"):
        w = w + even * U32(fma.SIGN_EVEN) + odd * U32(fma.SIGN_ODD)
    return w.astype(U32)


def new_codes(v: np.ndarray, rbytes: np.ndarray) -> np.ndarray:
    """Codes ``[n, 8]`` of the new sequence for values / bytes ``[n, 8]``."""
    g = value_grid(v.reshape(-1), rbytes.reshape(-1)).reshape(v.shape)
    w = pack8(v, g)
    return np.stack([(w >> U32(4 * k)) & U32(0xF) for k in range(8)], axis=1).astype(np.uint8)


def old_codes(v: np.ndarray, rbytes: np.ndarray) -> np.ndarray:
    """``stochastic.e2m1_sr_code_bits`` + ``device.pack_e2m1x8`` per value (a = fmin(|v|, 6),
    p = bits(max(bits(a), 1.0) & exponent mask), t = fma(byte / 512, p, a), code = bits(rz(t *
    2^-126)) >> 22, sign from v's bit 31)."""
    a = np.fmin(np.abs(v).astype(np.float32), np.float32(6.0))
    p = f32(np.maximum(bits(a), U32(0x3F800000)) & U32(0x7F800000))
    t = a + (rbytes.astype(np.float32) / np.float32(512.0)) * p
    code = (mul_rz_2m126(t) >> U32(22)).astype(np.uint8)
    return code | ((bits(v) >> U32(31)).astype(np.uint8) << 3)


def ref_codes(v: np.ndarray, rbytes: np.ndarray) -> np.ndarray:
    out = reference.e2m1_encode_sr(torch.from_numpy(v.copy()), torch.from_numpy(rbytes.copy()))
    return out.numpy()


def _edges() -> np.ndarray:
    """Every e2m1 grid point / binade edge / clamp in [0, 8] and the wrap exponents, +-3 ulps."""
    pts = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0]
    pts += [16.0, 32.0, 64.0, 2.0**100, 2.0**126, 3.4e38]
    b = bits(np.array(pts, np.float32)).astype(np.int64)
    near = (b[:, None] + np.arange(-3, 4)[None, :]).reshape(-1)
    return f32(np.clip(near, 0, 0x7F7FFFFF).astype(U32))


def _specials() -> np.ndarray:
    return np.array(
        [0.0, 1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 2.0**-30, 2.0**-9, 2.0**-10,
         6.0000005, 6.5, 7.9999995, 1e30, np.inf, np.nan],
        np.float32,
    )  # fmt: skip


def _check(mag: np.ndarray) -> None:
    """Both signs of ``mag`` with every byte: new == reference (but -NaN) and new == old."""
    v = np.concatenate([mag, -mag]).astype(np.float32)
    v = np.repeat(v, 256)
    rbytes = np.tile(np.arange(256, dtype=np.uint8), len(v) // 256)
    pad = (-len(v)) % 8
    v = np.concatenate([v, np.zeros(pad, np.float32)]).reshape(-1, 8)
    rbytes = np.concatenate([rbytes, np.zeros(pad, np.uint8)]).reshape(-1, 8)
    new = new_codes(v, rbytes)
    np.testing.assert_array_equal(new, old_codes(v, rbytes))
    ref = ref_codes(v, rbytes)
    neg_nan = np.isnan(v) & (bits(v) >> U32(31) == 1)  # only ever a positive NaN from x * enc
    assert np.array_equal(new[~neg_nan], ref[~neg_nan])


def test_specials_and_edges_every_byte():
    _check(np.concatenate([_specials(), _edges()]))


def test_random_patterns_every_byte():
    rng = np.random.default_rng(17)
    below8 = rng.uniform(0.0, 8.0, 4096).astype(np.float32)
    small = f32(rng.integers(0, 0x3F800000, 2048, dtype=np.uint64).astype(U32))  # [0, 1)
    anyf = f32(rng.integers(0, 0x7F800000, 1024, dtype=np.uint64).astype(U32))
    _check(np.concatenate([below8, small, anyf]))


def test_near_ties_below_one():
    """a < 1 where TE's fp32 sum rounds up onto 0.5 or 1.0 (the case no pre-rounding of a
    reproduces, perf/NOTES.md "Issue 17" item 5): the new sequence keeps the one rounding."""
    out = []
    for edge in (0.5, 1.0):
        for byte in range(1, 256):
            base = np.float32(edge - byte / 512.0)
            if base <= 0:
                continue
            b = int(bits(np.float32(base)))
            out += [b + d for d in range(-40, 41) if 0 < b + d < 0x3F800000]
    _check(f32(np.array(out, U32)))


def _philox_split(ids, direction: int, seed: int, offset: int):
    """``nvfp4_sr.philox_prefix`` + ``block_random_words`` step by step (ids < 2^32)."""
    from cutequant.philox import M0, M1, ROUNDS, W0, W1, _mulhilo

    m = 0xFFFFFFFF
    seed_lo, seed_hi, off_lo, off_hi = seed & m, (seed >> 32) & m, offset & m, (offset >> 32) & m
    hi1, lo1 = _mulhilo(M1, torch.tensor(off_lo))  # the prefix
    c0_1 = hi1 ^ (direction << 31) ^ seed_lo
    k1 = (seed_hi + W1) & m
    hi0_2, lo0_2 = _mulhilo(M0, c0_1)
    pre = (c0_1, lo1, hi0_2 ^ k1, lo0_2)
    hi0, lo0 = _mulhilo(M0, ids)  # per call
    c2, c3 = hi0 ^ off_hi ^ seed_hi, lo0
    k0 = (seed_lo + W0) & m
    hi1, lo1 = _mulhilo(M1, c2)
    c = [hi1 ^ pre[1] ^ k0, lo1, pre[2] ^ c3, pre[3].expand_as(lo1)]
    for _ in range(2, ROUNDS):
        k0, k1 = (k0 + W0) & m, (k1 + W1) & m
        hi0, lo0 = _mulhilo(M0, c[0])
        hi1, lo1 = _mulhilo(M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return torch.stack(c, dim=-1)


@pytest.mark.parametrize("direction", [0, 1])
def test_philox_prefix_same_words(direction):
    """The loop-invariant first rounds (``philox_prefix``) and the per-call rest give the words
    of ``stochastic.block_random_words`` (runtime/philox.py) for ids < 2^32."""
    from cutequant import philox

    g = torch.Generator().manual_seed(direction)
    ids = torch.cat([torch.randint(0, 2**32, (4096,), generator=g), torch.tensor([0, 2**32 - 1])])
    for seed, offset in [(0, 0), (-1, -1), (0x123456789ABCDEF, 77), (-(2**63), 2**63 - 1)]:
        want = philox.block_random_bytes(ids, direction, seed, offset)
        words = _philox_split(ids, direction, seed % 2**64, offset % 2**64)
        got = ((words[..., :, None] >> torch.tensor([0, 8, 16, 24])) & 0xFF).reshape(-1, 16)
        assert torch.equal(got.to(torch.uint8), want)


def test_constants():
    assert srq.P_BIAS == 124 << 23 and srq.P_MIN == 251 << 23
    assert f32(np.array(srq.P_MIN, U32)) == np.float32(2.0**124)
    assert f32(np.array(1 << 16, U32)) * np.float32(2.0**124) == np.float32(1 / 512)
    assert [srq.byte_selector(k) for k in range(4)] == [0x4044, 0x4144, 0x4244, 0x4344]
    with pytest.raises(ValueError):  # needs alu_trim and SR
        S.Nvfp4QuantizeSpec(sr_trim=True, stochastic=True)
    with pytest.raises(ValueError):
        S.Nvfp4QuantizeSpec(sr_trim=True, alu_trim=True)
    on = S.Nvfp4QuantizeSpec(sr_trim=True, alu_trim=True, stochastic=True)
    assert '"sr_trim": true' in on.key()
    assert "sr_trim" not in S.Nvfp4QuantizeSpec(alu_trim=True, stochastic=True).key()


def test_switch(monkeypatch):
    from cutequant import nvfp4

    assert nvfp4.SR_TRIM is True  # the default (H200 run 62: 9.5-13.7% less time)
    assert nvfp4.sr_trim(True, True, "sm_90a")
    assert not nvfp4.sr_trim(False, True, "sm_90a")  # calls of 2^32 elements or more
    assert not nvfp4.sr_trim(True, False, "sm_90a")  # RN
    assert not nvfp4.sr_trim(True, True, "sm_100a")  # tested on sm_90a only
    monkeypatch.setattr(nvfp4, "SR_TRIM", False)
    assert not nvfp4.sr_trim(True, True, "sm_90a")


@pytest.mark.skipif(not os.environ.get("CUTEQUANT_SR_FULL"), reason="CUTEQUANT_SR_FULL=1")
def test_full_random():
    rng = np.random.default_rng(5)
    for _ in range(8):
        _check(f32(rng.integers(0, 0x80000000, 1 << 16, dtype=np.uint64).astype(U32)))
