"""CPU: bad input gets a clear error naming the argument, before any launch.

These run without a GPU: every check except the device itself is host-side and comes first.
(tests/test_gpu_errors.py covers the device-dependent ones.)"""

import pytest
import torch

import cutequant

BF16 = torch.bfloat16


def x_of(m=64, n=128, dtype=BF16):
    return torch.zeros(m, n, dtype=dtype)


OPS = {
    "group_amax": lambda x, s, **kw: cutequant.group_amax(x, s, **kw),
    "nvfp4": lambda x, s, **kw: cutequant.nvfp4_group_quantize(x, s, **kw),
    "fp8": lambda x, s, **kw: cutequant.fp8_group_quantize(x, s, **kw),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "x,splits,exc,match",
    [
        ("not a tensor", [64], TypeError, "x: expected a torch.Tensor"),
        (torch.zeros(64, dtype=BF16), [64], ValueError, "x: expected a 2-D"),
        (torch.zeros(64, 128, dtype=torch.int8), [64], TypeError, "x: dtype"),
        (x_of(64, 24), [64], ValueError, "x: N = x.shape\\[1\\] = 24"),
        (x_of(64, 0), [64], ValueError, "positive multiple of 16"),
        (x_of(128, 64).t(), [64], ValueError, "x: must be contiguous"),
        (x_of(), [48, 20], ValueError, "splits\\[1\\] = 20 is not a multiple of 16"),
        (x_of(), [80, -16], ValueError, "splits\\[1\\] = -16 is negative"),
        (x_of(), [32, 16], ValueError, "splits sum to 48 but x has 64 rows"),
        (x_of(), [], ValueError, "splits: need at least one group"),
        (x_of(), 64, TypeError, "splits: expected a sequence"),
        (x_of(), [64.0], TypeError, "splits\\[0\\] = 64.0 is not an int"),
        (x_of(), [64], ValueError, "x: must be a CUDA tensor"),
    ],
)
def test_bad_x_and_splits(op, x, splits, exc, match):
    with pytest.raises(exc, match=match):
        OPS[op](x, splits)


def test_flags_and_options():
    x = x_of()
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        cutequant.nvfp4_group_quantize(x, [64], rowwise=False, columnwise=False)
    with pytest.raises(TypeError, match="swizzled_scales: expected a bool"):
        cutequant.nvfp4_group_quantize(x, [64], swizzled_scales=1)
    with pytest.raises(ValueError, match="sign_mask: must be a 16-bit mask"):
        cutequant.nvfp4_group_quantize(x, [64], sign_mask=0x1FFFF)
    with pytest.raises(TypeError, match="sign_mask: expected an int"):
        cutequant.group_amax(x, [64], sign_mask=1.5)
    with pytest.raises(TypeError, match="x: the RHT amax needs torch.bfloat16"):
        cutequant.group_amax(x_of(dtype=torch.float16), [64], rht=True)
    with pytest.raises(TypeError, match="x: dtype"):
        cutequant.nvfp4_group_quantize(x_of(dtype=torch.float32), [64])


def test_amax_argument():
    x = x_of()
    with pytest.raises(ValueError, match="amax: expected shape \\(2, 2\\)"):
        cutequant.nvfp4_group_quantize(x, [32, 32], amax=torch.zeros(2, 3))
    with pytest.raises(TypeError, match="amax: must be float32"):
        cutequant.nvfp4_group_quantize(x, [32, 32], amax=torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="amax\\[1\\]: expected a tensor"):
        cutequant.nvfp4_group_quantize(x, [64], amax=(torch.zeros(1), 3.0))
    with pytest.raises(ValueError, match="amax: expected"):
        cutequant.nvfp4_group_quantize(x, [64], amax=(torch.zeros(1),))


def test_fp8_options():
    x = x_of()
    with pytest.raises(TypeError, match="fp8_dtype"):
        cutequant.fp8_group_quantize(x, [64], fp8_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="scaling: must be 'current' or 'delayed'"):
        cutequant.fp8_group_quantize(x, [64], scaling="just-in-time")
    with pytest.raises(ValueError, match="scale: required with scaling='delayed'"):
        cutequant.fp8_group_quantize(x, [64], scaling="delayed")
    with pytest.raises(ValueError, match="scale: expected shape \\(2,\\)"):
        cutequant.fp8_group_quantize(x, [32, 32], scaling="delayed", scale=torch.ones(3))
    with pytest.raises(TypeError, match="scale: must be float32"):
        cutequant.fp8_group_quantize(x, [64], scaling="delayed", scale=torch.ones(1, dtype=BF16))
    with pytest.raises(ValueError, match="scale: only used with scaling='delayed'"):
        cutequant.fp8_group_quantize(x, [64], scale=torch.ones(1))
    with pytest.raises(ValueError, match="amax_epsilon: must be >= 0"):
        cutequant.fp8_group_quantize(x, [64], amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="rowwise and columnwise are both False"):
        cutequant.fp8_group_quantize(x, [64], rowwise=False, columnwise=False)


def test_stochastic_rounding_arguments():
    x = x_of()
    with pytest.raises(TypeError, match="stochastic_rounding"):
        cutequant.nvfp4_group_quantize(x, [64], stochastic_rounding=1)
    with pytest.raises(ValueError, match="rng_state: only used with stochastic_rounding=True"):
        cutequant.nvfp4_group_quantize(x, [64], rng_state=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="rng_state: expected a tensor"):
        cutequant.nvfp4_group_quantize(x, [64], stochastic_rounding=True, rng_state=(1, 2))
    with pytest.raises(ValueError, match="rng_state: must be int64 of shape \\(2,\\)"):
        cutequant.nvfp4_group_quantize(
            x, [64], stochastic_rounding=True, rng_state=torch.zeros(3, dtype=torch.int64)
        )
    with pytest.raises(ValueError, match="rng_state: must be int64"):
        cutequant.nvfp4_group_quantize(x, [64], stochastic_rounding=True, rng_state=torch.zeros(2))


def test_amax_estimation_scale_arguments():
    x = x_of()
    with pytest.raises(TypeError, match="amax_estimation_scale: expected a float"):
        cutequant.nvfp4_group_quantize(x, [64], amax_estimation_scale="2")
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="amax_estimation_scale: must be positive and finite"):
            cutequant.nvfp4_group_quantize(x, [64], amax_estimation_scale=bad)
    with pytest.raises(ValueError, match="amax_estimation_scale: not with a given amax"):
        cutequant.nvfp4_group_quantize(x, [64], amax=torch.zeros(2, 1), amax_estimation_scale=2.0)
    with pytest.raises(ValueError, match="columnwise=False"):
        cutequant.nvfp4_group_quantize(
            x, [64], columnwise=False, rht=False, amax_estimation_scale=2.0
        )
