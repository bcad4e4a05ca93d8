"""cutequant: grouped NVFP4 / FP8 quantization kernels for MoE training (CuTe DSL, Hopper)."""

from cutequant.amax import group_amax

__all__ = ["group_amax"]
