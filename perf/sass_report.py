"""Compile every kernel variant, keep its cubin, and summarize the SASS that matters:
tensor-core MMAs (HGMMA/HMMA), global/shared access widths, local-memory traffic (spills),
registers. Needs ``cuobjdump`` (on the GPU hosts; on a CPU box: ``pip download
nvidia-cuda-cuobjdump`` into /tmp, unzip, pass ``--cuobjdump``).

``--loops``: the static instruction count of each innermost loop that holds the e2m1 encoder
(HFMA2 / FFMA), per value of its 32-value iteration, with the opcode classes and the issue
pipes (ALU / FMA / IMAD; the NVFP4 consumer loops; static: cold branches inside the loop count
too, e.g. the outlier-block clamp of ``device.e2m1_blocks``).

``--body``: the static instruction count of the kernel function (subroutines such as the
division slow paths left out), per value of a thread's share of its tile (the module's
``TILE_ROWS * TILE_COLS / THREADS``), with the opcode classes: for the one-CTA-per-tile
kernels (dequantize, fp8_tile_cast) every thread runs its function once, mostly straight-line,
so this is close to the issued instructions per value (both copies of the tile lookup and the
device-split search count too).

    python perf/sass_report.py [--out DIR] [--family group_amax] [--match stochastic=True]
                               [--col-tokens 128] [--loops] [--body] [--cuobjdump PATH]
                               [--set col_ring=0]

``--set FIELD=VALUE`` (repeatable): compile the A/B variants that are not in ``all_specs``,
e.g. ``--family dequantize --match columnwise=True --set col_ring=0``: the field is
replaced in every selected spec that has it (specs it does not validate for are skipped).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PATTERNS = {
    "HGMMA": r"\bHGMMA\.",
    "HMMA": r"\bHMMA\.",
    # cache hints sit between .E and the width (LDG.E.NA.LTC256B.64.CONSTANT, STG.E.EF.128)
    "LDG.128": r"\bLDG\.E(?:\.[A-Z0-9]+)*?\.128\b",
    "LDG<128": r"\bLDG\.E(?![.A-Z0-9]*?\.128\b)",
    "LDG.NA": r"\bLDG\.E\.NA\b",
    "STG.128": r"\bSTG\.E(?:\.[A-Z0-9]+)*?\.128\b",
    "STG<128": r"\bSTG\.E(?![.A-Z0-9]*?\.128\b)",
    "STG.EF": r"\bSTG\.E\.EF\b",
    "LDS.128": r"\bLDS\.128",
    "LDS<128": r"\bLDS(?!\.128)\b",
    "STSM": r"\bSTSM\b",
    "UTMALDG": r"\bUTMALDG",
    "UTMASTG": r"\bUTMASTG",
    "LDL/STL": r"\b(LDL|STL)\b",
    "ATOMG/RED": r"\b(ATOMG|RED)\b",
}


CLASSES = (
    ("fp", r"(FFMA|FMNMX|FMUL|FADD|HFMA2|HMNMX2|VHMNMX|HADD2|HMUL2|F2FP)$"),
    ("int", r"(LOP3|PRMT|SHF|LEA|IADD3|IMAD|SEL|VIADD|VIMNMX|IABS|POPC|FLO|SGXT|BMSK)$"),
    ("pred", r"(ISETP|FSETP|PLOP3|P2R|R2P)$"),
    ("mem", r"(LDS|STS|STSM|LDSM|LDG|STG|ATOMG|RED|SYNCS|LDC|ULDC|UTMALDG|UTMASTG)$"),
    ("move", r"(MOV|UMOV|S2R|S2UR|CS2R|R2UR|SHFL)$"),
)


def _parse(sass: str):
    """(address, opcode) of every instruction."""
    out = []
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass):
        text = re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(2).strip())
        out.append((int(m.group(1), 16), text.split()[0]))
    return out


def _branch_targets(sass: str) -> dict:
    return {
        int(m.group(1), 16): int(m.group(2), 16)
        for m in re.finditer(
            r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?BRA[^;]*?0x([0-9a-f]+)", sass
        )
    }


def encoder_loops(sass: str):
    """Innermost backward-branch loops with >= 16 encoder ops: [(count, opcode Counter)]."""
    ins = _parse(sass)
    index = {a: i for i, (a, _) in enumerate(ins)}
    spans = sorted(
        ((index[t], index[a]) for a, t in _branch_targets(sass).items() if t <= a and t in index),
        key=lambda se: se[1] - se[0],
    )
    chosen = []
    for s, e in spans:
        ops = [op.split(".")[0] for _, op in ins[s : e + 1]]
        if sum(op in ("HFMA2", "FFMA") for op in ops) < 16:
            continue
        if any(cs >= s and ce <= e for cs, ce, _ in chosen):
            continue
        chosen.append((s, e, collections.Counter(ops)))
    return [(e - s + 1, ops) for s, e, ops in chosen]


def kernel_body(sass: str) -> collections.Counter:
    """Opcode counts of the kernel function: everything before the first CALL target (the
    compiler's subroutines follow the function), trailing BRA-to-self / NOP padding left out."""
    ins = _parse(sass)
    calls = [int(m.group(1), 16) for m in re.finditer(r"CALL\.\w+(?:\.\w+)*\s+0x([0-9a-f]+)", sass)]
    end = min(calls) if calls else None
    ops = [op.split(".")[0] for a, op in ins if end is None or a < end]
    while ops and ops[-1] in ("NOP", "BRA"):
        ops.pop()
    return collections.Counter(ops)


def tile_part(sass: str) -> int:
    """Instructions of a one-CTA-per-tile dequantize after its tile lookup: from the first EXIT
    after the lookups' last SHFL (the device-split search) to the function's end (0: none)."""
    ins = [op for _, op in _parse(sass)]
    n = sum(kernel_body(sass).values())
    shfl = [i for i, op in enumerate(ins[:n]) if op.startswith("SHFL.IDX")]
    exits = [i for i in range(shfl[-1], n) if ins[i] == "EXIT"] if shfl else []
    return n - exits[0] - 1 if exits else 0


def _values_per_thread(spec) -> int:
    from cutequant import jit

    mod = jit.load_module(spec)
    threads = getattr(mod, "THREADS", 0)
    rows, cols = getattr(mod, "TILE_ROWS", 0), getattr(mod, "TILE_COLS", 0)
    return rows * cols // threads if threads else 0


def _classes(ops: collections.Counter) -> str:
    out = collections.Counter()
    for op, n in ops.items():
        name = next((c for c, pat in CLASSES if re.match(pat, op)), "other")
        out[name] += n
    return " ".join(f"{k}={v}" for k, v in out.most_common())


# Issue pipes on Hopper (perf/NOTES.md, "Issue 17, seventh session"): the ALU pipe takes 2
# cycles per warp instruction, IMAD* only the fmaheavy half of the FMA pipes.
PIPES = (
    (
        "alu",
        r"(LOP3|PRMT|SHF|LEA|ISETP|SEL|VIMNMX|IMNMX|FMNMX|HMNMX2|VHMNMX|IADD3|F2FP|FSETP"
        r"|PLOP3|FSEL|P2R|R2P|MOV|VIADD|VIADDMNMX|POPC|FLO)$",
    ),
    ("fma", r"(FFMA|FMUL|FADD|HFMA2|HADD2|HMUL2)$"),
    ("imad", r"IMAD$"),
)


def _pipes(ops: collections.Counter) -> str:
    out = collections.Counter()
    for op, n in ops.items():
        out[next((c for c, pat in PIPES if re.match(pat, op)), "rest")] += n
    return " ".join(f"{k}={out[k]}" for k in ("alu", "fma", "imad", "rest"))


def _with_fields(spec, assignments):
    """``spec`` with FIELD=VALUE assignments applied, None where a field is missing or the
    result does not validate."""
    import ast

    changes = {}
    for item in assignments:
        name, _, value = item.partition("=")
        if not hasattr(spec, name):
            return None
        changes[name] = ast.literal_eval(value)
    try:
        return dataclasses.replace(spec, **changes)
    except ValueError:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--family", default=None)
    p.add_argument("--match", default=None, help="only specs whose description has this text")
    p.add_argument(
        "--col-tokens",
        type=int,
        default=None,
        help="columnwise dequantize transposes: compile tiles of this many tokens (64/128/256)",
    )
    p.add_argument(
        "--col-ring",
        type=int,
        default=0,
        help="with --col-tokens 256: the sub-tile ring's CTAs per SM (DequantizeSpec.col_ring)",
    )
    p.add_argument(
        "--col-scale-words",
        action="store_true",
        help="with --col-tokens 256: NVFP4 compact-scale specs with DequantizeSpec.col_scale_words",
    )
    p.add_argument("--loops", action="store_true", help="encoder loop counts per value")
    p.add_argument("--body", action="store_true", help="kernel function counts per value")
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    p.add_argument("--set", action="append", default=[], help="FIELD=VALUE (Python literal)")
    args = p.parse_args(argv)
    if not args.cuobjdump:
        print("cuobjdump not found: run this on a GPU host or pass --cuobjdump")
        return 1
    out = Path(args.out or tempfile.mkdtemp(prefix="cq-sass-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["CUTE_DSL_DUMP_DIR"] = str(out)  # read when the DSL is first imported
    from cutequant import cli, jit

    rows, index = [], []
    for spec in cli.all_specs("sm_90a"):
        if args.family and spec.family != args.family:
            continue
        transposes = getattr(spec, "columnwise", False) and not getattr(spec, "transposed_out", 1)
        if args.col_tokens and transposes:
            spec = dataclasses.replace(spec, col_tokens=args.col_tokens, col_ring=args.col_ring)
            if args.col_scale_words and spec.fmt == "nvfp4" and not spec.swizzled:
                spec = dataclasses.replace(spec, col_scale_words=True)
        if args.match and args.match not in spec.describe().replace(" ", ""):
            continue
        if args.set:
            spec = _with_fields(spec, args.set)
            if spec is None:
                continue
        d = out / jit.entry_name(spec)
        d.mkdir(exist_ok=True)
        compiled = jit.compile_spec(spec, "--keep-cubin")
        cubin_bytes = compiled.artifacts.CUBIN  # the cubin itself (bytes)
        (d / "kernel.cubin").write_bytes(cubin_bytes)
        for cubin in d.glob("*.cubin"):
            sass = subprocess.run(
                [args.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True
            ).stdout
            res = subprocess.run(
                [args.cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True
            ).stdout
            counts = collections.Counter()
            for name, pat in PATTERNS.items():
                counts[name] = len(re.findall(pat, sass))
            regs = re.findall(r"REG:(\d+)", res)
            loops = encoder_loops(sass) if args.loops else []
            body = None
            if args.body:
                body = (kernel_body(sass), _values_per_thread(spec), tile_part(sass))
            rows.append((spec.describe(), regs, counts, loops, body))
            (d / "kernel.sass").write_text(sass)
            (d / "res.txt").write_text(res)
        index.append(f"{spec.describe()}\t{d.name}")
    (out / "index.tsv").write_text("\n".join(index) + "\n")  # for diffing two builds by spec
    for desc, regs, counts, loops, body in rows:
        print(desc)
        print("   regs", ",".join(regs), " ", "  ".join(f"{k}={v}" for k, v in counts.items() if v))
        for n, ops in loops:
            print(f"   loop {n} instructions, {n / 32:.1f} per value: {_classes(ops)}")
            print(f"        pipes {_pipes(ops)}")
        if body:
            ops, per, tile = body
            n = sum(ops.values())
            rate = f", {n / per:.1f} per value ({per} per thread)" if per else ""
            print(f"   body {n} instructions{rate}: {_classes(ops)}")
            if tile and per:
                print(f"   tile part (after the lookup) {tile}, {tile / per:.1f} per value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
