"""Every parallel layout the library builds on two ranks, checked against the single-device layer
and timed next to its communication and the planner's prediction of it (issue 17).

    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu.py --out benchmarks/results/multi_gpu
    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu.py --tiny --out /tmp/mg   # CPU

On CUDA: NCCL, real widths of Llama 4 Scout, Qwen3-30B-A3B and a DeepSeek-V3-shaped layer, T per
rank 1, 8, 64 (decode) and 2048 (prefill), bf16 and fp8. On the CPU (--tiny, or no GPU): gloo,
the same layers at tiny widths (what CI runs, to keep this script working). NCCL_NVLS_ENABLE=0 is
set unless the environment says otherwise (NVLink multicast stays off on the lent H200 pair).

Per (model, dtype, layout, T) row, on every rank:
- ok / graph_ok: the rank's output against the single-device layer (the full layer, dispatch
  "local") on the same tokens, within the dtype's tolerance row (shufflemoe.testing), eager and,
  for graph-safe layouts on CUDA, replayed from a CUDA graph (shufflemoe.graphed);
- layer_us (eager), graph_us (the forward captured in one CUDA graph, where graph-safe);
- comm_us: the forward's collectives alone (recorded from one forward, replayed on buffers of the
  same sizes), and predicted_comm_us: the planner's traffic for this forward (every source's
  routing counts) priced with the latency and per-collective bandwidth measured at the start of
  this run; pred_ratio = predicted / measured (target within 15%);
- x_floor (ep_allgather decode, graph): graph_us / (single_us / ep + comm_us), single_us being the
  single-device layer on the whole batch in a CUDA graph (the ranks' share of the expert reads).
Then a patched transformers model (Qwen3-MoE shaped) under tp, ep_alltoall and ep_allgather: the
greedy tokens against one process, and decode tokens/s against one process.
Results: <out>/<name>.json and .md (name: multi_gpu), stamped with commit, versions and date.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import statistics
import time
from dataclasses import dataclass, replace

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from shufflemoe import MoE, graphed, preset  # noqa: E402
from shufflemoe.dispatch import DISPATCHERS, comm, ep, ep_allgather, ep_alltoall, tp  # noqa: E402
from shufflemoe.parallel import exit_rank, parallel_mesh, parallelize  # noqa: E402
from shufflemoe.planner import HARDWARE, Layout, comm_time, layouts, traffic  # noqa: E402
from shufflemoe.testing import compare, tolerance_key  # noqa: E402

MODELS = {"scout": "llama4-scout", "qwen3": "qwen3-30b-a3b", "deepseek": "deepseek-v3"}
OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
_COMM_MODULES = (tp, ep, ep_allgather, ep_alltoall)
COLUMNS = ["model", "dtype", "layout", "phase", "tokens", "ok", "err", "graph_ok", "layer_us",
           "graph_us", "comm_us", "predicted_comm_us", "pred_ratio", "comm_mb", "single_us",
           "x_floor", "note"]


@dataclass
class Ctx:
    args: argparse.Namespace
    rank: int
    world: int
    device: torch.device
    hw: object = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def timed_us(ctx: Ctx, fn, graph: bool = False) -> float:
    """Median microseconds of fn(): CUDA events (optionally one CUDA graph), or wall clock."""
    if ctx.cuda:
        from shufflemoe.bench.timing import time_fn

        return time_fn(lambda i: fn(), 1, graph=graph, reps=ctx.args.reps).median_us
    fn()
    samples = []
    for _ in range(ctx.args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


# ---- links ---------------------------------------------------------------------------------------

def _op_call(op: str, nbytes: int, ctx: Ctx):
    """A collective of ``op`` that brings this rank ``nbytes`` from the others (planner's count)."""
    w, g = ctx.world, dist.group.WORLD
    n = max(4, nbytes // (w - 1) // 4 * 4)  # bytes per rank's part
    if op == "all_reduce":  # a ring receives 2 (w - 1) / w of the tensor
        n = max(4, round(nbytes * w / (2 * (w - 1))) // 4 * 4)
    whole = torch.ones(w * n, dtype=torch.uint8, device=ctx.device)
    part = torch.ones(n, dtype=torch.uint8, device=ctx.device)
    f32 = lambda t: t.view(torch.float32)  # noqa: E731  (reductions sum floats)
    return {"all_gather": lambda: comm.all_gather(whole, part, g, w),
            "reduce_scatter": lambda: comm.reduce_scatter(f32(part), f32(whole), g, w),
            "all_reduce": lambda: comm.all_reduce(f32(part), g, w),
            "all_to_all": lambda: comm.all_to_all(whole, torch.ones_like(whole), g, w)}[op]


def measure_links(ctx: Ctx) -> dict:
    """Latency (a 64-byte collective) and bandwidth (received bytes / time of a large one, less
    the latency) of each collective over the two ranks; the planner is priced with them."""
    big = (256 << 20) if ctx.cuda else (4 << 20)
    lat = {op: timed_us(ctx, _op_call(op, 64, ctx)) * 1e-6 for op in OPS}
    bw = {op: big / max(timed_us(ctx, _op_call(op, big, ctx)) * 1e-6 - lat[op], 1e-9) for op in OPS}
    name = "h200" if ctx.cuda and "H200" in torch.cuda.get_device_name() else "h100"
    ctx.hw = replace(HARDWARE[name], link_latency=statistics.median(lat.values()),
                     op_bandwidth=tuple(sorted(bw.items())))
    return dict(latency_us={k: round(v * 1e6, 2) for k, v in lat.items()},
                bandwidth_gbps={k: round(v / 1e9, 2) for k, v in bw.items()})


# ---- collectives of one forward ----------------------------------------------------------------

@contextlib.contextmanager
def recording(calls: list):
    """Record every collective the dispatchers issue: (op, args) with the tensors kept."""
    saved = []
    for module in _COMM_MODULES:
        for op in OPS:
            if hasattr(module, op):
                original = getattr(module, op)

                def wrap(*a, _op=op, _orig=original, **kw):
                    calls.append((_op, a, kw))
                    return _orig(*a, **kw)

                saved.append((module, op, original))
                setattr(module, op, wrap)
    try:
        yield
    finally:
        for module, op, original in saved:
            setattr(module, op, original)


def replay(calls: list):
    """The recorded collectives alone, on fresh buffers of the same sizes, in the same order."""
    fresh = []
    for op, args, kw in calls:
        kw = {k: v for k, v in kw.items() if k != "async_op"}
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        fresh.append((getattr(comm, op), args, kw))
    return lambda: [fn(*a, **kw) for fn, a, kw in fresh]


# ---- one layer -----------------------------------------------------------------------------------

def config(ctx: Ctx, model: str, dtype: str):
    cfg = preset(MODELS[model], quantization="fp8_rowwise" if dtype == "fp8" else "none")
    if ctx.args.tiny:
        shared = 32 if cfg.shared_intermediate_size else 0
        cfg = cfg.replace(hidden_size=64, intermediate_size=32, shared_intermediate_size=shared)
    return cfg


def batch(ctx: Ctx, cfg, T: int, layout: Layout) -> list[torch.Tensor]:
    """Every rank's input (the same seeds on every rank): tp: one shared batch; tp_sp: slices of
    it; EP: a batch per rank."""
    def tokens(seed, n):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, cfg.hidden_size, generator=g).to(ctx.device, cfg.dtype)

    if layout.dispatch == "tp":
        return [tokens(0, T)] * ctx.world
    if layout.dispatch == "tp_sp":
        return list(tokens(0, T * ctx.world).split(T))
    return [tokens(r, T) for r in range(ctx.world)]


def source_counts(layer, xs: list[torch.Tensor]) -> list[list[int]]:
    d = layer.dispatch
    if not hasattr(d, "routing_of"):
        return []
    return [d.routing_of(layer, xs[s], s).counts.tolist() for s in range(d.num_sources)]


def bench_case(ctx: Ctx, full: MoE, model: str, dtype: str, layout: Layout, T: int) -> dict:
    cfg = full.config
    layer = parallelize(full, layout.dispatch, parallel_mesh(ep=layout.ep, tp=layout.tp),
                        **dict(layout.options))
    xs = batch(ctx, cfg, T, layout)
    x = xs[ctx.rank]
    whole = torch.cat(xs) if layout.dispatch != "tp" else xs[0]
    rows = slice(ctx.rank * T, (ctx.rank + 1) * T) if layout.dispatch != "tp" else slice(0, T)
    want = full(whole)[rows]  # the single-device layer on the same tokens
    key = tolerance_key(cfg)
    calls: list = []
    with recording(calls):
        got = layer(x)
    c = compare(got, want, key)
    row = dict(model=model, dtype=dtype, layout=layout.describe(), tokens=T,
               phase="prefill" if T >= 1024 else "decode", ok=c.ok,
               err=round(c.max_err_over_rms, 5), note="" if c.ok else c.why)
    safe = DISPATCHERS.get(layout.dispatch).graph_safe
    if ctx.cuda and safe:
        cg = compare(graphed(layer, token_buckets=(T,))(x), want, key)
        row["graph_ok"] = cg.ok
    row["layer_us"] = round(timed_us(ctx, lambda: layer(x)), 2)
    if ctx.cuda and safe:
        row["graph_us"] = round(timed_us(ctx, lambda: layer(x), graph=True), 2)
    row["comm_us"] = round(timed_us(ctx, replay(calls)), 2)
    tokens = [xi.shape[0] for xi in xs]
    planned = traffic(cfg, layout, tokens, source_counts(layer, xs), ctx.rank)
    predicted = comm_time(planned, layout, ctx.hw) * 1e6
    row.update(predicted_comm_us=round(predicted, 2),
               pred_ratio=round(predicted / max(row["comm_us"], 1e-9), 3),
               comm_mb=round(sum(p.nbytes for p in planned) / 1e6, 4))
    if ctx.cuda and layout.dispatch == "ep_allgather" and row["phase"] == "decode":
        row["single_us"] = round(timed_us(ctx, lambda: full(whole), graph=True), 2)
        row["x_floor"] = round(row["graph_us"] / (row["single_us"] / layout.ep + row["comm_us"]), 3)
    return row


def bench_layers(ctx: Ctx) -> list[dict]:
    out = []
    for model in ctx.args.models:
        for dtype in ctx.args.dtypes:
            cfg = config(ctx, model, dtype).replace(dtype=torch.bfloat16)
            torch.manual_seed(0)  # the same full layer on every rank
            full = MoE(cfg, device=ctx.device)
            extra = [Layout(f"ep_{m}", ctx.world, 1, (("dedup", False), ("redundant", ctx.world)))
                     for m in ("alltoall", "allgather")]  # EPLB
            for layout in layouts(cfg, ctx.world) + extra:
                if ctx.args.layouts and layout.dispatch not in ctx.args.layouts:
                    continue
                for T in ctx.args.tokens + ([ctx.args.prefill] if ctx.args.prefill else []):
                    try:
                        row = bench_case(ctx, full, model, dtype, layout, T)
                    except Exception as e:  # noqa: BLE001  (one bad row must not lose the rest)
                        row = dict(model=model, dtype=dtype, layout=layout.describe(), tokens=T,
                                   ok=False, note=f"{type(e).__name__}: {e}"[:300])
                    out.append(row)
                    if ctx.rank == 0:
                        print({k: row.get(k) for k in COLUMNS if k in row}, flush=True)
            del full
            if ctx.cuda:
                torch.cuda.empty_cache()
    return out


# ---- a transformers model ------------------------------------------------------------------------

def _example():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "distributed_generate.py"
    spec = importlib.util.spec_from_file_location("distributed_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_model(ctx: Ctx) -> list[dict]:
    """Greedy tokens and decode tokens/s of a patched model under each layout vs one process."""
    from shufflemoe.integrations.transformers import patch_distributed, unpatch
    from shufflemoe.integrations.transformers.models import build_model, tiny_config

    ex = _example()
    if ctx.args.tiny:
        hf_cfg, dtype = tiny_config("qwen3_moe"), torch.float32
    else:
        from shufflemoe.bench.suites.e2e_hf import SHAPES

        shape = next(s for s in SHAPES if s.model_type == "qwen3_moe")
        hf_cfg, dtype = shape.config(quick=True), getattr(torch, ctx.args.hf_dtype)
    model = build_model(hf_cfg, dtype=dtype, device=ctx.device, seed=0)
    opts = argparse.Namespace(batch=ctx.args.hf_batch, prompt_len=16, vocab=min(128, hf_cfg.vocab_size))
    rows = []
    for layout in ("tp", "ep_alltoall", "ep_allgather"):
        ids = ex.prompts(opts, ctx.rank, layout).to(ctx.device)
        unpatch(model)
        want, _ = ex.generate(model, ids, ctx.args.hf_tokens)
        single = ex.decode_rate(model, ids, ctx.args.hf_tokens)
        patch_distributed(model, layout)
        got, _ = ex.generate(model, ids, ctx.args.hf_tokens)
        rate = ex.decode_rate(model, ids, ctx.args.hf_tokens)
        same = (got == want).float().mean().item()
        rows.append(dict(model=f"qwen3_moe ({hf_cfg.num_hidden_layers} layers, {str(dtype)[6:]})",
                         layout=layout, rank=ctx.rank, tokens_match=round(same, 4),
                         ok=same == 1.0, decode_tokens_per_s=round(rate, 1),
                         one_process_tokens_per_s=round(single, 1)))
        if ctx.rank == 0:
            print(rows[-1], flush=True)
    return rows


# ---- results -------------------------------------------------------------------------------------

def targets(layer_rows: list[dict], model_rows: list[dict]) -> list[dict]:
    pred = [r for r in layer_rows if r.get("pred_ratio") is not None]
    floor = [r for r in layer_rows if r.get("x_floor") is not None]
    return [
        dict(target="every layout correct against the single device (eager, graph)",
             met=all(r.get("ok") and r.get("graph_ok", True) for r in layer_rows),
             detail=f"{sum(bool(r.get('ok')) for r in layer_rows)}/{len(layer_rows)} rows ok"),
        dict(target="predicted communication time within 15% of measured",
             met=bool(pred) and all(abs(r["pred_ratio"] - 1) <= 0.15 for r in pred),
             detail=f"{sum(abs(r['pred_ratio'] - 1) <= 0.15 for r in pred)}/{len(pred)} rows"),
        dict(target="ep_allgather decode (graph) within 1.3x of local compute + communication",
             met=bool(floor) and all(r["x_floor"] <= 1.3 for r in floor),
             detail=f"{sum(r['x_floor'] <= 1.3 for r in floor)}/{len(floor)} rows"),
        dict(target="patched model: same greedy tokens as one process",
             met=bool(model_rows) and all(r["ok"] for r in model_rows),
             detail=f"{sum(r['ok'] for r in model_rows)}/{len(model_rows)} rank-layouts"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for <name>.json and .md")
    p.add_argument("--name", default="multi_gpu", help="results file name (split runs)")
    p.add_argument("--tiny", action="store_true", help="CPU widths (default without CUDA)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    p.add_argument("--layouts", nargs="*", help="dispatcher names to keep (default: all)")
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 64], help="decode T per rank")
    p.add_argument("--prefill", type=int, default=2048, help="prefill T per rank (0: none)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--no-hf", dest="hf", action="store_false")
    p.add_argument("--hf-dtype", default="bfloat16")
    p.add_argument("--hf-batch", type=int, default=4)
    p.add_argument("--hf-tokens", type=int, default=16)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    args.tiny = not cuda
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    ctx = Ctx(args, rank, world, device)
    links = measure_links(ctx)
    layer_rows = bench_layers(ctx)
    model_rows = bench_model(ctx) if args.hf else []
    every = [None] * world
    dist.all_gather_object(every, model_rows)
    model_rows = [r for part in every for r in part]
    goals = targets(layer_rows, model_rows)
    if rank == 0:
        from shufflemoe.bench.report import markdown_table, metadata, write_results

        notes = (f"{world} ranks, {'NCCL' if cuda else 'gloo (tiny widths)'}; links measured in "
                 f"this run: {links}. Rows are rank 0's (ranks checked alike: the run fails if "
                 "any rank is wrong).\n\n## Patched transformers model\n\n"
                 + markdown_table(model_rows))
        doc = dict(suite=args.name, meta=metadata(), targets=goals, rows=layer_rows, notes=notes)
        write_results(doc, args.out, columns=COLUMNS)
    correct = goals[0]["met"] and (goals[3]["met"] or not args.hf)  # timings are reported, not gated
    flag = torch.tensor([int(correct)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    exit_rank(main())  # not sys.exit: see exit_rank (gloo threads at interpreter shutdown)
