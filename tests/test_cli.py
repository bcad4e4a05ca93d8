"""CPU: the ``cutequant`` command line: argument validation, list <-> show-kernel agreement,
precompile's summary and exit status, and the cache subcommands."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from cutequant import cache, cli, jit
from cutequant.codegen import render
from cutequant.codegen import specs as S

ALL = cli.all_specs()


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["precompile", "--arch", "sm_89"], "argument --arch: invalid choice: 'sm_89'"),
        (["precompile", "--arch", "sm_80"], "argument --arch: invalid choice: 'sm_80'"),
        (["precompile", "--jobs", "0"], "argument --jobs/-j: must be an integer >= 1, got 0"),
        (["precompile", "-j", "-3"], "argument --jobs/-j: must be an integer >= 1, got -3"),
        (["precompile", "--jobs", "two"], "must be an integer >= 1, got 'two'"),
        (["precompile", "--family", "foo"], "argument --family: invalid choice: 'foo'"),
        (["list", "--family", "foo"], "argument --family: invalid choice: 'foo'"),
        (["show-kernel", "foo"], "argument family: invalid choice: 'foo'"),
        (["show-kernel", "group_amax", "bogus=1"], "group_amax has no option 'bogus'; options:"),
        (["show-kernel", "group_amax", "rht"], "options are KEY=VALUE, got 'rht'"),
        (["show-kernel", "group_amax", "rht=maybe"], "option rht: expected true or false"),
        (["show-kernel", "group_amax", "stages=many"], "option stages: expected an integer"),
        (["show-kernel", "group_amax", "stages=9"], "stages must be in [2, 8]"),
        (["show-kernel", "fp8_tile_cast", "tile_cols=96"], "tile_cols must be 64, 128 or 256"),
        (["show-kernel", "fp8_quantize", "in_dtype=int8"], "in_dtype must be one of"),
        (["cache"], "the following arguments are required: ACTION"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert message in err, err
    assert "Traceback" not in err


def test_arch_choices_come_from_specs():
    pre = cli.build_parser()._subparsers._group_actions[0].choices["precompile"]
    arch = next(a for a in pre._actions if a.dest == "arch")
    assert tuple(arch.choices) == S.ARCHS and arch.default == S.ARCHS[0]


def test_every_option_has_help():
    parser = cli.build_parser()
    subparsers = parser._subparsers._group_actions[0].choices
    cache_sub = subparsers["cache"]._subparsers._group_actions[0].choices
    for name, sub in [*subparsers.items(), *(("cache " + k, v) for k, v in cache_sub.items())]:
        for action in sub._actions:
            if action.dest not in ("help", "cache_cmd"):
                assert action.help, f"{name}: {action.dest} has no help text"


# --------------------------------------------------------------------------- list / show-kernel


def test_families_are_every_spec_class_and_all_precompiled():
    known = {"group_tables", "group_amax", "nvfp4_quantize", "fp8_quantize", "fp8_tile_cast"}
    assert known <= set(cli.FAMILIES) and list(cli.FAMILIES) == sorted(cli.FAMILIES)
    assert {s.family for s in ALL} == set(cli.FAMILIES)  # precompile covers every family


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.describe())
def test_list_lines_name_the_spec_show_kernel_builds(spec):
    args = cli.spec_to_args(spec)
    assert cli.spec_from_args(args[0], args[1:]) == spec
    assert cli.spec_from_key(spec.key()) == spec


def test_list_prints_every_variant_once(capsys):
    rc, out, _ = run_cli(capsys, "list")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == len(ALL) == len(set(lines))
    assert lines[0] == "group_tables"
    assert "nvfp4_quantize rht=false swizzled=true" in lines


def test_list_into_a_closed_pipe_stops_quietly():
    """`cutequant list | head -1`: the reader is gone before the first line is written (closed
    at once; unbuffered, so the first print meets it): no traceback, the SIGPIPE status."""
    code = "import sys; from cutequant import cli; sys.exit(cli.main())"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code, "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_list_options_match_show_kernel(capsys):
    rc, out, _ = run_cli(capsys, "list", "--options")
    assert rc == 0
    amax = next(line for line in out.splitlines() if line.strip().startswith("group_amax:"))
    assert "stages=6" in amax and "tile_cols=128" in amax and "rht=true" in amax
    tile = next(line for line in out.splitlines() if line.strip().startswith("fp8_tile_cast:"))
    assert "tile_cols=128" in tile and "stages" not in tile


@pytest.mark.parametrize("family", list(cli.FAMILIES))
def test_show_kernel_renders_every_family(capsys, family):
    rc, out, _ = run_cli(capsys, "show-kernel", family)
    assert rc == 0
    assert out == render(cli.FAMILIES[family]())
    assert "def launch(" in out and "def compile_args(" in out


def test_show_kernel_takes_plan_fields(capsys):
    rc, out, _ = run_cli(capsys, "show-kernel", "group_amax", "rht=false", "stages=3")
    expected = S.GroupAmaxSpec(rht=False, plan=dataclasses.replace(S.TilePlan(), stages=3))
    assert rc == 0 and out == render(expected)
    assert out != render(S.GroupAmaxSpec(rht=False))


# --------------------------------------------------------------------------- precompile


def test_precompile_summary_and_second_run_cached(cache_root, capsys):
    rc, out, err = run_cli(capsys, "precompile", "--family", "group_tables", "-j", "1")
    assert rc == 0, err
    assert re.search(r"precompile sm_90a: 2 kernels, 2 compiled, 0 already cached, 0 failed", out)
    rc, out, _ = run_cli(capsys, "precompile", "--family", "group_tables", "-v")
    assert rc == 0
    assert out.splitlines()[:2] == [
        "cached: group_tables",
        "cached: group_tables splits_int64=true",
    ]
    assert "2 kernels, 0 compiled, 2 already cached, 0 failed" in out
    rc, out, _ = run_cli(capsys, "cache", "verify")
    assert rc == 0 and out.strip() == "2 entries: 2 valid, 0 valid for another install, 0 invalid"


def test_precompile_progress_bar(cache_root, capsys):
    rc, _, err = run_cli(capsys, "precompile", "--family", "group_tables", "--progress", "-j", "1")
    assert rc == 0 and "precompile: 100%" in err and "2/2" in err


def test_precompile_failure_exits_1(cache_root, capsys, monkeypatch):
    real = jit.precompile

    def flaky(spec):
        if spec.splits_int64:
            return jit.Outcome("failed", "OSError: [Errno 28] No space left on device")
        return real(spec)

    monkeypatch.setattr(jit, "precompile", flaky)
    rc, out, _ = run_cli(capsys, "precompile", "--family", "group_tables", "-j", "1")
    assert rc == 1
    assert "failed: group_tables splits_int64=true (OSError: [Errno 28]" in out
    assert "2 kernels, 1 compiled, 0 already cached, 1 failed" in out


def test_precompile_ab_variants(cache_root, capsys, monkeypatch):
    """``--ab SWITCH`` adds the A/B side of a runtime switch (``cli.ab_variants``) to the
    runtime's kernels, ``--family`` still filtering; every name is a choice, each list is
    disjoint from ``all_specs`` (the A/B side is what the runtime does not ask for by default)."""
    seen = []

    def record(spec):
        seen.append(spec)
        return jit.Outcome("compiled", "")

    monkeypatch.setattr(jit, "precompile", record)
    rc, out, err = run_cli(
        capsys, "precompile", "--family", "dequantize", "--ab", "dequantize", "-j", "1"
    )
    assert rc == 0, err
    runtime = [s for s in ALL if s.family == "dequantize"]
    assert seen == runtime + S.dequant_ab_variants()
    assert f"{len(seen)} kernels, {len(seen)} compiled" in out
    seen.clear()
    rc, out, err = run_cli(
        capsys, "precompile", "--family", "nvfp4_quantize", "--ab", "fma_encoder", "--ab",
        "sr_trim", "-j", "1",
    )  # fmt: skip
    assert rc == 0, err
    extra = cli.fma_encoder_variants() + cli.sr_trim_variants()
    assert seen == [s for s in ALL if s.family == "nvfp4_quantize"] + extra
    for name, variants in cli.ab_variants().items():
        assert variants() and not set(variants()) & set(ALL), name
    rc, _, err = run_cli(capsys, "precompile", "--ab", "nope")
    assert rc == 2 and "argument --ab: invalid choice: 'nope'" in err


def test_precompile_into_an_unusable_directory(tmp_path, cache_root, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = str(blocker / "cache")
    rc, out, err = run_cli(capsys, "precompile", "--cache-dir", bad, "--family", "group_tables")
    assert rc == 1 and out == ""
    assert f"cache directory {bad} is not usable: NotADirectoryError" in err


def test_precompile_with_the_disk_cache_disabled(cache_root, capsys, monkeypatch):
    monkeypatch.setenv("CUTEQUANT_DISABLE_DISK_CACHE", "1")
    rc, _, err = run_cli(capsys, "precompile", "--family", "group_tables")
    assert rc == 1 and "the disk cache is disabled" in err


def test_precompile_in_worker_processes(cache_root):
    """The installed script, two spawned workers: the entries it writes are the ones a later
    lookup in this process loads (no compile)."""
    env = {**os.environ, "CUTEQUANT_CACHE_DIR": str(cache_root)}
    cmd = [sys.executable, "-m", "cutequant.cli", "precompile", "--family", "group_tables"]
    done = subprocess.run([*cmd, "-j", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 kernels, 2 compiled, 0 already cached, 0 failed" in done.stdout
    before = jit.stats.compiles
    for spec in (s for s in ALL if s.family == "group_tables"):
        assert type(jit.get_kernel(spec)).__name__ == "Function"
    assert jit.stats.compiles == before


# --------------------------------------------------------------------------- cache commands


def _damage_one(root):
    obj = sorted((root / "kernels").glob("*.so"))[0]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    return obj.stem


def test_cache_info_list_verify_clear(cache_root, capsys):
    rc, out, _ = run_cli(capsys, "cache", "info")
    assert rc == 0 and f"cache dir: {cache_root}: not created yet" in out
    assert run_cli(capsys, "precompile", "--family", "group_tables")[0] == 0

    rc, out, _ = run_cli(capsys, "cache", "list")
    lines = out.splitlines()
    assert rc == 0 and lines[-1] == f"2 entries in {cache_root / 'kernels'}"
    assert sorted(line.split()[-1] for line in lines[:2]) == ["group_tables", "splits_int64=true"]
    assert all(line.startswith("ok ") and " sm_90a " in line for line in lines[:2])

    bad = _damage_one(cache_root)
    rc, out, _ = run_cli(capsys, "cache", "verify")
    assert rc == 1
    assert f"invalid: {bad}: object file checksum mismatch" in out
    assert "2 entries: 1 valid, 0 valid for another install, 1 invalid" in out
    rc, out, _ = run_cli(capsys, "cache", "info")
    assert rc == 0 and "2 entries" in out and "1 for this install" in out and "1 invalid" in out

    rc, out, _ = run_cli(capsys, "cache", "verify", "--remove-invalid")
    assert rc == 0 and "removed 2 files" in out
    assert run_cli(capsys, "cache", "verify")[0] == 0

    present = [*(cache_root / "kernels").iterdir(), *(cache_root / "src").iterdir()]
    assert len(present) >= 3  # an entry (2 files), the lock, rendered sources
    rc, out, _ = run_cli(capsys, "cache", "clear")
    assert rc == 0 and f"removed {len(present)} files" in out
    assert [*(cache_root / "kernels").iterdir(), *(cache_root / "src").iterdir()] == []


def test_cache_clear_stale_keeps_current_entries(cache_root, capsys):
    assert run_cli(capsys, "precompile", "--family", "group_tables")[0] == 0
    names = sorted(p.name for p in (cache_root / "kernels").glob("*.so"))
    # an entry of another install: same files under another name, other DSL version
    other = cache.Entry(cache_root, "cq_group_tables_" + "f" * 24)
    meta = cache.read_metadata(cache.Entry(cache_root, names[0].removesuffix(".so")))
    cache.write_entry(
        other,
        lambda path: path.write_bytes(b"object of another DSL"),
        {k: v for k, v in meta.items() if k not in ("size", "sha256", "function")} | {"dsl": "0.1"},
    )
    (cache_root / "kernels" / ".tmp-left-by-a-crash").mkdir()
    rc, out, _ = run_cli(capsys, "cache", "list")
    assert "other install" in out and "dsl 0.1" in out
    rc, out, _ = run_cli(capsys, "cache", "clear", "--stale")
    assert rc == 0 and "removed 3 files" in out
    assert sorted(p.name for p in (cache_root / "kernels").glob("*.so")) == names


def test_cache_clear_in_a_read_only_directory(cache_root, capsys, monkeypatch):
    assert run_cli(capsys, "precompile", "--family", "group_tables")[0] == 0

    def refuse(paths):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "remove_paths", refuse)
    rc, out, err = run_cli(capsys, "cache", "clear")
    assert rc == 1 and out == ""
    assert f"cutequant cache clear: cannot remove files from {cache_root}" in err
    assert "Permission denied" in err


def test_cache_commands_on_a_path_under_a_file(tmp_path, cache_root, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = str(blocker / "cache")
    for action in ("info", "list", "verify", "clear"):
        rc, out, err = run_cli(capsys, "cache", action, "--cache-dir", bad)
        assert rc == 1, action
        assert "is not a directory" in out + err, action
    rc, out, err = run_cli(capsys, "cache-info", "--cache-dir", bad)
    assert rc == 1 and "deprecated" in err and "UNUSABLE" in out


def test_arch_aware_list_show_and_precompile(capsys, tmp_path):
    """`list --arch` prints the variants that exist there, `show-kernel --arch` renders the
    hardware encoder on Blackwell, a family missing on an arch is refused by name."""
    rc, out, _ = run_cli(capsys, "list", "--arch", "sm_120a")
    assert rc == 0 and "fake_quant_rows" in out
    families = {line.split()[0] for line in out.splitlines()}
    assert "fp8_quantize" not in families and "nvfp4_quantize" not in families
    rc, out, _ = run_cli(capsys, "show-kernel", "--arch", "sm_100a", "fake_quant_rows")
    assert rc == 0 and "dev.e2m1x8_cvt(" in out
    rc, out, _ = run_cli(capsys, "show-kernel", "fake_quant_rows")
    assert rc == 0 and "dev.e2m1x8(" in out and "e2m1x8_cvt" not in out
    rc, out, _ = run_cli(capsys, "show-kernel", "--arch", "sm_100a", "nvfp4_quantize")
    assert rc == 0 and "warp_rht.rht_block(" in out and "dev.e2m1x8_cvt(" in out
    rc, out, _ = run_cli(capsys, "show-kernel", "nvfp4_quantize", "rht_mma=mma_sync")
    assert rc == 0 and "warp_rht.rht_block(" in out and "dev.e2m1x8(" in out
    rc, out, err = run_cli(
        capsys, "show-kernel", "--arch", "sm_100a", "nvfp4_quantize", "rht_mma=wgmma"
    )
    assert rc == 2 and "nvfp4_quantize with rht_mma=wgmma is not available on sm_100a" in err
    rc, out, err = run_cli(capsys, "show-kernel", "--arch", "sm_120a", "nvfp4_quantize")
    assert rc == 2 and "nvfp4_quantize is not available on sm_120a" in err
    rc, out, err = run_cli(
        capsys, "precompile", "--arch", "sm_120a", "--family", "fp8_quantize",
        "--cache-dir", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert rc == 1 and "fp8_quantize does not exist on sm_120a" in err
