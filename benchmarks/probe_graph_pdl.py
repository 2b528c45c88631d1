"""Why a per-layer graph replay costs the host 4 us at Qwen3-30B-A3B and ~10 us at Llama 4 Scout,
Mixtral and gpt-oss with the same six nodes (results/probe_replay_host.json at 140cd61).

Hypothesis: programmatic dependent launch. At the host_cost shapes Qwen3's decode kernels take the
tuning table's PDL rows; the others (full widths, not in the table) the heuristic's, without PDL
(Scout's merged gate_up aside). For each host_cost shape at T = 1, the layer's graph (as
GraphedMoE captures it, without the copies) is captured with the router, index_shuffle and the
two decode kernels launched
  - as the layer chooses ("default"), every kernel without PDL ("pdl off"), with PDL ("pdl on");
and, to separate PDL from the kernels, graphs of four trivial Triton kernels (one program, or
1024) launched without / with PDL. Host us per graph.replay() (and per cudaGraphLaunch through
ctypes), ROUNDS samples of CALLS back-to-back calls from a drained queue and of one call, every
variant interleaved; GPU us per replay (bench.timing.time_fn of the replay) for every graph.
Writes $OUT/probe_graph_pdl.json.

Result (H100, at f957d9b, results/probe_graph_pdl.json; host us per replay, 30 back to back):
every graph replays in 2.9-4.8 us (cudaGraphLaunch alone 2.0-3.4), PDL on or off, kept or not,
in GraphedMoE's pool or not, four no-op kernels included (2.9); GraphedMoE's own graphs 2.9-3.8
(Qwen3 2.9, Scout 3.5, Mixtral 3.8, gpt-oss 3.1). The hypothesis is refuted: the ~10 us of
probe_replay_host's run at 140cd61 was that machine's host, not the graphs.

    PYTHONPATH=src python benchmarks/probe_graph_pdl.py --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import pathlib
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from shufflemoe._cudart import runtime
from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.host_cost import SHAPES, _sample, config, first_block
from shufflemoe.bench.timing import time_fn
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model
from shufflemoe.ops.index_shuffle import kernel as route_kernel
from shufflemoe.ops.moe_decode import configs
from shufflemoe.ops.router import kernel as router_kernel

CALLS, ROUNDS, SINGLE = 30, 15, 60


@triton.jit
def _noop(p, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    i = tl.program_id(0)
    tl.store(p + i, tl.load(p + i) + 1)


@contextlib.contextmanager
def pdl_forced(on: bool | None):
    """Every decode kernel with (on) or without (not on) PDL; None: as the layer chooses."""
    if on is None:
        yield
        return
    saved = route_kernel.traced, router_kernel.traced
    if not on:  # the router's and index_shuffle's launchers take PDL unless traced
        route_kernel.traced = router_kernel.traced = lambda tensors: True
    try:
        with configs.override(lambda key: configs._choose(*key).with_(pdl=on)):
            yield
    finally:
        route_kernel.traced, router_kernel.traced = saved


def capture(fn, keep: bool = False, pool=None) -> torch.cuda.CUDAGraph:
    """fn captured; keep: CUDAGraph(keep_graph=True) and instantiated after (as GraphedMoE)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
        s.synchronize()
        g = torch.cuda.CUDAGraph(keep_graph=keep)
        g.capture_begin(pool=pool)
        fn()
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    if keep:
        g.instantiate()
    torch.cuda.synchronize()
    return g


def measure(graphs: dict, extra: dict) -> dict:
    rt = runtime()
    rt.cudaGraphLaunch.argtypes, rt.cudaGraphLaunch.restype = [ctypes.c_void_p] * 2, ctypes.c_int
    fns = {}
    for name, g in graphs.items():
        fns[name] = g.replay
        handle = ctypes.c_void_p(g.raw_cuda_graph_exec())
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        fns[name + " (cudaGraphLaunch)"] = (lambda h=handle, s=stream: rt.cudaGraphLaunch(h, s))
    samples = {(n, c): [] for n in fns for c in (CALLS, 1)}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            samples[(name, CALLS)].append(_sample(fn, CALLS)[0])
            for _ in range(SINGLE // ROUNDS):
                samples[(name, 1)].append(_sample(fn, 1)[0])
    row = dict(extra)
    for (name, c), s in samples.items():
        q = statistics.quantiles(s, n=5)
        row[f"{name} x{c}"] = dict(us=round(statistics.median(s), 2), p20=round(q[0], 2),
                                    p80=round(q[3], 2))
    for name, g in graphs.items():
        row[f"{name} gpu_us"] = round(time_fn(lambda i, g=g: g.replay(), 1, graph=False,
                                              reps=50).median_us, 2)
    return row


def layer_row(shape) -> dict:
    model = patch(build_model(config(shape), torch.bfloat16, "cuda"))
    block = first_block(model)
    D = shape.fields["hidden_size"]
    x = torch.randn(1, D, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        res = block(x.view(1, 1, D))  # builds and captures the layer (res: its copy's target)
    state = block.__dict__["_shufflemoe"]
    layer = state.layer
    out = torch.empty_like(x)
    graphs = {"GraphedMoE's": state.run._graphs[1].graph}
    with torch.no_grad():
        for name, on in (("default", None), ("pdl off", False), ("pdl on", True)):
            with pdl_forced(on):
                graphs[name] = capture(lambda: layer.forward_into(x, out))
        graphs["keep_graph"] = capture(lambda: layer.forward_into(x, out), keep=True)
        graphs["keep_graph, pool"] = capture(lambda: layer.forward_into(x, out), keep=True,
                                             pool=state.run.pool.handle)
    row = measure(graphs, dict(model=shape.name, T=1))
    del res  # GraphedMoE's graph copied out into it
    return row


def noop_row(programs: int) -> dict:
    p = torch.zeros(programs, device="cuda", dtype=torch.int32)
    graphs = {}
    for pdl in (False, True):
        def run(pdl=pdl):
            for _ in range(4):
                _noop[(programs,)](p, PDL=pdl, launch_pdl=pdl)
        graphs[f"noop x4 pdl {'on' if pdl else 'off'}"] = capture(run)
    return measure(graphs, dict(model=f"noop kernels, {programs} programs", T=0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_graph_pdl")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for make in [lambda: noop_row(1), lambda: noop_row(1024)] + [
            (lambda s=s: layer_row(s)) for s in SHAPES]:
        row = make()
        rows.append(row)
        print(json.dumps({k: (v["us"] if isinstance(v, dict) else v) for k, v in row.items()}),
              flush=True)
        (out / "probe_graph_pdl.json").write_text(json.dumps(dict(meta=metadata(), rows=rows),
                                                             indent=1))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
