"""Every parallel layout x every expert strategy against the float64 reference of the FULL layer,
on 2 and 4 gloo CPU ranks (vLLM's modular-kernel combination test, spec 001).

Each rank builds the same full layer (same seed), transforms it for a layout (a dispatcher on an
(ep, tp) mesh: tp, tp_sp, ep_alltoall, ep_allgather, the EP x TP hybrid with and without dedup,
with redundant experts), runs its tokens (ep ranks: their own, a different count per rank, some
with none; tp groups: the same; tp_sp: a slice) and compares with naive_moe of the full layer on
the whole batch (so capacity drops are counted over every rank, as one process would). All
checks of one world size run inside ONE spawn (start-up dominates on the 2-core CI machine) under
a deadline, so a hang fails instead of waiting; each rank writes its verdicts to JSON and every
combination is then its own pytest case. Dispatcher buffers are NaN-poisoned: a padding row that
is read shows up as a non-finite output.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shufflemoe import DISPATCHERS, EXPERTS, MoE, MoEConfig
from shufflemoe.dispatch import ep_allgather, ep_alltoall
from shufflemoe.dispatch import ep as ep_module
from shufflemoe.ops import use_impl
from shufflemoe.parallel import exit_rank
from shufflemoe.testing import poisoned

from dispatch_checks import CASES, FORMAT_SPIES, LAYOUTS, run_checks

DEADLINE_S = {2: 240, 4: 300}  # a hung collective fails the test instead of the CI job


def _worker(rank: int, world: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # ranks x default threads oversubscribe 2 cores: measured 4x slower
    # a file in the test's own directory: no port to pick and release for another process to take
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    for module in (ep_module, ep_allgather, ep_alltoall):
        module.alloc = poisoned  # rows a dispatcher leaves unwritten are NaN
    try:
        with use_impl("torch"):  # the op references; run_checks switches to the kernels itself
            results = run_checks(world, rank)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    exit_rank(0)  # not the interpreter's shutdown, which gloo's threads can abort (see exit_rank)


def _run_world(world: int, out_dir: Path) -> list[dict]:
    # gloo ranks hold CPU tensors, so their Triton checks run in the interpreter, GPU or not: the
    # ranks must start with TRITON_INTERPRET=1 (triton.jit reads it when a kernel is decorated).
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        ctx = mp.spawn(_worker, args=(world, str(out_dir)), nprocs=world,
                       join=False)
        deadline = time.monotonic() + DEADLINE_S[world]
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"{world} ranks did not finish within {DEADLINE_S[world]} s (a hang)")
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def world_results(tmp_path_factory):
    cache: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in cache:
            cache[world] = _run_world(world, tmp_path_factory.mktemp(f"world{world}"))
        return cache[world]

    return get


def _verdicts(world_results, world: int, key: str) -> list[list]:
    return [r.get(key, ["error", "no result"]) for r in world_results(world)]


def _expect_pass(verdicts: list[list]) -> None:
    statuses = {v[0] for v in verdicts}
    if statuses == {"skip"}:
        pytest.skip(verdicts[0][1])
    if statuses != {"pass"}:
        pytest.fail("\n".join(f"rank {i}: {s}: {why}" for i, (s, why) in enumerate(verdicts)))


COMBINATIONS = [(world, case.name, dtype, layout, strategy)
                for world in (2, 4) for case in CASES[world] for dtype in case.dtypes
                for layout in LAYOUTS[world] for strategy in EXPERTS.names()]


@pytest.mark.parametrize("world,case,dtype,layout,strategy", COMBINATIONS,
                         ids=["-".join(map(str, c)) for c in COMBINATIONS])
def test_combination(world_results, world, case, dtype, layout, strategy):
    _expect_pass(_verdicts(world_results, world, f"{case}-{dtype}-{layout}-{strategy}"))


SPIED = [(world, layout) for world in (2, 4) for layout in LAYOUTS[world]] + [
    (2, f"{base}{suffix}") for suffix in FORMAT_SPIES for base in ("ep_allgather", "ep_alltoall")]


@pytest.mark.parametrize("world,layout", SPIED, ids=[f"w{w}-{l}" for w, l in SPIED])
def test_planner_bytes_equal_counted_bytes(world_results, world, layout):
    """The planner's traffic (each dispatcher's formula, fed every source's routing counts) is
    exactly what the collectives of a forward moved, rank by rank, collective by collective."""
    for rank, results in enumerate(world_results(world)):
        seen = results[f"spy-{layout}"]
        assert seen[0] == "pass", f"rank {rank}: {seen[1]}"
        assert seen[1]["counted"] == seen[1]["planned"], f"rank {rank}: {layout}: {seen[1]}"


@pytest.mark.parametrize("world,layout", SPIED, ids=[f"w{w}-{l}" for w, l in SPIED])
def test_host_syncs(world_results, world, layout):
    """Graph-safe layouts convert no tensor to a Python value in a forward (the host agreement on
    sizes reads host memory only and is not counted); ep_alltoall does exactly once."""
    want = [] if DISPATCHERS.get(layout.split("(")[0]).graph_safe else ["tolist"]
    for rank, results in enumerate(world_results(world)):
        assert results[f"spy-{layout}"][1]["syncs"] == want, f"rank {rank}"


TRITON = ["tp", "tp_sp", "ep_alltoall", "ep_allgather", "ep_allgather(fp8)"]


@pytest.mark.parametrize("layout", TRITON)
def test_with_triton_kernels(world_results, layout):
    """Shuffled strategy on the Triton kernels (interpreted): gather, shuffling and padded scatter
    kernels with the arguments the dispatchers pass, fp8 rows moved as 16-bit words."""
    _expect_pass(_verdicts(world_results, 2, f"triton-{layout}"))


ERRORS = {2: ["max-tokens", "max-tokens-differ", "layers-differ", "tp-unequal", "sp-unequal",
              "bad-dtype", "weights-differ", "eplb-capacity", "tp-divides-I", "tp-block-scales",
              "ep-divides-E", "twice", "placement"],
          4: ["hybrid-unequal"]}
ERROR_CASES = [(w, c) for w, cs in ERRORS.items() for c in cs]


@pytest.mark.parametrize("world,check", ERROR_CASES, ids=[f"w{w}-{c}" for w, c in ERROR_CASES])
def test_bad_inputs_raise_the_same_error_everywhere(world_results, world, check):
    """Every rank raises a ValueError naming the problem, the same message on every rank (no rank
    is left inside a collective), and the ranks run a correct forward afterwards."""
    verdicts = _verdicts(world_results, world, f"error-{check}")
    for rank, (status, why) in enumerate(verdicts):
        assert status == "pass", f"rank {rank}: {why}"
    assert len({why for _, why in verdicts}) == 1, verdicts
    _expect_pass(_verdicts(world_results, world, "after-errors"))


def test_eplb_balances_skewed_routing(world_results):
    """4 EP ranks, 8 experts, skewed routing (two experts take most pairs): the rebalanced
    placement with 4 redundant experts brings the busiest rank near the mean, and the rebalanced
    layer still matches the reference."""
    for rank, results in enumerate(world_results(4)):
        status, figures = results["eplb"]
        assert status == "pass", f"rank {rank}: {figures}"
        assert figures["before"] >= 1.8 and figures["after"] <= 1.25, figures
        assert figures["received_after"] <= 1.3, figures


def test_every_dispatcher_builds_its_layer():
    from shufflemoe.dispatch import Dispatch

    for name in DISPATCHERS.names():
        cls = DISPATCHERS.get(name)
        assert cls.build is not Dispatch.build, name
        assert name == "local" or cls.traffic is not Dispatch.traffic, name
    assert {name for layouts in LAYOUTS.values() for name in
            (layout.split("(")[0] for layout in layouts)} | {"local"} == set(DISPATCHERS.names())


def test_transforms_need_torch_distributed():
    from shufflemoe.parallel import expert_parallel, parallelize, tensor_parallel

    layer = MoE(MoEConfig(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2))
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        tensor_parallel(layer)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        expert_parallel(layer)
    with pytest.raises(ValueError, match="mode"):
        expert_parallel(layer, mode="ring")
    with pytest.raises(ValueError, match="unknown dispatcher"):
        parallelize(layer, "ep_ring")
