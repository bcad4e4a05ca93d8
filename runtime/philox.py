"""Philox4x32-10 in plain torch (CPU or GPU): the reference for the random bits of NVFP4
stochastic rounding (``cutequant.kernels.stochastic`` defines the stream; this reproduces it).

All arithmetic is on int64 tensors holding unsigned 32-bit values, so it is exact on any device.
"""

from __future__ import annotations

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
_MASK = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of a * b (a: a 32-bit constant, b: int64 tensor of u32)."""
    p_lo = (a & 0xFFFF) * b  # < 2^48
    p_hi = (a >> 16) * b  # < 2^48
    low = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2^49
    return (p_hi >> 16) + (low >> 32), low & _MASK


def philox4x32_10(ctr: torch.Tensor, k0: int, k1: int) -> torch.Tensor:
    """``ctr``: int64 [..., 4] of u32 words; returns the four output words (int64 [..., 4])."""
    c = [ctr[..., i] for i in range(4)]
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & _MASK, (k1 + W1) & _MASK
        hi0, lo0 = _mulhilo(M0, c[0])
        hi1, lo1 = _mulhilo(M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return torch.stack(c, dim=-1)


def block_random_bytes(
    block_ids: torch.Tensor, direction: int, seed: int, offset: int
) -> torch.Tensor:
    """uint8 [..., 16]: the random byte of each element of the 16-element blocks ``block_ids``
    (int64, any shape) of one direction (0 rowwise, 1 columnwise), for ``(seed, offset)`` as
    given in ``rng_state`` (int64 values, taken as 64-bit two's complement)."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    ids = block_ids.to(torch.int64)
    ctr = torch.stack(
        [
            ids & _MASK,
            (ids >> 32) | (direction << 31),
            torch.full_like(ids, offset & _MASK),
            torch.full_like(ids, offset >> 32),
        ],
        dim=-1,
    )
    words = philox4x32_10(ctr, seed & _MASK, seed >> 32)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=ids.device)
    return ((words[..., :, None] >> shifts) & 0xFF).reshape(*ids.shape, 16).to(torch.uint8)
