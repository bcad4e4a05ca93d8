"""Zeroing accumulated outputs inside the kernel that accumulates into them.

The amax outputs are filled with ``atomicMax`` by every CTA, so they must hold 0 before the
first atomic. A memset in front of the kernel costs a graph node per call (measured 1.2-1.3 us
per call on an H200, 5% of the dense 8192x5120 amax call); a last-CTA hand-off (accumulate in a
workspace, the last CTA copies out and re-zeroes) costs more, because its counter round trip sits
at the kernel's tail (+0.9 us, perf/NOTES.md attempt 15). Here the zeroing happens at the
kernel's *head*, off the critical path:

* one warp of every CTA takes a ticket from a 64-bit counter that the runtime keeps per
  (device, stream, grid size) and never resets; kernels on one stream run one after another
  (with programmatic dependent launch they may start early, but take no ticket before their
  ``schedule.wait_prior_grids``) and every CTA takes exactly one ticket, so ``ticket // grid``
  numbers the launch and ``ticket % grid == 0`` picks one CTA of it, the first to arrive;
* that CTA zeroes the outputs and publishes ``launch + 1`` in the counter's second word
  (release, gpu scope);
* every CTA's warp waits for that word (acquire) and arrives on a one-arrival mbarrier in its
  shared memory; the warps that flush a maximum wait on it (acquire, CTA scope) before their
  first atomic. By then (after at least one tile) it has long completed, so nothing waits in
  practice.

No deadlock: the CTA that zeroes is running by definition and waits for nothing. The counter
words are ``counter[0]`` (tickets) and ``counter[1]`` (the last launch whose zeroing finished).
Like the rest of the per-stream workspace, a counter assumes that its stream's kernels do not
run concurrently (e.g. two CUDA graphs captured on one stream replayed at once on two others).
Bad device splits (no tiles at all): nothing is zeroed, the runtime's NaN poison stays.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev
from cutequant.kernels import schedule as sched


@dsl_user_op
def _take_ticket(counter: Int64, *, loc=None, ip=None) -> Int64:
    return Int64(
        dev.volatile_asm(
            T.i64(),
            "atom.relaxed.gpu.global.add.u64 $0, [$1], 1;",
            "=l,l",
            [Int64(counter).ir_value(loc=loc, ip=ip)],
        )
    )


@dsl_user_op
def _publish(addr: Int64, value: Int64, *, loc=None, ip=None):
    # max, not a plain store: the word only ever grows
    dev.volatile_asm(
        None,
        "red.release.gpu.global.max.u64 [$0], $1;",
        "l,l",
        [Int64(addr).ir_value(loc=loc, ip=ip), Int64(value).ir_value(loc=loc, ip=ip)],
    )


@dsl_user_op
def _load_acquire_gpu(addr: Int64, *, loc=None, ip=None) -> Int64:
    return Int64(
        dev.volatile_asm(
            T.i64(),
            "ld.acquire.gpu.global.u64 $0, [$1];",
            "=l,l",
            [Int64(addr).ir_value(loc=loc, ip=ip)],
        )
    )


@dsl_user_op
def _store_zero(addr: Int64, *, loc=None, ip=None):
    dev.volatile_asm(None, "st.global.b32 [$0], 0;", "l", [Int64(addr).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def _nanosleep(*, loc=None, ip=None):
    dev.volatile_asm(None, "nanosleep.u32 64;", "", [])


@dsl_user_op
def init_done_barrier(addr: Int32, *, loc=None, ip=None):
    """One thread, before the pipeline's mbarrier-init fence and CTA-wide barrier: the CTA's
    "outputs are zero" mbarrier (8 bytes of shared memory at ``addr``, one arrival)."""
    dev.volatile_asm(
        None, "mbarrier.init.shared::cta.b64 [$0], 1;", "r", [Int32(addr).ir_value(loc=loc, ip=ip)]
    )


@dsl_user_op
def _arrive(addr: Int32, *, loc=None, ip=None):
    dev.volatile_asm(
        None,
        "mbarrier.arrive.release.cta.shared::cta.b64 _, [$0];",
        "r",
        [Int32(addr).ir_value(loc=loc, ip=ip)],
    )


@dsl_user_op
def _try_wait(addr: Int32, *, loc=None, ip=None) -> Int32:
    ptx = (
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [$1], 0;\n\t"
        "selp.b32 $0, 1, 0, p;\n\t}"
    )
    return Int32(dev.volatile_asm(T.i32(), ptx, "=r,r", [Int32(addr).ir_value(loc=loc, ip=ip)]))


@cute.jit
def zero_once_per_launch(counter: Int64, num_ctas: Int32, out: Int64, words: Int32, done: Int32):
    """Run by one whole warp of every CTA, unconditionally: the launch's first CTA zeroes
    ``words`` 32-bit words at ``out`` (global address); every CTA then arrives on its ``done``
    mbarrier (``init_done_barrier``) once they are zero."""
    lane = cute.arch.lane_idx()
    launch = Int64(0)
    first = Int32(0)
    if lane == 0:
        ticket = _take_ticket(counter)
        launch = ticket // Int64(num_ctas)
        if ticket - launch * Int64(num_ctas) == Int64(0):
            first = Int32(1)
    first = cute.arch.shuffle_sync(first, 0)
    if first == 1:
        for i in range(lane, words, 32):
            _store_zero(out + Int64(i) * Int64(4))
        dev.fence_acq_rel_gpu()
        cute.arch.sync_warp()
        if lane == 0:
            _publish(counter + Int64(8), launch + Int64(1))
    if lane == 0:  # the other lanes have exited: nothing in this warp waits for lane 0
        while _load_acquire_gpu(counter + Int64(8)) <= launch:
            _nanosleep()
        _arrive(done)


@cute.jit
def zero_group_outputs(
    counter: Int64,
    tables: cute.Tensor,
    num_groups: Int32,
    words_per_group: cutlass.Constexpr,
    out: Int64,
    done: Int32,
):
    """``zero_once_per_launch`` of ``words_per_group`` 32-bit words per group at ``out``, or of
    nothing when the call has no tiles at all (bad device splits): then the runtime's NaN poison
    stays in place."""
    words = Int32(0)
    if tables[sched.ROWTILE_START, num_groups] > 0:
        words = words_per_group * num_groups
    gdim, _, _ = cute.arch.grid_dim()
    zero_once_per_launch(counter, gdim, out, words, done)


@cute.jit
def wait_zeroed(done: Int32):
    """By every lane of a warp, before the warp's first atomic into the zeroed outputs.

    Every lane waits, then the warp reconverges: a first version spun in lane 0 only (inside
    ``if lane == 0``, the other lanes parked at the branch's reconvergence point) and hung the
    no-RHT amax kernel on 64-group inputs; the whole-warp wait never did (12 x 2 shapes)."""
    while _try_wait(done) == 0:
        _nanosleep()
    cute.arch.sync_warp()
