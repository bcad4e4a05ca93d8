"""Argument checks shared by the public ops: each error names the argument and the rule,
and is raised before anything is launched or written."""

from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1


def check_x(
    x, *, dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,), name: str = "x"
) -> tuple[int, int]:
    """``x`` is a contiguous 2-D tensor [rows, N] of an allowed dtype with N % 16 == 0.
    (Host-side checks only: the device comes last, in ``check_device``, so that every argument
    error is reported the same way with or without a GPU.)"""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"{name}: expected a 2-D [sum(splits), N] tensor, got shape {tuple(x.shape)}"
        )
    if x.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: dtype must be one of ({allowed}), got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (row-major); call .contiguous() first")
    m, n = x.shape
    if n == 0 or n % 16:
        raise ValueError(f"{name}: N = x.shape[1] = {n} must be a positive multiple of 16")
    if not fits_32bit_tiles(m, n):
        raise ValueError(f"{name}: shape {tuple(x.shape)} is too large for 32-bit tile indexing")
    return m, n


def fits_32bit_tiles(m: int, n: int) -> bool:
    """Whether an [m, n] input is within the grouped kernels' 32-bit tile indexing."""
    return m * n <= INT32_MAX * 16 and m <= INT32_MAX // 2


def check_device(x: torch.Tensor, name: str = "x") -> str:
    """``x`` lives on a supported GPU (``_launch.CAPABILITY_ARCHS``) with a 16-byte-aligned data
    pointer; returns its arch."""
    from cutequant import _launch

    if not x.is_cuda:
        raise ValueError(f"{name}: must be a CUDA tensor, got device {x.device}")
    if x.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")
    return _launch.device_arch(x.device)


def check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_sign_mask(sign_mask) -> int:
    if isinstance(sign_mask, bool) or not isinstance(sign_mask, int):
        raise TypeError(f"sign_mask: expected an int, got {type(sign_mask).__name__}")
    if not 0 <= sign_mask <= 0xFFFF:
        raise ValueError(f"sign_mask: must be a 16-bit mask in [0, 0xFFFF], got {sign_mask:#x}")
    return sign_mask


def check_amax_vector(amax, count: int, what: str = "amax") -> None:
    """A given per-group (or per-expert) amax: an fp32 tensor of shape (count,)."""
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(amax).__name__}")
    if amax.dtype != torch.float32 or tuple(amax.shape) != (count,):
        raise ValueError(
            f"{what}: must be float32 of shape ({count},), got {amax.dtype} {tuple(amax.shape)}"
        )


def plain_int_splits(splits) -> bool:
    """Whether a host split list holds only ``int`` (no float, bool, numpy scalar) -- checked
    before the cache lookup, because 1024.0 and False hash like 1024 and 0. ``sum`` is an int
    only if no float or numpy scalar is present (1.8 us for 256 groups vs 11 us for a Python
    loop over the types); a bool can only equal a valid split where it is ``False`` == 0, so
    lists with a zero get the full check."""
    if type(sum(splits)) is not int:
        return False
    return 0 not in splits or all(type(v) is int for v in splits)
