"""Device check: how often does the tensor-core fp32 accumulation of the RHT differ from the
exact sum rounded once, and does the kernel match the tensor-core oracle? (NOTES.md)"""

import torch

from cutequant import reference
from cutequant.testing import grouped_input

gen = torch.Generator().manual_seed(11)
x = grouped_input([65536], 2048, gen)
reference.RHT_ACCUMULATION = "exact"
exact = reference.rht_along_tokens(x, round_to_bf16=False)
reference.RHT_ACCUMULATION = "tensor_core"
tc = reference.rht_along_tokens(x, round_to_bf16=False)
reference.RHT_ACCUMULATION = "auto"
diff32 = (exact.view(torch.int32) != tc.view(torch.int32)).sum().item()
diff16 = (exact.to(torch.bfloat16).view(torch.int16) != tc.to(torch.bfloat16).view(torch.int16)).sum()
print(f"RHT outputs {exact.numel()}: fp32 differ {diff32}, after bf16 rounding differ {int(diff16)}")
