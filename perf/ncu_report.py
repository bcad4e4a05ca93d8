"""Read Nsight Compute CSV exports: per-kernel metric tables and per-SASS-line stall samples.

    ncu ... -o R python3 perf/ncu_profile.py OP            # on the device (see ncu_profile.py)
    ncu --import R.ncu-rep --csv --page details > details.csv
    ncu --import R.ncu-rep --csv --page source --print-source sass > source.csv

    python perf/ncu_report.py details details.csv [--grep stalled,issue_active]
    python perf/ncu_report.py source source.csv [--top 25] [--kernel 0]

``details``: one block per profiled kernel (id, name, grid, block), its metrics in the order ncu
wrote them (``--grep``: only metric names containing one of the comma-separated words; the
``smsp__average_warps_issue_stalled_X_per_issue_active.ratio`` names are shortened to
``stalled X``). ``source`` (the export of a run with ``--section SourceCounters``): per kernel
the number of stall samples, their shares by stall reason, and the ``--top`` SASS lines by
samples, each with its share, the running share up to it in program order (to read where a
kernel's phases begin and end) and its executed count. Runs on the CPU: the exports are
copied back from the device.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, field

_STALL_PREFIX = "smsp__average_warps_issue_stalled_"
_STALL_SUFFIX = "_per_issue_active.ratio"


@dataclass
class KernelMetrics:
    """One profiled kernel of a ``--page details`` export."""

    ident: str
    name: str
    grid: str
    block: str
    metrics: list[tuple[str, str, str]] = field(default_factory=list)  # (name, value, unit)


@dataclass
class KernelSource:
    """One kernel of a ``--page source`` export: its SASS lines and the columns ncu gave."""

    name: str
    header: list[str]
    lines: list[list[str]] = field(default_factory=list)

    def column(self, title: str) -> int:
        if title not in self.header:
            raise ValueError(
                f"kernel {self.name[:40]}: no column {title!r} in this export (profile with "
                "--section SourceCounters, export with --page source --print-source sass)"
            )
        return self.header.index(title)


def _rows(path: str) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def read_details(path: str) -> list[KernelMetrics]:
    """The kernels of a ``--page details --csv`` export (ncu's own log lines before the header
    are skipped)."""
    rows = _rows(path)
    start = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if start is None:
        raise ValueError(f'{path}: no ncu details header (a row starting with "ID")')
    head = {name: i for i, name in enumerate(rows[start])}
    kernels: dict[str, KernelMetrics] = {}
    for r in rows[start + 1 :]:
        if len(r) <= head["Metric Value"]:
            continue
        ident = r[head["ID"]]
        k = kernels.get(ident)
        if k is None:
            k = kernels[ident] = KernelMetrics(
                ident, r[head["Kernel Name"]], r[head["Grid Size"]], r[head["Block Size"]]
            )
        k.metrics.append((r[head["Metric Name"]], r[head["Metric Value"]], r[head["Metric Unit"]]))
    return list(kernels.values())


def short_name(metric: str) -> str:
    """``smsp__average_warps_issue_stalled_X_per_issue_active.ratio`` -> ``stalled X``."""
    if metric.startswith(_STALL_PREFIX) and metric.endswith(_STALL_SUFFIX):
        return "stalled " + metric[len(_STALL_PREFIX) : -len(_STALL_SUFFIX)]
    return metric


def read_source(path: str) -> list[KernelSource]:
    """The kernels of a ``--page source --csv --print-source sass`` export: each starts with a
    ``"Kernel Name", name`` row, then the column header (``"Address", "Source", ...``), then one
    row per SASS instruction."""
    kernels: list[KernelSource] = []
    current = None
    for r in _rows(path):
        if r[:1] == ["Kernel Name"]:
            current = KernelSource(r[1] if len(r) > 1 else "", [])
            kernels.append(current)
        elif current is not None and r[:1] == ["Address"]:
            current.header = r
        elif current is not None and current.header and r:
            current.lines.append(r)
    if not kernels:
        raise ValueError(f'{path}: no kernel in this export (a "Kernel Name" row)')
    return kernels


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(text) if text.isdigit() else 0


def stall_shares(kernel: KernelSource) -> tuple[int, dict[str, float]]:
    """(all stall samples, share of each stall reason in %), from the ``stall_*`` columns
    (issued and not issued together)."""
    samples = kernel.column("Warp Stall Sampling (All Samples)")
    total = sum(_int(line[samples]) for line in kernel.lines)
    shares = {}
    for i, title in enumerate(kernel.header):
        if title.startswith("stall_") and "(Not Issued)" not in title:
            n = sum(_int(line[i]) for line in kernel.lines if i < len(line))
            if n:
                shares[title[len("stall_") :]] = 100.0 * n / total if total else 0.0
    return total, dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def top_lines(kernel: KernelSource, top: int) -> list[tuple[int, float, float, str, str]]:
    """The ``top`` lines by stall samples, in program order: (line index, share %, running share
    % up to and including it, executed count, SASS text)."""
    samples = kernel.column("Warp Stall Sampling (All Samples)")
    executed = kernel.column("Instructions Executed")
    source = kernel.column("Source")
    counts = [_int(line[samples]) for line in kernel.lines]
    total = sum(counts) or 1
    running, acc = [], 0
    for n in counts:
        acc += n
        running.append(100.0 * acc / total)
    chosen = sorted(sorted(range(len(counts)), key=lambda i: -counts[i])[:top])
    return [
        (
            i,
            100.0 * counts[i] / total,
            running[i],
            kernel.lines[i][executed],
            kernel.lines[i][source].strip(),
        )
        for i in chosen
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="page", required=True)
    d = sub.add_parser("details", help="metric tables of a --page details export")
    d.add_argument("csv")
    d.add_argument("--grep", default="", help="comma-separated words a metric name must contain")
    s = sub.add_parser("source", help="stall samples per SASS line of a --page source export")
    s.add_argument("csv")
    s.add_argument("--top", type=int, default=25)
    s.add_argument("--kernel", type=int, default=None, help="only this kernel (0-based)")
    args = p.parse_args(argv)
    if args.page == "details":
        words = [w for w in args.grep.split(",") if w]
        for k in read_details(args.csv):
            print(f"[{k.ident}] {k.name[:60]}  grid {k.grid}  block {k.block}")
            for name, value, unit in k.metrics:
                if not words or any(w in name for w in words):
                    print(f"    {short_name(name):72s} {value} {unit}")
        return 0
    kernels = read_source(args.csv)
    for i, k in enumerate(kernels):
        if args.kernel is not None and i != args.kernel:
            continue
        total, shares = stall_shares(k)
        print(f"[{i}] {k.name[:60]}: {total} stall samples, {len(k.lines)} SASS lines")
        print("    " + ", ".join(f"{r} {v:.1f}%" for r, v in shares.items() if v >= 0.5))
        print("    line   share  running  executed  SASS")
        for line, share, running, executed, sass in top_lines(k, args.top):
            print(f"    {line:5d} {share:6.1f}% {running:7.1f}% {executed:>9s}  {sass[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
