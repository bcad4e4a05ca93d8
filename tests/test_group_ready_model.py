"""CPU: a step-by-step model of the fused FP8 cast's ticket protocol (kernels/group_ready.py,
templates/fp8_tile_cast.py.j2 with ``fused``): CTAs dispatched in any order into a few SM slots,
interleaved at random. Every launch terminates (no deadlock, however few slots and whatever the
dispatch order), every cast tile sees its group's complete amax, and the launch leaves the
ticket, reads and group words zero. With blockIdx instead of tickets an adversarial dispatch
order deadlocks: why the kernel takes tickets."""

import random

import pytest


def run_launch(group_tiles, extra, slots, rng, words, use_tickets=True, order=None):
    """One launch: ``group_tiles`` tiles per group, ``extra`` spare CTAs. ``words``: the
    persistent workspace (ticket, reads, per group [max, count]), mutated. Returns the maxima
    each cast tile read (per group), or None on deadlock."""
    total = sum(group_tiles)
    group_of = [g for g, n in enumerate(group_tiles) for _ in range(n)]
    value = [rng.random() for _ in range(total)]
    grid = 2 * total + extra
    pending = list(order) if order is not None else rng.sample(range(grid), grid)
    running, seen = [], {g: [] for g in range(len(group_tiles))}

    def cta(bidx):
        if use_tickets:
            ticket = words["ticket"]
            words["ticket"] += 1
            if ticket == grid - 1:
                words["ticket"] = 0
        else:
            ticket = bidx
        yield
        if ticket < total:  # amax tile
            g = group_of[ticket]
            words["max"][g] = max(words["max"][g], value[ticket])
            words["count"][g] += 1
        elif ticket < 2 * total:  # cast tile, backwards
            g = group_of[2 * total - 1 - ticket]
            while words["count"][g] < group_tiles[g]:
                yield "blocked"
            seen[g].append(words["max"][g])
            words["reads"] += 1
        yield
        if ticket == grid - 1 and total > 0:
            while words["reads"] < total:
                yield "blocked"
            words["max"] = [0.0] * len(group_tiles)
            words["count"] = [0] * len(group_tiles)
            words["reads"] = 0

    states = {}
    while pending or running:
        while pending and len(running) < slots:  # dispatch into free slots
            b = pending.pop(0)
            running.append(b)
            states[b] = cta(b)
        progressed = False
        for b in rng.sample(running, len(running)):
            try:
                if next(states[b]) != "blocked":
                    progressed = True
            except StopIteration:
                running.remove(b)
                progressed = True
        if not progressed:
            return None
    for g, n in enumerate(group_tiles):
        want = max((v for v, h in zip(value, group_of, strict=True) if h == g), default=0.0)
        assert seen[g] == [want] * n, g
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_tickets_never_deadlock_and_reset(seed):
    rng = random.Random(seed)
    words = {"ticket": 0, "reads": 0, "max": [0.0] * 6, "count": [0] * 6}
    for _ in range(3):  # back to back on one stream: each launch finds zeros
        group_tiles = [rng.choice([0, 0, 1, 2, 5, 9]) for _ in range(6)]
        slots = rng.choice([1, 2, 3, 8])
        assert run_launch(group_tiles, rng.choice([0, 3]), slots, rng, words) is not None
        assert words == {"ticket": 0, "reads": 0, "max": [0.0] * 6, "count": [0] * 6}


def test_block_index_order_can_deadlock():
    """Without tickets (work = blockIdx) a dispatch order that starts cast CTAs first fills the
    slots with CTAs waiting for amax tiles that are never dispatched."""
    rng = random.Random(0)
    words = {"ticket": 0, "reads": 0, "max": [0.0], "count": [0]}
    order = [3, 2, 1, 0]  # cast CTAs (blockIdx 2, 3) first, 1 slot
    assert run_launch([2], 0, 1, rng, words, use_tickets=False, order=order) is None
    words = {"ticket": 0, "reads": 0, "max": [0.0], "count": [0]}
    assert run_launch([2], 0, 1, rng, words, use_tickets=True, order=order) is not None
