"""CPU: host split validation, lookup tables, offsets, disk-cache plumbing."""

import json

import numpy as np
import pytest
import torch

from cutequant import groups, jit
from cutequant.codegen import specs as S


def test_host_tables_match_the_definition():
    splits = (0, 16, 48, 64, 0, 272, 128)
    t = groups.host_tables(splits)
    rows, tiles, rscale, cscale = (t[i].tolist() for i in range(4))
    acc = [0, 0, 0, 0]
    for g, s in enumerate(splits):
        assert rows[g] == acc[0] and tiles[g] == acc[1]
        assert rscale[g] == acc[2] and cscale[g] == acc[3]
        acc[0] += s
        acc[1] += -(-s // 64)
        acc[2] += -(-s // 128) * 128
        acc[3] += -(-(s // 16) // 4) * 4
    assert [rows[-1], tiles[-1], rscale[-1], cscale[-1]] == acc
    assert t.dtype == torch.int32 and t.shape == (4, len(splits) + 1)


def test_host_tables_random_lists_and_overflow():
    """The Python prefix sums against torch's cumsum of the same counts, for random lists of
    1-300 groups (their totals too), and the int32 overflow error."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(50):
        g = int(torch.randint(1, 300, (1,), generator=gen))
        s = torch.randint(0, 200, (g,), generator=gen) * 16
        s[torch.rand(g, generator=gen) < 0.2] = 0
        counts = torch.stack([s, (s + 63) // 64, (s + 127) // 128 * 128, (s // 16 + 3) // 4 * 4])
        want = torch.zeros(4, g + 1, dtype=torch.int64)
        want[:, 1:] = counts.cumsum(dim=1)
        values = tuple(s.tolist())
        assert torch.equal(groups.host_tables(values).long(), want)
        assert groups.host_totals(values) == tuple(want[:, -1].tolist())
    with pytest.raises(ValueError, match="overflows the int32"):
        groups.host_tables((2**31 - 16, 16))


@pytest.mark.parametrize(
    "splits",
    [[16, 32], (0, 48, 0), [True, 16], [False, 48], [16.0, 32], [np.int64(16), 32], [-16, 64],
     [8, 40], [16, 16, 16], [48, 16]],
)  # fmt: skip
def test_fast_split_validation_agrees_with_the_loop(splits):
    """``_validate_host_splits``'s builtin-only fast path accepts exactly what the per-group
    loop accepts, with the same values (errors come from the loop, naming the split)."""
    m_rows = 48

    def loop(values):
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise TypeError(i)
            if v < 0 or v % 16:
                raise ValueError(i)
        if sum(values) != m_rows:
            raise ValueError("sum")
        return tuple(int(v) for v in values)

    try:
        want = loop(splits)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            groups._validate_host_splits(splits, m_rows)
    else:
        got = groups._validate_host_splits(splits, m_rows)
        assert got == want and all(type(v) is int for v in got)


def test_tile_records_match_the_tables():
    """One record per 64-row tile (group, group's first row, group's rows, tile within the
    group), in tile order, skipping empty groups; on the device right after the tables, then
    one scale record per tile (the group's first row-scale row and column-scale column)."""
    splits = (0, 16, 130 // 16 * 16, 64, 0, 272)
    t = groups.host_tables(splits)
    want, want_scales = [], []
    row0 = rscale = cscale = 0
    for g, s in enumerate(splits):
        want += [[g, row0, s, k] for k in range(-(-s // 64))]
        want_scales += [[rscale, cscale]] * -(-s // 64)
        row0 += s
        rscale += -(-s // 128) * 128
        cscale += -(-(s // 16) // 4) * 4
    assert groups.host_tile_records(t).tolist() == want
    assert groups.host_tile_records(groups.host_tables((0, 0))).shape == (0, 4)
    assert groups.host_scale_records(t).tolist() == want_scales
    assert groups.host_scale_records(groups.host_tables((0, 0))).shape == (0, 2)

    cpu = torch.device("cpu")
    plain = groups.prepare_groups(list(splits), sum(splits), cpu)
    assert plain.tile_tables is None
    layout = groups.prepare_groups(list(splits), sum(splits), cpu, tile_records=True)
    buf = layout.tile_tables  # built on first use, for the entry cached without them
    assert torch.equal(buf[: t.numel()].view(t.shape), t)
    records = buf[t.numel() :]
    assert records[: 4 * len(want)].view(-1, 4).tolist() == want
    assert records[4 * len(want) :].view(-1, 2).tolist() == want_scales
    again = groups.prepare_groups(tuple(splits), sum(splits), cpu, tile_records=True)
    assert again.tile_tables is buf and torch.equal(again.tables, layout.tables)
    # a split list first seen by a call that needs the records: one buffer for both
    other = (48, 0, 80)
    first = groups.prepare_groups(list(other), 128, cpu, tile_records=True)
    assert torch.equal(first.tables, groups.host_tables(other))
    assert first.tables.data_ptr() == first.tile_tables.data_ptr()


@pytest.mark.parametrize(
    "splits,m,match",
    [
        ([16, -16, 16], 16, "negative"),
        ([16, 20], 36, "multiple of 16"),
        ([16, 16], 48, "sum to 32"),
        ([], 0, "at least one group"),
        ([16.0], 16, "not an int"),
        ([True], 16, "not an int"),
        (torch.tensor([[16]]), 16, "1-D"),
        (torch.tensor([16.0]), 16, "integer tensor"),
        ("16", 16, "is not an int"),
    ],
)
def test_bad_host_splits(splits, m, match):
    with pytest.raises((ValueError, TypeError), match=match):
        groups.check_splits(splits, m)


@pytest.mark.parametrize("bad", [[1024.0, 0, 32.0], [1024, False, 32], [1024, 0, 32.0]], ids=str)
def test_non_int_splits_rejected_after_an_equal_int_list_was_cached(bad):
    """1024.0 and False hash like 1024 and 0: the types are checked before the cache lookup,
    in check_splits and in prepare_groups (which keeps its own cache)."""
    good = [1024, 0, 32]
    cpu = torch.device("cpu")
    assert groups.check_splits(good, 1056) == (1024, 0, 32)
    groups.prepare_groups(good, 1056, cpu)
    with pytest.raises(TypeError, match=r"splits\[\d\] = .* is not an int"):
        groups.check_splits(bad, 1056)
    with pytest.raises(TypeError, match="is not an int"):
        groups.prepare_groups(bad, 1056, cpu)


def test_host_splits_are_cached_and_accept_tensors_and_tuples():
    assert groups.check_splits([np.int64(16), 0, np.int32(32)], 48) == (16, 0, 32)
    assert groups.check_splits([16, 0, 32], 48) == (16, 0, 32)
    assert groups.check_splits((16, 0, 32), 48) == (16, 0, 32)
    assert groups.check_splits(torch.tensor([16, 0, 32]), 48) == (16, 0, 32)
    assert groups.check_splits([0, 0], 0) == (0, 0)


def test_thousands_of_groups():
    splits = [16 * (g % 5) for g in range(5000)]
    t = groups.host_tables(tuple(splits))
    assert int(t[0, -1]) == sum(splits)


def test_rendered_source_is_written_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(tmp_path))
    spec = S.GroupTablesSpec(splits_int64=True)
    jit._MODULES.clear()
    module = jit.load_module(spec)
    files = list((tmp_path / "src").glob("*.py"))
    assert (
        len(files) == 1
        and files[0].read_text() == module.__loader__.get_data(str(files[0])).decode()
    )
    assert not list((tmp_path / "src").glob(".*")), "temporary files left behind"
    json.dumps(spec.fields())


def test_output_offsets_from_host_splits():
    splits = (0, 64, 16, 0, 208)
    layout = groups.GroupLayout(len(splits), sum(splits), groups.host_tables(splits), splits)
    n = 272
    off = groups.byte_offsets(layout, n)
    row0 = [0, 0, 64, 80, 80, 288]
    cp = 20  # roundup(272 / 16, 4)
    rscale = [0, 0, 128, 256, 256, 512]
    cscale = [0, 0, 4, 8, 8, 24]
    assert off[0].tolist() == [r * n // 2 for r in row0]
    assert off[1].tolist() == [r * cp for r in rscale]
    assert off[2].tolist() == [r * n // 2 for r in row0]
    assert off[3].tolist() == [c * 384 for c in cscale]  # roundup(272, 128) = 384
    assert groups.element_offsets(layout, n).tolist() == [[r * n for r in row0]] * 2


def test_checked_splits_and_layouts_do_not_share_cache_entries():
    """check_splits then prepare_groups on a device whose index is None (the CPU): the second
    gets a layout, not the first's validated tuple."""
    splits = [48, 16, 0]
    assert groups.check_splits(splits, 64) == (48, 16, 0)
    layout = groups.prepare_groups(splits, 64, torch.device("cpu"))
    assert isinstance(layout, groups.GroupLayout)
    assert layout.host_splits == (48, 16, 0) and layout.host_totals == (64, 2, 256, 8)
    assert layout.tables.tolist()[0] == [0, 48, 64, 64]


def test_workspace_scratch_grows_with_the_groups():
    """The stream workspace's fp32 scratch (the 2D fake-quant's amax pass writes [2, E] there)
    holds two words per group, like the fold words, and grows with them."""
    dev = torch.device("cpu")
    small = groups.workspace(dev, 8, 12345)
    assert small.scratch.dtype == torch.float32
    assert small.scratch.numel() >= 16 and small.scratch.numel() == small.fold.numel()
    big = groups.workspace(dev, 5000, 12345)
    assert big.scratch.numel() >= 10000 and big.scratch.numel() == big.fold.numel()
    assert groups.workspace(dev, 8, 12345) is big  # a grown workspace serves smaller calls


def test_2d_fake_quant_amax_pass_applies(monkeypatch):
    """Which 2D fake-quant calls take the grouped amax pass: stacked experts without a given
    amax, with rows, within the amax kernel's 32-bit indexing; never a list, a given amax or
    the switch off."""
    from cutequant import nvfp4_2d

    w = torch.empty(4, 64, 128, dtype=torch.bfloat16, device="meta")
    assert nvfp4_2d.amax_pass_applies(w, None)
    assert not nvfp4_2d.amax_pass_applies(w, torch.ones(4))
    assert not nvfp4_2d.amax_pass_applies([w[0], w[1]], None)
    assert not nvfp4_2d.amax_pass_applies(w[:, :0], None)
    huge = torch.empty(2**16, 2**15, 2**6, dtype=torch.bfloat16, device="meta")  # 2^37 values
    assert not nvfp4_2d.amax_pass_applies(huge, None)
    monkeypatch.setattr(nvfp4_2d, "AMAX_PASS_STACKED", False)
    assert not nvfp4_2d.amax_pass_applies(w, None)
