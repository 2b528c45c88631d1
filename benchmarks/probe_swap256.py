"""The swapped 256-token grouped GEMM tile, TileConfig(256, 128, 64, 8 warps, 3 stages, swap_ab),
on the GPU: where its output is wrong (one GPU call, no timing).

probe_prefill_formats.py found it the fastest weight-only tile where groups pass 256 rows
(Mixtral TP2 / Scout TP8) but wrong on Qwen3-30B-A3B's groups of ~128 rows (fp8_w8a16: 1074
non-finite values, mxfp4: 1269 out of tolerance), while the interpreter matches float64. Here
the routed GEMMs' shapes alone, each against float64 on the same device: the formats (bf16 too),
the two GEMM forms the layer runs (gate_up: gathered rows and the GLU; down: rows in order), the
group sizes (Qwen3-like routing, equal groups under and over 256 rows), then variants of the tile
(pointer loads, two stages, 4 warps, 128 tokens); and for each wrong output, where the wrong
elements lie (rows within their tile, columns within their weight tile). Writes
$OUT/probe_swap256.json. With --stress R: each of STRESS_TILES on the routed GEMMs of Qwen3-30B-A3B
T = 2048, Scout TP8 T = 16384 and Mixtral TP2 T = 2048 (down), R runs each, the wrong runs
counted and the GEMM timed (CUDA events over 10 launches, 5 times, not in a graph):
$OUT/probe_swap256_stress.json.

Since these runs (results/probe_swap256_24e962d.json, probe_swap256_stress_dd4e678.json) the
kernel refuses swapped tiles of more than kernel.SWAP_MAX_ROWS rows: the first mode records the
refusals, --stress skips those tiles.

    PYTHONPATH=src python benchmarks/probe_swap256.py --out $OUT [--budget 240] [--stress R]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

from shufflemoe.bench.report import metadata
from shufflemoe.ops import grouped_gemm
from shufflemoe.ops.grouped_gemm import configs
from shufflemoe.ops.grouped_gemm.kernel import SWAP_MAX_ROWS
from shufflemoe.ops.quantize.formats import weight_format
from shufflemoe.testing import compare, poisoned, tolerance_for

TileConfig = configs.TileConfig
TILE = TileConfig(256, 128, 64, num_warps=8, num_stages=3, swap_ab=True)
VARIANTS = {
    "256 swap s3 (the tile)": TILE,
    "256 swap s3 pointers": TILE.with_(tma="none"),
    "256 swap s2": TILE.with_(num_stages=2),
    "256 swap s3 w4": TILE.with_(num_warps=4),
    "256 swap s3 flat": TILE.with_(flatten=True),
    "128 swap x256 (the rule)": configs.FORMAT_PREFILL_TILES["mxfp4"],
    "128 swap x256 flat": configs.FORMAT_PREFILL_TILES["mxfp4"].with_(flatten=True),
    "128 swap x256 s2": configs.FORMAT_PREFILL_TILES["mxfp4"].with_(num_stages=2),
}
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: the interpreter, small shapes
FORMS = {"gate_up": dict(N=2 * 768, K=2048, glu=True), "down": dict(N=2048, K=768, glu=False),
         "scout down": dict(N=5120, K=1024, glu=False),
         "mixtral down": dict(N=4096, K=7168, glu=False)}
# --stress: each tile on each routed GEMM shape, many runs, failures counted and the GEMM timed
STRESS_TILES = ("128 swap x256 (the rule)", "256 swap s3 (the tile)", "256 swap s3 flat",
                "256 swap s2", "128 swap x256 flat", "128 swap x256 s2")
STRESS_SHAPES = (("down", "qwen3 T=2048"), ("gate_up", "qwen3 T=2048"),
                 ("scout down", "equal 1024"), ("mixtral down", "equal 512"))


def groups(kind: str, gen: torch.Generator) -> list[int]:
    if kind == "qwen3 T=2048":  # 16384 pairs over 128 experts, uniform routing
        counts = torch.bincount(torch.randint(0, 128, (16384,), generator=gen), minlength=128)
        return counts.tolist()
    size, n = {"equal 128": (128, 64), "equal 200": (200, 40), "equal 300": (300, 24),
               "equal 512": (512, 16),
                  "equal 1024": (1024, 16)}[kind]
    return [size] * n


def case(fmt_name: str, form: str, sizes: list[int], seed: int) -> dict:
    """Inputs and the float64 reference of one GEMM (on the GPU)."""
    g = torch.Generator(DEV).manual_seed(seed)
    N, K, glu = FORMS[form]["N"], FORMS[form]["K"], FORMS[form]["glu"]
    G, M = len(sizes), sum(sizes)
    x = torch.randn(M, K, generator=g, device=DEV).to(torch.bfloat16)
    w = (torch.randn(G, N, K, generator=g, device=DEV) / K**0.5).to(torch.bfloat16)
    kw = {}
    if fmt_name == "none":
        wq, w64 = w, w.double()
    else:
        fmt = weight_format(fmt_name)
        wq, ws = fmt.quantize(w, None)
        w64 = fmt.dequantize(wq, ws, None).double()
        kw = dict(w_scale=ws, quantization=fmt_name)
    x64 = x.double()
    ref = torch.empty(M, N, dtype=torch.float64, device=DEV)
    start = 0
    for e, n in enumerate(sizes):
        ref[start:start + n] = x64[start:start + n] @ w64[e].T
        start += n
    if glu:
        gate, up = ref.chunk(2, dim=1)
        ref = gate * torch.sigmoid(gate) * up
        perm = torch.randperm(M + 7, generator=g, device=DEV)[:M]
        src = torch.full((M + 7, K), float("nan"), dtype=x.dtype, device=DEV)
        src[perm] = x
        x, kw = src, dict(kw, x_ids=perm.to(torch.int32), glu="silu")
    return dict(x=x, w=wq, kw=kw, ref=ref, sizes=sizes, M=M, N=ref.shape[1])


def where_wrong(out: torch.Tensor, ref: torch.Tensor, sizes: list[int], block_m: int,
                block_n: int) -> dict:
    """Wrong elements (non-finite or past 8x the bf16 tolerance's atol + rtol bound) by row
    within their m-tile, column within their n-tile, and group size."""
    o, r = out.double(), ref
    rms = r.square().mean().sqrt()
    bad = ~torch.isfinite(o) | ((o - r).abs() > 8 * (6e-2 * rms + 2e-2 * r.abs()))
    rows, cols = bad.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return dict(bad=0)
    starts = torch.tensor([0] + sizes[:-1], device=out.device).cumsum(0)
    grp = torch.searchsorted(starts + torch.tensor(sizes, device=out.device), rows, right=True)
    in_group = rows - starts[grp]
    sz = torch.tensor(sizes, device=out.device)[grp]
    hist = lambda v, n: torch.bincount(v, minlength=n).tolist()  # noqa: E731
    return dict(bad=int(rows.numel()), bad_rows=int(rows.unique().numel()),
                nonfinite=int((~torch.isfinite(o)).sum()),
                row_in_tile_by_16=hist(((in_group % block_m) // 16).cpu(), block_m // 16),
                col_in_tile_by_16=hist(((cols % block_n) // 16).cpu(), block_n // 16),
                groups_hit=int(grp.unique().numel()),
                group_sizes_hit=sorted(set(sz.unique().tolist()))[:20],
                tile_of_row=sorted(set((in_group // block_m).unique().tolist()))[:8])


def run(variant: str, fmt_name: str, form: str, kind: str, seed: int) -> dict:
    cfg = VARIANTS[variant]
    sizes = groups(kind, torch.Generator().manual_seed(seed))
    c = case(fmt_name, form, sizes, seed)
    ms = torch.tensor(sizes, dtype=torch.int32, device=DEV)
    row = dict(variant=variant, format=fmt_name, form=form, groups=kind, seed=seed)
    for rep in range(2):
        out = poisoned(c["M"], c["N"], dtype=torch.bfloat16, device=DEV)
        with configs.override(cfg):
            y = grouped_gemm(c["x"], c["w"], ms, out=out, **c["kw"])
        tol = "bfloat16" if fmt_name == "none" else fmt_name
        cmp = compare(y, c["ref"], tol)
        row[f"rep{rep}"] = dict(ok=cmp.ok, why=cmp.why,
                                **where_wrong(y, c["ref"], sizes, cfg.block_m, cfg.block_n))
    print(json.dumps(row), flush=True)
    return row


def within(out: torch.Tensor, ref: torch.Tensor, tol: str) -> bool:
    """testing.compare's elementwise bound, on the device (a quick check for many runs)."""
    t, o = tolerance_for(tol), out.double()
    bound = t.atol * ref.square().mean().sqrt() + t.rtol * ref.abs()
    return bool(torch.isfinite(o).all() and ((o - ref).abs() <= bound).all())


def stress(fmt_name: str, form: str, kind: str, reps: int) -> list[dict]:
    """Each STRESS_TILES tile on one GEMM: wrong outputs in ``reps`` runs, and the median time."""
    sizes = groups(kind, torch.Generator().manual_seed(3))
    c = case(fmt_name, form, sizes, 3)
    ms = torch.tensor(sizes, dtype=torch.int32, device=DEV)
    tol = "bfloat16" if fmt_name == "none" else fmt_name
    rows = []
    for variant in STRESS_TILES:
        cfg = VARIANTS[variant]
        out = poisoned(c["M"], c["N"], dtype=torch.bfloat16, device=DEV)
        wrong, times = 0, []
        if cfg.swap_ab and cfg.block_m > SWAP_MAX_ROWS:  # the kernel refuses it
            continue
        with configs.override(cfg):
            for rep in range(reps):
                out.fill_(float("nan"))
                y = grouped_gemm(c["x"], c["w"], ms, out=out, **c["kw"])
                wrong += not within(y, c["ref"], tol)
            for _ in range(5):  # back-to-back launches: the GPU's time, not the host's
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(10):
                    grouped_gemm(c["x"], c["w"], ms, out=out, **c["kw"])
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / 10)
        times.sort()
        rows.append(dict(variant=variant, format=fmt_name, form=form, groups=kind, reps=reps,
                         wrong=wrong, us=times[len(times) // 2], us_p20=times[len(times) // 5],
                         us_p80=times[4 * len(times) // 5]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def plan() -> list[tuple]:
    first = [("256 swap s3 (the tile)", f, form, kind, 1)
             for kind in ("qwen3 T=2048", "equal 128", "equal 300")
             for f in ("fp8_w8a16", "mxfp4", "none") for form in FORMS]
    more = [(v, f, form, "qwen3 T=2048", 1) for v in list(VARIANTS)[1:]
            for f in ("fp8_w8a16", "none") for form in FORMS]
    extra = [("256 swap s3 (the tile)", f, form, kind, 2) for kind in ("equal 200", "equal 512")
             for f in ("fp8_w8a16",) for form in FORMS]
    return first + more + extra


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--budget", type=float, default=240.0)
    p.add_argument("--stress", type=int, default=0, help="runs a tile and shape (0: no stress)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    rows = []
    if args.stress:
        for fmt_name in ("fp8_w8a16", "mxfp4"):
            for form, kind in STRESS_SHAPES:
                if time.time() < deadline:
                    rows += stress(fmt_name, form, kind, args.stress)
        (args.out / "probe_swap256_stress.json").write_text(
            json.dumps(dict(meta=metadata(), rows=rows), indent=1))
        raise SystemExit(0)
    for spec in plan():
        if time.time() > deadline:
            rows.append(dict(zip(("variant", "format", "form", "groups", "seed"), spec),
                             skipped="time budget"))
            continue
        try:
            rows.append(run(*spec))
        except Exception as exc:  # a compile or launch failure is a finding too
            rows.append(dict(zip(("variant", "format", "form", "groups", "seed"), spec),
                             error=repr(exc)[:500]))
            print(rows[-1], flush=True)
    (args.out / "probe_swap256.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                             indent=1))
