"""Pure-torch reference (CPU-capable) of the rest of the NVFP4 training recipe: grouped
dequantize (NVFP4 rowwise / columnwise with or without the inverse RHT, FP8 rowwise /
transposed), 2D 16x16 NVFP4 quantization of weights (docs/numerics.md §2) and fused
fake-quant. The oracle of the dequantize, 2D-quantize and fake-quant kernels; built on the
primitives of ``cutequant.reference`` (kept in their own module so that both stay readable).

Buffers are the grouped layouts the kernels read and write (``cutequant.nvfp4``): rowwise data
[M, N/2], rowwise scales [sum_g roundup(M_g, 128), roundup(N/16, 4)] (group blocks one after the
other, each flat-swizzled when ``swizzled``), columnwise data flat (group g a [N, M_g/2] block),
columnwise scales flat (group g a [roundup(N, 128), roundup(M_g/16, 4)] block).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cutequant import reference as R

_F32 = torch.float32
_QUARTER = 0.25


def _roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def _splits(splits) -> list[int]:
    return [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]


# --------------------------------------------------------------------------- inverse RHT


def inverse_rht_exact(y_t: torch.Tensor, sign_mask: int = R.DEFAULT_SIGN_MASK) -> torch.Tensor:
    """Inverse of ``reference.rht_along_tokens`` in the fixed fp32 order of the dequantize
    kernels: ``y_t`` [N, M] (fp32) -> fp32 [M, N].

    Per 16-token block y (a row piece of ``y_t``): a fast Walsh-Hadamard transform, butterfly
    stages over index bits 0, 1, 2, 3 in that order, each ``a + b`` and ``a - b`` one fp32
    rounding, gives ``(H16 y)_i``; then ``x_i = f32((H16 y)_i * s_i * 0.25)`` with ``s_i = -1``
    iff bit i of ``sign_mask`` (R = diag(s) H16 / 4 is orthogonal, so x = y R^T)."""
    n, m = y_t.shape
    if m % 16:
        raise ValueError(f"token count {m} must be a multiple of 16")
    v = y_t.to(_F32).reshape(n, m // 16, 16)
    for b in range(4):
        w = v.reshape(n, m // 16, 16 >> (b + 1), 2, 1 << b)
        a, c = w[..., 0, :], w[..., 1, :]
        v = torch.stack([a + c, a - c], dim=-2).reshape(n, m // 16, 16)
    i = torch.arange(16, device=y_t.device)
    mult = torch.where((sign_mask >> i) & 1 == 1, -_QUARTER, _QUARTER).to(_F32)
    return (v * mult).reshape(n, m).t().contiguous()


# --------------------------------------------------------------------------- dequantize


def nvfp4_group_dequantize(
    data: torch.Tensor,
    scales: torch.Tensor,
    amax: torch.Tensor,
    splits: Sequence[int],
    n_cols: int,
    *,
    columnwise: bool = False,
    swizzled: bool = False,
    undo_rht: bool = False,
    sign_mask: int = R.DEFAULT_SIGN_MASK,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """[M, N] ``out_dtype`` from grouped NVFP4 buffers (layouts in the module docstring).

    Each value is ``f32(f32(e2m1 * sf) * S_dec[g])`` (``reference.nvfp4_dequantize``), cast to
    ``out_dtype`` (RNE). Columnwise: group g's [N, M_g] values transposed back, or with
    ``undo_rht`` passed through :func:`inverse_rht_exact` first (fp32), then cast. ``amax``:
    fp32 [G], the amax of the direction read. 2D-scaled data has the same layouts."""
    splits = _splits(splits)
    m = sum(splits)
    n = n_cols
    nb = n // 16
    amax = amax.reshape(-1).to(_F32)
    out = torch.empty((m, n), dtype=out_dtype, device=data.device)
    flat_data = data.reshape(-1)
    flat_scales = scales.reshape(-1)
    row0 = rs0 = cs0 = 0
    np_ = _roundup(n, 128)
    for g, m_g in enumerate(splits):
        if not columnwise:
            rp, cp = _roundup(m_g, 128), _roundup(nb, 4)
            blk = flat_scales[rs0 * cp : (rs0 + rp) * cp]
            d = flat_data[row0 * n // 2 : (row0 + m_g) * n // 2].reshape(m_g, n // 2)
            if m_g:
                sc = blk if swizzled else blk.reshape(rp, cp)
                y = R.nvfp4_dequantize(d, sc, amax[g], shape=(m_g, n), swizzled=swizzled)
                out[row0 : row0 + m_g] = y.to(out_dtype)
            rs0 += rp
        else:
            cg = _roundup(m_g // 16, 4)
            blk = flat_scales[np_ * cs0 : np_ * (cs0 + cg)]
            d = flat_data[row0 * n // 2 : (row0 + m_g) * n // 2].reshape(n, m_g // 2)
            if m_g:
                sc = blk if swizzled else blk.reshape(np_, cg)
                y = R.nvfp4_dequantize(d, sc, amax[g], shape=(n, m_g), swizzled=swizzled)
                y = inverse_rht_exact(y, sign_mask) if undo_rht else y.t()
                out[row0 : row0 + m_g] = y.to(out_dtype)
            cs0 += cg
        row0 += m_g
    return out


def fp8_group_dequantize(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    splits: Sequence[int],
    n_cols: int,
    *,
    columnwise: bool = False,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """[M, N] ``out_dtype``: ``f32(f32(fp8) * scale_inv[g])`` of rowwise [M, N] data, or of the
    per-group transposed blocks ([N, M_g] each, flat) transposed back."""
    splits = _splits(splits)
    n = n_cols
    flat = data.reshape(-1)
    scale_inv = scale_inv.reshape(-1).to(_F32)
    out = torch.empty((sum(splits), n), dtype=out_dtype, device=data.device)
    row0 = 0
    for g, m_g in enumerate(splits):
        d = flat[row0 * n : (row0 + m_g) * n]
        d = d.reshape(n, m_g).t() if columnwise else d.reshape(m_g, n)
        out[row0 : row0 + m_g] = (d.to(_F32) * scale_inv[g]).to(out_dtype)
        row0 += m_g
    return out


# --------------------------------------------------------------------------- 2D quantize


def nvfp4_quantize_2d(
    w: torch.Tensor, amax, *, swizzled: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """docs/numerics.md §2: 16x16-block NVFP4 of one matrix ``w`` [R, C] (R, C % 16 ==
    0; bf16 / f16 / fp32, fp32 not pre-rounded) with the global amax ``amax``.

    ``block_amax`` = max |w| over each 16x16 block (NaN propagates), then the 1D formulas of
    ``reference.nvfp4_quantize_rows`` per block: sf = e4m3(fmin(block_amax * f32(S_enc *
    f32(1/6)), FLT_MAX)), enc = fmin(f32(1 / f32(sf * S_dec)), FLT_MAX), q = e2m1(f32(w * enc)).
    Returns (row_data uint8 [R, C/2], row_scales [roundup(R, 128), roundup(C/16, 4)],
    col_data uint8 [C, R/2] = the nibble transpose, col_scales [roundup(C, 128),
    roundup(R/16, 4)]); scale padding zero, scales flat-swizzled when ``swizzled``."""
    rows, cols = w.shape
    if rows % 16 or cols % 16:
        raise ValueError(f"shape {tuple(w.shape)}: both dimensions must be multiples of 16")
    dev = w.device
    s_enc = R.global_encode_scale(R._scalar_amax(amax, dev))
    s_dec = R.global_decode_scale(s_enc)
    flt_max = R._f32(R.FLT_MAX, dev)
    vf = w.to(_F32)
    blocks = vf.reshape(rows // 16, 16, cols // 16, 16)
    if vf.numel():
        block_amax = blocks.abs().amax(dim=(1, 3))  # NaN propagates
    else:
        block_amax = torch.zeros((rows // 16, cols // 16), dtype=_F32, device=dev)
    sf = R.e4m3_rne_satfinite(torch.fmin(block_amax * (s_enc * R._f32(1.0 / 6.0, dev)), flt_max))
    enc = torch.fmin(R._f32(1.0, dev) / (R.e4m3_to_float(sf) * s_dec), flt_max)
    codes = R.e2m1_encode(blocks * enc[:, None, :, None]).reshape(rows, cols)
    row_scales = torch.zeros(
        (_roundup(rows, 128), _roundup(cols // 16, 4)), dtype=torch.uint8, device=dev
    )
    row_scales[:rows, : cols // 16] = sf.repeat_interleave(16, dim=0)
    col_scales = torch.zeros(
        (_roundup(cols, 128), _roundup(rows // 16, 4)), dtype=torch.uint8, device=dev
    )
    col_scales[:cols, : rows // 16] = sf.t().repeat_interleave(16, dim=0)
    if swizzled:
        row_scales, col_scales = R.swizzle_scales(row_scales), R.swizzle_scales(col_scales)
    return R.pack_fp4(codes), row_scales, R.pack_fp4(codes.t().contiguous()), col_scales


def nvfp4_quantize_2d_experts(
    weights, *, swizzled: bool = False, amax: torch.Tensor | None = None
) -> dict:
    """2D NVFP4 of E same-shaped experts (a stacked [E, R, C] tensor or a list of [R, C]).
    ``amax``: fp32 [E] to use, else max |w_e| (NaN propagates; 0 for an empty matrix), the
    global amax of both directions (no RHT: TE's columnwise amax equals the rowwise one).
    Returns a dict of stacked tensors: row_data [E, R, C/2], row_scales [E, roundup(R, 128),
    roundup(C/16, 4)] (each expert's block flat-swizzled when ``swizzled``: [E, Rp * Cp]),
    col_data [E, C, R/2], col_scales [E, roundup(C, 128), roundup(R/16, 4)] (or [E, Np * Mp]),
    amax [E]."""
    ws = list(weights.unbind(0)) if isinstance(weights, torch.Tensor) else list(weights)
    if amax is None:
        amax = torch.stack([R._abs_max(w) for w in ws]) if ws else torch.zeros(0)
    parts = [nvfp4_quantize_2d(w, amax[e], swizzled=swizzled) for e, w in enumerate(ws)]
    keys = ("row_data", "row_scales", "col_data", "col_scales")
    out = {k: torch.stack([p[i] for p in parts]) for i, k in enumerate(keys)}
    out["amax"] = amax.to(_F32).reshape(-1)
    return out


# --------------------------------------------------------------------------- fake-quant


def nvfp4_fake_quantize_rows(
    x: torch.Tensor,
    splits: Sequence[int],
    amax_row: torch.Tensor,
    *,
    rng_state=None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Rowwise fake-quant (activations; gradients with ``rng_state`` = stochastic rounding):
    by definition ``nvfp4_group_dequantize(nvfp4_group_quantize(x))`` of the rowwise data with
    the groups' rowwise amax ``amax_row`` [G]; [M, N] ``out_dtype``."""
    splits = _splits(splits)
    amax_row = amax_row.reshape(-1).to(_F32)
    q = R.nvfp4_group_quantize(
        x,
        splits,
        columnwise=False,
        rht=False,
        amax=(amax_row, amax_row),
        stochastic_rounding=rng_state is not None,
        rng_state=rng_state,
    )
    data = torch.cat([d["row_data"].reshape(-1) for d in q]).view(-1, x.shape[1] // 2)
    scales = torch.cat([d["row_scales"].reshape(-1) for d in q])
    return nvfp4_group_dequantize(data, scales, amax_row, splits, x.shape[1], out_dtype=out_dtype)


def nvfp4_fake_quantize_columnwise(
    x: torch.Tensor,
    splits: Sequence[int],
    amax_col: torch.Tensor,
    *,
    rht: bool = True,
    sign_mask: int = R.DEFAULT_SIGN_MASK,
    rng_state=None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Columnwise fake-quant as the wgrad GEMM consumes it: group g's dequantized columnwise
    data [N, M_g] (in the RHT domain with ``rht``), the groups' blocks one after the other,
    flat [M * N] ``out_dtype``. ``amax_col`` [G]: the columnwise (post-RHT) amax."""
    splits = _splits(splits)
    n = x.shape[1]
    amax_col = amax_col.reshape(-1).to(_F32)
    q = R.nvfp4_group_quantize(
        x,
        splits,
        rowwise=False,
        rht=rht,
        sign_mask=sign_mask,
        amax=(amax_col, amax_col),
        stochastic_rounding=rng_state is not None,
        rng_state=rng_state,
    )
    out = []
    for g, m_g in enumerate(splits):
        if m_g:
            y = R.nvfp4_dequantize(
                q[g]["col_data"], q[g]["col_scales"], amax_col[g], shape=(n, m_g)
            )
            out.append(y.to(out_dtype).reshape(-1))
    if not out:
        return torch.empty(0, dtype=out_dtype, device=x.device)
    return torch.cat(out)


def nvfp4_fake_quantize_2d_experts(
    weights, amax: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """2D fake-quant of the experts (weights): ([E, R, C] ``out_dtype``, amax [E]) = the
    dequantized rowwise data of :func:`nvfp4_quantize_2d_experts` (its columnwise data
    dequantizes to the transpose)."""
    q = nvfp4_quantize_2d_experts(weights, amax=amax)
    e, rows, half = q["row_data"].shape
    out = torch.empty((e, rows, 2 * half), dtype=out_dtype, device=q["row_data"].device)
    for i in range(e):
        y = R.nvfp4_dequantize(
            q["row_data"][i], q["row_scales"][i], q["amax"][i], shape=(rows, 2 * half)
        )
        out[i] = y.to(out_dtype)
    return out, q["amax"]
