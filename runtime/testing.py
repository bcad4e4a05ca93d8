"""Test and benchmark inputs (``cutequant.testing``): fresh random data, uneven splits, poison."""

from __future__ import annotations

import torch

POISON_BYTE = 0xA5


def random_splits(
    num_groups: int,
    total_rows: int | None,
    gen: torch.Generator,
    *,
    zero_at: tuple[str, ...] = (),
    multiple: int = 16,
    mean_rows: int = 128,
) -> list[int]:
    """Uneven multiples of ``multiple`` (sum ``total_rows`` if given); zero-token groups placed
    at 'front', 'middle', 'end' (or every group with 'all')."""
    if "all" in zero_at:
        return [0] * num_groups
    zeros = set()
    if "front" in zero_at:
        zeros.add(0)
    if "middle" in zero_at:
        zeros.add(num_groups // 2)
    if "end" in zero_at:
        zeros.add(num_groups - 1)
    live = [g for g in range(num_groups) if g not in zeros]
    if total_rows is None:
        units = torch.randint(1, 2 * mean_rows // multiple, (len(live),), generator=gen)
    else:
        assert total_rows % multiple == 0
        w = torch.rand(len(live), generator=gen) + 0.05
        units = (w / w.sum() * (total_rows // multiple)).floor().long()
        units[torch.argmax(w)] += total_rows // multiple - int(units.sum())
    out = [0] * num_groups
    for g, u in zip(live, units.tolist()):
        out[g] = int(u) * multiple
    return out


def grouped_input(splits, n_cols: int, gen: torch.Generator, device="cuda") -> torch.Tensor:
    """bf16 [sum(splits), N]: normal data with a different scale per group plus rare outliers,
    so per-group amaxes differ and blocks span many binades."""
    m = sum(splits)
    g_cuda = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    x = torch.randn(m, n_cols, device=device, generator=g_cuda)
    scales = torch.exp2(torch.randint(-8, 8, (max(len(splits), 1),), generator=gen).float())
    row_scale = torch.repeat_interleave(scales[: len(splits)], torch.tensor(splits)).to(device)
    x = x * row_scale[:, None]
    spikes = torch.rand(m, n_cols, device=device, generator=g_cuda) < 1e-4
    x = torch.where(spikes, x * 64, x)
    return x.to(torch.bfloat16)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill every byte of ``t`` with POISON_BYTE (so an unwritten byte is detectable)."""
    t.view(torch.uint8).fill_(POISON_BYTE)
    return t
