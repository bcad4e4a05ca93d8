"""The packed e2m1 encoder with part of its work moved from the ALU pipe to the FMA pipe
(``Nvfp4QuantizeSpec.fma_encoder``, runtime/nvfp4.py's ``FMA_ENCODER``; perf/NOTES.md, "FMA
encoder"). Same bits as ``device.e2m1x8`` / ``nvfp4_trim.e2m1x8`` for every fp32 input
(tests/test_e2m1_fma.py emulates this sequence; tests/test_gpu_e2m1_exhaustive.py runs it on all
2^32 patterns).

On the H200 the quantize kernel is bound by the ALU pipe (16 lanes: LOP3, PRMT, VIMNMX, HMNMX2,
VHMNMX, ...), and ``e2m1x8`` was ~30 of its ALU-pipe instructions per 8 values. This form keeps
the round to odd at bf16 precision (2 PRMT, VIMNMX.U16x2, LOP3 per pair of values) and changes
the rest:

1. **Two candidates and the saturation in one 3-input min** (instead of HMNMX2 min(a, 6), three
   HFMA2 and a VHMNMX). With a = |round to odd| (bf16, inf and NaN included):
   t_a = RN(a + 126), t_b = RN(a / 2 + 128), code word = min(t_a, t_b, 131) = 0x42FC + code.
   t_a uses a binade edge: [64, 128) has the ulp 0.5 and [128, 256) the ulp 1, so t_a rounds a
   to the e2m1 step 0.5 below a = 2 and to 1 from 2 up, with bf16 bit patterns B - 4 + code
   (B = bits(128)) in both ranges: one ulp per code. t_b = B + RN(a / 2) is code 6 + RN((a -
   4) / 2) from a = 4 on (step 2). Below 2, t_a <= t_b; from 2 to 4, RN(a - 2) <= RN(a / 2);
   from 4 up t_b is smaller; 131 = B + 3 (code 7) caps everything from 6 up, +inf, and NaN (min
   returns the non-NaN operand). Each candidate is one rounding of an exact sum (ties to even:
   the bit pattern's parity is the code's). One HADD2 + one HFMA2 (FMA pipe) + one VHMNMX
   (ALU) per pair: -1 ALU, -1 FMA-pipe instruction per pair.
2. **Nibbles by IMAD.** Each half of the pair words is 0x42FC + code, a constant plus the code,
   so sum_j codes_j 16^j (values j, j + 4 in pair j) is the eight codes in their nibbles plus a
   constant K, subtracted by one more IMAD (``NEG_BASE``). Signs: the two sign-replicating PRMTs
   of ``e2m1x8`` give bytes 0x00 / 0xFF = 255 * sign; 255 is odd, so E * (8 * 255^-1 mod 2^32)
   is the sign bit at bit 3 of each byte, exactly (no carries: E = 255 P with bytes of P 0 / 1).
   Three Horner IMADs, two sign IMADs, one for -K (FMA pipe) replace 2 PRMT + 2 LOP3 + LEA.

Per 8 values: 8 + 4 + 4 (round to odd) + 4 VHMNMX + 2 PRMT = 22 ALU-pipe instructions (was 30),
4 HADD2 + 4 HFMA2 + 6 IMAD (was 12 HFMA2 + 1 IMAD), 36 in all (was 43). ptxas turns a multiply by
a power of two it can see into SHF / LEA (ALU), so 16 and 1 come in as operands that are constant
for every launch but opaque to it (``nvfp4_trim.opaque_zero``), like the multiplier 0.5.

3. **The block amax's last step in the bf16 pair.** ``nvfp4_blocks.bf16_block_amaxes`` ended
   each block's tree word with LOP3 (high half) + IMAD (low half) + FMNMX; here one more
   ``max.NaN.xorsign.abs.bf16x2`` of the word with its high half broadcast (ptxas: HMNMX2 with
   the ``.H1_H1`` operand) leaves max(|lo|, |hi|) (NaN if either is) in the low half, widened
   by one shift; its garbage sign is dropped by the |.| that ptxas folds into the FMUL by
   S_enc / 6 (``block_scales2``): -1 ALU-pipe instruction per block. A NaN amax stays a NaN
   (its payload may differ), and block_scales2's fmin maps every NaN to FLT_MAX as before.
"""

import cutlass.cute as cute
from cutlass import Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import nvfp4_blocks as blocks
from cutequant.kernels import nvfp4_trim as trim

# bf16x2 constants of the pair step (tests/test_e2m1_fma.py checks them against the PTX)
ADD_A = 0x42FC42FC  # 126: t_a = a + 126
MUL_B = 0x3F003F00  # 0.5 (an operand, opaque to ptxas): t_b = a * 0.5 + 128
ADD_B = 0x43004300  # 128
SAT = 0x43034303  # 131 = code 7: the cap for a >= 6, +inf and NaN
CODE_BASE = 0x42FC  # each half of a pair's code word: CODE_BASE + code
INV255 = 0xFEFEFEFF  # 255 * INV255 = 1 (mod 2^32)
SIGN_EVEN = (8 * INV255) & 0xFFFFFFFF  # E * SIGN_EVEN: sign bytes -> bit 3 of each byte
SIGN_ODD = (128 * INV255) & 0xFFFFFFFF  # O * SIGN_ODD: -> bit 7 of each byte
NEG_BASE = -(((CODE_BASE << 16) | CODE_BASE) * 0x1111) & 0xFFFFFFFF  # -K (mod 2^32)

_PAIR_CODES = (
    "{\n\t.reg .b32 s, a, ta, tb;\n\t"
    "mov.b32 s, 0x00010001;\n\t"
    "min.u16x2 s, $2, s;\n\t"  # sticky: 1 in each half whose dropped 16 bits are not all 0
    "lop3.b32 a, $1, s, 0x7FFF7FFF, 0xA8;\n\t"  # (upper | sticky) & ~sign: |round to odd|
    f"mov.b32 s, {ADD_A:#x};\n\t"
    "add.rn.bf16x2 ta, a, s;\n\t"
    f"mov.b32 s, {ADD_B:#x};\n\t"
    "fma.rn.bf16x2 tb, a, $3, s;\n\t"
    "min.bf16x2 ta, ta, tb;\n\t"
    f"mov.b32 s, {SAT:#x};\n\t"
    "min.bf16x2 $0, ta, s;\n\t}"  # ptxas: one VHMNMX with the immediate
)


@dsl_user_op
def pair_codes(upper: Uint32, lower: Uint32, half: Uint32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 values split into their ``upper`` and ``lower`` 16-bit halves (value 0 in bits
    0-15 of each) -> CODE_BASE + the e2m1 magnitude code of each (RNE, satfinite, NaN -> 7);
    ``half``: bf16x2 0.5 (``encoder_constants``)."""
    args = dev._ir((upper, lower, half), (Uint32,) * 3, loc, ip)
    return Uint32(dev._asm(T.i32(), _PAIR_CODES, "=r,r,r,r", args))


def encoder_constants(zero: Uint32):
    """(bf16x2 0.5, 16, 1), made opaque to ptxas by ``zero`` (``nvfp4_trim.opaque_zero``)."""
    return (Uint32(MUL_B) + zero, Uint32(16) + zero, Uint32(1) + zero)


def e2m1x8(v, consts) -> Uint32:
    """Eight fp32 values (already times enc) -> eight e2m1 nibbles (RNE, satfinite), element 0
    in bits 0-3, bit for bit ``device.e2m1x8``; ``consts``: ``encoder_constants``."""
    half, sixteen, one = consts
    bits = [dev.f32_bits(x) for x in v]
    # pair j: value j in the low half, value j + 4 in the high half
    upper = [dev.prmt(bits[j], bits[j + 4], 0x7632) for j in range(4)]
    lower = [dev.prmt(bits[j], bits[j + 4], 0x5410) for j in range(4)]
    codes = [pair_codes(upper[j], lower[j], half) for j in range(4)]
    even_sign = dev.prmt(upper[0], upper[2], 0xFBD9)  # 0xFF / 0x00 bytes: values 0, 2, 4, 6
    odd_sign = dev.prmt(upper[1], upper[3], 0xFBD9)  # 1, 3, 5, 7
    w = trim.mad_lo(codes[3], sixteen, codes[2])  # Horner: sum_j codes_j 16^j
    w = trim.mad_lo(w, sixteen, codes[1])
    w = trim.mad_lo(w, sixteen, codes[0])
    w = trim.mad_lo_imm(even_sign, SIGN_EVEN, w)
    w = trim.mad_lo_imm(odd_sign, SIGN_ODD, w)
    return trim.mad_lo_imm(one, NEG_BASE, w)


_PAIR_ABSMAX = (
    "{\n\t.reg .b16 lo, hi;\n\t.reg .b32 t;\n\tmov.b32 {lo, hi}, $1;\n\t"
    "mov.b32 t, {hi, hi};\n\tmax.NaN.xorsign.abs.bf16x2 $0, $1, t;\n\t}"
)


@dsl_user_op
def _pair_absmax_low(word: Uint32, *, loc=None, ip=None) -> Uint32:
    """Low half: max(|lo|, |hi|) of the two bf16 halves of ``word`` (NaN-propagating; sign
    garbage); high half: the high half's |.| (unused)."""
    return Uint32(dev._asm(T.i32(), _PAIR_ABSMAX, "=r,r", dev._ir((word,), (Uint32,), loc, ip)))


def _pair_absmax(word: Uint32):
    """A block tree's last step folded in bf16 (``_pair_absmax_low``), widened to fp32 (the
    |.| folds into the consumer's FMUL)."""
    return cute.math.absf(dev.bits_f32(_pair_absmax_low(word) << 16))


def bf16_block_amaxes(words):
    """``nvfp4_blocks.bf16_block_amaxes`` (the same bf16x2 trees) with each block's pair folded
    in bf16 (``_pair_absmax``): non-negative |max| of the two 16-element blocks in 16 words."""
    return blocks.bf16_block_amaxes(words, _pair_absmax)
