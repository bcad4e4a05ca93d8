"""Where the host time of one call goes.

    python perf/host_overhead.py profile [op ...]   cProfile of 200 back-to-back calls per op
    python perf/host_overhead.py primitives         CPU cost of the torch / TVM-FFI pieces a
                                                    call is made of (median of 2000, in us)
    python perf/host_overhead.py first-call         a fresh process with a warm disk cache:
                                                    import cutequant, then its first op
    python perf/host_overhead.py conditions         host time per op by input size, GPU busy or
                                                    idle, and the argument checks alone
    python perf/host_overhead.py breakdown          per op: the whole call, the call with its
                                                    launches stubbed out (Python + allocations),
                                                    and the launches' share
    python perf/host_overhead.py queue              host time vs the work queued ahead (idle
                                                    GPU one call at a time, back to back,
                                                    behind a GPU sleep: shallow / deep queue)
    python perf/host_overhead.py versus [rounds]    every op's eager host time next to
                                                    torch's own ops, interleaved round by
                                                    round (the host's speed moves between
                                                    rounds; the ratio does not)

No synchronization inside the timed loops: what is measured is the CPU time to issue work.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch
from bench import host_reference, host_time_us  # perf/ is the script's directory

import cutequant
from cutequant.testing import grouped_input

OPS = {
    "nvfp4": lambda x, s: cutequant.nvfp4_group_quantize(x, s),
    "fp8": lambda x, s: cutequant.fp8_group_quantize(x, s),
    "amax": lambda x, s: cutequant.group_amax(x, s),
    "fake_quant": lambda x, s: cutequant.nvfp4_fake_quantize(x, s),
}


def profile(names) -> None:
    gen = torch.Generator().manual_seed(0)
    splits = [1024] * 8
    x = grouped_input(splits, 2048, gen)
    for name in names or list(OPS):
        op = OPS[name]
        for _ in range(3):
            op(x, splits)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            op(x, splits)
        prof.disable()
        torch.cuda.synchronize()
        print(f"=== {name}: 200 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def _cost_us(fn, n: int = 2000) -> float:
    """Median CPU time of ``fn`` (idle GPU between rounds; for ops on large inputs use
    ``bench.host_time_us``, which issues the calls behind a GPU sleep)."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def primitives() -> None:
    from cutequant import _launch
    from cutequant.codegen.specs import GroupTablesSpec

    dev = torch.device("cuda")
    buf = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    splits = torch.tensor([1024] * 8, dtype=torch.int32, device=dev)
    spec = GroupTablesSpec(arch=_launch.device_arch(dev), splits_int64=False)
    tables = torch.empty(4 * 9, dtype=torch.int32, device=dev)
    snap = torch.empty(10, dtype=torch.int32, device=dev)
    kernel = lambda: _launch.run(  # noqa: E731
        spec,
        splits.data_ptr(),
        8,
        8192,
        tables.data_ptr(),
        snap.data_ptr(),
        snap.data_ptr(),
        0,
        stream=_launch.raw_stream(dev),
    )
    # the op boundaries: torch.library.custom_op vs the lower-level Library define / impl route,
    # each around the same trivial function, and a real op through each route
    lib = torch.library.Library("cutequant_probe", "FRAGMENT")
    lib.define("noop_lib(Tensor x) -> Tensor")
    lib.impl("noop_lib", lambda x: x.new_empty(0), "CUDA")

    @torch.library.custom_op("cutequant_probe::noop_custom", mutates_args=())
    def noop_custom(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(0)

    x = torch.zeros(1024, 512, dtype=torch.bfloat16, device=dev)
    host = [512, 0, 512]
    cases = {
        "custom_op boundary (trivial op)": lambda: noop_custom(x),
        "Library define/impl boundary (trivial op)": lambda: torch.ops.cutequant_probe.noop_lib(x),
        "plain call of the trivial function": lambda: x.new_empty(0),
        "cutequant.group_amax (eager, direct)": lambda: cutequant.group_amax(x, host),
        "torch.ops.cutequant.group_amax (custom op)": lambda: torch.ops.cutequant.group_amax(
            x, None, host, True, 0xD7E8
        ),
        "torch.empty cuda": lambda: torch.empty(4096, dtype=torch.uint8, device=dev),
        "torch.empty cuda (2-D)": lambda: torch.empty((64, 64), dtype=torch.uint8, device=dev),
        "split_with_sizes x4": lambda: buf.split_with_sizes([1024, 1024, 1024, 1045504]),
        "tensor.view(shape)": lambda: buf.view(1024, 1024),
        "tensor slice": lambda: buf[16:4096],
        "data_ptr()": lambda: buf.data_ptr(),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(dev),
        "_launch.raw_stream": lambda: _launch.raw_stream(dev),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.cuda._sleep(0) (torch's own launch)": lambda: torch.cuda._sleep(0),
        "tvm-ffi launch (group tables, 8 args)": kernel,
    }
    for name, fn in cases.items():
        print(f"{name:42s} {_cost_us(fn):7.2f} us")


_FIRST_CALL = """
import sys, time
import torch
x = torch.randn(1024, 512, device="cuda").to(torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
import cutequant
t1 = time.perf_counter()
getattr(cutequant, sys.argv[1])(x, [512, 0, 512])
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"import cutequant {1e3 * (t1 - t0):7.1f} ms, first {sys.argv[1]} {1e3 * (t2 - t1):7.1f} ms"
      f" (cutlass imported: {'cutlass' in sys.modules})")
"""


def first_call() -> None:
    """Fresh processes sharing one disk cache: the first fills it, the next ones load."""
    import os
    import subprocess
    import tempfile

    env = dict(os.environ, CUTEQUANT_CACHE_DIR=tempfile.mkdtemp(prefix="cq-first-call-"))
    for op in ("group_amax", "nvfp4_group_quantize", "fp8_group_quantize"):
        for label in ("cold (compiles)", "warm disk cache", "warm disk cache"):
            out = subprocess.run(
                [sys.executable, "-c", _FIRST_CALL, op], env=env, capture_output=True, text=True
            )
            print(f"{label:18s} {out.stdout.strip() or out.stderr.strip()[-300:]}")


def _fresh_lists(splits, count: int = 1500) -> list[list[int]]:
    """``count`` distinct split lists with the group count and total of ``splits`` (more than
    the runtime remembers, so that cycling through them, every call sees a new list)."""
    gen = torch.Generator().manual_seed(1)
    units, groups = sum(splits) // 16, len(splits)
    seen: set = set()
    while len(seen) < count:
        cuts = sorted(torch.randint(0, units + 1, (groups - 1,), generator=gen).tolist())
        seen.add(tuple(b - a for a, b in zip([0, *cuts], [*cuts, units], strict=True)))
    return [[16 * u for u in s] for s in seen]


def _condition_ops(x, splits, amax) -> dict:
    from cutequant import amax as amax_mod
    from cutequant import nvfp4

    ops = {
        "group_amax": lambda: cutequant.group_amax(x, splits),
        "nvfp4 (given amax)": lambda: cutequant.nvfp4_group_quantize(x, splits, amax=amax),
        "nvfp4 (amax pass)": lambda: cutequant.nvfp4_group_quantize(x, splits),
        "fp8 current": lambda: cutequant.fp8_group_quantize(x, splits),
        "check_group_amax only": lambda: amax_mod.check_group_amax(x, splits, True, 0xD7E8),
        "nvfp4 check_quantize only": lambda: nvfp4.check_quantize(
            x, splits, True, True, True, 0xD7E8, False, False, amax, False, None, None
        ),
    }
    if len(splits) > 1:  # an MoE step: new split sizes on every call
        pool, k = _fresh_lists(splits), [0]

        def fresh():
            k[0] += 1
            return pool[k[0] % len(pool)]

        ops["group_amax, new splits"] = lambda: cutequant.group_amax(x, fresh())
        ops["nvfp4 (amax pass), new splits"] = lambda: cutequant.nvfp4_group_quantize(x, fresh())
        ops["fp8 current, new splits"] = lambda: cutequant.fp8_group_quantize(x, fresh())
    return ops


def conditions() -> None:
    """Host time per call (median) of each op on small and large inputs: the first 50 calls after
    one warm-up (as perf/bench.py measures), 300 calls after 50 more, and 300 calls queued
    behind a long sleep kernel (GPU busy); and the argument checks alone."""
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "small 1024x512 / 3": ([512, 0, 512], 512),
        "dense 8192x5120": ([8192], 5120),
        "65536x2048 / 256": ([256] * 256, 2048),
    }
    for label, (splits, n_cols) in inputs.items():
        x = grouped_input(splits, n_cols, gen)
        amax = torch.stack(cutequant.group_amax(x, splits))
        ops = _condition_ops(x, splits, amax)
        for name, fn in ops.items():
            fn()
            torch.cuda.synchronize()
            first = []  # as perf/bench.py measures: 50 calls right after one warm-up call
            for _ in range(50):
                t = time.perf_counter_ns()
                fn()
                first.append(time.perf_counter_ns() - t)
            torch.cuda.synchronize()
            warm = _cost_us(fn, 300)
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU work queued ahead of the calls
            busy = _cost_us(fn, 300)  # <= 700 launches: below the launch queue's depth
            torch.cuda.synchronize()
            print(
                f"{label:20s} {name:30s} first 50 {statistics.median(first) / 1e3:6.1f} us  "
                f"warm {warm:6.1f} us  GPU busy {busy:6.1f} us"
            )


def _queue_costs(fn) -> dict:
    """Median host time (us) of ``fn`` under four launch-queue conditions."""
    out = {}
    times = []
    for _ in range(300):  # every call finds an idle GPU and an empty launch queue
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    out["idle, one at a time"] = statistics.median(times) / 1e3
    out["back-to-back x1000"] = _cost_us(fn, 1000)
    out["behind a sleep, rounds of 20"] = host_time_us(fn, 20, 15)
    out["behind a sleep, rounds of 200"] = host_time_us(fn, 200, 3)
    return out


def queue() -> None:
    """Host time of a few ops (and of torch's own launch) with an idle GPU and empty queue,
    back to back on an idle GPU, and behind a GPU sleep with shallow and deep queues: whether
    a launch's CPU cost depends on the work queued ahead of it."""
    gen = torch.Generator().manual_seed(0)
    for splits, n_cols in (([512, 0, 512], 512), ([1024] * 8, 2048)):
        x = grouped_input(splits, n_cols, gen)
        amax = torch.stack(cutequant.group_amax(x, splits))
        ops = {
            "torch.cuda._sleep(0)": lambda: torch.cuda._sleep(0),
            "torch.empty(4096)": lambda: torch.empty(4096, device="cuda"),
            "group_amax": lambda x=x, s=splits: cutequant.group_amax(x, s),
            "nvfp4 (given amax)": lambda x=x, s=splits, a=amax: cutequant.nvfp4_group_quantize(
                x, s, amax=a
            ),
            "nvfp4 (amax pass)": lambda x=x, s=splits: cutequant.nvfp4_group_quantize(x, s),
        }
        for name, fn in ops.items():
            costs = "  ".join(f"{k} {v:5.1f}" for k, v in _queue_costs(fn).items())
            print(f"{len(splits)} groups x {n_cols:5d}  {name:22s} {costs}")


def _breakdown_ops(x, splits, amax) -> dict:
    from cutequant import dequant

    q = cutequant.nvfp4_group_quantize(x, splits, amax=amax)
    q8 = cutequant.fp8_group_quantize(x, splits)
    w = x.view(-1, 64, x.shape[1])
    scale = torch.ones(len(splits), dtype=torch.float32, device=x.device)
    dev_splits = torch.tensor(splits, dtype=torch.int32, device=x.device)
    qd = cutequant.nvfp4_group_quantize(x, dev_splits, amax=amax)
    w_amax = torch.ones(w.shape[0], dtype=torch.float32, device=x.device)
    amax_row = amax[0].contiguous()
    return {
        "group_amax": lambda: cutequant.group_amax(x, splits),
        "nvfp4 (given amax)": lambda: cutequant.nvfp4_group_quantize(x, splits, amax=amax),
        "nvfp4 (amax pass)": lambda: cutequant.nvfp4_group_quantize(x, splits),
        "nvfp4 rowwise only (given amax)": lambda: cutequant.nvfp4_group_quantize(
            x, splits, amax=amax, columnwise=False
        ),
        "nvfp4 rowwise only, no RHT (given amax)": lambda: cutequant.nvfp4_group_quantize(
            x, splits, amax=amax, columnwise=False, rht=False
        ),
        "nvfp4 columnwise only (given amax)": lambda: cutequant.nvfp4_group_quantize(
            x, splits, amax=amax, rowwise=False
        ),
        "nvfp4 dequantize rowwise": lambda: dequant.nvfp4_group_dequantize(q),
        "nvfp4 dequantize columnwise": lambda: dequant.nvfp4_group_dequantize(q, columnwise=True),
        "nvfp4 dequantize, device splits": lambda: dequant.nvfp4_group_dequantize(qd),
        "fp8 current": lambda: cutequant.fp8_group_quantize(x, splits),
        "fp8 delayed": lambda: cutequant.fp8_group_quantize(
            x, splits, scaling="delayed", scale=scale
        ),
        "fp8 dequantize rowwise": lambda: dequant.fp8_group_dequantize(q8),
        # stochastic rounding without an rng_state: a fresh state per call (cutequant/rng.py)
        "nvfp4 SR, fresh state": lambda: cutequant.nvfp4_group_quantize(
            x, splits, stochastic_rounding=True
        ),
        "fake-quant rows SR, fresh state": lambda: cutequant.nvfp4_fake_quantize(
            x, splits, stochastic_rounding=True
        ),
        "fake-quant rows": lambda: cutequant.nvfp4_fake_quantize(x, splits),
        "fake-quant rows (given amax)": lambda: cutequant.nvfp4_fake_quantize(
            x, splits, amax=amax_row
        ),
        "fake-quant columnwise (RHT)": lambda: cutequant.nvfp4_fake_quantize(
            x, splits, columnwise=True
        ),
        "2D weights, stacked [E, 64, N]": lambda: cutequant.nvfp4_quantize_weights_2d(w),
        "2D weights fake-quant": lambda: cutequant.nvfp4_fake_quantize_weights_2d(w),
        "2D weights, given amax": lambda: cutequant.nvfp4_quantize_weights_2d(w, amax=w_amax),
        # device-resident splits (an int32 CUDA tensor): the amax pass builds the tables; the
        # calls without one launch the table kernel first
        "group_amax, device splits": lambda: cutequant.group_amax(x, dev_splits),
        "nvfp4 (amax pass), device splits": lambda: cutequant.nvfp4_group_quantize(x, dev_splits),
        "nvfp4 (given amax), device splits": lambda: cutequant.nvfp4_group_quantize(
            x, dev_splits, amax=amax
        ),
        "fp8 current, device splits": lambda: cutequant.fp8_group_quantize(x, dev_splits),
        "fake-quant rows, device splits": lambda: cutequant.nvfp4_fake_quantize(x, dev_splits),
        "fake-quant cols, device splits": lambda: cutequant.nvfp4_fake_quantize(
            x, dev_splits, columnwise=True
        ),
        "fake-quant rows, dev splits, amax": lambda: cutequant.nvfp4_fake_quantize(
            x, dev_splits, amax=amax_row
        ),
    }


def breakdown() -> None:
    """Per op and input, host time (``bench.host_time_us``: 3 rounds of 100 calls behind a GPU
    sleep) of: the checked path (``replay.enabled`` off), the eager
    path (a replay of the recorded launches where the call has a record, runtime/replay.py),
    and the eager path with its launches stubbed out (what is left is Python and allocations;
    launches = eager - stubbed)."""
    from cutequant import _launch, replay

    gen = torch.Generator().manual_seed(0)
    inputs = {
        "1024x512 / 3": ([512, 0, 512], 512),
        "8192x2048 / 8": ([1024] * 8, 2048),
        "65536x2048 / 256": ([256] * 256, 2048),
    }
    real_run, real_launch = _launch.run, replay.Replay.launch
    for label, (splits, n_cols) in inputs.items():
        x = grouped_input(splits, n_cols, gen)
        amax = torch.stack(cutequant.group_amax(x, splits))
        for name, fn in _breakdown_ops(x, splits, amax).items():
            replay.enabled = False
            try:
                checked = host_time_us(fn, 100, 3)
            finally:
                replay.enabled = True
            eager = host_time_us(fn, 100, 3)
            _launch.run = lambda spec, *args, stream: None
            replay.Replay.launch = lambda self, bases: []
            try:
                stubbed = host_time_us(fn, 100, 3)
            finally:
                _launch.run, replay.Replay.launch = real_run, real_launch
            print(
                f"{label:17s} {name:32s} checked {checked:6.1f} us  eager {eager:6.1f} us  "
                f"no launch {stubbed:6.1f} us  launches {eager - stubbed:5.1f} us"
            )


_TORCH_TWO = "torch t.abs().amax(): 2 kernels, 2 allocations"


def _reference_ops() -> dict:
    """Torch's own ops on a small tensor: what a launch and an allocation cost on this host."""
    t = torch.ones(1024, dtype=torch.bfloat16, device="cuda")
    return {"torch t.abs(): 1 kernel, 1 allocation": lambda: t.abs(), _TORCH_TWO: host_reference()}


def versus(rounds: int = 7) -> None:
    """Per op (``breakdown``'s, eager) and input: the host time (``bench.host_time_us``, one
    round of 100 calls behind a GPU sleep) in each of ``rounds`` rounds, every op once per
    round, torch's own ops among them; printed: the median, min and max over the rounds and
    the median over the rounds of the ratio to torch's two-kernel op of the same round. A
    host's speed moves by up to 1.5x between rounds of one process (torch's own ops with it),
    so the rounds' spread shows the host, and the ratio what is the op's own."""
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "8192x2048 / 8": ([1024] * 8, 2048),
        "65536x2048 / 256": ([256] * 256, 2048),
    }
    for label, (splits, n_cols) in inputs.items():
        x = grouped_input(splits, n_cols, gen)
        amax = torch.stack(cutequant.group_amax(x, splits))
        ops = {**_reference_ops(), **_breakdown_ops(x, splits, amax)}
        times: dict = {name: [] for name in ops}
        for _ in range(rounds):
            for name, fn in ops.items():
                times[name].append(host_time_us(fn, 100, 1))
        ref = times[_TORCH_TWO]
        for name, got in times.items():
            ratio = statistics.median(a / b for a, b in zip(got, ref, strict=True))
            print(
                f"{label:17s} {name:48s} median {statistics.median(got):6.1f} us  "
                f"min {min(got):6.1f}  max {max(got):6.1f}  x{ratio:4.2f} of torch's two-kernel op"
            )


def main(argv) -> int:
    if argv and argv[0] == "first-call":
        first_call()
    elif argv and argv[0] == "primitives":
        primitives()
    elif argv and argv[0] == "conditions":
        conditions()
    elif argv and argv[0] == "breakdown":
        breakdown()
    elif argv and argv[0] == "queue":
        queue()
    elif argv and argv[0] == "versus":
        versus(*(int(a) for a in argv[1:2]))
    else:
        profile(argv[1:] if argv and argv[0] == "profile" else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
