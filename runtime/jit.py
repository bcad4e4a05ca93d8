"""JIT compilation and the two kernel caches (in memory, on disk).

``get_kernel(spec)`` returns a callable launcher for a spec:

1. in-memory dict keyed by the spec (arch included);
2. disk (``cutequant.cache``): ``<cache dir>/kernels/<name>.so``, the ``export_to_c`` TVM-FFI
   object linked into a shared library and loaded with ``tvm_ffi.load_module`` without
   importing the DSL (``cutequant._dso``: a fresh process's first call), beside a metadata file
   checked on every load (spec, arch, DSL version, source fingerprint, size, sha256). The
   entry name hashes the spec, the nvidia-cutlass-dsl version and a fingerprint of every
   source file of this package, so an upgrade or an edit never loads a stale binary. An entry
   that fails a check or does not load is reported (one warning), recompiled and replaced;
3. otherwise: render the template, import the module, ``cute.compile`` it for the spec's arch
   (works without a GPU: ``cutequant precompile`` on a build box fills the disk cache).

A disk cache that cannot be used (``cache.directory_mode``) costs one warning; kernels are then
kept in memory. ``CUTEQUANT_DISABLE_DISK_CACHE=1`` turns the disk layer off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutequant import _dso, cache
from cutequant.cache import cache_dir, disk_cache_enabled
from cutequant.codegen import module_name, render
from cutequant.codegen.specs import KernelSpec

__all__ = ["cache_dir", "disk_cache_enabled", "get_kernel", "compile_spec", "precompile"]

_LOCK = threading.RLock()
_MEMORY: dict[KernelSpec, Callable[..., Any]] = {}
_MODULES: dict[str, Any] = {}


@dataclass
class CacheStats:
    """Counters for tests and the CLI (per process, cumulative)."""

    compiles: int = 0
    disk_loads: int = 0
    disk_writes: int = 0
    memory_hits: int = 0
    invalid_entries: int = 0  # entries that failed a check or did not load (then recompiled)
    write_failures: int = 0  # compiled kernels that could not be written to the disk cache


stats = CacheStats()


def _package_dirs() -> list[Path]:
    import cutequant
    import cutequant.codegen
    import cutequant.kernels

    return [Path(m.__file__).parent for m in (cutequant, cutequant.kernels, cutequant.codegen)]


_FINGERPRINT: str | None = None


def source_fingerprint() -> str:
    """sha256 over every .py / .j2 file of the installed package (computed once per process)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256()
        for root in _package_dirs():
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".j2") and "__pycache__" not in path.parts:
                    h.update(str(path.relative_to(root)).encode())
                    h.update(path.read_bytes())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def dsl_version() -> str:
    """The installed nvidia-cutlass-dsl version, from its package metadata (importing the DSL
    to ask it costs 0.4-2 s; a cached kernel loads without it)."""
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        import cutlass

        return getattr(cutlass, "__version__", "unknown")


def entry_key(spec: KernelSpec) -> str:
    """Disk identity: spec (arch included) + DSL version + package source fingerprint."""
    payload = json.dumps(
        {"spec": spec.key(), "dsl": dsl_version(), "sources": source_fingerprint()},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def entry_name(spec: KernelSpec) -> str:
    return f"cq_{spec.family}_{entry_key(spec)[:24]}"


def entry_metadata(spec: KernelSpec) -> dict:
    """What an entry's metadata must hold to be loaded for ``spec`` by this install."""
    return {
        "spec": spec.key(),
        "family": spec.family,
        "arch": spec.arch,
        "dsl": dsl_version(),
        "sources": source_fingerprint(),
    }


# --------------------------------------------------------------------------- rendered modules

_PRIVATE_SRC: Path | None = None


def _source_dir() -> Path:
    """``<cache dir>/src`` when the cache is writable, else a private temporary directory
    (removed at exit): the DSL needs the rendered module in a real file either way."""
    global _PRIVATE_SRC
    root = cache_dir()
    if cache.directory_mode(root) == "rw":
        with contextlib.suppress(OSError):  # someone may have removed it; a failure shows later
            (root / "src").mkdir(parents=True, exist_ok=True)
        return root / "src"
    if _PRIVATE_SRC is None:
        import atexit
        import shutil
        import tempfile

        _PRIVATE_SRC = Path(tempfile.mkdtemp(prefix="cutequant-src-"))
        atexit.register(shutil.rmtree, _PRIVATE_SRC, ignore_errors=True)
    return _PRIVATE_SRC


def load_module(spec: KernelSpec):
    """Render the spec's template to ``<source dir>/<name>.py`` and import it."""
    name = module_name(spec)
    with _LOCK:
        if name in _MODULES:
            return _MODULES[name]
        source = render(spec)
        path = _source_dir() / f"{name}.py"
        try:
            if not path.is_file() or path.read_text() != source:
                cache.write_file(path, source.encode())
        except OSError as exc:  # a full disk or a directory that went away since the probe
            cache.stop_writing(cache_dir(), exc)
            path = _source_dir() / f"{name}.py"
            cache.write_file(path, source.encode())
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        _MODULES[name] = module
        return module


# --------------------------------------------------------------------------- compile + caches


def compile_spec(spec: KernelSpec, extra_options: str = ""):
    """Compile a spec from scratch (no cache lookup). Works without a GPU."""
    import cutlass.cute as cute

    module = load_module(spec)
    with _LOCK:
        stats.compiles += 1
        compiled = cute.compile(
            module.launch,
            *module.compile_args(),
            options=f"--gpu-arch {spec.arch} --enable-tvm-ffi {extra_options}".strip(),
        )
    check_tvm_ffi(compiled)
    return compiled


def check_tvm_ffi(fn) -> None:
    """Every kernel is called through the TVM-FFI convention (plain Python ints and floats in,
    ~2 us per call): a compiled object of another kind (an options form the DSL ignored, a
    non-TVM-FFI disk entry) would take the DSL's generic path at ~100 us per call."""
    kind = type(fn).__name__
    if "TVMFFI" not in kind and not kind.startswith("Function"):
        raise RuntimeError(f"cutequant: expected a TVM-FFI kernel, got {type(fn)!r}")


def _load_entry(entry: cache.Entry, expected: dict, *, replace: bool):
    """The entry's kernel if it passes every check and loads; else None, after one warning
    (and removing the entry when it is to be replaced)."""
    if not entry.exists():
        return None
    problem = cache.check_entry(entry, expected)
    if problem is None:
        try:
            fn = _dso.load(entry.obj, entry.name)
            check_tvm_ffi(fn)
            return fn
        except Exception as exc:  # a sound file the loader still rejects: recompile
            problem = f"does not load: {type(exc).__name__}: {exc}"
    stats.invalid_entries += 1
    action = "recompiling and replacing it" if replace else "compiling into memory"
    cache.warn(f"cutequant: cache entry {entry.obj} is invalid ({problem}); {action}")
    if replace:
        with contextlib.suppress(OSError):  # write_entry's renames replace it anyway
            entry.remove()
    return None


@dataclass(frozen=True)
class Outcome:
    """How ``resolve`` got a kernel: "cached" (a valid disk entry), "compiled" (and written to
    the disk cache), "memory" (compiled, disk cache off or read-only), "failed" (compiled but
    the write failed: ``detail`` says why)."""

    status: str
    detail: str = ""


def resolve(spec: KernelSpec, *, use_disk: bool | None = None) -> tuple[Any, Outcome]:
    """A kernel for ``spec`` from the disk cache or a fresh compile (never the memory cache)."""
    if use_disk is None:
        use_disk = disk_cache_enabled()
    root = cache_dir()
    mode = cache.directory_mode(root) if use_disk else "off"
    if mode == "off":
        return compile_spec(spec), Outcome("memory", "disk cache off or unusable")
    entry = cache.Entry(root, entry_name(spec))
    expected = entry_metadata(spec)
    writable = mode == "rw"
    # the lock is not held while compiling: one lock per directory, and compiles of other
    # kernels by other processes (precompile --jobs) must not wait for this one
    with cache.directory_lock(root) if writable else contextlib.nullcontext():
        fn = _load_entry(entry, expected, replace=writable)
    if fn is not None:
        stats.disk_loads += 1
        return fn, Outcome("cached")
    compiled = compile_spec(spec)
    if not writable:
        return compiled, Outcome("memory", f"cache directory {root} is not writable")
    with cache.directory_lock(root):
        try:
            cache.write_entry(
                entry,
                lambda path: _dso.export_shared(compiled, entry.name, Path(path)),
                expected,
            )
        except OSError as exc:  # full disk, permissions: the same for every later write
            stats.write_failures += 1
            cache.stop_writing(root, exc)
            return compiled, Outcome("failed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the DSL's export itself failed
            stats.write_failures += 1
            cache.warn(f"cutequant: exporting {entry.name} failed ({exc}); kept in memory")
            return compiled, Outcome("failed", f"export failed: {type(exc).__name__}: {exc}")
        stats.disk_writes += 1
        loaded = _load_entry(entry, expected, replace=True)
    if loaded is None:
        stats.write_failures += 1
        return compiled, Outcome("failed", "the written entry did not load back")
    return loaded, Outcome("compiled")


def get_kernel(spec: KernelSpec, *, use_disk: bool | None = None) -> Callable[..., Any]:
    """Launcher for ``spec``: memory cache, then disk cache, then a fresh compile."""
    key = spec  # frozen dataclass: hashable, equal iff every field (arch included) is equal
    fn = _MEMORY.get(key)
    if fn is not None:
        stats.memory_hits += 1
        return fn
    with _LOCK:
        fn = _MEMORY.get(key)
        if fn is None:
            fn, _ = resolve(spec, use_disk=use_disk)
            _MEMORY[key] = fn
        return fn


def precompile(spec: KernelSpec) -> Outcome:
    """Make sure the disk cache holds a valid entry for ``spec`` (``cutequant precompile``).
    Never raises: a compile error is a "failed" outcome whose detail names it."""
    try:
        _, outcome = resolve(spec, use_disk=True)
    except Exception as exc:
        return Outcome("failed", f"{type(exc).__name__}: {exc}")
    if outcome.status == "memory":
        return Outcome("failed", outcome.detail)
    return outcome


def clear_memory_cache() -> None:
    """Forget compiled kernels (and their launchers, and the replay records holding them): the
    next call loads or compiles again."""
    from cutequant import _launch, replay

    with _LOCK:
        _MEMORY.clear()
        _launch._KERNELS.clear()
        replay.invalidate()
