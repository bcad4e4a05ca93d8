"""CPU tests for the stochastic-rounding reference: the Philox4x32-10 stream and TE's SR rule.

Known-answer vectors are Random123's published Philox4x32-10 test vectors; the SR expectations
are derived by hand from docs/numerics.md §1.4 (grid steps 0.5 / 1 / 2, u = byte / 256)."""

from __future__ import annotations

import pytest
import torch

from cutequant import philox
from cutequant import reference as ref

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "ctr,key,expected",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_known_answers(ctr, key, expected):
    out = philox.philox4x32_10(torch.tensor(ctr, dtype=torch.int64), *key)
    assert tuple(int(v) for v in out) == expected


def test_block_random_bytes_layout():
    """Counter = (id lo, id hi | dir << 31, offset lo, offset hi), key = seed; byte i of the
    block is byte i % 4 (little-endian) of word i // 4."""
    seed, offset = 0x0123456789ABCDEF, (5 << 32) | 7
    ids = torch.tensor([[0, 1], [(3 << 32) | 9, 2]], dtype=torch.int64)
    got = philox.block_random_bytes(ids, 1, seed, offset)
    assert got.shape == (2, 2, 16) and got.dtype == torch.uint8
    i = (3 << 32) | 9
    ctr = torch.tensor([i & 0xFFFFFFFF, (i >> 32) | (1 << 31), 7, 5], dtype=torch.int64)
    words = philox.philox4x32_10(ctr, 0x89ABCDEF, 0x01234567)
    want = [(int(words[k // 4]) >> (8 * (k % 4))) & 0xFF for k in range(16)]
    assert got[1, 0].tolist() == want
    assert not torch.equal(got, philox.block_random_bytes(ids, 0, seed, offset))  # direction
    assert not torch.equal(got, philox.block_random_bytes(ids, 1, seed, offset + 1))
    negative = philox.block_random_bytes(ids, 1, seed - (1 << 64), offset)  # two's complement
    assert torch.equal(got, negative)


def _sr(values, byte):
    v = torch.tensor(values, dtype=torch.float32)
    return ref.e2m1_encode_sr(v, torch.full(v.shape, byte, dtype=torch.uint8)).tolist()


def test_sr_grid_points_never_move():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    for byte in (0, 1, 128, 255):
        assert _sr(grid, byte) == list(range(8))
        assert _sr([-g for g in grid], byte) == [8 + c for c in range(8)]  # -0 keeps its sign


def test_sr_thresholds_by_hand():
    # 0.75 = 0.5 + 0.5 * 0.5: rounds up once u >= 0.5, i.e. byte >= 128
    assert _sr([0.75], 127) == [1] and _sr([0.75], 128) == [2]
    # 2.25 = 2 + 0.25 * 1 (step 1 in [2, 4)): up iff u >= 0.75, byte >= 192 -> 3.0 (code 5)
    assert _sr([2.25], 191) == [4] and _sr([2.25], 192) == [5]
    # 5.0 = 4 + 0.5 * 2: up iff u >= 0.5 -> 6.0 (code 7)
    assert _sr([5.0], 127) == [6] and _sr([5.0], 128) == [7]
    # 1.9 with step 0.5: frac 0.8 -> up iff u >= 0.2 (t crosses into step 1 at 2.0): byte >= 52
    assert _sr([1.9], 51) == [3] and _sr([1.9], 52) == [4]
    # beyond 6, inf, NaN: +-6 (NaN positive)
    assert _sr([7.0, -1e30, INF, -INF, NAN], 200) == [7, 15, 7, 15, 7]
    # below the first grid step: 0.1 = 0.2 * 0.5 -> up iff u >= 0.8 (byte >= 205)
    assert _sr([0.1], 204) == [0] and _sr([-0.1], 205) == [9]


def test_sr_is_unbiased_over_all_bytes():
    """Averaged over the 256 byte values the rounded value is within step / 256 of the input."""
    v = torch.rand(4096, generator=torch.Generator().manual_seed(3)) * 6.5 - 0.25
    v = v.to(torch.float32)
    bytes_ = torch.arange(256, dtype=torch.uint8)
    codes = ref.e2m1_encode_sr(v[:, None].expand(-1, 256), bytes_[None, :].expand(4096, -1))
    mean = ref.e2m1_decode(codes).mean(dim=1)
    a = v.abs().clamp(max=6.0)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    err = (mean - v.clamp(-6, 6)).abs()
    assert bool((err <= step / 256 + 1e-6).all()), float((err - step / 256).max())


def test_group_quantize_sr_reproducible_and_seeded():
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(96, 64, generator=gen) * 3).to(torch.bfloat16)
    splits = [32, 0, 64]
    kw = dict(rht=True, stochastic_rounding=True)
    a = ref.nvfp4_group_quantize(x, splits, rng_state=(11, 0), **kw)
    b = ref.nvfp4_group_quantize(x, splits, rng_state=(11, 0), **kw)
    c = ref.nvfp4_group_quantize(x, splits, rng_state=(12, 0), **kw)
    rn = ref.nvfp4_group_quantize(x, splits, rht=True)
    for key in ("row_data", "col_data"):
        assert torch.equal(a[2][key], b[2][key])
        assert not torch.equal(a[2][key], c[2][key])
    for key in ("row_scales", "col_scales", "amax_row", "amax_col"):  # SR leaves them alone
        assert torch.equal(a[2][key], rn[2][key])
