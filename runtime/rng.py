"""Fresh Philox states for stochastic rounding when the caller passes no ``rng_state``.

A fresh state per call used to be one ``torch.randint`` per call: a kernel launch and an
allocation (~8 us of host time on the GPU hosts), and for the NVFP4 quantize a call that could
not be replayed (its key needs the state as a tensor argument). Here states are drawn from
torch's CUDA generator ``POOL_STATES`` at a time (one pool per device and stream, drawn on that
stream), and each call takes the next one (a view), so such a call costs what a call with a
given state costs.

Same guarantees as one draw per call:
* Every call gets a state of its own (the pool never hands one out twice) and the result keeps
  the state it used (``Nvfp4GroupedTensor.rng_state``), so any result can be reproduced.
* A run is reproducible from torch's seed: the pool is drawn anew whenever torch's generator
  has moved since the pool's draw (``torch.manual_seed``, ``torch.cuda.set_rng_state``, or any
  other random op on that device in between), so the states depend only on the generator's
  state and the sequence of calls, as one ``torch.randint`` per call did.
* Inside CUDA-graph capture each call still draws with ``torch.randint`` (graph safe: every
  replay of the graph advances torch's Philox offset, so each replay rounds with fresh bits);
  a pool view would be a constant address and repeat one state on every replay.
"""

from __future__ import annotations

import threading

import torch

POOL_STATES = 256  # states per draw: 4 KB of int64 pairs, one small torch.randint
STATE_MAX = 2**62  # (seed, offset) words drawn in [0, 2^62), as before


class StatePool:
    """States of one device, drawn ``size`` at a time; ``take`` returns the next one."""

    def __init__(self, size: int = POOL_STATES):
        self.size = size
        self.states: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []  # states[i] made once per draw (a list index per
        # call instead of a tensor select, ~0.7 us)
        self.next = size  # nothing drawn yet
        self.position: tuple | None = None  # the generator's (seed, offset) after the draw
        self.lock = threading.Lock()  # two threads never take one state (~0.1 us uncontended)

    def take(self, device: torch.device, generator) -> torch.Tensor:
        """The next state (int64 [2] on ``device``, a view of the pool), drawing a new pool when
        this one is used up or ``generator`` moved since it was drawn."""
        with self.lock:
            if self.next == self.size or generator_position(generator) != self.position:
                self.states = torch.randint(
                    0, STATE_MAX, (self.size, 2), dtype=torch.int64, device=device
                )
                self.views = list(self.states.unbind(0))
                self.next = 0
                self.position = generator_position(generator)
            state = self.views[self.next]
            self.next += 1
            return state


def generator_position(generator) -> tuple:
    """Where a CUDA generator stands: (seed, Philox offset); any draw or reseed changes it."""
    return generator.initial_seed(), generator.get_offset()


# by (device index, stream): a pool is drawn on the stream whose kernels read it, so a read never
# overtakes the draw, and the caching allocator never hands the pool's memory to another stream
# while a kernel there may still read it (a pool shared across streams could do both)
_POOLS: dict[tuple, tuple[StatePool, torch.Generator]] = {}


def fresh_state(device: torch.device) -> torch.Tensor:
    """A Philox (seed, offset) state of its own for one stochastic-rounding call on ``device``
    (a CUDA device; the call runs on its current stream): int64 [2], from torch's default CUDA
    generator of that device."""
    if torch._C._cuda_isCurrentStreamCapturing():  # torch.cuda.is_current_stream_capturing
        return torch.randint(0, STATE_MAX, (2,), dtype=torch.int64, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    hit = _POOLS.get(key)
    if hit is None:
        hit = _POOLS[key] = (StatePool(), torch.cuda.default_generators[index])
    return hit[0].take(device, hit[1])
