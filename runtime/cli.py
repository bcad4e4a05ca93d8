"""``cutequant`` command line: kernel variants, their rendered source, and the kernel cache.

  cutequant list [--family F] [--arch A] [--options]
                                              kernel variants, as show-kernel arguments
  cutequant show-kernel [--arch A] FAMILY [KEY=VALUE ...]
                                              print the rendered CuTe DSL module of a spec
  cutequant precompile [--arch A] [--family F] [--jobs N]
                                              compile every variant into the disk cache
                                              (no GPU needed: run it on a build box)
  cutequant cache info | list | verify | clear
                                              the disk cache: state, entries, checks, removal

A kernel spec is a family plus KEY=VALUE options: booleans as true/false (or 1/0, yes/no,
on/off), integers, dtype names. Options not given keep the family's default;
`cutequant list --options` shows every family's options and defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
import warnings

from cutequant.codegen import specs as S

# --------------------------------------------------------------------------- kernel variants


def _variants(cls, arch: str, **choices):
    names = list(choices)
    for values in itertools.product(*(choices[n] for n in names)):
        yield cls(arch=arch, **dict(zip(names, values, strict=True)))


def all_specs(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """Every kernel variant the runtime can ask for on ``arch``: what `precompile` and CI
    compile. The variants that exist on ``arch`` (``spec.supported_archs()``), in the order of
    the sm_90a list."""
    if arch not in S.ARCHS:
        raise ValueError(f"arch must be one of {S.ARCHS}, got {arch!r}")
    return [
        s if arch == s.arch else _for_arch(s, arch)
        for s in _hopper_specs()
        if arch in s.supported_archs()
    ]


def _for_arch(spec: S.KernelSpec, arch: str) -> S.KernelSpec:
    """``spec`` for another arch; the hardware-e2m1 archs have no software RN encoder to vary
    and keep the SR paths they had (the trimmed ones were tested on sm_90a only)."""
    if arch in S.HW_E2M1_ARCHS and spec.family == "nvfp4_quantize":
        return dataclasses.replace(spec, arch=arch, fma_encoder=False, sr_trim=False)
    if arch != "sm_90a" and spec.family in _FAKE_QUANT_FAMILIES:
        return dataclasses.replace(spec, arch=arch, sr_trim=False)
    return dataclasses.replace(spec, arch=arch)


def fma_encoder_variants(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """The A/B side of runtime/nvfp4.py's ``FMA_ENCODER`` (default on): every RN ``alu_trim``
    kernel of ``all_specs`` without ``fma_encoder`` (sm_90a only), the encoder before it. Not
    precompiled; tests/test_compile.py compiles them."""
    if arch in S.HW_E2M1_ARCHS:
        return []
    return [
        dataclasses.replace(s, fma_encoder=False)
        for s in all_specs(arch)
        if s.family == "nvfp4_quantize" and s.fma_encoder
    ]


def stsm_restage_variants(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """The A/B side of runtime/nvfp4.py's ``STSM_RESTAGE`` (default off): every kernel of
    ``all_specs`` that has fast math's wgmma restage, with ``stsm_restage``. Not precompiled;
    tests/test_compile.py compiles them."""
    return [
        dataclasses.replace(s, stsm_restage=True)
        for s in all_specs(arch)
        if s.family == "nvfp4_quantize" and s.stsm_restage_applies()
    ]


_FAKE_QUANT_FAMILIES = ("fake_quant_rows", "fake_quant_cols")


def fake_quant_sr_trim_variants(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """The other side of runtime/fake_quant.py's ``SR_TRIM`` (default on, sm_90a): every
    stochastic fake-quant kernel (rows, columnwise) of ``all_specs`` with ``sr_trim`` flipped
    (sm_90a: without it, the A/B side and what calls of 2^36 elements or more use; other archs:
    with it). Not precompiled; tests/test_compile.py compiles them, tests/test_codegen.py lints
    them."""
    return [
        dataclasses.replace(s, sr_trim=not s.sr_trim)
        for s in all_specs(arch)
        if s.family in _FAKE_QUANT_FAMILIES and s.stochastic
    ]


def sr_trim_variants(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """The A/B side of runtime/nvfp4.py's ``SR_TRIM`` (default on, sm_90a): every SR
    ``alu_trim`` kernel of ``all_specs`` without ``sr_trim`` (the SR encoder before it). Not
    precompiled; tests/test_compile.py compiles them."""
    return [
        dataclasses.replace(s, sr_trim=False)
        for s in all_specs(arch)
        if s.family == "nvfp4_quantize" and s.sr_trim
    ]


def ab_variants() -> dict:
    """The A/B sides of the runtime's kernel switches, by name: what a GPU A/B probe
    (perf/probes/nvfp4_ab.py, fake_quant_ab.py, dequant_walk.py) compiles besides the runtime's
    kernels. ``cutequant precompile --ab NAME`` builds them in parallel into the disk cache, so
    that a probe on a fresh machine does not spend its time compiling them one by one."""
    return {
        "fma_encoder": fma_encoder_variants,
        "stsm_restage": stsm_restage_variants,
        "sr_trim": sr_trim_variants,
        "fake_quant_sr_trim": fake_quant_sr_trim_variants,
        "dequantize": S.dequant_ab_variants,
    }


def _hopper_specs() -> list[S.KernelSpec]:
    arch = "sm_90a"  # every family exists there
    out: list[S.KernelSpec] = []
    out += _variants(S.GroupTablesSpec, arch, splits_int64=(False, True))
    # each also building a device-split call's tables itself (int32 / int64 splits)
    dsplits = S.GroupAmaxSpec.DEVICE_SPLITS
    out += _variants(S.GroupAmaxSpec, arch, rht=(True,), device_splits=dsplits)
    out += _variants(
        S.GroupAmaxSpec, arch, rht=(False,), in_dtype=S.IN_DTYPES, device_splits=dsplits
    )
    # the amax pass of FP8 current scaling with a transposed output walks like that cast kernel
    whole_group = dataclasses.replace(S.GroupAmaxSpec().plan, walk_band=S.WHOLE_GROUP_BAND)
    out += _variants(
        S.GroupAmaxSpec, arch, rht=(False,), in_dtype=S.IN_DTYPES, plan=(whole_group,),
        device_splits=dsplits,
    )  # fmt: skip
    for rowwise, columnwise in ((True, True), (True, False), (False, True)):
        for rht in (True, False) if columnwise else (False,):
            out += _variants(
                S.Nvfp4QuantizeSpec,
                arch,
                rowwise=(rowwise,),
                columnwise=(columnwise,),
                rht=(rht,),
                swizzled=(False, True),
                fast_math=(False, True),
                stochastic=(False, True),
            )
            if rowwise:  # what nvfp4.device_chunk asks for on an H100
                chunked = dataclasses.replace(
                    S.Nvfp4QuantizeSpec().plan, chunk=S.Nvfp4QuantizeSpec.MEMORY_BOUND_CHUNK
                )
                out.append(
                    S.Nvfp4QuantizeSpec(
                        arch=arch, rowwise=True, columnwise=columnwise, rht=rht, plan=chunked
                    )
                )
    # every NVFP4 quantize kernel twice: with ``alu_trim`` (the runtime's default below 2^32
    # elements, runtime/nvfp4.py's ALU_TRIM; the RN ones with its ``fma_encoder``, FMA_ENCODER,
    # the SR ones with its ``sr_trim``, SR_TRIM) and without (larger calls: 64-bit offsets)
    out += [
        dataclasses.replace(s, alu_trim=True, fma_encoder=not s.stochastic, sr_trim=s.stochastic)
        for s in out
        if s.family == "nvfp4_quantize"
    ]
    for delayed in (False, True):
        out += _variants(
            S.Fp8TileCastSpec,
            arch,
            in_dtype=("bf16", "f16"),
            fp8_dtype=S.FP8_DTYPES,
            delayed=(delayed,),
            tile_cols=(S.Fp8TileCastSpec.default_tile_cols(delayed),),
        )
    for rowwise, columnwise in ((True, True), (True, False), (False, True)):
        out += _variants(
            S.Fp8QuantizeSpec,
            arch,
            in_dtype=S.IN_DTYPES,
            fp8_dtype=S.FP8_DTYPES,
            delayed=(False, True),
            rowwise=(rowwise,),
            columnwise=(columnwise,),
        )
    # dequantize, 2D quantize, fake-quant (issue 20); the SR fake-quant kernels with their
    # ``sr_trim`` (runtime/fake_quant.py's SR_TRIM, the default on sm_90a)
    out += [
        dataclasses.replace(s, sr_trim=True)
        if s.family in _FAKE_QUANT_FAMILIES and s.stochastic
        else s
        for s in S.recipe_variants(arch)
    ]
    return out


def _spec_classes() -> dict[str, type[S.KernelSpec]]:
    """Every concrete spec class by family (a new family is found without editing this file)."""
    found: dict[str, type[S.KernelSpec]] = {}
    stack = list(S.KernelSpec.__subclasses__())
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if cls.family:
            found[cls.family] = cls
    return dict(sorted(found.items()))


FAMILIES = _spec_classes()

# --------------------------------------------------------------------------- KEY=VALUE specs

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def spec_options(family: str) -> dict[str, object]:
    """The options of a family and their defaults: its own fields, then its tile plan's fields
    under their own names (``stages=6``), as ``list`` prints them and ``show-kernel`` takes them."""
    default = FAMILIES[family]()
    out: dict[str, object] = {}
    for f in dataclasses.fields(default):
        value = getattr(default, f.name)
        if f.name == "arch":
            continue
        if f.name == "plan":
            out.update(dataclasses.asdict(value))
        else:
            out[f.name] = value
    return out


def _format_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def spec_to_args(spec: S.KernelSpec) -> list[str]:
    """``[family, KEY=VALUE ...]`` for the options where ``spec`` differs from the default."""
    defaults = spec_options(spec.family)
    current = spec_options_of(spec)
    changed = [f"{k}={_format_value(v)}" for k, v in current.items() if v != defaults[k]]
    return [spec.family, *changed]


def spec_options_of(spec: S.KernelSpec) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name == "plan":
            out.update(dataclasses.asdict(value))
        elif f.name != "arch":
            out[f.name] = value
    return out


def _parse_value(key: str, text: str, default):
    if isinstance(default, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"option {key}: expected true or false, got {text!r}")
    if isinstance(default, int):
        try:
            return int(text, 0)
        except ValueError:
            raise ValueError(f"option {key}: expected an integer, got {text!r}") from None
    return text


def spec_from_args(family: str, options: list[str], arch: str = "sm_90a") -> S.KernelSpec:
    """The spec named by ``family`` and ``KEY=VALUE`` options; ValueError naming the bad
    option and the rule it breaks."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of: {', '.join(FAMILIES)}")
    known = spec_options(family)
    default = FAMILIES[family](arch=arch)
    fields = {f.name for f in dataclasses.fields(default)}
    changes: dict[str, object] = {}
    plan_changes: dict[str, object] = {}
    for opt in options:
        key, sep, text = opt.partition("=")
        if not sep or not key:
            raise ValueError(f"options are KEY=VALUE, got {opt!r}")
        if key not in known:
            raise ValueError(f"{family} has no option {key!r}; options: {', '.join(known)}")
        value = _parse_value(key, text, known[key])
        (changes if key in fields else plan_changes)[key] = value
    if plan_changes:
        changes["plan"] = dataclasses.replace(default.plan, **plan_changes)
    return dataclasses.replace(default, **changes)


def spec_from_key(key: str) -> S.KernelSpec:
    """The spec whose ``spec.key()`` is ``key`` (an entry's metadata); ValueError if none."""
    import json

    try:
        fields = json.loads(key)
        cls = FAMILIES[fields.pop("family")]
        if "plan" in fields:
            fields["plan"] = S.TilePlan(**fields["plan"])
        return cls(**fields)
    except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a spec key: {key!r} ({exc})") from None


def _options_text() -> str:
    lines = []
    for family in FAMILIES:
        opts = " ".join(f"{k}={_format_value(v)}" for k, v in spec_options(family).items())
        lines.append(f"  {family}: {opts}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- precompile


def _precompile_one(spec: S.KernelSpec) -> tuple[S.KernelSpec, str, str]:
    """(spec, status, detail) for one spec; warnings become part of the detail so that the
    parent prints them once, beside the spec they belong to."""
    from cutequant import jit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = jit.precompile(spec)
    notes = [str(w.message) for w in caught]
    detail = "; ".join(x for x in [outcome.detail, *notes] if x)
    return spec, outcome.status, detail


def _run_precompile(specs, jobs: int, progress: bool) -> list[tuple[S.KernelSpec, str, str]]:
    """(spec, status, detail) for every spec, in the order of ``specs``."""
    from tqdm import tqdm

    results: list = [None] * len(specs)
    bar = tqdm(total=len(specs), desc="precompile", unit="kernel", disable=not progress)
    try:
        if jobs == 1:
            for i, spec in enumerate(specs):
                results[i] = _precompile_one(spec)
                bar.update()
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # cute.compile is not thread-safe: parallelism is per process. spawn, not fork: the
            # parent runs tqdm's monitor thread, and fork with threads is unsafe.
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                futures = {pool.submit(_precompile_one, s): i for i, s in enumerate(specs)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
    finally:
        bar.close()
    return results


def cmd_precompile(args) -> int:
    from cutequant import cache

    specs = all_specs(args.arch)
    for name in args.ab or ():
        specs += [s for s in ab_variants()[name](args.arch) if s not in specs]
    specs = [s for s in specs if not args.family or s.family in args.family]
    missing = [f for f in args.family or () if args.arch not in FAMILIES[f].ARCHS]
    if missing:
        for family in missing:
            print(
                f"cutequant precompile: {family} does not exist on {args.arch} (it does on "
                f"{', '.join(FAMILIES[family].ARCHS)})",
                file=sys.stderr,
            )
        return 1
    root = cache.cache_dir()
    if not cache.disk_cache_enabled():
        print(
            "cutequant precompile: the disk cache is disabled (CUTEQUANT_DISABLE_DISK_CACHE); "
            "nothing to precompile into",
            file=sys.stderr,
        )
        return 1
    mode, reason = cache.probe(root)
    if mode != "rw":
        print(
            f"cutequant precompile: cache directory {root} is not usable: {reason}", file=sys.stderr
        )
        return 1
    start = time.monotonic()
    results = _run_precompile(specs, args.jobs, args.progress)
    counts = {"compiled": 0, "cached": 0, "failed": 0}
    for spec, status, detail in results:
        counts[status] = counts.get(status, 0) + 1
        if status == "failed" or args.verbose:
            print(f"{status}: {' '.join(spec_to_args(spec))}" + (f" ({detail})" if detail else ""))
    print(
        f"precompile {args.arch}: {len(specs)} kernels, {counts['compiled']} compiled, "
        f"{counts['cached']} already cached, {counts['failed']} failed "
        f"in {time.monotonic() - start:.1f} s; cache {root}"
    )
    return 1 if counts["failed"] else 0


# --------------------------------------------------------------------------- cache commands


def _current() -> dict:
    from cutequant import jit

    return {"dsl": jit.dsl_version(), "sources": jit.source_fingerprint()}


def _usable_for_reading(root, cmd: str) -> bool:
    from cutequant import cache

    mode, reason = cache.probe(root, create=False)
    if mode == "off":
        print(
            f"cutequant cache {cmd}: cache directory {root} is unusable: {reason}", file=sys.stderr
        )
        return False
    return True


def cmd_cache_info(args) -> int:
    from cutequant import cache, jit

    root = cache.cache_dir()
    enabled = cache.disk_cache_enabled()
    mode, reason = cache.probe(root, create=False)
    state = {
        "rw": "usable",
        "ro": f"read-only ({reason})",
        "off": f"UNUSABLE ({reason})",
        "missing": "not created yet",
    }[mode]
    print(f"cache dir: {root}: {state}")
    print(f"disk cache: {'on' if enabled else 'off (CUTEQUANT_DISABLE_DISK_CACHE)'}")
    print(f"nvidia-cutlass-dsl {jit.dsl_version()}; sources {jit.source_fingerprint()[:16]}")
    if mode == "off":
        return 1
    reports = cache.inspect_entries(root, _current())
    by_status = {
        s: [r for r in reports if r.status == s] for s in ("ok", "other install", "invalid")
    }
    size = sum(r.size for r in reports)
    print(
        f"{len(reports)} entries ({size / 1e6:.1f} MB): {len(by_status['ok'])} for this install, "
        f"{len(by_status['other install'])} for another install, "
        f"{len(by_status['invalid'])} invalid; {len(cache.stray_files(root))} stray temporary files"
    )
    return 0


def _readable_entries(cmd: str):
    """(cache root, its entries' reports) for ``cutequant cache CMD``, or None (after saying
    why on stderr) when the directory cannot be read."""
    from cutequant import cache

    root = cache.cache_dir()
    if not _usable_for_reading(root, cmd):
        return None
    return root, cache.inspect_entries(root, _current())


def cmd_cache_list(args) -> int:
    found = _readable_entries("list")
    if found is None:
        return 1
    root, reports = found
    for r in reports:
        meta = r.meta or {}
        try:
            what = " ".join(spec_to_args(spec_from_key(meta.get("spec", ""))))
        except ValueError:
            what = meta.get("family", "?")
        extra = f" ({r.detail})" if r.detail else ""
        print(f"{r.status:13} {meta.get('arch', '?'):7} {r.size:>7} B  {r.name}  {what}{extra}")
    print(f"{len(reports)} entries in {root / 'kernels'}")
    return 0


def cmd_cache_verify(args) -> int:
    from cutequant import cache

    found = _readable_entries("verify")
    if found is None:
        return 1
    root, reports = found
    bad = [r for r in reports if r.status == "invalid"]
    strays = cache.stray_files(root)
    for r in bad:
        print(f"invalid: {r.name}: {r.detail}")
    for p in strays:
        print(f"stray temporary file: {p}")
    if args.remove_invalid:
        entries = [cache.Entry(root, r.name) for r in bad]
        paths = strays + [p for e in entries for p in (e.obj, e.meta)]
        if not _remove(paths, root, "verify"):
            return 1
    ok = sum(r.status == "ok" for r in reports)
    other = sum(r.status == "other install" for r in reports)
    print(
        f"{len(reports)} entries: {ok} valid, {other} valid for another install, {len(bad)} invalid"
    )
    return 1 if (bad or strays) and not args.remove_invalid else 0


def cmd_cache_clear(args) -> int:
    from cutequant import cache

    root = cache.cache_dir()
    if not _usable_for_reading(root, "clear"):
        return 1
    if args.stale:
        reports = cache.inspect_entries(root, _current())
        paths = cache.stray_files(root)
        for r in reports:
            if r.status != "ok":
                entry = cache.Entry(root, r.name)
                paths += [entry.obj, entry.meta]
    else:
        paths = cache.all_files(root)
    return 0 if _remove(paths, root, "clear") else 1


def _remove(paths, root, cmd: str) -> bool:
    """Remove ``paths``; False (after a message) when the directory does not allow it."""
    from cutequant import cache

    try:
        removed = cache.remove_paths(paths)
    except OSError as exc:
        print(f"cutequant cache {cmd}: cannot remove files from {root}: {exc}", file=sys.stderr)
        return False
    print(f"removed {removed} files from {root}")
    return True


# --------------------------------------------------------------------------- argument parsing


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _add_cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="kernel cache directory (default: $CUTEQUANT_CACHE_DIR, else "
        "$XDG_CACHE_HOME/cutequant, else ~/.cache/cutequant)",
    )


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="cutequant", description=__doc__, formatter_class=fmt)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    families = list(FAMILIES)

    ls = sub.add_parser("list", help="kernel variants that precompile builds")
    ls.add_argument("--family", action="append", choices=families, help="only this family")
    ls.add_argument(
        "--arch",
        default=S.ARCHS[0],
        choices=S.ARCHS,
        help="the variants on this arch (%(default)s)",
    )
    ls.add_argument(
        "--options", action="store_true", help="print each family's options and defaults instead"
    )

    show = sub.add_parser(
        "show-kernel",
        help="print the rendered CuTe DSL module of a kernel spec",
        formatter_class=fmt,
        epilog="options and defaults per family:\n" + _options_text(),
    )
    show.add_argument("family", choices=families, help="kernel family")
    show.add_argument(
        "--arch",
        default=S.ARCHS[0],
        choices=S.ARCHS,
        help="target arch: picks the e2m1 encoder and the RHT instruction (default %(default)s)",
    )
    show.add_argument(
        "options",
        nargs="*",
        metavar="KEY=VALUE",
        help="spec options (booleans true/false, integers, dtype names); "
        "the rest keep their defaults",
    )

    pre = sub.add_parser(
        "precompile",
        help="compile every kernel variant into the disk cache (no GPU needed)",
        description="Compile every kernel variant (`cutequant list`) for an arch into the disk "
        "cache. Prints a summary; exits 1 if any kernel failed to compile or to be written.",
    )
    pre.add_argument(
        "--arch", default=S.ARCHS[0], choices=S.ARCHS, help="target GPU arch (default %(default)s)"
    )
    pre.add_argument(
        "--family", action="append", choices=families, help="only this family (repeatable)"
    )
    pre.add_argument(
        "--jobs",
        "-j",
        metavar="N",
        type=_positive_int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="compiler processes (>= 1; default %(default)s)",
    )
    pre.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=sys.stderr.isatty(),
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    pre.add_argument(
        "--ab",
        action="append",
        choices=sorted(ab_variants()),
        metavar="SWITCH",
        help="also the A/B side of a runtime switch, for GPU A/B probes (repeatable; "
        f"{', '.join(sorted(ab_variants()))})",
    )
    pre.add_argument("--verbose", "-v", action="store_true", help="one line per kernel")
    _add_cache_dir(pre)

    cache_p = sub.add_parser("cache", help="inspect, verify or clear the disk cache")
    csub = cache_p.add_subparsers(dest="cache_cmd", required=True, metavar="ACTION")
    for name, text in (
        ("info", "cache directory, its state and entry counts"),
        ("list", "every entry: family, arch, size, status"),
    ):
        _add_cache_dir(csub.add_parser(name, help=text))
    ver = csub.add_parser(
        "verify",
        help="check every entry's metadata and checksum (exit 1 if any is invalid)",
    )
    ver.add_argument(
        "--remove-invalid",
        action="store_true",
        help="delete invalid entries and stray temporary files",
    )
    _add_cache_dir(ver)
    clr = csub.add_parser("clear", help="delete the cache's files")
    clr.add_argument(
        "--stale",
        action="store_true",
        help="only invalid entries, entries of other installs and stray temporary files",
    )
    _add_cache_dir(clr)

    info = sub.add_parser("cache-info", help="deprecated: use `cutequant cache info`")
    _add_cache_dir(info)
    return p


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader closed the pipe (`cutequant list | head`): stop quietly, with the status of
        # a process ended by SIGPIPE, and keep Python's exit-time flush from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "cache_dir", None):
        os.environ["CUTEQUANT_CACHE_DIR"] = args.cache_dir  # the workers inherit it

    if args.cmd == "list":
        if args.options:
            print(_options_text())
            return 0
        for spec in all_specs(args.arch):
            if not args.family or spec.family in args.family:
                print(" ".join(spec_to_args(spec)))
    elif args.cmd == "show-kernel":
        from cutequant.codegen import render

        try:
            spec = spec_from_args(args.family, args.options, arch=args.arch)
        except (ValueError, TypeError) as exc:
            parser.error(f"show-kernel: {exc}")
        sys.stdout.write(render(spec))
    elif args.cmd == "precompile":
        return cmd_precompile(args)
    elif args.cmd == "cache-info":
        print("cutequant: `cache-info` is deprecated; use `cutequant cache info`", file=sys.stderr)
        return cmd_cache_info(args)
    elif args.cmd == "cache":
        return {
            "info": cmd_cache_info,
            "list": cmd_cache_list,
            "verify": cmd_cache_verify,
            "clear": cmd_cache_clear,
        }[args.cache_cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
