"""A per-group maximum folded from one value per CTA, with no zeroing launch.

The one-CTA-per-tile FP8 cast with delayed scaling records each group's amax. Its grid has one
CTA per tile (5120 for a dense 8192 x 5120 input), so the head-of-kernel zeroing of
``kernels/launch_zeroing.py`` (a ticket per CTA, a wait for the zeroing CTA before the first
atomic) would sit on every CTA's path. Instead each group has two 32-bit workspace words that
are zero between launches:

* ``word 0``: the running maximum (non-negative fp32 bit patterns order like unsigned integers,
  NaN above inf), folded in with a fire-and-forget ``red.max``;
* ``word 1``: the number of the group's CTAs that have arrived.

One thread of every CTA folds its value, releases it (``fence.acq_rel.gpu``, the pattern of
CUDA's threadfence reduction) and counts itself in. The CTA that brings the count to the
group's number of tiles is the last one: it acquires, copies the maximum to the output and sets
both words back to zero, so the next launch finds them zero without a memset node (1.2-1.3 us
per call, perf/NOTES.md attempt 15) and without a ticket.

The words live in one stream's workspace (``groups.workspace(...).fold``): kernels on a
stream run one after another, and a kernel launched early (programmatic dependent launch)
touches them only after ``schedule.wait_prior_grids``, when the previous launch's last CTAs
have reset them. Like ``kernels/launch_zeroing.py``'s counters they assume that the stream's
kernels do not run concurrently (e.g. two CUDA graphs captured on one stream and replayed at
once on two others).
If a launch never completes (a crashed context) the words are not reset; the next context
allocates new ones.
"""

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev


@dsl_user_op
def _red_max(addr: Int64, value: Uint32, *, loc=None, ip=None):
    dev.volatile_asm(
        None,
        "red.relaxed.gpu.global.max.u32 [$0], $1;",
        "l,r",
        [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
    )


@dsl_user_op
def _count_in(addr: Int64, *, loc=None, ip=None) -> Int32:
    return Int32(
        dev.volatile_asm(
            T.i32(),
            "atom.relaxed.gpu.global.add.u32 $0, [$1], 1;",
            "=r,l",
            [Int64(addr).ir_value(loc=loc, ip=ip)],
        )
    )


@dsl_user_op
def _load_relaxed(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return Uint32(
        dev.volatile_asm(
            T.i32(),
            "ld.relaxed.gpu.global.u32 $0, [$1];",
            "=r,l",
            [Int64(addr).ir_value(loc=loc, ip=ip)],
        )
    )


@dsl_user_op
def _store_relaxed(addr: Int64, value: Uint32, *, loc=None, ip=None):
    dev.volatile_asm(
        None,
        "st.relaxed.gpu.global.u32 [$0], $1;",
        "l,r",
        [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
    )


@cute.jit
def arrive(words: Int64, value: Float32) -> Int32:
    """One thread per CTA: fold ``value`` (>= 0 or NaN) into the group's maximum at ``words``
    (global address of its two workspace words) and count the CTA in. Returns the count before
    this arrival, for ``finish_if_last``; the caller may issue other stores in between."""
    _red_max(words, dev.f32_bits(value) & Uint32(0x7FFFFFFF))
    dev.fence_acq_rel_gpu()  # the maximum is visible before the count that announces it
    return _count_in(words + Int64(4))


@cute.jit
def finish_if_last(words: Int64, before: Int32, ctas: Int32, out: Int64):
    """The same thread after ``arrive``: if this CTA was the group's last of ``ctas``, write the
    maximum as fp32 to ``out`` and reset the two words for the next launch."""
    if before == ctas - 1:
        dev.fence_acq_rel_gpu()  # every other CTA's maximum happened before its count
        dev.st_global_b32(out, _load_relaxed(words))
        _store_relaxed(words, Uint32(0))
        _store_relaxed(words + Int64(4), Uint32(0))
