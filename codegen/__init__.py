"""Kernel specs and the spec -> template -> module renderer (``cutequant.codegen``)."""

from .render import module_name, render
from .specs import (
    Fp8QuantizeSpec,
    GroupAmaxSpec,
    GroupTablesSpec,
    KernelSpec,
    Nvfp4QuantizeSpec,
    TilePlan,
)

__all__ = [
    "Fp8QuantizeSpec",
    "GroupAmaxSpec",
    "GroupTablesSpec",
    "Nvfp4QuantizeSpec",
    "KernelSpec",
    "TilePlan",
    "module_name",
    "render",
]
