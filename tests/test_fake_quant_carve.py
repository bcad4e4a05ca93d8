"""CPU: the eager fake-quant op's one outputs allocation (fake_quant._outputs, carve_words):
y and the amax part (with device splits the call's tables too) are non-overlapping, aligned
views of one fp32 buffer, on the checked path and on a replay, and a replay points every
recorded launch argument at the same offsets of its own new buffer. The kernels are not run
(the tensors are CPU tensors passed off as CUDA ones; launches are recorded, not made):
tests/test_gpu_replay.py and test_gpu_fake_quant.py check the bits on the GPU."""

import pytest
import torch

from cutequant import _launch, fake_quant, groups, replay


@pytest.mark.parametrize("m_rows,n_cols", [(16, 16), (1024, 512), (48, 272), (4096, 5120)])
@pytest.mark.parametrize("num_groups", [1, 3, 300])
@pytest.mark.parametrize("kind", ["given", "host", "device", "given-device"])
def test_carve_words(m_rows, n_cols, num_groups, kind):
    given, device = kind.startswith("given"), kind.endswith("device")
    words, at = fake_quant.carve_words(m_rows, n_cols, num_groups, given, device)
    y_bytes = 2 * m_rows * n_cols
    assert 4 * at >= y_bytes and (4 * at) % 256 == 0 and 4 * at - y_bytes < 256
    amax_words = num_groups if given else 2 * num_groups
    assert words >= at + amax_words
    if device:
        tables_at = at + fake_quant._amax_rows_words(num_groups)
        assert tables_at >= at + 2 * num_groups and (4 * tables_at) % 16 == 0
        assert words == tables_at + groups.device_tables_words(num_groups)
    else:
        assert words == at + amax_words


class _Launches:
    """Stands in for a compiled kernel: records the arguments of every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def cpu_as_cuda(monkeypatch):
    """CPU tensors pass for CUDA ones; ``_launch.run`` records a launch without a kernel."""
    kernel = _Launches()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_launch, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(_launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(groups, "sync_check", lambda layout: None)

    def run(spec, *args, stream):
        kernel(*args, stream)
        launches = replay.recorder()
        if launches is not None:
            launches.append((kernel, args, stream))

    monkeypatch.setattr(_launch, "run", run)
    allocations = []

    def alloc(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        allocations.append(t)
        return t

    monkeypatch.setattr(_launch, "output_allocator", alloc)
    replay.invalidate()
    yield kernel, allocations
    replay.invalidate()


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("given", [False, True], ids=["amax-pass", "given-amax"])
@pytest.mark.parametrize("device", [False, True], ids=["host-splits", "device-splits"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "cols"])
def test_eager_outputs_are_views_of_one_allocation(cpu_as_cuda, columnwise, device, given,
                                                   out_dtype):  # fmt: skip
    kernel, allocations = cpu_as_cuda
    host = [64, 0, 128, 48]
    m, n, g = sum(host), 272, len(host)
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    splits = torch.tensor(host, dtype=torch.int32) if device else host
    amax = torch.ones(g) if given else None
    results = []
    for _ in range(4):  # first sighting, cached and recorded, then replayed
        del allocations[:]
        calls = len(kernel.calls)
        y, a = fake_quant.nvfp4_fake_quantize(
            x, splits, columnwise=columnwise, amax=amax, out_dtype=out_dtype
        )
        assert y.dtype == out_dtype and y.shape == ((m * n,) if columnwise else (m, n))
        assert y.is_contiguous() and a.dtype == torch.float32 and a.shape == (g,)
        assert len(allocations) == 1, "one outputs allocation per call"
        (buf,) = allocations
        assert y.data_ptr() == buf.data_ptr() and a.data_ptr() % 16 == 0
        lo, hi = _span(buf)
        (ylo, yhi), (alo, ahi) = _span(y), _span(a)
        assert lo <= ylo < yhi <= alo < ahi <= hi, "y, then the amax part, inside the buffer"
        if device:  # the tables follow the amax rows, inside the buffer (no scratch buffer)
            assert buf.numel() == fake_quant.carve_words(m, n, g, given, True)[0]
        results.append((buf, kernel.calls[calls:]))
    if min(_span(t)[0] for t in (x, results[-1][0])) < 1 << 32:
        pytest.skip("host allocations below 4 GiB: the replay's address rule is for devices")
    (buf1, launches1), (buf2, launches2) = results[-2], results[-1]
    # the fake-quant kernel, after the amax pass or, with a given amax and device splits, the
    # table kernel
    assert len(launches1) == len(launches2) == (1 if given and not device else 2)
    lo1, hi1 = _span(buf1)
    for args1, args2 in zip(launches1, launches2, strict=True):
        for a1, a2 in zip(args1, args2, strict=True):
            if type(a1) is int and lo1 <= a1 < hi1:  # into the outputs: rebased
                assert a2 - buf2.data_ptr() == a1 - buf1.data_ptr()
            else:  # x (the same tensor), sizes, flags, runtime buffers
                assert a2 == a1
