"""cutequant: grouped NVFP4 / FP8 quantization kernels for MoE training (CuTe DSL, Hopper)."""

from cutequant import ops  # noqa: F401  (registers the torch.library ops)
from cutequant.amax import group_amax
from cutequant.dequant import fp8_group_dequantize, nvfp4_group_dequantize
from cutequant.fake_quant import nvfp4_fake_quant_linear, nvfp4_fake_quantize
from cutequant.fp8 import Fp8GroupedTensor, fp8_group_quantize
from cutequant.nvfp4 import Nvfp4GroupedTensor, nvfp4_group_quantize
from cutequant.nvfp4_2d import (
    Nvfp4WeightTensor,
    nvfp4_fake_quantize_weights_2d,
    nvfp4_quantize_weights_2d,
)

__all__ = [
    "Fp8GroupedTensor",
    "Nvfp4GroupedTensor",
    "Nvfp4WeightTensor",
    "fp8_group_dequantize",
    "fp8_group_quantize",
    "group_amax",
    "nvfp4_group_dequantize",
    "nvfp4_fake_quant_linear",
    "nvfp4_fake_quantize",
    "nvfp4_fake_quantize_weights_2d",
    "nvfp4_group_quantize",
    "nvfp4_quantize_weights_2d",
]


def __getattr__(name: str):
    # cutequant.reference (the pure-torch oracle) is imported on first use, so that
    # `import cutequant` stays cheap (no reference module, no cutlass).
    if name in ("reference", "recipe_reference"):
        import importlib

        return importlib.import_module(f"cutequant.{name}")
    raise AttributeError(f"module 'cutequant' has no attribute {name!r}")
