"""Device helpers of the fused NVFP4 fake-quant kernels (``fake_quant_cols.py.j2``, most of
them; ``fake_quant_rows.py.j2`` and the 2D kernel's fake-quant share the rounding helpers).

The kernel stages a 64-token tile of x in shared memory and reads each 16-token block of 16
hidden columns with one ``ldmatrix.x4.trans``; with the RHT it multiplies the block by the RHT
matrix on the tensor cores with two warp-level ``mma.sync.m16n8k16`` (bf16 in, fp32
accumulators: every arch from sm_80 on has them, unlike wgmma). Fragment layout (lane =
4 gq + q): every lane ends up holding tokens 4q .. 4q + 3 of one block for hidden columns gq and
gq + 8, so a block's 16 values lie in the four lanes of a quad (amax: two shuffles).

* ldmatrix: lane l gives the address of row r = l % 8 of 8x8 matrix i = l // 8; with ``.trans``
  lane (gq, q) receives rows 2q, 2q + 1 of column gq of each matrix. Matrix i holds the hidden
  columns 8 (i & 1) .. + 7 and the tokens ``ldmatrix_token(i, r)``: rows 2q, 2q + 1 are tokens
  4q + 2 (i >> 1) + {0, 1}, so registers (r0, r2) are tokens 4q .. 4q + 3 of column gq and
  (r1, r3) of column gq + 8. Without the RHT those are the values.
* mma (A row-major 16x16, B col-major 16x8): (r0, r1, r2, r3) are A's a0a1, a2a3, a4a5, a6a7,
  i.e. A[m][k] = x[token a_token(k)][column m]; B's rows follow the same token order and its
  columns pick output tokens (``b_indices``), so mma h yields tokens 4q + 2h, + 1 of columns gq
  (d0, d1) and gq + 8 (d2, d3). A product of permuted operands is the same set of 16-term dot
  products, so the values are the tensor-core RHT of ``cutequant.reference`` bit for bit.

The shared tile's 16-byte chunks are XOR-swizzled by ``chunk_key(token)``, which equals the
ldmatrix row r of the token: the 8 rows of every matrix land on 8 distinct 16-byte bank groups
(conflict-free), and a quarter-warp's 16-byte stores of one token row stay a permutation.

Rounding helpers: fake-quant needs the e2m1 *value*, not its code, so the quantize-dequantize
pair ``decode(e2m1(s))`` is done directly in fp32 (tests/test_e2m1_value.py checks the RN one
on every fp32 input, tests/test_gpu_e2m1_exhaustive.py on the device).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import nvfp4_sr as srq
from cutequant.kernels import stochastic as sr

RHT_MAGIC = 4194304.0  # 2^22: p * 2^22 has the ulp of the e2m1 step of [p, 2p) (p = 1, 2, 4)
BF16_QUARTER = 0x3E80  # bf16 0.25: every RHT matrix entry is +-0.25


# ------------------------------------------------------------------------------ index maps
# Plain integer arithmetic: the kernel calls these on Int32 values, the CPU test
# (tests/test_fake_quant_cols_layout.py) on Python ints, and emulates the fragments with them.


def ldmatrix_token(i, r):
    """Token (within the 16-token block) of row r of ldmatrix matrix i: matrices 0, 1 hold
    tokens 4 (r >> 1) + (r & 1), matrices 2, 3 the same + 2."""
    return 4 * (r >> 1) + 2 * (i >> 1) + (r & 1)


def chunk_key(token):
    """The XOR key of a token row's 16-byte chunks in the shared tile: bits (3, 2, 0) of the
    token. It equals r for the token of ``ldmatrix_token(i, r)``."""
    return ((token >> 1) & 6) | (token & 1)


def a_token(k):
    """The token that A's column k holds (the k order of ``(r0, r1, r2, r3)``)."""
    return 4 * ((k & 7) >> 1) + 2 * (k >> 3) + (k & 1)


def b_indices(lane, h, reg):
    """((i0, i1), j): B register ``reg`` (0: b0b1, 1: b2b3) of lane ``lane`` in mma ``h`` holds
    R[i0][j] (low half) and R[i1][j] (high half): B rows k = 2q + 8 reg + {0, 1} (tokens
    ``a_token``), column n = lane // 4 holding output token 4 (n >> 1) + 2h + (n & 1)."""
    q = lane & 3
    n = lane >> 2
    k = 2 * q + 8 * reg
    return (a_token(k), a_token(k + 1)), 4 * (n >> 1) + 2 * h + (n & 1)


# Random words of stochastic rounding through shared memory (the columnwise SR kernel):
# per slice a warp draws 64 Philox calls (16 columns x 4 blocks), lane (gq, q) those of block q
# of columns gq and gq + 8, and lane (gq, q) needs word q of every block of its two columns (its
# tokens 4q .. 4q + 3). The writer of block b stores word e of both columns (one 8-byte store)
# where reader (gq, e) loads them at block b: reader offsets are lane * 8 + b * RAND_BLOCK_BYTES
# (a warp's 8-byte loads contiguous, conflict-free); writer offsets q * RAND_BLOCK_BYTES + 32 gq
# + 8 e. A block row of 256 bytes padded to 264 puts the writers' 16 lanes of each half-warp on
# 16 distinct 8-byte bank pairs (q + 4 gq + e mod 16) instead of 4-way conflicts.
RAND_BLOCK_BYTES = 264
RAND_WARP_BYTES = 4 * RAND_BLOCK_BYTES


def rand_write_offset(lane, e):
    """Byte offset (in the warp's buffer) of word e of both columns of the block that ``lane``
    draws (block q = lane % 4, columns gq, gq + 8 with gq = lane // 4)."""
    return (lane & 3) * RAND_BLOCK_BYTES + (lane >> 2) * 32 + 8 * e


def rand_read_offset(lane, blk):
    """Byte offset of the two words (columns gq, gq + 8) ``lane`` reads for block ``blk``."""
    return lane * 8 + blk * RAND_BLOCK_BYTES


# ------------------------------------------------------------------------------ instructions


@dsl_user_op
def ldmatrix_x4_trans(addr: Int32, *, loc=None, ip=None) -> list:
    """``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``: four 8x8 b16 matrices, transposed.
    Volatile, so that it stays after the barrier that published the tile."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int32(addr).ir_value(loc=loc, ip=ip)],
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r",
        has_side_effects=True,
        is_align_stack=False,
    )
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def mma_bf16_16816(a: list, b: list, *, loc=None, ip=None) -> list:
    """D = A B + 0 of ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` (fp32
    accumulators, C = +0). Volatile: a warp-synchronous instruction must not be moved into
    divergent code."""
    args = [Uint32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)]
    args.append(Float32(0.0).ir_value(loc=loc, ip=ip))
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4),
        args,
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, "
        "{$4, $5, $6, $7}, {$8, $9}, {$10, $10, $10, $10};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f",
        has_side_effects=True,
        is_align_stack=False,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


def rht_b_word(sign_mask: Int32, lane: Int32, h: Int32, reg: Int32) -> Uint32:
    """B register ``reg`` of ``lane`` in mma ``h``: two bf16 +-0.25 entries of the RHT matrix
    R[i][j] = s_i (-1)^popc(i & j) / 4 (``device.rht_entry``), R[i0][j] in the low half."""
    (i0, i1), j = b_indices(lane, h, reg)
    word = Uint32(BF16_QUARTER | (BF16_QUARTER << 16))
    for half, i in enumerate((i0, i1)):
        parity = cute.arch.popc(Uint32(i & j)) + Uint32((sign_mask >> i) & 1)
        word = word | ((parity & Uint32(1)) << Uint32(15 + 16 * half))
    return word


@dsl_user_op
def cp_async_16(dst: Int32, src: Int64, src_bytes: Int32, *, loc=None, ip=None):
    """``cp.async.cg.shared.global`` of 16 bytes, ``src_bytes`` (16 or 0) of them read, the rest
    zero-filled: a load into shared memory that holds no registers while it flies."""
    dev.volatile_asm(
        None,
        "cp.async.cg.shared.global [$0], [$1], 16, $2;",
        "r,l,r",
        [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
         Int32(src_bytes).ir_value(loc=loc, ip=ip)],
    )  # fmt: skip


@dsl_user_op
def cp_async_wait_all(*, loc=None, ip=None):
    """Wait for this thread's ``cp_async_16`` copies (a barrier then publishes them)."""
    dev.volatile_asm(None, "cp.async.wait_all;", "", [])


@dsl_user_op
def load_global_f32_now(addr: Int64, *, loc=None, ip=None) -> Float32:
    """``ld.global.f32``, volatile: ptxas keeps it where it stands. A plain load that only one
    branch uses is sunk into that branch, i.e. after whatever precedes the branch (the group
    amax of the columnwise kernel went behind the tile's shared stores)."""
    return Float32(
        dev.volatile_asm(
            T.f32(),
            "ld.volatile.global.f32 $0, [$1];",
            "=f,l",
            [Int64(addr).ir_value(loc=loc, ip=ip)],
        )
    )


@cute.jit
def load_shared_v2(addr: Int32) -> list:
    """Two 32-bit words from 8-byte-aligned shared address ``addr`` (one LDS.64)."""
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=8), cute.make_layout(2)
    ).load()
    return [v[0], v[1]]


# ------------------------------------------------------------------------------ quads


def quad_block_amax(w) -> tuple:
    """Non-negative |max| of a 16-token block for the two hidden columns of a quad (``w[c]``:
    column gq + 8c, two bf16x2 words = this lane's tokens 4q .. 4q + 3): bf16x2 trees, the two
    columns packed in one word for the two butterfly shuffles. NaN propagates."""
    m0 = dev.bf16x2_absmax(w[0][0], w[0][1])
    m1 = dev.bf16x2_absmax(w[1][0], w[1][1])
    m = dev.bf16x2_absmax(dev.prmt(m0, m1, 0x5410), dev.prmt(m0, m1, 0x7632))
    for off in (1, 2):
        m = dev.bf16x2_absmax(m, cute.arch.shuffle_sync_bfly(m, offset=off))
    m = m & Uint32(0x7FFF7FFF)  # xorsign left the signs undefined
    return dev.bits_f32(m << 16), dev.bits_f32(m & Uint32(0xFFFF0000))


# ------------------------------------------------------------------------------ e2m1 values


def _unit_scale(a: Float32) -> Float32:
    """p = 2^floor(log2(max(a, 1))) for 0 <= a <= 6: 1 below 2 (the e2m1 step there is 0.5),
    2 below 4 (step 1), 4 from 4 up (step 2); non-negative floats order like their bits."""
    return dev.bits_f32(dev.max_u32(dev.f32_bits(a), Uint32(0x3F800000)) & Uint32(0x7F800000))


def e2m1_rn_value(s: Float32) -> Float32:
    """The e2m1 value of ``s`` (already times enc) as fp32: ``e2m1_decode(e2m1_encode(s))``
    (RNE, ties to the even code, saturation at 6, NaN -> +6 when its sign bit is clear, -0 for
    negative values that round to 0). a = min(|s|, 6); with p from ``_unit_scale``, a + p 2^22
    rounded once (one fma) lands on the e2m1 step of a's binade, and subtracting p 2^22 is
    exact; fp32 ties to even are e2m1's (the step's multiples alternate parity like the codes).
    Six instructions (the sign included); the e2m1 code and its decode take about ten."""
    a = cute.arch.fmin(cute.math.absf(s), Float32(6.0))  # NaN -> 6, as the hardware cvt
    p = _unit_scale(a)
    t = dev.fma_rn(p, Float32(RHT_MAGIC), a)
    mag = dev.fma_rn(p, Float32(-RHT_MAGIC), t)
    return dev.bits_f32(dev.f32_bits(mag) | (dev.f32_bits(s) & Uint32(0x80000000)))


def e2m1_sr_value_rz(s: Float32, rb: Float32) -> Float32:
    """The stochastically rounded e2m1 value of ``s`` (``rb`` = the element's random byte /
    512), the sign of ``s`` kept. For t = fma(rb, p, a) (TE's one rounding) rz(p 2^22 + t) -
    p 2^22 is t floored to a multiple of p / 2, the e2m1 step of a's binade: p 2^22 + t stays in
    [p 2^22, p 2^23) (t < 2.5 p), whose ulp is p / 2. That floor is the grid floor of t even
    where t left a's binade (t < 2.5 below 2 -> 2, t < 5 below 4 -> 4, t < 8 from 4 on -> 4 or
    6, TE's clamp at 6). Three FMA-pipe ops instead of the rz product's FMUL.RZ + LOP3 + FMUL
    (``stochastic.e2m1_sr_code_bits``' floor kept in place; tests/test_e2m1_value.py checks
    the two floors equal)."""
    a = cute.arch.fmin(cute.math.absf(s), Float32(6.0))
    p = _unit_scale(a)
    t = dev.fma_rn(rb, p, a)
    floor = dev.fma_rz(p, Float32(RHT_MAGIC), t)
    mag = dev.fma_rn(p, Float32(-RHT_MAGIC), floor)  # exact
    return dev.bits_f32(dev.f32_bits(mag) | (dev.f32_bits(s) & Uint32(0x80000000)))


# ------------------------------------------------------------------------------ signs from x
# (the stochastic rowwise kernel, issue 20, branch fq6)
#
# The value path above ORs s's sign into every e2m1 magnitude (one LOP3 a value). The sign of
# the result f32(f32(+-q sf) S_dec) is x's own sign wherever it is not NaN: s = x enc has sign
# sgn(x) ^ sgn(enc), and sgn(enc) = sgn(sf) ^ sgn(S_dec) (enc = fmin(1 / (sf S_dec), FLT_MAX)),
# which the two multiplies take back out. So the kernels multiply the unsigned magnitude, pack
# two results into a 16-bit pair and take the pair's two sign bits from x's word in the same
# positions: one LOP3 (``sign_select``) a word, i.e. half an instruction a value instead of one.
# Exceptions: a NaN in the block makes sf NaN (e4m3 0x7F; its amax is NaN) and every result the
# canonical NaN, whose sign bit must stay clear: that block's mask is 0 (``sign_keep``). x = +0
# with enc = -inf (sf S_dec rounding to -0) would give s NaN -> +6; it needs an sf whose sign
# differs from S_dec's, which the e4m3 cvt of amax (>= +0) x S_enc / 6 cannot produce (S_enc / 6
# has S_dec's sign; the cvt keeps the sign, zeros included). tests/test_fake_quant_sign_words.py
# checks the rule against the per-value signs on a model of the fp32 path (every e4m3 scale,
# S_dec of both signs, specials, every random byte).
SIGN_BITS = 0x80008000  # the sign bits of a packed 16-bit pair


def e2m1_sr_mag_rz(s: Float32, rb: Float32) -> Float32:
    """``e2m1_sr_value_rz`` without the sign."""
    a = cute.arch.fmin(cute.math.absf(s), Float32(6.0))
    p = _unit_scale(a)
    t = dev.fma_rn(rb, p, a)
    floor = dev.fma_rz(p, Float32(RHT_MAGIC), t)
    return dev.fma_rn(p, Float32(-RHT_MAGIC), floor)


# ------------------------------------------------------------------------------ SR trim
# (``sr_trim`` of both fake-quant specs, issue 20, branch fq7; perf/NOTES.md, "Fake-quant SR
# trim"). The NVFP4 quantize's SR trim (kernels/nvfp4_sr.py) carried over to the value path:
# the random byte goes to bits 16-23 of a zero word (one PRMT: byte * 2^-133 as fp32, a
# subnormal that the FFMA multiplies exactly) and p' = p * 2^124 comes from |v|'s exponent bits
# (AND + one VIADDMNMX) without a clamp of |v| at 6; the floor's magic is p' * 2^-102 = p * 2^22
# (exact), and the clamp at 6 moves to the result (FMNMX: from |v| >= 6 on the floor is >= 6, or
# NaN / inf where p' wrapped or overflowed, and min.f32 turns NaN into 6). Against
# ``e2m1_sr_mag_rz`` + ``stochastic.random_bytes_f32_prmt``: the byte's FADD is gone (the FMNMX
# of the clamp moved, AND + VIADDMNMX replace VIMNMX + LOP3). tests/test_fake_quant_sr_trim.py
# emulates the sequence against the old one for every random byte.
SUB_MAGIC = 0x0C800000  # 2^-102: p' * 2^-102 = p * 2^22 (RHT_MAGIC times p)
E2M1_MAX_BITS = 0x40C00000  # 6.0


def _sr_sub_ptx(k: int, signed: bool) -> str:
    signed_out = "and.b32 x, x, 0x80000000;\n\tmov.b32 e, t;\n\tor.b32 $0, e, x;"
    sign = signed_out if signed else "mov.b32 $0, t;"
    return (
        "{\n\t.reg .b32 e, p, r, x;\n\t.reg .f32 a, t, f;\n\t"
        + srq.sr_sum_ptx(k)
        + f"fma.rz.f32 f, p, 0f{SUB_MAGIC:08X}, t;\n\t"  # t floored to a multiple of p / 2
        f"fma.rn.f32 t, p, 0f{SUB_MAGIC | 0x80000000:08X}, f;\n\t"  # exact
        f"min.f32 t, t, 0f{E2M1_MAX_BITS:08X};\n\t"  # |v| >= 6, NaN -> 6
        f"{sign}\n\t}}"
    )


@dsl_user_op
def e2m1_sr_sub(s: Float32, word: Uint32, k: int, signed: bool, *, loc=None, ip=None) -> Float32:
    """``e2m1_sr_value_rz(s, rb)`` (``signed``) or ``e2m1_sr_mag_rz(s, rb)`` with rb = byte k of
    ``word`` / 512: the same bits, the byte taken by one PRMT (the SR trim above)."""
    args = dev._ir((s, word), (Float32, Uint32), loc, ip)
    return Float32(dev._asm(T.f32(), _sr_sub_ptx(k, signed), "=f,f,r", args))


def sign_keep(sf_byte_is_nan):
    """The ``sign_select`` mask of a block: SIGN_BITS, or 0 where its scale is NaN."""
    return Uint32(cutlass.select_(sf_byte_is_nan, Uint32(0), Uint32(SIGN_BITS)))


@dsl_user_op
def sign_select(packed: Uint32, x_word: Uint32, keep: Uint32, *, loc=None, ip=None) -> Uint32:
    """(packed & ~keep) | (x_word & keep) in one LOP3: the packed magnitudes with x's signs."""
    return dev._u32_op3("lop3.b32 $0, $1, $2, $3, 0xD8;", packed, x_word, keep, loc, ip)


def rows_block_amax2(row0: list, row1: list) -> tuple:
    """Non-negative |max| (fp32, NaN kept) of two 16-value bf16 blocks given as 8 packed words
    each (the stochastic rowwise kernel): a bf16x2 |max| tree per row (7 each), the two rows'
    halves paired by PRMT into one more: 17 ALU ops for 32 values instead of 32 FMNMX. The
    max of bf16 values is the max of their exact fp32 widenings, so the amax is the FMNMX
    chain's. The |.| at the end folds into block_scales2's multiply."""
    tops = []
    for level in (list(row0), list(row1)):  # plain Python: unrolled at trace time
        while len(level) > 1:
            level = [
                dev.bf16x2_absmax(level[2 * j], level[2 * j + 1]) for j in range(len(level) // 2)
            ]
        tops.append(level[0])
    both = dev.bf16x2_absmax(dev.prmt(tops[0], tops[1], 0x5410), dev.prmt(tops[0], tops[1], 0x7632))
    return (
        cute.math.absf(dev.bits_f32(both << 16)),
        cute.math.absf(dev.bits_f32(both & Uint32(0xFFFF0000))),
    )


@dsl_user_op
def opaque_u32(addr: Int32, value: Uint32, *, loc=None, ip=None) -> Uint32:
    """``value`` stored to shared address ``addr`` and loaded back (volatile, so neither LLVM nor
    ptxas forwards it): a register whose constant ptxas cannot see (the PRMT random-byte magic of
    ``stochastic.random_bytes_f32_prmt`` in the stochastic rowwise kernel). Every thread may
    store the same value to the same address: a thread reads its own store or an equal one, no
    barrier."""
    dev.volatile_asm(
        None,
        "st.volatile.shared.u32 [$0], $1;",
        "r,r",
        [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
    )
    return Uint32(
        dev.volatile_asm(
            T.i32(),
            "ld.volatile.shared.u32 $0, [$1];",
            "=r,r",
            [Int32(addr).ir_value(loc=loc, ip=ip)],
        )
    )


def stage_random_words(buf: Int32, lane: Int32, block_ids: list, rng: tuple, pre=None):
    """Draw this lane's two Philox calls (``block_ids``: Int64 ids of block q of columns gq and
    gq + 8) and store each word e where lane (gq, e) reads it (``rand_write_offset``).
    ``pre``: ``nvfp4_sr.philox_prefix(1, rng)`` (sr_trim), the ids then Uint32 (< 2^32)."""
    if pre is None:
        words = [sr.block_random_words(i, 1, rng) for i in block_ids]
    else:
        words = [srq.block_random_words(i, pre, rng) for i in block_ids]
    base = buf + rand_write_offset(lane, 0)
    for e in range(4):
        dev.store_shared_v2(base + 8 * e, [words[0][e], words[1][e]])


@cute.jit
def copy_given_amax(amax: cute.Tensor, out: cute.Tensor, count: Int32, threads: cutlass.Constexpr):
    """By every thread, after the PDL wait: CTA 0 copies the ``count`` floats of a given amax
    into the op's amax output (0: the amax pass wrote it). The op returns a copy of a given
    amax; a torch clone cost a launch and an allocation of host time (~7 us a call)."""
    if cute.arch.block_idx()[0] == 0:
        for i in range(cute.arch.thread_idx()[0], count, threads):
            out[i] = amax[i]
