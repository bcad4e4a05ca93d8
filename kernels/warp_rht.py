"""The 16x16 RHT of 16-token blocks on warp-level tensor cores: ``mma.sync`` m16n8k16, bf16 x bf16
-> fp32 (sm_80+). What the NVFP4 quantize and RHT amax kernels use where wgmma does not exist
(sm_100a), and on sm_90a when their spec asks for it (``rht_mma="mma_sync"``: how the GPU tests
prove this path bit-exact on Hopper).

Both kernels hold a 64-token x 64-hidden-column slice of x per consumer warpgroup in shared
memory, as the TMA wrote it: hidden-major rows of 128 bytes per token, 16-byte chunks swizzled,
(t, h) at byte ``t * 128 + ((h // 8) ^ (t % 8)) * 16 + (h % 8) * 2``. Warp w of the warpgroup
computes, per 16-token block kb, ``y^T = x_blk^T @ B`` for hidden rows 16 w .. 16 w + 15:

* A (M = 16 hidden rows x K = 16 tokens) comes straight from that tile with one
  ``ldmatrix.x4.trans`` per block: lane l gives the row address of 8 x 8 matrix j = l // 8
  (tokens 8 (j // 2) .., hiddens 8 (j % 2) ..), and the transposed load hands every thread the
  token pairs of its hidden row that the A fragment wants, registers a0..a3 in matrix order.
  The eight rows of a matrix fall in eight distinct 16-byte chunks: conflict-free.
* B (16 tokens k x 16 columns n, two n8 halves) is the RHT matrix with its columns permuted,
  ``B[k, n] = R[k, token_of_column(n)]``: built once per thread into four registers.
* Two MMAs (n = 0..7, 8..15) give each thread 8 fp32 values in the order of the wgmma
  m64n16k16 accumulator fragment, so the kernels' epilogues read both alike: value
  ``2 h + c + 4 jj`` is (hidden row 16 w + lane // 4 + 8 h, column n = 2 (lane % 4) + c + 8 jj),
  which holds token ``4 (lane % 4) + 2 jj + c``: four consecutive tokens per row half.

Every product is exact (bf16 x +-0.25) and the 16 of an output are summed by one k16 MMA with
fp32 accumulation, as one wgmma k16 does. The MMA's C operand is -0.0, the additive identity
(a sum of -0 products stays -0, as in wgmma's D = A B without C). tests/test_warp_rht.py
emulates the loads, fragments and MMAs on the CPU (PTX ISA layouts).
"""

import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp
from cutlass.cutlass_dsl import T, dsl_user_op

from cutequant.kernels import device as dev

TOKEN_ROW_BYTES = 128  # one token of a warpgroup's 64-column slice
BLOCK_BYTES = 16 * TOKEN_ROW_BYTES  # one 16-token block of the slice


def token_of_column(n):
    """The token of B's column n (and of accumulator column n): 4 (n % 8 // 2) + 2 (n // 8) +
    n % 2, the permutation of nvfp4_quantize's wgmma B. Plain ints or Int32."""
    return ((n & 7) >> 1) * 4 + (n >> 3) * 2 + (n & 1)


def a_lane_offset(warp_in_wg, lane):
    """Byte offset, from the slice's first byte, of the 16 bytes whose address lane ``lane`` of
    warp ``warp_in_wg`` gives ``ldmatrix.x4`` for block 0 (block kb: + kb * BLOCK_BYTES): token
    8 (j // 2) + r, hiddens 16 warp + 8 (j % 2) .. + 7 (one swizzle chunk), j = lane // 8, r =
    lane % 8. Plain ints or Int32."""
    j = lane >> 3
    r = lane & 7
    return (8 * (j >> 1) + r) * TOKEN_ROW_BYTES + (((2 * warp_in_wg + (j & 1)) ^ r) * 16)


def b_coordinates(lane):
    """(k, token) of the low bf16 of each of this lane's four B registers (the high one is
    k + 1): registers b0, b1 of the n = 0..7 MMA, then of n = 8..15. Plain ints or Int32."""
    gid = lane >> 2
    k0 = 2 * (lane & 3)
    return [(k0 + 8 * kh, token_of_column(8 * jj + gid)) for jj in range(2) for kh in range(2)]


@dsl_user_op
def ldmatrix_x4_trans(addr: Int32, offset: int, *, loc=None, ip=None) -> list:
    """``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`` at shared ``addr + offset`` (offset: a
    compile-time immediate): four 32-bit registers, matrix j's in register j. Volatile: the loads
    must stay before the stage release that follows them."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int32(addr).ir_value(loc=loc, ip=ip)],
        f"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{$0, $1, $2, $3}}, [$4+{int(offset)}];",
        "=r,=r,=r,=r,r",
        has_side_effects=True,
        is_align_stack=False,
    )
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


def load_a(addr: Int32, blocks: int) -> list:
    """The A fragments (four registers each) of ``blocks`` consecutive 16-token blocks;
    ``addr``: the slice's first byte plus ``a_lane_offset``."""
    return [ldmatrix_x4_trans(addr, kb * BLOCK_BYTES) for kb in range(blocks)]


def b_fragment(sign_mask: Int32, lane: Int32) -> list:
    """This lane's four B registers (bf16 pairs, exact: every entry is +-0.25) of the RHT
    matrix with ``sign_mask`` (device.rht_entry), columns permuted by ``token_of_column``."""
    words = []
    for k, token in b_coordinates(lane):
        lo = dev.rht_entry(sign_mask, k, token)
        hi = dev.rht_entry(sign_mask, k + 1, token)
        words.append(dev.bf16x2_rn(hi, lo))
    return words


def rht_block(a_words: list, b_words: list) -> list:
    """One 16-token block: the 8 fp32 outputs of this thread in the wgmma accumulator order
    (module docstring), from its A registers (``load_a``) and B registers (``b_fragment``)."""
    atom = cute.make_mma_atom(warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)))
    a = cute.make_rmem_tensor(cute.make_layout(((2, 2, 2), 1, 1)), BFloat16)
    a_regs = cute.recast_tensor(a, Uint32)
    for i in range(4):
        a_regs[i] = a_words[i]
    out = []
    for jj in range(2):
        b = cute.make_rmem_tensor(cute.make_layout(((2, 2), 1, 1)), BFloat16)
        b_regs = cute.recast_tensor(b, Uint32)
        b_regs[0] = b_words[2 * jj]
        b_regs[1] = b_words[2 * jj + 1]
        d = cute.make_rmem_tensor(cute.make_layout(((2, 2), 1, 1)), Float32)
        # D and C are one tensor: in 4.8.1 a separate C tensor left D unwritten (our probe)
        d.fill(-0.0)
        cute.gemm(atom, d, a, b, d)
        out += [d[i] for i in range(4)]
    return out
