"""Where a per-layer graph replay's host time goes (issue 21: <= 30 us per block call at T = 1),
and kernel-node copies against the memcpy nodes that came before them.

For each host_cost shape (the first MoE block of a one-layer transformers model at real width,
patched with the default per-layer graphs), at T = 1: host us per call of
  - block / block alt: the patched block's forward (what host_cost times) on one input, and
    alternating two inputs (host_cost's method: both copies set again every call);
  - graphed / graphed alt: GraphedMoE.__call__ alone (an allocation, the graph's copy nodes set
    to x and to it where they moved, the replay);
  - memcpy graphed alt: the same with the copies as memcpy nodes (``Tensor.copy_`` captured, set
    through cudaGraphExecMemcpyNodeSetParams1D: what GraphedMoE did before 2026-11-28), the layer's
    graph captured again that way;
  - replay / memcpy replay: graph.replay() alone; launch: _cudart.launch of the same graph
    (cudaGraphLaunch, what GraphedMoE calls); empty_like: the output's allocation;
    set x2 / memcpy set x2: both copies set (alternating addresses);
ROUNDS samples of CALLS back-to-back calls from a drained queue, every variant interleaved within
each round; and each graph's GPU activities per replay (the profiler's count).
Writes $OUT/probe_replay_host.json.

    PYTHONPATH=src python benchmarks/probe_replay_host.py --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import pathlib
import statistics

import torch

from shufflemoe.bench.report import metadata
from shufflemoe._cudart import launch, runtime
from shufflemoe.bench.suites.host_cost import SHAPES, _models, _sample, first_block

CALLS, ROUNDS = 30, 20


class _Pos(ctypes.Structure):  # cudaPos and cudaExtent
    _fields_ = [("x", ctypes.c_size_t), ("y", ctypes.c_size_t), ("z", ctypes.c_size_t)]


class _PitchedPtr(ctypes.Structure):  # cudaPitchedPtr
    _fields_ = [("ptr", ctypes.c_void_p), ("pitch", ctypes.c_size_t), ("xsize", ctypes.c_size_t),
                ("ysize", ctypes.c_size_t)]


class _Memcpy3DParms(ctypes.Structure):  # cudaMemcpy3DParms
    _fields_ = [("srcArray", ctypes.c_void_p), ("srcPos", _Pos), ("srcPtr", _PitchedPtr),
                ("dstArray", ctypes.c_void_p), ("dstPos", _Pos), ("dstPtr", _PitchedPtr),
                ("extent", _Pos), ("kind", ctypes.c_int)]


def memcpy_graph(run):
    """The layer's T = 1 graph captured again with its copies as memcpy nodes: (graph, copy-in
    node, copy-out node, static x address, static out address, set(node, dst, src, nbytes))."""
    pool, layer = run.pool, run.layer
    x, out, scratch = pool.io(1, layer.config.hidden_size, layer.config.dtype)
    main = torch.cuda.current_stream()
    pool.stream.wait_stream(main)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), torch.cuda.stream(pool.stream):
        layer.forward_into(x, out)
        pool.stream.synchronize()
        graph.capture_begin(pool=pool.handle)
        x.copy_(scratch)
        layer.forward_into(x, out)
        scratch.copy_(out)
        graph.capture_end()
    main.wait_stream(pool.stream)
    graph.instantiate()
    rt, p = runtime(), ctypes.c_void_p
    rt.cudaGraphMemcpyNodeGetParams.argtypes = [p, p]
    rt.cudaGraphExecMemcpyNodeSetParams1D.argtypes = [p, p, p, p, ctypes.c_size_t, ctypes.c_int]
    count = ctypes.c_size_t(0)
    raw = ctypes.c_void_p(graph.raw_cuda_graph())
    assert rt.cudaGraphGetNodes(raw, None, ctypes.byref(count)) == 0
    nodes = (ctypes.c_void_p * count.value)()
    assert rt.cudaGraphGetNodes(raw, nodes, ctypes.byref(count)) == 0
    into = outof = None
    for node in nodes[:count.value]:
        kind, parms = ctypes.c_int(-1), _Memcpy3DParms()
        assert rt.cudaGraphNodeGetType(node, ctypes.byref(kind)) == 0
        if kind.value != 1:  # cudaGraphNodeTypeMemcpy
            continue
        assert rt.cudaGraphMemcpyNodeGetParams(node, ctypes.byref(parms)) == 0
        ends = ((parms.srcPtr.ptr or 0) + parms.srcPos.x, (parms.dstPtr.ptr or 0) + parms.dstPos.x)
        if ends == (scratch.data_ptr(), x.data_ptr()):
            into = ctypes.c_void_p(node)
        elif ends == (out.data_ptr(), scratch.data_ptr()):
            outof = ctypes.c_void_p(node)
    assert into is not None and outof is not None
    handle = ctypes.c_void_p(graph.raw_cuda_graph_exec())

    def set_copy(node, dst, src, nbytes):
        return rt.cudaGraphExecMemcpyNodeSetParams1D(handle, node, dst, src, nbytes, 3)

    return graph, into, outof, x.data_ptr(), out.data_ptr(), set_copy


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


def probe(shape) -> dict:
    """One shape's row."""
    models = _models(shape)
    block = first_block(models["ours graphs"])
    xs = [torch.randn(1, 1, shape.fields["hidden_size"], device="cuda", dtype=torch.bfloat16)
          for _ in range(2)]
    x = xs[0]
    with torch.no_grad():
        for _ in range(3):
            block(x)
        run = block.__dict__["_shufflemoe"].run
        handle, into, outof, static_x, static_out, n, flat_shape, _ = \
            run._replays[(x.shape, x.dtype, x.device)]
        graph = run._graphs[1].graph
        stream = torch.cuda.current_stream().cuda_stream
        yshape = x.shape if flat_shape is None else flat_shape
        mgraph, minto, moutof, mstatic_x, mstatic_out, set_copy = memcpy_graph(run)
        nbytes = n * x.element_size()
        alt, alt_block, alt_run, alt_memcpy = (itertools.cycle(range(2)) for _ in range(4))

        def memcpy_graphed(i):  # GraphedMoE's replay before, both copies set every call
            src = xs[i]
            y = torch.empty_like(src)
            set_copy(minto, mstatic_x, src.data_ptr(), nbytes)
            set_copy(moutof, y.data_ptr(), mstatic_out, nbytes)
            mgraph.replay()
            return y

        ys = [torch.empty(yshape, dtype=x.dtype, device=x.device) for _ in range(2)]

        def set_kernels(i):
            into.set(handle, xs[i].data_ptr(), static_x, n)
            outof.set(handle, static_out, ys[i].data_ptr(), n, n)

        def set_memcpy(i):
            set_copy(minto, mstatic_x, xs[i].data_ptr(), nbytes)
            set_copy(moutof, ys[i].data_ptr(), mstatic_out, nbytes)

        fns = {"block": lambda: block(x), "block alt": lambda: block(xs[next(alt_block)]),
               "graphed": lambda: run(x), "graphed alt": lambda: run(xs[next(alt_run)]),
               "memcpy graphed alt": lambda: memcpy_graphed(next(alt_memcpy)),
               "replay": graph.replay, "memcpy replay": mgraph.replay,
               "launch": lambda: launch(handle, stream),
               "empty_like": lambda: torch.empty_like(x),
               "set x2": lambda: set_kernels(next(alt)), "memcpy set x2": lambda: set_memcpy(next(alt))}
        y = memcpy_graphed(1)
        torch.cuda.synchronize()
        torch.testing.assert_close(y.view(yshape), run(xs[1]), rtol=2e-2, atol=2e-2)  # both agree
        samples = {name: [] for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                samples[name].append(_sample(fn, CALLS)[0])
        row = dict(model=shape.name, T=1, graph_activities=activities(graph.replay),
                   memcpy_graph_activities=activities(mgraph.replay))
        for name, s in samples.items():
            q = statistics.quantiles(s, n=5)
            row[name] = dict(us=round(statistics.median(s), 2), p20=round(q[0], 2),
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
        row = probe(shape)
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    (out / "probe_replay_host.json").write_text(json.dumps(dict(meta=metadata(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
