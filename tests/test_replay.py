"""CPU: the pieces of the eager fast path (runtime/replay.py) that need no GPU: which split
lists may key a record, how recorded arguments are rebased onto a new call's tensors, record
invalidation and nested recordings. tests/test_gpu_replay.py checks the replayed kernels."""

import numpy as np
import pytest
import torch

from cutequant import replay


@pytest.mark.parametrize(
    "splits, expected",
    [
        ([16, 0, 32], (16, 0, 32)),
        ((16, 32), (16, 32)),
        ([16.0, 32], None),  # 16.0 == 16 and hashes alike: must take the checked path
        ([16, False, 32], None),  # False == 0
        ([np.int64(16), 32], None),
        (torch.tensor([16, 32]), None),
        ("abc", None),
    ],
)
def test_plain_splits(splits, expected):
    assert replay.plain_splits(splits) == expected


def test_call_key_needs_a_cuda_tensor_and_plain_splits():
    x = torch.zeros(32, 16, dtype=torch.bfloat16)
    assert replay.call_key(x, [16, 16], (True,)) is None  # CPU: no record
    assert replay.call_key("x", [16, 16], (True,)) is None


class _FakeFn:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def test_replay_rebases_pointer_arguments():
    x, out = torch.zeros(1024, dtype=torch.uint8), torch.zeros(256, dtype=torch.float32)
    fn = _FakeFn()
    xp, op = x.data_ptr(), out.data_ptr()
    if min(xp, op) < 1 << 32:
        pytest.skip("host allocations below 4 GiB: the address rule is for device pointers")
    table = 1 << 40  # a runtime buffer's address: replayed as recorded
    args = (xp + 64, 8192, op + 512, table, 0.5, xp)
    record = replay.Replay([(fn, args, 7)], [x, None, out])
    x2, out2 = torch.zeros_like(x), torch.zeros_like(out)
    record.launch((x2, None, out2))
    assert fn.calls == [(x2.data_ptr() + 64, 8192, out2.data_ptr() + 512, table, 0.5,
                         x2.data_ptr(), 7)]  # fmt: skip


def test_records_are_dropped_on_invalidate():
    memo = replay.CallMemo()
    x = torch.zeros(16, dtype=torch.uint8)
    memo.put("k", (replay.Replay([], [x]), 1))
    assert memo.get("k") is not None
    replay.invalidate()
    assert memo.get("k") is None
    assert "k" not in memo.entries


def test_recordings_nest_and_taint():
    with replay.recording() as outer:
        outer.launches.append("a")
        with replay.recording() as inner:
            replay.recorder().append("b")
            replay.taint()
        assert inner.launches == ["b"] and inner.tainted
        assert replay.recorder() is outer.launches
    assert outer.launches == ["a", "b"] and outer.tainted  # the inner call's work is the outer's
    assert replay.recorder() is None
    replay.taint()  # no recording: nothing to mark
