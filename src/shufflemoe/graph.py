"""CUDA-graph decode: capture a layer once per token bucket, replay it with any routing.

The layer's ``shuffled`` path reads every size on the device, so one captured graph serves every
routing: only the input changes. Inputs are padded with zero rows up to the smallest bucket that
fits (each token's output depends on its own row only, so padding never changes real rows; the
zero rows do route to experts 0..k-1, which may read one or two experts more than needed).

Host cost: each graph begins with a copy into its static input and ends with a copy out of its
static output, both captured as launches of one small Triton kernel (``_copy``). A replay points
those two kernel nodes at the caller's input and at a fresh output (their arguments set in the
instantiated graph through the driver, _cudart.py) and launches the graph on the caller's current
stream (cudaGraphLaunch): one allocation, up to two driver calls and one graph launch, where
copying in and cloning out from Python would launch two more aten ops (~11 us of host time each
on an H100 host). A node already pointing at the address (a decode loop's allocator often hands
a layer the same blocks step after step) is left as it is: no driver call. The copy in also
zeroes the static rows past the caller's tokens, so a batch below its bucket costs no fill
launch of its own. (Before, the copies were the memcpy nodes ``Tensor.copy_`` captures: setting
both cost 0.2-2.1 us more host time in two H100 runs, launching the graph the same;
benchmarks/probe_replay_host.py, DESIGN.md.)

Memory: graphs made with one ``GraphPool`` share its CUDA memory pool and, per (bucket, width,
dtype), one static input, one static output and the scratch rows their copies were captured
with. A layer's intermediates are freed before its capture ends, so the next capture reuses their
blocks: the pool holds about the largest single capture's intermediates, however many layers and
buckets share it. This is safe because the graphs of a pool replay one at a time, on one stream,
and every replay copies its output out.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._cudart import KernelNode, kernel_nodes, launch
from .layer import MoE

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COPY_BLOCK = 2048  # elements per program of _copy


@triton.jit(do_not_specialize=("src", "dst", "n", "size"))
def _copy(src, dst, n, size, BLOCK: tl.constexpr):
    """dst[:size] = src[:n] followed by zeros. Nothing is specialized on the arguments' values
    (alignment, divisibility): a replay sets them to any address and count."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n, other=0), mask=offs < size)


def copy_rows(src: Tensor, dst: Tensor, n: int, size: int):
    """dst.view(-1)[:size] = src.view(-1)[:n] then zeros (contiguous tensors of one dtype); returns
    the launched CompiledKernel (its ``.function`` names the kernel's nodes in a captured graph)."""
    return _copy[(triton.cdiv(size, COPY_BLOCK),)](src, dst, n, size, BLOCK=COPY_BLOCK)


class GraphPool:
    """One CUDA memory pool and the static inputs/outputs shared by every graph captured with it
    (e.g. every MoE layer of one model). Replays of graphs that share a pool must not overlap."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None \
            else torch.device(device)
        self.handle = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(self.device)  # captures and warm-ups run here
        self._io: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}

    def io(self, rows: int, width: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(static input, static output, scratch), each [rows, width], shared by every graph of
        that size (scratch: the far end of the copies in and out at capture, never replayed)."""
        key = (rows, width, dtype)
        if key not in self._io:
            x = torch.zeros(rows, width, dtype=dtype, device=self.device)
            self._io[key] = (x, torch.empty_like(x), torch.zeros_like(x))
        return self._io[key]

    def nbytes(self) -> int:
        """Bytes of the static inputs, outputs and scratch rows (the pool's own blocks are not
        counted)."""
        return sum(3 * x.numel() * x.element_size() for x, _, _ in self._io.values())


class GraphedMoE:
    """Callable like the layer: x [T, D] or [B, S, D] -> same shape (``flat``: [T, D] always, as
    Llama 4's block returns it, with no reshape per call). Token counts above the largest bucket,
    and calls made while the caller captures a CUDA graph of its own (the layer is then captured
    into that graph), run the layer eagerly. ``lazy``: capture a bucket on its first use instead
    of all of them now."""

    def __init__(self, layer: MoE, token_buckets: Sequence[int] = DEFAULT_BUCKETS,
                 warmup: int = 2, pool: GraphPool | None = None, lazy: bool = False,
                 flat: bool = False):
        cfg = layer.config
        if not layer.w13.is_cuda:
            raise ValueError("graphed() needs a layer on a CUDA device")
        for part in (layer.experts, layer.dispatch):
            if not part.graph_safe:
                raise ValueError(f"{part.name} syncs with the host and cannot be captured")
        why = layer.dispatch.graph_error(token_buckets)
        if why:
            raise ValueError(f"{layer.dispatch.name}: {why}")
        if cfg.capacity_factor is not None:
            raise ValueError("graphed() pads the batch, which would change capacity-factor drops")
        if not token_buckets or any(not isinstance(b, int) or b <= 0 for b in token_buckets):
            raise ValueError(f"token_buckets must be positive ints, got {token_buckets!r}")
        if not isinstance(warmup, int) or warmup < 1:  # kernels compile (and may sync) in it
            raise ValueError(f"warmup must be an int >= 1 (calls before capture), got {warmup!r}")
        self.layer = layer
        self.flat = flat
        self.buckets = sorted(set(token_buckets))
        self.warmup = warmup
        self.pool = pool or GraphPool(layer.w13.device)
        self._device = layer.w13.device.index
        self._graphs: dict[int, _Graph] = {}
        self._replays: dict[tuple, tuple] = {}  # (shape, dtype, device) -> _replay_for(x)
        if not lazy:
            for b in reversed(self.buckets):  # largest first: the rest fit in its blocks
                if self._capture(b) is None:
                    break

    def _capture(self, bucket: int) -> _Graph | None:
        cfg, pool = self.layer.config, self.pool
        x, out, scratch = pool.io(bucket, cfg.hidden_size, cfg.dtype)
        size = x.numel()
        main = torch.cuda.current_stream(pool.device)
        pool.stream.wait_stream(main)
        with torch.no_grad(), torch.cuda.stream(pool.stream):
            for _ in range(self.warmup):  # compiles kernels (may sync), off the capture
                copy = copy_rows(scratch, x, size, size)
                self.layer.forward_into(x, out)
                copy_rows(out, scratch, size, size)
            graph = torch.cuda.CUDAGraph(keep_graph=True)  # keeps the nodes to find the copies
            # capture_begin/end, not torch.cuda.graph(): that also runs gc.collect() and
            # empty_cache() per capture, seconds over the layers of a large model.
            pool.stream.synchronize()
            graph.capture_begin(pool=pool.handle)
            try:
                copy_rows(scratch, x, size, size)  # the copy in and the copy out, set per replay
                self.layer.forward_into(x, out)
                copy_rows(out, scratch, size, size)
            finally:
                graph.capture_end()
        main.wait_stream(pool.stream)
        graph.instantiate()
        copies = kernel_nodes(graph.raw_cuda_graph(), copy.function)
        into = [c for c in copies if c.args[:2] == [scratch.data_ptr(), x.data_ptr()]]
        outof = [c for c in copies if c.args[:2] == [out.data_ptr(), scratch.data_ptr()]]
        if len(into) != 1 or len(outof) != 1:  # e.g. no libcuda mapped into this process
            self._stop_replaying(f"found {len(into)} copies in and {len(outof)} out in the "
                                 "captured graph, not one each")
            return None
        captured = self._graphs[bucket] = _Graph(
            graph, ctypes.c_void_p(graph.raw_cuda_graph_exec()), into[0], outof[0], x, out,
            [0, 0, 0])
        return captured

    def _replay_for(self, x: Tensor) -> tuple | None:
        """(exec handle, copy-in node, copy-out node, static input address, static output
        address, elements, [T, D] where flat and x is 3-D | None, the graph's ``pointed``) of the
        smallest bucket that holds x's T tokens (captured now if lazy), or None: no tokens, above
        the largest bucket, or an input the layer must reject (it then raises)."""
        cfg = self.layer.config
        if (x.dtype != cfg.dtype or x.device != self.layer.w13.device or x.dim() not in (2, 3)
                or x.shape[-1] != cfg.hidden_size):
            return None
        T = x.numel() // cfg.hidden_size
        bucket = next((b for b in self.buckets if b >= T), None)
        if bucket is None or T == 0:
            return None
        g = self._graphs.get(bucket) or self._capture(bucket)
        if g is None:
            return None
        replay = self._replays[(x.shape, x.dtype, x.device)] = (
            g.handle, g.into, g.outof, g.x.data_ptr(), g.out.data_ptr(), x.numel(),
            (T, cfg.hidden_size) if self.flat and x.dim() == 3 else None, g.pointed)
        return replay

    def __call__(self, x: Tensor) -> Tensor:
        # The host path of a decode step: one dict lookup, an allocation, the copies set to x and
        # to the new output (where they point elsewhere), the replay.
        replay = (None if _capturing()  # captured into the caller's graph
                  else self._replays.get((x.shape, x.dtype, x.device)) or self._replay_for(x))
        if replay is None:  # no tokens, above the largest bucket, or a bad input (the layer says)
            out = self.layer(x)
            return out.view(-1, out.shape[-1]) if self.flat else out
        handle, into, outof, static_x, static_out, n, flat_shape, pointed = replay
        if not x.is_contiguous():
            x = x.contiguous()
        y = torch.empty_like(x)  # (torch.empty with a shape, dtype and device: ~4 us more)
        src, dst = x.data_ptr(), y.data_ptr()
        # the copy in keeps its size (the bucket's rows: those past n are zeroed)
        if ((pointed[0] != src or pointed[2] != n) and into.set(handle, src, static_x, n)) or (
                (pointed[1] != dst or pointed[2] != n) and outof.set(handle, static_out, dst, n, n)):
            self._stop_replaying("CUDA refused to point a graph's copies at this input")
            return self(x)
        pointed[:] = src, dst, n
        launch(handle, _stream(self._device))
        return y if flat_shape is None else y.view(flat_shape)

    def _stop_replaying(self, why: str) -> None:
        """The graphs' copies cannot be retargeted (``why``): from now on the layer runs eagerly,
        as above the largest bucket, correct but launched from Python."""
        warnings.warn(f"shufflemoe.graphed: {why}; this layer now runs without CUDA graphs",
                      RuntimeWarning, stacklevel=3)
        self.buckets, self._graphs, self._replays = [], {}, {}


class _Graph(NamedTuple):
    """One bucket's captured graph: its exec handle, its two copy nodes, its static rows, and
    where its copies point now (input address, output address, elements; 0s: the scratch
    rows)."""
    graph: torch.cuda.CUDAGraph
    handle: ctypes.c_void_p
    into: KernelNode
    outof: KernelNode
    x: Tensor
    out: Tensor
    pointed: list[int]


_capturing = torch._C._cuda_isCurrentStreamCapturing  # torch.cuda's, without its Python frame
# device index -> its current cudaStream_t (absent from CPU-only builds, which capture no graphs)
_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def graphed(layer: MoE, token_buckets: Sequence[int] = DEFAULT_BUCKETS, warmup: int = 2,
            pool: GraphPool | None = None) -> GraphedMoE:
    """Capture ``layer`` in CUDA graphs, one per token-count bucket (``pool``: share memory and
    static buffers with other layers' graphs, see GraphPool)."""
    return GraphedMoE(layer, token_buckets, warmup, pool)
