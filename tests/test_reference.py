"""CPU tests for cutequant.reference (TE NVFP4 / RHT / FP8 numerics, docs/numerics.md).

Expected values are written out by hand (with the derivation in comments) or come from small
independent scalar oracles (numpy fp32 arithmetic, enumerated E4M3/E2M1 grids, exact rationals),
never from the code under test.
"""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from cutequant import reference as ref

f32 = np.float32
NAN, INF = float("nan"), float("inf")
FLT_MAX = 3.4028234663852886e38


def t32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def bits32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def u8(values) -> list[int]:
    return [int(v) for v in values.reshape(-1).tolist()]


# ------------------------------------------------------------------------------------------
# Independent scalar oracles
# ------------------------------------------------------------------------------------------

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E4M3_GRID = [
    (c >> 3 and (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7)) or (c & 7) / 8 * 2.0**-6
    for c in range(127)
]  # codes 0..126, 126 = 448


def nearest_even_code(a: float, grid: list[float]) -> int:
    """Index of the grid value nearest to a >= 0 (exact rationals), ties to the even index."""
    fa = Fraction(a)
    dists = [abs(fa - Fraction(g)) for g in grid]
    best = min(dists)
    cands = [i for i, d in enumerate(dists) if d == best]
    return cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)


def oracle_e2m1(v: float) -> int:
    if math.isnan(v):
        return 7
    sign = 8 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    return sign | (7 if a > 6 else nearest_even_code(a, E2M1_GRID))


def oracle_e4m3(v: float) -> int:
    if math.isnan(v):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    return sign | (126 if a > 448 else nearest_even_code(a, E4M3_GRID))


def oracle_nvfp4_row(row: list[float], amax: float) -> tuple[list[int], list[int]]:
    """Scalar numpy-fp32 transcription of docs/numerics.md §9 (codes, sf bytes)."""
    with np.errstate(all="ignore"):
        s_enc = f32(2688.0) / f32(amax)
        s_enc = f32(np.fmin(s_enc, f32(FLT_MAX)))
        if f32(amax) == 0 or s_enc == 0:
            s_enc = f32(1.0)
        s_dec = f32(1.0) / s_enc
        codes, sfs = [], []
        for b in range(0, len(row), 16):
            blk = [f32(v) for v in row[b : b + 16]]
            bmax = max(abs(v) for v in blk)
            sf = oracle_e4m3(float(np.fmin(bmax * (s_enc * f32(1.0 / 6.0)), f32(FLT_MAX))))
            sfs.append(sf)
            enc = f32(np.fmin(f32(1.0) / (f32(E4M3_GRID[sf]) * s_dec), f32(FLT_MAX)))
            codes += [oracle_e2m1(float(v * enc)) for v in blk]
    return codes, sfs


# ------------------------------------------------------------------------------------------
# constants, E2M1
# ------------------------------------------------------------------------------------------


def test_constants():
    assert ref.FP4_MAX == 6.0 and ref.E4M3_MAX == 448.0 and ref.E5M2_MAX == 57344.0
    assert ref.FLT_MAX == FLT_MAX
    assert ref.DEFAULT_SIGN_MASK == 0xD7E8 == 55272


E2M1_TIES = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)]


@pytest.mark.parametrize("value,code", E2M1_TIES)
def test_e2m1_ties_to_even(value, code):
    assert u8(ref.e2m1_encode(t32([value, -value]))) == [code, code | 8]


@pytest.mark.parametrize("mid,code", E2M1_TIES)
def test_e2m1_around_midpoints(mid, code):
    # lower neighbour code is the one just below the midpoint, upper the one just above
    lo_code = {0.25: 0, 0.75: 1, 1.25: 2, 1.75: 3, 2.5: 4, 3.5: 5, 5.0: 6}[mid]
    m = t32([mid])
    below = torch.nextafter(m, t32([0.0]))
    above = torch.nextafter(m, t32([INF]))
    assert u8(ref.e2m1_encode(below)) == [lo_code]
    assert u8(ref.e2m1_encode(above)) == [lo_code + 1]
    assert u8(ref.e2m1_encode(-below)) == [lo_code | 8]
    assert u8(ref.e2m1_encode(-above)) == [(lo_code + 1) | 8]


def test_e2m1_grid_saturation_zero_nan():
    vals = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0]
    assert u8(ref.e2m1_encode(t32(vals))) == [0, 1, 2, 3, 4, 5, 6, 7, 9, 15]
    above6 = torch.nextafter(t32([6.0]), t32([INF])).item()
    sat = [6.5, above6, 1e30, FLT_MAX, INF, -6.5, -1e30, -INF]
    assert u8(ref.e2m1_encode(t32(sat))) == [7, 7, 7, 7, 7, 15, 15, 15]
    # -0.0 keeps its sign (hardware cvt), tiny negatives round to -0, NaN -> +6
    special = [-0.0, -1e-30, -1e-45, 1e-45, NAN, -NAN]
    assert u8(ref.e2m1_encode(t32(special))) == [8, 8, 8, 0, 7, 7]


def test_e2m1_random_vs_oracle():
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0x30000000, 0x41000000, (3000,), generator=g, dtype=torch.int32)
    v = bits.view(torch.float32) * torch.where(torch.arange(3000) % 2 == 0, 1.0, -1.0)
    got = u8(ref.e2m1_encode(v))
    assert got == [oracle_e2m1(x) for x in v.tolist()]


def test_e2m1_decode_and_pack():
    codes = torch.arange(16, dtype=torch.uint8)
    dec = ref.e2m1_decode(codes)
    assert dec.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert torch.signbit(dec[8]).item()
    assert u8(ref.e2m1_encode(dec)) == list(range(16))
    # even element -> low nibble
    packed = ref.pack_fp4(torch.tensor([[1, 2, 0xF, 0x3, 7, 8]], dtype=torch.uint8))
    assert u8(packed) == [0x21, 0x3F, 0x87]
    assert u8(ref.unpack_fp4(torch.tensor([0x21, 0x3F], dtype=torch.uint8))) == [1, 2, 15, 3]
    rnd = torch.randint(0, 16, (4, 32), dtype=torch.uint8)
    assert torch.equal(ref.unpack_fp4(ref.pack_fp4(rnd)), rnd)


# ------------------------------------------------------------------------------------------
# E4M3, global scale
# ------------------------------------------------------------------------------------------


def test_e4m3_rne_satfinite_cases():
    cases = [
        (464.0, 0x7E),
        (1e9, 0x7E),
        (-1e9, 0xFE),
        (INF, 0x7E),
        (-INF, 0xFE),
        (448.0, 0x7E),
        (449.0, 0x7E),
        (416.0, 0x7D),
        (432.0, 0x7E),  # 432: tie 416/448 -> even mantissa 110
        (1.0, 0x38),
        (1.0625, 0x38),
        (1.1875, 0x3A),  # ties to even mantissa
        (2.0**-6, 0x08),
        (2.0**-9, 0x01),
        (2.0**-10, 0x00),
        (3 * 2.0**-11, 0x01),
        (0.0, 0x00),
        (-0.0, 0x80),
        (3.0, 0x44),
        (NAN, 0x7F),
    ]
    got = u8(ref.e4m3_rne_satfinite(t32([c[0] for c in cases])))
    assert got == [c[1] for c in cases]


def test_e4m3_random_vs_oracle_and_decode():
    g = torch.Generator().manual_seed(2)
    v = torch.exp(torch.empty(2000).uniform_(-16, 7, generator=g)) * torch.randn(2000, generator=g)
    assert u8(ref.e4m3_rne_satfinite(v)) == [oracle_e4m3(x) for x in v.tolist()]
    codes = torch.arange(127, dtype=torch.uint8)
    assert ref.e4m3_to_float(codes).tolist() == E4M3_GRID
    assert ref.e4m3_to_float(codes | 0x80).tolist() == [-x for x in E4M3_GRID]


def test_global_encode_scale():
    amax = t32([0.0, INF, NAN, 1e-40, 1e-38, 448.0, 1.0, 7.0, 2688.0, 5.0])
    s = ref.global_encode_scale(amax)
    expect = [
        1.0,
        1.0,
        FLT_MAX,
        FLT_MAX,
        FLT_MAX,
        6.0,
        2688.0,
        384.0,
        1.0,
        from_bits32(0x44066666),
    ]  # f32(2688/5) = 537.5999755859375
    assert s.tolist() == expect
    assert s.dtype == torch.float32
    sd = ref.global_decode_scale(t32([6.0, 1.0, 2688.0]))
    expect = [0x3E2AAAAB, 0x3F800000, bits32(float(f32(1) / f32(2688)))]
    assert [bits32(x) for x in sd.tolist()] == expect


# ------------------------------------------------------------------------------------------
# NVFP4 1D quantization
# ------------------------------------------------------------------------------------------

# Global amax 448 -> S_enc = 6, S_dec = f32(1/6) = 11184811 * 2^-26, f32(S_enc * f32(1/6)) = 1.0
# Block A: block_amax 3 -> sf = e4m3(3) = 0x44; f32(3 * S_dec) = f32(0.5 + 2^-26) = 0.5 -> enc 2.
BLOCK_A = [3, -3, 0.125, 0.375, 0.625, 1.25, -0.875, 2.5, 1.75, 1.5, 0, 0.25, 2, -1, -0.0625, 0.75]
CODES_A = [7, 15, 0, 2, 2, 4, 12, 6, 6, 5, 0, 1, 6, 12, 8, 3]  # of 2*v, ties to even
BYTES_A = [0xF7, 0x20, 0x42, 0x6C, 0x56, 0x10, 0xC6, 0x38]
# Block B: block_amax 1000 -> 1000 > 448 -> sf = 0x7E; f32(448 * S_dec) = 74.66667175292969,
# enc = f32(1/that) = 0.013392856; products: 1000->13.39 (6), 300->4.018 (4), -200->-2.679 (-3),
# 112->1.4999999 (1.5), 56->0.74999994 (0.5, NOT the 0.75 tie), 37->0.4955 (0.5), 38->0.5089,
# 130->1.741 (1.5), 131->1.754 (2), 200->2.679 (3), 7->0.094 (0), -1e-3 -> -0 (code 8)
BLOCK_B = [1000, 300, -200, 112, 56, -56, 0, -0.0, 37, 38, 130, 131, 1e-3, -1e-3, 200, 7]
CODES_B = [7, 6, 13, 3, 1, 9, 0, 8, 1, 1, 3, 4, 0, 8, 5, 0]
BYTES_B = [0x67, 0x3D, 0x91, 0x80, 0x11, 0x43, 0x80, 0x05]


def test_nvfp4_hand_computed_blocks():
    v = torch.zeros(3, 32)
    v[0] = t32(BLOCK_A + BLOCK_B)
    v[2, :4] = t32([1e-6, -1e-6, 0.0, 5e-7])  # block amax rounds to sf = 0 -> enc = FLT_MAX
    data, scales = ref.nvfp4_quantize_rows(v, t32(448.0))
    assert data.shape == (3, 16) and data.dtype == torch.uint8
    assert scales.shape == (128, 4) and scales.dtype == torch.uint8
    assert u8(data[0]) == BYTES_A + BYTES_B
    assert u8(ref.unpack_fp4(data[0])) == CODES_A + CODES_B
    assert u8(data[1]) == [0] * 16  # all-zero block: sf 0, codes 0
    assert u8(ref.unpack_fp4(data[2, :2])) == [7, 15, 0, 7]
    assert u8(data[2, 2:]) == [0] * 14
    assert u8(scales[:3, :2]) == [0x44, 0x7E, 0, 0, 0, 0]
    assert int(scales.sum()) == 0x44 + 0x7E  # padding is zero
    # bf16 input gives the same result for bf16-exact values
    d16, s16 = ref.nvfp4_quantize_rows(t32([BLOCK_A]).to(torch.bfloat16), t32([448.0]))
    assert u8(d16) == BYTES_A and u8(s16[0, :1]) == [0x44]


def test_nvfp4_nan_inf_blocks():
    v = torch.zeros(2, 16)
    v[0, 0], v[0, 1], v[0, 2] = NAN, 100.0, -1.0
    v[1, 0], v[1, 1] = INF, 100.0
    data, scales = ref.nvfp4_quantize_rows(v, t32(448.0))
    # NaN/inf block amax -> fminf(., FLT_MAX) -> sf 448; enc = 0.013392856
    assert u8(scales[:2, 0]) == [0x7E, 0x7E]
    # 100 * enc = 1.339 -> 1.5 (3); -1 * enc = -0.0134 -> -0 (8); NaN -> 7; inf -> 7
    assert u8(ref.unpack_fp4(data[:, :2])) == [7, 3, 8, 0, 7, 3, 0, 0]


def test_nvfp4_rows_vs_scalar_oracle():
    g = torch.Generator().manual_seed(3)
    for dtype, amax_scale in [
        (torch.bfloat16, 1.0),
        (torch.float32, 1.0),
        (torch.float32, 0.01),
        (torch.bfloat16, 1e30),
        (torch.float32, 1e-30),
    ]:
        v = torch.randn(6, 64, generator=g) * torch.exp(torch.randn(6, 64, generator=g) * 3)
        v[1, 16:32] *= 1e-20  # tiny block (sf underflow)
        v = v.to(dtype)
        amax = v.float().abs().max() * amax_scale
        data, scales = ref.nvfp4_quantize_rows(v, amax)
        codes = ref.unpack_fp4(data)
        for r in range(6):
            exp_codes, exp_sf = oracle_nvfp4_row(v[r].float().tolist(), amax.item())
            assert u8(codes[r]) == exp_codes
            assert u8(scales[r, :4]) == exp_sf


def test_nvfp4_shapes_and_empty():
    d, s = ref.nvfp4_quantize_rows(torch.zeros(0, 48, dtype=torch.bfloat16), t32(1.0))
    assert d.shape == (0, 24) and s.shape == (0, 4)
    d, s = ref.nvfp4_quantize_rows(torch.ones(130, 80), t32(1.0))
    assert d.shape == (130, 40) and s.shape == (256, 8)
    assert int(s[130:].sum()) == 0 and int(s[:, 5:].sum()) == 0
    with pytest.raises(ValueError):
        ref.nvfp4_quantize_rows(torch.ones(2, 24), t32(1.0))


def test_nvfp4_fast_math():
    v = torch.zeros(2, 32)
    v[0, 16:20] = t32([1e-6, -1e-6, 0.0, 3.0])  # sf(3.0) with amax 448: e4m3(3) = 0x44
    v[1, :16] = t32(BLOCK_A)
    d, s = ref.nvfp4_quantize_rows(v, t32(448.0), fast_math=True)
    # all-zero block: rcp(0) = inf, 0 * inf = NaN -> code 7 (hardware satfinite)
    assert u8(d[0, :8]) == [0x77] * 8 and u8(s[0, :2]) == [0x00, 0x44]
    # second block: enc = 2 -> 1e-6*2 -> 0, -1e-6*2 -> -0, 3*2 = 6 -> 7
    assert u8(ref.unpack_fp4(d[0, 8:10])) == [0, 8, 0, 7]
    assert u8(d[1, :8]) == BYTES_A  # exact reciprocal: identical to the default path
    # injected reciprocal is used (here: 1/x times 0.5 -> enc = 1 for block A)
    d2, s2 = ref.nvfp4_quantize_rows(
        v[1:], t32(448.0), fast_math=True, reciprocal=lambda t: 0.5 / t
    )
    assert u8(ref.unpack_fp4(d2[0, :8])) == [oracle_e2m1(x) for x in BLOCK_A]
    assert u8(s2[0, :1]) == [0x44]


def test_dequantize_round_trip():
    # grid values, global amax 2688 -> S_enc = 1, block amax 6 -> sf = 1.0: exact round trip
    x = t32([E2M1_GRID + [-g for g in E2M1_GRID]] * 2)
    x[1] *= 0.5  # block amax 3 -> sf = f32(3 * f32(1/6)) = 0.5 (e4m3 exact)
    data, scales = ref.nvfp4_quantize_rows(x, t32(2688.0))
    assert u8(scales[:2, 0]) == [0x38, 0x30]
    assert torch.equal(ref.nvfp4_dequantize(data, scales, t32(2688.0), shape=(2, 16)), x)
    # random data: |deq - x| <= one block scale step (max half-step 1 in the scaled domain)
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(64, 128, generator=g) * 3).to(torch.bfloat16)
    amax = x.float().abs().max()
    data, scales = ref.nvfp4_quantize_rows(x, amax)
    deq = ref.nvfp4_dequantize(data, scales, amax, shape=(64, 128))
    deq_sw = ref.nvfp4_dequantize(
        data, ref.swizzle_scales(scales), amax, shape=(64, 128), swizzled=True
    )
    assert torch.equal(deq, deq_sw)
    s_dec = 1.0 / (2688.0 / amax.item())
    step = ref.e4m3_to_float(scales[:64, :8]).repeat_interleave(16, 1) * s_dec
    err = (deq - x.float()).abs()
    assert bool((err <= step * 1.0001 + 1e-30).all())
    assert (err.pow(2).mean() / x.float().pow(2).mean()).sqrt().item() < 0.15


# ------------------------------------------------------------------------------------------
# swizzle
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "r,c,num_cols,offset",
    [
        (0, 0, 8, 0),
        (1, 0, 8, 16),
        (32, 0, 8, 4),
        (33, 1, 8, 21),
        (0, 4, 8, 512),
        (128, 0, 8, 1024),
        (130, 5, 8, 1569),
        (255, 7, 8, 2047),
        (130, 5, 5, 1569),
        (127, 3, 1, 511),
        (200, 2, 12, 3 * 512 + (8 * 16 + 2 * 4 + 2)),
    ],
)
def test_swizzle_offset(r, c, num_cols, offset):
    # offset = ((rb*ceil(C/4) + cb)*32 + d3)*16 + d4*4 + d5   (docs/numerics.md §4)
    assert ref.swizzle_offset(r, c, num_cols) == offset


def test_swizzle_scales_round_trip():
    g = torch.Generator().manual_seed(5)
    s = torch.randint(0, 256, (256, 12), generator=g, dtype=torch.uint8)
    flat = ref.swizzle_scales(s)
    assert flat.shape == (256 * 12,)
    for r, c in [(0, 0), (1, 0), (33, 1), (130, 5), (255, 11), (129, 4), (64, 7)]:
        assert flat[ref.swizzle_offset(r, c, 12)].item() == s[r, c].item()
    assert torch.equal(ref.unswizzle_scales(flat, 256, 12), s)
    # padding of a compact tensor stays zero after swizzling
    _, sc = ref.nvfp4_quantize_rows(torch.ones(3, 32), t32(1.0))
    sw = ref.swizzle_scales(sc)
    nz = sorted(torch.nonzero(sw).reshape(-1).tolist())
    assert nz == sorted(ref.swizzle_offset(r, c, 2) for r in range(3) for c in range(2))


# ------------------------------------------------------------------------------------------
# RHT
# ------------------------------------------------------------------------------------------

TE_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # get_wgrad_sign_vector


def h16() -> torch.Tensor:
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    return torch.kron(torch.kron(h2, h2), torch.kron(h2, h2))


def test_rht_matrix():
    assert sum(1 << i for i, s in enumerate(TE_SIGNS) if s < 0) == 0xD7E8
    r = ref.rht_matrix()
    assert r.dtype == torch.bfloat16 and r.shape == (16, 16)
    expect = torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float64)) @ h16() * 0.25
    assert torch.equal(r.double(), expect)
    assert set(r.double().abs().reshape(-1).tolist()) == {0.25}
    assert torch.equal(ref.rht_matrix(0).double(), h16() / 4)
    assert r.double()[0, 1].item() == 0.25 and r.double()[3, 0].item() == -0.25
    eye = torch.eye(16, dtype=torch.float64)
    assert torch.equal(r.double() @ r.double().t(), eye)
    assert torch.equal(r.double().t() @ r.double(), eye)


def test_rht_along_tokens_exact_small_ints():
    g = torch.Generator().manual_seed(6)
    m, n = 48, 5
    x = torch.randint(-100, 101, (m, n), generator=g).to(torch.bfloat16)
    y32 = ref.rht_along_tokens(x, round_to_bf16=False)
    y16 = ref.rht_along_tokens(x)
    assert y32.dtype == torch.float32 and y16.dtype == torch.bfloat16 and y32.shape == (n, m)
    rm = torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float64)) @ h16() * 0.25
    xd = x.double()
    for col in range(n):
        for b in range(m // 16):
            want = xd[16 * b : 16 * b + 16, col] @ rm  # exact: <= 1600 in steps of 0.25
            assert torch.equal(y32[col, 16 * b : 16 * b + 16].double(), want)
            assert torch.equal(y16[col, 16 * b : 16 * b + 16], want.to(torch.bfloat16))
    back = ref.inverse_rht_along_tokens(y32)
    assert back.shape == (m, n) and torch.equal(back, x.float())
    assert ref.rht_along_tokens(torch.zeros(0, 7, dtype=torch.bfloat16)).shape == (7, 0)


def col16(vals) -> torch.Tensor:
    x = torch.zeros(16, 1, dtype=torch.float64)
    x[: len(vals), 0] = torch.tensor(vals, dtype=torch.float64)
    return x.to(torch.bfloat16)


def test_rht_exact_sum_edge_cases():
    # cancellation: 2^100 + 1 - 2^100 = 1 exactly (a float64 sum gives 0); mask 0: column 0 of
    # H16/4 is all +0.25
    y = ref.rht_along_tokens(col16([2.0**100, 1.0, -(2.0**100)]), 0, round_to_bf16=False)
    assert y[0, 0].item() == 0.25
    # double rounding: 0.25*(1 + 2^-24 + 2^-100) rounds UP to 0.25 + 2^-25 (float64 would land
    # on the fp32 midpoint 0.25*(1 + 2^-24) and round to even 0.25)
    x = col16([1.0, 2.0**-24, 2.0**-100])
    y = ref.rht_along_tokens(x, 0, round_to_bf16=False)
    assert y[0, 0].item() == 0.25 + 2.0**-25
    naive = (x.double()[:, 0] @ (h16() / 4)).float()
    assert naive[0].item() == 0.25  # shows the case is a real double-rounding trap
    # bf16 output = RNE of the fp32 value: 1 + 2^-8 ties down to 1, 1 + 3*2^-8 ties up
    y = ref.rht_along_tokens(col16([1.0, 2.0**-8]), 0)
    assert y[0, 0].item() == 0.25
    y = ref.rht_along_tokens(col16([1.0 + 2.0**-7, 2.0**-8]), 0)
    assert y[0, 0].item() == 0.25 * (1 + 2.0**-6)
    # exact zero -> +0.0, overflow -> inf, inf/NaN propagate
    y = ref.rht_along_tokens(col16([1.0, 1.0]), 0, round_to_bf16=False)
    assert y[0, 1].item() == 0.0 and not torch.signbit(y[0, 1]).item()
    bmax = torch.finfo(torch.bfloat16).max
    y = ref.rht_along_tokens(col16([bmax] * 16), 0, round_to_bf16=False)
    assert y[0, 0].item() == INF and y[0, 1:].abs().max().item() == 0.0
    y = ref.rht_along_tokens(col16([INF, 1.0]), 0)
    assert y[0, 0].item() == INF and y[0, 1].item() == INF
    y = ref.rht_along_tokens(col16([INF, INF]), 0)
    assert y[0, 0].item() == INF and math.isnan(y[0, 1].item())
    y = ref.rht_along_tokens(col16([NAN]), 0)
    assert bool(torch.isnan(y).all())
    # fp32 subnormal results: 0.25 * 2^-133 = 2^-135 is an fp32 subnormal, exact
    y = ref.rht_along_tokens(col16([2.0**-133]), 0, round_to_bf16=False)
    assert y[0, 0].item() == 2.0**-135


def test_rht_random_vs_rational_oracle():
    rng = random.Random(7)
    x = torch.zeros(16, 24, dtype=torch.float64)
    for n in range(24):
        base = rng.choice([0, 90, -126, -130, 126, -40])
        for i in range(16):
            if rng.random() < 0.6:
                e = max(min(base - rng.choice([0, 1, 8, 23, 24, 25, 53, 60, 100]), 127), -133)
                x[i, n] = rng.choice([-1, 1]) * rng.choice([1, 1.5, 1.0078125]) * 2.0**e
    x = x.to(torch.bfloat16)
    sg = torch.diag(torch.tensor(TE_SIGNS, dtype=torch.float64)) @ h16()
    y = ref.rht_along_tokens(x, round_to_bf16=False)
    for n in range(24):
        col = [Fraction(v) for v in x[:, n].double().tolist()]
        for j in range(16):
            s = sum(col[i] * int(sg[i, j]) for i in range(16)) / 4
            assert Fraction(y[n, j].item()) == Fraction(float(np.float32(_rn32(s))))


def _rn32(s: Fraction) -> float:
    """Exact RNE of a rational to fp32 (finite inputs)."""
    if s == 0:
        return 0.0
    a = abs(s)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, -126) - 23)
    m = a / q
    fl = m.numerator // m.denominator
    rem = m - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    return math.copysign(float(fl * q), s)


# ------------------------------------------------------------------------------------------
# grouped NVFP4
# ------------------------------------------------------------------------------------------


def grouped_input() -> tuple[torch.Tensor, list[int]]:
    splits = [0, 32, 0, 16, 0]
    x = torch.zeros(48, 16)
    x[5, 3], x[20, 3] = -7.0, 2.0  # group 1: amax_row 7; RHT |y| = 7/4, 2/4 -> amax_col 1.75
    x[32, 0], x[33, 0] = 1.0, 1.0  # group 3: y[j] = 0.25*(1 + (-1)^j) -> amax_col 0.5
    return x.to(torch.bfloat16), splits


def test_group_amax():
    x, splits = grouped_input()
    ar, ac = ref.group_amax(x, splits)
    assert ar.tolist() == [0.0, 7.0, 0.0, 1.0, 0.0] and ar.dtype == torch.float32
    assert ac.tolist() == [0.0, 1.75, 0.0, 0.5, 0.0]
    ar2, ac2 = ref.group_amax(x, splits, rht=False)
    assert ar2.tolist() == ac2.tolist() == [0.0, 7.0, 0.0, 1.0, 0.0]
    ar, ac = ref.group_amax(torch.zeros(0, 16, dtype=torch.bfloat16), [0, 0])
    assert ar.tolist() == [0.0, 0.0] and ac.tolist() == [0.0, 0.0]
    ar, ac = ref.group_amax(torch.zeros(0, 16, dtype=torch.bfloat16), [])
    assert ar.shape == (0,) and ac.shape == (0,)
    xn = x.clone()
    xn[40, 2] = NAN
    ar, ac = ref.group_amax(xn, splits)
    assert math.isnan(ar[3].item()) and math.isnan(ac[3].item()) and ar[1].item() == 7.0
    with pytest.raises(ValueError):
        ref.group_amax(x, [16, 16])


def test_nvfp4_group_quantize_shapes_and_consistency():
    g = torch.Generator().manual_seed(8)
    splits = [0, 32, 0, 48, 0]
    n = 32
    x = (torch.randn(80, n, generator=g) * 2).to(torch.bfloat16)
    outs = ref.nvfp4_group_quantize(x, splits)
    assert len(outs) == 5
    ar, ac = ref.group_amax(x, splits)
    off = 0
    for gi, (mg, o) in enumerate(zip(splits, outs, strict=True)):
        xg = x[off : off + mg]
        off += mg
        assert o["row_data"].shape == (mg, n // 2)
        assert o["row_scales"].shape == ((mg + 127) // 128 * 128, 4)
        assert o["col_data"].shape == (n, mg // 2)
        assert o["col_scales"].shape == (128, (mg // 16 + 3) // 4 * 4)
        assert o["amax_row"].shape == () and o["amax_row"].item() == ar[gi].item()
        assert o["amax_col"].item() == ac[gi].item()
        if mg:
            rd, rs = ref.nvfp4_quantize_rows(xg, ar[gi])
            cd, cs = ref.nvfp4_quantize_rows(ref.rht_along_tokens(xg), ac[gi])
            assert torch.equal(o["row_data"], rd) and torch.equal(o["row_scales"], rs)
            assert torch.equal(o["col_data"], cd) and torch.equal(o["col_scales"], cs)
    assert outs[0]["row_scales"].shape == (0, 4) and outs[0]["col_scales"].shape == (128, 0)
    assert outs[3]["col_scales"].shape == (128, 4)  # 48/16 = 3 -> padded to 4
    # swizzled scales
    sw = ref.nvfp4_group_quantize(x, splits, swizzled_scales=True)
    for o, s in zip(outs, sw, strict=True):
        assert torch.equal(s["row_scales"], ref.swizzle_scales(o["row_scales"]))
        assert torch.equal(s["col_scales"], ref.swizzle_scales(o["col_scales"]))
        assert torch.equal(s["row_data"], o["row_data"])
    assert sw[0]["row_scales"].shape == (0,) and sw[0]["col_scales"].shape == (0,)
    # disabled directions, no RHT, explicit amax, fast math
    only_col = ref.nvfp4_group_quantize(x, splits, rowwise=False, rht=False)
    assert "row_data" not in only_col[1] and "row_scales" not in only_col[1]
    cd, _ = ref.nvfp4_quantize_rows(x[:32].t().contiguous(), ar[1])
    assert torch.equal(only_col[1]["col_data"], cd)
    assert only_col[1]["amax_col"].item() == ar[1].item()
    only_row = ref.nvfp4_group_quantize(x, splits, columnwise=False)
    assert "col_data" not in only_row[3] and torch.equal(
        only_row[3]["row_data"], outs[3]["row_data"]
    )
    amax = (torch.full((5,), 10.0), torch.full((5,), 20.0))
    given = ref.nvfp4_group_quantize(x, splits, amax=amax)
    rd, _ = ref.nvfp4_quantize_rows(x[32:], t32(10.0))
    assert torch.equal(given[3]["row_data"], rd) and given[3]["amax_col"].item() == 20.0
    fm = ref.nvfp4_group_quantize(x, splits, fast_math=True)
    cd, cs = ref.nvfp4_quantize_rows(
        ref.rht_along_tokens(x[32:], round_to_bf16=False), ac[3], fast_math=True
    )
    assert torch.equal(fm[3]["col_data"], cd) and torch.equal(fm[3]["col_scales"], cs)


# ------------------------------------------------------------------------------------------
# FP8
# ------------------------------------------------------------------------------------------

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def test_fp8_max():
    assert ref.fp8_max(E4) == 448.0 and ref.fp8_max(E5) == 57344.0
    with pytest.raises(ValueError):
        ref.fp8_max(torch.float16)


def test_fp8_scale_edge_cases():
    amax = t32([0.0, INF, NAN, -INF, 448.0, 3.0, 1e-40])
    s, si = ref.fp8_scale_from_amax(amax, E4)
    assert s.tolist() == [1, 1, 1, 1, 1, from_bits32(0x43155555), FLT_MAX]  # 448/3 = 149.33333
    assert si[:5].tolist() == [1] * 5
    assert bits32(si[6].item()) == 0x00200000  # f32(1/FLT_MAX) = 2^-128 (subnormal, no ftz)
    s, si = ref.fp8_scale_from_amax(amax, E4, force_pow2=True)
    assert s.tolist() == [1, 1, 1, 1, 1, 128.0, 2.0**127]
    assert si.tolist() == [1, 1, 1, 1, 1, 1 / 128, 2.0**-127]
    s, _ = ref.fp8_scale_from_amax(t32([0.0, 3.0, NAN]), E4, epsilon=1e-3)
    assert bits32(s[0].item()) == 0x48DABFFF and s[1].item() == from_bits32(0x43155555)
    assert s[2].item() == 1.0  # NaN < eps is false -> NaN -> 1
    s, _ = ref.fp8_scale_from_amax(t32([3.0]), E4, epsilon=100.0)
    assert bits32(s[0].item()) == 0x408F5C29  # f32(448/100) = 4.48
    s, _ = ref.fp8_scale_from_amax(t32([1.0, 3.0, 57344.0]), E5)
    assert s.tolist() == [57344.0, float(f32(57344) / f32(3)), 1.0]
    s, _ = ref.fp8_scale_from_amax(t32([3.0]), E5, force_pow2=True)
    assert s.tolist() == [16384.0]


def test_fp8_cast_saturation():
    x = t32([500, -1e6, INF, -INF, NAN, 464, 1.0625, 449, 2.0**-10, -0.0])
    q = ref.fp8_cast(x, t32(1.0), E4)
    assert q.dtype == E4
    assert u8(q.view(torch.uint8)) == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7E, 0x38, 0x7E, 0, 0x80]
    x = t32([60000, 61440, 1e9, INF, -INF, NAN, 1.125, 1.375, 57344, -61439])
    q = ref.fp8_cast(x, t32(1.0), E5).float()
    assert q[:5].tolist() == [57344, 57344, 57344, 57344, -57344]
    assert math.isnan(q[5].item())
    assert q[6:].tolist() == [1.0, 1.5, 57344, -57344]
    # scale applied in fp32 before the cast; bf16/fp16 inputs
    q = ref.fp8_cast(torch.tensor([2.0, 2.5], dtype=torch.bfloat16), t32(224.0), E4)
    assert q.float().tolist() == [448.0, 448.0]
    q = ref.fp8_cast(torch.tensor([1.0, 0.0009765625], dtype=torch.float16), t32(3.0), E4)
    # 3 * 2^-10 = 1.5 * 2^-9: tie between codes 1 and 2 (subnormal step 2^-9) -> even code 2
    assert q.float().tolist() == [3.0, 2.0**-8]


def test_fp8_group_quantize():
    splits = [0, 3, 0, 5]
    x = torch.zeros(8, 4, dtype=torch.float16)
    x[0:3] = torch.tensor([[1, -2, 3, 0.5]] * 3, dtype=torch.float16)
    x[3:8, 1] = -448.0 * 2
    x[4, 2] = 100.0
    outs = ref.fp8_group_quantize(x, splits, fp8_dtype=E4)
    assert [o["amax"].item() for o in outs] == [0.0, 3.0, 0.0, 896.0]
    assert [o["scale"].item() for o in outs] == [1.0, from_bits32(0x43155555), 1.0, 0.5]
    assert outs[3]["scale_inv"].item() == 2.0
    assert outs[0]["row_data"].shape == (0, 4) and outs[0]["col_data"].shape == (4, 0)
    r3 = outs[3]["row_data"].float()
    # 100 * 0.5 = 50: tie between 48 (mantissa 100) and 52 (101) -> even -> 48
    assert r3[:, 1].tolist() == [-448.0] * 5 and r3[1, 2].item() == 48.0
    for o, mg in zip(outs, splits, strict=True):
        assert o["row_data"].dtype == E4 and o["row_data"].shape == (mg, 4)
        assert o["col_data"].shape == (4, mg) and o["col_data"].is_contiguous()
        assert torch.equal(o["col_data"].view(torch.uint8), o["row_data"].view(torch.uint8).t())
    deq = ref.fp8_dequantize(outs[1]["row_data"], outs[1]["scale_inv"])
    # 149.33333 * [1,2,3,0.5] -> e4m3 [144, 288, 448, 72]; * f32(1/149.33333)
    si = float(f32(1) / f32(from_bits32(0x43155555)))
    assert deq[0].tolist() == [float(f32(v) * f32(si)) for v in (144, -288, 448, 72)]
    assert (
        ref.fp8_dequantize(outs[1]["row_data"], outs[1]["scale_inv"], torch.bfloat16).dtype
        == torch.bfloat16
    )
    pw = ref.fp8_group_quantize(x, splits, fp8_dtype=E5, force_pow2_scales=True, columnwise=False)
    assert [o["scale"].item() for o in pw] == [1.0, 16384.0, 1.0, 64.0]  # 57344/896 = 64
    assert "col_data" not in pw[1]
    dl = ref.fp8_group_quantize(
        x, splits, fp8_dtype=E4, scaling="delayed", scale=t32([1.0, 2.0, 4.0, 0.25]), rowwise=False
    )
    assert [o["scale_inv"].item() for o in dl] == [1.0, 0.5, 0.25, 4.0]
    assert dl[1]["amax"].item() == 3.0 and "row_data" not in dl[1]
    assert dl[1]["col_data"].float()[:, 0].tolist() == [2.0, -4.0, 6.0, 1.0]
    assert dl[3]["col_data"].float()[1].tolist() == [-224.0] * 5
    eps = ref.fp8_group_quantize(x, splits, fp8_dtype=E4, amax_epsilon=1e-3)
    assert bits32(eps[0]["scale"].item()) == 0x48DABFFF
