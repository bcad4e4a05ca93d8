"""Test and benchmark inputs (``cutequant.testing``): fresh random data, uneven splits, poison."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

POISON_BYTE = 0xA5


def with_plan(builder, **settings):
    """Wrap a runtime spec builder (``fp8._spec``, ``nvfp4._spec``, ``amax._spec``) so that every
    spec it returns carries ``settings`` in its TilePlan: how tests and
    perf/probes/plan_sweep.py run the kernels with other tile plans (each plan is its own
    compiled kernel)."""

    def build(*args, **kwargs):
        spec = builder(*args, **kwargs)
        return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, **settings))

    return build


def random_splits(
    num_groups: int,
    total_rows: int | None,
    gen: torch.Generator,
    *,
    zero_at: tuple[str, ...] = (),
    multiple: int = 16,
    mean_rows: int = 128,
) -> list[int]:
    """Uneven multiples of ``multiple`` (sum ``total_rows`` if given); zero-token groups placed
    at 'front', 'middle', 'end' (or every group with 'all')."""
    if "all" in zero_at:
        return [0] * num_groups
    zeros = set()
    if "front" in zero_at:
        zeros.add(0)
    if "middle" in zero_at:
        zeros.add(num_groups // 2)
    if "end" in zero_at:
        zeros.add(num_groups - 1)
    live = [g for g in range(num_groups) if g not in zeros]
    if total_rows is None:
        units = torch.randint(1, 2 * mean_rows // multiple, (len(live),), generator=gen)
    else:
        assert total_rows % multiple == 0
        w = torch.rand(len(live), generator=gen) + 0.05
        units = (w / w.sum() * (total_rows // multiple)).floor().long()
        units[torch.argmax(w)] += total_rows // multiple - int(units.sum())
    out = [0] * num_groups
    for g, u in zip(live, units.tolist(), strict=True):
        out[g] = int(u) * multiple
    return out


def grouped_input(splits, n_cols: int, gen: torch.Generator, device="cuda") -> torch.Tensor:
    """bf16 [sum(splits), N]: normal data with a different scale per group plus rare outliers,
    so per-group amaxes differ and blocks span many binades."""
    m = sum(splits)
    g_cuda = torch.Generator(device=device).manual_seed(
        int(torch.randint(0, 2**62, (1,), generator=gen))
    )
    x = torch.randn(m, n_cols, device=device, generator=g_cuda)
    scales = torch.exp2(torch.randint(-8, 8, (max(len(splits), 1),), generator=gen).float())
    row_scale = torch.repeat_interleave(scales[: len(splits)], torch.tensor(splits)).to(device)
    x = x * row_scale[:, None]
    spikes = torch.rand(m, n_cols, device=device, generator=g_cuda) < 1e-4
    x = torch.where(spikes, x * 64, x)
    return x.to(torch.bfloat16)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill every byte of ``t`` with POISON_BYTE (so an unwritten byte is detectable)."""
    t.view(torch.uint8).fill_(POISON_BYTE)
    return t


@contextlib.contextmanager
def poisoned_outputs(byte: int = POISON_BYTE):
    """Within the block, every output buffer a cutequant op allocates is pre-filled with
    ``byte``, so an unwritten byte shows up as a mismatch."""
    from cutequant import _launch

    saved = _launch.output_allocator

    def alloc(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        t.view(torch.uint8).fill_(byte)
        return t

    _launch.output_allocator = alloc
    try:
        yield
    finally:
        _launch.output_allocator = saved


def rcp_approx_ftz(t: torch.Tensor) -> torch.Tensor:
    """Elementwise ``rcp.approx.ftz.f32`` on the GPU (Triton inline PTX): the reciprocal TE's
    fast math uses, so the fast-math reference can be compared bit for bit."""
    import triton
    import triton.language as tl

    @triton.jit
    def _rcp(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
        tl.store(y_ptr + offs, y, mask=mask)

    x = t.contiguous().float()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _rcp[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y.view(t.shape)
