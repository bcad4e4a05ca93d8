"""Probe (GPU): A/B of a module switch of the fused NVFP4 fake-quant / 2D kernels in one
process (issue 20: >= 80% of the copy rate on an H200).

    python perf/probes/fake_quant_ab.py [--cases "dense 8192x5120,..."] [--ops ...]
    python perf/probes/fake_quant_ab.py --flag NAME[,NAME...] [--ops ...]

``--flag NAME[,NAME...]``: A/B a module flag (or several set together) of
``cutequant.fake_quant`` (``nvfp4_2d.NAME``: of ``cutequant.nvfp4_2d``, for the 2D ops) on every
op given (default: the columnwise SR kernel): side "off" = the flags False (the default
kernels), "on" = True. The outputs of both sides are compared bit for bit on the case's inputs
first (the columnwise ops with and without the RHT, SR with the same rng state); then both are
timed like perf/bench.py (CUDA-graph replay, median, ``bench.graph_time_us``), alternating sides
over ``--rounds`` rounds so that clock drift hits both. Without ``--flag`` every op is timed
once, for the table. Prints us and % of the copy rate measured in the same run.

The switches of issue 20 (the kernels' legacy forms and the losing variants) are retired: the
winners are the only forms (perf/NOTES.md, "retired A/B switches"); a new switch is a module
flag, default False, that this probe flips.

On a fresh machine run `cutequant precompile -j 16 --ab fake_quant_sr_trim` first (the default
kernels and this probe's A/B side, compiled in parallel into the disk cache): compiled one by
one inside the probe they can take its whole call.
"""

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/
import bench  # noqa: E402

import cutequant  # noqa: E402
from cutequant import fake_quant, nvfp4_2d, replay  # noqa: E402

# op -> (module, flag) under --flag: the flag set to True selects the "on" side
SWITCHES: dict = {}
QUANTIZE_2D_OPS = [op for op in bench.OPS if op.startswith("nvfp4_2d_weights")]
MODULES = {"fake_quant": fake_quant, "nvfp4_2d": nvfp4_2d}
OPS = (
    "fake_quant_columnwise_kernel",
    "fake_quant_columnwise_kernel_sr",
    "fake_quant_rows_sr",
    "fake_quant_weights_2d",
    "nvfp4_2d_weights(amax+quantize)",
)


def columnwise_outputs(case, sr: bool):
    """The columnwise kernel's outputs (given amax; with the RHT, then without) on the case's
    first input, concatenated."""
    gen = torch.Generator().manual_seed(0)
    _, splits, xs = bench.make_inputs(case, gen)
    x = xs[0]
    out = []
    for rht in (True, False):
        amax = cutequant.group_amax(x, splits, rht=rht)[1]
        rng = torch.tensor([7, 0], dtype=torch.int64, device="cuda") if sr else None
        y, _ = fake_quant.nvfp4_fake_quantize_columnwise_impl(
            x, splits, amax, rht, 0xD7E8, sr, rng, torch.bfloat16
        )
        out.append(y)
    torch.cuda.synchronize()
    return torch.cat(out)


def rows_outputs(case, sr: bool):
    """The rowwise kernel's output (computed amax) on the case's first input."""
    gen = torch.Generator().manual_seed(0)
    _, splits, xs = bench.make_inputs(case, gen)
    rng = torch.tensor([7, 0], dtype=torch.int64, device="cuda") if sr else None
    y, _ = fake_quant.nvfp4_fake_quantize_rows_impl(xs[0], splits, None, sr, rng, torch.bfloat16)
    torch.cuda.synchronize()
    return y.view(torch.int16)


def weights_2d_outputs(case, fake: bool):
    """The 2D kernel's outputs (computed amax; the case's shape as E experts, as bench.py):
    the fake-quant values, or every quantize output byte (one allocation) and the amax."""
    gen = torch.Generator().manual_seed(0)
    _, splits, xs = bench.make_inputs(case, gen)
    e, n_cols = len(splits), xs[0].shape[1]
    rows = sum(splits) // e // 16 * 16
    w = xs[0][: e * rows].view(e, rows, n_cols)
    if fake:
        y, amax = nvfp4_2d.nvfp4_fake_quantize_2d_impl(w, None, torch.bfloat16)
        out = torch.cat([y.view(torch.int16).reshape(-1).view(torch.uint8), amax.view(torch.uint8)])
    else:
        got = nvfp4_2d.nvfp4_quantize_2d_impl(w, True, True, False, None)
        out = torch.cat([t.reshape(-1).view(torch.uint8) for t in got])
    torch.cuda.synchronize()
    return out


def outputs(op, case):
    if op.startswith("fake_quant_columnwise"):
        return columnwise_outputs(case, op.endswith("_sr")).view(torch.int16)
    if op.startswith("fake_quant_rows"):
        return rows_outputs(case, op.endswith("_sr"))
    return weights_2d_outputs(case, op == "fake_quant_weights_2d")


def _set(mod, flag, value: bool):
    """Set one module flag, or each of a comma-separated list."""
    for name in flag.split(","):
        if not hasattr(mod, name):
            raise SystemExit(f"{mod.__name__} has no flag {name}")
        setattr(mod, name, value)
    # the public ops (bench.OPS) replay recorded launches under keys that hold the call's
    # arguments, not the module switches: forget the records, or a flip times the old kernel
    replay.invalidate()


def compare_bits(op, case) -> bool:
    mod, flag = SWITCHES[op]
    if op in QUANTIZE_2D_OPS[1:]:
        return True  # one 2D quantize comparison (rowwise + columnwise, compact) is enough
    outs = []
    for on in (False, True):
        _set(mod, flag, on)
        outs.append(outputs(op, case))
    _set(mod, flag, False)
    same = torch.equal(outs[0], outs[1])
    if not same:
        diff = (outs[0] != outs[1]).sum().item()
        print(f"  BITS DIFFER: {op} / {case}: {diff} of {outs[0].numel()} elements")
    return same


def time_op(op, case, on=None) -> float:
    if on is not None:
        mod, flag = SWITCHES[op]
        _set(mod, flag, on)
    try:
        fn, _ = bench.OPS[op](case, torch.Generator().manual_seed(0))
        return bench.graph_time_us(fn)
    finally:
        if on is not None:
            _set(mod, flag, False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", default=",".join(bench.CASES))
    p.add_argument("--ops", default=None, help=f"default: {','.join(OPS)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--flag", default=None, help="A/B these flags (comma-separated; nvfp4_2d.NAME: the 2D)"
    )
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    labels = ("off", "on")
    if args.flag:
        module, _, names = args.flag.rpartition(".")
        if module not in ("", *MODULES):
            raise SystemExit(f"--flag: {module} is not one of {', '.join(MODULES)}")
        mod = MODULES[module or "fake_quant"]
        ops = (args.ops or "fake_quant_columnwise_kernel_sr").split(",")
        for op in ops:
            if op not in bench.OPS or not (op.startswith("fake_quant_") or op in QUANTIZE_2D_OPS):
                raise SystemExit(f"--flag: {op} is not a fake-quant or 2D op")
            SWITCHES[op] = (mod, names)
        _set(mod, names, False)  # checks the names
        labels = (f"{args.flag}=off", "on")
    else:
        ops = (args.ops or ",".join(OPS)).split(",")
    copy = bench.copy_bandwidth_gbps()
    print(f"copy: {copy:.0f} GB/s  ({torch.cuda.get_device_name()})")
    ok = True
    for op in ops:
        if op in SWITCHES:
            for case in cases:
                ok &= compare_bits(op, case)
    same = f"bits: {labels[0]} == {labels[1]} on every switched op and case"
    print(same if ok else "bits: MISMATCH")
    if not ok:
        return 1  # no timings of kernels that disagree
    for op in ops:
        for case in cases:
            _, nbytes = bench.OPS[op](case, torch.Generator().manual_seed(0))
            pct = lambda us, n=nbytes: 100.0 * n / (us * 1e3) / copy  # noqa: E731
            if op not in SWITCHES:
                us = time_op(op, case)
                print(f"{op:34s} {case:24s} {us:8.1f} us {pct(us):5.1f}%")
                continue
            a, b = bench.interleaved_medians(functools.partial(time_op, op, case), args.rounds)
            print(
                f"{op:34s} {case:24s} {labels[0]} {a:8.1f} us {pct(a):5.1f}%   "
                f"{labels[1]} {b:8.1f} us {pct(b):5.1f}%   "
                f"{100.0 * (a - b) / a:+5.1f}% less time {labels[1]}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
