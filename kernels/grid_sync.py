"""A grid-wide barrier and a per-group maximum folded from runs of tiles, for persistent
kernels that compute an amax and then use it in the same launch (the 2D weight quantize).

Co-residency: a CTA spinning in the barrier waits for every other CTA of the grid, so all of
them must be resident at once. The runtime launches such a grid cooperatively
(``cudaLaunchAttributeCooperative``: the driver refuses a grid larger than the device can hold
at once, instead of letting it deadlock) with at most ``SMs x RESIDENT_CTAS`` CTAs, and the
kernel is compiled for that residency (``.minnctapersm``: registers, threads and shared memory
of RESIDENT_CTAS CTAs fit an SM). With programmatic dependent launch the CTAs may be placed while
the previous kernel finishes; that kernel completes without waiting for this one, so every CTA
of this grid still becomes resident.

The barrier's two words live in the stream's workspace (``groups.workspace(...).barrier``):
``word 0`` counts the CTAs that arrived in this launch, ``word 1`` is a generation number. One
thread per CTA reads the generation, releases the CTA's writes (``fence.acq_rel.gpu``) and
counts itself in; the last CTA sets the count back to zero and bumps the generation (release);
the others spin until the generation changes (acquire; the pattern of cooperative groups'
grid sync, with gpu-scope release / acquire instead of volatile accesses). The count is zero
again when the launch ends, so no launch needs host state, a memset or a reset (CUDA graphs
replay it as is), and the grid size may change from launch to launch. Kernels on one stream
run one after another (a PDL launch touches the words only after
``schedule.wait_prior_grids``), so the words need no more than the stream's order; like the
rest of the per-stream workspace they assume that graphs captured on one stream are not
replayed concurrently on two others.
"""

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import group_fold


def _addr(addr, loc, ip):
    return Int64(addr).ir_value(loc=loc, ip=ip)


def _load(ptx_type: str, order: str, addr, loc, ip):
    """A volatile gpu-scope load of ``order`` (relaxed / acquire)."""
    res = T.f32() if ptx_type == "f32" else T.i32()
    ptx = f"ld.{order}.gpu.global.{ptx_type} $0, [$1];"
    cons = ("=f" if ptx_type == "f32" else "=r") + ",l"
    return dev.volatile_asm(res, ptx, cons, [_addr(addr, loc, ip)])


@dsl_user_op
def _load_relaxed(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return Uint32(_load("u32", "relaxed", addr, loc, ip))


@dsl_user_op
def _load_acquire(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return Uint32(_load("u32", "acquire", addr, loc, ip))


@dsl_user_op
def _count_in(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return Uint32(
        dev.volatile_asm(
            T.i32(), "atom.relaxed.gpu.global.add.u32 $0, [$1], 1;", "=r,l", [_addr(addr, loc, ip)]
        )
    )


@dsl_user_op
def _add_n(addr: Int64, n: Int32, *, loc=None, ip=None) -> Uint32:
    return Uint32(
        dev.volatile_asm(
            T.i32(),
            "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;",
            "=r,l,r",
            [_addr(addr, loc, ip), Int32(n).ir_value(loc=loc, ip=ip)],
        )
    )


@dsl_user_op
def _store_zero(addr: Int64, *, loc=None, ip=None):
    dev.volatile_asm(None, "st.relaxed.gpu.global.u32 [$0], 0;", "l", [_addr(addr, loc, ip)])


@dsl_user_op
def _bump_release(addr: Int64, *, loc=None, ip=None):
    dev.volatile_asm(None, "red.release.gpu.global.add.u32 [$0], 1;", "l", [_addr(addr, loc, ip)])


@dsl_user_op
def _nanosleep(*, loc=None, ip=None):
    dev.volatile_asm(None, "nanosleep.u32 100;", "", [])


@dsl_user_op
def load_f32_relaxed(addr: Int64, *, loc=None, ip=None) -> Float32:
    """An fp32 another CTA wrote before the barrier: a volatile gpu-scope load (from L2, never a
    stale L1 line, and never hoisted above the barrier by the compiler)."""
    return Float32(_load("f32", "relaxed", addr, loc, ip))


@cute.jit
def arrive_and_wait(words: Int64, num_ctas: Int32):
    """All 32 lanes of one warp per CTA, between two CTA barriers (what the CTA wrote before
    the first is visible to every CTA after the second): the grid barrier described above.
    Lane 0 arrives; the whole warp spins (as ``launch_zeroing.wait_zeroed``: a spin in one
    lane of a diverged warp hung there once) and reconverges."""
    lane = cute.arch.lane_idx()
    gen = Uint32(0)
    before = Uint32(0)
    if lane == 0:
        gen = _load_relaxed(words + Int64(4))  # before arriving: it cannot move until all arrive
        dev.fence_acq_rel_gpu()  # release this CTA's writes before its arrival
        before = _count_in(words)
    gen = cute.arch.shuffle_sync(gen, 0)
    before = cute.arch.shuffle_sync(before, 0)
    if before == Uint32(num_ctas - 1):
        if lane == 0:
            dev.fence_acq_rel_gpu()  # acquire every other CTA's arrival (and what it released)
            _store_zero(words)  # the next launch starts from zero
            _bump_release(words + Int64(4))
    else:
        while _load_acquire(words + Int64(4)) == gen:
            _nanosleep()
    dev.fence_acq_rel_gpu()
    cute.arch.sync_warp()


@cute.jit
def fold_tiles(words: Int64, value: Float32, tiles: Int32, group_tiles: Int32, out: Int64):
    """One thread: fold the maximum ``value`` (>= 0 or NaN) of ``tiles`` consecutive tiles of a
    group into its two ``group_fold`` words and count the tiles in; the fold that completes the
    group's ``group_tiles`` writes the maximum to ``out`` and resets the words (as
    ``group_fold.finish_if_last``, counting tiles instead of CTAs: a persistent CTA folds once
    per run of tiles of one group)."""
    group_fold._red_max(words, dev.f32_bits(value) & Uint32(0x7FFFFFFF))
    dev.fence_acq_rel_gpu()  # the maximum is visible before the count that announces it
    before = Int32(_add_n(words + Int64(4), tiles))
    group_fold.finish_if_last(words, before + tiles - 1, group_tiles, out)
