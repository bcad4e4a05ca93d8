"""Cached kernels as shared libraries, loaded without importing the DSL.

``cute.runtime.load_module`` loads an exported object through the DSL's MLIR execution engine,
which means importing ``cutlass`` first: 1.8-2.2 s on the GPU hosts, most of a fresh process's
first call (perf/host_overhead.py first-call). An exported TVM-FFI object linked into a shared
library (``cc -shared``; it is position independent) is an ordinary TVM-FFI library module:
``tvm_ffi.load_module`` opens it with ``dlopen`` once the CuTe DSL runtime library it calls into
is loaded, and ``module[name]`` is the same ``tvm_ffi.Function`` the DSL's loader returns.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path


def linker() -> str | None:
    """The C compiler driver used to link (``$CC``, else ``cc``, ``gcc``), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def link_shared(obj: Path, out: Path) -> None:
    """Link one exported object into a shared library (raises on failure)."""
    cc = linker()
    if cc is None:
        raise RuntimeError("no C compiler driver (cc / gcc / $CC) to link the kernel library")
    proc = subprocess.run(
        [cc, "-shared", "-o", str(out), str(obj)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"linking {obj.name} failed: {proc.stderr.strip()[-400:]}")


def export_shared(compiled, name: str, out: Path) -> None:
    """Export a compiled TVM-FFI kernel as the shared library ``out`` (through an object file
    beside it, removed after linking)."""
    obj = out.with_name(out.name + ".export.o")
    try:
        compiled.export_to_c(str(obj), function_name=name)
        link_shared(obj, out)
    finally:
        obj.unlink(missing_ok=True)


@functools.cache
def runtime_library() -> str:
    """Path of the CuTe DSL runtime library (``libcute_dsl_runtime.so``) of the installed
    nvidia-cutlass-dsl, found without importing it."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        found = sorted(Path(root).glob("cu*/lib/libcute_dsl_runtime.so"))
        if found:
            return str(found[0])
    raise RuntimeError("libcute_dsl_runtime.so not found in the nvidia-cutlass-dsl install")


_LOADED: list = []
_PRIVATE: list = []


def _private_dir() -> Path:
    if not _PRIVATE:
        import atexit
        import tempfile

        _PRIVATE.append(Path(tempfile.mkdtemp(prefix="cutequant-dso-")))
        atexit.register(shutil.rmtree, _PRIVATE[0], ignore_errors=True)
    return _PRIVATE[0]


def load(path: Path, name: str):
    """``tvm_ffi.Function`` ``name`` of the shared library at ``path``.

    A private copy is opened: ``dlopen`` maps the file, and a cache entry damaged in place
    (truncated, overwritten) while mapped would crash the process with SIGBUS; replacing the
    entry by rename, as the cache does, would not, but a private copy is safe against both."""
    import tvm_ffi

    if not _LOADED:  # its symbols resolve the library's undefined CuteDSLRT_* references
        _LOADED.append(ctypes.CDLL(runtime_library(), mode=ctypes.RTLD_GLOBAL))
    copy = _private_dir() / f"{len(_LOADED)}-{path.name}"
    _LOADED.append(copy)
    shutil.copyfile(path, copy)
    return tvm_ffi.load_module(str(copy))[name]
