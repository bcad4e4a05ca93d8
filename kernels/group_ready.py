"""Dispatch-order tickets and per-group readiness, for a one-CTA-per-tile kernel in which some
CTAs produce a per-group value (the amax of its tiles) that other CTAs of the same launch
consume (the FP8 current-scaling cast, ``templates/fp8_tile_cast.py.j2`` with ``fused``).

No grid barrier and no co-residency: the grid may be many waves long.

* **Tickets, not blockIdx, decide the work.** One thread of every CTA takes a ticket with one
  ``atom.add`` on a 32-bit word of the stream's workspace. Tickets are handed out in the order
  the CTAs start running, whatever order the hardware dispatches them in. Tickets [0, A) are
  producer tiles, [A, A + C) consumer tiles.
* **A consumer only waits for producers whose ticket was taken before its own**, i.e. by CTAs
  that are already running and that wait for nothing (a producer never waits). So every
  producer a consumer waits for finishes, whichever CTAs are resident: no deadlock, for any
  grid size and any dispatch order. (blockIdx order would need the hardware to dispatch in
  blockIdx order, which CUDA does not promise.)
* **Per group, two workspace words** (``groups.workspace(...).fold``, 8 bytes per group):
  ``word 0`` the maximum (non-negative fp32 bits order like unsigned integers, NaN above inf;
  folded with ``red.max``), ``word 1`` a count. A producer folds its maximum, then increments the
  count with release semantics (fire and forget: the producer CTA does not wait for it). A
  consumer polls the count (acquire) until it reaches the group's producer tiles, then reads the
  maximum, and counts itself into a launch-wide ``reads`` word (release, fire and forget).
* **Everything resets itself within the launch**, by the CTA that takes the launch's last
  ticket (``num_ctas - 1``): it sets the ticket word back to zero at once (every ticket of this
  launch is taken by then); at its end it waits until ``reads`` counts every consumer (they all
  took earlier tickets: running CTAs that wait only for producers), then zeroes every group's
  two words and ``reads``. So the next launch on the stream, or a CUDA-graph replay, finds
  zeros, with no memset node and no host state. No consumer needs the value of an atomic (a
  per-group "last consumer resets" needs the count-out's return value, which ptxas spilled
  right after the atomic at 32 registers, stalling the CTA for its round trip). Kernels on one
  stream run one after another (with programmatic dependent launch this kernel touches the
  words only after ``schedule.wait_prior_grids``); like the rest of the per-stream workspace
  the words assume that graphs captured on one stream are not replayed concurrently on two
  others.
"""

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev


def _addr(addr, loc, ip):
    return Int64(addr).ir_value(loc=loc, ip=ip)


@dsl_user_op
def _atom_add(addr: Int64, order: str = "relaxed", *, loc=None, ip=None) -> Uint32:
    ptx = f"atom.{order}.gpu.global.add.u32 $0, [$1], 1;"
    return Uint32(dev.volatile_asm(T.i32(), ptx, "=r,l", [_addr(addr, loc, ip)]))


@dsl_user_op
def _red_max(addr: Int64, value: Uint32, *, loc=None, ip=None):
    dev.volatile_asm(
        None,
        "red.relaxed.gpu.global.max.u32 [$0], $1;",
        "l,r",
        [_addr(addr, loc, ip), Uint32(value).ir_value(loc=loc, ip=ip)],
    )


@dsl_user_op
def _red_add_release(addr: Int64, *, loc=None, ip=None):
    dev.volatile_asm(None, "red.release.gpu.global.add.u32 [$0], 1;", "l", [_addr(addr, loc, ip)])


@dsl_user_op
def _load(addr: Int64, order: str = "relaxed", *, loc=None, ip=None) -> Uint32:
    ptx = f"ld.{order}.gpu.global.u32 $0, [$1];"
    return Uint32(dev.volatile_asm(T.i32(), ptx, "=r,l", [_addr(addr, loc, ip)]))


@dsl_user_op
def _store_zero(addr: Int64, *, loc=None, ip=None):
    dev.volatile_asm(None, "st.relaxed.gpu.global.u32 [$0], 0;", "l", [_addr(addr, loc, ip)])


@dsl_user_op
def _nanosleep(*, loc=None, ip=None):
    dev.volatile_asm(None, "nanosleep.u32 32;", "", [])


@cute.jit
def take_ticket(counter: Int64, num_ctas: Int32) -> Int32:
    """One thread per CTA, after ``schedule.wait_prior_grids``: this CTA's ticket (0, 1, ... in
    the order the CTAs get here). The launch's last ticket resets the word: its atomic is the
    last in the word's order, and no CTA of this launch takes another."""
    ticket = Int32(_atom_add(counter))
    if ticket == num_ctas - 1:
        _store_zero(counter)
    return ticket


@cute.jit
def produce(words: Int64, value: Float32):
    """One thread per producer CTA: fold ``value`` (>= 0, or NaN) into the group's maximum at
    ``words`` (the group's two workspace words) and count the tile in. The release orders the
    fold before the count that announces it; nothing is waited for."""
    _red_max(words, dev.f32_bits(value) & Uint32(0x7FFFFFFF))
    _red_add_release(words + Int64(4))


@cute.jit
def wait_ready(words: Int64, producers: Int32) -> Uint32:
    """All 32 lanes of one warp of a consumer CTA: poll until the group's ``producers`` tiles
    have counted in, then return the maximum's bits. Every lane polls and the warp reconverges
    (``launch_zeroing.wait_zeroed``: a spin in one lane of a diverged warp hung once). The polls
    are acquire loads: the first one usually succeeds, and it orders the read of the maximum
    after it (each is LDG.STRONG + CCTL.IVALL, an L1 invalidation: only while waiting)."""
    while Int32(_load(words + Int64(4), "acquire")) < producers:
        _nanosleep()
    cute.arch.sync_warp()
    return _load(words)


@cute.jit
def count_read(reads: Int64):
    """One thread of a consumer CTA, after ``wait_ready``: count its read of the maximum into the
    launch's ``reads`` word (release: the read happens before; nothing is waited for)."""
    _red_add_release(reads)


@cute.jit
def reset_after_reads(reads: Int64, consumers: Int32, fold: Int64, num_groups: Int32):
    """Every thread of the CTA with the launch's last ticket, at its end: warp 0 waits until
    ``consumers`` reads are counted (acquire), then the CTA zeroes both words of every group and
    ``reads`` for the next launch."""
    tidx, _, _ = cute.arch.thread_idx()
    ntid, _, _ = cute.arch.block_dim()
    if tidx < 32:
        while Int32(_load(reads, "acquire")) < consumers:
            _nanosleep()
        cute.arch.sync_warp()
    cute.arch.barrier()
    for i in range(tidx, 2 * num_groups, ntid):
        _store_zero(fold + Int64(4) * Int64(i))
    if tidx == 0:
        _store_zero(reads)
