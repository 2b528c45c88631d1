"""Tensors of more than 2**31 elements on a GPU: every kernel and the whole layer, with T * D (and
A * D, A * 2I, M * K, M * N, T * E) past 2**31, so each offset that grows with the program id is
computed in int64 (tests/ops/test_int64_indexing.py covers, in the interpreter, the offsets that
come from data or strides). Rows on both sides of element 2**31 are checked against the torch
references on those rows. Each test needs 5-25 GB of GPU memory; skipped without a GPU or the
memory. The H100 command: PYTHONPATH=src python -m pytest -q tests/test_large_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from shufflemoe import MoE, MoEConfig
from shufflemoe.ops import (gather_scale, grouped_gemm, index_shuffle, scatter_add, silu_mul,
                            sort_by_expert)
from shufflemoe.reference import naive_moe
from shufflemoe.testing import assert_close

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
D = 4096
T = 2**31 // D + 1024  # [T, D] has 2**31 + 4 M elements: its last 1024 rows lie past 2**31


def sample_rows(n: int, width: int) -> list[int]:
    """Rows at the start, the middle, the first row past element 2**31, and the end."""
    return sorted({0, 1, n // 2, 2**31 // width, 2**31 // width + 1, n - 2, n - 1})


def needs_gib(gib: float) -> None:
    free = torch.cuda.mem_get_info()[0] if CUDA else 0
    if free < gib * 2**30:
        pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free / 2**30:.0f} free")


@pytest.fixture(autouse=True)
def _release_memory():
    yield
    if CUDA:
        torch.cuda.empty_cache()


def _randn(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=dtype)


@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "fp8"])
def test_gather_scale(quantize):
    needs_gib(10)
    x = _randn(T, D)
    ids = torch.arange(T - 1, -1, -1, device="cuda", dtype=torch.int32)  # far rows <-> near rows
    w = torch.rand(T, device="cuda") + 0.5
    got = gather_scale(x, ids, w, quantize=quantize)
    rows = sample_rows(T, D)
    want = gather_scale(x[ids[rows].long()].contiguous(), torch.arange(len(rows), device="cuda"),
                        w[rows].contiguous(), quantize=quantize, impl="torch")
    if quantize:
        assert torch.equal(got[1][rows], want[1])
        got, want = got[0].view(torch.uint8), want[0].view(torch.uint8)
    assert torch.equal(got[rows], want)


@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "fp8"])
def test_silu_mul(quantize):
    needs_gib(14)
    A, I = T, D  # h [A, 2I]: 2**32 + elements; out [A, I]: past 2**31
    h = _randn(A, 2 * I)
    got = silu_mul(h, quantize=quantize)
    rows = sample_rows(A, I)
    want = silu_mul(h[rows].contiguous(), quantize=quantize, impl="torch")
    if quantize:  # compare dequantized values: one e4m3 step where the float32 exps differ
        got = got[0][rows].float() * got[1][rows, None]
        want = want[0].float() * want[1][:, None]
        torch.testing.assert_close(got, want, rtol=0.07, atol=1e-3)
    else:
        assert_close(got[rows], want.double(), torch.bfloat16)


@pytest.mark.parametrize("form", ["atomic", "token-major"])
def test_scatter_add(form):
    needs_gib(10)
    y = _randn(T, D)
    perm = torch.randperm(T, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    out = torch.zeros(T, D, device="cuda", dtype=torch.bfloat16)  # 0 + y is exact
    if form == "atomic":  # pair i (row i of y) goes to token perm[i]
        scatter_add(out, y, perm.int())
        src = torch.empty_like(perm).scatter_(0, perm, torch.arange(T, device="cuda"))
    else:  # token t's one pair sits at row perm[t]
        scatter_add(out, y, torch.zeros(T, dtype=torch.int32, device="cuda"), positions=perm.int())
        src = perm
    rows = sample_rows(T, D)
    assert torch.equal(out[rows], y[src[rows]])


@pytest.mark.parametrize("scatter", [False, True], ids=["store", "scatter-add"])
def test_grouped_gemm(scatter):
    needs_gib(12)
    M, K, N = 2**31 // 2048 + 512, 2048, 2048  # x [M, K] and out [M, N] past 2**31
    x, w = _randn(M, K), _randn(4, N, K, seed=1) / K**0.5
    sizes = torch.tensor([M // 4, M // 4, M // 4, M - 3 * (M // 4)], device="cuda",
                         dtype=torch.int32)
    rows = sample_rows(M, K)
    group = torch.repeat_interleave(torch.arange(4, device="cuda"), sizes.long())[rows]
    want = torch.stack([x[r].double() @ w[g].double().T for r, g in zip(rows, group.tolist())])
    if scatter:
        perm = torch.arange(M - 1, -1, -1, device="cuda")
        out = torch.zeros(M, N, device="cuda", dtype=torch.bfloat16)
        grouped_gemm(x, w, sizes, scatter_ids=perm, out=out, scatter="add_unique")
        got = out[perm[rows]]
    else:
        got = grouped_gemm(x, w, sizes)[rows]
    assert_close(got, want, torch.bfloat16)


def test_index_shuffle():
    """Top-1 of scores [Tr, 128] past 2**31 elements, against argmax and a stable sort of the
    whole batch (the torch reference's full sort of the scores would need 40 GB)."""
    needs_gib(12)
    Tr, E = 2**31 // 128 + 1024, 128
    scores = _randn(Tr, E)
    got = index_shuffle(scores, 1, scoring="sigmoid")
    best = scores.argmax(1)  # the first maximum: ties go to the lower expert id, as the kernel's
    order = torch.sort(best, stable=True)
    assert torch.equal(got.counts, torch.bincount(best, minlength=E).int())
    assert int(got.num_valid) == Tr
    assert torch.equal(got.expert_ids, order.values.int())
    assert torch.equal(got.token_ids, order.indices.int())
    assert torch.equal(got.positions.long(), torch.empty_like(best).scatter_(
        0, order.indices, torch.arange(Tr, device="cuda")))
    want = torch.sigmoid(scores.gather(1, best[:, None]).float())[order.indices, 0]
    torch.testing.assert_close(got.weights, want)


def test_layer():
    """The whole layer with x [T, D], the gathered rows [T * k, D] and the output past 2**31."""
    needs_gib(30)
    cfg = MoEConfig(hidden_size=D, intermediate_size=256, num_experts=8, top_k=2,
                    renormalize=True, shared_intermediate_size=256)
    torch.manual_seed(0)
    layer = MoE(cfg, device="cuda")
    x = _randn(T, D)
    out = layer(x)
    routing = layer.route(x)
    rows = sample_rows(T, D)
    chosen = routing.dense_weights(T)[rows]  # [n, E]: the full batch's routing of those rows
    ids = chosen.topk(cfg.top_k, dim=1).indices
    sub = sort_by_expert(ids, cfg.num_experts, chosen.gather(1, ids))
    ref, mag = naive_moe(layer, x[rows], sub, with_magnitude=True)
    assert_close(out[rows], ref, torch.bfloat16, magnitude=mag)
