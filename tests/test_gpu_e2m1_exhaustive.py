"""GPU: the packed e2m1 encoder (``kernels/device.e2m1x8``) on every one of the 2^32 fp32 bit
patterns, against the fp32 encoder it replaced (``e2m1x8_fp32``, on the device) and against
``cutequant.reference.e2m1_encode`` (torch): NaN, +-inf, +-0, subnormals, saturation at 6 and
every tie. One test kernel encodes each run of 8 consecutive patterns with both encoders; the
comparisons run in torch, 2^26 patterns per launch (64 launches, a few seconds on an H100).
The FMA-pipe form (``kernels/nvfp4_fma.e2m1x8``, ``Nvfp4QuantizeSpec.fma_encoder``) runs the
same sweep against ``device.e2m1x8`` and the reference, its constants opaque to ptxas as in
the quantize kernel.

The one documented difference from the torch reference: a NaN with the sign bit set encodes as
0xF on the device (sign from bit 31; the reference clears it). The kernels never see one: x *
enc of a NaN is the canonical NaN 0x7FFFFFFF.

On Blackwell (sm_100a / sm_120a, marker ``blackwell``; never run so far) the same sweep
compares the hardware encoder ``e2m1x8_cvt`` (the cvt the software one is defined by) with
``e2m1x8``: all 2^32 patterns must agree, which is what makes the arch switch of the RN
templates safe. On CPU both launchers compile for every arch they target."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import pytest
import torch
from cutlass import Int32, Int64, Uint32

from cutequant import reference
from cutequant.kernels import device as dev
from cutequant.kernels import fake_quant as fq
from cutequant.kernels import nvfp4_fma, nvfp4_trim

CHUNK_LOG2 = 26
THREADS = 256


@cute.kernel
def _encode_kernel(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    w = bidx * THREADS + tidx  # this thread's word: patterns base + 8 w + (0 .. 7)
    first = Uint32(base) + Uint32(w) * Uint32(8)
    v = [dev.bits_f32(first + Uint32(j)) for j in range(8)]
    dev.st_global_b32(new_ptr.toint() + Int64(w) * 4, dev.e2m1x8(v))
    dev.st_global_b32(old_ptr.toint() + Int64(w) * 4, dev.e2m1x8_fp32(v))


@cute.kernel
def _encode_kernel_fma(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32, n: Int32):
    """``nvfp4_fma.e2m1x8`` into ``new_ptr``, ``device.e2m1x8`` into ``old_ptr``; ``n`` = 0
    (non-negative: ``opaque_zero`` gives 0 that ptxas cannot see, as the kernels' n_cols)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    w = bidx * THREADS + tidx
    first = Uint32(base) + Uint32(w) * Uint32(8)
    v = [dev.bits_f32(first + Uint32(j)) for j in range(8)]
    consts = nvfp4_fma.encoder_constants(nvfp4_trim.opaque_zero(n))
    dev.st_global_b32(new_ptr.toint() + Int64(w) * 4, nvfp4_fma.e2m1x8(v, consts))
    dev.st_global_b32(old_ptr.toint() + Int64(w) * 4, dev.e2m1x8(v))


@cute.kernel
def _encode_kernel_hw(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32):
    """Blackwell: the hardware cvt into ``new_ptr``, the software ``e2m1x8`` into ``old_ptr``."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    w = bidx * THREADS + tidx
    first = Uint32(base) + Uint32(w) * Uint32(8)
    v = [dev.bits_f32(first + Uint32(j)) for j in range(8)]
    dev.st_global_b32(new_ptr.toint() + Int64(w) * 4, dev.e2m1x8_cvt(v))
    dev.st_global_b32(old_ptr.toint() + Int64(w) * 4, dev.e2m1x8(v))


@cute.kernel
def _value_kernel(out_ptr: cute.Pointer, unused: cute.Pointer, base: Int32):
    """The fake-quant rounding ``fake_quant.e2m1_rn_value`` of 8 consecutive patterns per
    thread, as fp32 bit patterns."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    w = bidx * THREADS + tidx
    first = Uint32(base) + Uint32(w) * Uint32(8)
    for j in range(8):
        v = fq.e2m1_rn_value(dev.bits_f32(first + Uint32(j)))
        dev.st_global_b32(out_ptr.toint() + (Int64(w) * 8 + j) * 4, dev.f32_bits(v))


@cute.jit
def _launch_value(out_ptr: cute.Pointer, unused: cute.Pointer, base: Int32, stream: cuda.CUstream):
    words = (1 << CHUNK_LOG2) // 8
    _value_kernel(out_ptr, unused, base).launch(
        grid=[words // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream
    )


@cute.jit
def _launch(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32, stream: cuda.CUstream):
    words = (1 << CHUNK_LOG2) // 8
    _encode_kernel(new_ptr, old_ptr, base).launch(
        grid=[words // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream
    )


@cute.jit
def _launch_fma(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32, stream: cuda.CUstream):
    words = (1 << CHUNK_LOG2) // 8
    _encode_kernel_fma(new_ptr, old_ptr, base, Int32(0) * base).launch(
        grid=[words // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream
    )


@cute.jit
def _launch_hw(new_ptr: cute.Pointer, old_ptr: cute.Pointer, base: Int32, stream: cuda.CUstream):
    words = (1 << CHUNK_LOG2) // 8
    _encode_kernel_hw(new_ptr, old_ptr, base).launch(
        grid=[words // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream
    )


def _compile(*options: str, launcher=_launch):
    """Compile the test launcher (``options``: e.g. "--gpu-arch sm_90a" without a GPU)."""
    gmem = cute.AddressSpace.gmem
    ptr = cute.runtime.make_ptr(cutlass.Uint32, 0, gmem, assumed_align=4)
    kw = {"options": " ".join(options)} if options else {}
    return cute.compile(launcher, ptr, ptr, Int32(0), cuda.CUstream(0), **kw)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_exhaustive_kernel_compiles(arch):
    """CPU: the test kernel (both software encoders) builds for every arch."""
    assert _compile(f"--gpu-arch {arch}") is not None


def test_fma_encoder_kernel_compiles():
    """CPU: the FMA-pipe encoder's test kernel builds (sm_90a: the arch it exists for)."""
    assert _compile("--gpu-arch sm_90a", launcher=_launch_fma) is not None


def test_value_kernel_compiles():
    """CPU: the fake-quant rounding's test kernel builds (its rounding is arch-neutral)."""
    assert _compile("--gpu-arch sm_90a", launcher=_launch_value) is not None


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_hardware_encoder_kernel_compiles_for_blackwell(arch):
    """CPU: the hardware-vs-software kernel builds for the archs with the e2m1 cvt."""
    assert _compile(f"--gpu-arch {arch}", launcher=_launch_hw) is not None


def test_hardware_encoder_does_not_build_for_sm90a():
    """sm_90a has no e2m1 cvt: ptxas refuses it (why the templates switch on the arch)."""
    with pytest.raises(Exception, match="e2m1x2"):
        _compile("--gpu-arch sm_90a", launcher=_launch_hw)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int64)
    return ((words.to(torch.int64).unsqueeze(1) >> shifts) & 0xF).reshape(-1).to(torch.uint8)


@pytest.mark.gpu
def test_packed_encoder_all_fp32_patterns():
    _sweep_against_reference(_compile(), "e2m1x8_fp32")


@pytest.mark.gpu
def test_fma_encoder_all_fp32_patterns():
    """``nvfp4_fma.e2m1x8`` (FMA-pipe form) == ``device.e2m1x8`` and the reference, every
    pattern."""
    _sweep_against_reference(_compile(launcher=_launch_fma), "device.e2m1x8")


def _sweep_against_reference(compiled, old_name: str):
    """Run ``compiled`` (new encoder -> first buffer, old -> second) over all 2^32 patterns;
    the new words must equal the old ones and decode to the reference's nibbles."""
    n = 1 << CHUNK_LOG2
    new = torch.empty(n // 8, dtype=torch.int32, device="cuda")
    old = torch.empty_like(new)
    gmem = cute.AddressSpace.gmem
    mk = cute.runtime.make_ptr
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    idx = torch.arange(n, dtype=torch.int64, device="cuda")
    vs_old = vs_ref = 0
    first_bad = None
    for chunk in range(1 << (32 - CHUNK_LOG2)):
        base = chunk << CHUNK_LOG2
        compiled(
            mk(cutlass.Uint32, new.data_ptr(), gmem, assumed_align=4),
            mk(cutlass.Uint32, old.data_ptr(), gmem, assumed_align=4),
            Int32(base - (1 << 32) if base >= 1 << 31 else base),
            stream,
        )
        pattern = idx + base
        bits = torch.where(pattern >= 1 << 31, pattern - (1 << 32), pattern).to(torch.int32)
        v = bits.view(torch.float32)
        want = reference.e2m1_encode(v)
        neg_nan = torch.isnan(v) & (bits < 0)
        want = torch.where(neg_nan, torch.full_like(want, 0xF), want)
        got = _nibbles(new)
        bad_old = int((new != old).sum())
        bad_ref = (got != want).nonzero()
        vs_old += bad_old
        vs_ref += len(bad_ref)
        if first_bad is None and len(bad_ref):
            i = int(bad_ref[0])
            first_bad = (
                f"pattern {int(bits[i]) & 0xFFFFFFFF:#010x}: {int(got[i]):#x} vs {int(want[i]):#x}"
            )
    assert vs_old == 0, f"{vs_old} words differ from {old_name}"
    assert vs_ref == 0, f"{vs_ref} codes differ from reference.e2m1_encode; first {first_bad}"


@pytest.mark.blackwell
def test_hardware_encoder_all_fp32_patterns():
    """sm_100a / sm_120a: ``e2m1x8_cvt`` (hardware) == ``e2m1x8`` (software), every pattern."""
    compiled = _compile(launcher=_launch_hw)
    n = 1 << CHUNK_LOG2
    hw = torch.empty(n // 8, dtype=torch.int32, device="cuda")
    sw = torch.empty_like(hw)
    gmem = cute.AddressSpace.gmem
    mk = cute.runtime.make_ptr
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    bad = 0
    for chunk in range(1 << (32 - CHUNK_LOG2)):
        base = chunk << CHUNK_LOG2
        compiled(
            mk(cutlass.Uint32, hw.data_ptr(), gmem, assumed_align=4),
            mk(cutlass.Uint32, sw.data_ptr(), gmem, assumed_align=4),
            Int32(base - (1 << 32) if base >= 1 << 31 else base),
            stream,
        )
        bad += int((hw != sw).sum())
    assert bad == 0, f"{bad} words differ between the hardware cvt and the software encoder"


@pytest.mark.gpu
def test_fake_quant_rounding_all_fp32_patterns():
    """``fake_quant.e2m1_rn_value`` (the fused columnwise fake-quant's RN rounding) on every
    fp32 pattern == ``e2m1_decode(e2m1_encode(v))`` of the reference (a NaN with the sign bit
    set: -6, the sign from bit 31, as the encoders; x * enc never is one)."""
    compiled = _compile(launcher=_launch_value)
    n = 1 << CHUNK_LOG2
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    gmem = cute.AddressSpace.gmem
    mk = cute.runtime.make_ptr
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    idx = torch.arange(n, dtype=torch.int64, device="cuda")
    bad = 0
    first_bad = None
    for chunk in range(1 << (32 - CHUNK_LOG2)):
        base = chunk << CHUNK_LOG2
        ptr = mk(cutlass.Uint32, out.data_ptr(), gmem, assumed_align=4)
        compiled(ptr, ptr, Int32(base - (1 << 32) if base >= 1 << 31 else base), stream)
        pattern = idx + base
        bits = torch.where(pattern >= 1 << 31, pattern - (1 << 32), pattern).to(torch.int32)
        v = bits.view(torch.float32)
        want = reference.e2m1_decode(reference.e2m1_encode(v))
        want = torch.where(torch.isnan(v) & (bits < 0), torch.full_like(want, -6.0), want)
        wrong = (out != want.view(torch.int32)).nonzero()
        bad += len(wrong)
        if first_bad is None and len(wrong):
            i = int(wrong[0])
            first_bad = f"pattern {int(bits[i]) & 0xFFFFFFFF:#010x}: {int(out[i]):#x}"
    assert bad == 0, f"{bad} values differ from decode(encode(v)); first {first_bad}"
