"""Shared pytest setup: the ``gpu`` marker skips cleanly without an sm_90 GPU, and every test
session uses a private kernel cache directory unless one is given."""

import os
import tempfile

import pytest
import torch


def _has_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


HAS_HOPPER = _has_hopper()
HAS_BLACKWELL = torch.cuda.is_available() and torch.cuda.get_device_capability() in (
    (10, 0),
    (12, 0),
)


def pytest_configure(config):
    if "CUTEQUANT_CACHE_DIR" not in os.environ:
        os.environ["CUTEQUANT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cutequant-test-cache-")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")
    skip_bw = pytest.mark.skip(reason="needs an sm_100a / sm_120a (Blackwell) GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_HOPPER:
            item.add_marker(skip)
        if "blackwell" in item.keywords and not HAS_BLACKWELL:
            item.add_marker(skip_bw)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    """A private, empty disk cache for one test (memory cache and cache warnings reset)."""
    from cutequant import cache, jit

    root = tmp_path / "cache"
    monkeypatch.setenv("CUTEQUANT_CACHE_DIR", str(root))
    monkeypatch.delenv("CUTEQUANT_DISABLE_DISK_CACHE", raising=False)
    cache.reset_state()
    jit.clear_memory_cache()
    yield root
    cache.reset_state()
    jit.clear_memory_cache()


@pytest.fixture(params=["auto", "mma_sync"], ids=["rht_auto", "rht_mma_sync"])
def rht_mma(request, monkeypatch):
    """The runtime's RHT instruction (``_launch.rht_mma``, normally CUTEQUANT_RHT_MMA): the
    arch's own ("auto": wgmma on sm_90a) and mma.sync (kernels/warp_rht.py, the sm_100a path),
    so that one set of bit-exact GPU tests proves both on Hopper. The choice is in every spec
    key: no cache mixes the two. A test parametrized with rht=False runs no RHT: the mma.sync
    copy is skipped (the amax kernel is then the same either way)."""
    from cutequant import _launch

    callspec = getattr(request.node, "callspec", None)
    if request.param == "mma_sync" and callspec is not None and callspec.params.get("rht") is False:
        pytest.skip("rht=False: no RHT instruction")
    monkeypatch.setattr(_launch, "rht_mma", lambda: request.param)
    return request.param


@pytest.fixture
def rng():
    """A fresh, logged seed per test: failures are reproducible, inputs differ per run."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
