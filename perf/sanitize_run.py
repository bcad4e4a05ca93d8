"""Small grouped calls for compute-sanitizer (memcheck / racecheck / synccheck):

    compute-sanitizer --tool memcheck python perf/sanitize_run.py
Covers the FP8 cases TE PR #3102's review was about (65 and 300 groups: a fixed-size per-group
array would overflow; repeated block reductions would race) plus NVFP4 and the amax kernels,
round-robin chunks of both casts, the amax pass's L2 hand-off walk, the FP8 tile cast (16-bit
inputs with both outputs, current and delayed scaling, host and device splits: the first
section; its splits include M_g % 32 == 16 groups, whose shifted rows read the previous tile),
the fused columnwise fake-quant, the one-launch 2D weight quantize (grid barrier) and every
dequantize kernel kind (host and device splits, both columnwise CTA orders)."""

import torch

import cutequant
from cutequant.testing import grouped_input, random_splits


def dequantize_all(x, splits):
    """Every dequantize kernel kind on host and device splits (the device ones search the
    tables warp by warp; the columnwise ones stage through shared memory with stmatrix), both
    CTA orders of the columnwise ones."""
    from cutequant import dequant

    for s in (splits, torch.tensor(splits, device="cuda")):
        for swizzled in (False, True):
            q = cutequant.nvfp4_group_quantize(x, s, swizzled_scales=swizzled)
            for first in (False, True):
                dequant.COLUMNWISE_ROW_TILES_FIRST = first
                cutequant.nvfp4_group_dequantize(q, out_dtype=torch.float32)
                cutequant.nvfp4_group_dequantize(q, columnwise=True)
                cutequant.nvfp4_group_dequantize(q, columnwise=True, undo_rht=False)
                cutequant.nvfp4_group_dequantize(q, columnwise=True, out_dtype=torch.float32)
        f = cutequant.fp8_group_quantize(x, s)
        for first in (False, True):
            dequant.COLUMNWISE_ROW_TILES_FIRST = first
            cutequant.fp8_group_dequantize(f)
            cutequant.fp8_group_dequantize(f, columnwise=True)
    dequant.COLUMNWISE_ROW_TILES_FIRST = False


def main():
    gen = torch.Generator().manual_seed(7)
    for groups in (65, 300):
        splits = random_splits(groups, None, gen, zero_at=("front", "middle", "end"), mean_rows=48)
        x = grouped_input(splits, 256, gen)
        cutequant.fp8_group_quantize(x, splits)
        cutequant.fp8_group_quantize(
            x.float(), splits, scaling="delayed", scale=torch.ones(groups, device="cuda")
        )
        # the tile cast (both outputs) on a grid sized without the splits; delayed scaling
        # folds each group's amax with atomics (kernels/group_fold.py)
        cutequant.fp8_group_quantize(x, torch.tensor(splits, device="cuda"))
        ones = torch.ones(groups, device="cuda")
        cutequant.fp8_group_quantize(x, splits, scaling="delayed", scale=ones)
        cutequant.fp8_group_quantize(
            x, torch.tensor(splits, device="cuda"), scaling="delayed", scale=ones
        )
        cutequant.nvfp4_group_quantize(x, splits)
        cutequant.nvfp4_group_quantize(x, splits, rht=False, swizzled_scales=True, fast_math=True)
        cutequant.nvfp4_group_quantize(
            x, splits, stochastic_rounding=True, amax_estimation_scale=2.0
        )
        cutequant.nvfp4_group_quantize(  # the gathered (no-RHT) column path with SR
            x, splits, rht=False, swizzled_scales=True, stochastic_rounding=True
        )
        cutequant.group_amax(x, torch.tensor(splits, device="cuda"))
        # the fused columnwise fake-quant (shared tile, ldmatrix, mma.sync, quad shuffles)
        cutequant.nvfp4_fake_quantize(x, splits, columnwise=True)
        cutequant.nvfp4_fake_quantize(
            x, torch.tensor(splits, device="cuda"), columnwise=True, stochastic_rounding=True
        )
        cutequant.nvfp4_fake_quantize(x, splits, columnwise=True, rht=False)
        dequantize_all(x, splits)
    # 2D weights in one launch: phase 1, the grid barrier, phase 2 looping over items with the
    # shared transpose tile (300 experts: more items than the cooperative grid); given amax:
    # one CTA per item
    from cutequant import nvfp4_2d

    w = torch.randn(300, 96, 272, device="cuda").to(torch.bfloat16)
    nvfp4_2d.nvfp4_quantize_weights_2d(w)
    nvfp4_2d.nvfp4_quantize_weights_2d([w[e] for e in range(40)], swizzled_scales=True)
    nvfp4_2d.nvfp4_quantize_weights_2d(w, amax=torch.ones(300, device="cuda"))
    nvfp4_2d.nvfp4_fake_quantize_weights_2d(w)
    # the TMA-ring FP8 cast's round-robin chunks (kernels/schedule.cta_runs): full rounds plus a
    # tail (16-bit inputs go to the tile cast unless TILE_CAST is off)
    from cutequant import amax, fp8, nvfp4
    from cutequant.testing import with_plan

    fp8.TILE_CAST = False
    splits = random_splits(65, None, gen, zero_at=("front", "end"), mean_rows=1040)
    x = grouped_input(splits, 1024, gen)
    cutequant.fp8_group_quantize(x, splits)
    cutequant.fp8_group_quantize(
        x, splits, columnwise=False, scaling="delayed", scale=torch.ones(65, device="cuda")
    )
    # NVFP4 in round-robin chunks (the plan nvfp4.device_chunk picks on an H100)
    nvfp4_spec = nvfp4._spec
    nvfp4._spec = with_plan(nvfp4_spec, chunk=8)
    cutequant.nvfp4_group_quantize(x, splits)
    cutequant.nvfp4_group_quantize(x, splits, columnwise=False, rht=False)
    nvfp4._spec = nvfp4_spec
    # the shifted, wrapping walk of the amax pass before an FP8 cast on contiguous ranges (the
    # L2 hand-off's condition; forced: 1 resident tile)
    amax.l2_resident = lambda *args: 1
    fp8._spec = with_plan(fp8._spec, chunk=0)
    splits = random_splits(65, None, gen, zero_at=("front", "middle", "end"), mean_rows=48)
    cutequant.fp8_group_quantize(grouped_input(splits, 256, gen), splits)
    torch.cuda.synchronize()
    print("sanitize_run: done")


if __name__ == "__main__":
    main()
