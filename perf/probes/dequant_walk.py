"""A/Bs of the columnwise dequantize kernels, interleaved rounds on the bench's cases (CUDA
graph replay), checking first that every side gives the same bits on every op and case:

* ``--ab tokens`` (default): the tile length (``dequant.COLUMNWISE_TOKENS``, a compile
  variant): 64-token x 128-column tiles vs 128 / 256 tokens x 64 columns, which read 64 / 128
  contiguous bytes of each NVFP4 column row per tile (FP8: 128 / 256) instead of 32 (64);
  ``--values 64,256`` picks sides. About 2 minutes on an H200, compiles included;
* ``--ab ring``: the 256-token tiles' staging (``dequant.COLUMNWISE_RING``, a compile variant;
  the tile length is pinned to 256 for every op): the whole 32 KB tile vs a ring of two 64-token
  sub-tile buffers (16 KB) with registers bounded for 8 CTAs per SM;
* ``--ab scales``: the 256-token NVFP4 tiles' scale loads (``dequant.COLUMNWISE_SCALE_WORDS``,
  a compile variant; compact scales only, FP8 sides are the same kernel; the tile length pinned
  to 256 as for ``ring``): one LDG.U8 per 16 tokens vs one word per lane and column group plus
  a byte transpose over the quad;
* ``--with NAME=VALUE`` (repeatable) sets another module flag of ``cutequant.dequant`` for
  both sides, e.g. ``--ab scales --with COLUMNWISE_RING=8``;
* ``--ab walk``: the CTA order (``dequant.COLUMNWISE_ROW_TILES_FIRST``, a kernel argument: no
  recompile), column tiles fastest vs a column strip's row tiles first;
* ``--ab hints``: cache hints of every dequantize kernel (``dequant.CACHE_HINTS``, a compile
  variant): none / "ld" (loads ld.global.nc.L1::no_allocate.L2::256B) / "st" (stores
  st.global.cs) / "ldst"; ``--values none,ld,st,ldst``; give rowwise ops with ``--ops`` too;
* ``--ab tail``: tail CTAs of the 256-token ring kernels (``dequant.COLUMNWISE_TAIL``, a compile
  variant plus kernel arguments): 0 off, 1 or 2 sub-tiles per short CTA at the walk's end;
  ``--with COLUMNWISE_TAIL_WAVES=0.25`` changes how much work the plan gives them, ``--with
  COLUMNWISE_HEAD_WAVES=1`` adds a wave of short CTAs at the start (perf/NOTES.md, "short
  calls");
* ``--ab regs``: the FP8 columnwise ring tiles transposed in registers
  (``dequant.COLUMNWISE_REGS``, a compile variant; 16-bit outputs; the NVFP4 ops are the same
  kernel on every side, so give ``--ops fp8_dequantize_col``): 0, shared-memory staging
  through the sub-tile ring (the default); 128 / 256, the threads per CTA of the register
  transpose (no shared memory, no barrier) (perf/NOTES.md, "FP8 transposed dequantize in
  registers").

Each op and case is built once (inputs and quantized results); the sides are switched between
the timings (the module flags are read when a call builds its spec; replay records are keyed
by them).

    python perf/probes/dequant_walk.py [--ab tokens] [--values 64,128,256] [--rounds 2]
                                       [--ops nvfp4_dequantize_col,...] [--cases ...]
    python perf/probes/dequant_walk.py --rows-first perf/bench.py --ops ...   # any script
    python perf/probes/dequant_walk.py --tokens 128 perf/bench.py --ops nvfp4_dequantize_col
    python perf/probes/dequant_walk.py --flag COLUMNWISE_TAIL=2 perf/probes/size_sweep.py \
        --ops dq_col                      # any flag of --with, then any script

On a fresh machine run `cutequant precompile -j 16 --ab dequantize` first (the default
kernels and this probe's A/B side, compiled in parallel into the disk cache): compiled one by
one inside the probe they can take its whole call.
"""

import argparse
import runpy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench  # noqa: E402

from cutequant import dequant  # noqa: E402

COL_OPS = "nvfp4_dequantize_col,nvfp4_dequantize_col_unrht,fp8_dequantize_col"
# (module attribute, its values, how to parse --values)
ABS = {
    "tokens": ("COLUMNWISE_TOKENS", (64, 128, 256), int),
    "ring": ("COLUMNWISE_RING", (0, 8), int),
    "scales": ("COLUMNWISE_SCALE_WORDS", (False, True), lambda v: v == "True"),
    "walk": ("COLUMNWISE_ROW_TILES_FIRST", (False, True), lambda v: v == "True"),
    "hints": ("CACHE_HINTS", ("", "ld", "st", "ldst"), lambda v: "" if v == "none" else v),
    "tail": ("COLUMNWISE_TAIL", (0, 1, 2), int),
    "regs": ("COLUMNWISE_REGS", (0, 128, 256), int),
}
# flags --with may set (name: parse)
EXTRA = {
    "COLUMNWISE_TOKENS": int,
    "COLUMNWISE_RING": int,
    "COLUMNWISE_SCALE_WORDS": lambda v: v == "True",
    "COLUMNWISE_ROW_TILES_FIRST": lambda v: v == "True",
    "CACHE_HINTS": lambda v: "" if v == "none" else v,
    "COLUMNWISE_TAIL": int,
    "COLUMNWISE_TAIL_WAVES": float,
    "COLUMNWISE_HEAD_WAVES": float,
    "COLUMNWISE_REGS": int,
}


def _outputs(fn, calls: int = 2) -> list:
    """The outputs of the next ``calls`` calls of a bench op (its rotation over two inputs:
    every side sees both, in the same order), as integer bits."""
    got = []
    orig = dequant.nvfp4_group_dequantize, dequant.fp8_group_dequantize
    dequant.nvfp4_group_dequantize = lambda *a, **k: got.append(orig[0](*a, **k)) or got[-1]
    dequant.fp8_group_dequantize = lambda *a, **k: got.append(orig[1](*a, **k)) or got[-1]
    try:
        for _ in range(calls):
            fn()
    finally:
        dequant.nvfp4_group_dequantize, dequant.fp8_group_dequantize = orig
    return [t.view(torch.int16 if t.element_size() == 2 else torch.int32) for t in got]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ab", choices=sorted(ABS), default="tokens")
    p.add_argument("--values", default=None, help="comma-separated sides (default: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ops", default=COL_OPS)
    p.add_argument("--cases", default=",".join(bench.CASES))
    p.add_argument("--with", dest="extra", action="append", default=[], help="NAME=VALUE")
    args = p.parse_args(argv)
    attr, values, parse = ABS[args.ab]
    if args.values:
        values = tuple(parse(v) for v in args.values.split(","))
    default = getattr(dequant, attr)
    saved = {name: getattr(dequant, name) for name in ("COLUMNWISE_TOKENS", *EXTRA)}
    if args.ab in ("ring", "scales"):  # 256-token tiles only (the inverse RHT's default is 128)
        dequant.COLUMNWISE_TOKENS = 256
    for item in args.extra:
        name, value = item.split("=")
        assert name in EXTRA, f"--with: one of {EXTRA}"
        setattr(dequant, name, EXTRA[name](value))
    print(f"flags: {dict((n, getattr(dequant, n)) for n in saved)}")
    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s; {attr} {values}")
    built = {}
    try:
        for op in args.ops.split(","):  # bits first, every op and case
            for case in args.cases.split(","):
                fn, nbytes = bench.OPS[op](case, torch.Generator().manual_seed(1234))
                built[op, case] = fn, nbytes
                outs = []
                for value in values:
                    setattr(dequant, attr, value)
                    outs.append(_outputs(fn))
                for value, out in zip(values[1:], outs[1:], strict=True):
                    same = all(torch.equal(a, b) for a, b in zip(outs[0], out, strict=True))
                    assert same, f"{op} {case}: {attr} {values[0]} and {value} differ"
        print("bits: every side identical on every op and case")
        header = " / ".join(str(v) if v != "" else "none" for v in values)
        rounds = " | ".join(f"{header}, round {r + 1}" for r in range(args.rounds))
        print(f"| op | case | {rounds} |")
        for (op, case), (fn, nbytes) in built.items():
            cells = []
            for _ in range(args.rounds):
                side = []
                for value in values:
                    setattr(dequant, attr, value)
                    us = bench.graph_time_us(fn)
                    side.append(f"{us:.1f} us {100 * nbytes / us / 1e3 / copy:.1f}%")
                cells.append(" / ".join(side))
            print(f"| {op} | {case} | " + " | ".join(cells) + " |", flush=True)
    finally:
        setattr(dequant, attr, default)
        for name, value in saved.items():
            setattr(dequant, name, value)
    return 0


def _run_script(argv: list) -> None:
    """``-m module args`` or ``script args``, as ``python`` would run them."""
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(sys.argv[0], run_name="__main__")
    else:
        sys.argv = argv
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rows-first":
        dequant.COLUMNWISE_ROW_TILES_FIRST = True
        _run_script(sys.argv[2:])
    elif len(sys.argv) > 2 and sys.argv[1] == "--tokens":
        dequant.COLUMNWISE_TOKENS = int(sys.argv[2])
        _run_script(sys.argv[3:])
    elif len(sys.argv) > 2 and sys.argv[1] == "--flag":
        name, value = sys.argv[2].split("=")
        setattr(dequant, name, EXTRA[name](value))
        _run_script(sys.argv[3:])
    else:
        sys.exit(main())
