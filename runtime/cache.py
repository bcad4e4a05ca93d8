"""The on-disk kernel cache: where it lives, whether it can be used, and its entries.

Layout of a cache directory (``cache_dir()``)::

    kernels/<name>.so     the kernel: ``export_to_c``'s TVM-FFI object linked into a shared
                          library (``cutequant._dso``: loaded without importing the DSL)
    kernels/<name>.json   its metadata: spec, arch, DSL version, source fingerprint, sha256
    kernels/.lock         one lock file for the whole directory (never one per entry)
    src/<module>.py       rendered template modules (the DSL reads ``@cute.jit`` source files)

An entry is trusted only when its metadata parses, names this install's spec / arch / DSL
version / source fingerprint, and the object's size and sha256 match: a damaged object, wrong
metadata or anything else in its place is reported by ``check_entry`` and the caller recompiles
and replaces it. Files are written into a private temporary directory and renamed into place
(object first, metadata last), so a reader never sees a half-written file; the lock only keeps
two processes from checking and replacing the same entry at once, so when it cannot be taken
(a foreign lock file on a shared directory, a timeout) the cache carries on without it.

Every file is created with the permissions the umask gives (``0o666 & ~umask``), so a group
sharing a directory with ``umask 002`` can read and replace each other's entries.

A directory that cannot be used (missing parent that cannot be created, a file in the way,
not writable, disk full) is reported with ONE warning per directory and process; the caller
then keeps kernels in memory. A directory that is readable but not writable still serves
its valid entries (a cache precompiled on a build box and mounted read-only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# bump when the entry or metadata layout changes: older entries then read as invalid
# (2: the kernel is a linked shared library, was an object file)
FORMAT = 2
LOCK_TIMEOUT_S = 120.0  # longer than any single export; past it the cache goes on unlocked
_TEMP_PREFIX = ".tmp-"

_STATE_LOCK = threading.Lock()
_MODES: dict[Path, str] = {}  # cache root -> "rw" | "ro" | "off" (probed once per process)
_WARNED: set[str] = set()


def cache_dir() -> Path:
    """``$CUTEQUANT_CACHE_DIR``, else ``$XDG_CACHE_HOME/cutequant``, else ``~/.cache/cutequant``."""
    if os.environ.get("CUTEQUANT_CACHE_DIR"):
        return Path(os.environ["CUTEQUANT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cutequant"


def disk_cache_enabled() -> bool:
    """False when ``CUTEQUANT_DISABLE_DISK_CACHE`` is 1 / true / yes (any case)."""
    value = os.environ.get("CUTEQUANT_DISABLE_DISK_CACHE", "0").strip().lower()
    return value not in ("1", "true", "yes")


class CacheWarning(UserWarning):
    """A cache problem that was handled (the op still runs); filter on this class to silence."""


def warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=4)


def warn_once(key: str, message: str) -> None:
    """One warning per ``key`` and process (a training loop must not print one per call)."""
    with _STATE_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warn(message)


def reset_state() -> None:
    """Forget probed directories and issued warnings (tests; a repaired directory)."""
    with _STATE_LOCK:
        _MODES.clear()
        _WARNED.clear()


# --------------------------------------------------------------------------- permissions


def _umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads creating files
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of every file the cache creates: what ``open()`` would give (0o666 & ~umask)."""
    return 0o666 & ~_umask()


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file in the same directory, renamed),
    with the umask's permissions (mkstemp alone would leave it 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_TEMP_PREFIX}{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, file_mode())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _replace(src: str | Path, dst: Path) -> None:
    """``os.replace`` that also clears a directory standing where a file must go."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)


# --------------------------------------------------------------------------- directory state


def _probe_writable(directory: Path) -> None:
    """Raise OSError unless a file can be created in ``directory`` (permission bits, a
    read-only mount, a full disk: creating and writing one byte shows them all)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{_TEMP_PREFIX}probe.")
    try:
        os.write(fd, b"\0")
    finally:
        os.close(fd)
        os.unlink(tmp)


def probe(root: Path, *, create: bool = True) -> tuple[str, str]:
    """(mode, reason) of a cache directory: "rw" usable, "ro" only readable, "off" unusable,
    and with ``create=False`` (inspecting, not using it) "missing" for one not made yet."""
    kernels = root / "kernels"
    if not create and not root.exists():
        for parent in root.parents:
            if parent.exists():
                if parent.is_dir():
                    return "missing", ""
                return "off", f"NotADirectoryError: {parent} is not a directory"
        return "missing", ""
    if not create and not kernels.is_dir():
        if not root.is_dir():
            return "off", f"NotADirectoryError: {root} is not a directory"
        writable = os.access(root, os.W_OK | os.X_OK)
        return ("rw", "") if writable else ("ro", "PermissionError: not writable")
    try:
        if create:
            kernels.mkdir(parents=True, exist_ok=True)
            (root / "src").mkdir(exist_ok=True)
        _probe_writable(kernels)
        return "rw", ""
    except OSError as exc:
        reason = f"{type(exc).__name__}: {exc.strerror or exc}"
        if kernels.is_dir() and os.access(kernels, os.R_OK | os.X_OK):
            return "ro", reason
        return "off", reason


def directory_mode(root: Path | None = None) -> str:
    """``"rw"``, ``"ro"`` or ``"off"`` for ``root`` (default: ``cache_dir()``), probed once per
    process; ``"off"`` without a warning when the disk cache is disabled by the environment."""
    if not disk_cache_enabled():
        return "off"
    root = cache_dir() if root is None else root
    with _STATE_LOCK:
        mode = _MODES.get(root)
    if mode is not None:
        return mode
    mode, reason = probe(root)
    with _STATE_LOCK:
        _MODES[root] = mode
    if mode == "ro":
        warn_once(
            f"ro:{root}",
            f"cutequant: kernel cache directory {root} is not writable ({reason}); its valid "
            "entries are used, new kernels are kept in memory only",
        )
    elif mode == "off":
        warn_once(
            f"off:{root}",
            f"cutequant: kernel cache directory {root} is unusable ({reason}); kernels are "
            "compiled into memory only (set CUTEQUANT_CACHE_DIR to a writable directory, or "
            "CUTEQUANT_DISABLE_DISK_CACHE=1 to silence this)",
        )
    return mode


def stop_writing(root: Path, exc: OSError) -> None:
    """A write failed (disk full, read-only file system, permissions, the directory gone): such
    causes do not go away within a process, so warn once and treat the directory as read-only
    from now on rather than fail and warn again for every kernel."""
    with _STATE_LOCK:
        if _MODES.get(root) == "rw":
            _MODES[root] = "ro"
    warn_once(
        f"write:{root}",
        f"cutequant: cannot write to kernel cache directory {root} "
        f"({type(exc).__name__}: {exc.strerror or exc}); new kernels are kept in memory only",
    )


@contextlib.contextmanager
def directory_lock(root: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[bool]:
    """Hold ``<root>/kernels/.lock`` (yields True), or go on without it (yields False) when it
    cannot be created or taken in ``timeout`` seconds: atomic renames and checksums keep the
    entries sound either way; the lock only avoids needless replacements."""
    import filelock

    lock = filelock.FileLock(str(root / "kernels" / ".lock"), timeout=timeout, mode=file_mode())
    try:
        (root / "kernels").mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except (filelock.Timeout, OSError) as exc:
        warn_once(
            f"lock:{root}",
            f"cutequant: cannot lock kernel cache directory {root} ({exc}); going on without",
        )
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """One kernel's pair of files in a cache directory."""

    root: Path
    name: str

    @property
    def obj(self) -> Path:
        return self.root / "kernels" / f"{self.name}.so"

    @property
    def meta(self) -> Path:
        return self.root / "kernels" / f"{self.name}.json"

    def exists(self) -> bool:
        return self.obj.exists() or self.meta.exists()

    def remove(self) -> None:
        for path in (self.obj, self.meta):
            with contextlib.suppress(FileNotFoundError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_metadata(entry: Entry) -> dict:
    """The entry's metadata; ValueError saying what is wrong with the file."""
    if not entry.meta.is_file():
        what = "a directory" if entry.meta.is_dir() else "missing"
        raise ValueError(f"metadata file is {what}")
    try:
        meta = json.loads(entry.meta.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"metadata unreadable ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError("metadata is not a JSON object")
    return meta


def check_entry(entry: Entry, expected: dict | None = None) -> str | None:
    """None if ``entry`` is sound, else why not. Sound: metadata of this format whose fields
    equal ``expected`` (when given), naming this entry's function, and an object file of the
    recorded size and sha256."""
    try:
        meta = read_metadata(entry)
    except ValueError as exc:
        return str(exc)
    wanted = {"format": FORMAT, "function": entry.name, **(expected or {})}
    for key, value in wanted.items():
        if meta.get(key) != value:
            return f"metadata {key!r} is {meta.get(key)!r}, expected {value!r}"
    if not entry.obj.is_file():
        return "object file is " + ("a directory" if entry.obj.is_dir() else "missing")
    try:
        size = entry.obj.stat().st_size
        if size != meta.get("size"):
            return f"object file has {size} bytes, metadata says {meta.get('size')}"
        digest = sha256_file(entry.obj)
    except OSError as exc:
        return f"object file unreadable ({exc})"
    if digest != meta.get("sha256"):
        return "object file checksum mismatch (damaged or replaced)"
    return None


def write_entry(entry: Entry, export, metadata: dict) -> None:
    """Write an entry: ``export(path)`` writes the object file; its size and sha256 are added
    to ``metadata``. Both files are made in a private temporary directory and renamed into
    place, the metadata last (a reader checks the object against it). Raises OSError."""
    kernels = entry.root / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)  # someone may have removed the directory
    tmp = Path(tempfile.mkdtemp(dir=kernels, prefix=_TEMP_PREFIX))
    try:
        obj = tmp / entry.obj.name
        export(obj)
        os.chmod(obj, file_mode())
        meta = {
            **metadata,
            "format": FORMAT,
            "function": entry.name,
            "size": obj.stat().st_size,
            "sha256": sha256_file(obj),
        }
        meta_tmp = tmp / entry.meta.name
        meta_tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.chmod(meta_tmp, file_mode())
        _replace(obj, entry.obj)
        _replace(meta_tmp, entry.meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- whole directory


@dataclass
class EntryReport:
    """One entry as ``cutequant cache list / verify`` shows it."""

    name: str
    size: int
    status: str  # "ok", "other install" (another DSL version or source tree) or "invalid"
    detail: str = ""
    meta: dict | None = None


def entries(root: Path) -> list[Entry]:
    """Every entry name with an object or a metadata file in ``root`` (temp files excluded)."""
    kernels = root / "kernels"
    if not kernels.is_dir():
        return []
    names = {
        p.stem
        for p in kernels.iterdir()
        if p.suffix in (".so", ".json") and not p.name.startswith(".")
    }
    return [Entry(root, n) for n in sorted(names)]


def inspect_entries(root: Path, current: dict) -> list[EntryReport]:
    """Check every entry; ``current`` holds this install's ``dsl`` and ``sources`` values."""
    out = []
    for entry in entries(root):
        problem = check_entry(entry)
        size = entry.obj.stat().st_size if entry.obj.is_file() else 0
        if problem is not None:
            out.append(EntryReport(entry.name, size, "invalid", problem))
            continue
        meta = read_metadata(entry)
        foreign = [k for k in ("dsl", "sources") if meta.get(k) != current.get(k)]
        status = "other install" if foreign else "ok"
        detail = ", ".join(f"{k} {str(meta.get(k))[:12]}" for k in foreign)
        out.append(EntryReport(entry.name, size, status, detail, meta))
    return out


def stray_files(root: Path) -> list[Path]:
    """Temporary files and directories left by a process that died while writing."""
    found = []
    for sub in ("kernels", "src"):
        d = root / sub
        if d.is_dir():
            found += sorted(p for p in d.iterdir() if p.name.startswith(_TEMP_PREFIX))
    return found


def remove_paths(paths) -> int:
    removed = 0
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed += 1
    return removed


def all_files(root: Path) -> list[Path]:
    """Every file the cache made in ``root`` (entries, the lock, sources, temporary files);
    other files a user keeps there are left alone."""
    out = []
    kernels, src = root / "kernels", root / "src"
    if kernels.is_dir():
        out += sorted(
            p
            for p in kernels.iterdir()
            if p.suffix in (".so", ".json") or p.name == ".lock" or p.name.startswith(_TEMP_PREFIX)
        )
    if src.is_dir():
        out += sorted(
            p for p in src.iterdir() if p.suffix == ".py" or p.name.startswith(_TEMP_PREFIX)
        )
    return out
