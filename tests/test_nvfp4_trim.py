"""CPU checks of the integer identities behind ``Nvfp4QuantizeSpec.alu_trim``
(kernels/nvfp4_trim.py): each one replaces LOP3 / SHF / LEA / SEL work of the quantize kernel's
hot loops by IMAD / IMAD.HI forms that must give the same values on every input the kernel can
see. numpy emulates the 32-bit instructions (mul.hi.u32, mad.lo.u32 wrap modulo 2^32)."""

import re

import numpy as np

from cutequant.kernels import device as dev
from cutequant.kernels import nvfp4_trim as trim

U64 = np.uint64
MASK32 = U64(0xFFFFFFFF)


def mul_hi(a, k):
    """mul.hi.u32 a, k (a: uint64 array of u32 values)."""
    return (a * U64(k)) >> U64(32)


def mad_lo(a, k, c):
    """mad.lo.u32 a, k, c (k may be negative: two's complement, as the PTX immediate)."""
    return (a * U64(k & 0xFFFFFFFF) + c) & MASK32


def test_enc_table_addresses_every_scale_pair():
    """sf = b0 + 256 b1 for every byte pair (bits 16+ zero, as e4m3x2_word leaves them):
    b1 = (sf * 2^24) >> 32 and (4 sf + base) - 1024 b1 = base + 4 b0, for table bases anywhere in
    shared memory (the 4 is the opaque register, 4 here)."""
    sf = np.arange(1 << 16, dtype=U64)
    b0, b1 = sf & U64(0xFF), sf >> U64(8)
    got_b1 = mul_hi(sf, 1 << 24)
    assert np.array_equal(got_b1, b1)
    for base in (0, 0x40, 0x200, 0x1234 * 4, 227 * 1024 - 512, (1 << 32) - 2048):
        base = U64(base)
        addr0 = mad_lo(got_b1, -1024, mad_lo(sf, 4, base))
        addr1 = mad_lo(got_b1, 4, base)
        assert np.array_equal(addr0, (base + U64(4) * b0) & MASK32)
        assert np.array_equal(addr1, (base + U64(4) * b1) & MASK32)


def _cute_ring(n: int, stages: int):
    """CuTe's PipelineState.advance from (0, 0): (index, phase) before each of n tiles."""
    idx = phase = 0
    out = []
    for _ in range(n):
        out.append((idx, phase))
        idx += 1
        if idx == stages:
            idx, phase = 0, phase ^ 1
    return out


def test_stage_state_matches_pipeline_advance():
    """trim.stage_state(k): index = k - stages * q, q = (k * 2^(32 - log2 stages)) >> 32, and the
    wait's parity bit (q's lsb: the operand is shifted into bit 31) is CuTe's phase, for the
    first 2^16 tiles exactly as advance() walks, and k = 0 .. 2^26 against k % stages."""
    for stages in (2, 4, 8):
        shift = 32 - (stages.bit_length() - 1)
        k = np.arange(1 << 16, dtype=U64)
        q = mul_hi(k, 1 << shift)
        idx = mad_lo(q, -stages, k)
        ref = np.array(_cute_ring(1 << 16, stages), dtype=U64)
        assert np.array_equal(idx, ref[:, 0])
        assert np.array_equal(q & U64(1), ref[:, 1])
        big = np.arange(0, 1 << 26, 997, dtype=U64)
        assert np.array_equal(mad_lo(mul_hi(big, 1 << shift), -stages, big), big % U64(stages))


def test_column_shifts_by_mul_hi():
    """col >> 4 and col >> 1 by IMAD.HI for every column start the rowwise threads see
    (multiples of 32 below 2^31)."""
    col = np.arange(0, 1 << 31, 32 * 4099, dtype=U64)
    col = np.concatenate([col, np.arange(0, 1 << 20, 32, dtype=U64), U64([(1 << 31) - 32])])
    assert np.array_equal(mul_hi(col, 1 << 28), col >> U64(4))
    assert np.array_equal(mul_hi(col, 1 << 31), col >> U64(1))


def test_offsets_fit_32_bits_under_the_guard():
    """With M * N < 2^32 (``nvfp4.alu_trim``) the largest 32-bit offset of each store stays below
    2^32: rowwise codes (M - 1) * N / 2 + (N - 32) / 2, columnwise codes N * M_g / 2 (its group
    base is 64-bit), scales far smaller. Extremes of the guard, and the guard itself."""
    from cutequant import nvfp4

    for m, n in (
        (1 << 16, (1 << 16) - 16),
        ((1 << 27) - 16, 32),
        (16, (1 << 27) - 32),
        (65520, 65520),
    ):
        assert m * n < 1 << 32
        assert (m - 1) * (n // 2) + (n - 32) // 2 < 1 << 32
        assert n * (m // 2) + 32 * (m // 64) + 16 < 1 << 32
        scale_cols = (n // 16 + 3) // 4 * 4
        assert ((m + 127) // 128 * 128) * scale_cols < 1 << 32
    old = nvfp4.ALU_TRIM
    try:
        nvfp4.ALU_TRIM = True
        assert nvfp4.alu_trim(1 << 16, 1 << 15) and not nvfp4.alu_trim(1 << 17, 1 << 15)
        nvfp4.ALU_TRIM = False
        assert not nvfp4.alu_trim(64, 64)
    finally:
        nvfp4.ALU_TRIM = old


def _ops(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.replace("\\n\\t", "\n").split("\n") if ln.strip()]


def test_encoder_with_operand_multipliers_is_the_same_sequence():
    """trim's encoder step is device.e2m1_bf16x2_codes with the three bf16x2 multipliers passed
    as operands $3-$5 instead of mov'd constants: substituting them back gives the original PTX
    instruction for instruction (tests/test_e2m1_packed.py emulates that sequence exhaustively)."""
    orig = _ops(dev._E2M1_BF16X2_CODES)
    new = _ops(trim._E2M1_BF16X2_CODES_K)
    consts = {}
    for ln in orig:
        m = re.match(r"mov\.b32 (k[123]), (0x[0-9A-F]+);", ln)
        if m:
            consts[m.group(1)] = m.group(2)
    assert consts == {"k1": "0x40004000", "k2": "0x3F803F80", "k3": "0x3F003F00"}
    orig = [ln for ln in orig if not re.match(r"mov\.b32 k[123],", ln)]
    values = dict(zip(("$3", "$4", "$5"), ("k1", "k2", "k3"), strict=True))
    subst = [re.sub(r"\$[345]", lambda m: values[m.group(0)], ln) for ln in new]
    # the declarations differ (the operands need no registers of their own)
    body = lambda lines: [ln for ln in lines if not ln.startswith((".reg", "{"))]  # noqa: E731
    assert body(subst) == body(orig)
    words = [int(c, 16) for c in consts.values()]
    assert words == [0x40004000, 0x3F803F80, 0x3F003F00]  # encoder_constants' values
