"""Shared device helpers for every cutequant kernel (sm_90a first).

Small, pure ``@cute.jit`` / ``@dsl_user_op`` building blocks: bit casts, NaN-propagating abs-max,
warp reductions, atomic amax flushes, bf16 rounding, the NVFP4 scale math and the software
e2m1 encoder that sm_90a needs (it has no ``cvt.*.e2m1x2``). Numerics follow TE exactly; the
formulas are spelled out in ``cutequant.reference`` (the oracle of every GPU test).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
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


def _ir(values, types, loc, ip):
    return [t(v).ir_value(loc=loc, ip=ip) for v, t in zip(values, types, strict=True)]


def _u32_op(ptx: str, a, b, loc, ip) -> Uint32:
    """u32 <- op(u32, u32): packed 16-bit arithmetic, byte permutes."""
    return Uint32(_asm(T.i32(), ptx, "=r,r,r", _ir((a, b), (Uint32, Uint32), loc, ip)))


def _u32_op3(ptx: str, a, b, c, loc, ip) -> Uint32:
    """u32 <- op(u32, u32, u32): LOP3, integer multiply-add."""
    return Uint32(_asm(T.i32(), ptx, "=r,r,r,r", _ir((a, b, c), (Uint32, Uint32, Uint32), loc, ip)))


def _f32x2_to_u32(ptx: str, hi, lo, loc, ip) -> Uint32:
    """u32 <- cvt of two fp32 (``hi`` is the PTX cvt's first operand, landing in the upper half)."""
    return Uint32(_asm(T.i32(), ptx, "=r,f,f", _ir((hi, lo), (Float32, Float32), loc, ip)))


def _u32_to_f32x2(ptx: str, word, loc, ip):
    """(fp32, fp32) <- one u32 (``$0`` gets the low half, ``$1`` the high half)."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32(), T.f32()]),
        _ir((word,), (Uint32,), loc, ip),
        ptx,
        "=f,=f,r",
        has_side_effects=False,
        is_align_stack=False,
    )
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(2))


def _f32_op(ptx: str, args, loc, ip) -> Float32:
    """fp32 <- op(fp32, ...) with an explicit rounding mode."""
    cons = "=f," + ",".join(["f"] * len(args))
    return Float32(_asm(T.f32(), ptx, cons, _ir(args, (Float32,) * len(args), loc, ip)))


def volatile_asm(res_type, ptx: str, constraints: str, args):
    """Inline PTX with side effects (atomics, fences, ordered loads and stores): LLVM neither
    removes nor reorders it. ``args`` are IR values."""
    return llvm.inline_asm(
        res_type, args, ptx, constraints, has_side_effects=True, is_align_stack=False
    )


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None):
    """``fence.acq_rel.gpu``: this thread's earlier memory operations are ordered before its
    later ones for every thread of the GPU (MEMBAR.GPU)."""
    volatile_asm(None, "fence.acq_rel.gpu;", "", [])


def _side_effect(ptx: str, addr_type, addr, words, loc, ip):
    """A store (or other volatile op) of ``words`` (u32) at ``addr``."""
    cons = ("l" if addr_type is Int64 else "r") + "".join(",r" for _ in words)
    llvm.inline_asm(
        None,
        _ir((addr, *words), (addr_type,) + (Uint32,) * len(words), loc, ip),
        ptx,
        cons,
        has_side_effects=True,
        is_align_stack=False,
    )


# ------------------------------------------------------------------------------- bit casts


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(_asm(T.i32(), "mov.b32 $0, $1;", "=r,f", _ir((x,), (Float32,), loc, ip)))


@dsl_user_op
def bits_f32(x: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), "mov.b32 $0, $1;", "=f,r", _ir((x,), (Uint32,), loc, ip)))


# ------------------------------------------------------------------------- shared memory


@cute.jit
def load_shared_v4(addr: Int32) -> list:
    """Four 32-bit words from 16-byte-aligned shared address ``addr`` (one LDS.128)."""
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=16), cute.make_layout(4)
    ).load()
    return [v[0], v[1], v[2], v[3]]


@cute.jit
def load_shared_b32(addr: Int32) -> Uint32:
    """One 32-bit word from 4-byte-aligned shared address ``addr`` (one LDS.32)."""
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=4), cute.make_layout(1)
    ).load()
    return v[0]


@cute.jit
def store_shared_b32(addr: Int32, word: Uint32):
    """One 32-bit word to 4-byte-aligned shared address ``addr`` (one STS.32)."""
    cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=4), cute.make_layout(1)
    )[0] = word


@cute.jit
def store_shared_b8(addr: Int32, byte: Uint32):
    """The low byte of ``byte`` to shared address ``addr`` (one STS.U8)."""
    cute.make_tensor(
        cute.make_ptr(cutlass.Uint8, addr, cute.AddressSpace.smem, assumed_align=1),
        cute.make_layout(1),
    )[0] = cutlass.Uint8(byte & Uint32(0xFF))


@cute.jit
def load_global_v4(addr: Int64) -> list:
    """Four 32-bit words from 16-byte-aligned global address ``addr`` (one LDG.128)."""
    v = cute.make_tensor(
        cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=16), cute.make_layout(4)
    ).load()
    return [v[0], v[1], v[2], v[3]]


@dsl_user_op
def load_shared_u16x2(
    lo_addr: Int32, lo_off: int, hi_addr: Int32, hi_off: int, *, loc=None, ip=None
) -> Uint32:
    """Two 16-bit shared words, ``[lo_addr + lo_off]`` into bits 0-15 and ``[hi_addr + hi_off]``
    into bits 16-31 (the offsets are compile-time immediates of the LDS). Volatile: the loads
    must stay before the stage release that follows them."""
    return Uint32(
        llvm.inline_asm(
            T.i32(),
            _ir((lo_addr, hi_addr), (Int32, Int32), loc, ip),
            "{\n\t.reg .b16 lo, hi;\n\t"
            f"ld.shared.b16 lo, [$1+{int(lo_off)}];\n\tld.shared.b16 hi, [$2+{int(hi_off)}];\n\t"
            "mov.b32 $0, {lo, hi};\n\t}",
            "=r,r,r",
            has_side_effects=True,
            is_align_stack=False,
        )
    )


@dsl_user_op
def store_shared_v2(addr: Int32, words, *, loc=None, ip=None):
    """Two 32-bit words to 8-byte-aligned shared address ``addr`` (one STS.64)."""
    _side_effect("st.shared.v2.b32 [$0], {$1, $2};", Int32, addr, words, loc, ip)


@dsl_user_op
def store_shared_v4(addr: Int32, words, *, loc=None, ip=None):
    """Four 32-bit words to 16-byte-aligned shared address ``addr`` (one STS.128)."""
    _side_effect("st.shared.v4.b32 [$0], {$1, $2, $3, $4};", Int32, addr, words, loc, ip)


@dsl_user_op
def stmatrix_x4(addr: Int32, words, *, loc=None, ip=None):
    """``stmatrix.sync.aligned.m8n8.x4.shared.b16`` (one STSM.x4): the warp stores four 8x8
    matrices of 16-bit values. Register i of lane 4r + k holds elements (r, 2k) and (r, 2k + 1)
    of matrix i (the mma accumulator layout); lane 8i + j gives the 16-byte-aligned shared
    address of row j of matrix i (its 16 bytes). Warp-collective: every lane executes it."""
    _side_effect(
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};", Int32, addr, words,
        loc, ip,
    )  # fmt: skip


def release_after_loads(pipe, state):
    """Release a TMA pipeline stage that this thread read with ordinary shared loads.

    The loads are generic-proxy accesses and the producer's next TMA write into the stage is an
    async-proxy access: without a proxy fence between them the release can overtake the loads
    and the TMA write races with them (seen as a few wrong bytes per run before this fence).
    """
    cute.arch.fence_proxy("async.shared", space="cta")
    pipe.consumer_release(state)


# ------------------------------------------------------------------- packed 16-bit helpers


@dsl_user_op
def bf16x2_rn(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 -> packed bf16x2 (RNE): ``lo`` in bits 0-15."""
    return _f32x2_to_u32("cvt.rn.bf16x2.f32 $0, $1, $2;", hi, lo, loc, ip)


@dsl_user_op
def bf16x2_absmax(acc: Uint32, word: Uint32, *, loc=None, ip=None) -> Uint32:
    """Per-half |max| of two packed bf16 pairs, NaN-propagating (sign bits are garbage)."""
    return _u32_op("max.NaN.xorsign.abs.bf16x2 $0, $1, $2;", acc, word, loc, ip)


@dsl_user_op
def f16x2_absmax(acc: Uint32, word: Uint32, *, loc=None, ip=None) -> Uint32:
    """Per-half |max| of two packed f16 pairs, NaN-propagating (sign bits are garbage)."""
    return _u32_op("max.NaN.xorsign.abs.f16x2 $0, $1, $2;", acc, word, loc, ip)


@dsl_user_op
def prmt(a: Uint32, b: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """Byte permute of {b, a} (bytes 0-3 from a, 4-7 from b); selector nibble bit 3 replicates
    the sign of the chosen byte. Pure, unlike cute.arch.prmt."""
    return _u32_op(f"prmt.b32 $0, $1, $2, {selector:#x};", a, b, loc, ip)


@dsl_user_op
def max_u32(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    return _u32_op("max.u32 $0, $1, $2;", a, b, loc, ip)


@dsl_user_op
def and_or(a: Uint32, mask: Uint32, bits: Uint32, *, loc=None, ip=None) -> Uint32:
    """(a & mask) | bits in one LOP3 (left to itself, ptxas splits it when both are constants)."""
    return _u32_op3("lop3.b32 $0, $1, $2, $3, 0xEA;", a, mask, bits, loc, ip)


@dsl_user_op
def mul_hi_u32(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    """High 32 bits of the 64-bit product (the low half is plain ``a * b``)."""
    return _u32_op("mul.hi.u32 $0, $1, $2;", a, b, loc, ip)


@dsl_user_op
def f16x2_to_f32x2(word: Uint32, *, loc=None, ip=None):
    """Exact f16 -> fp32 of both halves of ``word`` (low half first)."""
    return _u32_to_f32x2(
        "{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $2;\n\t"
        "cvt.f32.f16 $0, lo;\n\tcvt.f32.f16 $1, hi;\n\t}",
        word,
        loc,
        ip,
    )


@cute.jit
def absmax(acc: Float32, x: Float32) -> Float32:
    """max(|acc|, |x|) with NaN propagation; the sign of the result is garbage (xorsign)."""
    return cute.arch.fmax(acc, x, abs=True, nan=True)


@cute.jit
def bf16x2_pair_absmax(word: Uint32) -> Float32:
    """max(|lo|, |hi|) of the two bf16 halves of ``word`` as a non-negative fp32 (exact)."""
    lo = bits_f32(word << 16)
    hi = bits_f32(word & Uint32(0xFFFF0000))
    return cute.math.absf(absmax(lo, hi))


@cute.jit
def f16x2_pair_absmax(word: Uint32) -> Float32:
    """max(|lo|, |hi|) of the two f16 halves of ``word`` as a non-negative fp32 (exact)."""
    lo, hi = f16x2_to_f32x2(word)
    return cute.math.absf(absmax(lo, hi))


@cute.jit
def rht_entry(sign_mask: Int32, i: Int32, j: Int32) -> Float32:
    """Entry (i, j) of TE's RHT matrix R = diag(s) H16 / 4 (docs/numerics.md §3.1): +-0.25,
    negative iff popc(i & j) (Sylvester Hadamard sign) + bit i of ``sign_mask`` is odd."""
    parity = cute.arch.popc(Uint32(i & j)) + ((sign_mask >> i) & 1)
    r = Float32(0.25)
    if (parity & 1) == 1:
        r = Float32(-0.25)
    return r


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


# ----------------------------------------------------------------------------------- NVFP4 math
# TE checklist (docs/numerics.md §9), per 16-element block with per-group S_enc / S_dec:
#   sf  = e4m3_rne_satfinite(fmin(block_amax * (S_enc * f32(1/6)), FLT_MAX))
#   enc = fmin(f32(1 / f32(f32(sf) * S_dec)), FLT_MAX)     (fast math: rcp.approx.ftz, no fmin)
#   q   = e2m1_rne_satfinite(f32(x * enc))


def _cvt_fp8x2(kind: str) -> str:
    """PTX: RNE satfinite fp32 pair -> fp8x2 (``kind`` e4m3 / e5m2), zero-extended to 32 bits."""
    return (
        "{\n\t.reg .b16 h;\n\tcvt.rn.satfinite." + kind + "x2.f32 h, $1, $2;\n\t"
        "cvt.u32.u16 $0, h;\n\t}"
    )


@dsl_user_op
def e4m3x2(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """RNE satfinite fp32 -> e4m3 of two values: ``lo`` in bits 0-7, ``hi`` in bits 8-15."""
    return _f32x2_to_u32(_cvt_fp8x2("e4m3"), hi, lo, loc, ip)


@dsl_user_op
def e5m2x2(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """RNE satfinite fp32 -> e5m2 of two values: ``lo`` in bits 0-7, ``hi`` in bits 8-15."""
    return _f32x2_to_u32(_cvt_fp8x2("e5m2"), hi, lo, loc, ip)


def half_to_f32(words, i: int, in_dtype: str) -> Float32:
    """Element ``i`` of packed 16-bit values (``in_dtype`` "bf16" / "f16"; element 0 in the low
    half of word 0) widened to fp32, exactly."""
    if in_dtype == "f16":
        return f16x2_to_f32x2(words[i // 2])[i % 2]
    w = words[i // 2]
    return bits_f32(w << 16) if i % 2 == 0 else bits_f32(w & Uint32(0xFFFF0000))


def fp8x4(vals, s: Float32, fp8_dtype: str) -> Uint32:
    """Four values times the scale -> four fp8 bytes (``fp8_dtype`` "e4m3" / "e5m2"; element 0
    in bits 0-7): RNE satfinite hardware conversions, NaN stays NaN."""
    cvt = e4m3x2 if fp8_dtype == "e4m3" else e5m2x2
    lo = cvt(vals[1] * s, vals[0] * s)
    hi = cvt(vals[3] * s, vals[2] * s)
    return lo | (hi << 16)


@cute.jit
def fp8_scale_from_amax(amax: Float32, epsilon: Float32, pow2: Int32, fp8_max: float) -> Float32:
    """TE's compute_scale_from_amax (docs/numerics.md §6): amax < epsilon -> epsilon;
    fp8_max / amax (RN), inf -> FLT_MAX; amax inf / 0 / NaN -> 1; ``pow2`` != 0: the power of 2
    at or below."""
    a = amax
    if a < epsilon:
        a = epsilon
    s = div_rn(Float32(fp8_max), a)
    if s == Float32(float("inf")):
        s = Float32(FLT_MAX)
    if a == Float32(float("inf")) or a == Float32(0.0) or a != a:
        s = Float32(1.0)
    if pow2 != 0:
        s = bits_f32(f32_bits(s) & Uint32(0xFF800000))
    return s


@dsl_user_op
def e4m3x2_to_f32x2(pair: Uint32, *, loc=None, ip=None):
    """Exact e4m3 -> fp32 of bytes 0 and 1 of ``pair`` (via f16, which holds every e4m3)."""
    return _u32_to_f32x2(
        "{\n\t.reg .b16 b, lo, hi;\n\t.reg .b32 h2;\n\tcvt.u16.u32 b, $2;\n\t"
        "cvt.rn.f16x2.e4m3x2 h2, b;\n\tmov.b32 {lo, hi}, h2;\n\t"
        "cvt.f32.f16 $0, lo;\n\tcvt.f32.f16 $1, hi;\n\t}",
        pair,
        loc,
        ip,
    )


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 division, round to nearest even."""
    return _f32_op("div.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def rcp_rn(a: Float32, *, loc=None, ip=None) -> Float32:
    """Correctly rounded 1/a (identical to TE's ``1.0 / a``; 1/0 = inf)."""
    return _f32_op("rcp.rn.f32 $0, $1;", (a,), loc, ip)


@dsl_user_op
def rcp_approx_ftz(a: Float32, *, loc=None, ip=None) -> Float32:
    """``rcp.approx.ftz.f32``: TE's fast-math reciprocal (cutlass::reciprocal_approximate_ftz)."""
    return _f32_op("rcp.approx.ftz.f32 $0, $1;", (a,), loc, ip)


@dsl_user_op
def fma_rn(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """Fused a*b+c, one RNE rounding (the e2m1 magic-number rounding relies on it)."""
    return _f32_op("fma.rn.f32 $0, $1, $2, $3;", (a, b, c), loc, ip)


@dsl_user_op
def mul_rz(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """a * b rounded toward zero, subnormal results kept (no .ftz): the SR grid floor."""
    return _f32_op("mul.rz.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def fma_rz(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """Fused a*b+c rounded once toward zero, subnormals kept (the SR floor of the fake-quant)."""
    return _f32_op("fma.rz.f32 $0, $1, $2, $3;", (a, b, c), loc, ip)


@cute.jit
def global_encode_scale(amax: Float32) -> Float32:
    """S_enc = fmin(f32(2688 / amax), FLT_MAX); 1 when amax == 0 or the result is 0 (amax inf)."""
    s = cute.arch.fmin(div_rn(Float32(2688.0), amax), Float32(FLT_MAX))
    if amax == Float32(0.0) or s == Float32(0.0):
        s = Float32(1.0)
    return s


def encode_multiplier(sf: Float32, s_dec: Float32, fast_math: bool) -> Float32:
    """enc = fmin(1 / f32(sf * S_dec), FLT_MAX) for the decoded scale ``sf``;
    fast math: rcp.approx.ftz, no clamp (TE's RHT cast-fusion kernels)."""
    denom = sf * s_dec
    if fast_math:
        return rcp_approx_ftz(denom)
    return cute.arch.fmin(rcp_rn(denom), Float32(FLT_MAX))


def enc_table_entry(code: Int32, s_dec: Float32, fast_math: bool) -> Float32:
    """Entry ``code`` (an e4m3 byte, 0..127) of a group's enc lookup table: each block then
    needs one shared load instead of a cvt, a multiply and a correctly rounded reciprocal."""
    sf = e4m3x2_to_f32x2(Uint32(code))[0]
    return encode_multiplier(sf, s_dec, fast_math)


def block_scales2(amax0: Float32, amax1: Float32, s_enc_div6: Float32):
    """sf bytes of two blocks in one cvt: block 0 in bits 0-7, block 1 in bits 8-15.
    ``s_enc_div6`` = f32(S_enc * f32(1/6)), per group (TE's amax * (S_enc * inv6) order)."""
    big = Float32(FLT_MAX)
    return e4m3x2(cute.arch.fmin(amax1 * s_enc_div6, big), cute.arch.fmin(amax0 * s_enc_div6, big))


# e2m1 RNE without a cvt (sm_90a has none). For a = min(|v|, 6) the code (0..7) is
#   min(RNE(2a), RNE(a) + 2, RNE(a / 2) + 4)
# (the first term is right below 2, the second in [2, 4), the third from 4 on, and each is
# the smallest where it is right). Each RNE is one fma against 2^23 (a single rounding, so ties
# go to even exactly like cvt.rn.satfinite.e2m1x2.f32) and leaves the code in mantissa bits 0-2.
# Cost: 1 FMNMX (abs + clamp) + 3 FFMA + 2 FMNMX per value.


def e2m1_code_bits(v: Float32) -> Uint32:
    """Bit pattern whose bits 0-2 hold the e2m1 magnitude code of ``v`` (bits 3+ garbage)."""
    a = cute.arch.fmin(cute.math.absf(v), Float32(6.0))  # NaN -> 6 (code 7), as the hw cvt
    t1 = fma_rn(a, Float32(2.0), Float32(MAGIC))
    t2 = fma_rn(a, Float32(1.0), Float32(MAGIC + 2.0))
    t3 = fma_rn(a, Float32(0.5), Float32(MAGIC + 4.0))
    return f32_bits(cute.arch.fmin(cute.arch.fmin(t1, t2), t3))


def e2m1x8_fp32(v) -> Uint32:
    """Eight fp32 values (already times enc) -> eight e2m1 nibbles (RNE), element 0 in bits
    0-3, one value per fp32 instruction: the reference of the packed ``e2m1x8`` in
    tests/test_gpu_e2m1_exhaustive.py. NaN gives code 7 (+6) like the hardware cvt: fmin(NaN,
    6) = 6, and NVIDIA arithmetic returns the canonical NaN 0x7FFFFFFF (sign clear) for any NaN
    operand of v = x * enc."""
    return pack_e2m1x8(v, [e2m1_code_bits(x) for x in v])


def pack_e2m1x8(v, code_bits) -> Uint32:
    """Eight magnitude codes and the signs of ``v`` -> one word of nibbles, element 0 in bits
    0-3. Each ``code_bits`` word is a 2^23-magic float: code in bits 0-2, bits 3-22 zero (only
    exponent bits above), so shifted adds (one LEA each) merge codes without masking: bits 0-15
    of (c0 + c1 << 4) + (c2 + c3 << 4) << 8 are the four nibbles, the carries and the exponent
    garbage stay above bit 22 (7 instructions for 8 codes; masking each pair took 15).
    Signs: PRMT sign-replicate of each value's top byte, masked into bits 3 / 7 of each byte."""
    pairs = [code_bits[2 * j] + (code_bits[2 * j + 1] << 4) for j in range(4)]
    codes = prmt(pairs[0] + (pairs[1] << 8), pairs[2] + (pairs[3] << 8), 0x5410)
    even, odd = sign_bytes([f32_bits(v[i]) for i in range(8)])
    return codes | (even & Uint32(0x08080808)) | (odd & Uint32(0x80808080))


def sign_bytes(bits) -> tuple:
    """Eight fp32 bit patterns -> (even, odd): byte i of ``even`` is 0xFF where value 2 i is
    negative (bit 31), else 0x00; ``odd`` likewise for value 2 i + 1 (sign-replicating PRMTs,
    six for eight values)."""
    even = prmt(prmt(bits[0], bits[2], 0x00FB), prmt(bits[4], bits[6], 0x00FB), 0x5410)
    odd = prmt(prmt(bits[1], bits[3], 0x00FB), prmt(bits[5], bits[7], 0x00FB), 0x5410)
    return even, odd


# Packed e2m1 RNE: two values per bf16x2 instruction (perf/NOTES.md, "Issue 17").
# 1. Round the fp32 value to odd at bf16 precision: its upper 16 bits, lsb set when any of the
#    lower 16 is (sticky). Rounding to odd first and then to nearest is exact when the first
#    format has >= 2 more significand bits than the second (bf16 has 8, e2m1 at most 2 in
#    every binade), so the e2m1 code of the bf16 value is the code of the fp32 value, ties and
#    saturation included. Round to odd never rounds up: finite stays finite, NaN stays NaN.
#    Per pair: two PRMTs split the two fp32 words into their upper and lower halves, one
#    VIMNMX.U16x2 min(lower, 1) makes both sticky bits, one LOP3 ORs them in and clears the
#    signs: 2 instructions per value (2.5 with an add-carry sticky per value, 3.5 with |.|).
# 2. The magic-number rule of ``e2m1_code_bits`` on bf16x2 with 128 (2^7) for 2^23: a =
#    min(|h|, 6); min(RNE(2a), RNE(a) + 2, RNE(a / 2) + 4) + 128 from three HFMA2.BF16 (one
#    rounding each) and two HMNMX2 (ptxas fuses them into one 3-input VHMNMX); each half ends as
#    0x4300 + code (code in bits 0-2, bits 3-7 zero). NaN: min(NaN, 6) = 6 (code 7), as the
#    hardware cvt.
# 3. Values j and j + 4 of eight share a pair, so two PRMTs gather the even and odd elements'
#    codes as clean bytes, two PRMTs (sign-replicating) their signs from the upper halves, and
#    one LEA merges the nibbles: 7 instructions per 8 values. Total 43 per 8 (5.4 / value)
#    against 8-9 for the fp32 form, which spent one FMA-pipe instruction per value per step.

_E2M1_BF16X2_CODES = (
    "{\n\t.reg .b32 s, a, k1, k2, k3, m1, m2, m3;\n\t"
    "mov.b32 s, 0x00010001;\n\t"
    "min.u16x2 s, $2, s;\n\t"  # sticky: 1 in each half whose dropped 16 bits are not all 0
    "lop3.b32 a, $1, s, 0x7FFF7FFF, 0xA8;\n\t"  # (upper | sticky) & ~sign: |round to odd|
    "mov.b32 s, 0x40C040C0;\n\t"  # 6.0
    "min.bf16x2 a, a, s;\n\t"
    "mov.b32 k1, 0x40004000;\n\t"  # 2.0
    "mov.b32 k2, 0x3F803F80;\n\t"  # 1.0
    "mov.b32 k3, 0x3F003F00;\n\t"  # 0.5
    "mov.b32 m1, 0x43004300;\n\t"  # 128
    "mov.b32 m2, 0x43024302;\n\t"  # 130
    "mov.b32 m3, 0x43044304;\n\t"  # 132
    "fma.rn.bf16x2 k1, a, k1, m1;\n\t"
    "fma.rn.bf16x2 k2, a, k2, m2;\n\t"
    "fma.rn.bf16x2 k3, a, k3, m3;\n\t"
    "min.bf16x2 k1, k1, k2;\n\t"
    "min.bf16x2 $0, k1, k3;\n\t}"
)


@dsl_user_op
def e2m1_bf16x2_codes(upper: Uint32, lower: Uint32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 values split into their ``upper`` and ``lower`` 16-bit halves (value 0 in bits
    0-15 of each) -> the e2m1 magnitude code of each as 0x4300 + code (RNE, satfinite at 6,
    NaN -> 7)."""
    return _u32_op(_E2M1_BF16X2_CODES, upper, lower, loc, ip)


def e2m1x8(v) -> Uint32:
    """Eight fp32 values (already times enc) -> eight e2m1 nibbles (RNE, satfinite), element 0
    in bits 0-3, bit for bit ``e2m1x8_fp32`` (tests/test_e2m1_packed.py emulates this sequence,
    tests/test_gpu_e2m1_exhaustive.py checks all 2^32 inputs). Sign: bit 31 of the value."""
    bits = [f32_bits(x) for x in v]
    # pair j: value j in the low half, value j + 4 in the high half
    upper = [prmt(bits[j], bits[j + 4], 0x7632) for j in range(4)]
    lower = [prmt(bits[j], bits[j + 4], 0x5410) for j in range(4)]
    codes = [e2m1_bf16x2_codes(upper[j], lower[j]) for j in range(4)]
    even = prmt(codes[0], codes[2], 0x6240)  # codes of values 0, 2, 4, 6 as bytes
    odd = prmt(codes[1], codes[3], 0x6240)  # 1, 3, 5, 7
    even_sign = prmt(upper[0], upper[2], 0xFBD9)  # 0xFF / 0x00 bytes from bits 15, 31
    odd_sign = prmt(upper[1], upper[3], 0xFBD9)
    lo = even | (even_sign & Uint32(0x08080808))
    hi = odd | (odd_sign & Uint32(0x08080808))
    return lo + (hi << 4)


# The hardware encoder (sm_100a, sm_120a; not sm_90a): cvt.rn.satfinite.e2m1x2.f32 packs two
# values into one byte, its first source operand in the upper nibble. The software ``e2m1x8``
# above is defined as this instruction's RN semantics (docs/numerics.md §1.3: ties to even,
# saturation at 6, NaN -> +6, -0.0 -> code 8), so the two are bit-identical by construction;
# the templates pick one by the spec's arch (``hw_e2m1``). Stochastic rounding stays in
# software on every arch (``kernels/stochastic.py``): the hardware SR cvt takes its own random
# bits per value and is not TE's rule.
_E2M1X8_CVT = (
    "{\n\t.reg .b8 b0, b1, b2, b3;\n\t"
    "cvt.rn.satfinite.e2m1x2.f32 b0, $2, $1;\n\t"
    "cvt.rn.satfinite.e2m1x2.f32 b1, $4, $3;\n\t"
    "cvt.rn.satfinite.e2m1x2.f32 b2, $6, $5;\n\t"
    "cvt.rn.satfinite.e2m1x2.f32 b3, $8, $7;\n\t"
    "mov.b32 $0, {b0, b1, b2, b3};\n\t}"
)


@dsl_user_op
def _cvt_e2m1x8(v0, v1, v2, v3, v4, v5, v6, v7, *, loc=None, ip=None) -> Uint32:
    args = _ir((v0, v1, v2, v3, v4, v5, v6, v7), (Float32,) * 8, loc, ip)
    return Uint32(_asm(T.i32(), _E2M1X8_CVT, "=r" + ",f" * 8, args))


def e2m1x8_cvt(v) -> Uint32:
    """``e2m1x8`` with the hardware cvt (sm_100a+): eight fp32 values (already times enc) ->
    eight e2m1 nibbles (RN, satfinite), element 0 in bits 0-3."""
    return _cvt_e2m1x8(*v)


# ------------------------------------------------------------------------ raw global stores


# L2 eviction priorities. Compact NVFP4 scales leave 2-byte pieces that only whole tiles
# later complete a 32-byte sector; evicted half-written, each costs a DRAM read-modify-write
# (ncu, 65536x2048 in 64 groups: +33 MB read, +32 MB written). Marking those stores evict_last
# keeps the sectors in L2 until complete (compact 64 groups 295 -> 251 us on an H200; with x
# also loaded evict_first, 222 us: perf/NOTES.md attempt 27).


@dsl_user_op
def l2_evict_last_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache-hint policy: lines written or read with it are evicted after the others."""
    return Int64(_asm(T.i64(), "createpolicy.fractional.L2::evict_last.b64 $0, 1.0;", "=l", []))


@dsl_user_op
def l2_evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache-hint policy: lines read with it are evicted first (data read once)."""
    return Int64(_asm(T.i64(), "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l", []))


def _st_global(op: str, addr: Int64, words, policy, loc, ip, value: str = "", prelude: str = ""):
    """``st.global.<op>`` of ``words`` at ``addr``, with an L2 cache-hint policy if given.
    ``value``: the stored operand when it is not the words themselves (computed by ``prelude``)."""
    n = len(words)
    if not value:
        value = "{" + ", ".join(f"${i + 1}" for i in range(n)) + "}" if n > 1 else "$1"
    if policy is None:
        ptx = f"st.global.{op} [$0], {value};"
        args, types, cons = (addr, *words), (Int64,) + (Uint32,) * n, "l" + ",r" * n
    else:
        ptx = f"st.global.L2::cache_hint.{op} [$0], {value}, ${n + 1};"
        args, types = (addr, *words, policy), (Int64,) + (Uint32,) * n + (Int64,)
        cons = "l" + ",r" * n + ",l"
    if prelude:
        ptx = "{\n\t" + prelude + "\n\t" + ptx + "\n\t}"
    llvm.inline_asm(
        None, _ir(args, types, loc, ip), ptx, cons, has_side_effects=True, is_align_stack=False
    )


@dsl_user_op
def st_global_v4(
    addr: Int64, a: Uint32, b: Uint32, c: Uint32, d: Uint32, policy=None, *, loc=None, ip=None
):
    """16-byte store; ``addr`` must be 16-byte aligned."""
    _st_global("v4.b32", addr, (a, b, c, d), policy, loc, ip)


@dsl_user_op
def st_global_v4_cs(addr: Int64, a: Uint32, b: Uint32, c: Uint32, d: Uint32, *, loc=None, ip=None):
    """16-byte store with the streaming cache operator (``st.global.cs``: evict-first in L2;
    SASS STG.E.EF.128)."""
    _st_global("cs.v4.b32", addr, (a, b, c, d), None, loc, ip)


@dsl_user_op
def st_global_v2(addr: Int64, a: Uint32, b: Uint32, policy=None, *, loc=None, ip=None):
    """8-byte store; ``addr`` must be 8-byte aligned."""
    _st_global("v2.b32", addr, (a, b), policy, loc, ip)


@dsl_user_op
def st_global_b32(addr: Int64, a: Uint32, policy=None, *, loc=None, ip=None):
    _st_global("b32", addr, (a,), policy, loc, ip)


@dsl_user_op
def st_global_b16(addr: Int64, a: Uint32, policy=None, *, loc=None, ip=None):
    """The low 16 bits of ``a``."""
    prelude = ".reg .b16 h;\n\tcvt.u16.u32 h, $1;"
    _st_global("b16", addr, (a,), policy, loc, ip, value="h", prelude=prelude)


def swizzled_scale_offset(r, c, num_cols_div4):
    """Byte offset of scale (r, c) in the cuBLASLt 128x4 layout (docs/numerics.md §4);
    ``num_cols_div4`` = ceil(compact columns / 4)."""
    rb = r >> 7
    d4 = (r >> 5) & 3
    d3 = r & 31
    cb = c >> 2
    d5 = c & 3
    return ((rb * num_cols_div4 + cb) * 32 + d3) * 16 + d4 * 4 + d5
