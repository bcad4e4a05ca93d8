"""GPU: 2D (16x16-block) NVFP4 weight quantization, every byte against
cutequant.recipe_reference (outputs poisoned first: scale padding included)."""

import pytest
import torch
from recipe_util import assert_same_bits

from cutequant import nvfp4_2d, recipe_reference, reference
from cutequant.testing import poisoned_outputs

pytestmark = pytest.mark.gpu


# the fake-quant's ways to its amax: (listed, AMAX_PASS_STACKED)
FAKE_PATHS = {"stacked-amax-pass": (False, True), "stacked-cooperative": (False, False),
              "list": (True, True)}  # fmt: skip


@pytest.fixture(params=[True, False], ids=["amax-pass", "cooperative"])
def stacked_amax_path(request, monkeypatch):
    """Both ways a 2D fake-quant of stacked experts computes its amax: the grouped amax pass,
    then the given-amax kernel (two launches, the default), and the cooperative launch (which
    lists of experts and the quantize always take)."""
    monkeypatch.setattr(nvfp4_2d, "AMAX_PASS_STACKED", request.param)
    return request.param


DIRECTIONS = [(True, True), (True, False), (False, True)]
KEYS = ("row_data", "row_scales", "col_data", "col_scales", "amax")


def _weights(e, rows, cols, dtype, gen, spread=True):
    w = torch.randn(e, rows, cols, generator=gen)
    if spread:  # per-expert and per-block magnitudes over many binades, rare outliers
        w = w * torch.exp2(torch.randint(-10, 10, (e, 1, 1), generator=gen).float())
        w = w * torch.exp2(
            torch.randint(-6, 6, (e, rows // 16, 1, cols // 16, 1), generator=gen).float()
        ).expand(e, rows // 16, 16, cols // 16, 16).reshape(e, rows, cols)
        w = torch.where(torch.rand(e, rows, cols, generator=gen) < 1e-3, w * 50, w)
    return w.to(dtype).cuda()


def check_2d(weights, *, rowwise=True, columnwise=True, swizzled=False, amax=None):
    nvfp4_2d._check_nvfp4_quantize_2d(weights, rowwise, columnwise, swizzled, amax)
    with poisoned_outputs():
        got = nvfp4_2d.nvfp4_quantize_2d_impl(weights, rowwise, columnwise, swizzled, amax)
    torch.cuda.synchronize()
    cpu = weights.cpu() if isinstance(weights, torch.Tensor) else [w.cpu() for w in weights]
    want = recipe_reference.nvfp4_quantize_2d_experts(
        cpu, swizzled=swizzled, amax=None if amax is None else amax.cpu()
    )
    rd, rs, cd, cs, a = got
    assert_same_bits(a, want["amax"], "amax")
    for key, t, on in (
        ("row_data", rd, rowwise),
        ("row_scales", rs, rowwise),
        ("col_data", cd, columnwise),
        ("col_scales", cs, columnwise),
    ):
        if not on:
            assert t.numel() == 0, key
            continue
        a_, b_ = t.cpu().reshape(-1), want[key].reshape(-1)
        assert a_.numel() == b_.numel(), (key, a_.numel(), b_.numel())
        bad = (a_ != b_).nonzero()
        assert len(bad) == 0, f"{key}: {len(bad)} bytes differ, first at {int(bad[0])}"
    return got


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=["both", "row", "col"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_every_variant(dtype, direction, swizzled, rng):
    """144 x 272: partial row and column tiles, padded scale blocks in both directions."""
    rowwise, columnwise = direction
    w = _weights(3, 144, 272, dtype, rng)
    check_2d(w, rowwise=rowwise, columnwise=columnwise, swizzled=swizzled)


@pytest.mark.parametrize("shape", [(16, 16), (128, 128), (256, 384), (1024, 2048), (2048, 7168)])
def test_shapes(shape, rng):
    w = _weights(2, *shape, torch.bfloat16, rng)
    check_2d(w, swizzled=True)
    check_2d(w)


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
def test_list_of_experts_equals_stacked(swizzled, rng):
    """Separately allocated experts (pointer array) give the stacked result; the pointer table
    is built once per address list."""
    stacked = _weights(5, 96, 160, torch.bfloat16, rng)
    experts = [stacked[e].clone() for e in range(5)]
    a = check_2d(experts, swizzled=swizzled)
    b = check_2d(stacked, swizzled=swizzled)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    before = len(nvfp4_2d._PTR_TABLES)
    check_2d(experts, swizzled=swizzled)
    assert len(nvfp4_2d._PTR_TABLES) == before


def test_many_experts_and_given_amax(rng):
    w = _weights(64, 32, 64, torch.bfloat16, rng)
    check_2d(w)
    amax = torch.rand(64, generator=rng).cuda() * 10
    check_2d(w, amax=amax)
    # the returned amax is the kernel's copy of the given one (poisoned first), not an alias
    for _ in range(3):  # the checked path, then replays
        with poisoned_outputs():
            got = [
                nvfp4_2d.nvfp4_quantize_weights_2d(w, amax=amax).amax,
                nvfp4_2d.nvfp4_fake_quantize_weights_2d(w, amax=amax)[1],
            ]
        for a in got:
            assert a.data_ptr() != amax.data_ptr() and torch.equal(a, amax)


def test_extremes():
    """TE's extremes: all zero, all +-dtype max, and NaN / inf entries (amax NaN / inf)."""
    for dtype in (torch.bfloat16, torch.float32):
        big = torch.finfo(dtype).max
        w = torch.full((2, 64, 128), big, dtype=dtype, device="cuda")
        w[:, 1::2] = -big
        check_2d(w)
        check_2d(torch.zeros(2, 64, 128, dtype=dtype, device="cuda"))
        w = torch.randn(3, 64, 128, device="cuda").to(dtype)
        w[0, 5, 7] = float("nan")
        w[1, 20, 100] = float("inf")
        w[2, 3, 3] = -float("inf")
        check_2d(w)


def test_public_api_round_trip(rng):
    """nvfp4_quantize_weights_2d + dequantize: W from the rowwise half equals W^T from the
    columnwise half, and is close to W."""
    w = _weights(2, 256, 512, torch.bfloat16, rng, spread=False)
    q = nvfp4_2d.nvfp4_quantize_weights_2d(w)
    for e in range(2):
        parts = q.expert(e)
        row = reference.nvfp4_dequantize(
            parts["row_data"].cpu(),
            parts["row_scales"].cpu(),
            parts["amax"].cpu(),
            shape=(256, 512),
        )
        col = reference.nvfp4_dequantize(
            parts["col_data"].cpu(),
            parts["col_scales"].cpu(),
            parts["amax"].cpu(),
            shape=(512, 256),
        )
        assert torch.equal(row, col.t())
        ref = w[e].float().cpu()
        assert (row - ref).norm() / ref.norm() < 0.25  # 16x16 blocks: ~0.13 on randn


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
def test_dequantize_2d_with_the_grouped_kernel(swizzled, rng):
    """2D results dequantize with the grouped dequantize kernel (experts = groups): both
    directions give the same [E, R, C], equal to the reference dequantize."""
    w = _weights(3, 144, 272, torch.bfloat16, rng)
    q = nvfp4_2d.nvfp4_quantize_weights_2d(w, swizzled_scales=swizzled)
    with poisoned_outputs():
        row = q.dequantize()
        col = q.dequantize(columnwise=True)
    torch.cuda.synchronize()
    assert torch.equal(row, col)
    want = recipe_reference.nvfp4_group_dequantize(
        q.row_data.cpu().view(-1, 136),
        q.row_scales.cpu(),
        q.amax.cpu(),
        [144] * 3,
        272,
        swizzled=swizzled,
    )
    assert_same_bits(row.view(-1, 272), want, "2D dequantize")


def _kernels_in(fn) -> int:
    """CUDA kernels one call of ``fn`` launches, torch's included (memsets and memcpys not
    counted); the call runs once before, outside the profile (compile / load, runtime
    buffers made on first use)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len([n for n in names if not n.lower().startswith(("memcpy", "memset"))])


@pytest.mark.parametrize("listed", [False, True], ids=["stacked", "list"])
def test_launches(listed, stacked_amax_path, rng):
    """The quantize is one launch, with or without a given amax (a computed amax comes from
    the same persistent launch: phase 1, grid barrier, phase 2; a given one is copied into the
    output by the kernel, not by a torch clone); so is the fake-quant, except of stacked experts
    without a given amax (``AMAX_PASS_STACKED``): the grouped amax pass, then the kernel."""
    w = _weights(6, 144, 272, torch.bfloat16, rng)
    weights = [w[e].clone() for e in range(6)] if listed else w
    amax = w.float().abs().amax(dim=(1, 2))
    for given in (None, amax):
        pass_first = given is None and not listed and stacked_amax_path
        for op, want in (
            (nvfp4_2d.nvfp4_quantize_weights_2d, 1),
            (nvfp4_2d.nvfp4_fake_quantize_weights_2d, 2 if pass_first else 1),
        ):
            for _ in range(3):  # first sighting, checked, replayed
                assert _kernels_in(lambda op=op, given=given: op(weights, amax=given)) == want


@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
@pytest.mark.parametrize("listed", [False, True], ids=["stacked", "list"])
@pytest.mark.parametrize("experts", [1, 300])
def test_one_and_300_experts(experts, listed, swizzled, rng):
    """300 experts of 96 x 272 (1200 tiles + 300 padding items: more work items than a
    cooperative grid holds, so CTAs loop) and one of 1040 x 400; every direction; list = the
    pointer table."""
    shape = (96, 272) if experts == 300 else (1040, 400)
    w = _weights(experts, *shape, torch.bfloat16, rng)
    weights = [w[e].clone() for e in range(experts)] if listed else w
    for rowwise, columnwise in DIRECTIONS:
        check_2d(weights, rowwise=rowwise, columnwise=columnwise, swizzled=swizzled)


def test_zero_size_experts():
    """R = 0 or C = 0: nothing to launch; amax 0 and the scale blocks all padding (zero)."""
    for shape in ((3, 0, 128), (3, 64, 0), (2, 0, 0)):
        for dtype in (torch.bfloat16, torch.float32):
            w = torch.zeros(shape, dtype=dtype, device="cuda")
            check_2d(w)
            check_2d(w, swizzled=True)
            check_2d([w[e] for e in range(shape[0])], rowwise=False)


@pytest.mark.parametrize("path", FAKE_PATHS)
def test_fake_quant_300_experts_and_extremes(path, monkeypatch, rng):
    listed, amax_pass = FAKE_PATHS[path]
    monkeypatch.setattr(nvfp4_2d, "AMAX_PASS_STACKED", amax_pass)
    w = _weights(300, 32, 144, torch.bfloat16, rng)
    w[7] = 0
    w[8, 3, 5] = float("nan")
    w[9, 0, 0] = float("inf")
    w[10] = torch.finfo(torch.bfloat16).max
    weights = [w[e] for e in range(300)] if listed else w
    with poisoned_outputs():
        y, amax = nvfp4_2d.nvfp4_fake_quantize_2d_impl(weights, None, torch.bfloat16)
    want, want_amax = recipe_reference.nvfp4_fake_quantize_2d_experts(w.cpu())
    assert_same_bits(amax, want_amax, "amax")
    assert_same_bits(y, want, "fake 2D")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(3, 144, 272), (1, 1040, 400), (7, 16, 16), (2, 64, 2048)])
@pytest.mark.parametrize("path", FAKE_PATHS)
def test_fake_quant_every_input(path, shape, dtype, out_dtype, monkeypatch, rng):
    """The 2D fake-quant with a computed amax, every input and output dtype, partial tiles and
    1-tile experts, stacked (both amax paths) and listed: bits (and the amax) against the
    reference; replayed calls (the third on) too, every output poisoned first."""
    listed, amax_pass = FAKE_PATHS[path]
    monkeypatch.setattr(nvfp4_2d, "AMAX_PASS_STACKED", amax_pass)
    w = _weights(*shape, dtype, rng)
    want, want_amax = recipe_reference.nvfp4_fake_quantize_2d_experts(w.cpu(), out_dtype=out_dtype)
    weights = [w[e].clone() for e in range(shape[0])] if listed else w
    for _ in range(3):  # first sighting of the amax pass's split list, checked, replayed
        with poisoned_outputs():
            y, amax = nvfp4_2d.nvfp4_fake_quantize_weights_2d(weights, out_dtype=out_dtype)
        assert_same_bits(amax, want_amax, "amax")
        assert_same_bits(y, want, "fake 2D")


def test_fake_quant_streams_and_cuda_graph(rng):
    """The amax pass's scratch is per stream: two streams' calls interleaved, then a CUDA
    graph of two calls replayed on new weights; every result against the reference."""
    a = _weights(4, 128, 256, torch.bfloat16, rng)
    b = _weights(40, 64, 128, torch.bfloat16, rng)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for _ in range(3):
        for w, st in ((a, streams[0]), (b, streams[1])):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                outs.append((w, nvfp4_2d.nvfp4_fake_quantize_weights_2d(w)))
    torch.cuda.synchronize()
    for w, (y, amax) in outs:
        want, want_amax = recipe_reference.nvfp4_fake_quantize_2d_experts(w.cpu())
        assert_same_bits(amax, want_amax, "amax")
        assert_same_bits(y, want, "fake 2D")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=streams[0]):
        got = [nvfp4_2d.nvfp4_fake_quantize_weights_2d(w) for w in (a, b)]
    for _ in range(2):
        a.copy_(_weights(4, 128, 256, torch.bfloat16, rng))
        b.copy_(_weights(40, 64, 128, torch.bfloat16, rng))
        graph.replay()
        torch.cuda.synchronize()
        for w, (y, amax) in zip((a, b), got, strict=True):
            want, want_amax = recipe_reference.nvfp4_fake_quantize_2d_experts(w.cpu())
            assert_same_bits(amax, want_amax, "graph amax")
            assert_same_bits(y, want, "graph fake 2D")


def test_back_to_back_and_cuda_graph(rng):
    """The grid barrier's words are reused launch after launch (the count left at zero, the
    generation moving on): calls of different grid sizes back to back on one stream, then a
    CUDA graph of two calls replayed on new weights, each result checked."""
    ws = [_weights(e, 64, 128 * (1 + e % 3), torch.bfloat16, rng) for e in (1, 5, 40, 300)]
    results = [nvfp4_2d.nvfp4_quantize_2d_impl(w, True, True, False, None) for w in ws * 2]
    torch.cuda.synchronize()
    for w, got in zip(ws * 2, results, strict=True):
        want = recipe_reference.nvfp4_quantize_2d_experts(w.cpu())
        for key, t in zip(KEYS, got, strict=True):
            assert torch.equal(t.cpu(), want[key]), key
    a = _weights(4, 128, 256, torch.bfloat16, rng)
    b = _weights(40, 64, 128, torch.bfloat16, rng)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        nvfp4_2d.nvfp4_quantize_2d_impl(a, True, True, True, None)  # warm-up: compile / load
        nvfp4_2d.nvfp4_quantize_2d_impl(b, True, True, True, None)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out_a = nvfp4_2d.nvfp4_quantize_2d_impl(a, True, True, True, None)
        out_b = nvfp4_2d.nvfp4_quantize_2d_impl(b, True, True, True, None)
    for _ in range(3):
        a.copy_(_weights(4, 128, 256, torch.bfloat16, rng))
        b.copy_(_weights(40, 64, 128, torch.bfloat16, rng))
        graph.replay()
        torch.cuda.synchronize()
        for w, got in ((a, out_a), (b, out_b)):
            want = recipe_reference.nvfp4_quantize_2d_experts(w.cpu(), swizzled=True)
            for key, t in zip(KEYS, got, strict=True):
                assert torch.equal(t.cpu().reshape(-1), want[key].reshape(-1)), key
