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
