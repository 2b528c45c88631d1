"""The parallel layers on one CUDA rank (NCCL world of one): no host sync in a graph-safe
forward (torch.cuda.set_sync_debug_mode), and CUDA-graph capture matching eager. Collectives of
a group of one are copies; benchmarks/multi_gpu.py runs the real two-GPU checks over NCCL."""

from __future__ import annotations


import pytest
import torch
import torch.distributed as dist

from shufflemoe import MoE, MoEConfig, graphed, naive_moe
from shufflemoe.ops import use_impl
from shufflemoe.parallel import parallel_mesh, parallelize
from shufflemoe.testing import compare

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    torch.cuda.set_device(0)
    rendezvous = tmp_path_factory.mktemp("nccl") / "rendezvous"
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _full():
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2,
                    shared_intermediate_size=32, dtype=torch.bfloat16)
    torch.manual_seed(0)
    return MoE(cfg, device="cuda")


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_allgather_forward_has_no_host_sync(nccl, impl):
    """ep_allgather's forward under set_sync_debug_mode('error'); ep_alltoall must trip it (its
    one sync), or the check proves nothing."""
    full = _full()
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    ref = naive_moe(full, x, routing=full.route(x))
    with use_impl(impl):
        gathered = parallelize(full, "ep_allgather", parallel_mesh(ep=1))
        alltoall = parallelize(full, "ep_alltoall", parallel_mesh(ep=1))
        gathered(x), alltoall(x)  # warm up (kernel compilation may sync)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            y = gathered(x)
            with pytest.raises(RuntimeError):
                alltoall(x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    c = compare(y, ref, "bfloat16")
    assert c.ok, c.why


@pytest.mark.parametrize("name,options", [("ep_allgather", dict(max_tokens=8)), ("tp", {}),
                                          ("tp_sp", {})])
def test_graph_capture_matches_eager(nccl, name, options):
    full = _full()
    mesh = parallel_mesh(ep=1) if name.startswith("ep") else parallel_mesh(tp=1)
    layer = parallelize(full, name, mesh, **options)
    decode = graphed(layer, token_buckets=(1, 8))
    for T in (1, 5, 8):
        x = torch.randn(T, 64, device="cuda", dtype=torch.bfloat16)
        c = compare(decode(x), naive_moe(full, x, routing=full.route(x)), "bfloat16")
        assert c.ok, f"T={T}: {c.why}"


def test_allgather_graphs_need_static_sizes(nccl):
    layer = parallelize(_full(), "ep_allgather", parallel_mesh(ep=1))
    with pytest.raises(ValueError, match="need max_tokens"):
        graphed(layer, token_buckets=(1, 8))
    capped = parallelize(_full(), "ep_allgather", parallel_mesh(ep=1), max_tokens=4)
    with pytest.raises(ValueError, match="exceed max_tokens=4"):
        graphed(capped, token_buckets=(1, 8))
