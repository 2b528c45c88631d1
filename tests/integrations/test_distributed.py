"""The README's multi-process example: under torchrun on 2 gloo ranks, a transformers MoE model
with tensor- or expert-parallel MoE blocks generates the same greedy tokens as one process."""

import pytest

pytest.importorskip("transformers")

from torchrun import torchrun  # noqa: E402


def test_example_generates_the_same_tokens_as_one_process():
    out = torchrun("examples/distributed_generate.py", "--new-tokens", "6")
    for layout in ("tp", "ep_alltoall", "ep_allgather"):
        for rank in (0, 1):
            assert f"rank {rank}/2 {layout:13} MATCH" in out, out[-3000:]
    assert "MISMATCH" not in out


def test_patch_distributed_refuses_sequence_parallel():
    from shufflemoe.integrations.transformers import patch_distributed

    with pytest.raises(ValueError, match="sequence-parallel attention"):
        patch_distributed(None, "tp_sp")
