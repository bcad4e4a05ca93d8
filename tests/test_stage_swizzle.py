"""CPU: the NVFP4 columnwise restaging layout (nvfp4_quantize.py.j2, ``stage_store_offset``):
every accumulator store lands on its own bytes inside the buffer, every block load reads back
the tokens the thread quantizes, and no shared-memory phase has a bank conflict (bf16 8-byte
stores by half-warps, fp32 16-byte stores and all 16-byte loads by quarter-warps)."""

import collections

import pytest

from cutequant import jit
from cutequant.codegen import specs


def _max_bank_ways(accesses, size: int) -> int:
    """Accesses (lane-ordered byte addresses of ``size`` bytes) of one warp instruction -> the
    worst bank multiplicity over its phases (128 bytes per phase)."""
    per_phase = 128 // size
    worst = 0
    for p in range(0, len(accesses), per_phase):
        words = collections.defaultdict(set)
        for addr in accesses[p : p + per_phase]:
            for w in range(addr // 4, (addr + size) // 4):
                words[w % 32].add(w)
        worst = max(worst, max(len(v) for v in words.values()))
    return worst


@pytest.mark.parametrize("fast_math", [False, True], ids=["bf16", "fp32"])
def test_restaging_layout(fast_math):
    m = jit.load_module(specs.Nvfp4QuantizeSpec(fast_math=fast_math))
    elem, row_bytes = m.STAGE_ELEM_BYTES, m.STAGE_ROW_BYTES
    owner = {}  # byte -> (hidden row, token)
    store_ways = []
    for warp in range(4):
        lanes = []
        for lane in range(32):
            quad, acc_row = lane % 4, 16 * warp + lane // 4
            lanes.append((quad, acc_row, m.stage_store_offset(acc_row, quad)))
        for h in range(2):
            for kb in range(4):
                addrs = []
                for quad, acc_row, off in lanes:
                    addr = off + 8 * h * row_bytes + m.STORE_OFFSETS[kb]
                    addrs.append(addr)
                    for t in range(4):  # four consecutive tokens, one element each
                        for b in range(elem):
                            key = addr + t * elem + b
                            assert key not in owner, "two stores share a byte"
                            owner[key] = (acc_row + 8 * h, 16 * kb + 4 * quad + t)
                store_ways.append(_max_bank_ways(addrs, 4 * elem))
    assert len(owner) == 64 * 64 * elem
    assert min(owner) >= 0 and max(owner) < m.STAGE_BUF_BYTES, "stores leave the buffer"
    assert max(store_ways) == 1, f"store bank conflicts: {max(store_ways)}-way"

    load_ways = []
    for warp in range(4):
        offs = []
        for lane in range(32):
            wtid = 32 * warp + lane
            row, half = wtid // 2, wtid % 2
            offs.append((row, half, m.stage_load_offset(row, half)))
        for k in range(32 * elem // 16):
            addrs = []
            for row, half, off in offs:
                addr = off + 16 * k
                addrs.append(addr)
                first = 32 * half + 16 * k // elem
                for b in range(16):
                    assert owner[addr + b] == (row, first + b // elem), (row, half, k, b)
            load_ways.append(_max_bank_ways(addrs, 16))
    assert max(load_ways) == 1, f"load bank conflicts: {max(load_ways)}-way"
