"""Bit-exact pure-torch reference of the Transformer Engine NVFP4 / RHT / FP8 numerics.

Every function follows ``docs/numerics.md`` (TE commit ``d0067d0``); the
section implemented is named in each docstring.  Everything is vectorized torch and
device-agnostic: it runs on ``x.device`` (CPU or CUDA) and uses no CUDA-only ops.  Python loops
only run over groups, RHT band/limb indices or column chunks, never over elements.

Conventions
-----------
* "f32(...)" means one IEEE fp32 rounding (RNE); all scale arithmetic is done in fp32 tensors.
* E2M1 codes are ``uint8`` 0..15 with the sign in bit 3; E4M3 scale factors are ``uint8`` bytes
  of ``float8_e4m3fn``.
* Packed FP4: byte ``k`` = ``code[2k] | code[2k+1] << 4`` (even element in the low nibble).
* Scale tensors are compact row-major ``[roundup(rows,128), roundup(cols/16,4)]`` with the
  padding set to ZERO (TE leaves it unwritten; its swizzle zero-fills it), or flat swizzled.

Decisions where TE is ambiguous / inconsistent (documented in the function docstrings):
* ``e2m1_encode``: NaN -> code 7 (+6) and exact ``-0.0`` -> code 8, both as the hardware
  ``cvt.rn.satfinite.e2m1x2.f32``; TE's python reference would give 0 for ``-0.0``.
* ``global_encode_scale``: NaN amax -> FLT_MAX (CUDA ``fminf``), as the core kernels.
* Block amax propagates NaN; ``fminf(NaN, FLT_MAX)`` then gives sf = 448 for such a block.
* ``rht_along_tokens`` rounds the EXACT 16-term sum once to fp32 (then to bf16); an exactly
  zero sum gives +0.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "DEFAULT_SIGN_MASK",
    "E4M3_MAX",
    "E5M2_MAX",
    "FLT_MAX",
    "FP4_MAX",
    "rht_matrix",
    "rht_along_tokens",
    "inverse_rht_along_tokens",
    "global_encode_scale",
    "global_decode_scale",
    "e4m3_rne_satfinite",
    "e4m3_to_float",
    "e2m1_encode",
    "e2m1_decode",
    "pack_fp4",
    "unpack_fp4",
    "nvfp4_quantize_rows",
    "nvfp4_dequantize",
    "swizzle_offset",
    "swizzle_scales",
    "unswizzle_scales",
    "group_amax",
    "nvfp4_group_quantize",
    "fp8_max",
    "fp8_scale_from_amax",
    "fp8_cast",
    "fp8_group_quantize",
    "fp8_dequantize",
]

FP4_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FLT_MAX = torch.finfo(torch.float32).max
DEFAULT_SIGN_MASK = 0xD7E8

_F32 = torch.float32


def _roundup(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _f32(value, device) -> torch.Tensor:
    """0-dim fp32 constant on ``device`` (python floats are rounded once to fp32)."""
    return torch.tensor(value, dtype=_F32, device=device)


def _scalar_amax(amax, device) -> torch.Tensor:
    a = torch.as_tensor(amax, device=device).to(_F32)
    if a.numel() != 1:
        raise ValueError(f"amax must have exactly one element, got shape {tuple(a.shape)}")
    return a.reshape(())


# --------------------------------------------------------------------------------------------
# §3.1 / §3.2  Random Hadamard Transform
# --------------------------------------------------------------------------------------------


def _sign_matrix(sign_mask: int, device) -> torch.Tensor:
    """float64 [16,16] of ±1: diag(s) @ H16 (Sylvester order), i.e. 4 * rht_matrix."""
    i = torch.arange(16, device=device)
    and_bits = i[:, None] & i[None, :]
    parity = torch.zeros_like(and_bits)
    for b in range(4):
        parity ^= (and_bits >> b) & 1
    row_sign = (sign_mask >> i) & 1
    return 1.0 - 2.0 * (parity ^ row_sign[:, None]).to(torch.float64)


def rht_matrix(sign_mask: int = DEFAULT_SIGN_MASK) -> torch.Tensor:
    """§3.1: bf16 [16,16] ``diag(s) @ H16 * 0.25``; ``H16[i][j] = (-1)^popcount(i & j)``,
    ``s[i] = -1`` iff bit ``i`` of ``sign_mask`` is set.  All entries are ±0.25 (exact)."""
    return (_sign_matrix(sign_mask, "cpu") * 0.25).to(torch.bfloat16)


# The exact sum uses fixed 48-bit "bands" of the integer u = x * 2^149 (every finite fp32 /
# bf16 / fp16 value is an integer multiple of 2^-149 and |x| < 2^128, so |u| < 2^277 < 2^288).
_EXP_SHIFT = 149
_BAND_BITS = 48
_NUM_BANDS = 6
_CHUNK_ELEMS = 1 << 22


def _exact_rht_sum_to_f64(xb: torch.Tensor, sgn: torch.Tensor) -> torch.Tensor:
    """Exact ``sum_i xb[n,b,i] * sgn[i,j]`` (sgn = ±1), returned round-to-odd in float64.

    xb: float64 [N, B, 16] of finite values.  Each value is split into six 48-bit bands; band
    sums over 16 terms are exact in float64 (52-bit integers in units of the band), carries are
    propagated and all bands made the sign of the total (non-overlapping, same sign).  The top
    two nonzero bands are added in float64 and the result is moved to the odd neighbour if any
    bit was lost ("round to odd", 53 >= 24 + 2 bits), so one later RNE cast to fp32 equals RNE
    of the exact sum (double-rounding free).  An exactly zero sum returns +0.0.
    """
    u = xb * (2.0**_EXP_SHIFT)  # integer-valued, exact
    a = u.abs()
    # trunc_k = |u| with the bits below 2^(48k) cleared (exact); band k = trunc_k - trunc_{k+1}
    trunc = [
        torch.trunc(a / 2.0 ** (_BAND_BITS * k)) * 2.0 ** (_BAND_BITS * k)
        for k in range(_NUM_BANDS)
    ] + [torch.zeros_like(a)]
    band = torch.stack([trunc[k] - trunc[k + 1] for k in range(_NUM_BANDS)]) * torch.sign(u)
    bs = list(torch.matmul(band, sgn).unbind(0))  # exact: 52-bit integers per band unit
    for k in range(_NUM_BANDS - 1):  # carry so that |bs[k]| < 2^(48(k+1))
        unit = 2.0 ** (_BAND_BITS * (k + 1))
        c = torch.trunc(bs[k] / unit) * unit
        bs[k] = bs[k] - c
        bs[k + 1] = bs[k + 1] + c
    sigma = torch.zeros_like(bs[0])  # sign of the total = sign of the top nonzero band
    for k in range(_NUM_BANDS - 1, -1, -1):
        sigma = torch.where(sigma == 0, torch.sign(bs[k]), sigma)
    for k in range(_NUM_BANDS - 1):  # borrow so every band has the sign of the total
        unit = 2.0 ** (_BAND_BITS * (k + 1))
        adj = torch.where(bs[k] * sigma < 0, sigma * unit, torch.zeros_like(sigma))
        bs[k] = bs[k] + adj
        bs[k + 1] = bs[k + 1] - adj
    stack = torch.stack(bs)
    kidx = torch.arange(_NUM_BANDS, device=xb.device).view(-1, 1, 1, 1)
    top = torch.where(stack != 0, kidx, torch.full_like(kidx, -1)).amax(dim=0)
    hi = stack.gather(0, top.clamp(min=0).unsqueeze(0)).squeeze(0)
    mid = stack.gather(0, (top - 1).clamp(min=0).unsqueeze(0)).squeeze(0)
    mid = torch.where(top >= 1, mid, torch.zeros_like(mid))
    rest = ((stack != 0) & (kidx < (top - 1).unsqueeze(0))).any(dim=0)
    z = hi + mid
    err = mid - (z - hi)  # Fast2Sum: exact residual, |hi| >= 2^(48 top) > |mid|
    direction = torch.where(err != 0, torch.sign(err), torch.where(rest, sigma, 0.0))
    even = (z.view(torch.int64) & 1) == 0
    z = torch.where((direction != 0) & even, torch.nextafter(z, direction * float("inf")), z)
    z = torch.where(top < 0, torch.zeros_like(z), z)
    return z * (2.0**-_EXP_SHIFT)


# How the 16-term RHT sums are evaluated: "exact" (rounded once to fp32: CPU-capable),
# "tensor_core" (a bf16 x bf16 -> fp32 tensor-core matmul, what TE's own tests use as the oracle
# via a torch bf16 matmul and what every tensor-core kernel computes; CUDA only), or "auto"
# (tensor_core for CUDA tensors, exact otherwise). The two agree except when a block spans
# ~16+ binades: the hardware's fp32 accumulation is not a single rounding of the exact sum.
RHT_ACCUMULATION = "auto"


def _tensor_core_rht(x: torch.Tensor, sign_mask: int) -> torch.Tensor:
    m, n = x.shape
    r = rht_matrix(sign_mask).to(x.device)
    xb = x.to(torch.bfloat16).t().reshape(n * (m // 16), 16)
    return torch.mm(xb, r, out_dtype=torch.float32).reshape(n, m)


def rht_along_tokens(
    x: torch.Tensor, sign_mask: int = DEFAULT_SIGN_MASK, *, round_to_bf16: bool = True
) -> torch.Tensor:
    """§3.1/§3.2: RHT of each 16-token block of each column, returned transposed ``[N, M]``.

    ``y[n, 16b + j] = sum_i x[16b+i, n] * R[i, j]`` with ``R = rht_matrix(sign_mask)``.
    x: bf16 (fp16/fp32 accepted) ``[M, N]``, ``M % 16 == 0``.  See ``RHT_ACCUMULATION``: in the
    exact mode the 16-term sum is computed EXACTLY and rounded once to fp32 (RNE; beyond the
    fp32 range -> ±inf).  Note a plain float64
    sum is NOT exact for wide exponent spreads (e.g. ``2^100 + 1 - 2^100``), hence the banded
    sum above.  With ``round_to_bf16`` (default, the TE kernels' ``cvt.rn.bf16x2.f32``) that fp32
    is rounded to bf16 (RNE) and bf16 is returned; otherwise fp32 is returned (fast-math path,
    which quantizes straight from the fp32 accumulators).  inf/NaN inputs give the IEEE sum
    (inf, or NaN for inf - inf / NaN).  An exactly zero sum is +0.0.  ``M == 0`` -> ``[N, 0]``.
    """
    if x.dim() != 2:
        raise ValueError("rht_along_tokens expects a 2-D [M, N] tensor")
    m, n = x.shape
    if m % 16:
        raise ValueError(f"token count {m} must be a multiple of 16")
    mode = RHT_ACCUMULATION
    if mode == "auto":
        mode = "tensor_core" if x.is_cuda else "exact"
    if mode == "tensor_core" and m and n:
        out = _tensor_core_rht(x, sign_mask)
        return out.to(torch.bfloat16) if round_to_bf16 else out
    out = torch.empty((n, m), dtype=_F32, device=x.device)
    if m and n:
        sgn = _sign_matrix(sign_mask, x.device)
        cols = max(1, _CHUNK_ELEMS // m)
        for c0 in range(0, n, cols):
            xb = x[:, c0 : c0 + cols].to(torch.float64).t().reshape(-1, m // 16, 16)
            plain = torch.matmul(xb, sgn * 0.25)  # IEEE inf/NaN semantics, never overflows
            finite = torch.isfinite(plain)
            exact = _exact_rht_sum_to_f64(torch.where(torch.isfinite(xb), xb, 0.0), sgn)
            y = torch.where(finite, exact * 0.25, plain)
            out[c0 : c0 + cols] = y.reshape(-1, m).to(_F32)
    return out.to(torch.bfloat16) if round_to_bf16 else out


def inverse_rht_along_tokens(y_t: torch.Tensor, sign_mask: int = DEFAULT_SIGN_MASK) -> torch.Tensor:
    """Inverse of :func:`rht_along_tokens` (§3.1): ``R`` is orthogonal (``R R^T = I``), so each
    block is ``x_blk = y_blk @ R^T``.  y_t: ``[N, M]`` (fp32/bf16) -> fp32 ``[M, N]``, computed
    with an fp32 matmul (not bit-exact; for round-trip checks)."""
    n, m = y_t.shape
    if m % 16:
        raise ValueError(f"token count {m} must be a multiple of 16")
    r = (_sign_matrix(sign_mask, y_t.device) * 0.25).to(_F32)
    x_blk = torch.matmul(y_t.to(_F32).reshape(n, m // 16, 16), r.t())
    return x_blk.reshape(n, m).t().contiguous()


# --------------------------------------------------------------------------------------------
# §1.1 global scale, §1.2 / §1.3 element formats
# --------------------------------------------------------------------------------------------


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """§1.1 (core kernels): ``S = f32(2688 / amax)``; ``S = fminf(S, FLT_MAX)``; ``S = 1`` where
    ``amax == 0`` or ``S == 0`` (amax = +inf).  NaN amax -> FLT_MAX (``fminf`` returns the
    non-NaN operand; TE's python reference would propagate NaN)."""
    amax = torch.as_tensor(amax).to(_F32)
    s = _f32(E4M3_MAX * FP4_MAX, amax.device) / amax
    s = torch.fmin(s, _f32(FLT_MAX, amax.device))
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def global_decode_scale(s_enc: torch.Tensor) -> torch.Tensor:
    """§1.1: ``S_dec = f32(1 / S_enc)``."""
    s_enc = torch.as_tensor(s_enc).to(_F32)
    return _f32(1.0, s_enc.device) / s_enc


def e4m3_rne_satfinite(v: torch.Tensor) -> torch.Tensor:
    """§1.2: fp32 -> ``uint8`` E4M3 (fn) codes, RNE, satfinite (|v| > 448 and ±inf -> ±448,
    code 0x7E/0xFE).  NaN -> 0x7F with the NaN's sign bit (0xFF for a negative NaN); ``-0.0``
    -> 0x80.  Clamps before torch's cast so saturation never depends on torch's cast."""
    v = v.to(_F32)
    v = torch.clamp(v, -E4M3_MAX, E4M3_MAX)  # keeps NaN
    return v.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode ``uint8`` E4M3 (fn) codes to fp32 (exact)."""
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).to(_F32)


# (midpoint, round up on an exact tie?): ties go to the even code (0.25->0, 0.75->1.0,
# 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5.0->4.0).
_E2M1_MIDPOINTS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)
_E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """§1.3: fp32 -> E2M1 codes 0..15 as ``cvt.rn.satfinite.e2m1x2.f32`` (RNE ties-to-even,
    |v| > 6 and ±inf -> ±6 = code 7 / 15).  Exact for every fp32 input: the code is the number
    of midpoints below |v| (comparisons, no float tricks).  Sign from the sign bit, so negative
    values rounding to zero AND an exact ``-0.0`` give code 8 (hardware behaviour; TE's python
    reference gives 0 for ``-0.0``).  NaN -> code 7 (+6), the hardware satfinite rule."""
    v = v.to(_F32)
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for mid, up_on_tie in _E2M1_MIDPOINTS:
        code += (a >= mid if up_on_tie else a > mid).to(torch.uint8)
    nan = torch.isnan(v)
    code = torch.where(nan, torch.full_like(code, 7), code)
    return code | ((torch.signbit(v) & ~nan).to(torch.uint8) << 3)


def e2m1_encode_sr(v: torch.Tensor, rbytes: torch.Tensor) -> torch.Tensor:
    """§1.4: stochastic rounding to E2M1 with one random byte per element (uint8, same shape),
    TE's software emulation written literally: ``u = byte / 256``, ``t = |v| + u * step(|v|)``
    (fp32), step 0.5 / 1 / 2 for |v| in [0, 2) / [2, 4) / [4, inf), ``q = min(floor(t /
    step(t)) * step(t), 6)``; sign copied (so -0 stays -0), NaN -> code 7 (+6)."""
    v = v.to(_F32)
    a = v.abs()

    def step(t):
        return torch.where(t < 2, 0.5, torch.where(t < 4, 1.0, 2.0)).to(_F32)

    t = a + (rbytes.to(_F32) / 256) * step(a)
    q = torch.fmin(torch.floor(t / step(t)) * step(t), _f32(6.0, v.device))
    nan = torch.isnan(v)
    code = torch.where(nan, 7, e2m1_encode(q).to(torch.int64)).to(torch.uint8)
    return code | ((torch.signbit(v) & ~nan).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 code (0..15) -> fp32 (code 8 -> -0.0)."""
    lut = torch.tensor(_E2M1_VALUES, dtype=_F32, device=codes.device)
    return lut[codes.to(torch.long) & 0xF]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """§1.5: ``[..., K]`` codes -> ``uint8 [..., K/2]``, even element in the LOW nibble."""
    if codes.shape[-1] % 2:
        raise ValueError("last dim must be even to pack FP4")
    c = codes.to(torch.uint8) & 0xF
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: ``uint8 [..., K/2]`` -> codes ``uint8 [..., K]``."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


# --------------------------------------------------------------------------------------------
# §1.2 / §1.3 / §1.5 / checklist 9: 1D NVFP4 quantization
# --------------------------------------------------------------------------------------------


def _exact_reciprocal(t: torch.Tensor) -> torch.Tensor:
    return _f32(1.0, t.device) / t


def nvfp4_quantize_rows(
    v: torch.Tensor,
    amax: torch.Tensor,
    *,
    fast_math: bool = False,
    reciprocal: Callable[[torch.Tensor], torch.Tensor] | None = None,
    rbytes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """1D NVFP4 quantization of each row of ``v`` ``[R, C]`` in 16-element blocks (§1.2, §1.3,
    §1.5, checklist 9).  ``v``: bf16 or fp32 (fp32 is NOT pre-rounded), ``C % 16 == 0``.
    ``rbytes`` (uint8 ``[R, C/16, 16]``): stochastic rounding of the elements with these random
    bytes (:func:`e2m1_encode_sr`) instead of RN; the scales do not change.

    All ops fp32::

        S_enc = global_encode_scale(amax);  S_dec = f32(1 / S_enc)
        block_amax = max|v| over 16 (NaN propagates; fminf below then gives sf = 448)
        sf  = e4m3_rne_satfinite(fminf(f32(block_amax * f32(S_enc * f32(1/6))), FLT_MAX))
        enc = fminf(f32(1 / f32(float(sf) * S_dec)), FLT_MAX)      # sf == 0 -> FLT_MAX
        q   = e2m1_encode(f32(float32(v) * enc))

    ``fast_math=True`` (RHT cast-fusion kernels, §1.3): ``enc = reciprocal(f32(sf * S_dec))``
    with NO fminf clamp; ``reciprocal`` models ``rcp.approx.ftz`` (default: exact fp32 1/x).
    Then sf == 0 gives enc = inf: nonzero elements -> ±6, zeros -> 0*inf = NaN -> code 7.

    Returns ``(data uint8 [R, C/2], scales uint8 [roundup(R,128), roundup(C/16,4)])`` with the
    scale padding ZERO.  ``R == 0`` gives ``[0, C/2]`` and ``[0, roundup(C/16,4)]``.
    """
    if v.dim() != 2:
        raise ValueError("nvfp4_quantize_rows expects a 2-D tensor")
    rows, cols = v.shape
    if cols % 16:
        raise ValueError(f"row length {cols} must be a multiple of 16")
    dev = v.device
    nb = cols // 16
    s_enc = global_encode_scale(_scalar_amax(amax, dev))
    s_dec = global_decode_scale(s_enc)
    flt_max = _f32(FLT_MAX, dev)
    vf = v.to(_F32).reshape(rows, nb, 16)
    if vf.numel():
        block_amax = vf.abs().amax(dim=-1)  # torch max propagates NaN
    else:
        block_amax = torch.zeros((rows, nb), dtype=_F32, device=dev)
    sf = e4m3_rne_satfinite(torch.fmin(block_amax * (s_enc * _f32(1.0 / 6.0, dev)), flt_max))
    denom = e4m3_to_float(sf) * s_dec
    if fast_math:
        enc = (reciprocal or _exact_reciprocal)(denom).to(_F32)
    else:
        enc = torch.fmin(_f32(1.0, dev) / denom, flt_max)
    scaled = vf * enc.unsqueeze(-1)
    codes = (e2m1_encode(scaled) if rbytes is None else e2m1_encode_sr(scaled, rbytes)).reshape(
        rows, cols
    )
    scales = torch.zeros((_roundup(rows, 128), _roundup(nb, 4)), dtype=torch.uint8, device=dev)
    scales[:rows, :nb] = sf
    return pack_fp4(codes), scales


def nvfp4_dequantize(
    data: torch.Tensor,
    scales: torch.Tensor,
    amax: torch.Tensor,
    *,
    shape: tuple[int, int],
    swizzled: bool = False,
) -> torch.Tensor:
    """Dequantize NVFP4 (§1.2/§1.5) to fp32 ``[R, C]``.

    ``value = f32(f32(e2m1_decode(code) * float(sf)) * S_dec)`` -- code times scale factor
    first, then times ``S_dec = f32(1 / global_encode_scale(amax))``.  ``scales`` is the compact
    padded ``[roundup(R,128), roundup(C/16,4)]`` tensor, or the flat swizzled one if ``swizzled``.
    """
    rows, cols = shape
    if tuple(data.shape) != (rows, cols // 2):
        raise ValueError(f"data shape {tuple(data.shape)} does not match {shape}")
    nb = cols // 16
    rp, cp = _roundup(rows, 128), _roundup(nb, 4)
    if swizzled:
        scales = unswizzle_scales(scales, rp, cp)
    sf = e4m3_to_float(scales[:rows, :nb]).repeat_interleave(16, dim=1)
    s_dec = global_decode_scale(global_encode_scale(_scalar_amax(amax, data.device)))
    return (e2m1_decode(unpack_fp4(data)) * sf) * s_dec


# --------------------------------------------------------------------------------------------
# §4 GEMM-swizzled scale layout
# --------------------------------------------------------------------------------------------


def swizzle_offset(r: int, c: int, num_cols: int) -> int:
    """§4: byte offset of compact scale ``[r, c]`` in the 128x4-atom swizzled layout;
    ``num_cols`` = compact scale columns before padding (C/16 rowwise, M/16 columnwise)."""
    rb, rem = divmod(r, 128)
    d4, d3 = divmod(rem, 32)
    cb, d5 = divmod(c, 4)
    cb_cnt = -(-num_cols // 4)
    return ((rb * cb_cnt + cb) * 32 + d3) * 16 + d4 * 4 + d5


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """§4: padded compact ``[Rp, Cp]`` (Rp % 128 == 0, Cp % 4 == 0) -> flat ``[Rp*Cp]``
    = ``reshape(Rp/128, 4, 32, Cp/4, 4).permute(0, 3, 2, 1, 4)``.  Padding stays as given
    (zero for tensors produced here, matching ``nvte_swizzle_scaling_factors``)."""
    rp, cp = scales.shape
    if rp % 128 or cp % 4:
        raise ValueError(f"scale shape {tuple(scales.shape)} is not padded to (128, 4)")
    t = scales.reshape(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(-1).contiguous()


def unswizzle_scales(flat: torch.Tensor, rp: int, cp: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: flat ``[Rp*Cp]`` -> compact ``[Rp, Cp]``."""
    t = flat.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(rp, cp).contiguous()


# --------------------------------------------------------------------------------------------
# §3.3 / §5 grouped (split) NVFP4
# --------------------------------------------------------------------------------------------


def _split_rows(x: torch.Tensor, splits: Sequence[int]) -> list[torch.Tensor]:
    splits = [int(s) for s in splits]
    if any(s < 0 for s in splits) or sum(splits) != x.shape[0]:
        raise ValueError(f"splits {splits} do not partition {x.shape[0]} rows")
    out, off = [], 0
    for s in splits:
        out.append(x[off : off + s])
        off += s
    return out


def _abs_max(t: torch.Tensor) -> torch.Tensor:
    """fp32 0-dim max|t| (NaN propagates); 0.0 for an empty tensor."""
    if t.numel() == 0:
        return torch.zeros((), dtype=_F32, device=t.device)
    return t.abs().amax().to(_F32)


def group_amax(
    x: torch.Tensor,
    splits: Sequence[int],
    *,
    rht: bool = True,
    sign_mask: int = DEFAULT_SIGN_MASK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.3 / §5.1: per-group amax of ``x`` ``[sum(splits), N]`` (bf16).

    ``amax_row[g] = max|x_g|`` (pre-RHT); ``amax_col[g] = max|rht_along_tokens(x_g)|`` of the
    bf16-rounded RHT output if ``rht`` else ``amax_row[g]``.  Zero-token groups -> 0.0 (TE
    leaves them unwritten).  NaN propagates.  Returns two fp32 ``[G]`` tensors on x.device.
    """
    rows, cols = [], []
    for xg in _split_rows(x, splits):
        a = _abs_max(xg)
        rows.append(a)
        cols.append(_abs_max(rht_along_tokens(xg, sign_mask)) if rht and xg.numel() else a)
    if not rows:
        empty = torch.zeros(0, dtype=_F32, device=x.device)
        return empty, empty.clone()
    return torch.stack(rows), torch.stack(cols)


def nvfp4_group_quantize(
    x: torch.Tensor,
    splits: Sequence[int],
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    rht: bool = True,
    sign_mask: int = DEFAULT_SIGN_MASK,
    swizzled_scales: bool = False,
    fast_math: bool = False,
    amax: tuple[torch.Tensor, torch.Tensor] | None = None,
    reciprocal: Callable[[torch.Tensor], torch.Tensor] | None = None,
    stochastic_rounding: bool = False,
    rng_state: torch.Tensor | Sequence[int] | None = None,
) -> list[dict]:
    """§5.1 ``split_quantize`` for NVFP4 (1D, RN), one dict per group ``x_g`` ``[M_g, N]``.

    Keys: ``row_data`` ``[M_g, N/2]`` / ``row_scales`` ``[roundup(M_g,128), roundup(N/16,4)]``
    = ``nvfp4_quantize_rows(x_g, amax_row)``; ``col_data`` ``[N, M_g/2]`` / ``col_scales``
    ``[roundup(N,128), roundup(M_g/16,4)]`` = ``nvfp4_quantize_rows(C_g, amax_col)`` with
    ``C_g = rht_along_tokens(x_g)`` (bf16; fp32 unrounded when ``fast_math``) if ``rht`` else
    ``x_g.T``; ``amax_row`` / ``amax_col`` (0-dim fp32).  Scales are flat swizzled (§4) when
    ``swizzled_scales``.  Keys of a disabled direction are absent.  ``fast_math`` (and
    ``reciprocal``) apply to the enc multiplier of BOTH directions, as in the fused RHT kernel.
    ``amax``: optional ``(amax_row [G], amax_col [G])`` used instead of :func:`group_amax`.
    Zero-token groups get correctly shaped empty tensors (row scales ``[0, roundup(N/16,4)]``,
    col scales ``[roundup(N,128), 0]``).  ``stochastic_rounding``: elements are rounded with
    :func:`e2m1_encode_sr`, random bytes from ``rng_state = (seed, offset)`` as defined in
    ``cutequant.kernels.stochastic`` (block ids over the whole of ``x``).
    """
    groups = _split_rows(x, splits)
    rand = None
    if stochastic_rounding:
        from cutequant import philox

        seed, offset = (int(v) for v in rng_state)
        m_all, n = x.shape

        def rand(direction, rows, blocks, row_stride):
            ids = rows[:, None] * row_stride + blocks[None, :]
            return philox.block_random_bytes(ids, direction, seed, offset)

    if amax is None:
        amax_row, amax_col = group_amax(x, splits, rht=rht, sign_mask=sign_mask)
    else:
        amax_row = torch.as_tensor(amax[0], device=x.device).to(_F32).reshape(-1)
        amax_col = torch.as_tensor(amax[1], device=x.device).to(_F32).reshape(-1)
        if amax_row.numel() != len(groups) or amax_col.numel() != len(groups):
            raise ValueError("amax tensors must have one entry per group")

    def finish(data, scales):
        return data, (swizzle_scales(scales) if swizzled_scales else scales)

    out = []
    row0 = 0
    for g, xg in enumerate(groups):
        m_g = xg.shape[0]
        res = {"amax_row": amax_row[g].clone(), "amax_col": amax_col[g].clone()}
        opts = dict(fast_math=fast_math, reciprocal=reciprocal)
        if rowwise:
            if rand is not None:
                tokens = torch.arange(row0, row0 + m_g, device=x.device)
                opts["rbytes"] = rand(0, tokens, torch.arange(n // 16, device=x.device), n // 16)
            res["row_data"], res["row_scales"] = finish(
                *nvfp4_quantize_rows(xg, amax_row[g], **opts)
            )
        if columnwise:
            if rht:
                cin = rht_along_tokens(xg, sign_mask, round_to_bf16=not fast_math)
            else:
                cin = xg.t().contiguous()
            if rand is not None:
                tblocks = torch.arange(row0 // 16, (row0 + m_g) // 16, device=x.device)
                opts["rbytes"] = rand(1, torch.arange(n, device=x.device), tblocks, m_all // 16)
            res["col_data"], res["col_scales"] = finish(
                *nvfp4_quantize_rows(cin, amax_col[g], **opts)
            )
        out.append(res)
        row0 += m_g
    return out


# --------------------------------------------------------------------------------------------
# §6 FP8 per-tensor scaling
# --------------------------------------------------------------------------------------------


def fp8_max(dtype: torch.dtype) -> float:
    """§6: largest finite value of the FP8 format (448 for E4M3, 57344 for E5M2)."""
    if dtype == torch.float8_e4m3fn:
        return E4M3_MAX
    if dtype == torch.float8_e5m2:
        return E5M2_MAX
    raise ValueError(f"unsupported fp8 dtype {dtype}")


def fp8_scale_from_amax(
    amax: torch.Tensor,
    fp8_dtype: torch.dtype,
    *,
    epsilon: float = 0.0,
    force_pow2: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§6 ``compute_scale_from_amax``: ``if amax < eps: amax = eps`` (NaN stays NaN); amax
    inf / 0 / NaN -> scale 1; else ``scale = f32(fp8_max / amax)``; inf -> FLT_MAX; pow2:
    ``bits & 0xFF800000``.  ``scale_inv = f32(1 / scale)``.  Elementwise, any shape."""
    amax = torch.as_tensor(amax).to(_F32)
    dev = amax.device
    eps = _f32(epsilon, dev)
    amax = torch.where(amax < eps, eps, amax)
    bad = torch.isinf(amax) | (amax == 0) | torch.isnan(amax)
    scale = _f32(fp8_max(fp8_dtype), dev) / torch.where(bad, torch.ones_like(amax), amax)
    scale = torch.where(torch.isinf(scale), _f32(FLT_MAX, dev), scale)
    scale = torch.where(bad, torch.ones_like(scale), scale)
    if force_pow2:
        bits = scale.view(torch.int32) & torch.tensor(
            0xFF800000 - (1 << 32), dtype=torch.int32, device=dev
        )
        scale = bits.view(_F32)
    return scale, _f32(1.0, dev) / scale


def fp8_cast(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """§6: ``fp8(f32(float32(x) * scale))`` with ``cvt.rn.satfinite``: RNE, |v| > max and ±inf
    -> ±max (both formats), NaN stays NaN (sign kept)."""
    m = fp8_max(fp8_dtype)
    v = x.to(_F32) * torch.as_tensor(scale, device=x.device).to(_F32)
    return torch.clamp(v, -m, m).to(fp8_dtype)


def fp8_group_quantize(
    x: torch.Tensor,
    splits: Sequence[int],
    *,
    fp8_dtype: torch.dtype,
    scaling: str = "current",
    scale: torch.Tensor | None = None,
    rowwise: bool = True,
    columnwise: bool = True,
    amax_epsilon: float = 0.0,
    force_pow2_scales: bool = False,
) -> list[dict]:
    """§6 grouped FP8 per-tensor quantization of ``x`` (bf16/fp16/fp32) ``[sum(splits), N]``.

    Per group: ``amax = max|x_g|`` (fp32, 0 for an empty group) in both modes.  ``"current"``:
    ``scale, scale_inv = fp8_scale_from_amax(amax, ...)``; ``"delayed"``: ``scale = scale[g]``
    (given fp32 ``[G]``), ``scale_inv = f32(1/scale)``.  Keys: ``row_data`` ``[M_g, N]`` and
    ``col_data`` ``[N, M_g]`` (= cast of ``x_g.T``, contiguous; absent when disabled),
    ``scale``, ``scale_inv``, ``amax`` (0-dim fp32).
    """
    if scaling not in ("current", "delayed"):
        raise ValueError(f"unknown scaling {scaling!r}")
    groups = _split_rows(x, splits)
    if scaling == "delayed":
        if scale is None:
            raise ValueError("delayed scaling needs scale")
        scale = torch.as_tensor(scale, device=x.device).to(_F32).reshape(-1)
        if scale.numel() != len(groups):
            raise ValueError("scale must have one entry per group")
    out = []
    for g, xg in enumerate(groups):
        amax = _abs_max(xg)
        if scaling == "current":
            s, s_inv = fp8_scale_from_amax(
                amax, fp8_dtype, epsilon=amax_epsilon, force_pow2=force_pow2_scales
            )
        else:
            s = scale[g].clone()
            s_inv = _f32(1.0, x.device) / s
        res = {"scale": s, "scale_inv": s_inv, "amax": amax}
        if rowwise:
            res["row_data"] = fp8_cast(xg, s, fp8_dtype)
        if columnwise:
            res["col_data"] = fp8_cast(xg.t(), s, fp8_dtype).contiguous()
        out.append(res)
    return out


def fp8_dequantize(
    data: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``f32(float32(data) * scale_inv)`` cast to ``out_dtype``."""
    return (data.to(_F32) * torch.as_tensor(scale_inv, device=data.device).to(_F32)).to(out_dtype)
