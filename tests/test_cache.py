"""CPU: the disk cache. Entries written without a GPU load back; every kind of damage is
caught, warned about, recompiled and replaced; an unusable directory costs one warning and
kernels stay in memory; files honour the umask; several processes share one directory."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings

import cutlass
import pytest
from cubins import embedded_cubin_archs

from cutequant import cache, cli, jit
from cutequant.codegen import specs as S

SPEC = S.GroupTablesSpec(splits_int64=True)  # the quickest kernel to compile
OTHER = S.GroupTablesSpec(splits_int64=False)


def _entry(spec=SPEC) -> cache.Entry:
    return cache.Entry(jit.cache_dir(), jit.entry_name(spec))


def _counts():
    s = jit.stats
    return s.compiles, s.disk_writes, s.disk_loads, s.invalid_entries


def _delta(before):
    return tuple(a - b for a, b in zip(_counts(), before, strict=True))


def _cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]


# --------------------------------------------------------------------------- write + read back


def test_cpu_write_then_read_back(cache_root):
    before = _counts()
    first = jit.get_kernel(SPEC, use_disk=True)
    assert _delta(before) == (1, 1, 0, 0)  # compiled and written (then loaded back from it)
    assert jit.get_kernel(SPEC, use_disk=True) is first  # memory hit

    entry = _entry()
    data = entry.obj.read_bytes()
    meta = json.loads(entry.meta.read_text())
    assert meta == {
        "format": cache.FORMAT,
        "function": entry.name,
        "family": "group_tables",
        "arch": "sm_90a",
        "spec": SPEC.key(),
        "dsl": cutlass.__version__,
        "sources": jit.source_fingerprint(),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert embedded_cubin_archs(data) == ["sm_90a"]
    assert f"__tvm_ffi_{entry.name}".encode() in data  # the TVM-FFI entry point load_module finds
    assert cache.check_entry(entry, jit.entry_metadata(SPEC)) is None

    jit.clear_memory_cache()
    before = _counts()
    again = jit.get_kernel(SPEC, use_disk=True)
    assert _delta(before) == (0, 0, 1, 0), "recompiled although the disk held a valid entry"
    assert type(again).__name__ == "Function" and again is not first  # a tvm_ffi.Function
    assert entry.obj.read_bytes() == data  # a load never rewrites the entry


def test_precompile_outcomes(cache_root):
    assert jit.precompile(SPEC) == jit.Outcome("compiled")
    assert jit.precompile(SPEC) == jit.Outcome("cached")
    _entry().obj.write_bytes(b"")
    with pytest.warns(cache.CacheWarning, match="invalid"):
        assert jit.precompile(SPEC) == jit.Outcome("compiled")
    assert jit.precompile(SPEC) == jit.Outcome("cached")


# --------------------------------------------------------------------------- damaged entries


def _flip_inside(path):
    data = bytearray(path.read_bytes())
    for at in (len(data) // 3, len(data) // 2, 2 * len(data) // 3):
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))


def _edit_meta(**changes):
    def damage(entry):
        meta = json.loads(entry.meta.read_text())
        meta.update(changes)
        entry.meta.write_text(json.dumps(meta))

    return damage


def _dir_instead(path):
    path.unlink()
    path.mkdir()
    (path / "junk").write_text("x")


DAMAGE = {
    "truncated object": (
        lambda e: e.obj.write_bytes(e.obj.read_bytes()[:2000]),
        "bytes, metadata says",
    ),
    "bytes flipped inside the object": (lambda e: _flip_inside(e.obj), "checksum mismatch"),
    "same size, other object": (
        lambda e: e.obj.write_bytes(bytes(len(e.obj.read_bytes()))),
        "checksum mismatch",
    ),
    "empty object": (lambda e: e.obj.write_bytes(b""), "0 bytes"),
    "directory instead of the object": (
        lambda e: _dir_instead(e.obj),
        "object file is a directory",
    ),
    "object missing": (lambda e: e.obj.unlink(), "object file is missing"),
    "metadata of another spec": (_edit_meta(spec=OTHER.key()), "metadata 'spec'"),
    "metadata of another arch": (_edit_meta(arch="sm_100a"), "metadata 'arch'"),
    "metadata of another DSL version": (_edit_meta(dsl="0.0.1"), "metadata 'dsl'"),
    "metadata of another source tree": (_edit_meta(sources="0" * 64), "metadata 'sources'"),
    "metadata with a wrong checksum": (_edit_meta(sha256="0" * 64), "checksum mismatch"),
    "metadata of another format": (_edit_meta(format=0), "metadata 'format'"),
    "metadata not JSON": (lambda e: e.meta.write_text("{not json"), "metadata unreadable"),
    "metadata not an object": (lambda e: e.meta.write_text("[1, 2]"), "not a JSON object"),
    "empty metadata": (lambda e: e.meta.write_bytes(b""), "metadata unreadable"),
    "directory instead of the metadata": (
        lambda e: _dir_instead(e.meta),
        "metadata file is a directory",
    ),
    "metadata missing": (lambda e: e.meta.unlink(), "metadata file is missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_damaged_entry_is_warned_recompiled_and_replaced(cache_root, damage):
    apply, reason = DAMAGE[damage]
    jit.precompile(SPEC)
    entry = _entry()
    good = entry.obj.read_bytes()
    apply(entry)
    problem = cache.check_entry(entry, jit.entry_metadata(SPEC))
    assert problem is not None and reason in problem, problem

    jit.clear_memory_cache()
    before = _counts()
    with pytest.warns(cache.CacheWarning, match="invalid") as caught:
        fn = jit.get_kernel(SPEC, use_disk=True)
    messages = _cache_warnings(caught)
    assert len(messages) == 1 and reason in messages[0], messages
    assert _delta(before) == (1, 1, 0, 1)  # found invalid, recompiled, rewritten
    assert type(fn).__name__ == "Function"
    assert cache.check_entry(entry, jit.entry_metadata(SPEC)) is None  # replaced, valid
    assert entry.obj.is_file() and entry.meta.is_file()
    assert embedded_cubin_archs(entry.obj.read_bytes()) == embedded_cubin_archs(good)

    jit.clear_memory_cache()
    before = _counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the replaced entry loads without a warning
        jit.get_kernel(SPEC, use_disk=True)
    assert _delta(before) == (0, 0, 1, 0)


# --------------------------------------------------------------------------- unusable directory


def _memory_only_once(root_problem: str):
    """Two kernels with the cache unusable: one warning naming the problem, both compiled,
    nothing loaded from or written to disk."""
    before = _counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = jit.get_kernel(SPEC)
        b = jit.get_kernel(OTHER)
    messages = _cache_warnings(caught)
    assert len(messages) == 1 and root_problem in messages[0], messages
    assert _delta(before)[:3] == (2, 0, 0)
    assert type(a).__name__ == type(b).__name__ == "TVMFFIJitCompiledFunctionWithKwargs"


def test_cache_path_under_a_file(tmp_path, cache_root, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(blocker / "cache"))
    _memory_only_once("unusable (NotADirectoryError")
    assert blocker.read_text() == "not a directory"


def test_cache_dir_is_a_file(tmp_path, cache_root, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(blocker))
    _memory_only_once("unusable (")


def test_missing_parents_are_created(tmp_path, cache_root, monkeypatch):
    root = tmp_path / "not" / "there" / "yet"
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jit.get_kernel(SPEC)
    assert cache.check_entry(_entry(), jit.entry_metadata(SPEC)) is None


def _refuse_writes(errno_value):
    def refuse(directory):
        raise OSError(errno_value, os.strerror(errno_value))

    return refuse


@pytest.mark.parametrize("errno_name", ["EROFS", "EACCES", "ENOSPC"])
def test_unwritable_directory_serves_its_entries(cache_root, monkeypatch, errno_name):
    """Read-only mount, no permission, full disk (faked: the tests run as root, whom permission
    bits do not stop): valid entries still load, new kernels are compiled into memory."""
    jit.precompile(SPEC)
    cache.reset_state()
    jit.clear_memory_cache()
    monkeypatch.setattr(cache, "_probe_writable", _refuse_writes(getattr(errno, errno_name)))
    before = _counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jit.get_kernel(SPEC)
        jit.get_kernel(OTHER)
    messages = _cache_warnings(caught)
    assert len(messages) == 1 and "is not writable" in messages[0], messages
    assert _delta(before)[:3] == (1, 0, 1)  # SPEC loaded, OTHER compiled, nothing written
    assert not _entry(OTHER).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_permissions(cache_root):
    jit.precompile(SPEC)
    cache.reset_state()
    jit.clear_memory_cache()
    os.chmod(cache_root / "kernels", 0o555)
    try:
        with pytest.warns(cache.CacheWarning, match="not writable"):
            jit.get_kernel(OTHER)
        assert not _entry(OTHER).exists()
    finally:
        os.chmod(cache_root / "kernels", 0o755)


def test_disk_full_while_writing(cache_root, monkeypatch):
    """A write that fails for good (ENOSPC mid-export): one warning, the kernel is used from
    memory, and no further write is attempted in this process."""

    def full(entry, export, metadata):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "write_entry", full)
    before = _counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = jit.get_kernel(SPEC)
        b = jit.get_kernel(OTHER)
    messages = _cache_warnings(caught)
    assert len(messages) == 1 and "No space left on device" in messages[0], messages
    assert _delta(before)[:3] == (2, 0, 0)
    assert jit.stats.write_failures >= 1
    assert callable(a) and callable(b)
    assert cache.directory_mode(cache_root) == "ro"


def test_cache_dir_removed_while_running(cache_root):
    """`rm -rf` of the cache directory under a running process: the next kernel is written to a
    new directory, without a warning."""
    import shutil

    jit.get_kernel(SPEC)
    shutil.rmtree(cache_root)
    jit._MODULES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jit.get_kernel(OTHER)
    assert cache.check_entry(_entry(OTHER), jit.entry_metadata(OTHER)) is None


def test_disable_env_writes_nothing(cache_root, monkeypatch):
    monkeypatch.setenv("CUTEQUANT_DISABLE_DISK_CACHE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jit.get_kernel(SPEC)
    assert not (cache_root / "kernels").exists()


def test_cache_dir_and_disable_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(tmp_path / "c"))
    assert jit.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("CUTEQUANT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert jit.cache_dir() == tmp_path / "x" / "cutequant"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jit.cache_dir() == tmp_path / "home" / ".cache" / "cutequant"
    for value, enabled in (("1", False), ("TRUE", False), ("yes", False), ("0", True), ("", True)):
        monkeypatch.setenv("CUTEQUANT_DISABLE_DISK_CACHE", value)
        assert jit.disk_cache_enabled() is enabled, value


def test_entry_key_covers_dsl_version_and_sources(monkeypatch):
    spec = S.GroupAmaxSpec()
    key = jit.entry_key(spec)
    monkeypatch.setattr(jit, "dsl_version", lambda: "9.9.9")
    assert jit.entry_key(spec) != key
    monkeypatch.undo()
    monkeypatch.setattr(jit, "_FINGERPRINT", "0" * 64)
    assert jit.entry_key(spec) != key
    monkeypatch.undo()
    assert jit.entry_key(spec) == key
    assert jit.entry_key(S.GroupAmaxSpec(rht=False)) != key


# --------------------------------------------------------------------------- shared directories


@pytest.mark.parametrize("umask", [0o002, 0o027])
def test_files_honour_the_umask(cache_root, umask):
    jit._MODULES.clear()  # render the source file again
    old = os.umask(umask)
    try:
        jit.get_kernel(SPEC)
    finally:
        os.umask(old)
    files = [*(cache_root / "kernels").iterdir(), *(cache_root / "src").iterdir()]
    names = sorted(p.name for p in files)
    entry = _entry()
    assert len(names) == 4, names  # object, metadata, the directory's one lock, the source
    assert {entry.obj.name, entry.meta.name, ".lock"} <= set(names)
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
    for d in (cache_root, cache_root / "kernels", cache_root / "src"):
        assert d.stat().st_mode & 0o777 == 0o777 & ~umask, d


def test_one_lock_file_and_no_temporary_files_left(cache_root):
    for spec in cli.all_specs()[:4]:
        jit.precompile(spec)
    kernels = sorted(p.name for p in (cache_root / "kernels").iterdir())
    assert [n for n in kernels if n.startswith(".")] == [".lock"]
    assert len(kernels) == 1 + 2 * 4
    assert cache.stray_files(cache_root) == []


_WORKER = textwrap.dedent(
    """
    import json, sys, time, warnings
    from pathlib import Path
    from cutequant import cli, jit
    start = Path(sys.argv[1])
    while not start.exists():
        time.sleep(0.01)
    specs = cli.all_specs()[:3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = [jit.precompile(s).status for s in specs]
        jit.clear_memory_cache()
        kinds = [type(jit.get_kernel(s)).__name__ for s in specs]
    print(json.dumps({"outcomes": outcomes, "kinds": kinds,
                      "warnings": [str(w.message) for w in caught]}))
    """
)


def test_processes_sharing_one_directory(cache_root, tmp_path):
    """Four processes precompile and then load the same kernels at once: each gets working
    kernels without a warning, and the directory ends with exactly those valid entries."""
    start = tmp_path / "go"
    env = {**os.environ, "CUTEQUANT_CACHE_DIR": str(cache_root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    start.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert set(r["outcomes"]) <= {"compiled", "cached"}, r
        assert r["kinds"] == ["Function"] * 3, r  # every kernel loaded from a disk entry
        assert r["warnings"] == [], r
    current = {"dsl": jit.dsl_version(), "sources": jit.source_fingerprint()}
    reports = cache.inspect_entries(cache_root, current)
    assert [r.status for r in reports] == ["ok"] * 3
    assert cache.stray_files(cache_root) == []
    assert sorted(p.name for p in (cache_root / "kernels").iterdir() if p.name.startswith(".")) == [
        ".lock"
    ]
