"""GPU: kernels precompiled without a GPU are loaded (not compiled) and give bit-exact results;
damaged entries and unusable cache directories still give the right answers."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from test_gpu_amax import _check as check_amax
from test_gpu_fp8 import check_fp8

from cutequant import cache, jit
from cutequant.testing import grouped_input, random_splits

pytestmark = pytest.mark.gpu


def _ops(rng):
    """The amax (RHT and plain) and FP8 (tile cast and TMA ring) kernels, checked byte for byte
    against cutequant.reference."""
    splits = random_splits(8, 2048, rng, zero_at=("middle",))
    x = grouped_input(splits, 512, rng)
    check_amax(x, splits, rht=True)
    check_amax(x, splits, rht=False)
    check_fp8(x, splits)  # bf16, both outputs: the tile cast
    scale = torch.rand(len(splits), generator=rng).cuda() * 100 + 0.5
    check_fp8(x.float(), splits, scaling="delayed", scale=scale)  # fp32: the TMA ring


def test_cpu_precompiled_entries_load_without_compiling(cache_root, rng):
    """`cutequant precompile` with no GPU visible (as on a build box) writes the entries; this
    GPU process then loads every kernel it needs from them and compiles none."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "CUTEQUANT_CACHE_DIR": str(cache_root)}
    families = ["group_tables", "group_amax", "fp8_tile_cast", "fp8_quantize"]
    cmd = [sys.executable, "-m", "cutequant.cli", "precompile", "--jobs", "8"]
    cmd += [arg for f in families for arg in ("--family", f)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout and " 0 already cached" in done.stdout

    compiles, loads = jit.stats.compiles, jit.stats.disk_loads
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)
        _ops(rng)
    assert jit.stats.compiles == compiles, "compiled although the precompiled cache had it"
    assert jit.stats.disk_loads - loads >= 4


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the object: it would still load
    path.write_bytes(bytes(data))


def test_damaged_entries_are_recompiled(cache_root, rng):
    _ops(rng)
    objs = sorted((cache_root / "kernels").glob("*.so"))
    assert len(objs) >= 4
    for obj in objs:
        _flip(obj)
    jit.clear_memory_cache()
    compiles = jit.stats.compiles
    with pytest.warns(cache.CacheWarning, match="checksum mismatch"):
        _ops(rng)
    assert jit.stats.compiles - compiles == len(objs)
    jit.clear_memory_cache()
    compiles = jit.stats.compiles
    _ops(rng)  # the replaced entries load
    assert jit.stats.compiles == compiles


def test_unusable_cache_dir_gives_right_answers(tmp_path, cache_root, monkeypatch, rng):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _ops(rng)
    messages = [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]
    assert len(messages) == 1 and "unusable" in messages[0], messages
    torch.cuda.synchronize()
