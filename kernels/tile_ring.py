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

from cutlass import Int32, Int64
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
