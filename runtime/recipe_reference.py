"""Pure-torch reference (CPU-capable) of the rest of the NVFP4 training recipe: grouped
dequantize (NVFP4 rowwise / columnwise with or without the inverse RHT, FP8 rowwise /
transposed), 2D 16x16 NVFP4 quantization of weights (te_semantics.md section 2) and fused
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
