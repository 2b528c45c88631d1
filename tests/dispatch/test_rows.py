"""The row movers expert parallelism adds around the ops: fp8 rows gathered bit for bit (as 16-bit
words through gather_scale), only the valid rows written, and the zeroing of valid rows only."""

from __future__ import annotations

import pytest
import torch

from shufflemoe.dispatch.ep import zero_rows
from shufflemoe.experts.base import QuantizedRows, gather_input, gather_rows
from shufflemoe.ops import ops_for
from shufflemoe.ops import FP8_DTYPE, use_impl
from shufflemoe.testing import poisoned
from shufflemoe.types import ExpertWeights

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run on the GPU when there is one


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("width", [32, 7])  # 7 bytes: an odd row falls back to index_select
def test_fp8_rows_move_bit_for_bit(impl, width):
    every_byte = torch.arange(256, dtype=torch.uint8).repeat(width)[: 40 * width]
    src = every_byte.view(40, width).view(FP8_DTYPE).to(DEV)  # NaN-like patterns too
    index = torch.randperm(40, generator=torch.Generator().manual_seed(0))[:24].int().to(DEV)
    out = poisoned(24, width, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    with use_impl(impl):
        got = gather_rows(src, index, torch.tensor([17], device=DEV), out=out)
    want = src.view(torch.uint8)[index.long()]
    assert torch.equal(got.view(torch.uint8)[:17], want[:17])
    if width % 2 == 0:  # rows past num_valid are not written
        assert (got.view(torch.uint8)[17:] == 255).all()


def _weights(quantization: str) -> ExpertWeights:
    w = torch.zeros(2, 4, 8, dtype=FP8_DTYPE)
    return ExpertWeights(w, w, torch.ones(2, 4), torch.ones(2, 4), quantization=quantization)


def test_quantized_rows_feed_fp8_rowwise_experts_only():
    q = torch.arange(32, dtype=torch.float32).view(4, 8).to(FP8_DTYPE)
    rows = QuantizedRows(q, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert rows.shape == (4, 8) and rows.device.type == "cpu"
    got_q, got_s = gather_input(ops_for("torch"), rows, torch.tensor([3, 1]), None, _weights("fp8_rowwise"))
    assert torch.equal(got_q.view(torch.uint8), q.view(torch.uint8)[[3, 1]])
    assert torch.equal(got_s, torch.tensor([4.0, 2.0]))
    with pytest.raises(ValueError, match="quantized rows"):  # scaled again
        gather_input(ops_for("torch"), rows, torch.tensor([3, 1]), torch.ones(2), _weights("fp8_rowwise"))
    with pytest.raises(ValueError, match="fp8_w8a16"):  # a format whose input is not fp8 rows
        gather_input(ops_for("torch"), rows, torch.tensor([3, 1]), None, _weights("fp8_w8a16"))


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_zero_rows_writes_only_the_valid_rows(impl):
    buf = poisoned(9, 5, dtype=torch.float32, device=DEV)
    with use_impl(impl):
        zero_rows(buf, torch.tensor([4], device=DEV))
    assert (buf[:4] == 0).all() and buf[4:].isnan().all()


def test_shared_expert_in_two_parts_sums_to_the_whole():
    """Eager EP runs the shared expert as two column halves around its host sync and combine
    (MoE.shared_split); together they give the unsplit output."""
    from shufflemoe import MoE, MoEConfig
    from shufflemoe.dispatch.ep import _two_parts

    cfg = MoEConfig(hidden_size=16, intermediate_size=8, num_experts=4, top_k=1,
                    shared_intermediate_size=12, shared_expert_gate=True, dtype=torch.float32)
    torch.manual_seed(0)
    layer = MoE(cfg)
    x = torch.randn(5, 16)
    whole = layer.shared_expert(x, torch.empty(5, 16))
    layer.shared_w13.data = _two_parts(layer.shared_w13.data, 5)
    layer.shared_split = 5
    first = layer.shared_expert(x, torch.empty(5, 16), 0).clone()
    both = layer.shared_expert(x, first.clone(), 1)
    assert not torch.allclose(first, whole, atol=1e-3)  # the first part alone is not the whole
    torch.testing.assert_close(both, whole, rtol=1e-5, atol=1e-6)
