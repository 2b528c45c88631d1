"""Top-k with one block reduction a round, or by one sort, measured against index_shuffle's own
(offline SASS on any machine; CUDA-graph timings on a GPU).

    PYTHONPATH=src:benchmarks python benchmarks/probe_route_topk.py --sass       (no GPU needed)
    PYTHONPATH=src:benchmarks python benchmarks/probe_route_topk.py --out $OUT   (a GPU, ~1 min)

At decode the routing is one program (route_config: up to 64 pairs), and each of its k top-k
rounds makes two block-wide reductions: the best key, then the lowest expert index holding it.
With 4 warps a row's scores span warps, so each reduction crosses them through shared memory:
the Qwen3-30B-A3B shape (E = 128, top-8, T = 1) compiles to 80 barriers (offline sm_90 SASS),
and the kernel takes 4.6 us in the layer's timeline, the largest fixed cost before gate_up at
T = 1 (Llama 4 Scout, E = 16, top-1: 56 barriers, ~2.3 us). Here each round is one reduction
over (key << 32 | BEC - 1 - index) in int64: the same order (ties to the lower index), so the
same Routing bit for bit. The variant is the route kernel with its ``_topk`` swapped (same
source, other globals), launched like the single-program path without PDL, as is the baseline.
Writes $OUT/probe_route_topk.json (--sass: prints the counts).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import tempfile
import types

import torch
import triton
import triton.language as tl

from probe_route_single import SHAPES  # the router shapes (E, k, scoring, renormalize)
from shufflemoe.ops.index_shuffle import kernel as K
from shufflemoe.ops.index_shuffle.kernel import (SCORING_IDS, _SENTINEL, _key_value, _load_scores,
                                                 _score_keys, route_config)

TOKENS = (1, 2, 4, 8)
SETS = 64
FIELDS = ("counts", "token_ids", "expert_ids", "weights", "num_valid", "positions")


@triton.jit
def _weights(s, vals, tmask, scaling, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr,
             SCORING: tl.constexpr, RENORM: tl.constexpr):
    """kernel._topk's weights of the picks' values vals [BT, KP] (scores s [BT, BEC])."""
    jj = tl.arange(0, KP)[None, :]
    if SCORING == 1:
        rmax = tl.where(tmask, tl.max(s, 1), 0.0)
        denom = tl.where(tmask, tl.sum(tl.exp(s - rmax[:, None]), 1), 1.0)
        w = tl.math.div_rn(tl.exp(vals - rmax[:, None]), denom[:, None])
    elif SCORING == 2:
        w = tl.math.div_rn(tl.full([BT, KP], 1.0, tl.float32), 1.0 + tl.exp(-vals))
    else:
        w = vals
    if RENORM:
        total = tl.where(tmask, tl.sum(tl.where(jj < K, w, 0.0), 1), 1.0)
        w = tl.math.div_rn(w, total[:, None])
    return w * tl.cast(scaling, tl.float32)


@triton.jit
def _topk_packed(s_ptr, stride, t, tmask, scaling, E: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, BT: tl.constexpr, BEC: tl.constexpr, SCORING: tl.constexpr,
                 RENORM: tl.constexpr):
    """kernel._topk's whole-row path (BEC >= E) with one int64 max a round."""
    jj = tl.arange(0, KP)[None, :]
    ids = tl.zeros([BT, KP], tl.int32)
    vals = tl.zeros([BT, KP], tl.float32)
    cols = tl.arange(0, BEC)
    s = _load_scores(s_ptr, stride, t, tmask, cols, E)
    key = tl.where((cols < E)[None, :], _score_keys(s), _SENTINEL)
    packed = (key.to(tl.int64) << 32) | (BEC - 1 - cols).to(tl.int64)[None, :]
    taken = tl.full([BT, BEC], _SENTINEL, tl.int64) << 32
    for j in tl.static_range(K):
        m = tl.max(packed, 1)
        idx = (BEC - 1) - (m & 0xFFFFFFFF).to(tl.int32)
        packed = tl.where(cols[None, :] == idx[:, None], taken, packed)
        ids = tl.where(jj == j, idx[:, None], ids)
        vals = tl.where(jj == j, _key_value((m >> 32).to(tl.int32))[:, None], vals)
    return ids, _weights(s, vals, tmask, scaling, K, KP, BT, SCORING, RENORM)


@triton.jit
def _topk_sorted(s_ptr, stride, t, tmask, scaling, E: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, BT: tl.constexpr, BEC: tl.constexpr, SCORING: tl.constexpr,
                 RENORM: tl.constexpr):
    """kernel._topk's whole-row path (BEC >= E) as one descending sort of each row's packed
    (key, BEC - 1 - expert) and its first k (probe_persistent: 2 us against 3-3.6 for Qwen3's
    top-8 of 128 in one program)."""
    cols = tl.arange(0, BEC)
    s = _load_scores(s_ptr, stride, t, tmask, cols, E)
    key = tl.where((cols < E)[None, :], _score_keys(s), _SENTINEL)
    packed = (key.to(tl.int64) << 32) | (BEC - 1 - cols).to(tl.int64)[None, :]
    first = tl.broadcast_to(tl.minimum(tl.arange(0, KP), BEC - 1)[None, :], [BT, KP])
    top = tl.gather(tl.sort(packed, dim=1, descending=True), first, 1)
    ids = (BEC - 1) - (top & 0xFFFFFFFF).to(tl.int32)
    vals = _key_value((top >> 32).to(tl.int32))
    return ids, _weights(s, vals, tmask, scaling, K, KP, BT, SCORING, RENORM)


def _route_kernel_with(topk):
    """The route kernel's source with ``topk`` in place of _topk (a new JIT function)."""
    fn = K._route_kernel.fn
    fn_globals = dict(fn.__globals__, _topk=topk)
    copy = types.FunctionType(fn.__code__, fn_globals, fn.__name__, fn.__defaults__)
    copy.__annotations__ = fn.__annotations__  # (tl.constexpr parameters are known by these)
    return triton.jit(copy)


KERNELS = {"two reductions": K._route_kernel, "packed": _route_kernel_with(_topk_packed),
           "sorted": _route_kernel_with(_topk_sorted)}


def _consts(E: int, k: int, scoring: str, renorm: bool, cfg) -> dict:
    return dict(E=E, K=k, KP=triton.next_power_of_2(k), BT=cfg.block_tokens,
                BEC=cfg.expert_chunk, NB=K._num_buckets(E, True), FROM_SCORES=True,
                SCORING=SCORING_IDS[scoring], RENORM=renorm, HAS_W=False, HAS_CAP=False,
                SINGLE=True, PDL=False)


def route(kern, scores: torch.Tensor, k: int, scoring: str, renorm: bool, cfg) -> dict:
    """The single-program routing of ``scores`` by ``kern`` (no PDL): Routing's fields."""
    T, E = scores.shape
    A, dev = T * k, scores.device
    out = dict(counts=torch.empty(E, dtype=torch.int32, device=dev),
               token_ids=torch.empty(A, dtype=torch.int32, device=dev),
               expert_ids=torch.empty(A, dtype=torch.int32, device=dev),
               weights=torch.empty(A, dtype=torch.float32, device=dev),
               num_valid=torch.empty(1, dtype=torch.int32, device=dev),
               positions=torch.empty(A, dtype=torch.int32, device=dev))
    none_i = torch.empty(1, dtype=torch.int32, device=dev)
    none_w = torch.empty(1, dtype=torch.float32, device=dev)
    kern[(1,)](scores, scores.stride(0), scores, scores.stride(0), *out.values(), none_i, none_i,
               none_w, none_i, T, 0, 1.0, **_consts(E, k, scoring, renorm, cfg),
               num_warps=cfg.num_warps)
    return out


def sass_counts(kern, consts: dict, num_warps: int) -> dict:
    """Instructions, barriers, shuffles and shared-memory accesses of ``kern`` built offline for
    sm_90 (Triton's bundled ptxas and cuobjdump)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(src_ptr="*bf16", src_stride="i32", win_ptr="*bf16", win_stride="i32",
               counts_ptr="*i32", tok_ptr="*i32", exp_ptr="*i32", w_ptr="*fp32", nv_ptr="*i32",
               pos_ptr="*i32", skey_ptr="*i32", sid_ptr="*i32", sw_ptr="*fp32", hist_ptr="*i32",
               T="i32", cap="i32", scaling="fp32", **{c: "constexpr" for c in consts})
    attrs = {(kern.arg_names.index(n),): [["tt.divisibility", 16]] for n, v in sig.items()
             if v.startswith("*")}
    built = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        pathlib.Path(path).write_bytes(built.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        text = subprocess.run([tool, "-sass", path], capture_output=True, text=True,
                              check=True).stdout
    ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0].split(".")[0]
           for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    n = collections.Counter(ops)
    return dict(instructions=len(ops), BAR=n["BAR"], SHFL=n["SHFL"], STS=n["STS"], LDS=n["LDS"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=pathlib.Path)
    p.add_argument("--sass", action="store_true", help="offline sm_90 counts only (no GPU)")
    args = p.parse_args()
    rows = []
    for name, (E, k, scoring, renorm) in SHAPES.items():
        for T in TOKENS:
            cfg = route_config(T, E, k)
            assert cfg.single and cfg.expert_chunk >= E, (name, T, cfg)
            row = dict(shape=name, T=T, cfg=f"bt={cfg.block_tokens} bec={cfg.expert_chunk} "
                                           f"w{cfg.num_warps}")
            if args.sass:
                for way, kern in KERNELS.items():
                    row[way] = sass_counts(kern, _consts(E, k, scoring, renorm, cfg),
                                           cfg.num_warps)
                print(name, T, row, flush=True)
                continue
            from shufflemoe.bench.timing import time_fn

            scores = [torch.randn(T, E, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
            want = route(KERNELS["two reductions"], scores[0], k, scoring, renorm, cfg)
            for way in ("packed", "sorted"):
                got = route(KERNELS[way], scores[0], k, scoring, renorm, cfg)
                row[f"{way}_same_bits"] = all(torch.equal(got[f], want[f]) for f in FIELDS)
            for way, kern in KERNELS.items():
                row[f"{way}_us"] = time_fn(
                    lambda i: route(kern, scores[i], k, scoring, renorm, cfg),
                    SETS, graph=True, reps=30).median_us
            rows.append(row)
            print(f"{name} T={T} ({row['cfg']}) two reductions {row['two reductions_us']:.2f} us, "
                  f"packed {row['packed_us']:.2f} us, sorted {row['sorted_us']:.2f} us, same bits "
                  f"{row['packed_same_bits']} {row['sorted_same_bits']}", flush=True)
    if args.out and rows:
        from shufflemoe.bench.report import metadata

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_route_topk.json").write_text(
            json.dumps(dict(meta=metadata(), rows=rows), indent=1, default=str))


if __name__ == "__main__":
    main()
