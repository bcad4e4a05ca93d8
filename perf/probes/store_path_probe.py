"""Probe (GPU): which store path a TMA-fed persistent kernel can write at the copy rate with.

    python perf/probes/store_path_probe.py [--m 8192,32768] [--n 5120]

Three dense bf16 copies y = x of the same tiles (64 rows x 128 columns, a 4-stage TMA ring
filled by one producer thread, one CTA per SM, contiguous per-CTA tile ranges):

* ``tma_store``: one thread writes each stage back with a TMA tensor store and releases it
  once the store has read it (``cp.async.bulk.wait_group.read``);
* ``stg``: two warpgroups read each stage with LDS.128 and write it with 16-byte STG, as the
  cast kernels do (whole 128-byte lines per store instruction);
* ``ldg``: one 256-thread CTA per tile, 16-byte LDG / STG, no TMA (torch's copy structure);
* torch's own copy kernel (LDG / STG, many CTAs per SM) for reference.

Timed like perf/bench.py (CUDA-graph replay, median) against the copy bandwidth of the same run.
perf/NOTES.md attempt 60: the FP8 cast's structure tops out near 86% (attempt 58); if the
TMA-store copy runs at the copy rate and the STG one does not, the casts' stores are the part
to change.
"""

import argparse
import os
import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import torch
from cutlass import BFloat16, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/
import bench  # noqa: E402

from cutequant.kernels import device as dev  # noqa: E402
from cutequant.kernels import schedule as sched  # noqa: E402

TILE_ROWS = 64
WG_COLS = 64
TILE_COLS = 128
TILE_BYTES = TILE_ROWS * TILE_COLS * 2


def make_launch(tma_store: bool, stages: int, chunk: int):
    consumer_warps = 1 if tma_store else 8
    threads = 128 + 32 * consumer_warps

    @cute.jit
    def launch(
        x_ptr: cute.Pointer,
        y_ptr: cute.Pointer,
        m: Int32,
        n: Int32,
        grid: Int32,
        stream: cuda.CUstream,
    ):
        n16 = cute.assume(n, divby=16)
        layout = cute.make_layout((n16, m), stride=(1, n16))
        m_x = cute.make_tensor(x_ptr, layout)
        m_y = cute.make_tensor(y_ptr, layout)
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.MN_SW128, BFloat16)
        sx_layout = cute.tile_to_shape(atom, (TILE_COLS, TILE_ROWS, stages), order=(1, 0, 2))
        stage_layout = cute.slice_(sx_layout, (None, None, 0))
        load_atom, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m_x, stage_layout, (TILE_COLS, TILE_ROWS)
        )
        store_atom, tma_y = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), m_y, stage_layout, (TILE_COLS, TILE_ROWS)
        )

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[cutlass.Int64, stages * 2]
            sx: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sx_layout)], 1024]

        kernel(load_atom, tma_x, store_atom, tma_y, sx_layout, y_ptr, m, n, Storage).launch(
            grid=[grid, 1, 1],
            block=[threads, 1, 1],
            smem=sched.persistent_smem_bytes(Storage.size_in_bytes(), 1),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        load_atom: cute.CopyAtom,
        tma_x: cute.Tensor,
        store_atom: cute.CopyAtom,
        tma_y: cute.Tensor,
        sx_layout: cute.ComposedLayout,
        y_ptr: cute.Pointer,
        m: Int32,
        n: Int32,
        Storage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = cutlass.memory.SmemAllocator().allocate(Storage)
        sx = storage.sx.get_tensor(sx_layout.outer, swizzle=sx_layout.inner)
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(),
            num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
            tx_count=TILE_BYTES,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )
        col_tiles = (n + TILE_COLS - 1) // TILE_COLS
        total = (m // TILE_ROWS) * col_tiles
        per = (total + gdim - 1) // gdim
        t0 = Int32(0)
        t1 = per
        if cutlass.const_expr(chunk == 0):
            t0 = cutlass.min(bidx * per, total)
            t1 = cutlass.min(t0 + per, total)
        if warp == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
            for k in range(t0, t1):
                t = tile_of(k, chunk, bidx, gdim)
                if t >= total:
                    t = total - 1  # past the end (round-robin tail): reload the last tile
                g_tile = cute.local_tile(
                    tma_x, (TILE_COLS, TILE_ROWS), (t % col_tiles, t // col_tiles)
                )
                t_s, t_g = cpasync.tma_partition(
                    load_atom,
                    0,
                    cute.make_layout(1),
                    cute.group_modes(sx, 0, 2),
                    cute.group_modes(g_tile, 0, 2),
                )
                pipe.producer_acquire(state)
                cute.copy(
                    load_atom,
                    t_g,
                    t_s[(None, state.index)],
                    tma_bar_ptr=pipe.producer_get_barrier(state),
                )
                pipe.producer_commit(state)
                state.advance()
            pipe.producer_tail(state)
        elif warp >= 4:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
            if cutlass.const_expr(tma_store):
                prev = state.clone()
                for k in range(t0, t1):
                    t = tile_of(k, chunk, bidx, gdim)
                    if t >= total:
                        t = total - 1
                    pipe.consumer_wait(state)
                    g_tile = cute.local_tile(
                        tma_y, (TILE_COLS, TILE_ROWS), (t % col_tiles, t // col_tiles)
                    )
                    t_s, t_g = cpasync.tma_partition(
                        store_atom,
                        0,
                        cute.make_layout(1),
                        cute.group_modes(sx, 0, 2),
                        cute.group_modes(g_tile, 0, 2),
                    )
                    if cute.arch.lane_idx() == 0:
                        cute.copy(store_atom, t_s[(None, state.index)], t_g)
                        cute.arch.cp_async_bulk_commit_group()
                        cute.arch.cp_async_bulk_wait_group(1, read=True)
                    cute.arch.sync_warp()  # lane 0's stores before prev have read smem
                    if k > t0:
                        pipe.consumer_release(prev)
                    prev = state.clone()
                    state.advance()
                if t1 > t0:
                    if cute.arch.lane_idx() == 0:
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                    cute.arch.sync_warp()
                    pipe.consumer_release(prev)
                    if cute.arch.lane_idx() == 0:
                        cute.arch.cp_async_bulk_wait_group(0)
            else:
                ctid = tidx - 128
                wg = ctid // 128  # the 64-column slice
                r = (ctid % 128) // 8
                c = ctid % 8
                base = storage.sx.data_ptr().toint() + wg * (TILE_ROWS * 128)
                y = y_ptr.toint()
                for k in range(t0, t1):
                    t = tile_of(k, chunk, bidx, gdim)
                    if t >= total:
                        t = total - 1
                    pipe.consumer_wait(state)
                    stage = base + state.index * TILE_BYTES
                    words = []
                    for i in cutlass.range_constexpr(4):
                        rr = r + 16 * i
                        words.append(dev.load_shared_v4(stage + rr * 128 + ((c ^ (rr % 8)) * 16)))
                    dev.release_after_loads(pipe, state)
                    state.advance()
                    row0 = (t // col_tiles) * TILE_ROWS
                    col = (t % col_tiles) * TILE_COLS + wg * WG_COLS + 8 * c
                    if col < n:
                        for i in cutlass.range_constexpr(4):
                            addr = (
                                y
                                + (
                                    cutlass.Int64(row0 + r + 16 * i) * cutlass.Int64(n)
                                    + cutlass.Int64(col)
                                )
                                * 2
                            )
                            dev.st_global_v4(addr, *words[i])

    return launch


def make_ldg_launch(ctas_per_tile_row: int = 1):
    """The torch-copy structure with this design's tiles: one 256-thread CTA per 64 x 128 tile
    (no TMA, no shared memory, no persistence), 16-byte LDG / STG, many CTAs per SM."""

    @cute.jit
    def launch(
        x_ptr: cute.Pointer,
        y_ptr: cute.Pointer,
        m: Int32,
        n: Int32,
        grid: Int32,
        stream: cuda.CUstream,
    ):
        col_tiles = (n + TILE_COLS - 1) // TILE_COLS
        total = (m // TILE_ROWS) * col_tiles
        ldg_kernel(x_ptr, y_ptr, m, n).launch(grid=[total, 1, 1], block=[256, 1, 1], stream=stream)

    @cute.kernel
    def ldg_kernel(x_ptr: cute.Pointer, y_ptr: cute.Pointer, m: Int32, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        col_tiles = (n + TILE_COLS - 1) // TILE_COLS
        row0 = (bidx // col_tiles) * TILE_ROWS  # token-fastest would be bidx % row_tiles
        col0 = (bidx % col_tiles) * TILE_COLS
        r = tidx // 16  # 16 threads x 16 bytes = one 256-byte tile row
        c = tidx % 16
        x = x_ptr.toint()
        y = y_ptr.toint()
        vals = []
        for i in cutlass.range_constexpr(4):
            off = (
                cutlass.Int64(row0 + r + 16 * i) * cutlass.Int64(n) + cutlass.Int64(col0 + 8 * c)
            ) * 2
            v = cute.make_tensor(
                cute.make_ptr(cutlass.Uint32, x + off, cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout(4),
            ).load()
            vals.append((off, [v[0], v[1], v[2], v[3]]))
        for off, w in vals:
            dev.st_global_v4(y + off, *w)

    return launch


@cute.jit
def tile_of(k: Int32, chunk: cutlass.Constexpr, bidx: Int32, gdim: Int32) -> Int32:
    """The k-th tile of CTA bidx: contiguous (chunk 0: k itself) or round-robin chunks."""
    t = k
    if cutlass.const_expr(chunk > 0):
        t = (k // chunk) * gdim * chunk + bidx * chunk + k % chunk
    return t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--m", default="8448,33792")  # whole rounds of 132 x 8 tiles at N = 5120
    p.add_argument("--n", type=int, default=5120)
    args = p.parse_args()
    copy = bench.copy_bandwidth_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    gmem = cute.AddressSpace.gmem
    mk = cute.runtime.make_ptr
    configs = [
        (name, ts, st, ch)
        for name, ts in (("tma_store", True), ("stg", False))
        for st in (4, 8)
        for ch in (0, 8)
    ] + [("ldg", None, 0, 0)]
    for base_name, tma_store, stages, chunk in configs:
        name = f"{base_name} s{stages} c{chunk}"
        compiled = cute.compile(
            make_ldg_launch() if tma_store is None else make_launch(tma_store, stages, chunk),
            mk(BFloat16, 0, gmem, assumed_align=16),
            mk(BFloat16, 0, gmem, assumed_align=16),
            Int32(64),
            Int32(128),
            Int32(1),
            cuda.CUstream(0),
        )
        for m in (int(v) for v in args.m.split(",")):
            xs = [torch.randn(m, args.n, device="cuda").bfloat16() for _ in range(2)]
            ys = [torch.empty_like(x) for x in xs]

            def call(i, compiled=compiled, xs=xs, ys=ys, m=m):
                compiled(
                    mk(BFloat16, xs[i].data_ptr(), gmem, assumed_align=16),
                    mk(BFloat16, ys[i].data_ptr(), gmem, assumed_align=16),
                    Int32(m),
                    Int32(args.n),
                    Int32(sms),
                    cuda.CUstream(torch.cuda.current_stream().cuda_stream),
                )

            call(0)
            call(1)
            torch.cuda.synchronize()
            ok = all(torch.equal(x, y) for x, y in zip(xs, ys, strict=True))
            fn = bench._rotating([lambda i=i: call(i) for i in range(2)])
            us = bench.graph_time_us(fn)
            nbytes = 4 * m * args.n
            print(
                f"{name:9s} {m:6d}x{args.n} {us:8.1f} us {100 * nbytes / us / 1e3 / copy:5.1f}%"
                f"  exact={ok}",
                flush=True,
            )
    for m in (int(v) for v in args.m.split(",")):
        xs = [torch.randn(m, args.n, device="cuda").bfloat16() for _ in range(2)]
        ys = [torch.empty_like(x) for x in xs]
        fn = bench._rotating([lambda x=x, y=y: y.copy_(x) for x, y in zip(xs, ys, strict=True)])
        us = bench.graph_time_us(fn)
        pct = 100 * 4 * m * args.n / us / 1e3 / copy
        print(f"torch              {m:6d}x{args.n} {us:8.1f} us {pct:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
