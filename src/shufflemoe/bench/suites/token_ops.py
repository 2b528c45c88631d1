"""Routing and token-movement benchmarks: IndexShuffling against the spec's fused kernel and the
unfused torch ops, and the memory-bound movement ops against the copy bandwidth.

``index_shuffle``: the spec 000 IndexShuffling table (T in {128, 2048, 4096, 8192}, E in {16, 128},
top-1, bf16 scores) and top-8 rows for E = 128 (Qwen3), over rotating score sets. Like for like:
  - graph: ours against the sync-free torch ops a user can capture (topk + scatter_add histogram +
    stable argsort), both as CUDA-graph replays;
  - eager: ours launched from Python against the same sync-free ops and against the ops a user
    writes first (argmax/topk + bincount + stable sort; bincount synchronizes with the host).

``token_movement``: gather_scale (+ fp8), silu_mul (+ fp8), scatter_add at D = 5120 (silu_mul:
h [A, 2 * 5120]), T in {1, 64, 2048, 16384}, k in {1, 4}, A = T * k, bf16, against the torch
reference of each op, both as CUDA-graph replays. These write as much as they read, so they are
judged against the copy bandwidth. Bytes are the fewest the op must move: each input row once
(gather_scale reads a token's row once, although k pairs use it), each output row once
(scatter_add reads and writes each output row once), plus indices, weights and scales. Pairs are
laid out as a routing leaves them: each token in exactly k pairs, in a random (expert-major)
order. scatter_add's ours runs token-major through Routing.positions; its peer is the pair-major
torch reference.

Every timed path is checked: one more pass of the captured graph (or eager calls) after the
samples, each input set's output compared with the torch reference.
"""

from __future__ import annotations

import traceback
from typing import Callable

import torch

from ...ops import gather_scale, index_shuffle, scatter_add, silu_mul
from ...testing import compare
from ..analysis import ratios, select, span, tally, target
from ..timing import rotations, time_fn
from . import Analysis, Context, SuiteResult, suite

DEVICE = "cuda"
D = 5120
# (T, E) -> IndexShuffling time in us on an H100 (spec 000, FBGEMM cooperative kernel)
SPEC_US = {(128, 16): 5.08, (128, 128): 8.95, (2048, 16): 7.06, (2048, 128): 13.53,
           (4096, 16): 7.42, (4096, 128): 18.89, (8192, 16): 9.26, (8192, 128): 30.56}
SPEC_UNFUSED_US = {(128, 16): 36.71, (128, 128): 34.36, (2048, 16): 57.10, (2048, 128): 69.84,
                   (4096, 16): 68.96, (4096, 128): 87.46, (8192, 16): 123.94, (8192, 128): 165.21}
MIN_COPY_PCT = 85.0  # movement ops at T >= TARGET_MIN_T
TARGET_MIN_T = 2048
KEYS = ["case", "shape"]
COLUMNS = ["case", "shape", "impl", "side", "mode", "us", "gbps", "pct_copy", "spec_us", "check", "note"]
TOP8_T = (128, 2048, 8192)
MOVEMENT_OPS = ("gather_scale", "gather_scale+fp8", "silu_mul", "silu_mul+fp8", "scatter_add")
MOVEMENT_T = (1, 64, 2048, 16384)
MOVEMENT_K = (1, 4)


def _safe(rows: list[dict], case: str, shape: str, fn: Callable[[], list[dict]]) -> None:
    """Run one measurement; a failure becomes a row saying why instead of ending the suite."""
    try:
        rows += fn()
    except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
        traceback.print_exc()
        rows.append(dict(case=case, shape=shape, impl="ours", side="ours",
                         check=f"ERROR {type(e).__name__}", note=str(e)[:200]))
    torch.cuda.empty_cache()


# ---- index_shuffle ---------------------------------------------------------------------------------

def _unfused_eager(scores: torch.Tensor, k: int):
    """What a user writes first: top-k (argmax for k = 1), bincount (syncs), stable sort."""
    E = scores.shape[1]
    ids = scores.argmax(1, keepdim=True) if k == 1 else scores.topk(k, dim=1).indices
    flat = ids.flatten()
    counts = torch.bincount(flat, minlength=E)
    order = torch.sort(flat, stable=True).indices
    return counts, order // k, flat[order]


def _unfused_sync_free(scores: torch.Tensor, k: int):
    """The same without a host sync: histogram by scatter_add, stable argsort."""
    E = scores.shape[1]
    flat = scores.topk(k, dim=1).indices.flatten()
    counts = torch.zeros(E, dtype=torch.int64, device=scores.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    order = torch.argsort(flat, stable=True)
    return counts, order // k, flat[order]


_ROUTING_FIELDS = ("counts", "token_ids", "expert_ids", "num_valid")


def _route_rows(T: int, E: int, k: int, ctx: Context) -> list[dict]:
    from ...ops.index_shuffle import kernel

    n_sets = rotations(T * E * 2)
    g = torch.Generator(device=DEVICE).manual_seed(T + E)
    sets = [torch.randn(T, E, device=DEVICE, generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    reps = 20 if ctx.quick else 40

    def ours(i: int):
        r = index_shuffle(sets[i], k, impl="triton")
        return tuple(getattr(r, f) for f in _ROUTING_FIELDS)

    def check(outputs: list) -> str:
        for i, got in enumerate(outputs):
            ref = index_shuffle(sets[i], k, impl="torch")
            if not all(torch.equal(a, getattr(ref, f)) for a, f in zip(got, _ROUTING_FIELDS)):
                return f"MISMATCH (set {i})"
        return "ok"

    cfg = kernel.route_config(T, E, k)
    case = dict(case=f"index_shuffle top{k}", shape=f"T={T} E={E}")
    note = f"bt={cfg.block_tokens} bec={cfg.expert_chunk} single={cfg.single} w={cfg.num_warps}"
    rows = []
    for mode in ("graph", "eager"):
        t = time_fn(ours, n_sets, graph=mode == "graph", reps=reps, keep_outputs=True)
        rows.append(dict(case, impl="shufflemoe", side="ours", mode=mode, **t.fields(),
                         spec_us=SPEC_US.get((T, E)) if k == 1 and mode == "graph" else None,
                         check=check(t.outputs), note=note))
    unfused_spec = SPEC_UNFUSED_US.get((T, E)) if k == 1 else None
    for mode in ("graph", "eager"):
        t = time_fn(lambda i: _unfused_sync_free(sets[i], k), n_sets, graph=mode == "graph", reps=reps)
        rows.append(dict(case, impl="torch sync-free ops", side="peer", mode=mode, **t.fields(),
                         spec_us=unfused_spec, note="spec_us: the spec's unfused torch ops"))
    t = time_fn(lambda i: _unfused_eager(sets[i], k), n_sets, graph=False, reps=reps)
    rows.append(dict(case, impl="torch ops with bincount (syncs)", side="peer", mode="eager",
                     **t.fields(), spec_us=unfused_spec))
    return rows


def analyse_index_shuffle(rows: list[dict]) -> Analysis:
    rs = ratios(rows, KEYS)
    spec_t, ratio_t = [], []
    for (T, E), spec in SPEC_US.items():
        shape = f"T={T} E={E}"
        mine = select(rows, case="index_shuffle top1", shape=shape, side="ours", mode="graph")
        us = mine[0].get("us") if mine and mine[0].get("check") == "ok" else None
        spec_t.append(target(f"{shape} time in a graph", us, at_most=spec, unit=" us (spec)"))
        # the spec's own speedup of its fused kernel over the unfused ops, graph vs graph here
        r = select(rs, case="index_shuffle top1", shape=shape, peer="torch sync-free ops",
                   modes="graph vs graph")
        ratio_t.append(target(f"{shape} vs sync-free torch ops, graph vs graph",
                              r[0]["ratio"] if r and us is not None else None,
                              at_least=round(SPEC_UNFUSED_US[(T, E)] / spec, 2), unit="x (the spec's ratio)"))
    graph = select(rs, peer="torch sync-free ops", modes="graph vs graph")
    eager = select(rs, modes="eager vs eager")
    ours = select(rows, side="ours", mode="graph", case="index_shuffle top1")
    headlines = [
        dict(what="fused index shuffle, top-1, T = 128..8192, E = 16/128, CUDA graph",
             result=f"{span((r.get('us') for r in ours), '{:.1f}', unit=' us')}; at most the spec's FBGEMM "
                    f"time: {tally(spec_t)}"),
        dict(what="index shuffle vs sync-free torch ops, graph vs graph (top-1 and top-8)",
             result=f"{span((r['ratio'] for r in graph), unit='x')}; at least the spec's fused/unfused ratio: "
                    f"{tally(ratio_t)}"),
        dict(what="index shuffle vs torch ops, eager vs eager (sync-free ops / ops with bincount)",
             result=f"{span((r['ratio'] for r in eager if r['peer'] == 'torch sync-free ops'), unit='x')} / "
                    f"{span((r['ratio'] for r in eager if r['peer'] != 'torch sync-free ops'), unit='x')}"),
    ]
    return Analysis(rs, spec_t + ratio_t, headlines)


@suite("index_shuffle", "fused routing vs the spec's FBGEMM times and the torch ops (graph and eager)",
       est_s=30, part=2)
def index_shuffle_suite(ctx: Context) -> SuiteResult:
    rows: list[dict] = []
    cases = [(T, E, 1) for (T, E) in SPEC_US] + [(T, 128, 8) for T in TOP8_T]
    for n, (T, E, k) in enumerate(cases):
        ctx.progress(n, len(cases), f"top{k} T={T} E={E}")
        _safe(rows, f"index_shuffle top{k}", f"T={T} E={E}", lambda: _route_rows(T, E, k, ctx))
    return SuiteResult(rows, analyse_index_shuffle, COLUMNS, notes=(
        "Rotating bf16 score sets. ratio = peer us / ours in the same mode. spec_us: the spec's "
        "fused IndexShuffling (ours) or unfused torch ops (peers). note: the tiling (bt = tokens "
        "per block, bec = experts per score tile)."))


# ---- token movement --------------------------------------------------------------------------------

def _movement_case(op: str, T: int, k: int):
    """(make input set, run(set, impl), bytes read, bytes written) for one row."""
    A = T * k
    g = torch.Generator(device=DEVICE).manual_seed(A)
    quant = op.endswith("+fp8")
    out_item = 1 if quant else 2
    scale_bytes = A * 4 if quant else 0

    if op.startswith("gather_scale"):
        def make():
            perm = torch.randperm(A, device=DEVICE, generator=g)  # as in scatter_add's sets below
            return dict(x=torch.randn(T, D, device=DEVICE, generator=g).to(torch.bfloat16),
                        ids=(perm // k).int(), pos=perm.argsort().int(),
                        w=torch.rand(A, device=DEVICE, generator=g))

        def run(s, impl):
            # ours: token-major at k > 1 (each row read once); the peer: index_select and a mul
            pos = s["pos"] if impl == "triton" else None
            return gather_scale(s["x"], s["ids"], s["w"], quantize=quant, positions=pos,
                                impl=impl)

        return make, run, T * D * 2 + A * 8, A * D * out_item + scale_bytes
    if op.startswith("silu_mul"):
        def make():
            return dict(h=torch.randn(A, 2 * D, device=DEVICE, generator=g).to(torch.bfloat16))

        def run(s, impl):
            return silu_mul(s["h"], quantize=quant, impl=impl)

        return make, run, A * 2 * D * 2, A * D * out_item + scale_bytes

    def make():
        # Row i holds pair perm[i] = token t's j-th choice (t = perm[i] // k), as a Routing orders
        # pairs; positions (argsort of perm) is where each token's pairs are.
        perm = torch.randperm(A, device=DEVICE, generator=g)
        out = torch.randn(T, D, device=DEVICE, generator=g).to(torch.bfloat16)
        return dict(out=out, out0=out.clone(),
                    y=torch.randn(A, D, device=DEVICE, generator=g).to(torch.bfloat16),
                    ids=(perm // k).int(), pos=perm.argsort().int(),
                    w=torch.rand(A, device=DEVICE, generator=g))

    def run(s, impl):
        # ours: token-major (no atomics); the peer: index_add_, what a user would write
        pos = s["pos"] if impl == "triton" else None
        return scatter_add(s["out"], s["y"], s["ids"], s["w"], positions=pos, impl=impl)

    return make, run, A * D * 2 + T * D * 2 + A * 8, T * D * 2


def _movement_check(op: str, run, sets: list[dict], outputs: list) -> str:
    """The timed path's output of every set against the torch reference (gather: bit for bit;
    others within the bf16 / fp8 tolerance; scatter_add from the set's original output)."""
    for i, (s, got) in enumerate(zip(sets, outputs)):
        if op == "scatter_add":
            ref = run(dict(s, out=s["out0"].clone()), "torch")
        else:
            ref = run(s, "torch")
        if op.endswith("+fp8"):
            if op.startswith("gather"):
                ok = torch.equal(got[0].view(torch.uint8), ref[0].view(torch.uint8))
            else:
                deq = [q.double() * sc.double()[:, None] for q, sc in (got, ref)]
                ok = compare(deq[0], deq[1], "fp8_rowwise").ok
        elif op.startswith("gather"):
            ok = torch.equal(got, ref)
        else:
            ok = compare(got, ref.double(), torch.bfloat16).ok
        if not ok:
            return f"MISMATCH (set {i})"
    return "ok"


def _movement_rows(op: str, T: int, k: int, ctx: Context) -> list[dict]:
    make, run, read, write = _movement_case(op, T, k)
    n_sets = rotations(read + write)
    sets = [make() for _ in range(n_sets)]
    reset = (lambda: [s["out"].copy_(s["out0"]) for s in sets]) if op == "scatter_add" else None
    reps = 15 if ctx.quick else 40
    case = dict(case=op, shape=f"T={T} k={k} D={D}", read_bytes=read, write_bytes=write, bound="copy")
    ours = time_fn(lambda i: run(sets[i], "triton"), n_sets, reps=reps, keep_outputs=True, reset=reset)
    peer = time_fn(lambda i: run(sets[i], "torch"), n_sets, reps=reps)
    return [dict(case, impl="shufflemoe", side="ours", mode="graph", **ours.fields(),
                 check=_movement_check(op, run, sets, ours.outputs),
                 note=f"{(read + write) / 1e6:.1f} MB"),
            dict(case, impl="torch reference", side="peer", mode="graph", **peer.fields())]


def _tokens(row: dict) -> int:
    return int(row["shape"].split()[0][2:])  # "T=2048 k=4 D=5120"


def analyse_movement(rows: list[dict]) -> Analysis:
    big = [r for r in select(rows, side="ours") if _tokens(r) >= TARGET_MIN_T]
    targets = [target(f"{r['case']} {r['shape']} of copy bandwidth",
                      r.get("pct_copy") if r.get("check") == "ok" else None, at_least=MIN_COPY_PCT, unit="%")
               for r in big]
    rs = ratios(rows, KEYS)
    headlines = []
    for op in MOVEMENT_OPS:
        mine = select(big, case=op)
        headlines.append(dict(
            what=f"{op}, T >= {TARGET_MIN_T}, D = {D}, k = 1/4 (CUDA graph)",
            result=f"{span((r.get('pct_copy') for r in mine), '{:.0f}', unit='%')} of the copy bandwidth; "
                   f"{span((r['ratio'] for r in rs if r['case'] == op), unit='x')} the torch reference (graph vs graph)"))
    headlines.append(dict(what=f"movement ops, T >= 2048: >= {MIN_COPY_PCT:.0f}% of copy", result=tally(targets)))
    return Analysis(rs, targets, headlines)


@suite("token_movement", "gather/SwiGLU/scatter ops against the copy bandwidth and their torch "
       "references (graph)", est_s=50, part=2)
def token_movement_suite(ctx: Context) -> SuiteResult:
    rows: list[dict] = []
    cases = [(op, T, k) for op in MOVEMENT_OPS for T in MOVEMENT_T for k in MOVEMENT_K]
    for n, (op, T, k) in enumerate(cases):
        ctx.progress(n, len(cases), f"{op} T={T} k={k}")
        _safe(rows, op, f"T={T} k={k} D={D}", lambda: _movement_rows(op, T, k, ctx))
    return SuiteResult(rows, analyse_movement, COLUMNS, notes=(
        "CUDA-graph replays over rotating input sets, bf16, D = 5120. pct_copy = bytes read + "
        "written per second over the copy bandwidth (the stricter of the suite's start and end "
        "measurements); ratio = torch reference us / ours."))
