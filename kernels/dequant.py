"""Device helpers of the dequantize, 2D-quantize and fake-quant kernels (sm_90a).

Dequantization is exact arithmetic followed by one rounding, and the kernels must reproduce the
reference's rounding sequence bit for bit, so every fp32 operation here that could be fused or
reordered by LLVM (a multiply feeding an add would become an FMA) is an explicit ``.rn`` PTX
instruction. Order of operations (``cutequant.reference``):

* NVFP4: ``f32(f32(e2m1 * sf) * S_dec)``. ``e2m1 * sf`` is exact in fp16 (at most 6 significant
  bits, |value| <= 6 * 448 = 2688, smallest nonzero 0.5 * 2^-9 = 2^-10, a normal fp16), so it is
  one ``mul.rn.f16x2`` of the hardware e4m3 -> f16 conversions, widened exactly to fp32; the
  multiply by S_dec is the one fp32 rounding (IEEE, no flush of subnormals).
* FP8: ``f32(f32(fp8) * scale_inv)``.
* Inverse RHT (NVFP4 columnwise): per 16-token block, a fast Walsh-Hadamard transform in a fixed
  order (butterfly stages over index bits 0, 1, 2, 3, each ``a + b`` / ``a - b`` rounded to
  fp32), then each output times 0.25 (exact but for subnormal results) and the sign s_i. The
  16x16 RHT is ``R = diag(s) H16 / 4`` and orthogonal, so ``x_i = s_i / 4 * (H16 y)_i``.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import schedule as sched

# e2m1 magnitude code (0..7) -> the same value as an e4m3 byte: 0, 0.5, 1, 1.5 | 2, 3, 4, 6
E2M1_AS_E4M3_LO = 0x3C383000
E2M1_AS_E4M3_HI = 0x4C484440
# PRMT selectors of {word << 4, word}: byte k <- the byte holding code k's sign bit at bit 7
# (codes 0-3, codes 4-7; even codes from word << 4, odd ones from word)
E2M1_SIGN_SEL_LO = 0x5140
E2M1_SIGN_SEL_HI = 0x7362


def _ir(values, types, loc, ip):
    return [t(v).ir_value(loc=loc, ip=ip) for v, t in zip(values, types, strict=True)]


def _pure(res_type, ptx: str, constraints: str, args):
    return llvm.inline_asm(
        res_type, args, ptx, constraints, has_side_effects=False, is_align_stack=False
    )


def _f32_op(ptx: str, args, loc, ip) -> Float32:
    cons = "=f," + ",".join(["f"] * len(args))
    return Float32(_pure(T.f32(), ptx, cons, _ir(args, (Float32,) * len(args), loc, ip)))


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 a * b (RNE, subnormals kept); never contracted into an FMA."""
    return _f32_op("mul.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return _f32_op("add.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def sub_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return _f32_op("sub.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def prmt_r(a: Uint32, b: Uint32, sel: Uint32, *, loc=None, ip=None) -> Uint32:
    """Byte permute of {b, a} with a register selector (its low 16 bits)."""
    return Uint32(
        _pure(
            T.i32(),
            "prmt.b32 $0, $1, $2, $3;",
            "=r,r,r,r",
            _ir((a, b, sel), (Uint32, Uint32, Uint32), loc, ip),
        )
    )


@dsl_user_op
def f16x2_rn(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 -> packed f16x2 (RNE, overflow -> inf): ``lo`` in bits 0-15."""
    return Uint32(
        _pure(
            T.i32(),
            "cvt.rn.f16x2.f32 $0, $1, $2;",
            "=r,f,f",
            _ir((hi, lo), (Float32,) * 2, loc, ip),
        )
    )


@dsl_user_op
def fp8x4_scaled_to_f32(
    word: Uint32, sf_f16x2: Uint32, s: Float32, kind: str = "e4m3", *, loc=None, ip=None
):
    """Four fp8 bytes of ``word`` (element 0 in bits 0-7) -> four fp32 ``f32(f32(v * sf) * s)``:
    the fp8 -> f16 conversion and the f16x2 multiply by ``sf_f16x2`` are exact (the caller
    guarantees it: an e4m3 scale times an e2m1 value, or 1.0), the fp32 multiply by ``s`` is
    the one rounding."""
    ptx = (
        "{\n\t.reg .b16 lo, hi, a0, a1, a2, a3;\n\t.reg .b32 h0, h1;\n\t"
        "mov.b32 {lo, hi}, $4;\n\t"
        f"cvt.rn.f16x2.{kind}x2 h0, lo;\n\tcvt.rn.f16x2.{kind}x2 h1, hi;\n\t"
        "mul.rn.f16x2 h0, h0, $5;\n\tmul.rn.f16x2 h1, h1, $5;\n\t"
        "mov.b32 {a0, a1}, h0;\n\tmov.b32 {a2, a3}, h1;\n\t"
        "cvt.f32.f16 $0, a0;\n\tcvt.f32.f16 $1, a1;\n\t"
        "cvt.f32.f16 $2, a2;\n\tcvt.f32.f16 $3, a3;\n\t"
        "mul.rn.f32 $0, $0, $6;\n\tmul.rn.f32 $1, $1, $6;\n\t"
        "mul.rn.f32 $2, $2, $6;\n\tmul.rn.f32 $3, $3, $6;\n\t}"
    )
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4),
        _ir((word, sf_f16x2, s), (Uint32, Uint32, Float32), loc, ip),
        ptx,
        "=f,=f,=f,=f,r,r,f",
        has_side_effects=False,
        is_align_stack=False,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def e4m3_to_f16x2(byte: Uint32, *, loc=None, ip=None) -> Uint32:
    """The e4m3 scale byte (bits 0-7) as f16 in both halves (exact): the f16x2 multiplier of
    ``fp8x4_scaled_to_f32``."""
    return Uint32(
        _pure(
            T.i32(),
            "{\n\t.reg .b16 b, lo, hi;\n\t.reg .b32 h;\n\tcvt.u16.u32 b, $1;\n\t"
            "cvt.rn.f16x2.e4m3x2 h, b;\n\tmov.b32 {lo, hi}, h;\n\tmov.b32 $0, {lo, lo};\n\t}",
            "=r,r",
            _ir((byte & Uint32(0xFF),), (Uint32,), loc, ip),
        )
    )


def e2m1x8_to_e4m3(word: Uint32):
    """Eight e2m1 codes (element 0 in bits 0-3) -> their values as e4m3 bytes, codes 0-3 and
    codes 4-7 (element 0 in bits 0-7). 9 SASS instructions for the 8 values (the earlier form
    with one spread PRMT per 4 codes took 15): the magnitudes from a byte LUT (PRMT with the
    codes' low 3 bits as selector nibbles), the signs by one PRMT of ``word`` and ``word << 4``
    that puts sign bit 3 (even codes: ``word << 4``) or 7 (odd codes: ``word``) of code k's
    nibble at bit 7 of byte k, merged with one LOP3."""
    mag = word & Uint32(0x77777777)
    w4 = word << Uint32(4)
    lut_lo, lut_hi = Uint32(E2M1_AS_E4M3_LO), Uint32(E2M1_AS_E4M3_HI)
    lo = prmt_r(lut_lo, lut_hi, mag)  # the selector is the low 16 bits: codes 0-3
    hi = prmt_r(lut_lo, lut_hi, mag >> Uint32(16))
    sign = Uint32(0x80808080)
    lo = (dev.prmt(w4, word, E2M1_SIGN_SEL_LO) & sign) | lo
    hi = (dev.prmt(w4, word, E2M1_SIGN_SEL_HI) & sign) | hi
    return lo, hi


def nvfp4x8_to_f32(word: Uint32, sf_f16x2: Uint32, s_dec: Float32) -> list:
    """Eight e2m1 codes (element 0 in bits 0-3) of one block -> ``f32(f32(e2m1 * sf) * S_dec)``."""
    lo, hi = e2m1x8_to_e4m3(word)
    return fp8x4_scaled_to_f32(lo, sf_f16x2, s_dec) + fp8x4_scaled_to_f32(hi, sf_f16x2, s_dec)


@dsl_user_op
def fp8x4_to_f32(word: Uint32, scale_inv: Float32, kind: str, *, loc=None, ip=None) -> list:
    """Four fp8 bytes -> ``f32(f32(fp8) * scale_inv)`` (exact fp8 -> f16 -> f32, one fp32
    rounding). ``fp8x4_scaled_to_f32`` with a multiplier of 1.0 would cost one HMUL2 per two
    values that ptxas keeps (inline PTX)."""
    ptx = (
        "{\n\t.reg .b16 lo, hi, a0, a1, a2, a3;\n\t.reg .b32 h0, h1;\n\t"
        "mov.b32 {lo, hi}, $4;\n\t"
        f"cvt.rn.f16x2.{kind}x2 h0, lo;\n\tcvt.rn.f16x2.{kind}x2 h1, hi;\n\t"
        "mov.b32 {a0, a1}, h0;\n\tmov.b32 {a2, a3}, h1;\n\t"
        "cvt.f32.f16 $0, a0;\n\tcvt.f32.f16 $1, a1;\n\t"
        "cvt.f32.f16 $2, a2;\n\tcvt.f32.f16 $3, a3;\n\t"
        "mul.rn.f32 $0, $0, $5;\n\tmul.rn.f32 $1, $1, $5;\n\t"
        "mul.rn.f32 $2, $2, $5;\n\tmul.rn.f32 $3, $3, $5;\n\t}"
    )
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4),
        _ir((word, scale_inv), (Uint32, Float32), loc, ip),
        ptx,
        "=f,=f,=f,=f,r,f",
        has_side_effects=False,
        is_align_stack=False,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@cute.jit
def nvfp4_decode_scale(amax: Float32) -> Float32:
    """S_dec = f32(1 / S_enc(amax)) of a group (docs/numerics.md §1.1)."""
    return dev.rcp_rn(dev.global_encode_scale(amax))


def inverse_rht16_unsigned(v: list, quarter: bool = True) -> list:
    """(H16 v)_i * 0.25 for one 16-token block: butterflies over index bits 0..3 in order, each
    sum and difference rounded to fp32, then the multiply by 0.25
    (``recipe_reference.inverse_rht_exact``; ``quarter`` False: without it, the caller scaled
    v by 0.25 exactly). The sign s_i of x_i = s_i * 0.25 * (H16 v)_i is left to the caller:
    RN(y * -0.25) = -RN(y * 0.25) and RNE to bf16 / f16 is odd too, so one XOR of the output
    words (``rht_sign_words``) replaces 16 registers of +-0.25 multipliers."""
    v = list(v)
    for b in range(4):
        step = 1 << b
        for k in range(16):
            if k & step == 0:
                a, c = v[k], v[k + step]
                v[k] = add_rn(a, c)
                v[k + step] = sub_rn(a, c)
    if not quarter:
        return v
    return [mul_rn(x, Float32(0.25)) for x in v]


@cute.jit
def rht_fast_scales(gs: list) -> Int32:
    """1 when every S_dec of ``gs`` lies in [2^-90, 2^112] (NaN: no), where the inverse RHT may
    fold its final * 0.25 into S_dec (the columnwise dequantize template; perf/NOTES.md, issue
    20 #4), else 0."""
    fast = Int32(1)
    for b in cutlass.range_constexpr(len(gs)):
        inside = Int32(0)
        if gs[b] >= Float32(2.0**-90) and gs[b] <= Float32(2.0**112):
            inside = Int32(1)
        fast = fast & inside
    return fast


def rht_sign_words(sign_mask: Int32, out_dtype: str) -> list:
    """Per output word of a 16-token block (``pack_out`` order: tokens 2j, 2j + 1 in the 16-bit
    halves, or one fp32 word per token), the sign bits of the inverse RHT: bit i of
    ``sign_mask`` negates token i."""
    m = Uint32(sign_mask)
    if out_dtype == "f32":
        return [((m >> Uint32(i)) & Uint32(1)) << Uint32(31) for i in range(16)]
    return [
        (((m >> Uint32(2 * j)) & Uint32(1)) << Uint32(15))
        | (((m >> Uint32(2 * j + 1)) & Uint32(1)) << Uint32(31))
        for j in range(8)
    ]


def rows_of_columns(cols: list) -> list:
    """``cols[j][t]``, value t of column j of 8 adjacent columns -> ``rows[t]``, the 8 columns'
    value t in column order, which ``pack_out`` pairs into output words (column 2p in the low
    half): the columnwise tile transposed in registers (DequantizeSpec.col_regs) costs no
    instruction, only the choice of the fp32 registers each packing conversion reads."""
    return [[col[t] for col in cols] for t in range(len(cols[0]))]


def pack_out(vals: list, out_dtype: str) -> list:
    """fp32 values -> 32-bit words of ``out_dtype`` (RNE; element 0 lowest)."""
    if out_dtype == "f32":
        return [dev.f32_bits(x) for x in vals]
    cvt = dev.bf16x2_rn if out_dtype == "bf16" else f16x2_rn
    return [cvt(vals[2 * i + 1], vals[2 * i]) for i in range(len(vals) // 2)]


# quad_transpose_bytes: PRMT selectors of the two exchange rounds (own word bytes 0-3, the
# partner's 4-7), for lane bit 0 / bit 1 clear and set
QUAD_SEL1 = (0x6240, 0x3715)  # round 1 (partner lane ^ 1): bytes j with j % 2 != lane % 2
QUAD_SEL2 = (0x5410, 0x3276)  # round 2 (partner lane ^ 2): bytes j with j // 2 != lane bit 1


def quad_transpose_bytes(word: Uint32, q: Int32) -> Uint32:
    """4 x 4 byte transpose over each quad of lanes (q = lane % 4): byte j of lane b's ``word``
    becomes byte b of lane j's result. Two butterfly rounds (lane bits 0 and 1), each one SHFL
    and one PRMT whose selector depends on the lane bit. Warp-collective."""
    bit0 = Uint32(q & 1)
    bit1 = Uint32((q >> 1) & 1)
    sel1 = Uint32(QUAD_SEL1[0]) ^ (bit0 * Uint32(QUAD_SEL1[0] ^ QUAD_SEL1[1]))
    sel2 = Uint32(QUAD_SEL2[0]) ^ (bit1 * Uint32(QUAD_SEL2[0] ^ QUAD_SEL2[1]))
    x = prmt_r(word, Uint32(cute.arch.shuffle_sync_bfly(word, 1)), sel1)
    return prmt_r(x, Uint32(cute.arch.shuffle_sync_bfly(x, 2)), sel2)


@dsl_user_op
def stmatrix_x4_trans(addr: Int32, words, *, loc=None, ip=None):
    """``stmatrix.sync.aligned.m8n8.x4.trans.shared.b16``: the warp stores four 8x8 matrices of
    16-bit values, transposed. Register i of lane 4r + k holds elements (r, 2k) and (r, 2k + 1)
    of matrix i; lane 8i + j gives the shared address of row j of matrix i as stored, which
    is column j of the held matrix (16 bytes: its 8 elements). Warp-collective: every lane
    executes it, with its own address."""
    llvm.inline_asm(
        None,
        _ir((addr, *words), (Int32, Uint32, Uint32, Uint32, Uint32), loc, ip),
        "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r",
        has_side_effects=True,
        is_align_stack=False,
    )


# ------------------------------------------------------------------------------ global loads


@cute.jit
def load_global_b8(addr: Int64) -> Uint32:
    v = cute.make_tensor(
        cute.make_ptr(cutlass.Uint8, addr, cute.AddressSpace.gmem, assumed_align=1),
        cute.make_layout(1),
    ).load()
    return Uint32(v[0])


@cute.jit
def load_global_b32(addr: Int64) -> Uint32:
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=4), cute.make_layout(1)
    ).load()
    return v[0]


@cute.jit
def load_global_v2(addr: Int64) -> list:
    """Two 32-bit words from 8-byte-aligned global address ``addr`` (one LDG.64)."""
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=8), cute.make_layout(2)
    ).load()
    return [v[0], v[1]]


def store_words(addr: Int64, words: list, streaming: bool = False):
    """4 or 8 words to 16-byte-aligned global ``addr`` (one or two STG.128; ``streaming``:
    ``st.global.cs``, DequantizeSpec.cache_hints)."""
    store = dev.st_global_v4_cs if streaming else dev.st_global_v4
    for q in range(len(words) // 4):
        store(addr + 16 * q, *words[4 * q : 4 * q + 4])


# Loads with cache hints (DequantizeSpec.cache_hints "ld"): the read-only path without an L1
# line (every byte a dequantize loads is used by the instruction that loads it: L1 only holds
# sectors in flight) and 256-byte L2 fills (the neighbouring tiles, dispatched next to this one,
# read the rest of the 256 bytes: one DRAM request instead of two to four). The inputs are never
# written while a dequantize runs, as .nc requires. Volatile, so that LLVM keeps them after the
# PDL wait (an inline asm without side effects may be hoisted above it).
_LD_NC = "ld.global.nc.L1::no_allocate.L2::256B"


def _ld_nc(kind: str, addr: Int64, n: int, loc, ip) -> list:
    regs = "{" + ", ".join(f"${i}" for i in range(n)) + "}" if n > 1 else "$0"
    vec = f".v{n}" if n > 1 else ""
    res_type = llvm.StructType.get_literal([T.i32()] * n) if n > 1 else T.i32()
    res = llvm.inline_asm(
        res_type,
        _ir((addr,), (Int64,), loc, ip),
        f"{_LD_NC}{vec}.{kind} {regs}, [${n}];",
        ",".join(["=r"] * n) + ",l",
        has_side_effects=True,
        is_align_stack=False,
    )
    if n == 1:
        return [Uint32(res)]
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def ldg_nc_b8(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """``load_global_b8`` with the hints above (zero-extended into a 32-bit register)."""
    return _ld_nc("u8", addr, 1, loc, ip)[0]


@dsl_user_op
def ldg_nc_b32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return _ld_nc("u32", addr, 1, loc, ip)[0]


@dsl_user_op
def ldg_nc_v2(addr: Int64, *, loc=None, ip=None) -> list:
    """``load_global_v2`` with the hints above (8-byte aligned)."""
    return _ld_nc("u32", addr, 2, loc, ip)


@dsl_user_op
def ldg_nc_v4(addr: Int64, *, loc=None, ip=None) -> list:
    """``device.load_global_v4`` with the hints above (16-byte aligned)."""
    return _ld_nc("u32", addr, 4, loc, ip)


# ------------------------------------------------------------------------------ tile lookup


@cute.jit
def locate_tile(
    tables: cute.Tensor, num_groups: Int32, col_tiles: Int32, row_tiles: Int32, t: Int32
):
    """(1 if tile ``t`` exists else 0, its group, the group's first row, the group's rows, the
    row tile within the group, the column tile) of a one-CTA-per-tile kernel. Host splits
    (``row_tiles`` >= 0): one 16-byte load of the row tile's record, stored after the tables
    (``groups.host_tile_records``); device splits: a binary search over the groups. (The same
    lookup as the FP8 tile cast's.)"""
    live = Int32(0)
    g = Int32(0)
    row0 = Int32(0)
    group_rows = Int32(0)
    tile_local = Int32(0)
    col_tile = Int32(0)
    if t < sched.total_tiles(tables, num_groups, col_tiles, row_tiles):
        live = Int32(1)
        if row_tiles >= 0:
            row_tile = t // col_tiles
            col_tile = t - row_tile * col_tiles
            records = tables.iterator.toint() + Int64(16) * Int64(num_groups + 1)
            rec = dev.load_global_v4(records + Int64(16) * Int64(row_tile))
            g = Int32(rec[0])
            row0 = Int32(rec[1])
            group_rows = Int32(rec[2])
            tile_local = Int32(rec[3])
        else:
            g, col_tile, row_tile, _, _, _ = sched.first_tile(tables, num_groups, col_tiles, t, 1)
            row0 = tables[sched.ROW_START, g]
            group_rows = tables[sched.ROW_START, g + 1] - row0
            tile_local = row_tile - tables[sched.ROWTILE_START, g]
    return live, g, row0, group_rows, tile_local, col_tile


@cute.jit
def find_tile(
    tables: cute.Tensor,
    num_groups: Int32,
    row_tiles: Int32,
    row_tile: Int32,
    scale_row: cutlass.Constexpr,
):
    """``locate_tile`` of a global 64-row tile (the grid's y and z give it, x the column tile:
    no division) plus the group's first scale row (``scale_row`` = sched.ROWSCALE_START) or
    column (sched.COLSCALE_START): (live, group, first row, rows, row tile within the group,
    scale start), with one round trip to memory in both cases.

    Host splits: the row tile's 16-byte record and its 8-byte scale record (both stored after
    the tables, ``groups.host_tile_records`` / ``host_scale_records``), loaded together: the
    scale bytes no longer wait for a table load that waited for the record.
    Device splits: every warp searches the groups itself, 31 table entries per round with one
    load per lane and a ballot (one round up to 30 groups, two up to 960), and its last round
    also loads the row starts and scale starts beside the tile starts; lane shuffles hand the
    group's values out. The binary search of ``locate_tile`` is 1 + log2(G) dependent loads (9
    for 256 groups) before the row and scale starts. Every lane of a warp must call it."""
    live = Int32(0)
    g = Int32(0)
    row0 = Int32(0)
    group_rows = Int32(0)
    tile_local = Int32(0)
    scale_start = Int32(0)
    if row_tiles >= 0:
        if row_tile < row_tiles:
            live = Int32(1)
            records = tables.iterator.toint() + Int64(16) * Int64(num_groups + 1)
            rec = dev.load_global_v4(records + Int64(16) * Int64(row_tile))
            srec = load_global_v2(
                records + Int64(16) * Int64(row_tiles) + Int64(8) * Int64(row_tile)
            )
            g = Int32(rec[0])
            row0 = Int32(rec[1])
            group_rows = Int32(rec[2])
            tile_local = Int32(rec[3])
            scale_start = Int32(srec[0 if scale_row == sched.ROWSCALE_START else 1])
    else:
        lane = cute.arch.lane_idx()
        # the answer: the last index of ROWTILE_START[0 .. G] at or below row_tile (G: no tile)
        lo = Int32(0)
        span = num_groups + 1
        while span > 31:
            stride = (span + 30) // 31
            hit = False
            if lane < 31 and lane * stride < span:
                hit = tables[sched.ROWTILE_START, lo + lane * stride] <= row_tile
            # lane 0 always hits on valid tables; the max keeps bad ones' reads in [0, G]
            skip = cutlass.max(cute.arch.popc(cute.arch.vote_ballot_sync(hit)) - 1, 0)
            lo = lo + skip * stride
            span = cutlass.min(stride, span - skip * stride)
        idx = cutlass.min(lo + lane, num_groups)
        # bad device splits leave only the tile total set (to 0) and the rest unordered: the
        # total, not the search, decides whether the tile exists (then nothing is written)
        total = tables[sched.ROWTILE_START, num_groups]
        first_tile = tables[sched.ROWTILE_START, idx]
        first_row = tables[sched.ROW_START, idx]
        first_scale = tables[scale_row, idx]
        k = cute.arch.popc(cute.arch.vote_ballot_sync(lane < span and first_tile <= row_tile))
        k = cutlass.max(k - 1, 0)
        g = lo + k
        row0 = cute.arch.shuffle_sync(first_row, k)
        # lane k + 1 <= 31 holds ROW_START[g + 1] whenever g < G (then lo + k + 1 <= G)
        group_rows = cute.arch.shuffle_sync(first_row, k + 1) - row0
        tile_local = row_tile - cute.arch.shuffle_sync(first_tile, k)
        scale_start = cute.arch.shuffle_sync(first_scale, k)
        if row_tile < total:
            live = Int32(1)
    return live, g, row0, group_rows, tile_local, scale_start


@cute.jit
def find_tiles(
    tables: cute.Tensor,
    num_groups: Int32,
    row_tiles: Int32,
    first: Int32,
    scale_row: cutlass.Constexpr,
    count: cutlass.Constexpr,
    limit=None,
):
    """``find_tile`` of the ``count`` consecutive 64-row tiles ``first`` .. ``first + count -
    1`` (one CTA of a columnwise dequantize with longer tiles), flat: 6 values per tile. A tile
    whose predecessor does not end its group is the next tile of that group (no memory access:
    the common case); only a tile after a group's last one is looked up again (it may start a
    later group, or lie past the end). Tiles past the end keep the previous group with
    ``tile_local`` past its rows: rows left <= 0, so they load and store nothing, and their
    group (whose scale the caller reuses) stays valid. The condition is the same in every
    thread (device splits: ``find_tile`` is warp-collective).

    ``limit`` (an Int32, the same in every thread; DequantizeSpec.col_tail): only tiles ``j <
    limit`` are the CTA's; the others are given as past their group's end in the same way
    (``tile_local`` = rows / 64 + 1), without a lookup."""
    out = find_tile(tables, num_groups, row_tiles, first, scale_row)
    prev = out
    for j in cutlass.range_constexpr(1, count):
        live, g, row0, rows, tl, ss = prev
        nxt = (live, g, row0, rows, tl + 1, ss)
        if cutlass.const_expr(limit is None):
            if live != 0 and rows - tl * sched.TILE_ROWS <= sched.TILE_ROWS:
                found = find_tile(tables, num_groups, row_tiles, first + j, scale_row)
                if found[0] != 0:
                    nxt = found
        else:
            if j >= limit:
                nxt = (live, g, row0, rows, (rows >> 6) + 1, ss)
            elif live != 0 and rows - tl * sched.TILE_ROWS <= sched.TILE_ROWS:
                found = find_tile(tables, num_groups, row_tiles, first + j, scale_row)
                if found[0] != 0:
                    nxt = found
        out = out + nxt
        prev = nxt
    return out


@dsl_user_op
def st_global_b8(addr: Int64, a: Uint32, *, loc=None, ip=None):
    """The low byte of ``a`` (one STG.U8)."""
    llvm.inline_asm(
        None,
        _ir((addr, a), (Int64, Uint32), loc, ip),
        "{\n\t.reg .b16 h;\n\tcvt.u16.u32 h, $1;\n\tst.global.b8 [$0], h;\n\t}",
        "l,r",
        has_side_effects=True,
        is_align_stack=False,
    )


@cute.jit
def load_global_b64(addr: Int64) -> Int64:
    v = cute.make_tensor(
        cute.make_ptr(Int64, addr, cute.AddressSpace.gmem, assumed_align=8), cute.make_layout(1)
    ).load()
    return v[0]
