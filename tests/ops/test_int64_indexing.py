"""Offsets past 2**31 elements, in the interpreter with little memory: every kernel offset that
comes from data (token ids, pair positions, expert ids, segment starts) or from a stride.

The big tensors are views of an anonymous memory mapping whose pages exist only once touched
(Linux hands out zero pages), so a [3 * 2**30, ...] tensor costs the few rows a test writes.
2**31 elements of mapping sit before each big tensor: an offset computed in int32 wraps to a
negative one and lands there, in zeros, so the kernel returns a wrong value (instead of crashing
the run) and the test fails. Offsets that grow with the grid (row = program id) need as many
programs as rows: tests/test_large_gpu.py covers those on a GPU.
"""

from __future__ import annotations

import mmap

import pytest
import torch

from shufflemoe.ops import (combine_shuffling, gather_scale, grouped_gemm, index_shuffle,
                            scatter_add, sort_by_expert)
from shufflemoe.ops.grouped_gemm import configs

pytest.importorskip("triton")
if torch.cuda.is_available():
    pytest.skip("lazily mapped CPU tensors: the interpreter's test", allow_module_level=True)

GUARD = 2**31  # elements mapped before a big tensor, where an int32-wrapped offset lands


def lazy(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A zero tensor of ``shape`` whose memory is committed only where written."""
    numel = 1
    for s in shape:
        numel *= s
    item = torch.empty(0, dtype=dtype).element_size()
    try:
        buf = mmap.mmap(-1, (GUARD + numel) * item, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError) as e:  # a machine that does not overcommit
        pytest.skip(f"cannot map {(GUARD + numel) * item / 2**30:.0f} GiB lazily: {e}")
    flat = torch.frombuffer(buf, dtype=torch.uint8)[GUARD * item:]
    return flat.view(dtype)[:numel].view(shape)


def _rows(t: torch.Tensor, rows: list[int], seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for r in rows:
        t[r] = torch.randn(t.shape[1:], generator=g).to(t.dtype)


D = 4096
T_BIG = 3 * 2**30 // D  # rows of a [T_BIG, D] tensor: its last third lies past 2**31 elements
FAR = [T_BIG - 1, 2**31 // D, T_BIG - 7]  # rows whose first element is past 2**31
IDX = pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])


@IDX
@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "fp8"])
def test_gather_scale_reads_far_rows(idx_dtype, quantize):
    x = lazy(T_BIG, D)
    _rows(x, FAR)
    ids = torch.tensor([*FAR, 3], dtype=idx_dtype)
    w = torch.tensor([1.0, 0.5, 2.0, 1.0])
    got = gather_scale(x, ids, w, quantize=quantize, impl="triton")
    want = gather_scale(x[ids.long()].contiguous(), torch.arange(4), w, quantize=quantize,
                        impl="torch")
    if quantize:  # (q, scale): compare fp8 bytes
        (got, got_scale), (want, want_scale) = got, want
        assert torch.equal(got_scale, want_scale)
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    assert torch.equal(got, want)


@IDX
@pytest.mark.parametrize("far", ["out rows", "y rows"])
def test_scatter_add_reaches_far_rows(idx_dtype, far):
    """Atomic form: destination rows from token_ids; y rows from ``rows``."""
    g = torch.Generator().manual_seed(1)
    w = torch.tensor([0.5, 2.0, 1.0])
    if far == "out rows":
        out, y = lazy(T_BIG, D), torch.randn(3, D, generator=g).bfloat16()
        ids, rows = torch.tensor(FAR, dtype=idx_dtype), None
        scatter_add(out, y, ids, w, impl="triton")
        got, want = out[FAR], (y.float() * w[:, None]).bfloat16()
    else:
        out, y = torch.zeros(3, D, dtype=torch.bfloat16), lazy(T_BIG, D)
        _rows(y, FAR)
        ids, rows = torch.tensor([2, 0, 1], dtype=idx_dtype), torch.tensor(FAR, dtype=idx_dtype)
        scatter_add(out, y, ids, w, rows=rows, impl="triton")
        got, want = out[[2, 0, 1]], (y[FAR].float() * w[:, None]).bfloat16()
    assert torch.equal(got, want)


@IDX
def test_token_major_scatter_add_reads_far_rows(idx_dtype):
    """Token-major form: y rows from Routing.positions."""
    y = lazy(T_BIG, D)
    _rows(y, FAR + [5])
    out = torch.zeros(2, D, dtype=torch.bfloat16)
    positions = torch.tensor([FAR[0], FAR[1], FAR[2], 5], dtype=idx_dtype)  # tokens 0, 1: k = 2
    nv = torch.tensor([T_BIG], dtype=torch.int32)
    scatter_add(out, y, torch.zeros(4, dtype=torch.int32), num_valid=nv, positions=positions,
                impl="triton")
    yf = y[[FAR[0], FAR[1], FAR[2], 5]].float()
    want = torch.stack([yf[1] + yf[0], yf[3] + yf[2]]).bfloat16()  # ascending position
    assert torch.equal(out, want)


K_W, N_W = 64, 64
W_BIG = 3 * 2**30 // (K_W * N_W)  # experts of a [W_BIG, N_W, K_W] weight tensor
TILES = {"pointer loads": configs.TileConfig(16, 32, 32, tma="none"),
         "TMA descriptors": configs.TileConfig(16, 32, 32, tma="host")}


@pytest.mark.parametrize("tiles", TILES)
def test_grouped_gemm_reads_far_experts(tiles):
    """Weight rows from weight_ids (the decode strategies' group -> expert map)."""
    w = lazy(W_BIG, N_W, K_W)
    far = [W_BIG - 1, 2**31 // (N_W * K_W) + 1]
    _rows(w, far)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, K_W, generator=g).bfloat16()
    sizes, wid = torch.tensor([4, 3], dtype=torch.int32), torch.tensor(far, dtype=torch.int32)
    with configs.override(TILES[tiles]):
        got = grouped_gemm(x, w, sizes, weight_ids=wid, impl="triton")
    want = torch.cat([x[:4].float() @ w[far[0]].float().T, x[4:].float() @ w[far[1]].float().T])
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)  # bf16 output
    assert got.abs().amax() > 0.5  # the far experts' weights, not the zeros of a wrapped offset


@pytest.mark.parametrize("scatter", ["add", "add_unique", "store"])
def test_grouped_gemm_scatters_into_far_rows(scatter):
    """Destination rows from scatter_ids (GEMM2's fused scatter-add). float32: the interpreter
    accumulates a 16-bit output in a float32 copy of all of it."""
    out = lazy(3 * 2**30 // N_W, N_W, dtype=torch.float32)
    far = [out.shape[0] - 1, 2**31 // N_W + 3, out.shape[0] - 2]
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, K_W, generator=g), torch.randn(1, N_W, K_W, generator=g)
    grouped_gemm(x, w, torch.tensor([3], dtype=torch.int32),
                 scatter_ids=torch.tensor(far, dtype=torch.int64), out=out, scatter=scatter,
                 impl="triton")
    torch.testing.assert_close(out[far], x @ w[0].T, rtol=1e-5, atol=1e-5)


@IDX
def test_combine_shuffling_reads_far_segments(idx_dtype):
    """Source rows from ``starts`` (where each rank's rows begin)."""
    x = lazy(T_BIG, D)
    starts = torch.tensor([0, FAR[1]], dtype=idx_dtype)
    counts = torch.tensor([[1, 0], [2, 1]], dtype=torch.int32)  # [EP = 2, El = 2]
    _rows(x, [0, FAR[1], FAR[1] + 1, FAR[1] + 2])
    out, totals = combine_shuffling(x, counts, starts, out_rows=4, impl="triton")
    assert totals.tolist() == [3, 1]
    assert torch.equal(out, x[[0, FAR[1], FAR[1] + 1, FAR[1] + 2]])  # expert 0: r0, r1 x2; e1


ROW_STRIDE = 2**30  # elements between rows of a strided view: row 2 starts at 2**31


def _strided(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` [T, E] copied into a view whose rows are ROW_STRIDE elements apart."""
    T, E = rows.shape
    view = lazy((T - 1) * ROW_STRIDE + E, dtype=rows.dtype).as_strided((T, E), (ROW_STRIDE, 1))
    return view.copy_(rows)


def test_index_shuffle_reads_rows_past_2_31_through_a_stride():
    scores = _strided(torch.randn(3, 16, generator=torch.Generator().manual_seed(4)).bfloat16())
    kw = dict(scoring="softmax", renormalize=True)
    got = index_shuffle(scores, 2, impl="triton", **kw)
    want = index_shuffle(scores.contiguous(), 2, impl="torch", **kw)
    for f in ("counts", "token_ids", "expert_ids", "positions"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f
    torch.testing.assert_close(got.weights, want.weights)


def test_sort_by_expert_reads_rows_past_2_31_through_a_stride():
    g = torch.Generator().manual_seed(5)
    ids = _strided(torch.randint(0, 6, (3, 4), generator=g, dtype=torch.int32))
    w = _strided(torch.rand(3, 4, generator=g))
    got = sort_by_expert(ids, 6, w, impl="triton")
    want = sort_by_expert(ids.contiguous(), 6, w.contiguous(), impl="torch")
    for f in ("counts", "token_ids", "expert_ids", "positions", "weights"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f

