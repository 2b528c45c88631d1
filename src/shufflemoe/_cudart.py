"""The CUDA graph calls torch does not expose, made through ctypes on the CUDA runtime and driver
torch loaded: find a captured graph's kernel nodes that run a given function, and set leading
arguments of one of them, in the instantiated graph, for the replays that follow
(graph.GraphedMoE's copy in and copy out, pointed per replay at the caller's input and a fresh
output); and launch an instantiated graph (``CUDAGraph.replay`` without torch's bookkeeping for
random-number generators, which a layer's graph does not use: ~0.9 us less host time on an H100
host, benchmarks/results/probe_graph_pdl.json)."""

from __future__ import annotations

import ctypes
import functools

_KERNEL_NODE = 0  # cudaGraphNodeTypeKernel


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("kernel_params", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class KernelNode:
    """One kernel node of an instantiated graph, with a copy of its argument values that ``set``
    changes. ``args``: the values it was captured with (ints: pointers and integers)."""

    def __init__(self, node: int, params: _KernelNodeParams, cells: list) -> None:
        self.node, self.params, self.cells = ctypes.c_void_p(node), params, cells
        self.args = [c.value if hasattr(c, "value") else bytes(c) for c in cells]
        array = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
        self._array = array  # kept alive: params points at it
        params.kernel_params = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))

    def set(self, graph_exec: ctypes.c_void_p, *values: int) -> int:
        """Give the first len(values) arguments these values in ``graph_exec`` for the replays
        that follow (the other arguments keep theirs); returns the CUDA error code (0: done)."""
        for cell, value in zip(self.cells, values):
            cell.value = value
        return driver().cuGraphExecKernelNodeSetParams_v2(graph_exec, self.node,
                                                          ctypes.byref(self.params))


def _loaded(name: str) -> str | None:
    """The path of the library ``name`` (e.g. "libcudart.so") mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return next((line.split()[-1] for line in maps if name in line), None)
    except OSError:
        return None


@functools.cache
def runtime() -> ctypes.CDLL | None:
    """The libcudart that torch loaded (None where none is mapped into this process, e.g. a
    statically linked build): with the signatures of the calls below."""
    path = _loaded("libcudart.so")
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    p = ctypes.c_void_p
    for name, args in (("cudaGraphGetNodes", [p, p, p]), ("cudaGraphNodeGetType", [p, p]),
                       ("cudaGraphLaunch", [p, p]), ("cudaGetLastError", [])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


@functools.cache
def driver() -> ctypes.CDLL | None:
    """The libcuda (driver API) in this process, or None: with the signatures of the calls
    below (cuFuncGetParamInfo needs a CUDA 12.4 driver or newer)."""
    path = _loaded("libcuda.so")
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    p, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args in (("cuGraphKernelNodeGetParams_v2", [p, p]),
                       ("cuGraphExecKernelNodeSetParams_v2", [p, p, p]),
                       ("cuFuncGetParamInfo", [p, size, p, p])):
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def launch(graph_exec: ctypes.c_void_p, stream: int) -> None:
    """cudaGraphLaunch(graph_exec, stream): raises on an error (cleared first)."""
    rt = runtime()
    err = rt.cudaGraphLaunch(graph_exec, stream)
    if err:
        _check(rt, err, "cudaGraphLaunch")


def kernel_nodes(graph: int, function: int) -> list[KernelNode]:
    """The kernel nodes of cudaGraph_t ``graph`` (torch: CUDAGraph(keep_graph=True)
    .raw_cuda_graph()) that run CUfunction ``function`` (a Triton CompiledKernel's
    ``.function``), in the graph's node order; [] when the runtime or driver is not reachable."""
    rt, drv = runtime(), driver()
    if rt is None or drv is None:
        return []
    count = ctypes.c_size_t(0)
    _check(rt, rt.cudaGraphGetNodes(graph, None, ctypes.byref(count)), "cudaGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(rt, rt.cudaGraphGetNodes(graph, nodes, ctypes.byref(count)), "cudaGraphGetNodes")
    found = []
    for node in nodes[:count.value]:
        kind = ctypes.c_int(-1)
        _check(rt, rt.cudaGraphNodeGetType(node, ctypes.byref(kind)), "cudaGraphNodeGetType")
        if kind.value != _KERNEL_NODE:
            continue
        params = _KernelNodeParams()
        if drv.cuGraphKernelNodeGetParams_v2(node, ctypes.byref(params)):
            raise RuntimeError("cuGraphKernelNodeGetParams failed")
        if params.func != function or params.extra or not params.kernel_params:
            continue
        cells = []  # each argument's value, copied out of the node
        offset, nbytes = ctypes.c_size_t(0), ctypes.c_size_t(0)
        while not drv.cuFuncGetParamInfo(function, len(cells), ctypes.byref(offset),
                                         ctypes.byref(nbytes)):
            cell = {8: ctypes.c_uint64, 4: ctypes.c_uint32}.get(
                nbytes.value, ctypes.c_ubyte * nbytes.value)()
            ctypes.memmove(ctypes.addressof(cell), params.kernel_params[len(cells)], nbytes.value)
            cells.append(cell)
        found.append(KernelNode(node, params, cells))
    return found


def _check(rt: ctypes.CDLL, err: int, what: str) -> None:
    if err:
        rt.cudaGetLastError()
        raise RuntimeError(f"{what} failed with CUDA error {err}")
