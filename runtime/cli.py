"""``cutequant`` command line: inspect rendered kernels, precompile the cache, show cache state.

cutequant list                              every kernel variant (family + switches)
cutequant show-kernel group_amax rht=false  print the rendered CuTe DSL module of a spec
cutequant precompile [--family F] [--jobs N]
                                            compile every variant into the disk cache
cutequant cache-info                        cache directory, entries, key ingredients
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from cutequant.codegen import specs as S


def _variants(cls, arch: str, **choices):
    names = list(choices)
    for values in itertools.product(*(choices[n] for n in names)):
        yield cls(arch=arch, **dict(zip(names, values, strict=True)))


def all_specs(arch: str = "sm_90a") -> list[S.KernelSpec]:
    """Every kernel variant the runtime can ask for: what `precompile` and CI compile."""
    out: list[S.KernelSpec] = []
    out += _variants(S.GroupTablesSpec, arch, splits_int64=(False, True))
    out += _variants(S.GroupAmaxSpec, arch, rht=(True,))
    out += _variants(S.GroupAmaxSpec, arch, rht=(False,), in_dtype=S.IN_DTYPES)
    # the amax pass of FP8 current scaling with a transposed output walks like that cast kernel
    whole_group = dataclasses.replace(S.GroupAmaxSpec().plan, walk_band=S.WHOLE_GROUP_BAND)
    out += _variants(S.GroupAmaxSpec, arch, rht=(False,), in_dtype=S.IN_DTYPES, plan=(whole_group,))
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
    out += S.recipe_variants(arch)  # dequantize, 2D quantize, fake-quant (issue 20)
    return out


FAMILIES = {
    cls.family: cls
    for cls in (S.GroupTablesSpec, S.GroupAmaxSpec, S.Nvfp4QuantizeSpec, S.Fp8QuantizeSpec)
}


def _parse_value(text: str, current):
    if isinstance(current, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise SystemExit(f"expected a boolean, got {text!r}")
    if isinstance(current, int):
        return int(text, 0)
    return text


def spec_from_args(family: str, options: list[str], arch: str) -> S.KernelSpec:
    if family not in FAMILIES:
        raise SystemExit(f"unknown family {family!r}; one of: {', '.join(sorted(FAMILIES))}")
    spec = FAMILIES[family](arch=arch)
    changes = {}
    for opt in options:
        if "=" not in opt:
            raise SystemExit(f"options are key=value, got {opt!r}")
        k, v = opt.split("=", 1)
        if not hasattr(spec, k) or k == "plan":
            fields = [f.name for f in dataclasses.fields(spec) if f.name not in ("arch", "plan")]
            raise SystemExit(f"{family} has no option {k!r}; options: {', '.join(fields)}")
        changes[k] = _parse_value(v, getattr(spec, k))
    return dataclasses.replace(spec, **changes)


def _compile_one(key_and_spec):
    from cutequant import jit

    spec = key_and_spec
    jit.get_kernel(spec)
    return spec.describe(), jit.stats.export_failures == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="cutequant", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    show = sub.add_parser("show-kernel")
    show.add_argument("family")
    show.add_argument("options", nargs="*")
    pre = sub.add_parser("precompile")
    pre.add_argument("--arch", default="sm_90a")
    pre.add_argument("--family", default=None)
    pre.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    sub.add_parser("cache-info")
    args = p.parse_args(argv)

    if args.cmd == "list":
        for spec in all_specs():
            print(spec.describe())
    elif args.cmd == "show-kernel":
        from cutequant.codegen import render

        sys.stdout.write(render(spec_from_args(args.family, args.options, "sm_90a")))
    elif args.cmd == "precompile":
        specs = [s for s in all_specs(args.arch) if args.family in (None, s.family)]
        # cute.compile is not thread-safe: parallelism is per process.
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for desc, exported in pool.map(_compile_one, specs):
                print(f"{'cached' if exported else 'compiled (no disk write)'}: {desc}")
    elif args.cmd == "cache-info":
        from cutequant import jit

        d = jit.cache_dir()
        entries = sorted((d / "kernels").glob("*.o")) if (d / "kernels").exists() else []
        print(f"cache dir: {d} (disk cache {'on' if jit.disk_cache_enabled() else 'off'})")
        print(f"nvidia-cutlass-dsl {jit.dsl_version()}; sources {jit.source_fingerprint()[:16]}")
        print(f"{len(entries)} compiled entries")
        for e in entries:
            print(f"  {e.name}  {e.stat().st_size} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
