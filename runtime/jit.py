"""JIT compilation and the two kernel caches (in memory, on disk).

``get_kernel(spec)`` returns a callable launcher for a spec:

1. in-memory dict keyed by the spec (arch included);
2. disk: ``<cache dir>/kernels/<name>.o`` written with ``export_to_c`` and loaded with
   ``cute.runtime.load_module``; the entry key hashes the spec, the nvidia-cutlass-dsl version and
   a fingerprint of every source file of this package, so an upgrade or an edit never loads a
   stale binary. Writes go to a temporary directory and are renamed into place under an
   exclusive file lock; an entry that fails to load is deleted and recompiled;
3. otherwise: render the template, import the module, ``cute.compile`` it for the spec's arch.

Cache directory: ``$CUTEQUANT_CACHE_DIR``, else ``$XDG_CACHE_HOME/cutequant``, else
``~/.cache/cutequant``. ``CUTEQUANT_DISABLE_DISK_CACHE=1`` turns the disk layer off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutequant.codegen import module_name, render
from cutequant.codegen.specs import KernelSpec

_LOCK = threading.RLock()
_MEMORY: dict[KernelSpec, Callable[..., Any]] = {}
_MODULES: dict[str, Any] = {}


@dataclass
class CacheStats:
    """Counters for tests and ``cutequant cache-info``."""

    compiles: int = 0
    disk_loads: int = 0
    disk_writes: int = 0
    memory_hits: int = 0
    export_failures: int = 0


stats = CacheStats()


def cache_dir() -> Path:
    if os.environ.get("CUTEQUANT_CACHE_DIR"):
        return Path(os.environ["CUTEQUANT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cutequant"


def disk_cache_enabled() -> bool:
    return os.environ.get("CUTEQUANT_DISABLE_DISK_CACHE", "0") not in ("1", "true", "yes")


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


# --------------------------------------------------------------------------- rendered modules


def load_module(spec: KernelSpec):
    """Render the spec's template to ``<cache dir>/src/<name>.py`` and import it.

    The source must live in a real file: the DSL reads the source of ``@cute.jit`` functions.
    """
    name = module_name(spec)
    with _LOCK:
        if name in _MODULES:
            return _MODULES[name]
        source = render(spec)
        src_dir = cache_dir() / "src"
        src_dir.mkdir(parents=True, exist_ok=True)
        path = src_dir / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            _atomic_write(path, source.encode())
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        _MODULES[name] = module
        return module


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


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


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _disk_paths(spec: KernelSpec) -> tuple[Path, Path, Path]:
    d = cache_dir() / "kernels"
    name = entry_name(spec)
    return d / f"{name}.o", d / f"{name}.json", d / f"{name}.lock"


def _try_load(obj_path: Path, name: str):
    import cutlass.cute as cute

    if not obj_path.exists():
        return None
    try:
        fn = cute.runtime.load_module(str(obj_path), enable_tvm_ffi=True)[name]
        check_tvm_ffi(fn)
        return fn
    except Exception as exc:  # corrupt or truncated entry: drop it, recompile
        warnings.warn(f"cutequant: dropping unreadable cache entry {obj_path}: {exc}", stacklevel=3)
        with contextlib.suppress(OSError):
            obj_path.unlink()
        return None


def _export(compiled, spec: KernelSpec, obj_path: Path, meta_path: Path) -> bool:
    name = entry_name(spec)
    tmp = Path(tempfile.mkdtemp(dir=obj_path.parent, prefix=".export-"))
    try:
        compiled.export_to_c(str(tmp / f"{name}.o"), function_name=name)
        os.replace(tmp / f"{name}.o", obj_path)
        meta = {"spec": spec.key(), "dsl": dsl_version(), "sources": source_fingerprint()}
        _atomic_write(meta_path, json.dumps(meta, indent=1).encode())
        stats.disk_writes += 1
        return True
    except Exception as exc:  # e.g. no CUDA driver on a CPU-only machine
        stats.export_failures += 1
        warnings.warn(f"cutequant: disk cache write failed ({exc}); kept in memory", stacklevel=3)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def get_kernel(spec: KernelSpec, *, use_disk: bool | None = None) -> Callable[..., Any]:
    """Launcher for ``spec``: memory cache, then disk cache, then a fresh compile."""
    key = spec  # frozen dataclass: hashable, equal iff every field (arch included) is equal
    fn = _MEMORY.get(key)
    if fn is not None:
        stats.memory_hits += 1
        return fn
    if use_disk is None:
        use_disk = disk_cache_enabled()
    with _LOCK:
        fn = _MEMORY.get(key)
        if fn is not None:
            return fn
        if not use_disk:
            fn = compile_spec(spec)
        else:
            obj_path, meta_path, lock_path = _disk_paths(spec)
            name = entry_name(spec)
            with _file_lock(lock_path):
                fn = _try_load(obj_path, name)
                if fn is not None:
                    stats.disk_loads += 1
                else:
                    compiled = compile_spec(spec)
                    fn = compiled
                    if _export(compiled, spec, obj_path, meta_path):
                        loaded = _try_load(obj_path, name)
                        fn = loaded if loaded is not None else compiled
        _MEMORY[key] = fn
        return fn


def clear_memory_cache() -> None:
    """Forget compiled kernels (and their launchers): the next call loads or compiles again."""
    from cutequant import _launch

    with _LOCK:
        _MEMORY.clear()
        _launch._KERNELS.clear()
