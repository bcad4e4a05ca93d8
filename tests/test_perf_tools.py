"""CPU: perf/ tooling that needs no GPU: the bar chart of bench results, bench.py's flag, and
that every probe kept under perf/probes/ is accounted for in perf/NOTES.md."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parent.parent / "perf"
sys.path.insert(0, str(PERF))
import plot  # noqa: E402

CASES = ["dense 8192x5120", "65536x2048 / 64"]


def _run(device, values):
    results = [
        {"op": op, "case": case, "us": 1.0, "gbps": 1.0, "pct_copy": v, "host_us": 5.0, "bytes": 1}
        for op, row in values.items()
        for case, v in zip(CASES, row, strict=True)
    ]
    return {"device": device, "copy_gbps": 4250.0, "results": results}


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_one_and_two_runs(tmp_path):
    run = _run("H200", {"group_amax": [93.2, 100.4], "fp8_cast": [86.0, 91.0], "nvfp4": [50, 52]})
    one = tmp_path / "one.png"
    plot.plot_results([run], str(one))
    w1, h1 = _png_size(one)
    saved = [tmp_path / "h200.json", tmp_path / "h100.json"]
    saved[0].write_text(json.dumps(run))
    saved[1].write_text(json.dumps({**run, "device": "H100"}))
    two = tmp_path / "two.png"
    assert plot.main([str(p) for p in saved] + ["--out", str(two)]) == 0
    w2, h2 = _png_size(two)
    assert w1 == w2 and h2 > 1.8 * h1  # one panel per run, stacked


def test_plot_without_results_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no results to plot"):
        plot.plot_results([{"device": "x", "copy_gbps": 1.0, "results": []}], str(tmp_path / "a"))


def test_bench_has_plot_flag_and_imports_no_matplotlib():
    code = (
        f"import sys; sys.path.insert(0, {str(PERF)!r}); import bench; "
        "print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    done = subprocess.run(
        [sys.executable, str(PERF / "bench.py"), "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--plot PNG" in done.stdout


def test_every_probe_has_a_line_in_notes():
    notes = (PERF / "NOTES.md").read_text()
    summary = notes.split("\n## ", 3)[:3]  # the opening summary sections
    probes = sorted(p.name for p in (PERF / "probes").glob("*.py"))
    assert probes
    for name in probes:
        assert any(f"probes/{name}" in part for part in summary), f"{name}: no line in NOTES.md"


def _write_csv(path, rows):
    import csv

    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)


def test_ncu_report_details(tmp_path, capsys):
    import ncu_report

    head = ["ID", "Process ID", "Kernel Name", "Grid Size", "Block Size", "Section Name",
            "Metric Name", "Metric Unit", "Metric Value"]  # fmt: skip
    stall = "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio"
    rows = [["==PROF== Connected to process 1"], ["profiled op / case"], head]
    rows += [["0", "1", "k_a", "(528, 1, 1)", "(256, 1, 1)", "s", "gpu__time_duration.sum", "us",
              "50.56"], ["0", "1", "k_a", "(528, 1, 1)", "(256, 1, 1)", "s", stall, "inst", "0.83"],
             ["1", "1", "k_b", "(132, 1, 1)", "(640, 1, 1)", "s", "gpu__time_duration.sum", "us",
              "43.84"]]  # fmt: skip
    path = tmp_path / "details.csv"
    _write_csv(path, rows)
    kernels = ncu_report.read_details(str(path))
    assert [(k.ident, k.name, k.grid) for k in kernels] == [
        ("0", "k_a", "(528, 1, 1)"),
        ("1", "k_b", "(132, 1, 1)"),
    ]
    assert kernels[0].metrics == [
        ("gpu__time_duration.sum", "50.56", "us"),
        (stall, "0.83", "inst"),
    ]
    assert ncu_report.short_name(stall) == "stalled drain"
    assert ncu_report.main(["details", str(path), "--grep", "stalled"]) == 0
    out = capsys.readouterr().out
    assert "stalled drain" in out and "0.83" in out and "gpu__time_duration" not in out
    _write_csv(path, [["no header here"]])
    with pytest.raises(ValueError, match="no ncu details header"):
        ncu_report.read_details(str(path))


def test_ncu_report_source(tmp_path, capsys):
    import ncu_report

    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
            "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]  # fmt: skip
    lines = [  # samples: 10 + 60 + 30 = 100; long_sb 80, wait 20
        ["0x0", "  LDG.E.128 R4, [R2.64]", "10", "4096", "0", "10", "0"],
        ["0x10", "  IMAD.U32 R0, R4, 0x10000, RZ", "60", "4096", "60", "0", "55"],
        ["0x20", "  FCHK P1, R4, R3", "30", "4096", "20", "10", "20"],
    ]
    rows = [["Kernel Name", "k_a"], head, *lines, ["Kernel Name", "k_b"], head, lines[0]]
    path = tmp_path / "source.csv"
    _write_csv(path, rows)
    kernels = ncu_report.read_source(str(path))
    assert [k.name for k in kernels] == ["k_a", "k_b"] and len(kernels[0].lines) == 3
    total, shares = ncu_report.stall_shares(kernels[0])
    assert total == 100 and shares == {"long_sb": 80.0, "wait": 20.0}
    top = ncu_report.top_lines(kernels[0], 2)  # the two busiest, in program order
    shares = [(i, share, running) for i, share, running, _, _ in top]
    assert shares == [(1, 60.0, 70.0), (2, 30.0, 100.0)]
    assert top[0][4] == "IMAD.U32 R0, R4, 0x10000, RZ"
    assert ncu_report.main(["source", str(path), "--top", "1", "--kernel", "0"]) == 0
    out = capsys.readouterr().out
    assert "100 stall samples" in out and "long_sb 80.0%" in out and "k_b" not in out
    _write_csv(path, [["Address", "Source"]])
    with pytest.raises(ValueError, match="no kernel"):
        ncu_report.read_source(str(path))
    _write_csv(path, [["Kernel Name", "k_c"], ["Address", "Source"], ["0x0", "  EXIT"]])
    with pytest.raises(ValueError, match="no column 'Warp Stall Sampling"):
        ncu_report.stall_shares(ncu_report.read_source(str(path))[0])
