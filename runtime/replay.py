"""Replay of a checked call's launches: the eager fast path of the public ops (issue 18).

A call's host time is mostly Python: argument checks, split-list hashing, layout and spec
lookups, argument assembly (perf/host_overhead.py ``breakdown``: 18-45 us of a 26-70 us call on
an H200 host, the TVM-FFI launches 6-8 us each). Yet from one call to the next with the same
shapes, flags, split list and stream, only the tensors' addresses change. So the first such
call runs the checked path and *records* its launches (``recording``); the next ones look up
the record by a key of everything the checks looked at, and of the runtime's choices (the
RHT instruction), (``CallMemo``), re-check what the key
cannot hold (contiguity, alignment), allocate the outputs and relaunch the recorded kernels with
the new addresses (``Replay``).

Which launch arguments are addresses of the call's own tensors is found by value: an integer
argument inside one of the call's tensors (x, the outputs, a given amax or scale) is stored as
(tensor, byte offset); every other argument (sizes, flags, the runtime's tables, counters and
workspaces) is replayed as recorded. Runtime buffers a record refers to must outlive it: the
host split tables are held by the record's layout; counters and dummies live as long as the process;
anything the runtime replaces (a grown workspace, an evicted layout) or forgets (compiled
kernels: ``jit.clear_memory_cache``) bumps ``generation`` and every record made before is
dropped.

Device splits: the table kernel writes the call's tables into a buffer of the call's own
(``scratch``): a replay allocates a fresh one and relaunches the table kernel too. Not
recorded: a host split list seen for the first time (its tables are copied, not launched),
stochastic rounding without a given ``rng_state`` (a fresh state per call) and calls with no
rows; those always take the checked path.
"""

from __future__ import annotations

import os
import threading

import torch

# ``CUTEQUANT_REPLAY=0`` turns the fast path off (every call takes the checked path).
enabled = os.environ.get("CUTEQUANT_REPLAY", "1") != "0"

# Bumped by the runtime whenever a buffer a record may refer to is replaced or may be freed.
generation = 0


def invalidate() -> None:
    """Drop every record (a runtime buffer was replaced)."""
    global generation
    generation += 1


_LOCAL = threading.local()


class recording:
    """Context: collect the ``_launch.run`` calls made inside it, as (fn, args, stream), in
    ``launches``. ``taint()`` inside it marks the call as not replayable (GPU work of its own
    that is no recorded launch: per-call tables, device splits)."""

    def __enter__(self) -> recording:
        self.outer = getattr(_LOCAL, "active", None)  # a recording around this one sees all too
        self.launches: list = []
        self.scratch: list = []  # per-call runtime buffers (``scratch``)
        self.tainted = False
        _LOCAL.active = self
        return self

    def __exit__(self, *exc) -> None:
        _LOCAL.active = self.outer
        if self.outer is not None:
            self.outer.launches.extend(self.launches)
            self.outer.scratch.extend(self.scratch)
            self.outer.tainted |= self.tainted

    def replayable(self, m_rows: int) -> bool:
        """Whether the recorded call may be replayed: it launched something, has rows and made
        no GPU work of its own that a replay would not repeat (a first sighting's table copy:
        ``taint``)."""
        return not self.tainted and m_rows > 0 and bool(self.launches)


def recorder() -> list | None:
    """The list the current thread's launches are recorded into, or None."""
    active = getattr(_LOCAL, "active", None)
    return None if active is None else active.launches


def scratch(buf: torch.Tensor) -> None:
    """``buf`` (made by the runtime for this call only, e.g. device splits' tables) is written
    and read by the call's kernels: a replay allocates a fresh one of the same size (returned by
    ``Replay.launch``) and points the recorded arguments into it."""
    active = getattr(_LOCAL, "active", None)
    if active is not None:
        active.scratch.append(buf)


def taint() -> None:
    """The call being recorded (if any) does GPU work a replay would not repeat."""
    active = getattr(_LOCAL, "active", None)
    if active is not None:
        active.tainted = True


# Device addresses are above 4 GiB on every CUDA platform (UVA); sizes and flags are far below.
_MIN_ADDRESS = 1 << 32


class Replay:
    """Recorded launches whose arguments point into the call's tensors (``bases``, in the order
    the caller passes them to ``launch``)."""

    __slots__ = ("launches", "generation", "scratch", "_run")

    def __init__(self, launches: list, bases: list[torch.Tensor | None], scratch=()):
        # per-call runtime buffers: bases after the caller's, allocated anew by ``launch``
        self.scratch = tuple((t.numel(), t.dtype) for t in scratch)
        bases = [*bases, *scratch]
        spans = [  # (base index, address, bytes) of every base with storage
            (b, t.data_ptr(), t.numel() * t.element_size())
            for b, t in enumerate(bases)
            if t is not None and t.numel() > 0
        ]
        self.launches = []
        for fn, args, stream in launches:
            slots = []
            for i, a in enumerate(args):
                if type(a) is int and a >= _MIN_ADDRESS:
                    for b, p, n in spans:
                        if p <= a < p + n:
                            slots.append((i, b, a - p))
                            break
            self.launches.append((fn, list(args), tuple(slots), stream))
        self._run = _compile(self.launches, len(bases))
        self.generation = generation

    def launch(self, bases: tuple) -> list:
        """Relaunch with the addresses of ``bases`` (same order and meaning as recorded; the
        first is on the call's device); returns the call's fresh scratch buffers."""
        if not self.scratch:
            self._run(*bases)
            return []
        dev = bases[0].device
        fresh = [torch.empty(n, dtype=d, device=dev) for n, d in self.scratch]
        self._run(*bases, *fresh)
        return fresh


def _compile(launches: list, num_bases: int):
    """A function of the bases that makes the recorded launches: each base's address read once
    (a ``data_ptr()`` call costs ~0.15-0.3 us), the other arguments constants of its code.
    What it replaces, a loop that copied each launch's argument list and patched its slots,
    cost ~0.6 us of a two-launch call on a 2-core host (perf/probes/replay_cpu.py)."""
    names: dict = {}  # the functions and the arguments that are not ints, by name
    used = sorted({b for _, _, slots, _ in launches for _, b, _ in slots})
    lines = [f"def run({', '.join(f'b{b}' for b in range(num_bases))}):"]
    lines += [f"    p{b} = b{b}.data_ptr()" for b in used]
    for k, (fn, args, slots, stream) in enumerate(launches):
        names[f"f{k}"] = fn
        code = []
        for i, a in enumerate(args):
            if type(a) is int:
                code.append(repr(a))
            else:
                names[f"a{k}_{i}"] = a
                code.append(f"a{k}_{i}")
        for i, b, off in slots:
            code[i] = f"p{b} + {off}" if off else f"p{b}"
        if type(stream) is int:
            code.append(repr(stream))
        else:
            names[f"s{k}"] = stream
            code.append(f"s{k}")
        lines.append(f"    f{k}({', '.join(code)})")
    if not launches:
        lines.append("    pass")
    exec(compile("\n".join(lines), "<cutequant replay>", "exec"), names)  # noqa: S102
    return names["run"]


class CallMemo:
    """Records of one op, by call key; bounded (cleared when full: keys are per shape, split
    list, flags and stream, of which a training loop has a handful)."""

    __slots__ = ("entries",)
    LIMIT = 512

    def __init__(self):
        self.entries: dict = {}

    def get(self, key):
        hit = self.entries.get(key)
        if hit is not None and hit[0].generation != generation:
            self.entries.pop(key, None)
            return None
        return hit

    def put(self, key, value) -> None:
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        if key.__class__ is tuple:  # a stored key owns its split list (the caller's may change)
            key = tuple(k.frozen() if k.__class__ is SplitList else k for k in key)
        self.entries[key] = value


class SplitList:
    """A host split list in a record key. Hashing a 256-int tuple and the type checks of every
    value cost 8-10 us of a call on the GPU hosts, so a key hashes only (length, sum) and
    compares the lists by value on a lookup (one C-level list compare). A stored key holds its
    own copy (``frozen``) and the positions of its zeros: ``False == 0`` and ``1.0 == 1``, so a
    probe is equal only if its sum is an ``int`` (no float, no numpy scalar: ``split_key``)
    and it has ``int`` zeros where the stored list has zeros (the only places a bool can equal
    a valid split: ``True == 1`` is no multiple of 16)."""

    __slots__ = ("values", "zeros", "_hash")

    def __init__(self, values, total: int, zeros: tuple | None = None):
        self.values = values
        self.zeros = zeros  # None: a probe (the caller's list, not copied)
        self._hash = hash((len(values), total))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if other.__class__ is not SplitList:
            return NotImplemented
        a, b = self.values, other.values
        if a.__class__ is not b.__class__:  # a stored key holds a list: a tuple probe's copy
            a, b = list(a), list(b)
        if a != b:
            return False
        stored, probe = (self, b) if self.zeros is not None else (other, a)
        if stored.zeros is None:  # two probes (not a lookup the runtime makes)
            return all(v.__class__ is int for v in a) and all(v.__class__ is int for v in b)
        return all(probe[i].__class__ is int for i in stored.zeros)

    def frozen(self) -> SplitList:
        # a list of its own (never mutated): the probes are lists (``tensor.tolist()``), and a
        # list compares with a list without a copy of both (256 groups: ~1.5 us less a lookup)
        values = list(self.values)
        zeros = tuple(i for i, v in enumerate(values) if v == 0)
        return SplitList(values, sum(values), zeros)


# Up to this many groups a plain tuple keys faster than a SplitList (a 2-core host, per lookup:
# 8 groups 0.7 vs 1.3 us, 16: 1.1-1.5 vs 1.4, 64: 1.8-3.4 vs 1.8-2.0, 256: 4.5-10.3 vs 3.1-3.7).
_TUPLE_KEY_GROUPS = 16
_INT_ONLY = frozenset((int,))


def device_splits(splits) -> torch.Tensor | None:
    """The splits as a base of a record (a device tensor: the table kernel reads it), or None
    (a host list: its values are in the key)."""
    return splits if splits.__class__ is torch.Tensor else None


def split_key(splits) -> SplitList | tuple | None:
    """The key part of host ``splits``: a list / tuple of plain ints (short lists: as a tuple;
    longer ones: a ``SplitList``, whose values must sum to an ``int``), or None (anything else
    takes the checked path, which names what is wrong)."""
    cls = splits.__class__
    if cls is not list and cls is not tuple:
        return None
    if len(splits) <= _TUPLE_KEY_GROUPS:
        # only ints (1.0 == 1 and False == 0 hash alike; a list with anything else takes the
        # checked path): one C-level pass, no per-value Python
        if not _INT_ONLY.issuperset(map(type, splits)):
            return None
        return splits if cls is tuple else tuple(splits)
    try:
        total = sum(splits)
    except TypeError:
        return None
    if total.__class__ is not int:  # a float or a numpy scalar
        return None
    return SplitList(splits, total)


def call_key(x, splits, flags: tuple) -> tuple | None:
    """The record key of a call on ``x`` (a CUDA tensor) with ``splits`` (host: their values;
    a device tensor: its shape, dtype and device) and the op's other arguments ``flags``
    (hashable; their types are part of the key, so that ``1`` never stands for ``True``); None
    when the call cannot have a record."""
    if not enabled or x.__class__ is not torch.Tensor or not x.is_cuda:
        return None
    if splits.__class__ is torch.Tensor and splits.is_cuda:
        values = ("device", splits.shape, splits.dtype, splits.device)
    else:
        values = split_key(splits)
    if values is None:
        return None
    dev = x.device
    stream = torch._C._cuda_getCurrentRawStream(dev.index)
    return (x.shape, x.dtype, dev, stream, values, flags, tuple(map(type, flags)))


def find(memo: CallMemo, x, splits, flags: tuple, tensors: tuple = ()):
    """(key, record) of a call on ``x`` with host ``splits``, the op's other arguments
    ``flags`` and optional tensor arguments ``tensors`` (None or plain tensors; their shape,
    dtype and device join the key). The key is None when the call cannot have a record; the
    record is None unless one matches and the call passes what a key cannot hold (x, and each
    given tensor, contiguous; x 16-byte aligned)."""
    sigs = []
    for t in tensors:
        if t is None:
            sigs.append(None)
        elif t.__class__ is torch.Tensor:
            sigs.append((t.shape, t.dtype, t.device))
        else:
            return None, None
    key = call_key(x, splits, (*flags, *sigs))
    if key is None:
        return None, None
    hit = memo.entries.get(key)  # CallMemo.get, inline (a call less per replay)
    if hit is None:
        return key, None
    if hit[0].generation != generation:
        memo.entries.pop(key, None)
        return key, None
    # what the key cannot hold about x (a plain CUDA tensor: call_key): contiguous, 16-byte
    # aligned
    if not x.is_contiguous() or x.data_ptr() % 16:
        return key, None
    if splits.__class__ is torch.Tensor and not splits.is_contiguous():
        return key, None
    for t in tensors:
        if t is not None and not t.is_contiguous():
            return key, None
    return key, hit
