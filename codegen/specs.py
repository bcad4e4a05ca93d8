"""Kernel specifications: the complete, hashable description of one compiled kernel.

A spec holds what changes the generated code or its binary: the family, its specialization
switches, the tile plan and the target arch. Nothing that varies from call to call (split
sizes, offsets, M, N, the SM count) may appear here: those are runtime arguments, so a
training loop never recompiles. ``spec.key()`` is the stable identity used by the in-memory
and on-disk caches; ``render_fields()`` is what the Jinja2 template sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import ClassVar

# Every arch a spec may target (nvidia-cutlass-dsl 4.8.1 compiles each). sm_90a (Hopper) is
# tested on hardware; sm_100a (B200/GB200) and sm_120a (RTX 50xx / RTX PRO Blackwell) are
# compile-checked only. A family lists the archs it exists on in its ``ARCHS`` class attribute.
ARCHS = ("sm_90a", "sm_100a", "sm_120a")
HOPPER_ARCHS = ("sm_90a",)  # families (or switches) built on wgmma
# Persistent kernels (kernels/schedule.py) ask for at least 115 KB of shared memory per CTA;
# sm_120a gives a CTA at most 99 KB (cutlass.memory.get_smem_capacity_in_bytes("sm_120")), so
# those families are not offered there (tests/test_compile.py checks every launch's smem).
PERSISTENT_ARCHS = ("sm_90a", "sm_100a")
# archs with the hardware e2m1 conversion (cvt.rn.satfinite.e2m1x2.f32): RN encodes with it
HW_E2M1_ARCHS = ("sm_100a", "sm_120a")
# The tensor-core instruction of the 16x16 RHT (spec field ``rht_mma`` of the NVFP4 quantize and
# RHT amax kernels): "wgmma" (warpgroup m64n16k16, sm_90a only) or "mma_sync" (warp-level
# m16n8k16, sm_80+: kernels/warp_rht.py). "auto", the field's default, is the arch's choice
# below; an explicit value equal to it is stored as "auto" (one form per kernel), and "auto" is
# left out of the key, so the sm_90a default kernels keep their keys and sources.
RHT_MMAS = ("wgmma", "mma_sync")
RHT_MMA_DEFAULT = {"sm_90a": "wgmma", "sm_100a": "mma_sync", "sm_120a": "mma_sync"}
# TilePlan.walk_band value for token-fastest walks over whole groups; equals
# cutequant.kernels.schedule.WHOLE_GROUP (a band wider than any group's row tiles).
WHOLE_GROUP_BAND = 1 << 26
IN_DTYPES = ("bf16", "f16", "f32")
FP8_DTYPES = ("e4m3", "e5m2")


@dataclass(frozen=True)
class TilePlan:
    """Static tiling of a grouped kernel: 64-row tiles (see kernels/schedule.py) of
    ``tile_cols`` columns, a ``stages``-deep TMA ring, ``consumer_warpgroups`` consumers, the
    tile walk's band height in row tiles (``walk_band``; 0 = the kernel's default),
    ``ctas_per_sm`` persistent CTAs launched per multiprocessor, and how the CTAs share the
    walk (``chunk``: -1 = the kernel's default, 0 = one contiguous range per CTA, k > 0 =
    round-robin chunks of k tiles; cast kernels only, see ``kernels/schedule.cta_runs``)."""

    tile_cols: int = 128
    stages: int = 4
    consumer_warpgroups: int = 2
    walk_band: int = 0
    ctas_per_sm: int = 1
    chunk: int = -1

    def __post_init__(self):
        if self.tile_cols % (64 * self.consumer_warpgroups):
            raise ValueError("tile_cols must split into 64-column slices, one per warpgroup")
        if not 2 <= self.stages <= 8:
            raise ValueError("stages must be in [2, 8]")
        if self.ctas_per_sm not in (1, 2):
            raise ValueError("ctas_per_sm must be 1 or 2")
        if not -1 <= self.chunk <= 1024:
            raise ValueError("chunk must be in [-1, 1024] (-1: the kernel's default)")
        if not (0 <= self.walk_band <= 1 << 20 or self.walk_band == WHOLE_GROUP_BAND):
            raise ValueError(
                "walk_band must be in [0, 2^20] (0: the kernel's default) or WHOLE_GROUP_BAND"
            )


class UnsupportedArchError(ValueError):
    """A family (or one of its switches) that does not exist on the requested arch."""


def _pdl_default() -> bool:
    """Programmatic dependent launch unless ``CUTEQUANT_PDL=0`` (read when a spec is made)."""
    return os.environ.get("CUTEQUANT_PDL", "1") != "0"


@dataclass(frozen=True)
class KernelSpec:
    """Base class: subclasses add their switches as dataclass fields.

    ``pdl``: launch with programmatic dependent launch (kernels/schedule.py, ``wait_prior_grids``).
    """

    template: ClassVar[str] = ""
    family: ClassVar[str] = ""
    ARCHS: ClassVar[tuple[str, ...]] = ARCHS  # the archs this family compiles for
    arch: str = "sm_90a"
    pdl: bool = field(default_factory=_pdl_default)

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.arch not in self.supported_archs():
            raise UnsupportedArchError(
                f"{self.variant_name()} is not available on {self.arch}; it exists on "
                f"{', '.join(self.supported_archs())} (cutequant supports {', '.join(ARCHS)})"
            )

    def supported_archs(self) -> tuple[str, ...]:
        """The archs this variant compiles for (the family's ``ARCHS`` unless a switch narrows
        them, e.g. an RHT built on wgmma)."""
        return type(self).ARCHS

    def variant_name(self) -> str:
        """The family, or the family and the switch that limits its archs (error messages)."""
        return self.family

    def fields(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return out

    def key(self) -> str:
        """Stable identity: family plus every field (arch included), as canonical JSON."""
        return json.dumps({"family": self.family, **self.fields()}, sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(self.key().encode()).hexdigest()

    def source_fields(self) -> dict:
        """Fields that shape the rendered source, the arch aside (``render_fields`` adds it: it
        picks the e2m1 encoder and the RHT instruction; ``codegen.module_name`` hashes it)."""
        out = self.fields()
        out.pop("arch")
        plan = out.pop("plan", {})
        return {**out, **plan}

    def render_fields(self) -> dict:
        return {
            **self.source_fields(),
            "spec_repr": self.describe(),
            "arch": self.arch,
            "hw_e2m1": self.arch in HW_E2M1_ARCHS,
        }

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.source_fields().items())]
        return f"{self.family}({', '.join(parts)})"


class _RhtMma:
    """The ``rht_mma`` switch (see RHT_MMAS) of the kernels with a tensor-core RHT."""

    def uses_rht_mma(self) -> bool:
        """Whether ``rht_mma`` shapes this kernel (else it stays "auto")."""
        return True

    def _normalize_rht_mma(self) -> None:
        """Before the arch check: "auto" for the arch's own choice (or where no RHT is built)."""
        if self.rht_mma not in ("auto", *RHT_MMAS):
            raise ValueError(
                f"rht_mma must be one of auto, {', '.join(RHT_MMAS)}, got {self.rht_mma!r}"
            )
        if not self.uses_rht_mma() or self.rht_mma == RHT_MMA_DEFAULT.get(self.arch):
            object.__setattr__(self, "rht_mma", "auto")

    def rht_mma_kind(self) -> str:
        """The instruction this kernel's RHT uses: "wgmma" or "mma_sync"."""
        return RHT_MMA_DEFAULT[self.arch] if self.rht_mma == "auto" else self.rht_mma

    def fields(self) -> dict:
        out = super().fields()
        if out["rht_mma"] == "auto":
            del out["rht_mma"]
        return out

    def render_fields(self) -> dict:
        return {**super().render_fields(), "rht_mma": self.rht_mma_kind()}


def _no_chunks(spec) -> None:
    """Round-robin chunks (TilePlan.chunk) are built into the cast kernels only."""
    if spec.plan.chunk != -1:
        raise ValueError(
            f"plan.chunk: only the cast kernels take round-robin chunks: {spec.family}"
        )


@dataclass(frozen=True)
class GroupAmaxSpec(_RhtMma, KernelSpec):
    """Grouped amax, optionally of the 16x16 RHT along tokens
    (TE's nvte_group_hadamard_transform_amax). ``rht_mma``: the RHT's instruction (RHT_MMAS;
    without the RHT it stays "auto")."""

    template: ClassVar[str] = "group_amax.py.j2"
    family: ClassVar[str] = "group_amax"
    ARCHS: ClassVar[tuple[str, ...]] = PERSISTENT_ARCHS
    RHT_ARCHS: ClassVar[tuple[str, ...]] = PERSISTENT_ARCHS  # wgmma on sm_90a, else mma.sync
    rht: bool = True
    in_dtype: str = "bf16"
    plan: TilePlan = field(default_factory=lambda: TilePlan(tile_cols=128, stages=6))
    rht_mma: str = "auto"
    # "" (the tables are given) or the dtype of device split sizes ("int32", "int64") from
    # which every CTA builds the call's tables at its head (kernels/tables.py), so that a
    # device-split call needs no table kernel. Left out of the key when "".
    device_splits: str = ""

    DEVICE_SPLITS: ClassVar[tuple[str, ...]] = ("", "int32", "int64")

    def uses_rht_mma(self) -> bool:
        return self.rht

    def __post_init__(self):
        self._normalize_rht_mma()
        super().__post_init__()
        _no_chunks(self)
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype must be one of {IN_DTYPES}, got {self.in_dtype!r}")
        if self.rht and self.in_dtype != "bf16":
            raise ValueError("the RHT amax is defined for bf16 input only")
        if self.device_splits not in self.DEVICE_SPLITS:
            raise ValueError(
                f"device_splits must be one of {self.DEVICE_SPLITS}, got {self.device_splits!r}"
            )

    def fields(self) -> dict:
        out = super().fields()
        if not out["device_splits"]:
            del out["device_splits"]
        return out

    def render_fields(self) -> dict:
        return {**super().render_fields(), "device_splits": self.device_splits}

    def supported_archs(self) -> tuple[str, ...]:
        if not self.rht:
            return type(self).ARCHS
        return HOPPER_ARCHS if self.rht_mma == "wgmma" else self.RHT_ARCHS

    def variant_name(self) -> str:
        if self.rht_mma == "wgmma":
            return "group_amax with rht=true and rht_mma=wgmma"
        return "group_amax with rht=true" if self.rht else self.family


@dataclass(frozen=True)
class GroupTablesSpec(KernelSpec):
    """Device-side construction of the grouped lookup tables from a device splits tensor."""

    template: ClassVar[str] = "group_tables.py.j2"
    family: ClassVar[str] = "group_tables"
    splits_int64: bool = False


class _CastWalk:
    """The tile walk of a cast kernel (NVFP4, FP8): the plan's band, else token-fastest over
    whole groups when a transposed output is written, column-fastest without one
    (kernels/schedule.py). One rule for the template and for the runtime's L2 hand-off from the
    amax pass, which must walk the same way."""

    def walk_band(self) -> int:
        return self.plan.walk_band or (WHOLE_GROUP_BAND if self.columnwise else 1)

    def render_fields(self) -> dict:
        return {**super().render_fields(), "walk": self.walk_band()}


@dataclass(frozen=True)
class Nvfp4QuantizeSpec(_CastWalk, _RhtMma, KernelSpec):
    """Grouped NVFP4 quantize: rowwise (raw x) and/or columnwise (RHT(x^T) or x^T) from one read.
    ``rht_mma``: the RHT's instruction (RHT_MMAS); it applies without the RHT too: the wgmma
    kernels build their (then unused) wgmma operands in every variant, the mma.sync ones none."""

    template: ClassVar[str] = "nvfp4_quantize.py.j2"
    family: ClassVar[str] = "nvfp4_quantize"
    # a persistent kernel (>= 115 KB of shared memory per CTA; 140-165 KB with its restaging
    # buffers): not on sm_120a
    ARCHS: ClassVar[tuple[str, ...]] = PERSISTENT_ARCHS
    rowwise: bool = True
    columnwise: bool = True
    rht: bool = True
    swizzled: bool = False
    fast_math: bool = False
    stochastic: bool = False
    plan: TilePlan = field(default_factory=lambda: TilePlan(tile_cols=128, stages=4))
    rht_mma: str = "auto"
    # True (issue 17, tenth session, branch speed4; what the runtime runs below 2^32 elements):
    # the hot loops with fewer ALU-pipe instructions (kernels/nvfp4_trim.py: enc-table
    # addresses and the ring position by IMAD, the encoder's multipliers as loop-invariant
    # operands, unmasked stores for whole blocks, 32-bit offsets); runtime/nvfp4.py's ALU_TRIM.
    # Same bits. False: 64-bit offsets (larger calls, and the A/B); left out of the key then.
    alu_trim: bool = False
    # True (issue 17, eleventh session, branch alu5; the runtime's default, runtime/nvfp4.py's
    # FMA_ENCODER): the RN encoder with part of its work on the FMA pipe (kernels/nvfp4_fma.py:
    # two bf16 candidates and the saturation in one 3-input min, the nibbles and signs gathered
    # by IMAD). Same bits. Needs alu_trim (its opaque operands); sm_90a's software encoder only
    # (not SR, not the hardware cvt). False: left out of the key and the source.
    fma_encoder: bool = False
    # True (issue 17, eleventh session, branch trim6; an A/B variant, runtime/nvfp4.py's
    # STSM_RESTAGE): fast math's fp32 restage stores the wgmma accumulators as they sit with
    # stmatrix (the RHT matrix's columns permuted so that an 8x8 b16 matrix row is four
    # consecutive fp32 tokens; 8 STSM.x4 a tile) instead of gathering four tokens into each
    # 16-byte store (8 STS.128 fed by 32 register moves: perf/NOTES.md, "Hot-loop census").
    # Same bits out. Fast math with the RHT by wgmma only (not SR). False: left out of the key
    # and the source.
    stsm_restage: bool = False
    # True (issue 17, eleventh session, branch sr5; the runtime's default on sm_90a, SR_TRIM):
    # the SR encoder with fewer ALU-pipe instructions (kernels/nvfp4_sr.py: no clamp of |v|, the
    # random byte as a subnormal FFMA operand, the grid floor clamped and packed on pair words,
    # nibbles and signs gathered by IMAD). Same bits, same random stream. Needs alu_trim (its
    # opaque operands) and stochastic. False: left out of the key and the source.
    sr_trim: bool = False
    # the chunk the runtime asks for on GPUs with little DRAM bandwidth per SM clock (8 beat 16
    # on the H100: 16 uneven groups of 7168 columns 375 vs 416 us; runtime/nvfp4.py)
    MEMORY_BOUND_CHUNK: ClassVar[int] = 8

    def fields(self) -> dict:
        out = super().fields()
        for name in ("alu_trim", "fma_encoder", "stsm_restage", "sr_trim"):  # off: not in the key
            if not out[name]:
                del out[name]
        return out

    def round_robin_chunk(self) -> int:
        """Tiles per round-robin chunk of the walk (kernels/schedule.py, ``cta_runs``); 0, the
        default: one contiguous range per CTA, rendered without the loop over runs (that loop
        alone cost the H200 kernel 2-3%: perf/NOTES.md attempt 55). The runtime asks for
        chunks on GPUs with little DRAM bandwidth per SM clock (``nvfp4.device_chunk``)."""
        return max(self.plan.chunk, 0)

    def render_fields(self) -> dict:
        return {
            **super().render_fields(),
            "chunk": self.round_robin_chunk(),
            "alu_trim": self.alu_trim,
            "fma_encoder": self.fma_encoder,
            "stsm_restage": self.stsm_restage,
            "sr_trim": self.sr_trim,
        }

    def supported_archs(self) -> tuple[str, ...]:
        return HOPPER_ARCHS if self.rht_mma == "wgmma" else type(self).ARCHS

    def variant_name(self) -> str:
        return f"{self.family} with rht_mma=wgmma" if self.rht_mma == "wgmma" else self.family

    def __post_init__(self):
        self._normalize_rht_mma()
        super().__post_init__()
        if not (self.rowwise or self.columnwise):
            raise ValueError("at least one of rowwise / columnwise must be set")
        if self.rht and not self.columnwise:
            raise ValueError("rht applies to the columnwise output only")
        hw_e2m1 = self.arch in HW_E2M1_ARCHS
        if self.fma_encoder and (not self.alu_trim or self.stochastic or hw_e2m1):
            raise ValueError(
                "fma_encoder: the RN software encoder of the alu_trim kernel only (needs alu_trim, "
                "not stochastic, an arch without the e2m1 cvt)"
            )
        if self.stsm_restage and not self.stsm_restage_applies():
            raise ValueError(
                "stsm_restage: fast math's columnwise RHT by wgmma only (fast_math, columnwise, "
                "rht, rht_mma wgmma, not stochastic)"
            )
        if self.sr_trim and not (self.alu_trim and self.stochastic):
            raise ValueError(
                "sr_trim: the SR encoder of the alu_trim kernel only (needs alu_trim, stochastic)"
            )

    def stsm_restage_applies(self) -> bool:
        """Whether this kernel has the restage that ``stsm_restage`` changes: fast math's fp32
        restage of the wgmma RHT (RN; the SR kernels are left as they are)."""
        return (
            self.fast_math
            and self.columnwise
            and self.rht
            and not self.stochastic
            and self.rht_mma_kind() == "wgmma"
        )


@dataclass(frozen=True)
class Fp8QuantizeSpec(_CastWalk, KernelSpec):
    """Grouped FP8 per-tensor cast (current or delayed scaling), rowwise and/or transposed."""

    template: ClassVar[str] = "fp8_quantize.py.j2"
    family: ClassVar[str] = "fp8_quantize"
    ARCHS: ClassVar[tuple[str, ...]] = PERSISTENT_ARCHS
    in_dtype: str = "bf16"
    fp8_dtype: str = "e4m3"
    delayed: bool = False
    rowwise: bool = True
    columnwise: bool = True
    plan: TilePlan = field(default_factory=lambda: TilePlan(tile_cols=128, stages=4))

    def round_robin_chunk(self) -> int:
        """Tiles per round-robin chunk of the walk (0: contiguous ranges; kernels/schedule.py,
        ``cta_runs``). Default (H200 sweeps, perf/NOTES.md attempt 54): 8 when a rowwise output
        is written (4 and 16 were 1-5% slower on grouped shapes with both outputs), 16 for the
        transposed output alone (longer runs of its token-contiguous rows; 8 was 1-2% slower
        at 128-256 groups)."""
        if self.plan.chunk >= 0:
            return self.plan.chunk
        return 8 if self.rowwise else 16

    def render_fields(self) -> dict:
        return {**super().render_fields(), "chunk": self.round_robin_chunk()}

    def __post_init__(self):
        super().__post_init__()
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype must be one of {IN_DTYPES}, got {self.in_dtype!r}")
        if self.fp8_dtype not in FP8_DTYPES:
            raise ValueError(f"fp8_dtype must be one of {FP8_DTYPES}, got {self.fp8_dtype!r}")
        if not (self.rowwise or self.columnwise):
            raise ValueError("at least one of rowwise / columnwise must be set")


@dataclass(frozen=True)
class Fp8TileCastSpec(KernelSpec):
    """Grouped FP8 per-tensor cast with both outputs, of 16-bit inputs, current or delayed
    scaling: one CTA per tile, 16-byte global loads, no TMA ring. The same arguments and outputs
    as Fp8QuantizeSpec's kernel, faster for these variants (perf/NOTES.md attempts 63, 64)."""

    template: ClassVar[str] = "fp8_tile_cast.py.j2"
    family: ClassVar[str] = "fp8_tile_cast"
    in_dtype: str = "bf16"
    fp8_dtype: str = "e4m3"
    delayed: bool = False
    tile_cols: int = 128  # columns per tile; 2 * tile_cols threads per CTA

    @staticmethod
    def default_tile_cols(delayed: bool) -> int:
        """H200 A/B, 6 shapes (perf/NOTES.md attempt 64): with delayed scaling every CTA folds
        its amax into its group's words with two atomics, and 256 columns (half the CTAs) are
        1-2% faster than 128 (64: 12-20% slower); current scaling has no fold, and 128 is
        0.5-1.5% faster than 256."""
        return 256 if delayed else 128

    def __post_init__(self):
        super().__post_init__()
        if self.tile_cols not in (64, 128, 256):
            raise ValueError(f"tile_cols must be 64, 128 or 256, got {self.tile_cols}")
        if self.in_dtype not in ("bf16", "f16"):
            raise ValueError(f"in_dtype must be bf16 or f16, got {self.in_dtype!r}")
        if self.fp8_dtype not in FP8_DTYPES:
            raise ValueError(f"fp8_dtype must be one of {FP8_DTYPES}, got {self.fp8_dtype!r}")


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
    is < 2^32. Needs stochastic. False: left out of the key and the source."""

    def _sr_trim_fields(self, out: dict) -> dict:
        if not out["sr_trim"]:
            del out["sr_trim"]
        return out

    def _check_sr_trim(self) -> None:
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

    def fields(self) -> dict:
        return self._sr_trim_fields(super().fields())

    def render_fields(self) -> dict:
        return {**super().render_fields(), "sr_trim": self.sr_trim}

    def __post_init__(self):
        super().__post_init__()
        if self.out_dtype not in ("bf16", "f16"):
            raise ValueError(f"out_dtype must be bf16 or f16, got {self.out_dtype!r}")
        self._check_sr_trim()


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

    def fields(self) -> dict:
        return self._sr_trim_fields(super().fields())

    def render_fields(self) -> dict:
        return {**super().render_fields(), "tile_cols": self.TILE_COLS, "sr_trim": self.sr_trim}

    def __post_init__(self):
        super().__post_init__()
        if self.out_dtype not in ("bf16", "f16"):
            raise ValueError(f"out_dtype must be bf16 or f16, got {self.out_dtype!r}")
        self._check_sr_trim()


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
