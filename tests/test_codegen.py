"""CPU: specs, rendering and cache keys."""

import dataclasses
import importlib
import itertools
import shutil
import subprocess
from importlib import resources

import pytest

from cutequant import cli, jit
from cutequant.codegen import module_name, render
from cutequant.codegen import specs as S

ALL = cli.all_specs()


def test_variant_inventory():
    families = {s.family for s in ALL}
    assert families == {
        "group_tables",
        "group_amax",
        "nvfp4_quantize",
        "fp8_quantize",
        "fp8_tile_cast",
        "dequantize",
        "nvfp4_quantize_2d",
        "fake_quant_rows",
        "fake_quant_cols",
    }
    assert len({s.key() for s in ALL}) == len(ALL), "two variants share a cache key"
    # (40 (x2: stochastic rounding) + 3 in round-robin chunks (nvfp4.device_chunk on an H100))
    # x2: with and without alu_trim
    assert sum(s.family == "nvfp4_quantize" for s in ALL) == 86
    assert sum(s.family == "fp8_quantize" for s in ALL) == 36
    # 16-bit inputs x fp8 dtypes x current / delayed scaling
    assert sum(s.family == "fp8_tile_cast" for s in ALL) == 8
    # NVFP4 (row x 2 scale layouts + col x 2 layouts x undo RHT) + FP8 (2 formats x 2
    # directions), each x 3 output dtypes; + the columnwise fake-quant's (2 output dtypes)
    assert sum(s.family == "dequantize" for s in ALL) == 32
    # 3 input dtypes x (3 output sets x 2 scale layouts + 2 fake-quant dtypes); the amax is a
    # run-time switch of the same kernel (one launch)
    assert sum(s.family == "nvfp4_quantize_2d" for s in ALL) == 24
    assert sum(s.family == "fake_quant_rows" for s in ALL) == 4
    # 2 output dtypes x RN / stochastic rounding (the RHT is a run-time switch)
    assert sum(s.family == "fake_quant_cols" for s in ALL) == 4


PAIRS = cli.stsm_restage_variants()  # the A/B side of nvfp4.STSM_RESTAGE


@pytest.mark.parametrize(
    "spec",
    ALL
    + S.dequant_ab_variants()
    + cli.fma_encoder_variants()
    + cli.sr_trim_variants()
    + cli.fake_quant_sr_trim_variants()
    + cli.all_specs("sm_100a")
    + PAIRS,
    ids=lambda s: f"{s.arch}-{s.describe()}",
)
def test_rendered_module_is_plain_python(spec):
    src = render(spec)
    compile(src, module_name(spec), "exec")
    assert "{%" not in src and "{{" not in src
    assert src == render(spec), "rendering is not deterministic"
    assert spec.describe() in src, "the module does not say which spec it is"


def test_rendered_modules_are_lint_clean(tmp_path):
    if shutil.which("ruff") is None:
        pytest.skip("ruff not installed")
    specs = [s for arch in S.ARCHS for s in cli.all_specs(arch)]  # Blackwell renders too
    specs += S.dequant_ab_variants()  # the A/B variants a module flag selects
    specs += cli.fma_encoder_variants() + cli.stsm_restage_variants()
    specs += cli.sr_trim_variants() + cli.sr_trim_variants("sm_100a")
    specs += cli.fake_quant_sr_trim_variants() + cli.fake_quant_sr_trim_variants("sm_100a")
    for spec in specs:
        (tmp_path / f"{module_name(spec)}.py").write_text(render(spec))
    res = subprocess.run(
        ["ruff", "check", "--select", "F,E9,B", "--no-cache", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _perturbations(spec):
    """Every single-field change of a spec (booleans flipped, enums cycled, plans changed)."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name == "arch":
            continue
        if isinstance(value, bool):
            candidates = [not value]
        elif f.name == "in_dtype":
            candidates = [d for d in S.IN_DTYPES if d != value]
        elif f.name == "fp8_dtype":
            candidates = [d for d in S.FP8_DTYPES if d != value]
        elif f.name == "plan":
            candidates = [dataclasses.replace(value, stages=value.stages + 1)]
        elif f.name == "rht_mma":  # "wgmma" is sm_90a's "auto": the same spec
            candidates = [m for m in ("auto", "mma_sync") if m != value]
        elif f.name == "device_splits":
            candidates = [d for d in S.GroupAmaxSpec.DEVICE_SPLITS if d != value]
        else:
            raise AssertionError(f"no perturbation rule for field {f.name}")
        for c in candidates:
            try:
                yield f.name, dataclasses.replace(spec, **{f.name: c})
            except ValueError:
                pass  # an invalid combination (e.g. RHT without columnwise)


@pytest.mark.parametrize(
    "spec",
    [S.GroupAmaxSpec(), S.GroupTablesSpec(), S.Nvfp4QuantizeSpec(), S.Fp8QuantizeSpec()],
    ids=lambda s: s.family,
)
def test_every_field_changes_the_keys(spec):
    seen = 0
    for name, other in _perturbations(spec):
        seen += 1
        assert other.key() != spec.key(), name
        assert jit.entry_key(other) != jit.entry_key(spec), name
        assert module_name(other) != module_name(spec), name
    assert seen >= 1


def test_module_name_hashes_included_parts(monkeypatch):
    """nvfp4_quantize.py.j2 includes its consumers (nvfp4_quantize_rows.j2 / _cols.j2),
    dequantize.py.j2 its register-transposed FP8 tile (dequantize_cols_regs.j2): an edit to a
    part renames the modules of its family only; families without parts hash their own
    template alone."""
    R = importlib.import_module("cutequant.codegen.render")
    assert R.template_parts("nvfp4_quantize.py.j2") == (
        "nvfp4_quantize.py.j2",
        "nvfp4_quantize_cols.j2",
        "nvfp4_quantize_rows.j2",
    )
    assert R.template_parts("dequantize.py.j2") == ("dequantize.py.j2", "dequantize_cols_regs.j2")
    assert R.template_parts("fp8_tile_cast.py.j2") == ("fp8_tile_cast.py.j2",)
    nv, dq = S.Nvfp4QuantizeSpec(), S.DequantizeSpec()
    before = module_name(nv), module_name(dq)
    text = R.template_text
    for part in ("nvfp4_quantize_rows.j2", "nvfp4_quantize_cols.j2", "dequantize_cols_regs.j2"):
        edited = lambda name, part=part: text(name) + ("# edit\n" if name == part else "")  # noqa: E731
        monkeypatch.setattr(R, "template_text", edited)
        assert (module_name(nv) != before[0]) == part.startswith("nvfp4"), part
        assert (module_name(dq) != before[1]) == part.startswith("dequantize"), part


def test_template_parts_equal_jinja2s():
    """``render.template_parts`` scans the include / import statements instead of parsing with
    jinja2 (so that a warm process does not import it): for every template it finds exactly the
    files jinja2's own ``meta.find_referenced_templates`` does, transitively, so the module
    names (the disk cache's keys) are those a jinja2 parse gives."""
    from jinja2 import meta

    R = importlib.import_module("cutequant.codegen.render")
    root = resources.files("cutequant.kernels").joinpath("templates")
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".j2"))
    assert len(names) >= 10
    for name in names:
        seen, todo = {name}, [name]
        while todo:
            for ref in meta.find_referenced_templates(
                R._environment().parse(R.template_text(todo.pop()))
            ):
                assert ref is not None, name
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        assert R.template_parts(name) == tuple(sorted(seen)), name


def test_fake_quant_kernels_render_the_issue20_forms():
    """The fake-quant kernels have one form each (the A/B switches of issue 20 are retired,
    perf/NOTES.md "retired A/B switches"): the stochastic ones render the staged random words,
    the fma.rz floor and the 4-CTA register bound (columnwise), the fma.rz floor, signs from
    x's words, the packed amax trees and PRMT random bytes (rowwise); the RN ones none."""
    for out_dtype in ("bf16", "f16"):
        cols, rows = (
            [render(cls(stochastic=st, out_dtype=out_dtype)) for st in (False, True)]
            for cls in (S.FakeQuantColsSpec, S.FakeQuantRowsSpec)
        )
        for mark in ("stage_random_words", "e2m1_sr_value_rz", "min_blocks_per_mp=4,"):
            assert mark not in cols[0] and mark in cols[1], mark
        assert "quad_transpose" not in cols[1] and "sign_select" not in cols[1]
        for mark in ("e2m1_sr_mag_rz", "sign_select", "rows_block_amax2", "opaque_u32"):
            assert mark not in rows[0] and mark in rows[1], mark
    for cls in (S.FakeQuantColsSpec, S.FakeQuantRowsSpec, S.Nvfp4Quantize2dSpec):
        assert not {"legacy", "sr_stage", "sr_rz", "sign_words"} & {
            f.name for f in dataclasses.fields(cls)
        }


def test_runtime_values_are_not_in_the_key():
    """Split sizes, offsets, M, N and the SM count are runtime arguments, never spec fields."""
    banned = {"m", "n", "m_rows", "n_cols", "splits", "num_groups", "offsets", "sm_count"}
    for spec in ALL:
        assert not banned & {f.name for f in dataclasses.fields(spec)}


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError, match="rowwise"):
        S.Nvfp4QuantizeSpec(rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="arch"):
        S.GroupAmaxSpec(arch="sm_80")
    with pytest.raises(ValueError, match="bf16"):
        S.GroupAmaxSpec(rht=True, in_dtype="f32")
    with pytest.raises(ValueError, match="fp8_dtype"):
        S.Fp8QuantizeSpec(fp8_dtype="e3m4")


def test_cli_show_kernel(capsys):
    assert cli.main(["show-kernel", "nvfp4_quantize", "rht=false", "swizzled=true"]) == 0
    out = capsys.readouterr().out
    assert "Grouped NVFP4 quantize" in out and "rht=False" in out and "swizzled=True" in out
    with pytest.raises(SystemExit) as exc:
        cli.main(["show-kernel", "nvfp4_quantize", "bogus=1"])
    assert exc.value.code == 2
    assert "nvfp4_quantize has no option 'bogus'" in capsys.readouterr().err
    assert cli.main(["list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(ALL)


def test_programmatic_dependent_launch_is_a_spec_switch(monkeypatch):
    """Every kernel waits for the grids before it (PDL) once, before any global access, and is
    launched with use_pdl as its spec says; CUTEQUANT_PDL=0 turns it off for new specs."""
    for spec in ALL:
        src = render(spec)
        assert spec.pdl
        assert src.count("sched.wait_prior_grids()") == 1, spec.describe()
        assert "pdl=True" in src and "pdl=False" not in src  # use_pdl= or launch_persistent's
        off = dataclasses.replace(spec, pdl=False)
        assert "pdl=False" in render(off) and off.key() != spec.key()
    monkeypatch.setenv("CUTEQUANT_PDL", "0")
    assert not S.GroupAmaxSpec().pdl and not S.Fp8QuantizeSpec().pdl
    monkeypatch.setenv("CUTEQUANT_PDL", "1")
    assert S.Nvfp4QuantizeSpec().pdl


@pytest.mark.parametrize("ctas_per_sm", [1, 2])
@pytest.mark.parametrize("storage", [0, 16 << 10, 70 << 10, 98 << 10, 150 << 10])
def test_persistent_smem_keeps_one_grid_to_its_ctas_per_sm(ctas_per_sm, storage):
    """With PDL a grid's CTAs are placed while the previous kernel runs: the shared memory asked
    for must keep ctas_per_sm + 1 of them off one SM, and cover the kernel's storage."""
    from cutequant.kernels import schedule as sched

    smem = sched.persistent_smem_bytes(storage, ctas_per_sm)
    per_cta = smem + sched.SMEM_RESERVED_PER_CTA
    assert smem >= storage + 1024
    assert (ctas_per_sm + 1) * per_cta > sched.SM90_SMEM_PER_SM
    if storage + 1024 <= sched.SM90_SMEM_PER_SM // ctas_per_sm - sched.SMEM_RESERVED_PER_CTA:
        assert ctas_per_sm * per_cta <= sched.SM90_SMEM_PER_SM  # the planned CTAs still fit


def test_round_robin_chunks_are_a_plan_switch():
    """The FP8 cast's round-robin chunks (kernels/schedule.cta_runs): 8 tiles with a rowwise
    output, 16 for the transposed output alone; a forced value changes the key; other
    families refuse them."""
    both = S.Fp8QuantizeSpec()
    assert both.round_robin_chunk() == 8 and "CHUNK = 8" in render(both)
    assert "sched.cta_runs(tables, num_groups, col_tiles, row_tiles, CHUNK)" in render(both)
    rows = S.Fp8QuantizeSpec(columnwise=False)
    assert rows.round_robin_chunk() == 8 and "CHUNK = 8" in render(rows)
    cols = S.Fp8QuantizeSpec(rowwise=False)
    assert cols.round_robin_chunk() == 16 and "CHUNK = 16" in render(cols)
    forced = dataclasses.replace(both, plan=dataclasses.replace(both.plan, chunk=0))
    assert forced.round_robin_chunk() == 0 and forced.key() != both.key()
    with pytest.raises(ValueError, match="chunk"):
        S.TilePlan(chunk=-2)
    with pytest.raises(ValueError, match="chunk"):
        S.GroupAmaxSpec(plan=S.TilePlan(chunk=4))


def test_nvfp4_chunks_render_only_when_asked():
    """NVFP4: contiguous ranges by default, rendered without the loop over runs (that loop cost
    the H200 kernel 2-3%); a chunked plan renders the run loop and is its own kernel."""
    plain = S.Nvfp4QuantizeSpec()
    assert plain.round_robin_chunk() == 0
    src = render(plain)
    assert "CHUNK" not in src and "sched.cta_tile_range(" in src and "run_bounds" not in src
    for opts in ({}, {"rowwise": False}, {"columnwise": False, "rht": False}):
        spec = S.Nvfp4QuantizeSpec(plan=S.TilePlan(chunk=8), **opts)
        src = render(spec)
        assert "CHUNK = 8" in src and "sched.cta_runs(" in src and "t_begin" not in src
        assert spec.key() != S.Nvfp4QuantizeSpec(**opts).key()


def test_nvfp4_device_chunk(monkeypatch):
    """The memory-bound NVFP4 variants (compact scales, a rowwise output, no fast-math, no SR)
    walk in round-robin chunks on memory-poor GPUs (H100 SXM: 12.8 DRAM bytes per SM clock),
    contiguously on the H200 (18.4) or when torch does not report the memory clock; the other
    variants always contiguously."""
    from cutequant import _launch, cli, nvfp4

    dev = object()
    plain = dict(rowwise=True, swizzled=False, fast_math=False, stochastic=False)
    for per_clock, change, want in (
        (12.8, {}, 8),
        (12.8, {"swizzled": True}, -1),
        (12.8, {"fast_math": True}, -1),
        (12.8, {"stochastic": True}, -1),
        (12.8, {"rowwise": False}, -1),
        (18.4, {}, -1),
        (None, {}, -1),
    ):
        monkeypatch.setattr(_launch, "dram_bytes_per_sm_clock", lambda d, v=per_clock: v)
        assert nvfp4.device_chunk(dev, **{**plain, **change}) == want, (per_clock, change)
    chunked = nvfp4._spec("sm_90a", True, True, True, False, False, False, 8)
    assert chunked.round_robin_chunk() == 8
    assert chunked in cli.all_specs("sm_90a")  # precompiled with the rest


def test_fp8_tile_cast_choice(monkeypatch):
    """The one-CTA-per-tile FP8 cast: both outputs of 16-bit inputs, either scaling (256-column
    tiles with delayed scaling, 128 with current); fp32 inputs, one output, and every call with
    TILE_CAST off, on the TMA-ring kernel."""
    from cutequant import fp8

    assert fp8.uses_tile_cast("bf16", True, True)
    assert fp8.uses_tile_cast("f16", True, True)
    assert not fp8.uses_tile_cast("f32", True, True)
    assert not fp8.uses_tile_cast("bf16", False, True)
    assert not fp8.uses_tile_cast("bf16", True, False)
    monkeypatch.setattr(fp8, "TILE_CAST", False)
    assert not fp8.uses_tile_cast("bf16", True, True)
    for delayed, cols in ((False, 128), (True, 256)):
        spec = fp8._tile_spec("sm_90a", "bf16", "e4m3", delayed)
        assert spec.tile_cols == cols
        assert spec in cli.all_specs("sm_90a")  # precompiled with the rest
    with pytest.raises(ValueError, match="tile_cols"):
        S.Fp8TileCastSpec(tile_cols=96)


def test_2d_work_items_match_the_kernel():
    """The runtime's grid for the 2D kernel (``nvfp4_2d.work_items``) counts the items the
    rendered kernel counts: its tiles, plus one padding item per expert exactly when a written
    direction's scale blocks have padding (the condition rendered into the kernel)."""
    from cutequant import nvfp4_2d

    for spec in (s for s in ALL if s.family == "nvfp4_quantize_2d"):
        src = render(spec)
        cond = None
        if not spec.fake_out:
            line = src[src.index("    items = num_tiles\n") :].split("\n")[1].strip()
            assert line.startswith("if ") and line.endswith(":"), line
            cond = line[3:-1]
        for rows in (0, 16, 64, 128, 144, 256, 1040):
            for cols in (16, 64, 128, 272, 512):
                tiles = 3 * -(-rows // 64) * -(-cols // 128)
                pad = bool(cond) and eval(cond, {"rows": rows, "cols": cols})
                want = tiles + (3 if pad else 0)
                got = nvfp4_2d.work_items(
                    3, rows, cols, spec.rowwise, spec.columnwise, bool(spec.fake_out)
                )
                assert got == want, (spec.describe(), rows, cols)


def test_dequantize_col_tokens_key():
    """``col_tokens`` 64 (the default) stays out of the key (the 64 x 128 kernels keep their
    keys and sources); 128 / 256 are other kernels; only columnwise kernels transposed back
    take them."""
    base = S.DequantizeSpec(columnwise=True)
    assert "col_tokens" not in base.key()
    assert dataclasses.replace(base, col_tokens=64).key() == base.key()
    keys = {base.key()}
    for tokens in (128, 256):
        other = dataclasses.replace(base, col_tokens=tokens)
        assert module_name(other) != module_name(base)
        keys.add(other.key())
    assert len(keys) == 3
    for bad in (
        {"col_tokens": 96},
        {"col_tokens": 128, "columnwise": False},
        {"col_tokens": 128, "transposed_out": True},
    ):
        with pytest.raises(ValueError, match="col_tokens"):
            dataclasses.replace(base, **bad)


def test_dequantize_col_ring_key():
    """``col_ring`` 0 (the default) stays out of the key; 8 is another kernel, of
    256-token columnwise tiles only."""
    base = S.DequantizeSpec(columnwise=True, col_tokens=256)
    assert "col_ring" not in base.key()
    keys = {base.key()}
    for ring in S.DEQUANT_COL_RINGS[1:]:
        other = dataclasses.replace(base, col_ring=ring)
        assert module_name(other) != module_name(base)
        keys.add(other.key())
    assert len(keys) == len(S.DEQUANT_COL_RINGS)
    for bad in ({"col_ring": 2}, {"col_ring": 8, "col_tokens": 128}):
        with pytest.raises(ValueError, match="col_ring"):
            dataclasses.replace(base, **bad)


def test_dequantize_hint_and_tail_keys():
    """``cache_hints`` "ldst" is the default (in the key), "" (no hints) stays out of it and
    ``col_tail`` False too; the others are other kernels; ``col_tail`` needs 256-token ring
    tiles; the runtime's flags map to the fields (by default "ldst" and no tail)."""
    from cutequant import dequant

    assert (dequant.CACHE_HINTS, dequant.COLUMNWISE_TAIL) == ("ldst", 0)
    assert S.DequantizeSpec().cache_hints == S.DEQUANT_DEFAULT_CACHE_HINTS == "ldst"
    ring = S.DequantizeSpec(columnwise=True, col_tokens=256, col_ring=8)
    for base in (S.DequantizeSpec(), ring):
        bare = dataclasses.replace(base, cache_hints="")
        assert "cache_hints" not in bare.key() and "col_tail" not in base.key()
        keys = {dataclasses.replace(base, cache_hints=h).key() for h in S.DEQUANT_CACHE_HINTS}
        assert len(keys) == len(S.DEQUANT_CACHE_HINTS)
    assert module_name(dataclasses.replace(ring, col_tail=True)) != module_name(ring)
    with pytest.raises(ValueError, match="cache_hints"):
        S.DequantizeSpec(cache_hints="nc")
    for bad in (S.DequantizeSpec(), dataclasses.replace(ring, col_ring=0)):
        with pytest.raises(ValueError, match="col_tail"):
            dataclasses.replace(bad, col_tail=True)
    args = ("sm_90a", "e4m3", True, False, False, "bf16")
    try:
        dequant.CACHE_HINTS, dequant.COLUMNWISE_TAIL = "st", 2
        spec = dequant._spec(*args)
        assert (spec.cache_hints, spec.col_tail, spec.col_ring) == ("st", True, 8)
        assert dequant._spec("sm_90a", "e4m3", False, False, False, "bf16").col_tail is False
        dequant.COLUMNWISE_TAIL = 3
        with pytest.raises(ValueError, match="COLUMNWISE_TAIL"):
            dequant._spec(*args)
    finally:
        dequant.CACHE_HINTS, dequant.COLUMNWISE_TAIL = "ldst", 0
    assert dequant._spec(*args) in set(cli.all_specs("sm_90a"))


def test_dequantize_regs_keys():
    """``col_regs`` 0 stays out of the key (the shared-memory staging keeps its key), 128 / 256
    are other kernels; it needs FP8 256-token ring tiles with 16-bit outputs; the runtime's
    flag ``dequant.COLUMNWISE_REGS`` (None: the default, 128, the kernel precompile builds)
    maps to it for those kernels only."""
    from cutequant import dequant

    assert dequant.COLUMNWISE_REGS is None
    ring = S.DequantizeSpec(fmt="e4m3", columnwise=True, col_tokens=256, col_ring=8)
    assert "col_regs" not in ring.key()
    keys = {dataclasses.replace(ring, col_regs=t).key() for t in S.DEQUANT_COL_REGS}
    assert len(keys) == len(S.DEQUANT_COL_REGS)
    for bad in (
        {"col_regs": 64},
        {"fmt": "nvfp4", "col_regs": 128},
        {"out_dtype": "f32", "col_regs": 128},
        {"col_ring": 0, "col_regs": 128},
        {"columnwise": False, "col_tokens": 64, "col_ring": 0, "col_regs": 128},
    ):
        with pytest.raises(ValueError, match="col_regs"):
            dataclasses.replace(ring, **bad)
    default = dequant._spec("sm_90a", "e5m2", True, False, False, "f16")
    assert (default.col_regs, default.col_ring, default.col_tokens) == (128, 8, 256)
    assert default in set(cli.all_specs("sm_90a"))
    try:
        for threads in S.DEQUANT_COL_REGS:
            dequant.COLUMNWISE_REGS = threads
            spec = dequant._spec("sm_90a", "e5m2", True, False, False, "f16")
            assert (spec.col_regs, spec.col_ring, spec.col_tokens) == (threads, 8, 256)
            assert spec in set(S.dequant_ab_variants()) | set(cli.all_specs("sm_90a"))
            for args in (
                ("e4m3", True, False, False, "f32"),
                ("e4m3", False, False, False, "bf16"),
                ("nvfp4", True, False, False, "bf16"),
                ("nvfp4", True, True, False, "bf16"),
            ):
                assert dequant._spec("sm_90a", *args).col_regs == 0
        dequant.COLUMNWISE_REGS = 64
        with pytest.raises(ValueError, match="COLUMNWISE_REGS"):
            dequant._spec("sm_90a", "e4m3", True, False, False, "bf16")
    finally:
        dequant.COLUMNWISE_REGS = None
    assert dequant._spec("sm_90a", "e4m3", True, False, False, "bf16").col_regs == 128


def test_dequantize_runtime_specs_are_precompiled():
    """Every spec the runtime's dequantize builds with its default flags (256-token columnwise
    tiles with the sub-tile ring, NVFP4 compact scales as words) is one precompile builds."""
    from cutequant import dequant

    defaults = (dequant.COLUMNWISE_TOKENS, dequant.COLUMNWISE_RING, dequant.COLUMNWISE_SCALE_WORDS)
    assert defaults == (None, None, None)
    pre = set(cli.all_specs("sm_90a"))
    seen = set()
    for out_dtype in S.OUT_DTYPES:
        for fmt in S.DEQUANT_FORMATS:
            flags = itertools.product(*[(False, True)] * 4)
            for columnwise, undo_rht, swizzled, transposed in flags:
                try:
                    spec = dequant._spec(
                        "sm_90a", fmt, columnwise, undo_rht, swizzled, out_dtype, transposed
                    )
                except ValueError:
                    continue  # no such kernel (e.g. FP8 with swizzled scales)
                if transposed and (swizzled or out_dtype == "f32" or fmt != "nvfp4"):
                    continue  # the runtime has none (NVFP4, compact scales, 16-bit outputs)
                assert spec in pre, spec.describe()
                seen.add(spec)
    tiles = {
        (s.fmt == "nvfp4" and not s.swizzled, s.col_tokens, s.col_ring, s.col_scale_words)
        for s in seen
        if s.columnwise and not s.transposed_out
    }
    assert tiles == {(False, 256, 8, False), (True, 256, 8, True)}
