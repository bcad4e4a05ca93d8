"""``cutequant.nvfp4_group_quantize`` / ``nvfp4_group_dequantize`` and the grouped result."""

from __future__ import annotations

import dataclasses
import functools

import torch

from cutequant import _checks, _launch, groups, packing, replay
from cutequant.amax import DEFAULT_SIGN_MASK, _num_groups, launch_group_amax, new_amax
from cutequant.codegen.specs import HW_E2M1_ARCHS, Nvfp4QuantizeSpec
from cutequant.rng import fresh_state


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


class Nvfp4GroupedTensor(groups.GroupedViews):
    """All groups' NVFP4 tensors as views into one contiguous buffer per kind (TE layouts).

    * ``row_data``: uint8 [M, N/2], group g = rows [row_start_g, row_start_g + M_g) (even element in
      the low nibble); ``row_scales``: uint8 [sum_g roundup(M_g, 128), roundup(N/16, 4)], group g
      a [roundup(M_g, 128), roundup(N/16, 4)] block (cuBLASLt 128x4 byte order when swizzled);
    * ``col_data``: uint8 flat, group g a [N, M_g/2] block = quantized RHT(x_g^T) (or x_g^T);
      ``col_scales``: uint8 flat, group g a [roundup(N, 128), roundup(M_g/16, 4)] block;
    * ``amax_row``, ``amax_col``: fp32 [G];
    * ``offsets``: int64 [4, G + 1] device tensor of byte offsets of every group's block in
      (row_data, row_scales, col_data, col_scales): what a grouped GEMM consumes;
    * ``rng_state``: with stochastic rounding, the int64 [2] (seed, offset) device tensor the
      kernel used (``cutequant.reference`` reproduces the random bits from it), else None.

    With split sizes on the device the scale buffers have upper-bound sizes (M + 127 G rows,
    M / 16 + 3 G columns): the buffers never depend on device values. Padding bytes of the scale
    blocks are zero in both layouts. Per-group views (``group(g)``) need the split sizes on the
    host: with device splits the first access synchronizes once. The data buffers are views of
    one allocation, built on first access (``packing.PackedOutputs``).
    """

    def __init__(
        self,
        *,
        n_cols: int,
        outputs,
        amax: torch.Tensor,
        swizzled_scales: bool,
        rht: bool,
        sign_mask: int,
        fast_math: bool,
        rng_state: torch.Tensor | None,
        layout: groups.GroupLayout,
    ):
        self.n_cols = n_cols
        self._outputs = outputs  # packing.PackedOutputs, or a dict of tensors (traced path)
        self._amax_t = amax  # None: computed into the outputs buffer ("amax"), viewed on use
        self._offsets = None
        self.swizzled_scales = swizzled_scales
        self.rht = rht
        self.sign_mask = sign_mask
        self.fast_math = fast_math
        self.rng_state = rng_state
        self._layout = layout

    row_data = property(lambda self: self._outputs.get("row_data"))
    row_scales = property(lambda self: self._outputs.get("row_scales"))
    col_data = property(lambda self: self._outputs.get("col_data"))
    col_scales = property(lambda self: self._outputs.get("col_scales"))
    amax_row = property(lambda self: self._amax[0])
    amax_col = property(lambda self: self._amax[1])

    @property
    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = groups.byte_offsets(self._layout, self.n_cols, self._amax.device)
        return self._offsets

    def group(self, g: int) -> dict:
        """TE-shaped views of group ``g``: row_data, row_scales, col_data, col_scales, amax."""
        splits, m_g, row0 = self._group_rows(g)
        n = self.n_cols
        out = {"amax_row": self.amax_row[g], "amax_col": self.amax_col[g]}
        if self.row_data is not None:
            cp = _round_up(n // 16, 4)
            rs0 = sum(_round_up(s, 128) for s in splits[:g])
            out["row_data"] = self.row_data[row0 : row0 + m_g]
            out["row_scales"] = self.row_scales[rs0 : rs0 + _round_up(m_g, 128)]
            assert out["row_scales"].shape[1] == cp
        if self.col_data is not None:
            np_ = _round_up(n, 128)
            cg = _round_up(m_g // 16, 4)
            cs0 = sum(_round_up(s // 16, 4) for s in splits[:g])
            out["col_data"] = self.col_data[n * row0 // 2 : n * (row0 + m_g) // 2].view(n, m_g // 2)
            out["col_scales"] = self.col_scales[np_ * cs0 : np_ * (cs0 + cg)].view(np_, cg)
        return out


# Round-robin tile chunks (kernels/schedule.py, ``cta_runs``) for the memory-bound variants
# (compact scales, a rowwise output, no fast-math, no stochastic rounding) on GPUs whose DRAM
# delivers fewer than 16 bytes per SM clock (``_launch.memory_rich`` is False): there the grid
# waits on memory, and sweeping one window of x and of the outputs pays. H100 (12.8), chunks of 8
# vs contiguous ranges (perf/NOTES.md attempt 59): compact 64 groups 251 -> 209 us, 16 uneven
# groups of 7168 columns 451 -> 375 us, 64 groups of 1040 rows 266 -> 223 us, the whole call 64
# groups 363 -> 321 us, dense -2..-5%, equal 2048-8192-row groups 5-7% slower; rowwise only 0-6%
# faster. Not chunked, measured worse or mixed there: swizzled scales (-12% .. +16%), fast-math
# (-10% dense, -9% at 256 groups), stochastic rounding (-4 .. -11%), columnwise only (-8.5% ..
# +12%). The H200 (18.4) is instruction bound and chunks cost it 5-15% (attempt 55): contiguous,
# without the run loop.
def device_chunk(
    device: torch.device, rowwise: bool, swizzled: bool, fast_math: bool, stochastic: bool
) -> int:
    """The tile plan's ``chunk`` for this variant on this GPU (-1: the spec's default,
    contiguous ranges)."""
    if swizzled or fast_math or stochastic or not rowwise:
        return -1
    if _launch.memory_rich(device) is not False:  # H200 class, or not known
        return -1
    return Nvfp4QuantizeSpec.MEMORY_BOUND_CHUNK


# True (the default): the quantize kernel with fewer ALU-pipe instructions in its hot loops
# (Nvfp4QuantizeSpec.alu_trim, kernels/nvfp4_trim.py; issue 17, branch speed4; H200 run 46:
# 4% less time on most cases, swizzled 4-8%, bits identical); False for the A/B in one process
# (perf/probes/nvfp4_ab.py); read at every call. Its 32-bit offsets need M * N < 2^32
# (ALU_TRIM_MAX_ELEMS): larger calls run the kernel without it.
ALU_TRIM = True
ALU_TRIM_MAX_ELEMS = 1 << 32


def alu_trim(m_rows: int, n_cols: int) -> bool:
    """Whether this call runs the ``alu_trim`` kernel (the flag, and offsets fit 32 bits)."""
    return ALU_TRIM and m_rows * n_cols < ALU_TRIM_MAX_ELEMS


# True (the default): the RN encoder of the alu_trim kernel with part of its work on the FMA
# pipe (Nvfp4QuantizeSpec.fma_encoder, kernels/nvfp4_fma.py; issue 17, branch alu5: per 8 values
# 22 ALU-pipe instructions instead of 30, 36 in all instead of 43; same bits, all 2^32 inputs
# checked on the GPU). H200 run 58 (perf/probes/nvfp4_ab.py --switch FMA_ENCODER --rounds 3):
# quantize 2-10% less time (swizzled 7-10%, columnwise only 7-8%) on the dense, 8- and
# 256-group cases, 0.3-3.3% more on the 64-group one. False for the A/B; read at every call; it
# applies where the alu_trim kernel runs, to RN (exact and fast math) on sm_90a, not to SR.
FMA_ENCODER = True


def fma_encoder(trim: bool, stochastic: bool, arch: str) -> bool:
    """Whether this call's kernel takes ``fma_encoder`` (the flag, on the kernels it exists for)."""
    return FMA_ENCODER and trim and not stochastic and arch not in HW_E2M1_ARCHS


# False (the default; an A/B variant, issue 17, eleventh session, branch trim6): True gives fast
# math's wgmma kernels ``Nvfp4QuantizeSpec.stsm_restage`` (the fp32 restage stored from the
# accumulators as they sit, by stmatrix: 8 STSM.x4 a tile instead of 8 STS.128 and 32 register
# moves; same bits; perf/NOTES.md, "Hot-loop census"). Read at every call; kernels without
# that restage (exact, SR, mma.sync) are unchanged.
STSM_RESTAGE = False

# True (the default; issue 17, eleventh session, branch sr5): the SR encoder of the alu_trim
# kernel with fewer ALU-pipe instructions (Nvfp4QuantizeSpec.sr_trim, kernels/nvfp4_sr.py; same
# bits, same random stream; perf/NOTES.md, "SR trim"). H200 run 62 (perf/probes/nvfp4_ab.py
# --switch SR_TRIM --rounds 3, bits identical): SR quantize 9.5-13.7% less time (35.6-38.4 ->
# 39.8-42.5% of copy). sm_90a only (the arch it was tested on); False for the A/B.
SR_TRIM = True


def sr_trim(trim: bool, stochastic: bool, arch: str) -> bool:
    """Whether this call's kernel takes ``sr_trim`` (the flag, on the kernels it exists for)."""
    return SR_TRIM and trim and stochastic and arch not in HW_E2M1_ARCHS


@functools.cache
def _spec(
    arch, rowwise, columnwise, rht, swizzled, fast_math, stochastic, chunk: int = -1,
    rht_mma: str = "auto", trim: bool = False, fma: bool = False, stsm: bool = False,
    srt: bool = False,
) -> Nvfp4QuantizeSpec:  # fmt: skip
    spec = Nvfp4QuantizeSpec(
        arch=arch,
        rowwise=rowwise,
        columnwise=columnwise,
        rht=rht,
        swizzled=swizzled,
        fast_math=fast_math,
        stochastic=stochastic,
        rht_mma=rht_mma,
        alu_trim=trim,
        fma_encoder=fma,
        sr_trim=srt,
    )
    if stsm and spec.stsm_restage_applies():
        spec = dataclasses.replace(spec, stsm_restage=True)
    if chunk == -1:
        return spec
    return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, chunk=chunk))


def _check_estimation_scale(scale, amax, columnwise: bool) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"amax_estimation_scale: expected a float, got {type(scale).__name__}")
    if not (0.0 < scale < float("inf")):
        raise ValueError(f"amax_estimation_scale: must be positive and finite, got {scale}")
    if amax is not None:
        raise ValueError("amax_estimation_scale: not with a given amax (it replaces the amax pass)")
    if not columnwise:
        raise ValueError("amax_estimation_scale: estimates the columnwise amax; columnwise=False")


def _check_rng_state(rng_state, stochastic_rounding: bool, device: torch.device):
    if rng_state is None:
        return None
    if not stochastic_rounding:
        raise ValueError("rng_state: only used with stochastic_rounding=True")
    if not isinstance(rng_state, torch.Tensor):
        raise TypeError(f"rng_state: expected a tensor, got {type(rng_state).__name__}")
    if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,):
        raise ValueError(
            f"rng_state: must be int64 of shape (2,) = (seed, offset), got {rng_state.dtype} "
            f"{tuple(rng_state.shape)}"
        )
    if rng_state.device != device:
        raise ValueError(f"rng_state: on {rng_state.device}, but x is on {device}")
    return rng_state.contiguous()


def _check_amax(amax, num_groups: int, device: torch.device) -> torch.Tensor:
    if isinstance(amax, (tuple, list)):
        if len(amax) != 2:
            raise ValueError("amax: expected (amax_row, amax_col) or a [2, G] tensor")
        for name, t in zip(("amax[0]", "amax[1]"), amax, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        amax = torch.stack([amax[0].reshape(-1), amax[1].reshape(-1)])
    if not isinstance(amax, torch.Tensor):
        raise TypeError(
            f"amax: expected a [2, G] tensor or a pair of [G] tensors, got {type(amax).__name__}"
        )
    if amax.dtype != torch.float32:
        raise TypeError(f"amax: must be float32, got {amax.dtype}")
    if tuple(amax.shape) != (2, num_groups):
        raise ValueError(f"amax: expected shape (2, {num_groups}), got {tuple(amax.shape)}")
    if amax.device != device:
        raise ValueError(f"amax: on {amax.device}, but x is on {device}")
    return amax.contiguous()


def output_parts(
    m_rows, n_cols: int, num_groups, rowwise: bool, columnwise: bool, host_splits=None,
    extents=None,
) -> dict:  # fmt: skip
    """name -> (shape, dtype) of every output buffer (None: not computed). Exact scale sizes
    for host splits, upper bounds (M + 127 G rows, M / 16 + 3 G columns) for device splits.
    Shared by the kernels' launch and the torch.library fake implementation (so it also takes
    symbolic sizes). ``extents``: (row-scale rows, column-scale columns) when known (the host
    tables' totals)."""
    cp = _round_up(n_cols // 16, 4)
    np_ = _round_up(n_cols, 128)
    if extents is not None:
        rs_rows, cs_cols = extents
    elif host_splits is not None:
        rs_rows = sum((s + 127) // 128 * 128 for s in host_splits)
        cs_cols = sum((s // 16 + 3) // 4 * 4 for s in host_splits)
    else:
        rs_rows = m_rows + 127 * num_groups
        cs_cols = m_rows // 16 + 3 * num_groups
    u8 = torch.uint8
    return {
        "row_data": ((m_rows, n_cols // 2), u8) if rowwise else None,
        "row_scales": ((rs_rows, cp), u8) if rowwise else None,
        "col_data": ((m_rows * n_cols // 2,), u8) if columnwise else None,
        "col_scales": ((np_ * cs_cols,), u8) if columnwise else None,
    }


def nvfp4_group_quantize(
    x: torch.Tensor,
    splits,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    rht: bool = True,
    sign_mask: int = DEFAULT_SIGN_MASK,
    swizzled_scales: bool = False,
    fast_math: bool = False,
    amax=None,
    stochastic_rounding: bool = False,
    rng_state: torch.Tensor | None = None,
    amax_estimation_scale: float | None = None,
) -> Nvfp4GroupedTensor:
    """Grouped NVFP4 quantization of bf16 ``x[sum(splits), N]`` (TE numerics, bit-exact).

    rowwise: 1x16-block NVFP4 of each group's rows. columnwise: NVFP4 of RHT(x_g^T) (16x16
    random Hadamard transform along tokens, ``sign_mask`` sign flips) or of x_g^T when ``rht``
    is False. ``amax``: per-group (row, col) amax to use; computed with ``group_amax`` when None.
    ``fast_math``: TE's fast-math (rcp.approx reciprocal, no bf16 rounding of the RHT output).
    ``stochastic_rounding``: the e2m1 values of both directions are rounded stochastically (TE's
    SR rule, docs/numerics.md §1.4; the scales are unchanged) with Philox4x32-10 bits drawn from
    ``rng_state`` (int64 [2] = (seed, offset) on x's device); when None, a fresh state of the
    call's own from torch's CUDA generator (``cutequant.rng``: reproducible from torch's seed,
    CUDA-graph safe; drawn 256 at a time outside graph capture). The bits are a function of the
    state and each block's position only, so a result is reproducible from its ``rng_state``.
    ``amax_estimation_scale``: post-RHT amax estimation (TE PR #2521, docs/numerics.md §3.4): the
    amax pass skips the RHT and sets ``amax_col = amax_row * scale`` (TE's defaults: 2.0 for
    activations, 1.0 for gradients); not with a given ``amax``.

    Inside ``torch.compile`` this runs as the ``cutequant::nvfp4_group_quantize`` op.
    """
    if torch.compiler.is_compiling():
        from cutequant import ops

        return ops.nvfp4_group_quantize_traced(
            x, splits, rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math, amax,
            stochastic_rounding, rng_state, amax_estimation_scale,
        )  # fmt: skip
    flags = (rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math,
             stochastic_rounding, amax_estimation_scale, _launch.rht_mma(),
             ALU_TRIM, FMA_ENCODER, STSM_RESTAGE, SR_TRIM)  # fmt: skip
    # stochastic rounding without a state keys as such; a replay takes a fresh state (rng.py),
    # a checked call draws it in run_quantize after the checks
    key, hit = replay.find(_RECORDS, x, splits, flags, (amax, rng_state))
    if hit is not None:  # replay.py: the checked call's launches again
        if stochastic_rounding is True and rng_state is None:
            rng_state = fresh_state(x.device)
        record, total, spans, layout = hit
        dev = x.device
        # a computed amax is the outputs buffer's "amax" part (run_quantize: ``packed``)
        outputs = packing.PackedOutputs(_launch.output_allocator(total, _U8, dev), spans)
        device_splits = replay.device_splits(splits)
        record.launch((x, amax, outputs.buf, rng_state, device_splits))
        tables = spans.get("tables")
        if tables is not None:  # device splits: this call's tables, in its outputs buffer
            layout = groups.device_layout(outputs.buf, *layout, tables[0])
        return _result(x, outputs, amax, layout, rng_state, rht, columnwise, sign_mask,
                           swizzled_scales, fast_math)  # fmt: skip
    m_rows, n_cols, num_groups, splits, amax, rng_state, arch = check_quantize(
        x, splits, rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math, amax,
        stochastic_rounding, rng_state, amax_estimation_scale,
    )  # fmt: skip
    with replay.recording() as rec:
        outputs, amax, layout, rng_state = run_quantize(
            x, splits, m_rows, n_cols, num_groups, arch, rowwise, columnwise, rht, sign_mask,
            swizzled_scales, fast_math, amax, stochastic_rounding, rng_state,
            amax_estimation_scale, packing.PackedOutputs,
        )  # fmt: skip
    if key is not None and rec.replayable(m_rows):
        device_splits = replay.device_splits(splits)
        bases = [x, amax, outputs.buf, rng_state, device_splits]
        record = replay.Replay(rec.launches, bases, rec.scratch)
        # a device-split layout's tables are its call's outputs buffer: the record keeps
        # (G, M) only, not a reference that would hold that buffer as long as the record
        kept = (layout.num_groups, m_rows) if "tables" in outputs.spans else layout
        _RECORDS.put(key, (record, outputs.buf.numel(), outputs.spans, kept))
    return _result(x, outputs, amax, layout, rng_state, rht, columnwise, sign_mask,
                   swizzled_scales, fast_math)  # fmt: skip


_RECORDS = replay.CallMemo()  # nvfp4_group_quantize's replayable calls (replay.py)
_U8 = torch.uint8


def _result(x, outputs, amax, layout, rng_state, rht, columnwise, sign_mask, swizzled, fast_math):
    return Nvfp4GroupedTensor(
        n_cols=x.shape[1],
        outputs=outputs,
        amax=amax,
        swizzled_scales=swizzled,
        rht=rht and columnwise,
        sign_mask=sign_mask,
        fast_math=fast_math,
        rng_state=rng_state,
        layout=layout,
    )


def check_quantize(
    x, splits, rowwise, columnwise, rht, sign_mask, swizzled_scales, fast_math, amax,
    stochastic_rounding, rng_state, amax_estimation_scale,
):  # fmt: skip
    """Every argument check of ``nvfp4_group_quantize`` (host only, before any launch).
    Returns (M, N, G, splits (the validated tuple for host splits), amax as a contiguous
    [2, G] tensor or None, rng_state, arch)."""
    m_rows, n_cols = _checks.check_x(x)
    for name, flag in (
        ("rowwise", rowwise),
        ("columnwise", columnwise),
        ("rht", rht),
        ("swizzled_scales", swizzled_scales),
        ("fast_math", fast_math),
        ("stochastic_rounding", stochastic_rounding),
    ):
        if flag is not True and flag is not False:
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: nothing to compute")
    _checks.check_sign_mask(sign_mask)
    num_groups = _num_groups(splits)
    host = groups.check_splits(splits, m_rows)
    if amax is not None:
        amax = _check_amax(amax, num_groups, x.device)
    if rng_state is not None:
        rng_state = _check_rng_state(rng_state, stochastic_rounding, x.device)
    if amax_estimation_scale is not None:
        _check_estimation_scale(amax_estimation_scale, amax, columnwise)
    arch = _checks.check_device(x)
    # a family missing on this arch: UnsupportedArchError now, before any allocation or launch
    _spec(
        arch,
        rowwise,
        columnwise,
        rht and columnwise,
        swizzled_scales,
        fast_math,
        stochastic_rounding,
        rht_mma=_launch.rht_mma(),
    )
    return m_rows, n_cols, num_groups, splits if host is None else host, amax, rng_state, arch


_SPECS: dict = {}


def _spec_and_grid(dev, arch, rowwise, columnwise, rht, swizzled, fast_math, stochastic,
                   trim=False):  # fmt: skip
    """(spec, grid size) of the quantize kernel for this variant on this GPU (cached)."""
    rht_mma = _launch.rht_mma()
    fma = fma_encoder(trim, stochastic, arch)
    stsm = STSM_RESTAGE
    srt = sr_trim(trim, stochastic, arch)
    key = (dev.index, arch, rowwise, columnwise, rht, swizzled, fast_math, stochastic, trim,
           rht_mma, fma, stsm, srt)  # fmt: skip
    hit = _SPECS.get(key)
    if hit is None:
        chunk = device_chunk(dev, rowwise, swizzled, fast_math, stochastic)
        spec = _spec(
            arch, rowwise, columnwise, rht, swizzled, fast_math, stochastic, chunk, rht_mma, trim,
            fma, stsm, srt,
        )  # fmt: skip
        hit = _SPECS[key] = (spec, _launch.grid_size(spec, dev))
    return hit


def _parts(m_rows, n_cols, num_groups, rowwise, columnwise, totals, packed, tables) -> dict:
    """``output_parts`` of a call (cached), with the computed amax (``packed``) and a
    device-split call's snapshot and tables (``tables``) as parts of the one allocation."""
    key = ("nvfp4", m_rows, n_cols, num_groups, rowwise, columnwise, totals, packed, tables)
    extents = totals[2:] if totals is not None else None
    return packing.carved_parts(
        key,
        lambda: output_parts(m_rows, n_cols, num_groups, rowwise, columnwise, None, extents),
        num_groups,
        2 if packed else 0,
        tables,
    )


def run_quantize(
    x, splits, m_rows, n_cols, num_groups, arch, rowwise, columnwise, rht, sign_mask,
    swizzled_scales, fast_math, amax, stochastic_rounding, rng_state, amax_estimation_scale,
    output_kind,
):  # fmt: skip
    """Launch the amax pass (when ``amax`` is None) and the quantize kernel on validated
    arguments. ``output_kind``: ``packing.PackedOutputs`` (eager calls) or
    ``packing.SeparateOutputs`` (the torch.library op). Returns (outputs, amax [2, G] or None
    when it is the outputs' "amax" part, layout, rng_state)."""
    dev = x.device
    if stochastic_rounding and rng_state is None:
        rng_state = fresh_state(dev)
    computed = amax is None
    carve = packing.carves_device_tables(output_kind, m_rows, splits)
    packed = computed and (carve or packing.carves_amax(output_kind, m_rows, splits))
    if computed and not packed:
        amax = new_amax(2, num_groups, m_rows, dev)  # the amax pass writes it
    if carve:  # device splits: the outputs' sizes are upper bounds, known before the tables
        outputs = output_kind.allocate(_parts(m_rows, n_cols, num_groups, rowwise, columnwise,
                                              None, packed, carve), dev)  # fmt: skip
        poison = (outputs.addr("amax", 0), 2 * num_groups) if packed else None
        into = (outputs.buf, outputs.spans["tables"][0])
        layout = groups.prepare_groups(
            splits, m_rows, dev, poison, validated=True, into=into, defer_tables=computed
        )
    else:
        layout = groups.prepare_groups(
            splits, m_rows, dev, poison=amax if computed else None, validated=True,
            defer_tables=computed,
        )  # fmt: skip
        parts = _parts(
            m_rows, n_cols, num_groups, rowwise, columnwise, layout.host_totals, packed, False
        )
        outputs = output_kind.allocate(parts, dev)
    amax_addr = outputs.addr("amax", 0) if packed else _launch.ptr(amax, 4)
    stream = _launch.raw_stream(dev)
    col_rht = rht and columnwise
    if computed:
        estimate = amax_estimation_scale is not None
        launch_group_amax(
            x,
            layout,
            amax_addr,
            rht=col_rht and not estimate,
            sign_mask=sign_mask,
            arch=arch,
            col_scale=float(amax_estimation_scale) if estimate else 1.0,
            stream=stream,
        )
    if m_rows > 0:
        spec, num_ctas = _spec_and_grid(
            dev, arch, rowwise, columnwise, col_rht, swizzled_scales, fast_math,
            stochastic_rounding, alu_trim(m_rows, n_cols),
        )  # fmt: skip
        dummy = groups.dummy_buffer(dev).data_ptr()  # for disabled outputs (never written)
        _launch.run_grouped(
            spec,
            _launch.ptr(x),
            m_rows,
            n_cols,
            layout,
            amax_addr,
            outputs.addr("row_data", dummy),
            outputs.addr("row_scales", dummy),
            outputs.addr("col_data", dummy),
            outputs.addr("col_scales", dummy),
            _launch.ptr(rng_state, 8) if stochastic_rounding else dummy,  # else never read
            sign_mask,
            layout.early_level(after_amax_pass=computed),
            num_ctas=num_ctas,
            stream=stream,
        )
    return outputs, amax, layout, rng_state
