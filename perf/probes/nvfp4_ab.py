"""Probe (GPU): A/B of the NVFP4 quantize kernel with and without a runtime/nvfp4.py switch, in
one process: ``ALU_TRIM`` (the default; issue 17, branch speed4: fewer ALU-pipe instructions in
the hot loops, kernels/nvfp4_trim.py) or ``FMA_ENCODER`` (branch alu5: the RN encoder with part
of its work on the FMA pipe, kernels/nvfp4_fma.py; on top of ALU_TRIM's kernel),
``STSM_RESTAGE`` (branch trim6, default off: fast math's restage by stmatrix, straight from the
accumulators; by default it times fast math and, as a control that runs the same kernel on both
sides, the exact quantize) or ``SR_TRIM`` (branch sr5: the SR encoder with fewer ALU-pipe
instructions, kernels/nvfp4_sr.py; SR calls only: without ``--ops`` it compares the bits of
every SR output set and times ``nvfp4_quantize_sr``).

    python perf/probes/nvfp4_ab.py [--switch FMA_ENCODER] [--cases "dense 8192x5120,..."]
                                   [--ops ...] [--rounds 5]
    python perf/probes/nvfp4_ab.py --switch FMA_ENCODER --bits-only
    python perf/probes/nvfp4_ab.py --switch SR_TRIM --rounds 5

Side "off" = ``cutequant.nvfp4.<switch>`` False, "on" = True, every other switch as it is
(FMA_ENCODER needs ALU_TRIM, the default; it leaves SR calls as they are). For every op
and case the outputs of both sides are compared bit for bit first (row data, row scales,
column data, column scales, both amaxes; the amax pass included, SR with the same rng state,
every byte of the output buffers, padding included); then both are timed like perf/bench.py
(CUDA-graph replay, median, ``bench.graph_time_us``: the quantize kernel alone, with a given
amax), alternating sides over ``--rounds`` rounds so that clock drift hits both. Prints us and %
of the copy rate measured in the same run, and the change in time of "on".

On a fresh machine run `cutequant precompile -j 16 --ab fma_encoder` (or `--ab sr_trim`, `--ab
stsm_restage`) first: the default kernels and this probe's A/B side, compiled in parallel into
the disk cache; compiled one by one inside the probe they can take its whole call (run 78).
"""

import argparse
import contextlib
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/
import bench  # noqa: E402

import cutequant  # noqa: E402
from cutequant import nvfp4  # noqa: E402

# bench.py's NVFP4 quantize ops and their options (bench_nvfp4 without the amax pass)
OPTS = {
    "nvfp4_quantize": {},
    "nvfp4_quantize_swizzled": dict(swizzled_scales=True),
    "nvfp4_quantize_fastmath": dict(fast_math=True),
    "nvfp4_quantize_sr": dict(stochastic_rounding=True),
    "nvfp4_rowwise_only": dict(columnwise=False, rht=False),
    "nvfp4_columnwise_only": dict(rowwise=False),
    # not bench.py ops, bits only: the columnwise path without the RHT (the column gather)
    "nvfp4_quantize_norht": dict(rht=False),
    "nvfp4_columnwise_only_fastmath": dict(rowwise=False, fast_math=True),  # STSM_RESTAGE's
    # SR output sets for SR_TRIM's bits (not bench.py ops)
    "nvfp4_quantize_sr_swizzled": dict(stochastic_rounding=True, swizzled_scales=True),
    "nvfp4_quantize_sr_fastmath": dict(stochastic_rounding=True, fast_math=True),
    "nvfp4_quantize_sr_norht": dict(stochastic_rounding=True, rht=False),
    "nvfp4_rowwise_only_sr": dict(stochastic_rounding=True, columnwise=False, rht=False),
    "nvfp4_columnwise_only_sr": dict(stochastic_rounding=True, rowwise=False),
}
SR_BITS = tuple(op for op in OPTS if OPTS[op].get("stochastic_rounding") and op not in bench.OPS)
OPS = tuple(op for op in OPTS if op in bench.OPS)


SWITCHES = ("ALU_TRIM", "FMA_ENCODER", "STSM_RESTAGE", "SR_TRIM")
SWITCH = "ALU_TRIM"  # set by --switch


@contextlib.contextmanager
def switched(on: bool):
    """``nvfp4.<SWITCH>`` = ``on`` inside, its value before restored after."""
    before = getattr(nvfp4, SWITCH)
    setattr(nvfp4, SWITCH, on)
    try:
        yield
    finally:
        setattr(nvfp4, SWITCH, before)


def outputs(op, case, on: bool) -> list:
    """Every output of one call (computed amax) on the case's first input, as byte tensors."""
    with switched(on):
        gen = torch.Generator().manual_seed(0)
        _, splits, xs = bench.make_inputs(case, gen)
        opts = dict(OPTS[op])
        if opts.get("stochastic_rounding"):
            opts["rng_state"] = torch.tensor([7, 0], dtype=torch.int64, device="cuda")
        res = cutequant.nvfp4_group_quantize(xs[0], splits, **opts)
        torch.cuda.synchronize()
        out = []
        for key in ("row_data", "row_scales", "col_data", "col_scales", "amax_row", "amax_col"):
            t = getattr(res, key, None)
            out.append((key, None if t is None else t.contiguous().view(-1).view(torch.uint8)))
        return out


def compare_bits(op, case) -> bool:
    off, on = outputs(op, case, False), outputs(op, case, True)
    ok = True
    for (key, a), (_, b) in zip(off, on, strict=True):
        if a is None and b is None:
            continue
        if a is None or b is None or a.numel() != b.numel() or not torch.equal(a, b):
            n = "?" if a is None or b is None or a.numel() != b.numel() else (a != b).sum().item()
            print(f"  BITS DIFFER: {op} / {case} / {key}: {n} bytes")
            ok = False
    return ok


def time_op(op, case, on: bool) -> float:
    with switched(on):
        fn, _ = bench.OPS[op](case, torch.Generator().manual_seed(0))
        return bench.graph_time_us(fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", default=",".join(bench.CASES))
    p.add_argument("--ops", default=None, help=f"default: {','.join(OPS)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bits-only", action="store_true")
    p.add_argument("--switch", default="ALU_TRIM", choices=SWITCHES)
    args = p.parse_args(argv)
    global SWITCH
    SWITCH = args.switch
    cases = args.cases.split(",")
    ops = (args.ops or ",".join(OPS)).split(",")
    if args.ops is None and SWITCH == "FMA_ENCODER":  # SR keeps its own encoder: same kernel
        ops = [op for op in ops if op != "nvfp4_quantize_sr"]
    if args.ops is None and SWITCH == "STSM_RESTAGE":  # only fast math's kernels change (the
        # exact quantize runs the same kernel on both sides: a control; columnwise only: bits)
        ops = ["nvfp4_quantize_fastmath", "nvfp4_quantize", "nvfp4_columnwise_only_fastmath"]
    if args.ops is None and SWITCH == "SR_TRIM":  # RN calls: the same kernel either way
        ops = ["nvfp4_quantize_sr"]
    for op in ops:
        if op not in OPTS:
            raise SystemExit(f"unknown op {op} (one of {', '.join(OPTS)})")
    copy = bench.copy_bandwidth_gbps()
    print(f"copy: {copy:.0f} GB/s  ({torch.cuda.get_device_name()})")
    ok = True
    extra = ["nvfp4_quantize_norht"] if SWITCH != "SR_TRIM" else list(SR_BITS)
    for op in list(ops) + (extra if args.ops is None else []):
        for case in cases:
            ok &= compare_bits(op, case)
    print(f"bits: {SWITCH} off == on on every op and case" if ok else "bits: MISMATCH")
    if not ok or args.bits_only:
        return 0 if ok else 1  # no timings of kernels that disagree
    for op in ops:
        if op not in bench.OPS:
            continue
        for case in cases:
            _, nbytes = bench.OPS[op](case, torch.Generator().manual_seed(0))
            pct = lambda us, n=nbytes: 100.0 * n / (us * 1e3) / copy  # noqa: E731
            a, b = bench.interleaved_medians(functools.partial(time_op, op, case), args.rounds)
            print(
                f"{op:26s} {case:24s} off {a:8.1f} us {pct(a):5.1f}%   "
                f"on {b:8.1f} us {pct(b):5.1f}%   {100.0 * (a - b) / a:+5.1f}% less time on"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
