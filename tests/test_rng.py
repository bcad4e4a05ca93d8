"""CPU: the pool of fresh stochastic-rounding states (cutequant/rng.py): each state handed out
once, a new draw when the pool is used up or the generator moved (a reseed or another draw),
and the draws themselves torch.randint's, so a run is reproducible from torch's seed."""

import torch

from cutequant import rng


class _Generator:
    """Stands in for a CUDA generator: a seed and an offset that the test moves."""

    def __init__(self):
        self.seed, self.offset = 5, 0

    def initial_seed(self):
        return self.seed

    def get_offset(self):
        return self.offset


def test_states_are_handed_out_once_then_drawn_again():
    gen = _Generator()
    pool = rng.StatePool(size=4)
    states = [pool.take(torch.device("cpu"), gen) for _ in range(9)]
    assert all(s.dtype == torch.int64 and s.shape == (2,) for s in states)
    assert len({tuple(s.tolist()) for s in states}) == 9  # 3 draws of 4: nine distinct states
    assert states[1].data_ptr() - states[0].data_ptr() == 16  # views of one draw
    assert states[4].data_ptr() != states[3].data_ptr() + 16  # the fifth is a new draw
    assert all(0 <= v < rng.STATE_MAX for s in states for v in s.tolist())


def test_a_moved_generator_draws_anew():
    gen = _Generator()
    pool = rng.StatePool(size=8)
    first = pool.take(torch.device("cpu"), gen)
    drawn = pool.states
    pool.take(torch.device("cpu"), gen)
    assert pool.states is drawn  # nothing moved: the same draw
    gen.offset += 4  # another random op on the device
    pool.take(torch.device("cpu"), gen)
    assert pool.states is not drawn and pool.next == 1
    drawn = pool.states
    gen.seed, gen.offset = 5, 0  # torch.manual_seed(5)
    pool.take(torch.device("cpu"), gen)
    assert pool.states is not drawn
    assert first.tolist() != [0, 0]


def test_draws_follow_torch_seed():
    """The states are torch.randint's after the seed: the same seed, the same states."""
    gen = _Generator()
    runs = []
    for _ in range(2):
        torch.manual_seed(77)
        pool = rng.StatePool(size=4)
        runs.append([pool.take(torch.device("cpu"), gen).tolist() for _ in range(6)])
    torch.manual_seed(77)
    want = torch.randint(0, rng.STATE_MAX, (4, 2), dtype=torch.int64).tolist()
    assert runs[0] == runs[1]
    assert runs[0][:4] == want


def test_threads_never_share_a_state():
    import threading

    gen = _Generator()
    pool = rng.StatePool(size=64)
    got = []

    def worker():
        for _ in range(40):
            got.append(pool.take(torch.device("cpu"), gen))  # kept: no draw's memory reused

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 160
    assert len({s.data_ptr() for s in got}) == 160  # every take a state of its own
