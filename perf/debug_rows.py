"""Ad-hoc device debugging of the rowwise NVFP4 path on a tiny input (prints a few rows)."""

import torch

import cutequant
from cutequant import reference
from cutequant.testing import poisoned_outputs

torch.manual_seed(0)
for n_cols in (16, 128):
    x = (torch.randn(64, n_cols, device="cuda") * 3).to(torch.bfloat16)
    with poisoned_outputs():
        res = cutequant.nvfp4_group_quantize(x, [64], columnwise=False, rht=False)
    torch.cuda.synchronize()
    ref = reference.nvfp4_group_quantize(x, [64], columnwise=False, rht=False)[0]
    got = res.group(0)
    print("N", n_cols, "amax", got["amax_row"].item(), ref["amax_row"].item())
    for r in (0, 1, 2, 9):
        print(
            " row",
            r,
            "got",
            got["row_data"][r, :8].tolist(),
            "ref",
            ref["row_data"][r, :8].tolist(),
        )
        print(
            "   scales got",
            got["row_scales"][r, :4].tolist(),
            "ref",
            ref["row_scales"][r, :4].tolist(),
        )
    print(" x row1", x[1, :16].float().tolist())
