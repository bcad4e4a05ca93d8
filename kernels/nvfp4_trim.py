"""ALU-pipe-trimmed pieces of the grouped NVFP4 quantize hot loops (``Nvfp4QuantizeSpec.alu_trim``,
runtime/nvfp4.py's ``ALU_TRIM``; perf/NOTES.md, "ALU trim: the NVFP4 quantize hot loops").

On the H200 the quantize kernel is bound by the ALU pipe (LOP3, PRMT, SHF, LEA, ISETP, SEL,
IMNMX, FMNMX, HMNMX2, F2FP, IADD3: 16 lanes, two issue cycles per warp instruction), while the
FMA pipe (FFMA, FMUL, HFMA2 on either half, IMAD* on fmaheavy) runs at a quarter of its peak.
These helpers compute the same values with fewer ALU-pipe instructions:

* the scale bytes' enc-table addresses by IMAD / IMAD.HI instead of LOP3 / LEA / LEA.HI, with
  the e4m3 pair zero-extended by ``mov.b32 {h, 0}`` (ptxas knows F2FP's upper half is zero; the
  ``cvt.u32.u16`` form cost a LOP3);
* the TMA ring's stage index and phase from the tile counter by IMAD.HI / IMAD (the CuTe
  ``PipelineState.advance`` costs VIADD + ISETP + 2 SEL + LOP3 a tile);
* the packed encoder's three bf16x2 multipliers as loop-invariant operands (as immediates, ptxas
  re-materialized them every tile with 4 IMAD.MOV and 2 PRMT).

ptxas turns a multiply by a power of two it can see into SHF / LEA (ALU), so the multipliers
that must stay IMADs come from ``opaque_zero``: a value that is 0 for every launch but that
ptxas cannot prove constant (it lives in a uniform register; IMAD takes it as an operand).
``mul.hi.u32`` by a constant and ``mad.lo.u32`` by a negative one stay IMAD.HI / IMAD as
written. Every identity here is exact integer arithmetic on the ranges noted
(tests/test_nvfp4_trim.py checks them exhaustively).
"""

import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev


@dsl_user_op
def opaque_zero(n_cols: Int32, *, loc=None, ip=None) -> Uint32:
    """0 for any n_cols >= 0 (a tensor extent), as ``n_cols >> 31``: not a constant to ptxas."""
    return Uint32(
        dev._asm(T.i32(), "shr.s32 $0, $1, 31;", "=r,r", dev._ir((n_cols,), (Int32,), loc, ip))
    )


@dsl_user_op
def mad_lo(a: Uint32, b: Uint32, c: Uint32, *, loc=None, ip=None) -> Uint32:
    """a * b + c (mod 2^32) as one ``mad.lo.u32`` (one IMAD unless ptxas sees a power of 2)."""
    return dev._u32_op3("mad.lo.u32 $0, $1, $2, $3;", a, b, c, loc, ip)


@dsl_user_op
def mad_lo_imm(a: Uint32, k: int, c: Uint32, *, loc=None, ip=None) -> Uint32:
    """a * k + c (mod 2^32), ``k`` a constant (negative: one IMAD with the immediate)."""
    return dev._u32_op(f"mad.lo.u32 $0, $1, {k & 0xFFFFFFFF:#x}, $2;", a, c, loc, ip)


@dsl_user_op
def mul_hi_imm(a: Uint32, k: int, *, loc=None, ip=None) -> Uint32:
    """(a * k) >> 32 for a constant ``k`` (one IMAD.HI.U32: a right shift on the FMA pipe when
    k is a power of two)."""
    return Uint32(
        dev._asm(T.i32(), f"mul.hi.u32 $0, $1, {k:#x};", "=r,r", dev._ir((a,), (Uint32,), loc, ip))
    )


@dsl_user_op
def e4m3x2_word(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """``device.e4m3x2`` (``lo`` in bits 0-7, ``hi`` in bits 8-15, bits 16-31 zero) without the
    zero-extending LOP3: ``mov.b32 {h, 0}`` lets ptxas use F2FP's zeroed upper half."""
    return dev._f32x2_to_u32(
        "{\n\t.reg .b16 h, z;\n\tcvt.rn.satfinite.e4m3x2.f32 h, $1, $2;\n\t"
        "mov.b16 z, 0;\n\tmov.b32 $0, {h, z};\n\t}",
        hi,
        lo,
        loc,
        ip,
    )


def block_scales2(amax0: Float32, amax1: Float32, s_enc_div6: Float32) -> Uint32:
    """``device.block_scales2`` (the same fmin and cvt), bits 16-31 zero without a LOP3."""
    big = Float32(dev.FLT_MAX)
    return e4m3x2_word(
        cute.arch.fmin(amax1 * s_enc_div6, big), cute.arch.fmin(amax0 * s_enc_div6, big)
    )


def enc_pair(sf: Uint32, lut_base: Int32, four: Uint32):
    """The two blocks' enc from the group's table at shared byte address ``lut_base`` (fp32
    entries, index = e4m3 byte): sf = b0 + 256 b1 (b0, b1 < 256, bits 16+ zero), so
    b1 = (sf * 2^24) >> 32, 4 b0 + base = 4 sf + base - 1024 b1 (``four``: 4 that ptxas cannot see,
    else the products become LEAs). 1 IMAD.HI + 3 IMAD instead of LOP3 + 2 LEA + LEA.HI + IMAD."""
    base = Uint32(lut_base)
    b1 = mul_hi_imm(sf, 1 << 24)
    addr0 = mad_lo_imm(b1, -1024, mad_lo(sf, four, base))
    addr1 = mad_lo(b1, four, base)
    return (
        dev.bits_f32(dev.load_shared_b32(Int32(addr0))),
        dev.bits_f32(dev.load_shared_b32(Int32(addr1))),
    )


def stage_state(k: Int32, stages: int):
    """The consumer's ring position after ``k`` tiles (k >= 0): index k % stages, phase
    (k / stages) & 1, ``stages`` a power of two. The phase is passed as k / stages whole: the
    wait's parity operand is lowered as a shift into bit 31 (only its lsb counts; checked in the
    SASS), which saves the mask."""
    assert stages & (stages - 1) == 0, "stage_state needs a power-of-two ring"
    q = mul_hi_imm(Uint32(k), 1 << (32 - (stages.bit_length() - 1)))
    idx = mad_lo_imm(q, -stages, Uint32(k))
    return pipeline.PipelineState(stages, k, Int32(idx), Int32(q))


# The packed encoder (device.e2m1x8) with its bf16x2 multipliers 2.0 / 1.0 / 0.5 as operands.
_E2M1_BF16X2_CODES_K = (
    "{\n\t.reg .b32 s, a, k1, k2, k3, m1, m2, m3;\n\t"
    "mov.b32 s, 0x00010001;\n\t"
    "min.u16x2 s, $2, s;\n\t"
    "lop3.b32 a, $1, s, 0x7FFF7FFF, 0xA8;\n\t"
    "mov.b32 s, 0x40C040C0;\n\t"
    "min.bf16x2 a, a, s;\n\t"
    "mov.b32 m1, 0x43004300;\n\t"  # 128
    "mov.b32 m2, 0x43024302;\n\t"  # 130
    "mov.b32 m3, 0x43044304;\n\t"  # 132
    "fma.rn.bf16x2 k1, a, $3, m1;\n\t"
    "fma.rn.bf16x2 k2, a, $4, m2;\n\t"
    "fma.rn.bf16x2 k3, a, $5, m3;\n\t"
    "min.bf16x2 k1, k1, k2;\n\t"
    "min.bf16x2 $0, k1, k3;\n\t}"
)


def encoder_constants(zero: Uint32):
    """The encoder's multipliers 2.0, 1.0, 0.5 (bf16x2), made opaque to ptxas by ``zero``."""
    return tuple(Uint32(k) + zero for k in (0x40004000, 0x3F803F80, 0x3F003F00))


@dsl_user_op
def _codes_k(upper: Uint32, lower: Uint32, k1, k2, k3, *, loc=None, ip=None) -> Uint32:
    args = dev._ir((upper, lower, k1, k2, k3), (Uint32,) * 5, loc, ip)
    return Uint32(dev._asm(T.i32(), _E2M1_BF16X2_CODES_K, "=r,r,r,r,r,r", args))


def e2m1x8(v, consts) -> Uint32:
    """``device.e2m1x8`` (the same instructions and bits) with the multipliers ``consts``
    (``encoder_constants``) as register operands."""
    bits = [dev.f32_bits(x) for x in v]
    upper = [dev.prmt(bits[j], bits[j + 4], 0x7632) for j in range(4)]
    lower = [dev.prmt(bits[j], bits[j + 4], 0x5410) for j in range(4)]
    codes = [_codes_k(upper[j], lower[j], *consts) for j in range(4)]
    even = dev.prmt(codes[0], codes[2], 0x6240)
    odd = dev.prmt(codes[1], codes[3], 0x6240)
    even_sign = dev.prmt(upper[0], upper[2], 0xFBD9)
    odd_sign = dev.prmt(upper[1], upper[3], 0xFBD9)
    lo = even | (even_sign & Uint32(0x08080808))
    hi = odd | (odd_sign & Uint32(0x08080808))
    return lo + (hi << 4)


def two_block_codes(vals, amaxes, lut_base: Int32, s6: Float32, four: Uint32, encode):
    """The template's ``two_block_codes`` with ``block_scales2`` / ``enc_pair`` above: two
    16-element blocks -> (four code words, the scale pair in bits 0-15, bits 16+ zero).
    ``encode(scaled8, blk, first)`` encodes eight scaled values of block ``blk``."""
    sf = block_scales2(amaxes[0], amaxes[1], s6)
    encs = enc_pair(sf, lut_base, four)
    codes = []
    for blk in range(2):
        scaled = [v * encs[blk] for v in vals[16 * blk : 16 * blk + 16]]
        codes += [encode(scaled[0:8], blk, 0), encode(scaled[8:16], blk, 8)]
    return codes, sf


@cute.jit
def store_two_blocks(addr: Int64, codes: list, policy):
    """``nvfp4_blocks.store_blocks`` for two valid blocks (no ``valid`` test)."""
    if (addr % 16) == 0:
        dev.st_global_v4(addr, codes[0], codes[1], codes[2], codes[3], policy)
    else:  # rows of N % 32 == 16 bytes (or M_g % 32 == 16) are only 8-byte aligned
        dev.st_global_v2(addr, codes[0], codes[1], policy)
        dev.st_global_v2(addr + 8, codes[2], codes[3], policy)


@dsl_user_op
def add_wide(base: Int64, off: Uint32, one: Uint32, *, loc=None, ip=None) -> Int64:
    """base + off (off unsigned) as one IMAD.WIDE.U32 ``off * one + base``; ``one``: 1 that
    ptxas cannot see (a 64-bit add of a 32-bit offset is IADD3 + LEA.HI.X / IADD3.X, 2 ALU)."""
    return Int64(
        dev._asm(
            T.i64(),
            "mad.wide.u32 $0, $1, $2, $3;",
            "=l,r,r,l",
            dev._ir((off, one, base), (Uint32, Uint32, Int64), loc, ip),
        )
    )


@dsl_user_op
def st_global_b16(addr: Int64, a: Uint32, policy=None, *, loc=None, ip=None):
    """``device.st_global_b16`` from the 32-bit register itself (PTX stores its low 16 bits):
    the ``cvt.u16.u32`` copy cost a PRMT."""
    dev._st_global("b16", addr, (a,), policy, loc, ip)
