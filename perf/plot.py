"""Bar chart of perf/bench.py results: percent of the copy bandwidth per op, one bar per case.

    python perf/bench.py --plot out.png [...]          # plot the run just made
    python perf/plot.py results.json [more.json] --out out.png   # plot saved --json results

Several JSON files (e.g. one per GPU) give one panel each, stacked. matplotlib is imported
only here, and only when a plot is asked for (pip install -e ".[perf]").
"""

from __future__ import annotations

import argparse
import json
import sys


def plot_results(runs: list[dict], out_path: str) -> None:
    """Write a PNG: for each run (``{"device", "copy_gbps", "results": [{"op", "case",
    "pct_copy", ...}]}``, what ``bench.py --json`` writes) a panel of grouped bars, ops along
    x, one bar per case, % of copy on y with the 100% line."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed on a GPU host
    import matplotlib.pyplot as plt

    if not runs or not any(run["results"] for run in runs):
        raise ValueError("plot_results: no results to plot")
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(max(8, 1.3 * _max_ops(runs) + 3), 4.5 * len(runs)), squeeze=False
    )
    for ax, run in zip(axes[:, 0], runs, strict=True):
        _panel(ax, run)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def _max_ops(runs) -> int:
    return max(len({r["op"] for r in run["results"]}) for run in runs)


def _panel(ax, run: dict) -> None:
    ops = list(dict.fromkeys(r["op"] for r in run["results"]))  # first-seen order
    cases = list(dict.fromkeys(r["case"] for r in run["results"]))
    pct = {(r["op"], r["case"]): r["pct_copy"] for r in run["results"]}
    width = 0.8 / len(cases)
    for i, case in enumerate(cases):
        xs = [k + (i - (len(cases) - 1) / 2) * width for k in range(len(ops))]
        heights = [pct.get((op, case), 0.0) for op in ops]
        bars = ax.bar(xs, heights, width, label=case)
        for bar, value in zip(bars, heights, strict=True):
            if value:
                ax.annotate(
                    f"{value:.0f}",
                    (bar.get_x() + bar.get_width() / 2, value),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
    ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("% of copy bandwidth")
    ax.set_ylim(0, max(125, max(pct.values()) * 1.15))  # room for the legend
    ax.set_title(f"{run.get('device', '?')}: copy {run.get('copy_gbps', 0):.0f} GB/s (read+write)")
    ax.legend(fontsize=7, ncols=min(4, len(cases)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="results written by perf/bench.py --json")
    p.add_argument("--out", required=True, help="PNG file to write")
    args = p.parse_args(argv)
    runs = []
    for path in args.json:
        with open(path) as f:
            runs.append(json.load(f))
    plot_results(runs, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
