"""CPU: the dequantize kernels' bit tricks, emulated instruction by instruction
(``kernels/dequant.py``; the GPU tests in test_gpu_dequant.py check the outputs bit for bit):
the e2m1 -> e4m3 decode (``e2m1x8_to_e4m3``: PRMT LUT + sign PRMT + LOP3), every 16-bit half.
"""

import random

import torch

from cutequant.kernels import dequant as dq

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): bytes 0-3 of ``a``, 4-7 of ``b``; selector nibble k picks
    output byte k, its bit 3 replicates the picked byte's sign bit."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def e2m1x8_to_e4m3(word: int) -> tuple[int, int]:
    """``dequant.e2m1x8_to_e4m3`` on Python ints, with the module's constants."""
    mag = word & 0x77777777
    w4 = (word << 4) & 0xFFFFFFFF
    lut = (dq.E2M1_AS_E4M3_LO, dq.E2M1_AS_E4M3_HI)
    lo = prmt(*lut, mag & 0xFFFF)
    hi = prmt(*lut, (mag >> 16) & 0xFFFF)
    lo |= prmt(w4, word, dq.E2M1_SIGN_SEL_LO) & 0x80808080
    hi |= prmt(w4, word, dq.E2M1_SIGN_SEL_HI) & 0x80808080
    return lo, hi


def test_e2m1_to_e4m3_every_half_word():
    """Every 4 codes in either half of the word (the other half random) decode to the e4m3
    bytes of their values, -0 included."""
    rng = random.Random(5)
    want = torch.tensor([(-1.0 if c & 8 else 1.0) * E2M1[c & 7] for c in range(16)])
    for half in (0, 1):
        got = []
        codes = []
        for v in range(1 << 16):
            other = rng.getrandbits(16)
            word = (v << 16 | other) if half else (other << 16 | v)
            lo, hi = e2m1x8_to_e4m3(word)
            e4m3 = hi if half else lo
            got += [(e4m3 >> (8 * k)) & 0xFF for k in range(4)]
            codes += [(v >> (4 * k)) & 0xF for k in range(4)]
        vals = torch.tensor(got, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        ref = want[torch.tensor(codes)]
        assert torch.equal(vals, ref)
        assert torch.equal(torch.signbit(vals), torch.signbit(ref))  # -0 for code 8
