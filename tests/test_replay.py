"""CPU: the pieces of the eager fast path (runtime/replay.py) that need no GPU: which split
lists may key a record, how recorded arguments are rebased onto a new call's tensors, record
invalidation and nested recordings. tests/test_gpu_replay.py checks the replayed kernels."""

import numpy as np
import pytest
import torch

from cutequant import replay


@pytest.mark.parametrize(
    "splits",
    [[16.0, 32], [np.int64(16), 32], [np.float32(16), 32], torch.tensor([16, 32]), "abc", None],
)
def test_split_key_refuses_what_is_not_plain_ints(splits):
    """16.0 == 16 (and numpy scalars) must take the checked path, which names the problem."""
    assert replay.split_key(splits) is None


@pytest.mark.parametrize("groups", [4, 40])  # a tuple key / a SplitList key
def test_split_keys_match_by_value_and_never_a_bool_for_a_zero(groups):
    base = [16, 0, 32, 0] * (groups // 4)

    def variant(i, v):
        out = list(base)
        out[i] = v
        return out

    memo = replay.CallMemo()
    x = torch.zeros(16, dtype=torch.uint8)
    probe = list(base)
    memo.put(("op", replay.split_key(probe)), (replay.Replay([], [x]), 1))
    assert memo.get(("op", replay.split_key(list(base)))) is not None
    assert memo.get(("op", replay.split_key(tuple(base)))) is not None  # a tuple of the values
    assert memo.get(("op", replay.split_key(variant(1, False)))) is None  # False == 0
    assert memo.get(("op", replay.split_key(variant(-1, False)))) is None
    assert memo.get(("op", replay.split_key(variant(0, 32)[:-2] + [16, 0]))) is None  # same sum
    assert memo.get(("op", replay.split_key(base[:-1]))) is None
    probe[0] = 32  # the caller's list changes after the call: the stored key kept a copy
    assert memo.get(("op", replay.split_key(list(base)))) is not None
    assert memo.get(("op", replay.split_key(probe))) is None


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
