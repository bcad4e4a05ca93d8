"""Thin launch layer: device facts, argument conversion, kernel invocation."""

from __future__ import annotations

import ctypes
import functools
import threading

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


@functools.cache
def _arch_of(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    if major != 9:
        raise RuntimeError(
            f"cutequant kernels need a Hopper GPU (sm_90); cuda:{index} is sm_{major}{minor}"
        )
    return "sm_90a"


def device_arch(device: torch.device) -> str:
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _dram_bytes_per_sm_clock(index: int) -> float | None:
    p = torch.cuda.get_device_properties(index)
    mem_khz = getattr(p, "memory_clock_rate", 0)  # torch >= 2.5 (else None: no opinion)
    bus_bits = getattr(p, "memory_bus_width", 0)
    sm_khz = getattr(p, "clock_rate", 0)
    if not (mem_khz and bus_bits and sm_khz):
        return None
    return 2 * mem_khz * bus_bits / 8 / (p.multi_processor_count * sm_khz)


def dram_bytes_per_sm_clock(device: torch.device) -> float | None:
    """Peak DRAM bytes per SM clock per SM (double data rate x bus width / (SMs x SM clock)):
    how memory-rich a GPU is for its compute. H100 SXM 12.8, H200 18.4 (from the device
    properties); None when torch does not report the memory clock."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _dram_bytes_per_sm_clock(index)


# Between the H100 SXM (12.8) and the H200 (18.4): the kernels' per-GPU choices
# (nvfp4.device_chunk) were measured on those two.
MEMORY_RICH_BYTES_PER_SM_CLOCK = 16.0


def memory_rich(device: torch.device) -> bool | None:
    """Whether the GPU's DRAM gives at least MEMORY_RICH_BYTES_PER_SM_CLOCK bytes per SM clock
    (H200 class: True; H100 class: False); None when torch does not report the memory clock."""
    per_clock = dram_bytes_per_sm_clock(device)
    return None if per_clock is None else per_clock >= MEMORY_RICH_BYTES_PER_SM_CLOCK


class DevPtr:
    """A device address with the element type and alignment a kernel was compiled for."""

    __slots__ = ("addr", "dtype", "align")

    def __init__(self, addr: int, dtype: torch.dtype, align: int):
        if addr % align:
            raise ValueError(f"device pointer {addr:#x} is not {align}-byte aligned")
        self.addr, self.dtype, self.align = addr, dtype, align

    def to_cute(self):
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_ptr

        return make_ptr(
            _cutlass_dtype(self.dtype), self.addr, cute.AddressSpace.gmem, assumed_align=self.align
        )


def ptr(t: torch.Tensor, align: int = 16) -> DevPtr:
    """Typed global-memory pointer to ``t``'s data (must match the kernel's compile_args)."""
    return DevPtr(t.data_ptr(), t.dtype, align)


class _Launcher:
    """Calls a compiled kernel's C entry point with reused ctypes argument slots.

    The DSL's generic call path (argument adapters, type checks, ctypes objects per argument)
    costs ~100 us of CPU per launch; MoE training launches these kernels per layer and step.
    The first call goes through that path and checks that every argument marshals to exactly
    one C pointer; later calls only store the new values into the slots (~10 us).
    """

    def __init__(self, fn):
        self.fn = fn
        self.slots = None
        self.exe_args = None
        self.lock = threading.Lock()

    def _slow(self, args, stream):
        import cuda.bindings.driver as cuda
        from cutlass import Float32, Int32

        conv = []
        kinds = []
        for a in args:
            if isinstance(a, DevPtr):
                conv.append(a.to_cute())
                kinds.append(ctypes.c_void_p)
            elif isinstance(a, bool) or not isinstance(a, (int, float)):
                raise TypeError(f"unsupported kernel argument {a!r}")
            elif isinstance(a, int):
                conv.append(Int32(a))
                kinds.append(ctypes.c_int32)
            else:
                conv.append(Float32(a))
                kinds.append(ctypes.c_float)
        cu_stream = cuda.CUstream(stream.cuda_stream)
        self.fn(*conv, cu_stream)
        exe_args, _ = self.fn.execution_args.generate_execution_args((*conv, cu_stream), {})
        if len(exe_args) == len(args) + 1:
            self.slots = [k() for k in kinds] + [ctypes.c_void_p()]
            self.exe_args = [ctypes.addressof(c) for c in self.slots]
        else:  # unexpected marshalling: keep using the generic path
            self.slots = False

    def __call__(self, args, stream):
        with self.lock:
            if not self.slots:  # first call, or a signature the fast path does not cover
                return self._slow(args, stream)
            slots = self.slots
            for slot, a in zip(slots[:-1], args, strict=True):
                slot.value = a.addr if isinstance(a, DevPtr) else a
            slots[-1].value = stream.cuda_stream
            self.fn.run_compiled_program(self.exe_args)


_LAUNCHERS: dict = {}


def run(spec, *args, stream: torch.cuda.Stream):
    """Launch ``spec``'s kernel on ``stream``. Arguments: DevPtr, int (Int32), float (Float32)."""
    launcher = _LAUNCHERS.get(spec)
    if launcher is None:
        launcher = _LAUNCHERS[spec] = _Launcher(jit.get_kernel(spec))
    launcher(args, stream)


def grid_size(spec, device: torch.device) -> int:
    """Persistent grid of a grouped kernel: ``ctas_per_sm`` CTAs on every SM."""
    return sm_count(device) * spec.plan.ctas_per_sm


def run_grouped(
    spec, x: DevPtr, m_rows: int, n_cols: int, layout, *args, num_ctas: int, stream, tables=None
):
    """Launch a grouped kernel. Every one takes (x, M, N, tables, G, row tiles, ...kernel's own
    arguments..., grid size); ``layout`` is the call's ``groups.GroupLayout``, ``tables`` a
    replacement for its tables (``layout.tile_tables``)."""
    run(
        spec,
        x,
        m_rows,
        n_cols,
        ptr(layout.tables if tables is None else tables, 4),
        layout.num_groups,
        layout.row_tiles,
        *args,
        num_ctas,
        stream=stream,
    )


def _empty(shape, dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


# How the public ops allocate their outputs; tests swap in a poisoning allocator
# (cutequant.testing.poisoned_outputs) so that every byte a kernel must write is checked.
output_allocator = _empty
