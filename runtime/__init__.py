"""cutequant: grouped NVFP4 / FP8 quantization kernels for MoE training (CuTe DSL, Hopper)."""

from cutequant.amax import group_amax
from cutequant.nvfp4 import Nvfp4GroupedTensor, nvfp4_group_quantize

__all__ = ["Nvfp4GroupedTensor", "group_amax", "nvfp4_group_quantize"]
