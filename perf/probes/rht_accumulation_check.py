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
bf16_bits = [t.to(torch.bfloat16).view(torch.int16) for t in (exact, tc)]
diff16 = (bf16_bits[0] != bf16_bits[1]).sum()
print(f"RHT outputs {exact.numel()}: fp32 differ {diff32}, bf16 differ {int(diff16)}")
