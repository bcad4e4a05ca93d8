"""Shared device helpers for every cutequant kernel (sm_90a first).

Small, pure ``@cute.jit`` / ``@dsl_user_op`` building blocks: bit casts, NaN-propagating abs-max,
warp reductions, atomic amax flushes, bf16 rounding, the NVFP4 scale math and the software
e2m1 encoder that sm_90a needs (it has no ``cvt.*.e2m1x2``). Numerics follow TE exactly; the
formulas are spelled out in ``cutequant.reference`` (the oracle of every GPU test).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

FLT_MAX = 3.4028234663852886e38
INV6 = 0.16666666666666666  # rounded to fp32 at use: TE's f32(1/6) multiplier (x * (1/y) rule)
MAGIC = 8388608.0  # 2^23: FADD/FFMA against it rounds to an integer (RNE, single rounding)


def _asm(res_type, ptx: str, constraints: str, args):
    """Side-effect-free inline PTX (lets LLVM CSE/DCE/schedule it like plain arithmetic)."""
    return llvm.inline_asm(
        res_type, args, ptx, constraints, has_side_effects=False, is_align_stack=False
    )


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(_asm(T.i32(), "mov.b32 $0, $1;", "=r,f", [Float32(x).ir_value(loc=loc, ip=ip)]))


@dsl_user_op
def bits_f32(x: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), "mov.b32 $0, $1;", "=f,r", [Uint32(x).ir_value(loc=loc, ip=ip)]))


@dsl_user_op
def bf16x2_absmax(acc: Uint32, word: Uint32, *, loc=None, ip=None) -> Uint32:
    """Per-half |max| of two packed bf16 pairs, NaN-propagating (sign bits are garbage)."""
    return Uint32(
        _asm(
            T.i32(),
            "max.NaN.xorsign.abs.bf16x2 $0, $1, $2;",
            "=r,r,r",
            [Uint32(acc).ir_value(loc=loc, ip=ip), Uint32(word).ir_value(loc=loc, ip=ip)],
        )
    )


@cute.jit
def absmax(acc: Float32, x: Float32) -> Float32:
    """max(|acc|, |x|) with NaN propagation; the sign of the result is garbage (xorsign)."""
    return cute.arch.fmax(acc, x, abs=True, nan=True)


@cute.jit
def bf16x2_pair_absmax(word: Uint32) -> Float32:
    """|max| of the two bf16 halves of ``word`` as fp32 (exact widening)."""
    lo = bits_f32(word << 16)
    hi = bits_f32(word & Uint32(0xFFFF0000))
    return absmax(lo, hi)


@cute.jit
def warp_absmax(x: Float32) -> Float32:
    """Butterfly abs-max over the 32 lanes; every lane gets the result (non-negative)."""
    for i in cutlass.range_constexpr(5):
        x = absmax(x, cute.arch.shuffle_sync_bfly(x, offset=1 << i))
    return bits_f32(f32_bits(x) & Uint32(0x7FFFFFFF))


@dsl_user_op
def round_bf16(x: Float32, *, loc=None, ip=None) -> Float32:
    """fp32 -> bf16 (RNE) -> fp32; NaN stays NaN."""
    return Float32(
        _asm(
            T.f32(),
            "{\n\t.reg .b16 h;\n\tcvt.rn.bf16.f32 h, $1;\n\tmov.b32 $0, {0, h};\n\t}",
            "=f,f",
            [Float32(x).ir_value(loc=loc, ip=ip)],
        )
    )


@cute.jit
def atomic_amax(ptr: cute.Pointer, value: Float32):
    """Global amax update: non-negative fp32 bit patterns order like integers (NaN > inf)."""
    cute.arch.atomic_max(ptr, Int32(f32_bits(value) & Uint32(0x7FFFFFFF)))
