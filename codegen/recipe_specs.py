"""Kernel specifications of the NVFP4 training recipe's kernels (issue 20): grouped dequantize
(NVFP4, FP8), 2D 16x16-block weight quantize and the fused fake-quant kernels, with their
tunables' constants and variant lists. Split from ``specs`` (which re-exports every name here,
so ``specs.DequantizeSpec`` and the like keep working); the spec rules are those of
``specs.KernelSpec``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from cutequant.codegen.specs import FP8_DTYPES, IN_DTYPES, KernelSpec

OUT_DTYPES = ("bf16", "f16", "f32")
DEQUANT_FORMATS = ("nvfp4", "e4m3", "e5m2")
# Tokens per CTA tile of a columnwise dequantize transposed back (DequantizeSpec.col_tokens):
# 64, the 64 x 128 tile (each column row read in 32-byte NVFP4 / 64-byte FP8 pieces); 128 and
# 256, tiles of 2 or 4 consecutive 64-row tiles x 64 columns (32 for f32 at 256), read 64-128
# (NVFP4) / 128-256 (FP8) contiguous bytes per column row (perf/NOTES.md, "longer runs per
# column row"; perf/probes/dequant_walk.py --ab tokens compares them)
DEQUANT_COL_TOKENS = (64, 128, 256)
# The one the runtime uses (runtime/dequant.py: COLUMNWISE_TOKENS) and precompile builds, for
# every kind (``dequant_columnwise_defaults``): 256, with the sub-tile ring below (without the
# ring the inverse RHT was 2-4 points faster at 128: its whole-tile 256-token variant spills).
DEQUANT_DEFAULT_COL_TOKENS = 256
# Shared-memory staging of the 256-token columnwise tiles (DequantizeSpec.col_ring): 0, the whole
# tile (32 KB: 6 CTAs per SM); 8, a ring of two 64-token sub-tile buffers (16 KB) with the
# registers bounded for 8 CTAs per SM (perf/NOTES.md, "sub-tile ring"), the default:
# H200, ninth session (perf/probes/dequant_walk.py --ab ring, % of copy, dense / 8 uneven / 64 /
# 256 groups, 0 -> 8): NVFP4 68.7 / 65.9 / 74.6 / 82.6 -> 78.4 / 82.4 / 85.8 / 87.0, inverse
# RHT 66.8 / 63.8 / 71.7 / 78.0 -> 79.4 / 82.4 / 87.0 / 87.7, FP8 77.9 / 73.0 / 78.4 / 79.0 ->
# 77.0 / 82.4 / 85.5 / 85.7. A bound for 10 CTAs per SM was slower than 8 everywhere but NVFP4
# dense (78.9%; it spilled 10-21 instructions in most variants): dropped.
DEQUANT_COL_RINGS = (0, 8)
DEQUANT_DEFAULT_COL_RING = 8
# NVFP4 compact scales of the 256-token tiles as one word per lane (DequantizeSpec.
# col_scale_words): with the ring, 78.5 / 82.6 / 85.9 / 86.8 -> 80.7 / 83.2 / 86.7 / 87.3% (the
# same run; the inverse RHT within +-0.4)
DEQUANT_DEFAULT_SCALE_WORDS = True


# Cache hints of a dequantize's data accesses (DequantizeSpec.cache_hints; perf/NOTES.md, "short
# calls"): "" none (left out of the key); "ld", data and scale loads as
# ld.global.nc.L1::no_allocate.L2::256B (read-only path, no L1 line, 256-byte L2 fills: the
# neighbouring tiles' pieces of a column / output row come in the same DRAM request); "st",
# output stores as st.global.cs (evict-first in L2); "ldst", both: the default. H200 runs 55-56
# (bits identical; 6 rotating inputs, 135+ MB, so that L2 cannot hold them between calls): NVFP4
# rowwise 82.4 / 85.0 / 87.3 / 87.9 -> 86.9 / 88.8 / 90.8 / 91.3% of copy, columnwise 80.8 /
# 83.5 / 86.3 / 86.9 -> 83.3 / 85.1 / 87.2 / 87.2, FP8 transposed 77.5 / 82.8 / 85.7 / 86.0 ->
# 82.5 / 84.4 / 87.0 / 87.4, FP8 rowwise and the inverse RHT within +-1; ncu with L2 flushed
# (dense): 32.1 -> 31.0 us (NVFP4 rowwise), 35.5 -> 34.4 us (FP8 transposed). "ld" alone lost
# 8-25% and "st" alone 0-4%
DEQUANT_CACHE_HINTS = ("", "ld", "st", "ldst")
DEQUANT_DEFAULT_CACHE_HINTS = "ldst"
# Sub-tiles per CTA of the last part of a 256-token ring kernel's walk (DequantizeSpec.col_tail,
# a run-time argument of that variant; the runtime's plan, runtime/dequant.py _tail_plan, picks
# how many row tiles go to them)
DEQUANT_TAIL_SUBTILES = (1, 2)
# The FP8 columnwise 256-token ring tiles transposed in registers instead of shared memory
# (DequantizeSpec.col_regs, threads per CTA; 0, off, is left out of the key): a lane decodes 8
# adjacent columns x 16 (128 threads) or 8 (256 threads) tokens and stores each token's 8
# columns, no stmatrix / LDS / barrier; every warp is independent of the others
# (perf/NOTES.md, "FP8 transposed dequantize in registers"; runtime/dequant.py COLUMNWISE_REGS)
DEQUANT_COL_REGS = (0, 128, 256)
# The default, 128 threads: H200 run 74 (twelfth session, `perf/probes/dequant_walk.py --ab regs
# --values 0,128,256`, two processes x 3 rounds, bits identical), FP8 transposed e4m3 -> bf16,
# % of copy, dense / 8 uneven / 64 / 256 groups: shared-memory ring 77.3-78.1 / 76.8-77.2 /
# 80.2-80.5 / 81.7-81.9 -> 82.5-83.6 / 84.5-84.8 / 86.6-86.9 / 86.1-86.2 (256 threads:
# 77.9-79.0 / 78.7-79.0 / 81.5-81.7 / 81.2-81.3).
DEQUANT_DEFAULT_COL_REGS = 128


def dequant_col_regs_default(fmt: str, out_dtype: str) -> int:
    """``col_regs`` of a columnwise dequantize transposed back on 256-token ring tiles, as the
    runtime picks it and precompile builds it: the register transpose for FP8 with 16-bit
    outputs, 0 (shared-memory staging) otherwise."""
    return DEQUANT_DEFAULT_COL_REGS if fmt != "nvfp4" and out_dtype != "f32" else 0


def dequant_columnwise_defaults(fmt: str, swizzled: bool) -> tuple[int, int, bool]:
    """(col_tokens, col_ring, col_scale_words) of a columnwise dequantize transposed back, as
    the runtime picks them and precompile builds them."""
    words = DEQUANT_DEFAULT_SCALE_WORDS and fmt == "nvfp4" and not swizzled
    return DEQUANT_DEFAULT_COL_TOKENS, DEQUANT_DEFAULT_COL_RING, words


@dataclass(frozen=True)
class DequantizeSpec(KernelSpec):
    """Grouped dequantize of NVFP4 (1D or 2D block scales: the same layouts) or FP8 per-group
    data back to ``out_dtype`` [M, N], one CTA per 64-token x 128-column tile, one launch.

    ``columnwise``: the input is the per-group transposed data ([N, M_g] blocks) and the kernel
    transposes it back; ``undo_rht`` (NVFP4 columnwise only) also applies the inverse 16x16 RHT
    along tokens (a fast Walsh-Hadamard transform in a fixed fp32 order, ``cutequant.reference.
    inverse_rht_exact``); ``swizzled``: NVFP4 scales in the cuBLASLt 128x4 layout."""

    template: ClassVar[str] = "dequantize.py.j2"
    family: ClassVar[str] = "dequantize"
    fmt: str = "nvfp4"
    columnwise: bool = False
    undo_rht: bool = False
    swizzled: bool = False
    out_dtype: str = "bf16"
    transposed_out: bool = False  # columnwise: keep the [N, M_g] blocks (no transpose back)
    # DEQUANT_COL_TOKENS: tokens per tile of the columnwise kernels transposed back (64, the
    # default, is left out of the key: those kernels keep their keys and sources)
    col_tokens: int = 64
    # DEQUANT_COL_RINGS: 0, the whole tile staged in shared memory (32 KB at 256 tokens: 6 CTAs
    # per SM); 8, 256-token tiles staged one 64-token sub-tile at a time through a ring of
    # two sub-tile buffers (16 KB: the registers, not shared memory, bound the CTAs per SM),
    # compiled for 8 CTAs per SM. 0 is left out of the key (those kernels keep their keys
    # and sources)
    col_ring: int = 0
    # NVFP4 compact scales, 256-token tiles: a lane loads one scale word (sub-tile q's 4 blocks)
    # instead of 4 bytes, handed out by a byte transpose over the quad, where the tile's 4
    # sub-tiles lie in one group (False, the default, is left out of the key)
    col_scale_words: bool = False
    # DEQUANT_CACHE_HINTS: cache hints of the data loads / output stores ("", the default, is
    # left out of the key: those kernels keep their keys and sources)
    cache_hints: str = DEQUANT_DEFAULT_CACHE_HINTS
    # 256-token ring tiles: the grid's last row CTAs ("tail CTAs", from a run-time index on) take
    # 1 or 2 64-row sub-tiles each (a run-time argument) instead of 4, so that the walk ends in
    # short CTAs (False, the default, is left out of the key)
    col_tail: bool = False
    # DEQUANT_COL_REGS: FP8 256-token ring tiles (16-bit outputs) transposed in registers, with
    # this many threads per CTA (0, the default, is left out of the key)
    col_regs: int = 0

    def __post_init__(self):
        super().__post_init__()
        transposes = self.columnwise and not self.transposed_out
        if self.col_regs not in DEQUANT_COL_REGS or (
            self.col_regs
            and not (
                transposes and self.fmt != "nvfp4" and self.col_ring and self.out_dtype != "f32"
            )
        ):
            raise ValueError(
                f"col_regs must be one of {DEQUANT_COL_REGS} (non-zero: FP8 256-token ring "
                f"tiles with 16-bit outputs only), got {self.col_regs!r}"
            )
        if self.cache_hints not in DEQUANT_CACHE_HINTS:
            raise ValueError(
                f"cache_hints must be one of {DEQUANT_CACHE_HINTS}, got {self.cache_hints!r}"
            )
        if self.col_tail and not (transposes and self.col_tokens == 256 and self.col_ring):
            raise ValueError("col_tail: 256-token columnwise tiles with the sub-tile ring only")
        if self.col_ring not in DEQUANT_COL_RINGS or (self.col_ring and self.col_tokens != 256):
            raise ValueError(
                f"col_ring must be one of {DEQUANT_COL_RINGS} (non-zero: 256-token columnwise "
                f"tiles only), got {self.col_ring!r}"
            )
        if self.col_tokens not in DEQUANT_COL_TOKENS or (self.col_tokens != 64 and not transposes):
            raise ValueError(
                f"col_tokens must be one of {DEQUANT_COL_TOKENS} for a columnwise dequantize "
                f"transposed back (else 64), got {self.col_tokens!r}"
            )
        if self.col_scale_words and (
            self.col_tokens != 256 or self.fmt != "nvfp4" or self.swizzled
        ):
            raise ValueError(
                "col_scale_words: 256-token NVFP4 columnwise tiles, compact scales only"
            )
        if self.transposed_out and (not self.columnwise or self.undo_rht):
            raise ValueError("transposed_out: columnwise data without undo_rht only")
        if self.fmt not in DEQUANT_FORMATS:
            raise ValueError(f"fmt must be one of {DEQUANT_FORMATS}, got {self.fmt!r}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {self.out_dtype!r}")
        if self.undo_rht and not (self.columnwise and self.fmt == "nvfp4"):
            raise ValueError("undo_rht applies to NVFP4 columnwise data only")
        if self.swizzled and self.fmt != "nvfp4":
            raise ValueError("swizzled applies to NVFP4 scales only")

    def fields(self) -> dict:
        out = super().fields()
        if out["col_tokens"] == 64:
            del out["col_tokens"]
        if out["col_ring"] == 0:
            del out["col_ring"]
        if not out["col_scale_words"]:
            del out["col_scale_words"]
        if not out["cache_hints"]:
            del out["cache_hints"]
        if not out["col_tail"]:
            del out["col_tail"]
        if not out["col_regs"]:
            del out["col_regs"]
        return out

    def render_fields(self) -> dict:
        return {
            **super().render_fields(),
            "col_tokens": self.col_tokens,
            "col_ring": self.col_ring,
            "col_scale_words": self.col_scale_words,
            "cache_hints": self.cache_hints,
            "col_tail": self.col_tail,
            "col_regs": self.col_regs,
        }


@dataclass(frozen=True)
class Nvfp4Quantize2dSpec(KernelSpec):
    """2D (16x16-block) NVFP4 quantization of E same-shaped weight matrices (docs/numerics.md
    §2), stacked [E, R, C] or a device array of E pointers (chosen at run time), in one launch:
    64 x 128 tiles of one expert as work items; with ``compute_amax`` (a run-time switch) the
    kernel first computes each expert's amax and passes a grid-wide barrier (a cooperative
    launch of at most ``RESIDENT_CTAS`` CTAs per SM), else one CTA per item. Outputs: rowwise
    data and/or the columnwise data (the exact nibble transpose), each block's e4m3 scale in
    both scale buffers (compact or swizzled; padding zeroed by one item per expert), or with
    ``fake_out`` the fused fake-quant [E, R, C]."""

    template: ClassVar[str] = "nvfp4_quantize_2d.py.j2"
    family: ClassVar[str] = "nvfp4_quantize_2d"
    # CTAs per SM of a cooperative grid; the kernel is compiled for it (.minnctapersm: <= 64
    # registers at 256 threads; ~6 KB of shared memory each), on every arch
    RESIDENT_CTAS: ClassVar[int] = 4
    in_dtype: str = "bf16"
    rowwise: bool = True
    columnwise: bool = True
    swizzled: bool = False
    fake_out: str = ""  # "bf16" / "f16": the fused fake-quant [E, R, C] instead of NVFP4 data

    def render_fields(self) -> dict:
        return {**super().render_fields(), "resident_ctas": self.RESIDENT_CTAS}

    def __post_init__(self):
        super().__post_init__()
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype must be one of {IN_DTYPES}, got {self.in_dtype!r}")
        if self.fake_out not in ("", "bf16", "f16"):
            raise ValueError(f"fake_out must be '', 'bf16' or 'f16', got {self.fake_out!r}")
        if self.fake_out and (self.swizzled or not self.rowwise):
            raise ValueError("fake_out: a quantize kernel with the default output switches")
        if not (self.rowwise or self.columnwise):
            raise ValueError("at least one of rowwise / columnwise must be set")


class _FakeQuantSrTrim:
    """The ``sr_trim`` switch of the fake-quant kernels (issue 20, eleventh session, branch fq7;
    the runtime's default on sm_90a, runtime/fake_quant.py's ``SR_TRIM``): the stochastic-rounding
    value path with the NVFP4 quantize's SR trims (``fake_quant.e2m1_sr_mag_sub``: the random
    byte as a subnormal FFMA operand, no clamp of |v| before the floor) and Philox with 32-bit
    block ids, the calls' common first rounds once per thread (``nvfp4_sr.philox_prefix``).
    Same bits, same random stream; the runtime asks for it only when every block id of the call
    is < 2^32. Needs stochastic. False: left out of the key and the source. Also what the two
    fake-quant specs share: their key, render fields and ``out_dtype`` rule."""

    def fields(self) -> dict:
        out = super().fields()
        if not out["sr_trim"]:
            del out["sr_trim"]
        return out

    def render_fields(self) -> dict:
        return {**super().render_fields(), "sr_trim": self.sr_trim}

    def __post_init__(self):
        super().__post_init__()
        if self.out_dtype not in ("bf16", "f16"):
            raise ValueError(f"out_dtype must be bf16 or f16, got {self.out_dtype!r}")
        if self.sr_trim and not self.stochastic:
            raise ValueError("sr_trim: the stochastic-rounding kernel only (needs stochastic)")


@dataclass(frozen=True)
class FakeQuantRowsSpec(_FakeQuantSrTrim, KernelSpec):
    """Fused rowwise NVFP4 fake-quant of grouped bf16 ``x`` [M, N]: per 16-element block
    quantize (RN or stochastic rounding) and dequantize in registers, ``out_dtype`` out; the
    values of dequantize(quantize(x)) bit for bit. One CTA per 64 x 128 tile. Stochastic
    rounding: the SR e2m1 value in fp32 with the fma.rz floor (``fake_quant.e2m1_sr_mag_rz``),
    output signs from x's words (``fake_quant.sign_select``), the block amax by packed bf16x2
    trees (``fake_quant.rows_block_amax2``) and random bytes by PRMT (``fake_quant.opaque_u32``):
    issue 20's forms, perf/NOTES.md ("retired A/B switches")."""

    template: ClassVar[str] = "fake_quant_rows.py.j2"
    family: ClassVar[str] = "fake_quant_rows"
    stochastic: bool = False
    out_dtype: str = "bf16"
    sr_trim: bool = False  # _FakeQuantSrTrim


@dataclass(frozen=True)
class FakeQuantColsSpec(_FakeQuantSrTrim, KernelSpec):
    """Fused columnwise NVFP4 fake-quant of grouped bf16 ``x`` [M, N] (the wgrad operands of
    the recipe): per group, the 16-token-block columnwise quantize of RHT(x_g^T) (or x_g^T; the
    RHT is a run-time switch, a warp-level mma.sync on every arch) dequantized in registers and
    written transposed ([N, M_g] per group) in ``out_dtype``: the values of
    dequantize(quantize(x)) bit for bit, no e2m1 data in memory. One CTA per 64-token x
    ``TILE_COLS``-column tile. Stochastic rounding: each warp's Philox words staged in shared
    memory in the layout the lanes read, the fma.rz SR floor, registers bounded for 4 CTAs per
    SM (issue 20's forms, perf/NOTES.md, "retired A/B switches")."""

    template: ClassVar[str] = "fake_quant_cols.py.j2"
    family: ClassVar[str] = "fake_quant_cols"
    # columns per CTA tile: 2 x 128 halves the per-tile setup (scale table, mma B fragments)
    # per value against 128, and keeps 8 16-byte loads per thread in flight
    TILE_COLS: ClassVar[int] = 256
    stochastic: bool = False
    out_dtype: str = "bf16"
    sr_trim: bool = False  # _FakeQuantSrTrim

    def render_fields(self) -> dict:
        return {**super().render_fields(), "tile_cols": self.TILE_COLS}


def dequant_ab_variants(arch: str = "sm_90a") -> list[KernelSpec]:
    """The dequantize variants the module flags ``dequant.CACHE_HINTS`` / ``COLUMNWISE_TAIL`` /
    ``COLUMNWISE_REGS`` select for A/B on the GPU (not in ``all_specs``; perf/NOTES.md, "short
    calls"): every dequantize kernel without cache hints (the form before "ldst" became the
    default), "ld" / "st" alone on the bf16 ones the bench times (compact scales), tail CTAs on
    every 256-token ring kernel, and the FP8 ring kernels with 16-bit outputs with the other
    ``col_regs`` choices (shared-memory staging, the form before the register transpose became
    the default, and 256 threads). tests/test_compile.py compiles them,
    tests/test_codegen.py lints them."""
    base = [s for s in recipe_variants(arch) if isinstance(s, DequantizeSpec)]
    bf16 = [s for s in base if s.out_dtype == "bf16"]
    out: list[KernelSpec] = [dataclasses.replace(s, cache_hints="") for s in base]
    out += [
        dataclasses.replace(s, cache_hints=hints)
        for s in bf16
        if not s.transposed_out and not s.swizzled
        for hints in ("ld", "st")
    ]
    out += [dataclasses.replace(s, col_tail=True) for s in base if s.col_ring]
    out += [
        dataclasses.replace(s, col_regs=threads)
        for s in base
        if s.col_ring and s.fmt != "nvfp4" and s.out_dtype != "f32"
        for threads in DEQUANT_COL_REGS
        if threads != s.col_regs
    ]
    return out


def recipe_variants(arch: str = "sm_90a") -> list[KernelSpec]:
    """Every variant of the recipe kernels (dequantize, 2D quantize, fake-quant) the runtime can
    ask for; ``cutequant.cli.all_specs`` includes them."""
    out: list[KernelSpec] = []
    for out_dtype in OUT_DTYPES:
        for swizzled in (False, True):
            out.append(DequantizeSpec(arch=arch, swizzled=swizzled, out_dtype=out_dtype))
            for undo_rht in (False, True):
                tokens, ring, words = dequant_columnwise_defaults("nvfp4", swizzled)
                out.append(
                    DequantizeSpec(
                        arch=arch,
                        columnwise=True,
                        undo_rht=undo_rht,
                        swizzled=swizzled,
                        out_dtype=out_dtype,
                        col_tokens=tokens,
                        col_ring=ring,
                        col_scale_words=words,
                    )
                )
        for fmt in FP8_DTYPES:
            for columnwise in (False, True):
                tokens, ring, _ = dequant_columnwise_defaults(fmt, False)
                out.append(
                    DequantizeSpec(
                        arch=arch,
                        fmt=fmt,
                        columnwise=columnwise,
                        out_dtype=out_dtype,
                        col_tokens=tokens if columnwise else 64,
                        col_ring=ring if columnwise else 0,
                        col_regs=dequant_col_regs_default(fmt, out_dtype) if columnwise else 0,
                    )
                )
    for out_dtype in ("bf16", "f16"):
        out.append(
            DequantizeSpec(arch=arch, columnwise=True, transposed_out=True, out_dtype=out_dtype)
        )
        for stochastic in (False, True):
            out.append(FakeQuantRowsSpec(arch=arch, stochastic=stochastic, out_dtype=out_dtype))
            out.append(FakeQuantColsSpec(arch=arch, stochastic=stochastic, out_dtype=out_dtype))
        for in_dtype in IN_DTYPES:
            out.append(Nvfp4Quantize2dSpec(arch=arch, in_dtype=in_dtype, fake_out=out_dtype))
    for in_dtype in IN_DTYPES:
        for rowwise, columnwise in ((True, True), (True, False), (False, True)):
            for swizzled in (False, True):
                out.append(
                    Nvfp4Quantize2dSpec(
                        arch=arch,
                        in_dtype=in_dtype,
                        rowwise=rowwise,
                        columnwise=columnwise,
                        swizzled=swizzled,
                    )
                )
    return out
