"""Every dispatcher x every expert strategy against the float64 reference of the FULL layer, on
2 and 4 gloo CPU ranks (vLLM's modular-kernel combination test, spec 001).

Each rank builds the same full layer (same seed), shards it with the dispatcher's transform
(shufflemoe.parallel.TRANSFORMS), runs its tokens (EP: its own tokens, a different count per rank;
TP and local: rank 0's tokens) and compares with naive_moe of the full layer on those tokens, using
the full layer's routing so float near-ties cannot differ. All combinations of one world size run
inside ONE torch.multiprocessing.spawn (start-up on the 2-core CI machine: ~8 s for 2 ranks,
~17 s for 4); every rank writes its verdicts to a
JSON file and each combination is then its own pytest case (skipped, with the reason, where a
supports() check says no). The dispatchers' intermediate buffers are NaN-poisoned, so a padding
row that is read shows up as a non-finite output.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shufflemoe import DISPATCHERS, EXPERTS, MoE, MoEConfig, naive_moe
from shufflemoe.dispatch import ep
from shufflemoe.ops import use_impl
from shufflemoe.parallel import expert_parallel, parallelize, tensor_parallel
from shufflemoe.testing import compare, poisoned

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    name: str
    fields: dict  # MoEConfig fields but dtype
    tokens: tuple[int, ...]  # T of each rank (EP); TP and local run rank 0's tokens
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    one_expert: int | None = None  # every token's first choice is this expert (EP: rank 0
    # then receives nothing)
    hidden: int = 16


_MIXTRAL = dict(num_experts=8, top_k=2, renormalize=True, intermediate_size=16)
_LLAMA4 = dict(num_experts=8, top_k=1, router="llama4", scoring="sigmoid",
               apply_router_weight_on_input=True, intermediate_size=8, shared_intermediate_size=16)
_DEEPSEEK = dict(num_experts=16, top_k=4, router="group_limited", scoring="sigmoid",
                 correction_bias=True, n_group=4, topk_group=2, renormalize=True,
                 routed_scaling_factor=2.5, intermediate_size=8, shared_intermediate_size=8)

CASES: dict[int, list[Case]] = {
    2: [
        Case("mixtral", _MIXTRAL, (9, 12), hidden=32),
        Case("llama4", _LLAMA4, (10, 10), hidden=24),  # equal T: ep_allgather pads to each call's T
        Case("deepseek", _DEEPSEEK, (7, 5)),
        Case("fp8", dict(_MIXTRAL, quantization="fp8_rowwise", shared_intermediate_size=16),
             (8, 6), dtypes=("bfloat16",), hidden=32),
        Case("empty_rank", dict(num_experts=8, top_k=2, scoring="sigmoid", capacity_factor=1.0,
                                intermediate_size=8), (0, 13)),
        Case("one_expert", dict(num_experts=8, top_k=1, intermediate_size=8,
                                shared_intermediate_size=8, shared_expert_gate=True),
             (6, 9), one_expert=7),
        Case("no_tokens", dict(num_experts=4, top_k=2, intermediate_size=8), (0, 0),
             dtypes=("float32",)),  # ep_allgather pads to T = 0: every buffer is empty
    ],
    4: [Case("deepseek", _DEEPSEEK, (5, 0, 9, 3))],
}


def _full_layer(case: Case, dtype: torch.dtype) -> MoE:
    cfg = MoEConfig(hidden_size=case.hidden, dtype=dtype, **case.fields)
    torch.manual_seed(1234)  # the same full layer on every rank
    layer = MoE(cfg)
    if layer.router_bias is not None:  # a real bias, so selection and weights differ
        layer.router_bias.data.normal_(0.0, 0.5)
    if case.one_expert is not None:  # column 0 of x is a constant 4: expert e's logit +16
        layer.router_weight.data[:, 0] = -2.0
        layer.router_weight.data[case.one_expert, 0] = 2.0
    return layer


def _tokens(case: Case, dtype: torch.dtype, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(case.tokens[rank], case.hidden, generator=g)
    if case.one_expert is not None:
        x[:, 0] = 4.0
    return x.to(dtype)


def _options(case: Case, dispatch: str) -> dict:
    if dispatch == "ep_allgather" and len(set(case.tokens)) > 1:
        return {"max_tokens": max(case.tokens)}  # static padding when ranks' T differ
    return {}


def _key(world: int, case: str, dtype: str, dispatch: str, strategy: str) -> str:
    return f"w{world}-{case}-{dtype}-{dispatch}-{strategy}"


def _tolerance(layer: MoE) -> str:
    return "fp8_rowwise" if layer.config.quantized else str(layer.config.dtype)[6:]


def _run_combinations(world: int, rank: int) -> dict[str, list]:
    results: dict[str, list] = {}
    for case in CASES[world]:
        for dname in case.dtypes:
            full = _full_layer(case, DTYPES[dname])
            own, first = _tokens(case, DTYPES[dname], rank), _tokens(case, DTYPES[dname], 0)
            refs = {id(x): naive_moe(full, x, routing=full.route(x)) for x in (own, first)}
            for dispatch in DISPATCHERS.names():
                x = own if dispatch.startswith("ep_") else first
                keys = {s: _key(world, case.name, dname, dispatch, s) for s in EXPERTS.names()}
                try:
                    layer = parallelize(full, dispatch, **_options(case, dispatch))
                except Exception:
                    for key in keys.values():
                        results[key] = ["error", f"transform: {traceback.format_exc(limit=3)}"]
                    continue
                for strategy, key in keys.items():
                    results[key] = _one(layer, strategy, x, refs[id(x)])
    return results


def _one(layer: MoE, strategy: str, x: torch.Tensor, ref: torch.Tensor) -> list:
    experts, dev = EXPERTS.get(strategy), x.device
    ok, why = experts.supports(layer.config, dev)
    if ok:
        ok, why = layer.dispatch.supports(layer.config, experts, dev)
    if not ok:
        return ["skip", why]
    try:
        layer.set_experts(strategy)
        c = compare(layer(x), ref, _tolerance(layer))
    except Exception:
        return ["error", traceback.format_exc(limit=4)]
    detail = f"max err {c.max_err_over_rms:.3g} rms, rel L2 {c.rel_l2:.3g}"
    return ["pass", detail] if c.ok else ["fail", f"{c.why} ({detail})"]


_SYNC_METHODS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def _patched(owner, name: str, wrap):
    saved = getattr(owner, name)
    setattr(owner, name, wrap(saved))
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _spied_forward(layer: MoE, x: torch.Tensor, world: int, rank: int) -> tuple[list[str], float]:
    """One forward -> (the Tensor -> host conversions it made: .item(), .tolist(), int(t), ...;
    the bytes its collectives brought from the other ranks, all-reduce counted as a ring)."""
    calls: list[str] = []
    received = [0.0]

    def host(name):
        def wrap(original):
            def call(self, *args, **kw):
                calls.append(name)
                return original(self, *args, **kw)
            return call
        return wrap

    def a2a(original):
        def call(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
            rows = output.shape[0]
            own = rows // world if output_split_sizes is None else output_split_sizes[rank]
            received[0] += (rows - own) * (output.nbytes // max(rows, 1))
            return original(output, input, output_split_sizes, input_split_sizes, **kw)
        return call

    def gather(original):
        def call(output, input, **kw):
            received[0] += (world - 1) * input.nbytes
            return original(output, input, **kw)
        return call

    def reduce(original):
        def call(tensor, *args, **kw):
            received[0] += 2 * (world - 1) / world * tensor.nbytes
            return original(tensor, *args, **kw)
        return call

    with contextlib.ExitStack() as stack:
        for name in _SYNC_METHODS:
            stack.enter_context(_patched(torch.Tensor, name, host(name)))
        stack.enter_context(_patched(dist, "all_to_all_single", a2a))
        stack.enter_context(_patched(ep, "_all_gather", gather))
        stack.enter_context(_patched(dist, "all_reduce", reduce))
        layer(x)
    return calls, received[0]


def _expected_bytes(case: Case, full: MoE, dispatch: str, world: int, rank: int) -> float:
    """The communication volumes ep.py's docstring states, from every rank's routing."""
    cfg, b = full.config, full.config.dtype.itemsize
    E, k, D = cfg.num_experts, cfg.top_k, cfg.hidden_size
    El = E // world
    if dispatch == "tp":
        return 2 * (world - 1) / world * case.tokens[0] * D * b
    if dispatch == "ep_allgather":
        Tm = max(case.tokens)
        return (world - 1) * (E * 4 + (Tm * k + min(El, k) * Tm) * D * b)
    counts = [full.route(_tokens(case, cfg.dtype, r)).counts.view(world, El).sum(1).tolist()
              for r in range(world)]  # [source][destination] pairs
    remote = sum(counts[r][rank] + counts[rank][r] for r in range(world) if r != rank)
    return (world - 1) * El * 4 + remote * D * b


def _run_forward_checks(world: int, rank: int) -> dict[str, list]:
    case = CASES[world][0]
    full = _full_layer(case, torch.bfloat16)
    results = {}
    for dispatch in ("ep_allgather", "tp", "ep_alltoall"):
        x = _tokens(case, torch.bfloat16, rank if dispatch.startswith("ep_") else 0)
        layer = parallelize(full, dispatch, **_options(case, dispatch))
        layer.set_experts("shuffled")
        calls, received = _spied_forward(layer, x, world, rank)
        results[f"forward-{dispatch}"] = [
            "pass", dict(syncs=calls, bytes=received,
                         expected=_expected_bytes(case, full, dispatch, world, rank))]
    return results


TRITON_CASE = ("deepseek", "bfloat16")  # unequal T, k = 4, shared expert; ~15 s interpreted


def _run_triton_checks(world: int, rank: int) -> dict[str, list]:
    """The parallel dispatchers with the shuffled strategy on the Triton kernels (interpreted on
    the CPU): the shuffling, gather and padded scatter kernels with the arguments EP passes."""
    case = next(c for c in CASES[world] if c.name == TRITON_CASE[0])
    dtype = DTYPES[TRITON_CASE[1]]
    full = _full_layer(case, dtype)
    results = {}
    for dispatch in ("ep_allgather", "ep_alltoall", "tp"):
        x = _tokens(case, dtype, rank if dispatch.startswith("ep_") else 0)
        ref = naive_moe(full, x, routing=full.route(x))
        layer = parallelize(full, dispatch, **_options(case, dispatch))
        with use_impl("triton"):
            results[f"triton-{dispatch}"] = _one(layer, "shuffled", x, ref)
    return results


def _expect_error(fn, match: str) -> list:
    try:
        fn()
    except ValueError as e:
        return ["pass" if match in str(e) else "fail", str(e)]
    return ["fail", "no ValueError"]


def _run_error_checks() -> dict[str, list]:
    """Bad layouts raise a ValueError naming the problem, before any collective (so every rank
    raises and none waits)."""
    base = dict(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2)
    odd_i = MoE(MoEConfig(**dict(base, intermediate_size=3)))
    odd_e = MoE(MoEConfig(**dict(base, num_experts=3)))
    layer = MoE(MoEConfig(**base))
    capped = expert_parallel(layer, mode="allgather", max_tokens=4)
    x = torch.randn(5, 8, dtype=layer.config.dtype)
    return {
        "error-tp-divides-I": _expect_error(lambda: tensor_parallel(odd_i), "intermediate_size"),
        "error-ep-divides-E": _expect_error(lambda: expert_parallel(odd_e), "num_experts"),
        "error-twice": _expect_error(lambda: expert_parallel(tensor_parallel(layer)),
                                     "single-device"),
        "error-max-tokens": _expect_error(lambda: capped(x), "max_tokens=4"),
    }


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # ranks x default threads oversubscribe 2 cores: measured 4x slower
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    ep._alloc = poisoned  # rows a dispatcher leaves unwritten are NaN
    try:
        with use_impl("torch"):  # the op references (fast); _run_triton_checks: the kernels
            results = _run_combinations(world, rank)
            if world == 2:
                results.update(_run_forward_checks(world, rank))
                results.update(_run_error_checks())
        if world == 2:
            results.update(_run_triton_checks(world, rank))
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_world(world: int, out_dir) -> list[dict[str, list]]:
    # gloo ranks hold CPU tensors, so their Triton checks run in the interpreter, GPU or not: the
    # ranks must start with TRITON_INTERPRET=1 (triton.jit reads it when a kernel is decorated).
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        mp.spawn(_worker, args=(world, _free_port(), str(out_dir)), nprocs=world, join=True)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    ranks = []
    for rank in range(world):
        with open(out_dir / f"rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks


@pytest.fixture(scope="module")
def world_results(tmp_path_factory):
    cache: dict[int, list[dict[str, list]]] = {}

    def get(world: int) -> list[dict[str, list]]:
        if world not in cache:
            cache[world] = _run_world(world, tmp_path_factory.mktemp(f"world{world}"))
        return cache[world]

    return get


COMBINATIONS = [
    (world, case.name, dname, dispatch, strategy)
    for world, cases in CASES.items() for case in cases for dname in case.dtypes
    for dispatch in DISPATCHERS.names() for strategy in EXPERTS.names()
]


@pytest.mark.parametrize("world,case,dtype,dispatch,strategy", COMBINATIONS,
                         ids=[_key(*c) for c in COMBINATIONS])
def test_combination(world_results, world, case, dtype, dispatch, strategy):
    key = _key(world, case, dtype, dispatch, strategy)
    verdicts = [r.get(key, ["error", "no result"]) for r in world_results(world)]
    statuses = {v[0] for v in verdicts}
    if statuses == {"skip"}:
        pytest.skip(verdicts[0][1])
    if statuses != {"pass"}:
        pytest.fail("\n".join(f"rank {i}: {s}: {why}" for i, (s, why) in enumerate(verdicts)))


@pytest.mark.parametrize("dispatch,syncs", [("ep_allgather", []), ("tp", []),
                                             ("ep_alltoall", ["tolist"])])
def test_host_syncs_and_bytes(world_results, dispatch, syncs):
    """ep_allgather and tp (with the shuffled strategy) convert no tensor to a Python value in a
    forward; ep_alltoall does exactly once (.tolist() of the sizes), which shows the spy works.
    The bytes each rank receives are the volumes ep.py's docstring states."""
    for rank, results in enumerate(world_results(2)):
        seen = results[f"forward-{dispatch}"][1]
        assert seen["syncs"] == syncs, f"rank {rank}: {dispatch} called {seen['syncs']}"
        assert seen["bytes"] == seen["expected"], f"rank {rank}: {dispatch} moved {seen}"


@pytest.mark.parametrize("dispatch", ["ep_allgather", "ep_alltoall", "tp"])
def test_with_triton_kernels(world_results, dispatch):
    verdicts = [r[f"triton-{dispatch}"] for r in world_results(2)]
    if any(v[0] != "pass" for v in verdicts):
        pytest.fail("\n".join(f"rank {i}: {s}: {why}" for i, (s, why) in enumerate(verdicts)))


@pytest.mark.parametrize("check", ["tp-divides-I", "ep-divides-E", "twice", "max-tokens"])
def test_bad_layouts_raise(world_results, check):
    for rank, results in enumerate(world_results(2)):
        status, why = results[f"error-{check}"]
        assert status == "pass", f"rank {rank}: {why}"


def test_transforms_cover_every_dispatcher():
    from shufflemoe.parallel import TRANSFORMS

    assert sorted(TRANSFORMS) == sorted(DISPATCHERS.names())


def test_transforms_need_torch_distributed():
    layer = MoE(MoEConfig(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2))
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        tensor_parallel(layer)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        expert_parallel(layer)
    with pytest.raises(ValueError, match="mode"):
        expert_parallel(layer, mode="ring")
    with pytest.raises(ValueError, match="no parallel transform"):
        parallelize(layer, "ep_ring")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_allgather_forward_has_no_host_sync_on_gpu(impl):
    """One NCCL rank: ep_allgather's forward under torch.cuda.set_sync_debug_mode('error'); the
    alltoall form must trip it (its one sync), or the check proves nothing."""
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2,
                        shared_intermediate_size=32, dtype=torch.bfloat16)
        torch.manual_seed(0)
        full = MoE(cfg, device="cuda")
        x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
        ref = naive_moe(full, x, routing=full.route(x))
        with use_impl(impl):
            gathered = expert_parallel(full, mode="allgather")
            alltoall = expert_parallel(full, mode="alltoall")
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
    finally:
        dist.destroy_process_group()
