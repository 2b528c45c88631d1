"""What every gloo rank of tests/dispatch/test_dispatch.py runs: (case x dtype x layout x
strategy) against the float64 reference, the collectives spied against the planner, the failure
checks and the EPLB figures. Returns {key: [status, detail]}."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shufflemoe import EXPERTS, MoE, MoEConfig, naive_moe
from shufflemoe.dispatch import Placement, ep, ep_allgather, ep_alltoall, shard, tp
from shufflemoe.ops import use_impl
from shufflemoe.parallel import (expert_parallel, observed_load, parallel_mesh, parallelize,
                                 rebalance, tensor_parallel)
from shufflemoe.planner import Layout, traffic
from shufflemoe.testing import compare, tolerance_key

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    name: str
    fields: dict  # MoEConfig fields but dtype
    tokens: tuple[int, ...]  # T of each ep group (ep = 1: the first; tp_sp: slices of it)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    one_expert: int | None = None  # every token's first choice is this expert
    hidden: int = 16


_MIXTRAL = dict(num_experts=8, top_k=2, renormalize=True, intermediate_size=16)
_LLAMA4 = dict(num_experts=8, top_k=1, router="llama4", scoring="sigmoid",
               apply_router_weight_on_input=True, intermediate_size=8, shared_intermediate_size=16)
_DEEPSEEK = dict(num_experts=16, top_k=4, router="group_limited", scoring="sigmoid",
                 correction_bias=True, n_group=4, topk_group=2, renormalize=True,
                 routed_scaling_factor=2.5, intermediate_size=8, shared_intermediate_size=8)
# gpt-oss: mxfp4 experts with biases, router logit bias, clamped GLU (w2_bias on tp rank 0 only)
_GPT_OSS = dict(num_experts=8, top_k=4, renormalize=True, router_logits_bias=True,
                expert_bias=True, activation="swiglu_oai", swiglu_limit=7.0, quantization="mxfp4",
                intermediate_size=128)
_CAPACITY = dict(num_experts=8, top_k=2, scoring="sigmoid", capacity_factor=1.0,
                 intermediate_size=8, shared_intermediate_size=4)

CASES: dict[int, list[Case]] = {
    2: [
        Case("mixtral", _MIXTRAL, (9, 12), hidden=32),
        Case("llama4", _LLAMA4, (10, 7), hidden=24),  # pair mode, unequal T, no max_tokens
        Case("deepseek", _DEEPSEEK, (7, 5)),
        Case("fp8", dict(_MIXTRAL, quantization="fp8_rowwise", shared_intermediate_size=16),
             (8, 6), dtypes=("bfloat16",), hidden=32),
        Case("gpt_oss", _GPT_OSS, (7, 5), dtypes=("bfloat16",), hidden=64),
        # tp = 2 cuts I = 256 on a 128-block boundary; EP sends its rows in bf16
        Case("fp8_block", dict(_MIXTRAL, quantization="fp8_block", intermediate_size=256,
                               shared_intermediate_size=16), (6, 4), dtypes=("bfloat16",),
             hidden=128),
        Case("w8a16", dict(_DEEPSEEK, quantization="fp8_w8a16"), (7, 5), dtypes=("bfloat16",)),
        Case("capacity", _CAPACITY, (0, 13)),  # dropped over both ranks' tokens, as one process
        Case("one_expert", dict(num_experts=8, top_k=1, intermediate_size=8,
                                shared_intermediate_size=8, shared_expert_gate=True),
             (6, 9), one_expert=7),
        Case("no_tokens", dict(num_experts=4, top_k=2, intermediate_size=8), (0, 0),
             dtypes=("float32",)),
    ],
    4: [
        Case("deepseek", _DEEPSEEK, (5, 0, 9, 3)),
        Case("gpt_oss", _GPT_OSS, (3, 0, 6, 2), dtypes=("bfloat16",), hidden=64),
        Case("capacity", _CAPACITY, (7, 6, 0, 5), dtypes=("float32",)),
    ],
}

# layout key -> (dispatcher, ep, tp, options)
SPECS = {
    2: {"tp": ("tp", 1, 2, {}), "tp_sp": ("tp_sp", 1, 2, {}),
        "ep_alltoall": ("ep_alltoall", 2, 1, {}), "ep_allgather": ("ep_allgather", 2, 1, {}),
        "ep_allgather(max_tokens)": ("ep_allgather", 2, 1, dict(max_tokens=16)),
        "ep_alltoall(eplb)": ("ep_alltoall", 2, 1, dict(redundant=2)),
        "ep_allgather(eplb)": ("ep_allgather", 2, 1, dict(redundant=2))},
    4: {"tp": ("tp", 1, 4, {}), "tp_sp": ("tp_sp", 1, 4, {}),
        "ep_alltoall": ("ep_alltoall", 4, 1, {}), "ep_allgather": ("ep_allgather", 4, 1, {}),
        "ep_alltoall(hybrid)": ("ep_alltoall", 2, 2, dict(dedup=False)),
        "ep_allgather(hybrid)": ("ep_allgather", 2, 2, dict(dedup=False)),
        "ep_alltoall(dedup)": ("ep_alltoall", 2, 2, dict(dedup=True)),
        "ep_allgather(dedup)": ("ep_allgather", 2, 2, dict(dedup=True)),
        "ep_alltoall(dedup,eplb)": ("ep_alltoall", 2, 2, dict(dedup=True, redundant=2)),
        "ep_allgather(dedup,eplb)": ("ep_allgather", 2, 2, dict(dedup=True, redundant=2))},
}
LAYOUTS = {w: list(s) for w, s in SPECS.items()}


def full_layer(case: Case, dtype: torch.dtype, seed: int = 1234) -> MoE:
    cfg = MoEConfig(hidden_size=case.hidden, dtype=dtype, **case.fields)
    torch.manual_seed(seed)  # the same full layer on every rank
    layer = MoE(cfg)
    if layer.router_bias is not None:  # a real bias, so selection and weights differ
        layer.router_bias.data.normal_(0.0, 0.5)
    if case.one_expert is not None:  # column 0 of x is a constant 4: expert e's logit +16
        layer.router_weight.data[:, 0] = -2.0
        layer.router_weight.data[case.one_expert, 0] = 2.0
    return layer


def group_tokens(case: Case, dtype: torch.dtype, group: int, n: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + group)
    x = torch.randn(case.tokens[group] if n is None else n, case.hidden, generator=g)
    if case.one_expert is not None:
        x[:, 0] = 4.0
    return x.to(dtype)


class Batch:
    """The tokens of a layout: every rank's input and the whole batch (as one process sees it)."""

    def __init__(self, case: Case, dtype: torch.dtype, name: str, ep: int, tp: int) -> None:
        self.sp = name == "tp_sp"
        if self.sp:
            L = case.tokens[0] // tp
            self.groups = [group_tokens(case, dtype, 0, tp * L)]
        else:
            self.groups = [group_tokens(case, dtype, e) for e in range(ep)]
        self.ep, self.tp = ep, tp
        self.all = torch.cat(self.groups)

    def rows(self, e: int, t: int) -> slice:
        """Rows of the whole batch that mesh rank (e, t) runs."""
        if self.sp:
            L = self.all.shape[0] // self.tp
            return slice(t * L, (t + 1) * L)
        start = sum(g.shape[0] for g in self.groups[:e])
        return slice(start, start + self.groups[e].shape[0])

    def input(self, e: int, t: int) -> torch.Tensor:
        return self.all[self.rows(e, t)]


def _mesh(ep: int, tp: int):
    return parallel_mesh(ep=ep, tp=tp)


def build(full: MoE, world: int, key: str) -> MoE:
    name, ep, tp_, options = SPECS[world][key]
    return parallelize(full, name, _mesh(ep, tp_), **options)


def _one(layer: MoE, strategy: str, x: torch.Tensor, ref: torch.Tensor) -> list:
    experts = EXPERTS.get(strategy)
    ok, why = experts.supports(layer.config, x.device)
    if ok:
        ok, why = layer.dispatch.supports(layer.config, experts, x.device)
    if not ok:
        return ["skip", why]
    try:
        layer.set_experts(strategy)
        c = compare(layer(x), ref, tolerance_key(layer.config))
    except Exception:
        return ["error", traceback.format_exc(limit=4)]
    detail = f"max err {c.max_err_over_rms:.3g} rms, rel L2 {c.rel_l2:.3g}"
    return ["pass", detail] if c.ok else ["fail", f"{c.why} ({detail})"]


def _combinations(world: int, rank: int, results: dict) -> None:
    for case in CASES[world]:
        for dname in case.dtypes:
            full = full_layer(case, DTYPES[dname])
            refs: dict = {}  # one float64 reference per distinct batch
            for key, (name, ep, tp_, options) in SPECS[world].items():
                batch = Batch(case, DTYPES[dname], name, ep, tp_)
                e, t = divmod(rank, tp_)
                which = (name == "tp_sp", ep, tp_ if name == "tp_sp" else 0)
                if which not in refs:
                    refs[which] = naive_moe(full, batch.all, routing=full.route(batch.all))
                ref = refs[which][batch.rows(e, t)]
                keys = {s: f"{case.name}-{dname}-{key}-{s}" for s in EXPERTS.names()}
                try:
                    layer = build(full, world, key)
                except ValueError as err:  # redundant experts refuse capacity factors
                    status = "skip" if "redundant" in str(err) else "error"
                    results.update({k: [status, str(err)] for k in keys.values()})
                    continue
                except Exception:
                    results.update({k: ["error", traceback.format_exc(limit=4)]
                                    for k in keys.values()})
                    continue
                x = batch.input(e, t)
                for strategy, k in keys.items():
                    results[k] = _one(layer, strategy, x, ref)


_SYNC_METHODS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")
_COMM_MODULES = (tp, ep, ep_allgather, ep_alltoall)


@contextlib.contextmanager
def _patched(owner, name: str, wrap):
    saved = getattr(owner, name)
    setattr(owner, name, wrap(saved))
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _spied_forward(layer: MoE, x: torch.Tensor) -> tuple[list[str], list]:
    """One forward -> (the Tensor -> host conversions it made outside the host agreement on
    sizes and outside the ops' CPU references, which read sizes of CPU tensors by design; (op,
    group size, bytes received from the other ranks) of every collective)."""
    calls: list[str] = []
    seen: list = []
    paused = [False]

    def host(name):
        def wrap(original):
            def call(self, *args, **kw):
                caller = sys._getframe(1).f_code.co_filename
                if not paused[0] and f"{os.sep}ops{os.sep}" not in caller:
                    calls.append(name)
                return original(self, *args, **kw)
            return call
        return wrap

    def agreement(original):
        def call(*args, **kw):
            paused[0] = True
            try:
                return original(*args, **kw)
            finally:
                paused[0] = False
        return call

    def counted(op, received):
        def wrap(original):
            def call(*args, **kw):
                size = args[3] if op != "all_reduce" else args[2]
                if size > 1:
                    seen.append([op, size, round(received(*args, **kw), 6)])
                return original(*args, **kw)
            return call
        return wrap

    def a2a_bytes(out, inp, group, size, out_splits=None, in_splits=None, async_op=False):
        rows = out.shape[0]
        own = rows // size if out_splits is None else out_splits[dist.get_rank(group)]
        return (rows - own) * (out.nbytes / max(rows, 1))

    ops = {"all_gather": lambda out, inp, group, size: (size - 1) * inp.nbytes,
           "reduce_scatter": lambda out, inp, group, size: (size - 1) * out.nbytes,
           "all_reduce": lambda t, group, size: 2 * (size - 1) / size * t.nbytes,
           "all_to_all": a2a_bytes}
    with contextlib.ExitStack() as stack:
        for name in _SYNC_METHODS:
            stack.enter_context(_patched(torch.Tensor, name, host(name)))
        stack.enter_context(_patched(shard, "agree", agreement))
        for module in _COMM_MODULES:
            for op, received in ops.items():
                if hasattr(module, op):
                    stack.enter_context(_patched(module, op, counted(op, received)))
        layer(x)
    return calls, seen


def _source_counts(layer: MoE, batch: Batch) -> list[list[int]]:
    """Every source's routing counts (buffer order), as the dispatcher routes them."""
    d = layer.dispatch
    if not hasattr(d, "routing_of"):
        return []
    m = d.mesh
    counts = []
    for s in range(d.num_sources):
        t, e = divmod(s, m.ep) if d.dedup else (0, s)
        group = batch.groups[e]
        lo, n = d.slice_of(group.shape[0], t)
        counts.append(d.routing_of(layer, group[lo : lo + n], s).counts.tolist())
    return counts


# Spied formats (world 2): layout suffix -> case. fp8_rowwise sends fp8 rows and scales; mxfp4
# (with biases) sends bf16 rows.
FORMAT_SPIES = {"(fp8)": "fp8", "(mxfp4)": "gpt_oss"}


def _spy_checks(world: int, rank: int, results: dict) -> None:
    spied = [(CASES[world][0], "bfloat16", key, key) for key in SPECS[world]]
    if world == 2:
        for suffix, case_name in FORMAT_SPIES.items():
            case = next(c for c in CASES[2] if c.name == case_name)
            spied += [(case, "bfloat16", f"{base}{suffix}", base)
                      for base in ("ep_allgather", "ep_alltoall")]
    for case, dname, key, base in spied:
        try:
            name, ep, tp_, options = SPECS[world][base]
            full = full_layer(case, DTYPES[dname])
            layer = build(full, world, base)
            layer.set_experts("shuffled")
            batch = Batch(case, DTYPES[dname], name, ep, tp_)
            e, t = divmod(rank, tp_)
            calls, seen = _spied_forward(layer, batch.input(e, t))
            tokens = [batch.input(*divmod(r, tp_)).shape[0] for r in range(world)]
            layout = Layout(name, ep, tp_, tuple(sorted(options.items())))
            planned = [[c.op, c.size, round(c.nbytes, 6)] for c in
                       traffic(full.config, layout, tokens, _source_counts(layer, batch), rank)]
            results[f"spy-{key}"] = ["pass", dict(syncs=calls, counted=sorted(seen),
                                                  planned=sorted(planned))]
        except Exception:
            results[f"spy-{key}"] = ["error", traceback.format_exc(limit=4)]


def _triton_checks(rank: int, results: dict) -> None:
    for key, case_name in (("tp", "deepseek"), ("tp_sp", "deepseek"), ("ep_alltoall", "deepseek"),
                           ("ep_allgather", "deepseek"), ("ep_allgather(fp8)", "fp8")):
        case = next(c for c in CASES[2] if c.name == case_name)
        base = key.replace("(fp8)", "")
        name, ep, tp_, _ = SPECS[2][base]
        full = full_layer(case, torch.bfloat16)
        batch = Batch(case, torch.bfloat16, name, ep, tp_)
        e, t = divmod(rank, tp_)
        ref = naive_moe(full, batch.all, routing=full.route(batch.all))[batch.rows(e, t)]
        with use_impl("triton"):
            results[f"triton-{key}"] = _one(build(full, 2, base), "shuffled", batch.input(e, t),
                                            ref)


def _expect_error(fn, match: str) -> list:
    try:
        fn()
    except ValueError as e:
        return ["pass" if match in str(e) else "fail", str(e)]
    except Exception:
        return ["fail", traceback.format_exc(limit=3)]
    return ["fail", "no ValueError"]


def _error_checks(world: int, rank: int, results: dict) -> None:
    case = CASES[world][0]
    full = full_layer(case, torch.float32)
    D, dt = case.hidden, torch.float32
    rows = lambda n: torch.randn(n, D, dtype=dt)  # noqa: E731
    if world == 4:
        hybrid = build(full, 4, "ep_alltoall(dedup)")
        results["error-hybrid-unequal"] = _expect_error(
            lambda: hybrid(rows(3 + (rank == 1))), "same tokens")
    else:
        capped = parallelize(full, "ep_allgather", _mesh(2, 1), max_tokens=4)
        tp_layer = tensor_parallel(full, _mesh(1, 2))
        sp_layer = tensor_parallel(full, _mesh(1, 2), sequence_parallel=True)
        a2a = expert_parallel(full, _mesh(2, 1), "alltoall")
        base = dict(hidden_size=8, intermediate_size=4, num_experts=4, top_k=2)
        odd_i = MoE(MoEConfig(**dict(base, intermediate_size=3)))
        odd_e = MoE(MoEConfig(**dict(base, num_experts=3)))
        blocks = MoE(MoEConfig(**dict(base, hidden_size=128, intermediate_size=128,
                                      quantization="fp8_block")))
        capacity = next(c for c in CASES[2] if c.name == "capacity")
        mixed = parallelize(full, "ep_allgather", _mesh(2, 1), max_tokens=4 + 4 * rank)
        other = expert_parallel(full, _mesh(2, 1), "allgather", dedup=False,
                                redundant=2 * rank, max_tokens=8)
        results.update({
            "error-max-tokens-differ": _expect_error(lambda: mixed(rows(3)),
                                                     "max_tokens per rank [4, 8]"),
            "error-layers-differ": _expect_error(lambda: other(rows(3)), "built different layers"),
            "error-max-tokens": _expect_error(lambda: capped(rows(3 + 2 * rank)),
                                              "more tokens than max_tokens=4"),
            "error-tp-unequal": _expect_error(lambda: tp_layer(rows(3 + rank)), "same tokens"),
            "error-sp-unequal": _expect_error(lambda: sp_layer(rows(3 + rank)), "equal length"),
            "error-bad-dtype": _expect_error(
                lambda: a2a(rows(4).to(torch.float64 if rank else dt)), "rank 1: x must have dtype"),
            "error-weights-differ": _expect_error(
                lambda: expert_parallel(full_layer(case, dt, seed=1234 + rank), _mesh(2, 1)),
                "differ across ranks"),
            "error-eplb-capacity": _expect_error(
                lambda: expert_parallel(full_layer(capacity, dt), _mesh(2, 1), redundant=2),
                "capacity_factor cannot be used"),
            "error-tp-divides-I": _expect_error(lambda: tensor_parallel(odd_i, _mesh(1, 2)),
                                                "intermediate_size"),
            "error-tp-block-scales": _expect_error(lambda: tensor_parallel(blocks, _mesh(1, 2)),
                                                   "fp8_block's w13's scale rows cannot be cut"),
            "error-ep-divides-E": _expect_error(lambda: expert_parallel(odd_e, _mesh(2, 1)),
                                                "must divide num_experts"),
            "error-twice": _expect_error(lambda: expert_parallel(tp_layer, _mesh(2, 1)),
                                         "single-device"),
            "error-placement": _expect_error(
                lambda: expert_parallel(full, _mesh(2, 1), placement=Placement(tuple(range(8)), 8, 4)),
                "placement is for 8 experts on 4 ranks"),
        })
    batch = Batch(case, dt, "ep_alltoall", 2, 1 if world == 2 else 2)
    e = rank // (world // 2)
    ref = naive_moe(full, batch.all, routing=full.route(batch.all))[batch.rows(e, 0)]
    key = "ep_alltoall" if world == 2 else "ep_alltoall(dedup)"
    results["after-errors"] = _one(build(full, world, key), "shuffled", batch.input(e, 0), ref)


def _eplb_figures(rank: int, results: dict) -> None:
    """4 EP ranks, 8 experts of which a few take most pairs: observed load -> rebalanced with 4
    redundant experts; max / mean pairs per rank before and after, and the new layer checked."""
    case = Case("skew", dict(num_experts=8, top_k=2, intermediate_size=8), (24, 24, 24, 24))
    full = full_layer(case, torch.float32)
    full.router_weight.data[:, 0] = torch.tensor([2.0, 1.6, 1.2, 0.8, 0.0, 0.0, 0.0, 0.0])
    xs = [group_tokens(case, torch.float32, e) for e in range(4)]
    for x in xs:
        x[:, 0] = 1.5
    whole = torch.cat(xs)
    ref = naive_moe(full, whole, routing=full.route(whole))[rank * 24 : (rank + 1) * 24]
    plain = expert_parallel(full, _mesh(4, 1), "alltoall")
    plain(xs[rank])
    load = observed_load(plain).tolist()
    identity = Placement(tuple(range(8)), 8, 4)
    balanced_layer = rebalance(full, plain, redundant=4)
    placement = balanced_layer.dispatch.placement
    verdict = _one(balanced_layer, "shuffled", xs[rank], ref)
    received = [0] * 4
    d = balanced_layer.dispatch
    for s in range(4):
        counts = d.routing_of(balanced_layer, xs[s], s).counts.tolist()
        for r in range(4):
            received[r] += sum(counts[r * d.num_local : (r + 1) * d.num_local])
    mean = sum(load) / 4

    def ratio(v):
        return max(v) / (sum(v) / len(v))

    figures = dict(load=load, before=ratio(identity.rank_loads(load)),
                   after=ratio(placement.rank_loads(load)), received_after=ratio(received),
                   received=received, placement=list(placement.experts), mean=mean)
    results["eplb"] = [verdict[0], figures if verdict[0] == "pass" else verdict[1]]


def run_checks(world: int, rank: int) -> dict:
    results: dict = {}
    _combinations(world, rank, results)
    _spy_checks(world, rank, results)
    _error_checks(world, rank, results)
    if world == 2:
        _triton_checks(rank, results)
    else:
        _eplb_figures(rank, results)
    return results
