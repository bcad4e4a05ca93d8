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
  consumer spins (acquire) until the count reaches the group's producer tiles, reads the maximum,
  and counts itself out (release: its read happens before). The consumer whose count-out brings
  the count to producers + consumers is the group's last one: it resets both words to zero.
* **Everything resets itself within the launch**: the CTA that takes the launch's last ticket
  (``num_ctas - 1``) sets the ticket word back to zero (every ticket of this launch is taken by
  then), and every group with tiles has its last consumer. A group without tiles touches
  neither word. So the next launch on the stream, or a CUDA-graph replay, finds zeros, with no
  memset node and no host state. Kernels on one stream run one after another (with programmatic
  dependent launch this kernel touches the words only after ``schedule.wait_prior_grids``); like
  the rest of the per-stream workspace the words assume that graphs captured on one stream are
  not replayed concurrently on two others.
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
    """All 32 lanes of one warp of a consumer CTA: spin until the group's ``producers`` tiles
    have counted in (acquire), then return the maximum's bits. Every lane spins and the warp
    reconverges (``launch_zeroing.wait_zeroed``: a spin in one lane of a diverged warp hung
    once)."""
    while Int32(_load(words + Int64(4), "acquire")) < producers:
        _nanosleep()
    cute.arch.sync_warp()
    return _load(words)


@cute.jit
def count_out(words: Int64) -> Int32:
    """One thread of a consumer CTA, after ``wait_ready``: count the consumer out (release: its
    read of the maximum happens before). Returns the count before, for ``finish``: ``producers``
    for the group's first consumer, ``2 * producers - 1`` for its last (as many consumers as
    producers)."""
    return Int32(_atom_add(words + Int64(4), "release"))


@cute.jit
def reset_if_last(words: Int64, before: Int32, producers: Int32, consumers: Int32):
    """The thread of ``count_out``: the group's last consumer resets both words for the next
    launch (acquire first: every fold and count of this launch happens before the reset)."""
    if before == producers + consumers - 1:
        dev.fence_acq_rel_gpu()
        _store_zero(words)
        _store_zero(words + Int64(4))
