"""Probe (GPU): an FP8 cast (rowwise + transposed) built like torch's copy kernel.

    python perf/probes/ldg_cast_probe.py [--m 8192,32768] [--n 5120]

Dense bf16 x [M, N] -> e4m3 rowwise [M, N] and transposed [N, M], one given scale: one
256-thread CTA per 64-token x 128-column tile (no TMA, no persistence, many CTAs per SM).
Thread (t, c) loads 16 bytes of tokens 4t .. 4t + 3 (LDG.128), stores each token's 8 rowwise
bytes (STG.64; a warp covers two whole 128-byte rows), and puts the 4 tokens of each of its 8
columns as one word into a padded shared tile; after one barrier each thread stores two 16-byte
pieces of transposed rows (STG.128). Checked bit-exact against torch, timed like perf/bench.py
next to the product's cast (TMA ring, persistent) on the same shapes. perf/NOTES.md attempt 62.
"""

import argparse
import os
import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, Int64, Uint32

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/
import bench  # noqa: E402

from cutequant.kernels import device as dev  # noqa: E402

TILE_ROWS = 64
TILE_COLS = 128
PITCH = TILE_ROWS // 4 + 1  # words per transposed row in shared memory (+1: fewer conflicts)


def make_launch(token_fastest: bool):
    @cute.jit
    def launch(
        x_ptr: cute.Pointer,
        row_ptr: cute.Pointer,
        col_ptr: cute.Pointer,
        m: Int32,
        n: Int32,
        scale: Float32,
        stream: cuda.CUstream,
    ):
        tiles = (m // TILE_ROWS) * ((n + TILE_COLS - 1) // TILE_COLS)

        @cute.struct
        class Storage:
            buf: cute.struct.Align[cute.struct.MemRange[Uint32, TILE_COLS * PITCH], 16]

        kernel(x_ptr, row_ptr, col_ptr, m, n, scale, Storage).launch(
            grid=[tiles, 1, 1], block=[256, 1, 1], smem=Storage.size_in_bytes(), stream=stream
        )

    @cute.kernel
    def kernel(
        x_ptr: cute.Pointer,
        row_ptr: cute.Pointer,
        col_ptr: cute.Pointer,
        m: Int32,
        n: Int32,
        scale: Float32,
        Storage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        col_tiles = (n + TILE_COLS - 1) // TILE_COLS
        row_tiles = m // TILE_ROWS
        rt = bidx // col_tiles
        ct = bidx % col_tiles
        if cutlass.const_expr(token_fastest):
            rt = bidx % row_tiles
            ct = bidx // row_tiles
        row0 = rt * TILE_ROWS
        col0 = ct * TILE_COLS
        t = tidx // 16
        c = tidx % 16
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sbase = storage.buf.data_ptr().toint()
        x = x_ptr.toint()
        rows = row_ptr.toint()
        cols = col_ptr.toint()
        col = col0 + 8 * c
        tok_words = []  # per token: 2 words of 4 fp8 bytes (columns 8c .. 8c + 7)
        for i in cutlass.range_constexpr(4):
            off = Int64(row0 + 4 * t + i) * Int64(n) + Int64(col)
            v = cute.make_tensor(
                cute.make_ptr(Uint32, x + off * 2, cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout(4),
            ).load()
            w = [v[0], v[1], v[2], v[3]]
            f = []
            for k in cutlass.range_constexpr(4):
                f += [dev.bits_f32(w[k] << 16), dev.bits_f32(w[k] & Uint32(0xFFFF0000))]
            lo = dev.e4m3x2(f[1] * scale, f[0] * scale) | (
                dev.e4m3x2(f[3] * scale, f[2] * scale) << 16
            )
            hi = dev.e4m3x2(f[5] * scale, f[4] * scale) | (
                dev.e4m3x2(f[7] * scale, f[6] * scale) << 16
            )
            tok_words.append((lo, hi))
            if col < n:
                dev.st_global_v2(rows + off, lo, hi)
        # column e of the thread: byte e % 4 of word e // 4 of tokens 0..3 -> one word
        for e in cutlass.range_constexpr(8):
            b = [tok_words[i][e // 4] for i in range(4)]
            sel = e % 4
            lo2 = dev.prmt(b[0], b[1], sel | ((4 + sel) << 4))
            hi2 = dev.prmt(b[2], b[3], sel | ((4 + sel) << 4))
            word = dev.prmt(lo2, hi2, 0x5410)
            dev.store_shared_b32(sbase + ((8 * c + e) * PITCH + t) * 4, word)
        cute.arch.barrier()
        for p in cutlass.range_constexpr(2):
            idx = tidx + 256 * p
            r = idx // 4  # transposed row (column of x) within the tile
            k = idx % 4  # 16-token piece
            words = [dev.load_shared_b32(sbase + (r * PITCH + 4 * k + q) * 4) for q in range(4)]
            if col0 + r < n:
                dev.st_global_v4(cols + Int64(col0 + r) * Int64(m) + Int64(row0 + 16 * k), *words)

    return launch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--m", default="8192,32768")
    p.add_argument("--n", type=int, default=5120)
    args = p.parse_args()
    import cutequant

    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    gmem = cute.AddressSpace.gmem
    mk = cute.runtime.make_ptr
    u8 = cutlass.Uint8
    scale = 0.75
    for order in (False, True):
        compiled = cute.compile(
            make_launch(order),
            mk(BFloat16, 0, gmem, assumed_align=16),
            mk(u8, 0, gmem, assumed_align=16),
            mk(u8, 0, gmem, assumed_align=16),
            Int32(64),
            Int32(128),
            Float32(1.0),
            cuda.CUstream(0),
        )
        for m in (int(v) for v in args.m.split(",")):
            n = args.n
            xs = [torch.randn(m, n, device="cuda").bfloat16() for _ in range(2)]
            rows = [torch.empty(m, n, dtype=torch.uint8, device="cuda") for _ in range(2)]
            cols = [torch.empty(n, m, dtype=torch.uint8, device="cuda") for _ in range(2)]

            def call(i, compiled=compiled, xs=xs, rows=rows, cols=cols, m=m, n=n):
                compiled(
                    mk(BFloat16, xs[i].data_ptr(), gmem, assumed_align=16),
                    mk(u8, rows[i].data_ptr(), gmem, assumed_align=16),
                    mk(u8, cols[i].data_ptr(), gmem, assumed_align=16),
                    Int32(m),
                    Int32(n),
                    Float32(scale),
                    cuda.CUstream(torch.cuda.current_stream().cuda_stream),
                )

            call(0)
            torch.cuda.synchronize()
            want = (xs[0].float() * scale).to(torch.float8_e4m3fn).view(torch.uint8)
            ok = torch.equal(rows[0], want) and torch.equal(cols[0], want.t().contiguous())
            fn = bench._rotating([lambda i=i: call(i) for i in range(2)])
            us = bench.graph_time_us(fn)
            name = "ldg token-fastest" if order else "ldg column-fastest"
            pct = 100 * 4 * m * n / us / 1e3 / copy
            print(f"{name:20s} {m:6d}x{n} {us:8.1f} us {pct:5.1f}%  exact={ok}", flush=True)
    for m in (int(v) for v in args.m.split(",")):
        n = args.n
        xs = [torch.randn(m, n, device="cuda").bfloat16() for _ in range(2)]
        s = torch.full((1,), scale, device="cuda")
        fn = bench._rotating(
            [
                lambda x=x, m=m, s=s: cutequant.fp8_group_quantize(
                    x, [m], fp8_dtype=torch.float8_e4m3fn, scaling="delayed", scale=s
                )
                for x in xs
            ]
        )
        us = bench.graph_time_us(fn)
        pct = 100 * 4 * m * n / us / 1e3 / copy
        print(f"{'cutequant cast':20s} {m:6d}x{n} {us:8.1f} us {pct:5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
