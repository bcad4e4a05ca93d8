"""CPU: the NVFP4 columnwise restaging layout (nvfp4_quantize.py.j2, ``stage_store_offset``):
every accumulator store lands on its own bytes inside the buffer, every block load reads back
the tokens the thread quantizes, and no shared-memory phase has a bank conflict (bf16 8-byte
stores by half-warps, fp32 16-byte stores and all 16-byte loads by quarter-warps)."""

import collections
import dataclasses

import pytest

from cutequant import jit
from cutequant.codegen import specs
from cutequant.codegen.render import render


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


def _check_stores_then_loads(m, owner: dict, store_ways: list) -> None:
    """After a store model filled ``owner`` (byte -> (hidden row, token)): every byte of the
    [64 x 64] restage written once inside the buffer, no store bank conflict, and each
    thread's 16-byte block loads (``stage_load_offset``, two threads per hidden row) read back
    its 32 tokens in order without a bank conflict."""
    elem = m.STAGE_ELEM_BYTES
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
    _check_stores_then_loads(m, owner, store_ways)


def test_stsm_restage_layout():
    """``stsm_restage`` (fast math, runtime/nvfp4.py's STSM_RESTAGE): the RHT matrix's column n
    holds token 8 (n // 8) + 4 (n % 2) + (n % 8) // 2, so that accumulator register 4 jj + i
    (wgmma m64n16: i = 2 h + c; row acc_row + 8 h, column 2 quad + c + 8 jj) of the four quad
    lanes is one 16-byte row of 8x8 b16 matrix i: tokens 8 jj + 4 c .. + 3 of hidden row
    acc_row + 8 h. One ``stmatrix_x4`` per (block, jj), lane 8 i + j addressing row j of matrix
    i (``stage_stsm_offset``). Every byte written once, the loads (unchanged) read back each
    thread's 32 tokens in order, no bank conflict in any store (one phase per matrix) or load."""
    spec = specs.Nvfp4QuantizeSpec(fast_math=True, alu_trim=True, fma_encoder=True)
    spec = dataclasses.replace(spec, stsm_restage=True)
    m = jit.load_module(spec)
    formula = "j = (n // 8) * 8 + (n % 2) * 4 + (n % 8) // 2"
    assert f"        {formula}  #" in render(spec)  # the B matrix's columns (consume_cols)

    def token(n):
        return (n // 8) * 8 + (n % 2) * 4 + (n % 8) // 2

    elem = m.STAGE_ELEM_BYTES
    assert elem == 4
    owner = {}
    store_ways = []
    for warp in range(4):
        for kb in range(4):
            for jj in range(2):  # one STSM.x4: registers 4 jj .. 4 jj + 3 of block kb
                addrs = [
                    m.stage_stsm_offset(warp, lane) + m.STORE_OFFSETS[kb] + 32 * jj
                    for lane in range(32)
                ]
                store_ways.append(_max_bank_ways(addrs, 16))
                for i in range(4):  # matrix i = register i = accumulator 4 jj + i
                    h, c = i // 2, i % 2
                    for r in range(8):  # matrix row r: lanes 4 r + k, their register i
                        for k in range(4):
                            acc_row = 16 * warp + (4 * r + k) // 4
                            n = 2 * ((4 * r + k) % 4) + c + 8 * jj
                            value = (acc_row + 8 * h, 16 * kb + token(n))
                            for b in range(4):
                                key = addrs[8 * i + r] + 4 * k + b
                                assert key not in owner, "two stores share a byte"
                                owner[key] = value
    _check_stores_then_loads(m, owner, store_ways)


def test_stsm_restage_switch_and_spec():
    """``nvfp4.STSM_RESTAGE`` (default off) reaches only fast math's wgmma RHT kernels (RN, both
    directions or columnwise only); the field stays out of the key when off and the spec refuses
    it where that restage does not exist."""
    from cutequant import nvfp4

    assert nvfp4.STSM_RESTAGE is False
    fast = dict(arch="sm_90a", rowwise=True, columnwise=True, rht=True, swizzled=False,
                fast_math=True, stochastic=False)  # fmt: skip
    assert nvfp4._spec(**fast, stsm=True).stsm_restage
    assert nvfp4._spec(**{**fast, "rowwise": False}, stsm=True).stsm_restage
    assert not nvfp4._spec(**fast).stsm_restage
    for other in (
        dict(fast_math=False),
        dict(stochastic=True),
        dict(rht=False),
        dict(arch="sm_100a"),  # mma.sync there
    ):
        assert not nvfp4._spec(**{**fast, **other}, stsm=True).stsm_restage, other
    assert not nvfp4._spec(**fast, rht_mma="mma_sync", stsm=True).stsm_restage
    on = specs.Nvfp4QuantizeSpec(fast_math=True, stsm_restage=True)
    assert '"stsm_restage": true' in on.key()
    assert "stsm_restage" not in specs.Nvfp4QuantizeSpec(fast_math=True).key()
    for bad in (
        dict(),
        dict(fast_math=True, stochastic=True),
        dict(fast_math=True, rht=False),
        dict(fast_math=True, rht_mma="mma_sync"),
        dict(fast_math=True, arch="sm_100a"),
    ):
        with pytest.raises(ValueError, match="stsm_restage"):
            specs.Nvfp4QuantizeSpec(stsm_restage=True, **bad)
