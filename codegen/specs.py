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


# The recipe kernels' specs live in recipe_specs (file size); every name is re-exported here.
from cutequant.codegen.recipe_specs import *  # noqa: E402, F403
