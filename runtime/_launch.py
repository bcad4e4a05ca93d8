"""Thin launch layer: device facts, argument conversion, kernel invocation."""

from __future__ import annotations

import functools

import torch

from cutequant import jit

_DTYPES = {}


def _cutlass_dtype(dtype: torch.dtype):
    if not _DTYPES:
        import cutlass

        _DTYPES.update(
            {
                torch.bfloat16: cutlass.BFloat16,
                torch.float16: cutlass.Float16,
                torch.float32: cutlass.Float32,
                torch.int32: cutlass.Int32,
                torch.int64: cutlass.Int64,
                torch.uint8: cutlass.Uint8,
                torch.float8_e4m3fn: cutlass.Float8E4M3FN,
                torch.float8_e5m2: cutlass.Float8E5M2,
            }
        )
    return _DTYPES[dtype]


@functools.lru_cache(maxsize=None)
def _arch_of(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    if major != 9:
        raise RuntimeError(
            f"cutequant kernels need a Hopper GPU (sm_90); cuda:{index} is sm_{major}{minor}"
        )
    return "sm_90a"


def device_arch(device: torch.device) -> str:
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def ptr(t: torch.Tensor, align: int = 16):
    """A typed global-memory pointer to ``t``'s data (alignment is checked by the caller)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(_cutlass_dtype(t.dtype), t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def run(spec, *args, stream: torch.cuda.Stream):
    """Launch ``spec``'s kernel on ``stream`` (ints become Int32, floats Float32 arguments)."""
    import cuda.bindings.driver as cuda
    from cutlass import Float32, Int32

    fn = jit.get_kernel(spec)
    conv = [
        Int32(a) if isinstance(a, int) else Float32(a) if isinstance(a, float) else a for a in args
    ]
    fn(*conv, cuda.CUstream(stream.cuda_stream))


def _empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


# How the public ops allocate their outputs; tests swap in a poisoning allocator
# (cutequant.testing.poisoned_outputs) so that every byte a kernel must write is checked.
output_allocator = _empty
