"""Compile every kernel variant, keep its cubin, and summarize the SASS that matters:
tensor-core MMAs (HGMMA/HMMA), global/shared access widths, local-memory traffic (spills),
registers. Needs ``cuobjdump`` (on the GPU hosts; not on the CPU CI machines).

    python perf/sass_report.py [--out DIR] [--family group_amax]
"""

from __future__ import annotations

import argparse
import collections
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
    "LDG.128": r"\bLDG\.E\.128",
    "LDG<128": r"\bLDG\.E(?!\.128)",
    "STG.128": r"\bSTG\.E\.128",
    "STG<128": r"\bSTG\.E(?!\.128)",
    "LDS.128": r"\bLDS\.128",
    "LDS<128": r"\bLDS(?!\.128)\b",
    "UTMALDG": r"\bUTMALDG",
    "UTMASTG": r"\bUTMASTG",
    "LDL/STL": r"\b(LDL|STL)\b",
    "ATOMG/RED": r"\b(ATOMG|RED)\b",
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--family", default=None)
    args = p.parse_args(argv)
    if shutil.which("cuobjdump") is None:
        print("cuobjdump not found: run this on a GPU host")
        return 1
    out = Path(args.out or tempfile.mkdtemp(prefix="cq-sass-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["CUTE_DSL_DUMP_DIR"] = str(out)  # read when the DSL is first imported
    from cutequant import cli, jit

    rows, index = [], []
    for spec in cli.all_specs("sm_90a"):
        if args.family and spec.family != args.family:
            continue
        d = out / jit.entry_name(spec)
        d.mkdir(exist_ok=True)
        compiled = jit.compile_spec(spec, "--keep-cubin")
        cubin_bytes = compiled.artifacts.CUBIN  # the cubin itself (bytes)
        (d / "kernel.cubin").write_bytes(cubin_bytes)
        for cubin in d.glob("*.cubin"):
            sass = subprocess.run(
                ["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True
            ).stdout
            res = subprocess.run(
                ["cuobjdump", "-res-usage", str(cubin)], capture_output=True, text=True
            ).stdout
            counts = collections.Counter()
            for name, pat in PATTERNS.items():
                counts[name] = len(re.findall(pat, sass))
            regs = re.findall(r"REG:(\d+)", res)
            rows.append((spec.describe(), regs, counts))
            (d / "kernel.sass").write_text(sass)
            (d / "res.txt").write_text(res)
        index.append(f"{spec.describe()}\t{d.name}")
    (out / "index.tsv").write_text("\n".join(index) + "\n")  # for diffing two builds by spec
    for desc, regs, counts in rows:
        print(desc)
        print("   regs", ",".join(regs), " ", "  ".join(f"{k}={v}" for k, v in counts.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
