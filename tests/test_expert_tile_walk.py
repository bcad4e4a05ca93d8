"""CPU: the 2D weight kernel's tile walk (kernels/schedule.py ``next_expert_tile`` /
``prev_expert_tile``, which its loops write inline; issue 20) steps through exactly the tiles
the two divisions of ``expert_tile`` give, forward from a CTA's first item and backward from
its last, for the grids the runtime launches (one item per CTA, or a cooperative grid of a few
CTAs per SM)."""

import random

import pytest

from cutequant.kernels import schedule as sched


def _ranges(items, ctas):
    """Each CTA's [begin, end), as the kernel splits the items."""
    per = (items + ctas - 1) // ctas
    for b in range(ctas):
        begin = min(b * per, items)
        yield begin, min(begin + per, items)


@pytest.mark.parametrize("seed", range(6))
def test_walk_matches_the_divisions(seed):
    gen = random.Random(seed)
    for _ in range(40):
        experts = gen.choice([1, 2, 3, 7, 300])
        rows = 16 * gen.randint(1, 40)
        cols = 16 * gen.randint(1, 60)
        col_tiles = -(-cols // 128)
        row_tiles = -(-rows // 64)
        per_expert = row_tiles * col_tiles
        items = experts * per_expert
        for ctas in {1, 3, min(items, 132 * 4), items, gen.randint(1, items)}:
            for begin, end in _ranges(items, ctas):
                # phase 2: forward from begin
                t = sched.expert_tile(min(begin, items), col_tiles, per_expert)
                for item in range(begin, end):
                    assert t == sched.expert_tile(item, col_tiles, per_expert), (item, t)
                    t = sched.next_expert_tile(*t, col_tiles, rows, 64)
                # phase 1: backward from end - 1
                t = sched.expert_tile(max(end - 1, 0), col_tiles, per_expert)
                for k in range(end - begin):
                    item = end - 1 - k
                    assert t == sched.expert_tile(item, col_tiles, per_expert), (item, t)
                    t = sched.prev_expert_tile(*t, col_tiles, rows, 64)
