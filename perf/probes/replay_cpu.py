"""Probe (CPU, no GPU needed): the Python of the eager fake-quant ops' replayed path.

    python perf/probes/replay_cpu.py [--calls 5000] [--rounds 5] [--profile]
    PYTHONPATH=<a copy of another checkout as a cutequant package> python ...  (the other side)

Runs ``nvfp4_fake_quantize`` (rows, rows with a given amax, columnwise, device splits) and
``nvfp4_fake_quantize_weights_2d`` on CPU tensors with what needs a GPU stubbed out (the
tensors report ``is_cuda``, the stream is 0, launches are recorded but not made: ``_launch.run``
records, ``Replay.launch``'s TVM-FFI functions are no-ops). The first calls take the checked
path and record; the timed calls replay. Per op it prints the median time of a replayed call
with the output allocations stubbed to preallocated tensors (the Python alone), and how many
torch allocations and view-making calls one replayed call makes (what the Python cannot show:
on the GPU hosts an allocation costs ~2-3 us and a view or slice ~1.3-1.6 us,
perf/NOTES.md "Host overhead"). ``--profile``: the C-level calls of one replayed call
(``sys.setprofile``), by name. Only for comparing two versions of the runtime on one machine;
the GPU hosts' ``perf/host_overhead.py breakdown`` is what counts.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cutequant import _launch, fake_quant, groups, nvfp4_2d, replay

# op -> (x shape, splits: "host" / "device" / None for the 2D op, kwargs)
CASES = {
    "fake-quant rows": ((1024, 512), "host", {}),
    "fake-quant rows (given amax)": ((1024, 512), "host", {"amax": "row"}),
    "fake-quant columnwise (RHT)": ((1024, 512), "host", {"columnwise": True}),
    "fake-quant rows, device splits": ((1024, 512), "device", {}),
    "fake-quant columnwise, device splits": ((1024, 512), "device", {"columnwise": True}),
    "fake-quant rows, 256 groups": ((65536, 64), "host256", {}),
    "2D weights fake-quant": ((16, 64, 512), None, {}),
}


def _stub_cuda() -> None:
    """CPU tensors pass for CUDA ones; nothing is compiled or launched."""
    torch.Tensor.is_cuda = property(lambda self: True)
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    _launch.device_arch = lambda device: "sm_90a"
    _launch.sm_count = lambda device: 132
    _launch.memory_rich = lambda device: True
    nvfp4_2d._resident_ctas = lambda index: 2

    def run(spec, *args, stream):  # what _launch.run records, without a kernel
        launches = replay.recorder()
        if launches is not None:
            launches.append((_noop, args, stream))

    _launch.run = run
    groups.sync_check = lambda layout: None


def _noop(*args) -> None:
    return None


def _op(shape, kind, kwargs):
    x = torch.zeros(shape, dtype=torch.bfloat16)
    if kind is None:
        return lambda: nvfp4_2d.nvfp4_fake_quantize_weights_2d(x)
    splits = [256, 0, 512, 256] if kind != "host256" else [256] * 256
    if kind == "device":
        splits = torch.tensor(splits, dtype=torch.int32)
    kw = dict(kwargs)
    if kw.get("amax") == "row":
        kw["amax"] = torch.ones(len(splits), dtype=torch.float32)
    return lambda: fake_quant.nvfp4_fake_quantize(x, splits, **kw)


class _Counting:
    """C-level calls of one replayed call by name (``sys.setprofile``)."""

    def __init__(self):
        self.calls = collections.Counter()

    def profile(self, frame, event, arg):
        if event == "c_call":
            self.calls[getattr(arg, "__qualname__", getattr(arg, "__name__", repr(arg)))] += 1


class _TorchOps(TorchDispatchMode):
    """The aten ops of one replayed call (allocations, views), by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _median_us(fn, calls: int) -> float:
    for _ in range(100):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def _allocations(fn) -> int:
    """Output allocations of one call of ``fn``."""
    made = []
    real = _launch.output_allocator

    def counting(shape, dtype, device):
        made.append(shape)
        return real(shape, dtype, device)

    _launch.output_allocator = counting
    try:
        fn()
    finally:
        _launch.output_allocator = real
    return len(made)


def _preallocated():
    """An output allocator that hands back one buffer per (shape, dtype): the Python alone."""
    cache = {}

    def alloc(shape, dtype, device):
        key = (shape if isinstance(shape, int) else tuple(shape), dtype)
        t = cache.get(key)
        if t is None:
            t = cache[key] = torch.empty(shape, dtype=dtype, device=device)
        return t

    return alloc


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    _stub_cuda()
    real_alloc = _launch.output_allocator
    for name, (shape, kind, kwargs) in CASES.items():
        fn = _op(shape, kind, kwargs)
        for _ in range(3):  # first sighting, cached (recorded), replayed
            out = fn()
        made = _allocations(fn)
        counter = _Counting()
        sys.setprofile(counter.profile)
        fn()
        sys.setprofile(None)
        torch_ops = _TorchOps()
        with torch_ops:
            fn()
        stubbed, real = [], []
        for _ in range(args.rounds):  # alternate, so that the shared host's drift hits both
            _launch.output_allocator = _preallocated()
            stubbed.append(_median_us(fn, args.calls))
            _launch.output_allocator = real_alloc
            real.append(_median_us(fn, args.calls))
        shapes = [tuple(t.shape) for t in out]
        ops = " ".join(f"{k} {n}" for k, n in sorted(torch_ops.ops.items()))
        print(f"{name:38s} stubbed {min(stubbed):5.2f} us  CPU allocations {min(real):5.2f} us  "
              f"allocations {made}  torch ops: {ops}  outputs {shapes}")  # fmt: skip
        if args.profile:
            for k, n in sorted(counter.calls.items()):
                print(f"    {n:3d} {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
