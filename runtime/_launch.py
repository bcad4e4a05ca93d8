"""Thin launch layer: device facts, argument conversion, kernel invocation."""

from __future__ import annotations

import functools
import os

import torch

from cutequant import jit, replay

# CUDA capability -> the arch cutequant compiles for it. sm_90a is tested on hardware; sm_100a
# and sm_120a are compile-checked only (README, Hardware). Arch-specific ("a") cubins run on
# exactly their capability, so sm_103 (B300), sm_121 (GB10), sm_89 and older are not served.
CAPABILITY_ARCHS = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a"}
ARCH_GPUS = {
    "sm_90a": "H100, H200; tested on hardware",
    "sm_100a": "B200, GB200; compile-checked only",
    "sm_120a": "RTX PRO 6000 Blackwell, RTX 50xx; compile-checked only",
}


def supported_archs_text() -> str:
    return "; ".join(f"{arch} ({gpus})" for arch, gpus in ARCH_GPUS.items())


@functools.cache
def _arch_of(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    arch = CAPABILITY_ARCHS.get((major, minor))
    if arch is None:
        name = torch.cuda.get_device_name(index)
        raise RuntimeError(
            f"cutequant does not support cuda:{index} ({name}, sm_{major}{minor}); "
            f"supported: {supported_archs_text()}"
        )
    return arch


def device_arch(device: torch.device) -> str:
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def rht_mma() -> str:
    """The tensor-core instruction of the columnwise RHT the runtime asks for (spec field
    ``rht_mma``): "auto" (the arch's own: wgmma on sm_90a, mma.sync on sm_100a) unless
    ``CUTEQUANT_RHT_MMA`` says "mma_sync" (the Blackwell path, on Hopper too: how the GPU tests
    prove it bit-exact there) or "wgmma". Read once per process; every spec the runtime builds
    carries it, so kernels of the two never share a cache entry."""
    value = os.environ.get("CUTEQUANT_RHT_MMA", "").strip().lower() or "auto"
    if value not in ("auto", "wgmma", "mma_sync"):
        raise ValueError(f"CUTEQUANT_RHT_MMA must be auto, wgmma or mma_sync, got {value!r}")
    return value


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


def ptr(t: torch.Tensor, align: int = 16) -> int:
    """``t``'s device address for a kernel pointer argument compiled with ``assumed_align =
    align`` (the kernel trusts that alignment, so it is checked here)."""
    addr = t.data_ptr()
    if addr % align:
        raise ValueError(f"device pointer {addr:#x} is not {align}-byte aligned")
    return addr


def raw_stream(device: torch.device) -> int:
    """The current CUDA stream of ``device`` as a raw handle (~0.2 us; building a
    torch.cuda.Stream object through ``torch.cuda.current_stream`` costs ~3 us)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)


# spec -> compiled TVM-FFI function (a copy of jit's memory cache without its lock and stats)
_KERNELS: dict = {}


def run(spec, *args, stream):
    """Launch ``spec``'s kernel on ``stream`` (a raw handle from ``raw_stream`` or a
    torch.cuda.Stream). Arguments in the order of the kernel's ``launch``: device addresses
    (``ptr``) and ints for pointers and Int32, floats for Float32. The TVM-FFI call converts
    and type-checks them in C (~2 us for 15 arguments)."""
    fn = _KERNELS.get(spec)
    if fn is None:
        fn = _KERNELS[spec] = jit.get_kernel(spec)
    if not isinstance(stream, int):
        stream = stream.cuda_stream
    fn(*args, stream)
    launches = replay.recorder()
    if launches is not None:
        launches.append((fn, args, stream))


def grid_size(spec, device: torch.device) -> int:
    """Persistent grid of a grouped kernel: ``ctas_per_sm`` CTAs on every SM."""
    return sm_count(device) * spec.plan.ctas_per_sm


def run_grouped(
    spec, x: int, m_rows: int, n_cols: int, layout, *args, num_ctas: int, stream, tables=None
):
    """Launch a grouped kernel. Every one takes (x, M, N, tables, G, row tiles, ...kernel's own
    arguments..., grid size); ``layout`` is the call's ``groups.GroupLayout``, ``tables`` a
    replacement for its tables (``layout.tile_tables``)."""
    if layout.pending_tables is not None:  # only the amax pass may run first (it builds them)
        raise RuntimeError("internal: a kernel would read device-split tables not yet built")
    run(
        spec,
        x,
        m_rows,
        n_cols,
        layout.tables_addr() if tables is None else ptr(tables, 4),
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
