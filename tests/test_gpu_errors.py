"""GPU: the device-dependent argument errors (raised before any launch)."""

import pytest
import torch

import cutequant

pytestmark = pytest.mark.gpu


def test_device_dependent_errors():
    base = torch.zeros(64 * 128 + 8, dtype=torch.bfloat16, device="cuda")
    misaligned = base[4 : 4 + 64 * 128].view(64, 128)
    with pytest.raises(ValueError, match="x: data pointer must be 16-byte aligned"):
        cutequant.nvfp4_group_quantize(misaligned, [64])
    x = torch.zeros(64, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="amax: on cpu"):
        cutequant.nvfp4_group_quantize(x, [64], amax=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="scale: must be on x's device"):
        cutequant.fp8_group_quantize(x, [64], scaling="delayed", scale=torch.ones(1))
    with pytest.raises(TypeError, match="splits: a device tensor must be int32 or int64"):
        cutequant.group_amax(x, torch.tensor([64.0], device="cuda"))


def test_bad_device_splits_write_nan_amax_and_no_data():
    x = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    bad = torch.tensor([64, 48], dtype=torch.int32, device="cuda")  # sums to 112, not 128
    res = cutequant.nvfp4_group_quantize(x, bad)
    torch.cuda.synchronize()
    assert torch.isnan(res.amax_row).all() and torch.isnan(res.amax_col).all()
    with pytest.raises(ValueError, match="device-side check failed"):
        res._layout.check()
    fp8 = cutequant.fp8_group_quantize(x, bad)
    torch.cuda.synchronize()
    assert torch.isnan(fp8.amax).all()
