"""ops/_pdl.py: which launches the unfused path chains with PDL (the GPU tests run them)."""

from __future__ import annotations

import torch

from shufflemoe.ops import _pdl


class _OnCuda:
    """Stands for a CUDA tensor: chained() reads only is_cuda of it."""

    is_cuda = True


def test_chains_small_grids_on_cuda_only(monkeypatch):
    monkeypatch.setattr(_pdl, "interpreting", lambda: False)
    on = {"PDL": True, "launch_pdl": True}
    assert _pdl.chained(_OnCuda(), (64, 2)) == on
    assert _pdl.chained(_OnCuda(), (_pdl.MAX_PROGRAMS,)) == on
    # prefill's grids launch as before: no PDL
    assert _pdl.chained(_OnCuda(), (_pdl.MAX_PROGRAMS + 1,)) == {"PDL": False}
    assert _pdl.chained(_OnCuda(), (2048, 16)) == {"PDL": False}
    assert _pdl.chained(torch.empty(2), (1,)) == {"PDL": False}  # the interpreter's CPU tensors


def test_never_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(_pdl, "interpreting", lambda: True)
    assert _pdl.chained(_OnCuda(), (1,)) == {"PDL": False}


def test_routing_blocks_launch_in_stream_order():
    """index_shuffle: one program chained both ways; blocks launch after the kernel before them
    has finished and let place launch early only while a block holds at most CHAIN_PAIRS pairs
    (index_shuffle/kernel.py's measurements)."""
    from shufflemoe.ops.index_shuffle.kernel import CHAIN_PAIRS, chain_keywords

    on, off = {"PDL": True, "launch_pdl": True}, {"PDL": False}
    assert chain_keywords(on, True, 1024) == (on, on)
    assert chain_keywords(on, False, CHAIN_PAIRS) == ({"PDL": True}, on)
    assert chain_keywords(on, False, 2 * CHAIN_PAIRS) == (off, off)
    assert chain_keywords(off, False, 32) == (off, off)
    assert chain_keywords(off, True, 32) == (off, off)
