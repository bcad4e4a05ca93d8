"""The stochastic-rounding e2m1 encoder of the NVFP4 quantize kernel with fewer (and fewer
ALU-pipe) instructions (``Nvfp4QuantizeSpec.sr_trim``, runtime/nvfp4.py's ``SR_TRIM``;
perf/NOTES.md, "SR trim"). Same bits as ``stochastic.e2m1x8_sr`` for every fp32 input and
random byte (tests/test_nvfp4_sr.py emulates this sequence against it and against
``reference.e2m1_encode_sr``); the random stream is unchanged: element i of a block still gets
byte i of the block's Philox4x32-10 words (TE's rule spends 8 bits per value, and one Philox
call per 16-element block is already that rate, so there is nothing left to amortize).

Per value (``stochastic.e2m1_sr_code_bits`` took FMNMX + VIMNMX + LOP3 + FFMA + FMUL.RZ + SHF,
and its random byte LOP3 / SHF + FADD):

1. **No clamp of |v| at 6, and the random byte as a subnormal.** The byte goes to bits 16-23 of
   an otherwise zero word (one PRMT with an opaque zero register): as fp32 that is the
   subnormal byte * 2^-133, and the multiplier is p' = p * 2^124 (p = 2^max(e, 0), e = the
   exponent of |v|), built from v's exponent bits by one AND and one signed add-max (ptxas:
   VIADDMNMX): p' = max(e_bits + (124 << 23), 251 << 23). The product byte * p / 512 is exact
   inside the FFMA (no .ftz: subnormal operands are exact), so t = fma(byte', p', |v|) is TE's
   one rounding of |v| + byte / 256 * step(|v|), without the FADD that removed a magic
   exponent. |v| is not clamped: below 6 p is the rule's; from 16 on e_bits + (124 << 23)
   reaches +inf (t = inf or NaN) or wraps negative (the signed max then gives p' = 2^124: t >=
   |v| >= 32); NaN gives NaN. Every t >= 8 or NaN is clamped to code 7 below.
2. **The grid floor and the clamp on packed halves.** G = bits(rz(t * 2^-126)) holds the code
   in bits 22-24 (``stochastic.e2m1_sr_code_bits``' floor, unchanged) with t's dropped bits in
   0-21 and zeros above 24 while t < 8. Values j and j + 4 of eight share a pair word: one PRMT
   takes both upper halves (code at bits 6-8 / 22-24, garbage at 0-5 / 16-21), one
   ``min.u16x2`` with 0x01FF clamps each half (t >= 8, inf and NaN have halves >= 0x0200, so
   they become code 7), one AND keeps the codes.
3. **Nibbles by IMAD.** Pair j's codes go to nibbles j and j + 4, 16 bits apart as in the pair
   word: sum_j (M_j shifted by 4 j - 6), two IMAD.HI (right shifts) and two IMADs (left shifts,
   by the opaque 16 and 4). Signs: the sign-replicating PRMT tree of ``device.sign_bytes``
   (bytes 0x00 / 0xFF = 255 * sign), put at bit 3 / 7 of each byte by the multipliers of
   ``nvfp4_fma`` (IMAD), as the FMA encoder does.

Per 8 values: ALU 8 AND + 8 VIADDMNMX + 8 PRMT (bytes) + 4 PRMT + 4 VIMNMX.U16x2 + 4 AND (pairs)
+ 6 PRMT (signs) = 42, FMA pipe 8 FFMA + 8 FMUL.RZ, IMAD 6; 64 in all. Before: ALU 8 FMNMX + 8
VIMNMX + 8 LOP3 + ~10 (bytes) + ~21 (shifts, packing, signs) = ~55, FMA pipe 8 FFMA + 8
FMUL.RZ + 8 FADD, IMAD ~2; ~81 (static SASS in perf/NOTES.md).
"""

from cutlass import Float32, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import nvfp4_fma as fma
from cutequant.kernels import nvfp4_trim as trim
from cutequant.kernels import stochastic as sr

P_BIAS = 124 << 23  # p' = p * 2^124: the byte at bits 16-23 is byte * 2^-133 as fp32
P_MIN = (127 + 124) << 23  # p' for |v| < 2 (p = 1)
GRID_SCALE = 0x00800000  # 2^-126 (stochastic.SR_GRID_SCALE): 1.0 -> the smallest normal
HALF_CAP = 0x01FF01FF  # code 7 plus garbage: the clamp of each upper half
CODE_MASK = 0x01C001C0  # the codes' bits 6-8 of each half


def byte_selector(k: int) -> int:
    """PRMT selector putting byte k of a into byte 2, zero bytes of b elsewhere."""
    return 0x4044 | (k << 8)


def sr_sum_ptx(k: int) -> str:
    """The PTX lines every SR value path starts with (this module's and the fake-quant
    kernels' ``fake_quant.e2m1_sr_sub``): from |v| = |$1|, p' (the grid step's exponent word,
    ``P_BIAS`` / ``P_MIN``), byte k of $2 as a subnormal operand, and t = |v| + byte * p / 512 in
    one rounding. The caller declares .b32 e, p, r, x and .f32 a, t."""
    return (
        "mov.b32 x, $1;\n\t"
        "and.b32 e, x, 0x7F800000;\n\t"  # exponent of |v|
        f"add.s32 e, e, {P_BIAS:#x};\n\t"
        f"max.s32 p, e, {P_MIN:#x};\n\t"  # ptxas: one VIADDMNMX
        f"prmt.b32 r, $2, 0, {byte_selector(k):#x};\n\t"  # byte k -> bits 16-23
        "abs.f32 a, $1;\n\t"
        "fma.rn.f32 t, r, p, a;\n\t"  # |v| + byte * p / 512, one rounding
    )


def _value_ptx(k: int) -> str:
    return (
        "{\n\t.reg .b32 e, p, r, x;\n\t.reg .f32 a, t;\n\t"
        + sr_sum_ptx(k)
        + f"mul.rz.f32 t, t, 0f{GRID_SCALE:08X};\n\t"
        "mov.b32 $0, t;\n\t}"
    )


@dsl_user_op
def value_grid(v: Float32, word: Uint32, zero: Uint32, k: int, *, loc=None, ip=None) -> Uint32:
    """bits(rz(t * 2^-126)) for t = |v| + byte_k(word) / 256 * step(|v|) (one rounding): the
    SR code of |v| in bits 22-24 while t < 8 (larger or NaN from t >= 8). ``zero``: 0, opaque
    to ptxas (a constant second operand would move the selector into a register)."""
    args = dev._ir((v, word, zero), (Float32, Uint32, Uint32), loc, ip)
    return Uint32(dev._asm(T.i32(), _value_ptx(k), "=r,f,r,r", args))


_PAIR_PTX = (
    "{\n\t.reg .b32 q, c;\n\t"
    "prmt.b32 q, $1, $2, 0x7632;\n\t"  # upper halves: value j low, value j + 4 high
    f"mov.b32 c, {HALF_CAP:#x};\n\t"
    "min.u16x2 q, q, c;\n\t"  # t >= 8, inf, NaN -> code 7
    f"and.b32 $0, q, {CODE_MASK:#x};\n\t}}"
)


@dsl_user_op
def pair_codes(g_lo: Uint32, g_hi: Uint32, *, loc=None, ip=None) -> Uint32:
    """Two ``value_grid`` words -> their clamped codes at bits 6-8 and 22-24, zeros elsewhere."""
    return dev._u32_op(_PAIR_PTX, g_lo, g_hi, loc, ip)


@dsl_user_op
def mad_hi_imm(a: Uint32, k: int, c: Uint32, *, loc=None, ip=None) -> Uint32:
    """((a * k) >> 32) + c for a constant ``k`` (one IMAD.HI.U32 with the add)."""
    return dev._u32_op(f"mad.hi.u32 $0, $1, {k:#x}, $2;", a, c, loc, ip)


def encoder_constants(zero: Uint32):
    """(0, 16, 4), opaque to ptxas (``nvfp4_trim.opaque_zero``): the PRMT's zero bytes and the
    left shifts that must stay IMADs (a visible power of two becomes SHF / LEA)."""
    return (zero, Uint32(16) + zero, Uint32(4) + zero)


def e2m1x8_sr(v, words: list, first: int, consts) -> Uint32:
    """``stochastic.e2m1x8_sr`` (the same bits): eight fp32 values (already times enc) ->
    eight SR e2m1 nibbles, element j with random byte ``first + j`` of the block's ``words``;
    ``consts``: ``encoder_constants``."""
    zero, sixteen, four = consts
    g = [value_grid(v[j], words[(first + j) // 4], zero, (first + j) % 4) for j in range(8)]
    m = [pair_codes(g[j], g[j + 4]) for j in range(4)]
    even, odd = dev.sign_bytes([dev.f32_bits(x) for x in v])
    w = trim.mul_hi_imm(m[0], 1 << 26)  # pair 0: >> 6
    w = mad_hi_imm(m[1], 1 << 30, w)  # pair 1: >> 2
    w = trim.mad_lo(trim.mad_lo(m[3], sixteen, m[2]), four, w)  # pairs 2, 3: << 2, << 6
    w = trim.mad_lo_imm(even, fma.SIGN_EVEN, w)
    return trim.mad_lo_imm(odd, fma.SIGN_ODD, w)


# ---------------------------------------------------------------- Philox, loop-invariant part
# With alu_trim every block id is < 2^32 (M N / 16 < 2^28), so a call's counter is (id, direction
# << 31, offset lo, offset hi): only word 0 varies. Round 1's product of word 2 (the offset), the
# new word 0 (hi1 ^ c1 ^ k0) and word 1 (lo1), and round 2's product of that word 0 are the same
# for every call of a thread: computed once before the tile loop (``philox_prefix``), each call
# starts from them (``block_random_words``): 2 IMAD.WIDE and 1 LOP3 fewer per call, same words.


def philox_prefix(direction: int, rng: tuple) -> tuple:
    """The id-independent part of the first two Philox rounds of ``stochastic.block_random_words``
    for ids < 2^32: (c0 and c1 after round 1, hi0 ^ key1 and lo0 of round 2's product)."""
    seed_lo, seed_hi, off_lo, off_hi = rng
    m0, m1 = Uint32(sr.PHILOX_M0), Uint32(sr.PHILOX_M1)
    hi1, lo1 = dev.mul_hi_u32(m1, off_lo), m1 * off_lo
    c0 = hi1 ^ Uint32(direction << 31) ^ seed_lo  # round 1's new word 0
    k1 = seed_hi + Uint32(sr.PHILOX_W1)  # round 2's key word 1
    return c0, lo1, dev.mul_hi_u32(m0, c0) ^ k1, m0 * c0


def block_random_words(block_id: Uint32, pre: tuple, rng: tuple) -> list:
    """``stochastic.block_random_words(block_id, direction, rng)`` for a block id < 2^32, from
    ``philox_prefix(direction, rng)``: the same four words."""
    seed_lo, seed_hi, _, off_hi = rng
    c0_1, c1_1, hk_2, lo0_2 = pre
    m0, m1 = Uint32(sr.PHILOX_M0), Uint32(sr.PHILOX_M1)
    # round 1: only the product of word 0 (the id) varies
    hi0, lo0 = dev.mul_hi_u32(m0, block_id), m0 * block_id
    c2, c3 = hi0 ^ off_hi ^ seed_hi, lo0
    # round 2: the product of word 0 is the prefix's
    k0 = seed_lo + Uint32(sr.PHILOX_W0)
    hi1, lo1 = dev.mul_hi_u32(m1, c2), m1 * c2
    c0, c1, c2, c3 = hi1 ^ c1_1 ^ k0, lo1, hk_2 ^ c3, lo0_2
    k1 = seed_hi + Uint32(sr.PHILOX_W1)
    for _ in range(2, sr.PHILOX_ROUNDS):
        k0 = k0 + Uint32(sr.PHILOX_W0)
        k1 = k1 + Uint32(sr.PHILOX_W1)
        hi0, lo0 = dev.mul_hi_u32(m0, c0), m0 * c0
        hi1, lo1 = dev.mul_hi_u32(m1, c2), m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]
