"""Where a per-layer graph replay's host time goes (issue 21: <= 30 us per block call at T = 1).

For each host_cost shape (the first MoE block of a one-layer transformers model at real width,
patched with the default per-layer graphs), at T = 1: host us per call of
  - block: the patched block's forward (what host_cost times), ROUNDS samples of CALLS
    back-to-back calls from a drained queue (host_cost's method: the GPU falls behind when its
    time per call exceeds the host's), and of one call from a drained queue;
  - graphed: GraphedMoE.__call__ alone (an allocation, the graph's copy in and copy out pointed
    at x and at it, the replay); graphed before: 86ca069's replay of the layer's graph alone
    between an aten copy in and an aten clone out (the layer's graph captured again without the
    copies, "kept replay");
  - replay: graph.replay() alone; empty: the output's allocation; set_copy x2: both
    retargets; copy_ / clone: the aten copy in and clone out of "graphed before";
and the graph's GPU activities per replay (kernels, memsets, copies; the profiler's count) and
its nodes and edges (cudaGraphDebugDotPrint, $OUT/<model>.dot). Every variant interleaved
within each round. (The copies as cudaMemcpyAsync through ctypes, tried at d5a7610-6f054c3: copy
in 6.3-7.1 us against aten's 8.4-9.2, clone out 13-14 against 10-11; not kept.)
Writes $OUT/probe_replay_host.json.

    PYTHONPATH=src python benchmarks/probe_replay_host.py --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import statistics

import torch

from shufflemoe.bench.report import metadata
from shufflemoe._cudart import runtime, set_copy
from shufflemoe.bench.suites.host_cost import SHAPES, _models, _sample, first_block

CALLS, ROUNDS, SINGLE = 30, 15, 60


def kept_capture(run) -> torch.cuda.CUDAGraph:
    """The layer's T = 1 graph captured again as GraphedMoE._capture does, keeping its
    cudaGraph_t (keep_graph=True) for cudaGraphDebugDotPrint."""
    pool, layer = run.pool, run.layer
    x, out, _ = pool.io(1, layer.config.hidden_size, layer.config.dtype)
    main = torch.cuda.current_stream()
    pool.stream.wait_stream(main)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(pool.stream):
        layer.forward_into(x, out)
        pool.stream.synchronize()
        graph.capture_begin(pool=pool.handle)
        layer.forward_into(x, out)
        graph.capture_end()
    main.wait_stream(pool.stream)
    graph.instantiate()
    return graph


def activities(fn) -> dict:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kinds: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kind = "memset" if "Memset" in e.name else "memcpy" if "Memcpy" in e.name else "kernel"
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def probe(shape, out: pathlib.Path) -> dict:
    """One shape's row."""
    models = _models(shape)
    block = first_block(models["ours graphs"])
    x = torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):
            block(x)
        run = block.__dict__["_shufflemoe"].run
        graph, handle, into, outof, static_x, static_out, nbytes, flat_shape, pad, _ = \
            run._replays[(x.shape, x.dtype, x.device)]
        g = run._graphs[1]
        yshape = x.shape if flat_shape is None else flat_shape
        res = torch.empty(yshape, dtype=x.dtype, device=x.device)
        dtype, dev = x.dtype, x.device
        kept = kept_capture(run)  # the layer alone: the graph before the copies moved in

        def before():  # 86ca069's replay: aten copy in, replay, aten clone out
            g.x.copy_(x.view(1, -1))
            kept.replay()
            return g.out.clone()

        def retarget():
            set_copy(handle, into, static_x, x.data_ptr(), nbytes)
            set_copy(handle, outof, res.data_ptr(), static_out, nbytes)

        fns = {"block": lambda: block(x), "graphed": lambda: run(x), "graphed before": before,
               "replay": graph.replay, "kept replay": kept.replay,
               "empty": lambda: torch.empty(yshape, dtype=x.dtype, device=x.device),
               "empty_like": lambda: torch.empty_like(x), "new_empty": lambda: x.new_empty(yshape),
               "empty dev": lambda: torch.empty(yshape, dtype=dtype, device=dev),
               "set_copy x2": retarget,
               "copy_": lambda: g.x.copy_(x.view(1, -1)), "clone": g.out.clone}
        dot = out / f"{shape.name}.dot"
        rt, raw, n = runtime(), ctypes.c_void_p(g.graph.raw_cuda_graph()), ctypes.c_size_t(0)
        assert rt.cudaGraphDebugDotPrint(raw, str(dot).encode(), 0) == 0
        assert rt.cudaGraphGetNodes(raw, None, ctypes.byref(n)) == 0
        samples = {(name, n): [] for name in fns for n in (CALLS, 1)}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                samples[(name, CALLS)].append(_sample(fn, CALLS)[0])
                for _ in range(SINGLE // ROUNDS):
                    samples[(name, 1)].append(_sample(fn, 1)[0])
        row = dict(model=shape.name, T=1, nodes=n.value,
                   graph_activities=activities(graph.replay),
                   block_activities=activities(lambda: block(x)))
        for (name, n), s in samples.items():
            q = statistics.quantiles(s, n=5)
            row[f"{name} x{n}"] = dict(us=round(statistics.median(s), 2), p20=round(q[0], 2),
                                       p80=round(q[3], 2))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_replay_host")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in SHAPES:
        row = probe(shape, out)
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    (out / "probe_replay_host.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
