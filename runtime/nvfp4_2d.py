"""2D (16x16-block) NVFP4 quantization of grouped weights: ``nvfp4_quantize_weights_2d``.

The weight slot of TE's NVFP4 recipe (docs/numerics.md §2): one amax per 16x16 block, no
RHT; a block's rowwise and columnwise scales hold the same e4m3 byte and the columnwise data is
the exact transpose of the rowwise data, so ``W`` and ``W^T`` quantize identically (what the
fprop and the dgrad GEMM consume). Experts come as one stacked [E, R, C] tensor or as a list of
E same-shaped [R, C] tensors; the list is passed to the kernels as a device array of E
addresses, built once per distinct list of addresses and cached.

The quantize is one launch for all experts (TE's recipe: one persistent launch). Without a given
``amax`` the kernel first computes each expert's max |W_e| (folded per run of tiles into
self-resetting workspace words), passes a grid-wide barrier and then quantizes (a cooperative
launch whose CTAs are all resident at once: ``kernels/grid_sync.py``); with a given ``amax``
one CTA per tile. The fake-quant of stacked experts without a given amax runs like the 1D
fake-quant instead: the grouped amax pass (``cutequant.amax``; the experts are the groups of
the [E R, C] view), then the kernel with that amax given: two launches, 3-12% less GPU time
than the cooperative one (``AMAX_PASS_STACKED``; the same two launches serve a quantize whose
caller passes ``group_amax``'s result as ``amax``). Bit-exact with
``cutequant.recipe_reference.nvfp4_quantize_2d_experts``.

Op-level: ``_check_nvfp4_quantize_2d`` and ``nvfp4_quantize_2d_impl`` (outputs as a plain
tuple; shapes from the input shapes alone).
"""

from __future__ import annotations

import collections
import functools
import threading

import torch

from cutequant import _checks, _launch, groups, packing, replay
from cutequant.codegen.specs import Nvfp4Quantize2dSpec

IN_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_PTR_TABLES: collections.OrderedDict = collections.OrderedDict()
_PTR_TABLES_SIZE = 64
_LOCK = threading.Lock()


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _spec(arch, in_dtype, rowwise, columnwise, swizzled, fake_out):
    return Nvfp4Quantize2dSpec(
        arch=arch,
        in_dtype=in_dtype,
        rowwise=rowwise,
        columnwise=columnwise,
        swizzled=swizzled,
        fake_out=fake_out,
    )


def output_shapes(num_experts: int, rows: int, cols: int) -> dict:
    """Shapes of the outputs (each scale block [roundup(R,128), roundup(C/16,4)] or
    [roundup(C,128), roundup(R/16,4)], cuBLASLt 128x4 byte order inside when swizzled)."""
    e = num_experts
    return {
        "row_data": (e, rows, cols // 2),
        "row_scales": (e, _round_up(rows, 128), _round_up(cols // 16, 4)),
        "col_data": (e, cols, rows // 2),
        "col_scales": (e, _round_up(cols, 128), _round_up(rows // 16, 4)),
        "amax": (e,),
    }


def _check_nvfp4_quantize_2d(weights, rowwise, columnwise, swizzled, amax):
    """Validate (before any launch); returns (E, R, C). ``weights``: a contiguous [E, R, C]
    tensor or a list / tuple of contiguous [R, C] tensors of one shape, dtype and device
    (bf16, f16 or fp32; R, C multiples of 16; 16-byte-aligned data)."""
    for name, flag in (("rowwise", rowwise), ("columnwise", columnwise), ("swizzled", swizzled)):
        _checks.check_flag(flag, name)
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: nothing to compute")
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 3:
            raise ValueError(
                f"weights: a tensor must be stacked [E, R, C], got shape {tuple(weights.shape)}"
            )
        mats = [("weights", weights)]
        num_experts, rows, cols = weights.shape
    elif isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError("weights: the list is empty (need at least one expert)")
        mats = [(f"weights[{i}]", w) for i, w in enumerate(weights)]
        for name, w in mats:
            if not isinstance(w, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(w).__name__}")
            if w.dim() != 2:
                raise ValueError(f"{name}: expected a 2-D [R, C] tensor, got {tuple(w.shape)}")
            if w.shape != weights[0].shape or w.dtype != weights[0].dtype:
                raise ValueError(
                    f"{name}: every expert must have weights[0]'s shape and dtype "
                    f"({tuple(weights[0].shape)}, {weights[0].dtype}), got "
                    f"({tuple(w.shape)}, {w.dtype})"
                )
        num_experts = len(weights)
        rows, cols = weights[0].shape
    else:
        raise TypeError(
            f"weights: expected a [E, R, C] tensor or a list of [R, C] tensors, "
            f"got {type(weights).__name__}"
        )
    for name, w in mats:
        if w.dtype not in IN_DTYPES:
            raise TypeError(f"{name}: dtype must be bfloat16, float16 or float32, got {w.dtype}")
        if not w.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    if rows % 16 or cols % 16:
        raise ValueError(f"weights: R = {rows} and C = {cols} must be multiples of 16")
    if num_experts * _ceil_div(rows, 64) * _ceil_div(cols, 128) + num_experts > 2**31 - 1:
        raise ValueError("weights: too many tiles for one launch")
    if amax is not None:
        _checks.check_amax_vector(amax, num_experts)
    first = mats[0][1]
    for name, w in mats:
        _checks.check_device(w, name)
        if w.device != first.device:
            raise ValueError(f"{name}: on {w.device}, but {mats[0][0]} is on {first.device}")
    if amax is not None and amax.device != first.device:
        raise ValueError(f"amax: on {amax.device}, but the weights are on {first.device}")
    return num_experts, rows, cols


def _pointer_table(weights: list, device: torch.device) -> torch.Tensor:
    """int64 [E] device array of the experts' addresses, cached per address list (the
    addresses are values: a cached table stays right for any tensors at those addresses)."""
    key = (device.index, tuple(w.data_ptr() for w in weights))
    with _LOCK:
        table = _PTR_TABLES.get(key)
        if table is not None:
            _PTR_TABLES.move_to_end(key)
            return table
    host = torch.tensor(key[1], dtype=torch.int64)
    table = groups.persistent(device, lambda: host.to(device))  # outside CUDA-graph pools
    with _LOCK:
        _PTR_TABLES[key] = table
        while len(_PTR_TABLES) > _PTR_TABLES_SIZE:
            _, old = _PTR_TABLES.popitem(last=False)
            # made on the runtime stream: its memory must wait for the kernels that read it
            old.record_stream(torch.cuda.current_stream(device))
    return table


def _experts(weights):
    """(stacked?, first matrix, E, R, C, device)."""
    stacked = isinstance(weights, torch.Tensor)
    first = weights if stacked else weights[0]
    num_experts = weights.shape[0] if stacked else len(weights)
    rows, cols = first.shape[-2:]
    return stacked, first, num_experts, rows, cols, first.device


def _amax_out(amax, num_experts: int, tiles: int, dev) -> torch.Tensor:
    """The amax output: uninitialized when there are tiles (the kernel writes every entry: the
    amax pass, or a copy of the given amax; an op's outputs never alias its inputs), else a
    copy of the given amax or zeros."""
    if tiles:
        return _launch.output_allocator((num_experts,), torch.float32, dev)
    if amax is not None:
        return amax.clone()
    return torch.zeros(num_experts, dtype=torch.float32, device=dev)


def work_items(
    num_experts: int, rows: int, cols: int, rowwise: bool, columnwise: bool, fake: bool
) -> int:
    """The kernel's work items (its own count, ``nvfp4_quantize_2d.py.j2``): every 64 x 128
    tile, plus one per expert that zeroes its scale blocks' padding when a written direction
    has any."""
    tiles = num_experts * _ceil_div(rows, 64) * _ceil_div(cols, 128)
    pad = not fake and (
        (rowwise and (rows % 128 or (cols // 16) % 4))
        or (columnwise and (cols % 128 or (rows // 16) % 4))
    )
    return tiles + (num_experts if pad else 0)


# The cooperative grid's kernel: 256 threads and ~5 KB of shared memory per CTA (the transpose
# tile, the warp maxima and the scale table), registers capped for RESIDENT_CTAS CTAs per SM
# by the compiler.
_THREADS = 256
_SMEM_BYTES = 128 * 40 + 32 + 64 + 1024  # + the system's 1 KB per resident CTA


@functools.cache
def _resident_ctas(index: int) -> int:
    """CTAs of the 2D kernel that an SM of this device holds at once: the compiled residency,
    or less if the SM's threads or shared memory say so (torch reports both)."""
    p = torch.cuda.get_device_properties(index)
    threads = getattr(p, "max_threads_per_multi_processor", 2048) // _THREADS
    smem = getattr(p, "shared_memory_per_multiprocessor", 228 * 1024) // _SMEM_BYTES
    return max(1, min(Nvfp4Quantize2dSpec.RESIDENT_CTAS, threads, smem))


def cooperative_grid(device: torch.device, items: int) -> int:
    """The grid of a launch that computes the amax: every CTA co-resident (the grid barrier
    waits for all of them), never more CTAs than work items."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return min(items, _launch.sm_count(device) * _resident_ctas(index))


# The 2D fake-quant of stacked experts whose amax is computed: two launches, the grouped amax
# pass over the [E R, C] view (its TMA ring, one group per expert) and then the 2D kernel with
# that amax given (one CTA per tile), instead of the cooperative launch (phase 1, grid barrier,
# phase 2). Bits equal. Less GPU time in every case measured (perf/NOTES.md, "2D fake-quant:
# the amax pass first"): the bench cases 2.7-9.8% (H200) and 9.6-12.1% (H100), 0.5-64 MB weights
# 2-19% (H100); one launch more of host time (~4-5 us). The quantize keeps its one launch (the
# recipe's); a list of experts has no [E R, C] view. False: the A/B's other side (the GPU tests
# run both).
AMAX_PASS_STACKED = True


def amax_pass_applies(weights, amax) -> bool:
    """Whether a 2D fake-quant computes its amax with the grouped amax pass
    (``AMAX_PASS_STACKED``): stacked experts, no given amax, a view within the amax kernel's
    32-bit indexing."""
    if not (AMAX_PASS_STACKED and amax is None and isinstance(weights, torch.Tensor)):
        return False
    e, r, c = weights.shape
    return e * r * c > 0 and _checks.fits_32bit_tiles(e * r, c)


def _run_amax_pass(weights: torch.Tensor, pass_out: int, arch: str) -> None:
    """Every expert's max |W_e| into the fp32 [2, E] at address ``pass_out`` (both rows: the
    grouped amax kernel without the RHT; the stream's workspace scratch), the experts as the
    groups of the [E R, C] view."""
    from cutequant import amax as amax_mod

    num_experts, rows, cols = weights.shape
    m_rows = num_experts * rows
    layout = groups.prepare_groups((rows,) * num_experts, m_rows, weights.device, validated=True)
    amax_mod.launch_group_amax(
        weights.view(m_rows, cols),
        layout,
        pass_out,
        rht=False,
        sign_mask=0,
        arch=arch,
        in_dtype=IN_DTYPES[weights.dtype],
    )


def _launch_2d(
    weights, spec_args: tuple, amax, amax_out: int, outs: list, amax_pass: bool = False
) -> None:
    """A launch of the kernel ``_spec(arch, in_dtype, *spec_args)`` with output pointers
    ``outs`` (4, None for an unused slot) and ``amax_out`` (the address of the fp32 [E] amax
    output): with ``amax`` None it computes every expert's amax into it first (phase 1 and a
    grid barrier: a cooperative, co-resident grid), else it reads the given ``amax`` and copies
    it there, with one CTA per work item. ``amax_pass`` (``amax_pass_applies``): the grouped
    amax pass computes the amax into the stream's workspace scratch first and the kernel runs
    as with a given amax (two launches, no cooperative grid)."""
    stacked, first, num_experts, rows, cols, dev = _experts(weights)
    rowwise, columnwise, _, fake = spec_args
    items = work_items(num_experts, rows, cols, rowwise, columnwise, bool(fake))
    arch = _launch.device_arch(dev)
    stream = _launch.raw_stream(dev)  # ~1 us; torch.cuda.current_stream costs 5-10 us
    dummy = groups.dummy_buffer(dev)
    ptrs = dummy if stacked else _pointer_table(weights, dev)
    compute = amax is None
    given = dummy.data_ptr() if compute else _launch.ptr(amax, 4)
    if compute and amax_pass:
        given = groups.workspace(dev, num_experts, stream).scratch.data_ptr()
        _run_amax_pass(weights, given, arch)  # its first row: every expert's amax
        compute = False
    if compute:
        ws = groups.workspace(dev, num_experts, stream)
        fold, barrier = ws.fold, ws.barrier
        num_ctas = cooperative_grid(dev, items)
    else:
        fold = barrier = dummy
        num_ctas = items
    _launch.run(
        _spec(arch, IN_DTYPES[first.dtype], *spec_args),
        _launch.ptr(first),
        _launch.ptr(ptrs, 8),
        int(not stacked),
        num_experts,
        rows,
        cols,
        amax_out,
        given,
        _launch.ptr(fold, 8),
        _launch.ptr(barrier, 8),
        *(_launch.ptr(dummy if t is None else t) for t in outs),
        int(compute),
        num_ctas,
        stream=stream,
    )


def nvfp4_quantize_2d_impl(
    weights, rowwise: bool, columnwise: bool, swizzled: bool, amax: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """(row_data, row_scales, col_data, col_scales, amax) from validated arguments
    (``_check_nvfp4_quantize_2d``); shapes in ``output_shapes`` (uint8, amax fp32 [E]); a
    disabled direction's two outputs are empty uint8 [0] tensors. ``amax`` given: used for the
    global scales and returned as a copy; else computed by the amax pass. Separate tensors
    (what the torch.library op returns)."""
    outputs, amax_out = quantize_2d(
        weights, rowwise, columnwise, swizzled, amax, packing.SeparateOutputs
    )
    dev = amax_out.device
    got = [
        outputs[k] if outputs[k] is not None else _launch.output_allocator((0,), torch.uint8, dev)
        for k in ("row_data", "row_scales", "col_data", "col_scales")
    ]
    return (*got, amax_out)


def quantize_2d(weights, rowwise, columnwise, swizzled, amax, output_kind):
    """(outputs, amax [E]) of the 2D quantize on validated arguments. ``output_kind``:
    ``packing.PackedOutputs`` (eager calls: one allocation, the amax its "amax" part: computed,
    or the kernel's copy of the given one) or ``packing.SeparateOutputs``; a disabled
    direction's parts are None."""
    _, _, num_experts, rows, cols, dev = _experts(weights)
    shapes = output_shapes(num_experts, rows, cols)
    parts = {}
    for side, on in (("row", rowwise), ("col", columnwise)):
        for kind in ("data", "scales"):
            parts[f"{side}_{kind}"] = (shapes[f"{side}_{kind}"], torch.uint8) if on else None
    parts["amax"] = ((num_experts,), torch.float32)  # computed, or the kernel's copy of the given
    outputs = output_kind.allocate(parts, dev)
    tiles = num_experts * _ceil_div(rows, 64) * _ceil_div(cols, 128)
    if tiles == 0:
        for key in ("row_scales", "col_scales", "amax"):  # all padding; no expert has a value
            if parts.get(key) is not None:
                outputs.get(key).zero_()
        if amax is not None:
            outputs.get("amax").copy_(amax)
    else:
        _launch_2d(
            weights,
            (rowwise, columnwise, swizzled, ""),
            amax,
            outputs.addr("amax", 0),
            [outputs.get(k) for k in ("row_data", "row_scales", "col_data", "col_scales")],
        )
    return outputs, outputs.get("amax")


def nvfp4_fake_quantize_2d_impl(
    weights, amax: torch.Tensor | None, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_fq [E, R, C] ``out_dtype`` (bf16 / f16), amax [E]) from validated arguments
    (``_check_nvfp4_quantize_2d`` with both directions, no swizzle): the values of the 2D
    quantize followed by dequantize, bit for bit, without NVFP4 data in memory. The columnwise
    fake-quant is its transpose (a block's columnwise values equal its rowwise ones)."""
    _, _, num_experts, rows, cols, dev = _experts(weights)
    out = _launch.output_allocator((num_experts, rows, cols), out_dtype, dev)
    tiles = num_experts * _ceil_div(rows, 64) * _ceil_div(cols, 128)
    amax_out = _amax_out(amax, num_experts, tiles, dev)
    if tiles:
        fake = {torch.bfloat16: "bf16", torch.float16: "f16"}[out_dtype]
        _launch_2d(
            weights, (True, True, False, fake), amax, amax_out.data_ptr(), [out, None, None, None],
            amax_pass_applies(weights, amax),
        )  # fmt: skip
    return out, amax_out


class Nvfp4WeightTensor:
    """2D-quantized experts (TE layouts, stacked over E; None where a direction is off):
    ``row_data`` uint8 [E, R, C/2] (even column in the low nibble), ``row_scales`` uint8
    [E, roundup(R, 128), roundup(C/16, 4)], ``col_data`` uint8 [E, C, R/2] (the exact nibble
    transpose), ``col_scales`` uint8 [E, roundup(C, 128), roundup(R/16, 4)], ``amax`` fp32 [E]
    (the global amax of both directions). Swizzled scales are in cuBLASLt 128x4 byte order
    inside each expert's block; padding bytes are zero. An eager call's buffers are views of
    one allocation, built on first access (``packing.PackedOutputs``)."""

    def __init__(self, *, rows: int, cols: int, outputs, amax, swizzled_scales: bool):
        self.rows = rows
        self.cols = cols
        self._outputs = outputs  # packing.PackedOutputs, or a dict of tensors / None (traced)
        self._amax = amax  # None: the outputs' "amax" part
        self.swizzled_scales = swizzled_scales

    row_data = property(lambda self: self._outputs.get("row_data"))
    row_scales = property(lambda self: self._outputs.get("row_scales"))
    col_data = property(lambda self: self._outputs.get("col_data"))
    col_scales = property(lambda self: self._outputs.get("col_scales"))

    @property
    def amax(self) -> torch.Tensor:
        if self._amax is None:
            self._amax = self._outputs.get("amax")
        return self._amax

    def dequantize(
        self, *, columnwise: bool = False, out_dtype: torch.dtype = torch.bfloat16
    ) -> torch.Tensor:
        """[E, R, C] back from the rowwise data or (``columnwise``) from the columnwise data
        transposed back (the same values: a block's two scale bytes are equal), in one launch
        of the grouped dequantize kernel: the stacked experts are its groups (splits R, ..., R;
        the layouts are the grouped ones)."""
        from cutequant import dequant

        _checks.check_flag(columnwise, "columnwise")
        data = self.col_data if columnwise else self.row_data
        if data is None:
            kind = "columnwise" if columnwise else "rowwise"
            raise ValueError(f"{kind} data: not quantized (it was switched off)")
        scales = self.col_scales if columnwise else self.row_scales
        num_experts = self.amax.numel()
        args = (
            data.view(-1) if columnwise else data.view(-1, self.cols // 2),
            scales.view(-1) if columnwise else scales.view(-1, scales.shape[-1]),
            self.amax,
            (self.rows,) * num_experts,
            self.cols,
            columnwise,
            self.swizzled_scales,
            False,
            0,
            out_dtype,
        )
        dequant._check_nvfp4_dequantize(*args)
        (out,) = dequant.nvfp4_group_dequantize_impl(*args)
        return out.view(num_experts, self.rows, self.cols)

    def expert(self, e: int) -> dict:
        out = {"amax": self.amax[e]}
        for key in ("row_data", "row_scales", "col_data", "col_scales"):
            t = getattr(self, key)
            if t is not None:
                out[key] = t[e]
        return out


def nvfp4_quantize_weights_2d(
    weights,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    swizzled_scales: bool = False,
    amax: torch.Tensor | None = None,
) -> Nvfp4WeightTensor:
    """2D 16x16-block NVFP4 quantization of E experts' weights (stacked [E, R, C] or a list
    of [R, C]; bf16, f16 or fp32). ``columnwise=True`` alone gives the transposed operand only.
    ``amax``: fp32 [E] per-expert global amax to use (else max |W_e|, computed). Inside
    ``torch.compile`` this runs as the ``cutequant::nvfp4_quantize_weights_2d`` op."""
    first = weights if isinstance(weights, torch.Tensor) else weights[0]
    if torch.compiler.is_compiling():
        from cutequant import ops

        stacked, experts = ops.weight_args(weights)
        rd, rs, cd, cs, amax_out = ops.nvfp4_quantize_weights_2d_op(
            stacked, experts, rowwise, columnwise, swizzled_scales, amax
        )
        outputs = {
            "row_data": rd if rowwise else None,
            "row_scales": rs if rowwise else None,
            "col_data": cd if columnwise else None,
            "col_scales": cs if columnwise else None,
        }
    else:
        outputs, amax_out = _quantize_replayed(weights, rowwise, columnwise, swizzled_scales, amax)
    return Nvfp4WeightTensor(
        rows=first.shape[-2],
        cols=first.shape[-1],
        outputs=outputs,
        amax=amax_out,
        swizzled_scales=swizzled_scales,
    )


def nvfp4_fake_quantize_weights_2d(
    weights, *, amax: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """2D 16x16-block NVFP4 fake-quant of E experts' weights (stacked [E, R, C] or a list of
    [R, C]): ``(w [E, R, C] out_dtype, amax [E])``, bit-identical to quantizing with
    ``nvfp4_quantize_weights_2d`` and dequantizing (the columnwise operand is its transpose).
    Inside ``torch.compile`` this runs as the ``cutequant::nvfp4_fake_quantize_weights_2d`` op."""
    if torch.compiler.is_compiling():
        from cutequant import ops

        stacked, experts = ops.weight_args(weights)
        return ops.nvfp4_fake_quantize_weights_2d_op(stacked, experts, amax, out_dtype)
    return _fake_replayed(weights, amax, out_dtype)


def _fake_checked(weights, amax, out_dtype):
    _check_nvfp4_quantize_2d(weights, True, True, False, amax)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out_dtype: must be torch.bfloat16 or torch.float16, got {out_dtype}")
    return nvfp4_fake_quantize_2d_impl(weights, amax, out_dtype)


def _quantize_checked(weights, rowwise, columnwise, swizzled, amax):
    _check_nvfp4_quantize_2d(weights, rowwise, columnwise, swizzled, amax)
    return quantize_2d(weights, rowwise, columnwise, swizzled, amax, packing.PackedOutputs)


_QUANTIZE_RECORDS = replay.CallMemo()  # nvfp4_quantize_weights_2d's replayable calls


def _quantize_replayed(weights, rowwise, columnwise, swizzled, amax):
    """(outputs (one allocation), amax) of the eager 2D quantize: a replay of a recorded call
    (replay.py) with the same shape, dtype, flags, amax signature and stream, else the checked
    path, recorded when it may be replayed. A list of experts always takes the checked path (its
    pointer table is per address list)."""
    flags = (rowwise, columnwise, swizzled)
    key, hit = replay.find(_QUANTIZE_RECORDS, weights, (), flags, (amax,))  # a list: no key
    if hit is not None:  # replay.py: the checked call's launches again
        record, total, spans = hit
        buf = _launch.output_allocator(total, torch.uint8, weights.device)
        record.launch((weights, amax, buf))
        return packing.PackedOutputs(buf, spans), None  # the amax: the outputs' "amax" part
    with replay.recording() as rec:
        outputs, amax_out = _quantize_checked(weights, rowwise, columnwise, swizzled, amax)
    if key is not None and rec.replayable(weights.numel()):
        record = replay.Replay(rec.launches, [weights, amax, outputs.buf])
        _QUANTIZE_RECORDS.put(key, (record, outputs.buf.numel(), outputs.spans))
    return outputs, amax_out


_FAKE_RECORDS = replay.CallMemo()  # nvfp4_fake_quantize_weights_2d's replayable calls


def _fake_replayed(weights, amax, out_dtype) -> tuple:
    """(w, amax) of the eager 2D fake-quant: a replay of a recorded call (replay.py) with the
    same shape, dtype, out_dtype, amax signature and stream, else the checked path, recorded
    when it may be replayed (stacked weights only, as ``_quantize_replayed``)."""
    flags = (out_dtype, AMAX_PASS_STACKED)  # the A/B switch: records of its own
    key, hit = replay.find(_FAKE_RECORDS, weights, (), flags, (amax,))
    if hit is not None:  # replay.py: the checked call's launches again
        record, shape = hit
        dev = weights.device
        out = _launch.output_allocator(shape, out_dtype, dev)
        # as the checked path: the kernel computes the amax, or copies the given one (or the
        # amax pass's), into it
        amax_out = _launch.output_allocator((shape[0],), torch.float32, dev)
        record.launch((weights, amax, amax_out, out))
        return out, amax_out
    with replay.recording() as rec:
        out, amax_out = _fake_checked(weights, amax, out_dtype)
    if key is not None and rec.replayable(weights.numel()):
        record = replay.Replay(rec.launches, [weights, amax, amax_out, out])
        _FAKE_RECORDS.put(key, (record, tuple(out.shape)))
    return out, amax_out
