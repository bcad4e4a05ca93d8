"""CPU: bad arguments of the recipe ops raise TypeError / ValueError naming the argument,
before anything is launched (the device check comes last, so CPU tensors reach every rule)."""

import pytest
import torch

import cutequant
from cutequant import dequant

N = 64


def _nvfp4_args(**over):
    splits = (32, 0, 16)
    args = dict(
        data=torch.zeros(48, N // 2, dtype=torch.uint8),
        scales=torch.zeros(256, 4, dtype=torch.uint8),
        amax=torch.ones(3),
        splits=splits,
        n_cols=N,
        columnwise=False,
        swizzled=False,
        undo_rht=False,
        sign_mask=0,
        out_dtype=torch.bfloat16,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, exc, words",
    [
        (dict(data=torch.zeros(48, N // 2, dtype=torch.int8)), TypeError, "data"),
        (dict(data=torch.zeros(48, N, dtype=torch.uint8)), ValueError, "data"),
        (dict(data=torch.zeros(N // 2, 48, dtype=torch.uint8).t()), ValueError, "contiguous"),
        (dict(n_cols=40), ValueError, "n_cols"),
        (dict(n_cols=64.0), TypeError, "n_cols"),
        (dict(undo_rht=True), ValueError, "undo_rht"),
        (dict(columnwise=1), TypeError, "columnwise"),
        (dict(sign_mask=1 << 16), ValueError, "sign_mask"),
        (dict(out_dtype=torch.int32), TypeError, "out_dtype"),
        (dict(amax=torch.ones(2)), ValueError, "amax"),
        (dict(amax=torch.ones(3, dtype=torch.float64)), TypeError, "amax"),
        (dict(scales=torch.zeros(255, 4, dtype=torch.uint8)), ValueError, "scales"),
        (dict(splits=(32, 8, 8)), ValueError, "splits"),
        (dict(splits=(32, 32)), ValueError, "splits"),
        (dict(splits=5), TypeError, "splits"),
        (dict(), ValueError, "CUDA"),
    ],
)
def test_nvfp4_dequantize_errors(over, exc, words):
    with pytest.raises(exc, match=words):
        dequant._check_nvfp4_dequantize(**_nvfp4_args(**over))


def test_nvfp4_columnwise_scale_bound():
    args = _nvfp4_args(
        data=torch.zeros(48 * N // 2, dtype=torch.uint8),
        columnwise=True,
        undo_rht=True,
        scales=torch.zeros(128 * 7, dtype=torch.uint8),  # needs 128 * (4 + 0 + 4)
    )
    with pytest.raises(ValueError, match="scales"):
        dequant._check_nvfp4_dequantize(**args)
    args["scales"] = torch.zeros(128 * 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="CUDA"):  # every host rule passed
        dequant._check_nvfp4_dequantize(**args)


def _fp8_args(**over):
    args = dict(
        data=torch.zeros(48, N, dtype=torch.float8_e4m3fn),
        scale_inv=torch.ones(3),
        splits=(32, 0, 16),
        n_cols=N,
        columnwise=False,
        out_dtype=torch.float32,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, exc, words",
    [
        (dict(data=torch.zeros(48, N, dtype=torch.uint8)), TypeError, "data"),
        (dict(data=torch.zeros(48, N + 16, dtype=torch.float8_e5m2)), ValueError, "data"),
        (dict(columnwise=True), ValueError, "data"),  # columnwise data is flat
        (dict(scale_inv=torch.ones(4)), ValueError, "scale_inv"),
        (dict(out_dtype=torch.float8_e4m3fn), TypeError, "out_dtype"),
        (dict(splits=(16, 16)), ValueError, "splits"),
        (dict(), ValueError, "CUDA"),
    ],
)
def test_fp8_dequantize_errors(over, exc, words):
    with pytest.raises(exc, match=words):
        dequant._check_fp8_dequantize(**_fp8_args(**over))


def test_friendly_wrappers_check_the_result_type():
    with pytest.raises(TypeError, match="result"):
        dequant.nvfp4_group_dequantize(torch.zeros(4))
    with pytest.raises(TypeError, match="result"):
        dequant.fp8_group_dequantize(torch.zeros(4))


def _w(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "weights, opts, exc, words",
    [
        (_w(2, 32, 32), dict(rowwise=False, columnwise=False), ValueError, "nothing"),
        (_w(2, 32, 32), dict(swizzled=1), TypeError, "swizzled"),
        (_w(32, 32), {}, ValueError, "stacked"),
        ([], {}, ValueError, "empty"),
        ("w", {}, TypeError, "weights"),
        ([_w(32, 32), 3], {}, TypeError, r"weights\[1\]"),
        ([_w(32, 32), _w(32, 48)], {}, ValueError, r"weights\[1\]"),
        ([_w(32, 32), _w(32, 32, dtype=torch.float16)], {}, ValueError, r"weights\[1\]"),
        (_w(2, 32, 32, dtype=torch.float64), {}, TypeError, "dtype"),
        (_w(2, 32, 24), {}, ValueError, "multiples of 16"),
        (_w(2, 32, 64)[:, :, :32], {}, ValueError, "contiguous"),
        (_w(2, 32, 32), dict(amax=torch.ones(3)), ValueError, "amax"),
        (_w(2, 32, 32), dict(amax=[1.0, 2.0]), TypeError, "amax"),
        (_w(2, 32, 32), {}, ValueError, "CUDA"),
    ],
)
def test_nvfp4_2d_errors(weights, opts, exc, words):
    from cutequant import nvfp4_2d

    args = dict(rowwise=True, columnwise=True, swizzled=False, amax=None)
    args.update(opts)
    with pytest.raises(exc, match=words):
        nvfp4_2d._check_nvfp4_quantize_2d(weights, **args)


def _fq_args(**over):
    args = dict(
        x=torch.zeros(48, N, dtype=torch.bfloat16),
        splits=(32, 16),
        amax=None,
        stochastic_rounding=False,
        rng_state=None,
        out_dtype=torch.bfloat16,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over, exc, words",
    [
        (dict(x=torch.zeros(48, N, dtype=torch.float32)), TypeError, "x"),
        (dict(x=torch.zeros(48, 40, dtype=torch.bfloat16)), ValueError, "x"),
        (dict(out_dtype=torch.float32), TypeError, "out_dtype"),
        (dict(splits=(32, 32)), ValueError, "splits"),
        (dict(amax=torch.ones(3)), ValueError, "amax"),
        # no state: allowed (the op draws a fresh one), so the device rule is what fails here
        (dict(stochastic_rounding=True), ValueError, "CUDA"),
        (dict(stochastic_rounding=True, rng_state=(1, 2)), TypeError, "rng_state"),
        (dict(stochastic_rounding=True, rng_state=torch.zeros(2)), ValueError, "rng_state"),
        (dict(rng_state=torch.zeros(2, dtype=torch.int64)), ValueError, "rng_state"),
        (dict(stochastic_rounding="yes"), TypeError, "stochastic_rounding"),
        (dict(), ValueError, "CUDA"),
    ],
)
def test_fake_quantize_errors(over, exc, words):
    from cutequant import fake_quant

    with pytest.raises(exc, match=words):
        fake_quant._check_fake_quantize(**_fq_args(**over))


def test_fake_quant_linear_errors():
    from cutequant import fake_quant

    x = torch.zeros(32, N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        fake_quant.nvfp4_fake_quant_linear(x, torch.zeros(16, N, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x"):
        fake_quant.nvfp4_fake_quant_linear(x[:20], torch.zeros(16, N, dtype=torch.bfloat16))


def test_stochastic_rounding_without_a_state_checks_x_first():
    """A call that would draw its own state names a bad x, not the state (no draw happens)."""
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        cutequant.nvfp4_fake_quantize("x", [64], stochastic_rounding=True)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        cutequant.nvfp4_group_quantize("x", [64], stochastic_rounding=True)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        cutequant.nvfp4_fake_quantize(
            torch.zeros(64, N, dtype=torch.bfloat16), [64], stochastic_rounding=True
        )
