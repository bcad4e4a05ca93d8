"""A call's outputs: carved from one allocation (``PackedOutputs``, eager calls) or as separate
tensors (``SeparateOutputs``, the torch.library ops), and which parts a call carves from its
outputs allocation (``carves_device_tables``, ``carves_amax``)."""

from __future__ import annotations

import torch

from cutequant import _launch, groups

# Sub-buffers of one output allocation start on this boundary (>= the kernels' 16-byte stores).
PACK_ALIGN = 256


class PackedOutputs:
    """A call's outputs carved from one allocation, viewed only when asked for.

    A torch allocation or view costs 3-6 us of CPU on the GPU hosts (perf/host_overhead.py
    primitives): one buffer whose sub-buffers the kernels address by offset, with the typed,
    shaped views built on first access, keeps a call's host time low. ``spans`` maps a name to
    (byte offset, shape, dtype), or None for an output that was not computed.
    """

    __slots__ = ("buf", "spans", "_views")

    def __init__(self, buf: torch.Tensor, spans: dict):
        self.buf, self.spans, self._views = buf, spans, {}

    @staticmethod
    def plan(parts: dict) -> tuple[int, dict]:
        """(total bytes, spans) for ``parts``: name -> (shape, dtype) or None."""
        spans, total = {}, 0
        for name, part in parts.items():
            if part is None:
                spans[name] = None
                continue
            shape, dtype = part
            n = dtype.itemsize
            for d in shape:
                n *= d
            spans[name] = (total, shape, dtype)
            total += -(-n // PACK_ALIGN) * PACK_ALIGN
        return max(total, PACK_ALIGN), spans

    @classmethod
    def allocate(cls, parts: dict, device: torch.device) -> PackedOutputs:
        total, spans = cls.plan(parts)
        return cls(_launch.output_allocator(total, torch.uint8, device), spans)

    def addr(self, name: str, fallback: int) -> int:
        """Device address of ``name`` (``fallback`` when it is not computed)."""
        span = self.spans[name]
        return fallback if span is None else self.buf.data_ptr() + span[0]

    def get(self, name: str) -> torch.Tensor | None:
        view = self._views.get(name)
        if view is None:
            span = self.spans[name]
            if span is None:
                return None
            off, shape, dtype = span
            n = dtype.itemsize
            for d in shape:
                n *= d
            view = self.buf[off : off + n].view(dtype).view(shape)
            self._views[name] = view
        return view


def carves_device_tables(output_kind, m_rows: int, splits) -> bool:
    """Whether a device-split call's snapshot and tables (and its computed amax) are parts
    ("tables", "amax") of its outputs allocation: eager calls (``PackedOutputs``) with rows.
    Two allocations and a view less per call (~6 us of host time); the table kernel still
    poisons the amax part on bad splits."""
    return output_kind is PackedOutputs and m_rows > 0 and isinstance(splits, torch.Tensor)


def carves_amax(output_kind, m_rows: int, splits) -> bool:
    """Whether a call's computed amax is a part ("amax") of its outputs allocation: eager calls
    (``PackedOutputs``) with host splits and rows. An allocation costs 2-5 us of host time;
    the result views the part on first use. With device splits the table kernel (or the amax
    pass that builds the tables) poisons the amax, so it must exist before the tables: NVFP4
    and FP8 carve both (``carves_device_tables``); the torch.library ops (``SeparateOutputs``)
    return it, and without rows no kernel writes it (it is zeros)."""
    return output_kind is PackedOutputs and m_rows > 0 and not isinstance(splits, torch.Tensor)


class SeparateOutputs(dict):
    """A call's outputs as separate tensors (name -> tensor or None), with the interface of
    ``PackedOutputs``: what a torch.library op returns (its outputs must not share storage)."""

    @classmethod
    def allocate(cls, parts: dict, device: torch.device) -> SeparateOutputs:
        alloc = _launch.output_allocator
        return cls({n: None if p is None else alloc(p[0], p[1], device) for n, p in parts.items()})

    def addr(self, name: str, fallback: int) -> int:
        t = self[name]
        return fallback if t is None else t.data_ptr()


_CARVED: dict = {}  # (op, the op's key) -> carved_parts(...)


def carved_parts(key: tuple, base, num_groups: int, amax_rows: int, carve_tables: bool) -> dict:
    """The parts of a call's outputs allocation, cached by ``key`` (the op and every argument
    of ``base``): ``base()`` (the op's ``output_parts``), then its computed amax (fp32
    [``amax_rows``, G]; 0: none) and a device-split call's snapshot and tables
    (``carve_tables``), so that one allocation holds them all."""
    parts = _CARVED.get(key)
    if parts is None:
        parts = base()
        if amax_rows:
            parts["amax"] = ((amax_rows, num_groups), torch.float32)
        if carve_tables:
            parts["tables"] = ((groups.device_tables_words(num_groups),), torch.int32)
        if len(_CARVED) > 1024:
            _CARVED.clear()
        _CARVED[key] = parts
    return parts
