"""A per-thread ring of tile slots in shared memory, filled by ``cp.async`` (the 2D kernel's
``Nvfp4Quantize2dSpec.ring``; issue 20, branch fq5).

Each thread copies exactly the 16-byte chunks it later reads itself: chunk q of thread t of
slot s lives at ``s * slot_bytes + q * 16 * THREADS + 16 t`` (``chunk_offset``). A warp's 32
lanes then write and read 512 contiguous bytes per chunk (no bank conflicts, LDS.128 /
LDGSTS.128), and no CTA barrier is needed between a slot's copy and its read, nor between
its read and the next copy into it: ``cp.async.wait_group`` makes a thread's own copies
visible to itself, and its read of the slot was consumed before it issues the next copy.

Every issue step commits exactly one group (empty where there is no tile to copy), so with
``depth`` slots ``wait_group(depth - 1)`` before reading tile i waits for exactly tile i's
copies (issued ``depth`` steps earlier, or in the prologue).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev


def chunk_offset(slot: int, chunk: int, tidx: int, threads: int, chunks: int) -> int:
    """Byte offset of ``chunk`` (of ``chunks`` per thread and slot) of thread ``tidx`` in
    ``slot``: the layout the kernel's copies and reads use (tests check it covers every byte
    of the ring once and that each warp's 16-byte accesses are contiguous)."""
    return (slot * chunks + chunk) * 16 * threads + 16 * tidx


@dsl_user_op
def cp_async_16_hint(dst: Int32, src: Int64, src_bytes: Int32, policy: Int64, *, loc=None, ip=None):
    """``cp.async.cg`` of 16 bytes (``src_bytes`` 16 or 0: zero-fill) with an L2 cache-hint
    policy (``device.l2_evict_first_policy`` ...)."""
    dev.volatile_asm(
        None,
        "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2, $3;",
        "r,l,r,l",
        [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
         Int32(src_bytes).ir_value(loc=loc, ip=ip), Int64(policy).ir_value(loc=loc, ip=ip)],
    )  # fmt: skip


@dsl_user_op
def commit(*, loc=None, ip=None):
    """``cp.async.commit_group``: this thread's copies issued since the last commit form a group
    (possibly empty)."""
    dev.volatile_asm(None, "cp.async.commit_group;", "", [])


@dsl_user_op
def wait_group(pending: int, *, loc=None, ip=None):
    """``cp.async.wait_group pending``: all but this thread's ``pending`` newest groups have
    landed (and are visible to this thread)."""
    dev.volatile_asm(None, f"cp.async.wait_group {int(pending)};", "", [])


@dsl_user_op
def l2_evict_normal_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache-hint policy of the default priority (a copy that needs no hint, selected
    per tile against ``device.l2_evict_first_policy``)."""
    ptx = "createpolicy.fractional.L2::evict_normal.b64 $0, 1.0;"
    return Int64(dev._asm(T.i64(), ptx, "=l", []))


@cute.jit
def read_slot(addr: Int32, chunks: cutlass.Constexpr, threads: cutlass.Constexpr) -> list:
    """This thread's ``chunks`` x 4 words of the slot whose chunk 0 (of this thread) is at
    ``addr``: one LDS.128 per chunk (``chunk_offset``)."""
    words = []
    for q in cutlass.range_constexpr(chunks):
        words += dev.load_shared_v4(addr + q * 16 * threads)
    return words


def widen(words, in_dtype: str) -> list:
    """Two rows of 16 16-bit values (row i: words 8i .. 8i + 7, element 0 low) as fp32, exactly
    (the 2D kernel's ``load_rows`` values)."""
    return [
        [dev.half_to_f32(words[8 * i : 8 * i + 8], k, in_dtype) for k in range(16)]
        for i in range(2)
    ]


def words_absmax(acc: Float32, words, in_dtype: str) -> Float32:
    """``device.absmax`` of ``acc`` and every value of ``widen(words)``, bit for bit after the
    final |.| (NaN: the canonical one): a tree of packed 16-bit x2 |max| (``max.NaN.xorsign.abs``,
    exact and NaN-propagating), then its two halves widened (exact) into fp32 |max|: 17
    instructions for 32 values, not 32 widenings and 32 FMNMX (tests/test_tile_ring.py checks
    it on a CPU model of the PTX semantics, exhaustively per position)."""
    pair_max = dev.bf16x2_absmax if in_dtype == "bf16" else dev.f16x2_absmax
    t = list(words)
    while len(t) > 1:
        t = [pair_max(t[2 * i], t[2 * i + 1]) for i in range(len(t) // 2)]
    acc = dev.absmax(acc, dev.half_to_f32(t, 0, in_dtype))
    return dev.absmax(acc, dev.half_to_f32(t, 1, in_dtype))


@cute.jit
def next_tile(
    e: Int32, rt: Int32, ct: Int32, col_tiles: Int32, rows: Int32, tile_rows: cutlass.Constexpr
):
    """``schedule.next_expert_tile``: (e, rt, ct) of the next work item."""
    ct += 1
    if ct == col_tiles:
        ct = Int32(0)
        rt += 1
        if rt * tile_rows >= rows:
            rt = Int32(0)
            e += 1
    return e, rt, ct


@cute.jit
def prev_tile(
    e: Int32, rt: Int32, ct: Int32, col_tiles: Int32, rows: Int32, tile_rows: cutlass.Constexpr
):
    """``schedule.prev_expert_tile``: (e, rt, ct) of the previous work item."""
    ct -= 1
    if ct < 0:
        ct = col_tiles - 1
        rt -= 1
        if rt < 0:
            rt = (rows - 1) // tile_rows
            e -= 1
    return e, rt, ct
