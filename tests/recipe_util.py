"""Helpers of the recipe tests (dequantize, 2D quantize, fake-quant): bitwise comparison and
random grouped NVFP4 / FP8 buffers in the kernels' layouts."""

from __future__ import annotations

import torch

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def assert_same_bits(got: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Equal bit patterns except that any NaN matches any NaN (the kernels write the canonical
    NaN, torch keeps payloads); shapes and dtypes must agree."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert got.dtype == ref.dtype, (what, got.dtype, ref.dtype)
    got, ref = got.detach().cpu(), ref.detach().cpu()
    if got.dtype in _INT_VIEW:
        nan_g, nan_r = torch.isnan(got), torch.isnan(ref)
        assert torch.equal(nan_g, nan_r), f"{what}: NaN positions differ"
        a = got.view(_INT_VIEW[got.dtype])[~nan_r]
        b = ref.view(_INT_VIEW[ref.dtype])[~nan_r]
    else:
        a, b = got.reshape(-1), ref.reshape(-1)
    bad = (a != b).nonzero()
    if len(bad):
        i = int(bad[0])
        raise AssertionError(
            f"{what}: {len(bad)} of {a.numel()} values differ; first at {i}: "
            f"got {int(a[i]):#x} ref {int(b[i]):#x}"
        )


def nvfp4_scale_bytes(splits, n: int, columnwise: bool, device_bound: bool = False) -> int:
    """Bytes of a grouped NVFP4 scale buffer: exact, or the device-split upper bound."""
    m, g = sum(splits), len(splits)
    if columnwise:
        cols = m // 16 + 3 * g if device_bound else sum(_round_up(s // 16, 4) for s in splits)
        return _round_up(n, 128) * cols
    rows = m + 127 * g if device_bound else sum(_round_up(s, 128) for s in splits)
    return rows * _round_up(n // 16, 4)


def random_nvfp4_buffers(splits, n: int, gen, *, columnwise: bool, device_bound=False):
    """(data, scales, amax) of random bytes in the grouped layouts: every e2m1 code and every
    e4m3 scale byte (NaN codes included) occurs; amax per group spans many binades."""
    m = sum(splits)
    data = torch.randint(0, 256, (m * n // 2,), generator=gen, dtype=torch.int64).to(torch.uint8)
    if not columnwise:
        data = data.view(m, n // 2)
    nbytes = nvfp4_scale_bytes(splits, n, columnwise, device_bound)
    scales = torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.int64).to(torch.uint8)
    if not columnwise:
        cp = _round_up(n // 16, 4)
        scales = scales.view(nbytes // cp, cp)
    amax = torch.exp2(torch.randint(-60, 60, (len(splits),), generator=gen).float())
    amax = amax * (1 + torch.rand(len(splits), generator=gen))
    return data, scales, amax


def random_fp8_bytes(numel: int, gen, dtype: torch.dtype) -> torch.Tensor:
    """Every byte value, NaN and inf codes included."""
    raw = torch.randint(0, 256, (numel,), generator=gen, dtype=torch.int64).to(torch.uint8)
    return raw.view(dtype)


def grouped_buffer(per_group: list[dict], key: str) -> torch.Tensor:
    """The grouped buffer of ``key`` (groups' blocks one after the other, flat) from the
    per-group dicts of ``cutequant.reference`` / ``recipe_reference``."""
    return torch.cat([d[key].reshape(-1) for d in per_group])
