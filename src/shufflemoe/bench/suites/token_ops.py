"""Routing and token-movement benchmarks: IndexShuffling against the spec's fused kernel and the
unfused torch ops, and the memory-bound movement ops against the copy bandwidth.

``index_shuffle``: the spec 000 IndexShuffling table (T in {128, 2048, 4096, 8192}, E in {16, 128},
top-1, bf16 scores), CUDA-graph replays over rotating score sets, beside
  - the unfused torch ops a user would write (argmax/topk + bincount + stable sort), timed
    eagerly because torch.bincount on CUDA synchronizes with the host (like the spec's peer);
  - a sync-free torch variant (topk + scatter_add histogram + stable argsort) under graphs.
Top-8 rows for E = 128 (Qwen3) and a few alternative tilings (``tune`` rows) are for information.

``token_movement``: gather_scale (+ fp8), silu_mul (+ fp8), scatter_add at D = 5120 (silu_mul:
h [A, 2 * 5120]), T in {1, 64, 2048, 16384}, k in {1, 4}, A = T * k, bf16, against the torch
reference of each op under graphs. Bytes are the fewest the op must move: each input row once
(gather_scale reads a token's row once, although k pairs use it), each output row once (scatter_add
reads and writes each output row once), plus indices, weights and scales. Pairs are laid out as a
routing leaves them: each token in exactly k pairs, in a random (expert-major) order. scatter_add's
ours runs token-major through Routing.positions; its peer is the pair-major torch reference.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Callable

import torch

from ...ops import gather_scale, index_shuffle, scatter_add, silu_mul
from ...testing import compare
from ..timing import rotations, time_fn
from . import SUITES, Context, SuiteResult

DEVICE = "cuda"
D = 5120
# (T, E) -> IndexShuffling time in us on an H100 (spec 000, FBGEMM cooperative kernel)
SPEC_US = {(128, 16): 5.08, (128, 128): 8.95, (2048, 16): 7.06, (2048, 128): 13.53,
           (4096, 16): 7.42, (4096, 128): 18.89, (8192, 16): 9.26, (8192, 128): 30.56}
SPEC_UNFUSED_US = {(128, 16): 36.71, (128, 128): 34.36, (2048, 16): 57.10, (2048, 128): 69.84,
                   (4096, 16): 68.96, (4096, 128): 87.46, (8192, 16): 123.94, (8192, 128): 165.21}
MIN_SPEEDUP = 5.0  # over the unfused torch ops
MIN_COPY_FRACTION = 0.85  # of the copy bandwidth, movement ops at T >= 2048
COLUMNS = ["case", "shape", "impl", "us", "gbps", "pct_copy", "peer", "peer_us", "ratio", "spec_us",
           "check", "note"]


def _target(name: str, measured, ok: bool) -> dict:
    return dict(target=name, measured=measured, met=bool(ok))


def _safe(rows: list[dict], case: str, shape: str, fn: Callable[[], list[dict]]) -> None:
    """Run one measurement; a failure becomes a row saying why instead of ending the suite."""
    try:
        for row in fn():
            rows.append(row)
            print({k: row.get(k) for k in COLUMNS if row.get(k) is not None}, flush=True)
    except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
        traceback.print_exc()
        rows.append(dict(case=case, shape=shape, impl="ours", check=f"ERROR {type(e).__name__}",
                         note=str(e)[:200]))
    torch.cuda.empty_cache()


# ---- index_shuffle ---------------------------------------------------------------------------------

def _unfused_eager(scores: torch.Tensor, k: int):
    """What a user writes: top-k (argmax for k = 1), bincount (syncs), stable sort."""
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


def _route_row(T: int, E: int, k: int, ctx: Context, *, config=None, label: str = "ours",
               peers: bool = True) -> list[dict]:
    from ...ops.index_shuffle import kernel

    n_sets = rotations(T * E * 2)
    g = torch.Generator(device=DEVICE).manual_seed(T + E)
    sets = [torch.randn(T, E, device=DEVICE, generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    reps = 20 if ctx.quick else 60

    def ours(i: int):
        if config is None:
            return index_shuffle(sets[i], k, impl="triton")
        return kernel.index_shuffle(sets[i], k, "none", False, 1.0, None, config=config)

    got, ref = ours(0), index_shuffle(sets[0], k, impl="torch")
    same = all(torch.equal(getattr(got, f), getattr(ref, f))
               for f in ("counts", "token_ids", "expert_ids", "num_valid"))
    t = time_fn(ours, n_sets, reps=reps)
    cfg = config or kernel.route_config(T, E, k)
    row = dict(case=f"index_shuffle top{k}", shape=f"T={T} E={E}", impl=label, us=t.median_us,
               spec_us=SPEC_US.get((T, E)) if k == 1 else None, check="ok" if same else "MISMATCH",
               note=f"bt={cfg.block_tokens} bec={cfg.expert_chunk} single={cfg.single} "
                    f"w={cfg.num_warps}")
    rows = [row]
    if peers:
        eager = time_fn(lambda i: _unfused_eager(sets[i], k), n_sets, graph=False, reps=reps)
        graphed = time_fn(lambda i: _unfused_sync_free(sets[i], k), n_sets, reps=reps)
        row.update(peer="torch unfused (eager, bincount syncs)", peer_us=eager.median_us,
                   ratio=eager.median_us / t.median_us)
        rows.append(dict(case=row["case"], shape=row["shape"], impl="torch sync-free (graph)",
                         us=graphed.median_us, peer="ours", peer_us=t.median_us,
                         ratio=graphed.median_us / t.median_us,
                         spec_us=SPEC_UNFUSED_US.get((T, E)) if k == 1 else None,
                         note="spec_us here: the spec's unfused ops"))
    return rows


def _tuning_configs(T: int, E: int) -> list:
    """Alternative tilings around the heuristic's choice (the other warp count; blocks of 32 to
    128 pairs; one program vs blocks at T = 512), to tune it from one run."""
    from ...ops.index_shuffle import kernel

    base = kernel.route_config(T, E, 1)
    alts = [dataclasses.replace(base, num_warps=4 if base.num_warps == 8 else 8)]
    for pairs in (32, 64, 128):
        c = kernel.route_config(T, E, 1, single_pairs=0, min_block_pairs=pairs)
        if c.block_tokens < T:
            alts.append(c)
    return [c for c in dict.fromkeys(alts) if c != base]


@SUITES.register("index_shuffle")
def index_shuffle_suite(ctx: Context) -> SuiteResult:
    rows: list[dict] = []
    for (T, E) in SPEC_US:
        _safe(rows, "index_shuffle top1", f"T={T} E={E}", lambda: _route_row(T, E, 1, ctx))
    for T in TOP8_T:
        _safe(rows, "index_shuffle top8", f"T={T} E=128", lambda: _route_row(T, 128, 8, ctx))
    for T, E in TUNE_SHAPES:
        for cfg in _tuning_configs(T, E):
            _safe(rows, "index_shuffle top1", f"T={T} E={E}",
                  lambda: _route_row(T, E, 1, ctx, config=cfg, label="tune", peers=False))
    targets = []
    for (T, E), spec in SPEC_US.items():
        mine = next((r for r in rows if r.get("impl") == "ours" and r["shape"] == f"T={T} E={E}"
                     and r["case"] == "index_shuffle top1"), None)
        us = mine.get("us") if mine else None
        ok = us is not None and mine.get("check") == "ok"
        targets.append(_target(f"T={T} E={E}: <= spec {spec} us", None if us is None else round(us, 2),
                               ok and us <= spec))
        ratio = mine.get("ratio") if mine else None
        targets.append(_target(f"T={T} E={E}: >= {MIN_SPEEDUP}x unfused torch",
                               None if ratio is None else round(ratio, 2),
                               ok and ratio is not None and ratio >= MIN_SPEEDUP))
    return SuiteResult(rows, targets, COLUMNS, notes=(
        "CUDA-graph replays over rotating bf16 score sets. ratio = peer us / our us. spec_us: the "
        "spec's fused IndexShuffling (ours rows) or unfused torch ops (sync-free rows). 'tune' rows "
        "time other tilings (note: bt = tokens per block, bec = experts per score tile)."))


# ---- token movement --------------------------------------------------------------------------------

def _movement_case(op: str, T: int, k: int):
    """(make input set, ours(set), peer(set), bytes moved, check(set) -> bool) for one row."""
    A = T * k
    g = torch.Generator(device=DEVICE).manual_seed(A)
    quant = op.endswith("+fp8")

    if op.startswith("gather_scale"):
        def make():
            return dict(x=torch.randn(T, D, device=DEVICE, generator=g).to(torch.bfloat16),
                        ids=(torch.randperm(A, device=DEVICE, generator=g) // k).int(),
                        w=torch.rand(A, device=DEVICE, generator=g))

        def run(s, impl):
            return gather_scale(s["x"], s["ids"], s["w"], quantize=quant, impl=impl)

        nbytes = T * D * 2 + A * D * (1 if quant else 2) + A * (8 + (4 if quant else 0))
    elif op.startswith("silu_mul"):
        def make():
            return dict(h=torch.randn(A, 2 * D, device=DEVICE, generator=g).to(torch.bfloat16))

        def run(s, impl):
            return silu_mul(s["h"], quantize=quant, impl=impl)

        nbytes = A * 2 * D * 2 + A * D * (1 if quant else 2) + (A * 4 if quant else 0)
    else:
        def make():
            # Row i holds pair perm[i] = token t's j-th choice (t = perm[i] // k), as a Routing
            # orders pairs; positions (argsort of perm) is where each token's pairs are.
            perm = torch.randperm(A, device=DEVICE, generator=g)
            return dict(out=torch.randn(T, D, device=DEVICE, generator=g).to(torch.bfloat16),
                        y=torch.randn(A, D, device=DEVICE, generator=g).to(torch.bfloat16),
                        ids=(perm // k).int(), pos=perm.argsort().int(),
                        w=torch.rand(A, device=DEVICE, generator=g))

        def run(s, impl):
            # ours: token-major (no atomics); the peer: index_add_, what a user would write
            pos = s["pos"] if impl == "triton" else None
            return scatter_add(s["out"], s["y"], s["ids"], s["w"], positions=pos, impl=impl)

        nbytes = A * D * 2 + 2 * T * D * 2 + A * 8

    def check(s) -> bool:
        """Ours against the torch reference on one set (gather: bit for bit; others: within the
        bf16 / fp8 tolerance; scatter_add on copies of the output)."""
        if op == "scatter_add":
            a = run(dict(s, out=s["out"].clone()), "triton")
            b = run(dict(s, out=s["out"].clone()), "torch")
            return compare(a, b.double(), torch.bfloat16).ok
        a, b = run(s, "triton"), run(s, "torch")
        if quant:
            if op.startswith("gather"):
                return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
            deq = [q.double() * sc.double()[:, None] for q, sc in (a, b)]
            return compare(deq[0], deq[1], "fp8_rowwise").ok
        return torch.equal(a, b) if op.startswith("gather") else compare(a, b.double(), torch.bfloat16).ok

    return make, run, nbytes, check


def _movement_row(op: str, T: int, k: int, ctx: Context) -> list[dict]:
    make, run, nbytes, check = _movement_case(op, T, k)
    n_sets = rotations(nbytes)
    sets = [make() for _ in range(n_sets)]
    ok = check(sets[0])
    reps = 15 if ctx.quick else 40
    ours = time_fn(lambda i: run(sets[i], "triton"), n_sets, reps=reps)
    peer = time_fn(lambda i: run(sets[i], "torch"), n_sets, reps=reps)
    gbps = nbytes / ours.median_us / 1e3
    return [dict(case=op, shape=f"T={T} k={k} D={D}", impl="ours", us=ours.median_us, gbps=gbps,
                 pct_copy=100 * gbps / ctx.ceilings.copy_gbps, peer="torch reference (graph)",
                 peer_us=peer.median_us, ratio=peer.median_us / ours.median_us,
                 check="ok" if ok else "MISMATCH", note=f"{nbytes / 1e6:.1f} MB")]


MOVEMENT_OPS = ("gather_scale", "gather_scale+fp8", "silu_mul", "silu_mul+fp8", "scatter_add")
MOVEMENT_T = (1, 64, 2048, 16384)
MOVEMENT_K = (1, 4)
TOP8_T = (128, 2048, 8192)
TUNE_SHAPES = ((128, 128), (512, 128), (2048, 128), (8192, 128))


@SUITES.register("token_movement")
def token_movement_suite(ctx: Context) -> SuiteResult:
    rows: list[dict] = []
    for op in MOVEMENT_OPS:
        for T in MOVEMENT_T:
            for k in MOVEMENT_K:
                _safe(rows, op, f"T={T} k={k} D={D}", lambda: _movement_row(op, T, k, ctx))
    targets = []
    for r in rows:
        T = int(r["shape"].split()[0][2:])
        if T >= 2048 and r.get("impl") == "ours":
            pct = r.get("pct_copy")
            targets.append(_target(f"{r['case']} {r['shape']}: >= {100 * MIN_COPY_FRACTION:.0f}% of copy",
                                   None if pct is None else f"{pct:.1f}%",
                                   pct is not None and pct >= 100 * MIN_COPY_FRACTION
                                   and r.get("check") == "ok"))
    return SuiteResult(rows, targets, COLUMNS, notes=(
        "CUDA-graph replays over rotating input sets, bf16, D = 5120. pct_copy = GB/s over the "
        "device copy bandwidth measured in this run; ratio = torch reference us / our us."))
