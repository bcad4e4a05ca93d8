"""GPU: the disk cache round trip (export_to_c -> load_module) and corrupt-entry recovery."""

import pytest
import torch

import cutequant
from cutequant import jit
from cutequant.testing import grouped_input

pytestmark = pytest.mark.gpu


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTEQUANT_DISABLE_DISK_CACHE", raising=False)
    jit.clear_memory_cache()
    yield tmp_path
    jit.clear_memory_cache()


def _amax(x, splits):
    row, col = cutequant.group_amax(x, splits)
    torch.cuda.synchronize()
    return torch.stack([row, col]).cpu()


def test_disk_round_trip_and_corrupt_entry(fresh_cache, rng):
    splits = [64, 128, 0, 32]
    x = grouped_input(splits, 512, rng)
    c0 = jit.stats.compiles
    first = _amax(x, splits)
    assert jit.stats.compiles - c0 >= 1
    objs = sorted((fresh_cache / "kernels").glob("*.o"))
    assert objs, "no exported object in the disk cache"

    jit.clear_memory_cache()
    c1, l1 = jit.stats.compiles, jit.stats.disk_loads
    again = _amax(x, splits)
    assert jit.stats.compiles == c1, "recompiled although the disk cache held the kernel"
    assert jit.stats.disk_loads > l1
    assert torch.equal(first, again)

    for obj in objs:
        obj.write_bytes(b"not an object file")
    jit.clear_memory_cache()
    c2 = jit.stats.compiles
    with pytest.warns(UserWarning, match="dropping unreadable cache entry"):
        recovered = _amax(x, splits)
    assert jit.stats.compiles > c2
    assert torch.equal(first, recovered)
