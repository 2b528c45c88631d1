"""The two CUDA graph calls torch does not expose, made through ctypes on the CUDA runtime torch
loaded: list a captured graph's memcpy nodes, and point one of them, in the instantiated graph,
at other memory (graph.GraphedMoE's copy in and copy out, retargeted per replay)."""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

_MEMCPY_NODE = 1  # cudaGraphNodeTypeMemcpy
DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice


class _Pos(ctypes.Structure):  # cudaPos and cudaExtent
    _fields_ = [("x", ctypes.c_size_t), ("y", ctypes.c_size_t), ("z", ctypes.c_size_t)]


class _PitchedPtr(ctypes.Structure):  # cudaPitchedPtr
    _fields_ = [("ptr", ctypes.c_void_p), ("pitch", ctypes.c_size_t), ("xsize", ctypes.c_size_t),
                ("ysize", ctypes.c_size_t)]


class _Memcpy3DParms(ctypes.Structure):  # cudaMemcpy3DParms
    _fields_ = [("srcArray", ctypes.c_void_p), ("srcPos", _Pos), ("srcPtr", _PitchedPtr),
                ("dstArray", ctypes.c_void_p), ("dstPos", _Pos), ("dstPtr", _PitchedPtr),
                ("extent", _Pos), ("kind", ctypes.c_int)]


class Copy(NamedTuple):
    """One memcpy node of a graph: the node's handle, and the addresses it copies between."""
    node: ctypes.c_void_p
    src: int
    dst: int


@functools.cache
def runtime() -> ctypes.CDLL | None:
    """The libcudart that torch loaded (None where none is mapped into this process, e.g. a
    statically linked build): with the signatures of the calls below."""
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "libcudart.so" in line), None)
    except OSError:
        return None
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    p, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args in (("cudaGraphGetNodes", [p, p, p]), ("cudaGraphNodeGetType", [p, p]),
                       ("cudaGraphMemcpyNodeGetParams", [p, p]), ("cudaGetLastError", []),
                       ("cudaGraphExecMemcpyNodeSetParams1D", [p, p, p, p, size, ctypes.c_int])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def memcpy_nodes(graph: int) -> list[Copy]:
    """The 1-D memcpy nodes of cudaGraph_t ``graph`` (torch: CUDAGraph(keep_graph=True)
    .raw_cuda_graph()); [] when the runtime is not reachable."""
    rt = runtime()
    if rt is None:
        return []
    count = ctypes.c_size_t(0)
    _check(rt, rt.cudaGraphGetNodes(graph, None, ctypes.byref(count)), "cudaGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(rt, rt.cudaGraphGetNodes(graph, nodes, ctypes.byref(count)), "cudaGraphGetNodes")
    copies = []
    for node in nodes[:count.value]:
        kind, parms = ctypes.c_int(-1), _Memcpy3DParms()
        _check(rt, rt.cudaGraphNodeGetType(node, ctypes.byref(kind)), "cudaGraphNodeGetType")
        if kind.value != _MEMCPY_NODE:
            continue
        _check(rt, rt.cudaGraphMemcpyNodeGetParams(node, ctypes.byref(parms)),
               "cudaGraphMemcpyNodeGetParams")
        if parms.extent.y == parms.extent.z == 1 and not (parms.srcArray or parms.dstArray):
            copies.append(Copy(ctypes.c_void_p(node), (parms.srcPtr.ptr or 0) + parms.srcPos.x,
                               (parms.dstPtr.ptr or 0) + parms.dstPos.x))
    return copies


def set_copy(graph_exec: ctypes.c_void_p, node: ctypes.c_void_p, dst: int, src: int,
             nbytes: int) -> int:
    """Point memcpy ``node`` of ``graph_exec`` at dst <- src (nbytes, device to device) for the
    replays that follow; returns the CUDA error code (0: done; else the error is cleared, so
    torch's next launch check does not report it)."""
    rt = runtime()
    err = rt.cudaGraphExecMemcpyNodeSetParams1D(graph_exec, node, dst, src, nbytes,
                                                 DEVICE_TO_DEVICE)
    if err:
        rt.cudaGetLastError()
    return err


def _check(rt: ctypes.CDLL, err: int, what: str) -> None:
    if err:
        rt.cudaGetLastError()
        raise RuntimeError(f"{what} failed with CUDA error {err}")
