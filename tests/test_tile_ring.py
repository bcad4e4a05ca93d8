"""CPU: the 2D kernel's tile ring (``Nvfp4Quantize2dSpec.ring``, ``kernels/tile_ring.py``).

The slot layout covers the ring once with warp-contiguous 16-byte chunks, in the word order of
``load_rows``; and an emulation of the kernel's schedule (its prologues, slot steps, one commit
per step, ``wait_group(RING - 1)``; written after nvfp4_quantize_2d.py.j2's ring code) reads
every tile from a slot that holds it, landed, never overwrites a slot before its tile is read,
keeps phase 1's last RING tiles for phase 2, and gives the evict_first policy exactly to the
tiles phase 2 takes from the slots.
"""

import dataclasses

import pytest

from cutequant.codegen import specs as S
from cutequant.codegen.render import module_name, render
from cutequant.kernels.tile_ring import chunk_offset

THREADS = 256


@pytest.mark.parametrize("in_bytes", [2])
@pytest.mark.parametrize("slots", [2, 3])
def test_slot_layout(in_bytes, slots):
    chunks = 2 * in_bytes
    offsets = [
        chunk_offset(s, q, t, THREADS, chunks)
        for s in range(slots)
        for q in range(chunks)
        for t in range(THREADS)
    ]
    slot_bytes = chunks * 16 * THREADS
    assert sorted(offsets) == list(range(0, slots * slot_bytes, 16))  # every byte once
    for s in range(slots):
        for q in range(chunks):
            for w in range(THREADS // 32):  # a warp: 512 contiguous bytes, lane order
                base = chunk_offset(s, q, 32 * w, THREADS, chunks)
                got = [chunk_offset(s, q, 32 * w + lane, THREADS, chunks) for lane in range(32)]
                assert got == [base + 16 * lane for lane in range(32)]
            # the template's address: ring + 16 tidx + SLOT_BYTES slot + q * 16 * THREADS
            assert chunk_offset(s, q, 5, THREADS, chunks) == 16 * 5 + slot_bytes * s + q * 4096
    # chunk q = IN_BYTES * row + piece holds load_rows' words[per_row * row + 4 * piece + z]
    per_row = 4 * in_bytes
    for row in range(2):
        for piece in range(in_bytes):
            q = in_bytes * row + piece
            assert [4 * q + z for z in range(4)] == [
                per_row * row + 4 * piece + z for z in range(4)
            ]


class Thread:
    """One thread's cp.async state: issued copies grouped by commit, landed slot contents."""

    def __init__(self, slots):
        self.content = [None] * slots  # landed tile of each slot
        self.read = [True] * slots  # its landed tile was read (or the slot is empty)
        self.flying = [None] * slots  # the tile a pending copy brings
        self.pending = []  # copies since the last commit
        self.groups = []  # committed, not yet waited for
        self.policies = {}  # (phase, tile) -> policy of its copy

    def issue(self, slot, tile, policy=None):
        assert self.flying[slot] is None, f"slot {slot}: a copy is still flying"
        assert self.read[slot], f"slot {slot}: tile {self.content[slot]} overwritten unread"
        self.flying[slot] = tile
        self.pending.append(slot)
        if policy is not None:
            self.policies[tile] = policy

    def commit(self):
        self.groups.append(self.pending)
        self.pending = []

    def wait_group(self, keep):
        while len(self.groups) > keep:
            for slot in self.groups.pop(0):
                self.content[slot] = self.flying[slot]
                self.flying[slot] = None
                self.read[slot] = False

    def take(self, slot, tile):
        assert self.flying[slot] is None, f"slot {slot}: read while its copy flies"
        assert self.content[slot] == tile, (slot, self.content[slot], tile)
        self.read[slot] = True


def emulate(n: int, ring: int, compute_amax: bool):
    """The kernel's ring schedule for a CTA with ``n`` tiles. Tiles are named by phase-1 walk
    index w (item end - 1 - w); phase 2's tile i is w = n - 1 - i. Returns the thread."""
    th = Thread(ring)
    slot = 0
    if compute_amax:  # expert_amaxes
        for s in range(ring):
            if s < n:
                th.issue(s, s, "once" if s + ring >= n else "keep")
            th.commit()
        for j in range(n):
            th.wait_group(ring - 1)
            th.take(slot, j)
            if j + ring < n:
                th.issue(slot, j + ring, "once" if j + 2 * ring >= n else "keep")
            th.commit()
            slot = 0 if slot == ring - 1 else slot + 1
    for s in range(ring):  # kernel: given amax, the first RING tiles' copies
        if not compute_amax and s < n:
            th.issue(ring - 1 - s, n - 1 - s)
        th.commit()
    held = {n - 1 - i for i in range(min(n, ring))}
    reissued = set()
    for i in range(n):
        slot = ring - 1 if slot == 0 else slot - 1
        th.wait_group(ring - 1)
        th.take(slot, n - 1 - i)
        if i + ring < n:
            th.issue(slot, n - 1 - (i + ring))
            reissued.add(n - 1 - (i + ring))
        th.commit()
    assert all(f is None for f in th.flying)  # every copy was waited for and read
    if compute_amax:
        # phase 2 copies again exactly the tiles it does not find in the slots
        assert reissued == set(range(n)) - held
        once = {w for w, p in th.policies.items() if p == "once"}
        assert once == held  # evict_first for the kept tiles (their L2 copy is not read)
    return th


@pytest.mark.parametrize("ring", [2, 3, 4])
@pytest.mark.parametrize("compute_amax", [True, False])
def test_schedule(ring, compute_amax):
    for n in range(0, 15):
        emulate(n, ring, compute_amax)


def test_emulation_catches_a_short_wait():
    """The emulation's checks fire: waiting for one group less reads a slot still flying."""
    th = Thread(3)
    th.issue(0, 0)
    th.commit()
    th.issue(1, 1)
    th.commit()
    th.wait_group(2)
    with pytest.raises(AssertionError):
        th.take(0, 0)


def test_ring_spec_keys_and_rules():
    """``ring`` / ``evict_first``: off leaves the default keys and sources alone, on changes
    both; the ring takes 16-bit inputs, not legacy; the hints need the fake-quant ring on
    sm_90a. The runtime's flags pick them (``nvfp4_2d._variant``)."""
    from cutequant import nvfp4_2d

    base = S.Nvfp4Quantize2dSpec(fake_out="bf16")
    ringed = dataclasses.replace(base, ring=True)
    hinted = dataclasses.replace(ringed, evict_first=True)
    assert "ring" not in base.key() and "evict_first" not in ringed.key()
    assert len({base.key(), ringed.key(), hinted.key()}) == 3
    assert len({module_name(base), module_name(ringed), module_name(hinted)}) == 3
    assert "tr.wait_group" in render(ringed) and "tile_ring" not in render(base)
    assert "cp_async_16_hint" in render(hinted) and "cp_async_16_hint" not in render(ringed)
    for bad in (dict(in_dtype="f32"), dict(legacy=True)):
        with pytest.raises(ValueError, match="ring"):
            S.Nvfp4Quantize2dSpec(ring=True, **bad)
    for bad in (dict(ring=False), dict(fake_out=""), dict(arch="sm_100a")):
        with pytest.raises(ValueError, match="evict_first"):
            S.Nvfp4Quantize2dSpec(**{"ring": True, "fake_out": "bf16", "evict_first": True, **bad})
    assert S.Nvfp4Quantize2dSpec().smem_bytes() + 1024 == nvfp4_2d._SMEM_BYTES
    flags = (nvfp4_2d.LEGACY_2D, nvfp4_2d.RING_2D, nvfp4_2d.EVICT_FIRST_2D)
    try:
        assert nvfp4_2d._variant("sm_90a", "bf16", True) == (False, False, False)
        nvfp4_2d.RING_2D = nvfp4_2d.EVICT_FIRST_2D = True
        assert nvfp4_2d._variant("sm_90a", "bf16", True) == (False, True, True)
        assert nvfp4_2d._variant("sm_90a", "bf16", False) == (False, True, False)
        assert nvfp4_2d._variant("sm_90a", "f32", True) == (False, False, False)
        assert nvfp4_2d._variant("sm_100a", "f16", True) == (False, True, False)
        nvfp4_2d.LEGACY_2D = True
        assert nvfp4_2d._variant("sm_90a", "bf16", True) == (True, False, False)
    finally:
        nvfp4_2d.LEGACY_2D, nvfp4_2d.RING_2D, nvfp4_2d.EVICT_FIRST_2D = flags
    for spec in S.ring_2d_variants():  # what the flags can select is in the A/B list
        assert spec in S.fake_quant_ab_variants()


# ------------------------------------------------ words_absmax: packed |max| tree (CPU model)

import numpy as np  # noqa: E402

_HALF = {"bf16": (16, 7), "f16": (5, 10)}  # (exponent bits or f32 shift, mantissa bits)


def _half_to_f32(h: np.ndarray, kind: str) -> np.ndarray:
    """``device.half_to_f32``: exact widening of 16-bit patterns."""
    h = h.astype(np.uint32)
    if kind == "bf16":
        return (h << 16).view(np.float32)
    return h.astype(np.uint16).view(np.float16).astype(np.float32)


def _is_nan16(h: np.ndarray, kind: str) -> np.ndarray:
    return np.isnan(_half_to_f32(h, kind))


def _pair_absmax16(a: np.ndarray, b: np.ndarray, kind: str) -> np.ndarray:
    """PTX max.NaN.xorsign.abs.{bf16,f16} on one half: canonical NaN (0x7FFF) if either is
    NaN, else the larger magnitude with the sign a XOR b."""
    sign = (a ^ b) & 0x8000
    fa, fb = np.abs(_half_to_f32(a, kind)), np.abs(_half_to_f32(b, kind))
    mag = np.where(fa >= fb, a & 0x7FFF, b & 0x7FFF)
    out = sign | mag
    return np.where(_is_nan16(a, kind) | _is_nan16(b, kind), 0x7FFF | sign, out).astype(np.uint32)


def _absmax32(acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    """PTX max.NaN.xorsign.abs.f32 (``device.absmax``) on bit patterns."""
    ai, xi = acc.view(np.uint32), x.view(np.uint32)
    sign = (ai ^ xi) & 0x80000000
    mag = np.maximum(np.abs(acc), np.abs(x)).view(np.uint32) & 0x7FFFFFFF
    nan = np.isnan(acc) | np.isnan(x)
    return (
        (np.where(nan, 0x7FFFFFFF, mag | sign) | np.where(nan, sign, 0))
        .astype(np.uint32)
        .view(np.float32)
    )


def _old(acc: np.ndarray, halves: np.ndarray, kind: str) -> np.ndarray:
    """The f32 chain: acc, then every value widened (``widen`` + ``dev.absmax``)."""
    for k in range(halves.shape[1]):
        acc = _absmax32(acc, _half_to_f32(halves[:, k], kind))
    return acc


def _new(acc: np.ndarray, halves: np.ndarray, kind: str) -> np.ndarray:
    """``words_absmax``: the packed tree over words (two halves each), then both halves."""
    lo, hi = halves[:, 0::2], halves[:, 1::2]
    while lo.shape[1] > 1:
        lo = _pair_absmax16(lo[:, 0::2], lo[:, 1::2], kind)
        hi = _pair_absmax16(hi[:, 0::2], hi[:, 1::2], kind)
    acc = _absmax32(acc, _half_to_f32(lo[:, 0], kind))
    return _absmax32(acc, _half_to_f32(hi[:, 0], kind))


def _final(x: np.ndarray) -> np.ndarray:
    """What phase 1 folds: |.| of the result (``cute.math.absf`` before ``fold_tiles``)."""
    return x.view(np.uint32) & 0x7FFFFFFF


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_words_absmax_equals_the_f32_chain(kind):
    """Every 16-bit pattern at every one of the 32 positions of a zero tile (exhaustive per
    position), then random tiles of specials and normal values, against accumulators of every
    class (0, subnormal, normal, max, inf, NaNs): the folded bits agree."""
    accs = np.array(
        [0.0, -0.0, 1e-40, 3.0, -7.5, 3.4e38, np.inf, -np.inf, np.nan], dtype=np.float32
    )
    accs = np.concatenate([accs, np.array([0x7FC00001, 0xFFFFFFFF], np.uint32).view(np.float32)])
    every = np.arange(1 << 16, dtype=np.uint32)
    for pos in (0, 1, 14, 31):
        halves = np.zeros((every.size, 32), np.uint32)
        halves[:, pos] = every
        for acc in accs:
            a = np.full(every.size, acc, np.float32)
            assert np.array_equal(_final(_old(a, halves, kind)), _final(_new(a, halves, kind)))
    rng = np.random.default_rng(7)
    specials = np.array([0, 0x8000, 0x7FFF, 0xFFFF, 0x0001, 0x8001, 0x7F80, 0xFF80, 0x7C00,
                         0xFC00, 0x7BFF, 0x7F7F, 0x7E00, 0x7C01], np.uint32)  # fmt: skip
    for _ in range(20):
        halves = rng.integers(0, 1 << 16, (4096, 32), dtype=np.uint32)
        pick = rng.random((4096, 32)) < 0.1
        halves = np.where(pick, rng.choice(specials, (4096, 32)), halves).astype(np.uint32)
        acc = rng.choice(accs, 4096).astype(np.float32)
        assert np.array_equal(_final(_old(acc, halves, kind)), _final(_new(acc, halves, kind)))
