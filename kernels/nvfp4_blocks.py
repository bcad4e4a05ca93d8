"""Block helpers of the grouped NVFP4 quantize kernel (nvfp4_quantize.py.j2) that no
specialization switch touches: unpacking bf16 words, 16-element block amaxes, the code and scale
stores, and the column gather of the no-RHT columnwise path; inlined into the kernel while it
is traced."""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from cutequant.kernels import device as dev


def bf16_words_to_f32(words):
    """Packed bf16 pairs -> fp32 values in element order (exact)."""
    out = []
    for w in words:
        out.append(dev.bits_f32(w << 16))
        out.append(dev.bits_f32(w & Uint32(0xFFFF0000)))
    return out


def bf16_block_amaxes(words, pair_absmax=None):
    """Non-negative |max| of the two 16-element blocks in 16 packed bf16 words (bf16x2 trees).
    ``pair_absmax``: each tree's last step, its bf16x2 word -> the block's fp32 |max|
    (default ``device.bf16x2_pair_absmax``; the FMA encoder's kernels pass theirs)."""
    last = dev.bf16x2_pair_absmax if pair_absmax is None else pair_absmax
    amaxes = []
    for first in (0, 8):
        level = list(words[first : first + 8])
        while len(level) > 1:
            level = [dev.bf16x2_absmax(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        amaxes.append(last(level[0]))
    return amaxes


def store_scale_pair(addr: Int64, pair: Uint32, policy: Int64):
    """Two scale bytes (the low 16 bits of ``pair``), marked evict_last in L2 (``policy``, made
    once per thread: createpolicy costs 6 uniform instructions): a compact row sector is
    completed only tiles later, and evicted half-written it costs a DRAM read-modify-write
    (kernels/device.py)."""
    dev.st_global_b16(addr, pair, policy)


def store_scale_word(addr: Int64, word: Uint32, policy: Int64):
    """Four scale bytes at 4-byte-aligned ``addr``, evict_last like ``store_scale_pair``."""
    dev.st_global_b32(addr, word, policy)


def block_mask(valid: Int32) -> Uint32:
    """Scale-byte mask keeping the first ``valid`` (<= 2) blocks; the rest are zero padding."""
    return (Uint32(1) << Uint32(8 * cutlass.max(valid, 0))) - Uint32(1)


@cute.jit
def store_blocks(addr: Int64, codes: list, valid: Int32, policy):
    """Store the codes of ``valid`` (1 or 2) blocks at ``addr`` (8-byte aligned); ``policy``: an
    L2 cache-hint policy or None."""
    if valid == 1:
        dev.st_global_v2(addr, codes[0], codes[1], policy)
    elif (addr % 16) == 0:
        dev.st_global_v4(addr, codes[0], codes[1], codes[2], codes[3], policy)
    else:  # rows of N % 32 == 16 bytes (or M_g % 32 == 16) are only 8-byte aligned
        dev.st_global_v2(addr, codes[0], codes[1], policy)
        dev.st_global_v2(addr + 8, codes[2], codes[3], policy)


@cute.jit
def gather_column(stage: Int32, h: Int32, t0: Int32) -> list:
    """Tokens t0 .. t0 + 31 (t0 % 8 == 0) of hidden column h of a swizzled tile slice (``stage``
    1024-byte aligned), packed as bf16 pairs. The 128-byte swizzle puts (t, h) at
    t * 128 + ((h // 8) ^ (t % 8)) * 16 + (h % 8) * 2 = (t * 128 + 2 h) ^ ((t % 8) * 16): eight
    XORed bases per tile and immediate offsets. (All 32 addresses, loop-invariant but for the
    stage, were hoisted out of the tile loop and spilled 59 LDL/STL in the SR variants.)"""
    base = stage + t0 * 128 + 2 * h
    rows = [base ^ (c * 16) for c in range(8)]
    words = []
    for i in cutlass.range_constexpr(16):
        k = 2 * i  # tokens t0 + k, t0 + k + 1
        words.append(dev.load_shared_u16x2(rows[k % 8], k * 128, rows[(k + 1) % 8], (k + 1) * 128))
    return words
