"""Launch plans: a region of Triton launches recorded once, then replayed with new pointers.

Launched from Python, a decode call is bound by the host: on an H100 host ``kernel[grid](...)``
cost 25-47 us (binding and specializing ~30 arguments, a cache lookup, empty launch hooks, then
the C launcher, which asks the driver about every tensor pointer) and a torch allocation ~5 us
(benchmarks/probe_launch.py). A region whose host logic depends only on shapes (the layer's
routing and experts: no host sync, every group size read on the device) makes the same launches
with the same grids each time it sees the same shapes. So its first call is recorded: each
Triton launch (made through ``launch``) with its arguments, and every tensor it allocated.
Later calls replay the compiled kernels directly (``CompiledKernel.run``) with integer pointers:
the caller's tensors (the region's inputs) at their recorded offsets, the region's own
allocations at fixed offsets of one workspace per (device, stream), shared by every plan: plans
replay one at a time in stream order, as graph.GraphPool's graphs do, and a region returns
nothing it allocated.

A region can be recorded when, besides Triton launches, it only allocates and views tensors
(watched by a TorchDispatchMode while recording: anything else, a copy, a fill, a read of a
value, and no plan is made), and its launches read no tensor but its inputs, its own allocations
and buffers made by ``persistent_zeros`` (which live as long as the process, e.g. the fused
decode kernels' self-resetting arrival words). A Template is shared by every caller whose region
and inputs have the same layouts (the layer keys them: MoE._planned); each caller binds its own
fixed inputs (weights) once. Under the interpreter a replay calls ``fn[grid]`` with
tensors rebuilt at the same places, so CI runs the same bookkeeping.
"""

from __future__ import annotations

import contextvars
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.library import wrap_triton
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

try:
    from triton import knobs
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # no triton: nothing is ever recorded
    knobs = TensorDescriptor = None

from ._common import traced

ALIGN = 256  # workspace offsets: as the caching allocator aligns (Triton specializes on 16)

_recording: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "shufflemoe_launch_recording", default=None)
_PERSISTENT: dict[int, Tensor] = {}  # storage data_ptr -> buffer kept for the process


def persistent_zeros(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A zeroed buffer of n values that lives (and keeps its meaning) as long as the process: a
    plan may point at it. Made outside any recording (its fill is not the region's work)."""
    with _disable_current_modes():
        t = torch.zeros(n, dtype=dtype, device=device)
    _PERSISTENT[t.untyped_storage().data_ptr()] = t
    return t


def launch(fn, grid: tuple, *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, recorded when a plan is being recorded. Every Triton launch
    of the ops goes through here (tests/test_launch_plans.py checks), so a recording sees them
    all. Traced by torch.compile (fake tensors), the launch is recorded in the graph instead."""
    rec = _recording.get()
    if rec is None:
        if traced(args):  # torch.compile tracing a triton_op (ops/_impl.py): a graph node
            return wrap_triton(fn)[grid](*args, **kwargs)
        return fn[grid](*args, **kwargs)
    with _disable_current_modes():  # the interpreter's own copies are not the region's ops
        compiled = fn[grid](*args, **kwargs)
    rec.append((fn, tuple(grid), args, kwargs, compiled))
    return compiled


_ALLOCATING = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}
_VIEWING = {torch.ops.aten.view.default, torch.ops.aten.view.dtype,
            torch.ops.aten._unsafe_view.default, torch.ops.aten.select.int,
            torch.ops.aten.slice.Tensor, torch.ops.aten.alias.default,
            torch.ops.aten.as_strided.default, torch.ops.aten.unsqueeze.default,
            torch.ops.aten.squeeze.dim, torch.ops.aten.t.default, torch.ops.aten.transpose.int,
            torch.ops.aten.permute.default, torch.ops.aten.expand.default,
            torch.ops.aten.detach.default}


class _Watch(TorchDispatchMode):
    """Lets every op run; keeps what was allocated and the first op that is neither an
    allocation nor a view."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: list[Tensor] = []
        self.other = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATING:
            self.allocated.append(out)
        elif func not in _VIEWING and self.other is None:
            self.other = func
        return out


@dataclass(frozen=True)
class _Ref:
    """A tensor argument: ``byte_offset`` from input ``index``'s data pointer (``space`` "in")
    or from allocation ``index``'s start in the workspace ("ws")."""

    space: str
    index: int
    byte_offset: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _DescRef:
    """A host TMA descriptor argument (triton.tools.tensor_descriptor.TensorDescriptor) over the
    tensor of ``base``."""

    base: _Ref
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    block_shape: tuple[int, ...]
    padding: str


@dataclass(frozen=True)
class _Pointer:
    """What the C launcher reads a pointer from (data_ptr()), without a tensor."""

    ptr: int

    def data_ptr(self) -> int:
        return self.ptr


@dataclass(frozen=True)
class _Descriptor:
    """The fields of a TensorDescriptor that Triton's launcher reads, over a raw pointer."""

    base: _Pointer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    padding: str


@dataclass
class _Launch:
    fn: Any  # the JITFunction (or the interpreter's)
    grid: tuple[int, int, int]
    args: list  # every parameter in order: plain values, _Ref, or a persistent tensor
    options: dict  # launch options (num_warps, ...)
    compiled: Any  # the CompiledKernel (None under the interpreter)


@dataclass
class Template:
    """A recorded region: its launches and the workspace its allocations need."""

    launches: list[_Launch]
    workspace: list[int]  # byte offset of each allocation in the workspace
    nbytes: int
    aligned: tuple[bool, ...]  # per input: its data pointer a multiple of 16 when recorded


def _owner(t: Tensor, inputs: Sequence[Tensor | None], allocated: list[Tensor]):
    """(space, index, base pointer) of the tensor ``t`` views, or None when it is none of the
    inputs or allocations (persistent buffers are handled by the caller)."""
    storage = t.untyped_storage().data_ptr()
    same = [i for i, x in enumerate(inputs)
            if x is not None and x.untyped_storage().data_ptr() == storage]
    if len(same) > 1:  # inputs sharing memory: only an exact match is unambiguous
        same = [i for i in same if inputs[i].data_ptr() == t.data_ptr()]
    if len(same) == 1:
        return "in", same[0], inputs[same[0]].data_ptr()
    if same:
        return None
    for j, a in enumerate(allocated):
        if a.untyped_storage().data_ptr() == storage:
            return "ws", j, storage
    return None


def _bound(fn, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """(every kernel parameter's value in order, the launch options) of ``fn[grid](*args,
    **kwargs)``."""
    sig = inspect.signature(fn.fn)
    params = {k: v for k, v in kwargs.items() if k in sig.parameters}
    options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
    bound = sig.bind(*args, **params)
    bound.apply_defaults()
    return list(bound.arguments.values()), options


_PLAIN = (int, float, bool, str, type(None), torch.dtype)
_UNSAFE = object()
refusal: str | None = None  # why the last recording made no template (benchmarks/profile_host.py)


def record(region: Callable[[], None], inputs: Sequence[Tensor | None],
           dynamic: int) -> Template | None:
    """Run ``region()`` (for real: its results are this call's) and return its Template, or None
    when it cannot be replayed (see the module docstring). The first ``dynamic`` inputs change
    per call, the others per caller."""
    rec: list = []
    token = _recording.set(rec)
    try:
        with _Watch() as watch:
            region()
    finally:
        _recording.reset(token)
    global refusal
    if watch.other is not None or not rec:
        refusal = f"ran {watch.other}" if rec else "no Triton launch"
        return None
    allocated = watch.allocated
    offsets, nbytes = [], 0
    for a in allocated:
        offsets.append(nbytes)
        nbytes += -(-a.untyped_storage().nbytes() // ALIGN) * ALIGN

    def arg(v):  # the template of one argument, or _UNSAFE
        if isinstance(v, Tensor):
            owner = _owner(v, inputs, allocated)
            if owner is None:  # from outside the region: only a persistent buffer is reusable
                return _PERSISTENT.get(v.untyped_storage().data_ptr(), _UNSAFE)
            space, index, base = owner
            return _Ref(space, index, v.data_ptr() - base, v.dtype, tuple(v.shape),
                        tuple(v.stride()))
        if TensorDescriptor is not None and isinstance(v, TensorDescriptor):
            base = arg(v.base)
            if not isinstance(base, _Ref) or (base.space == "in" and base.index < dynamic):
                return _UNSAFE  # over a per-call input: it would be rebuilt every call
            return _DescRef(base, tuple(v.shape), tuple(v.strides), tuple(v.block_shape),
                            v.padding)
        return v if isinstance(v, _PLAIN) else _UNSAFE

    launches = []
    for fn, grid, args, kwargs, compiled in rec:
        values, options = _bound(fn, args, kwargs)
        template = [arg(v) for v in values]
        if any(v is _UNSAFE for v in template):
            names = list(inspect.signature(fn.fn).parameters)
            refusal = f"{fn.fn.__name__}: {[n for n, v in zip(names, template) if v is _UNSAFE]}"
            return None
        if compiled is not None and hasattr(compiled, "result"):
            compiled = compiled.result()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        launches.append(_Launch(fn, grid3, template, options, compiled))
    aligned = tuple(x is not None and x.data_ptr() % 16 == 0 for x in inputs)
    return Template(launches, offsets, nbytes, aligned)


_WORKSPACES: dict[tuple, Tensor] = {}


def workspace(device: torch.device, stream: int, nbytes: int) -> Tensor:
    """The shared workspace of (device, stream), at least ``nbytes``. When it must grow, a new
    one (twice as large at least) replaces it for later binds; plans bound to the old one keep it
    alive, so at most about twice the largest need is held."""
    key = (device, stream)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < nbytes:
        size = max(nbytes, 2 * ws.numel() if ws is not None else 0, ALIGN)
        ws = _WORKSPACES[key] = torch.empty(size, dtype=torch.uint8, device=device)
    return ws


def _view(base: Tensor, byte_offset: int, ref: _Ref) -> Tensor:
    """The tensor of ``ref`` at ``byte_offset`` bytes from base's data pointer."""
    start = base.storage_offset() * base.element_size() + byte_offset
    item = ref.dtype.itemsize
    return torch.empty(0, dtype=ref.dtype, device=base.device).set_(
        base.untyped_storage(), start // item, ref.size, ref.stride)


class Plan:
    """A Template bound to one caller: the inputs after the first ``dynamic`` (the caller's
    weights) and the workspace resolved once; ``__call__`` takes the first ``dynamic`` inputs,
    which change per call, and launches. On CUDA every pointer is an int, under the interpreter
    a tensor."""

    def __init__(self, template: Template, inputs: Sequence[Tensor | None], dynamic: int,
                 device: torch.device, stream: int) -> None:
        self.ws = workspace(device, stream, template.nbytes)
        self.pointers = device.type == "cuda"
        self.launches = []
        for L in template.launches:
            args, per_call = [], []
            for pos, v in enumerate(L.args):
                if isinstance(v, _Ref) and v.space == "in" and v.index < dynamic:
                    per_call.append((pos, v.index, v.byte_offset, v))
                    v = None
                elif isinstance(v, _Ref):
                    v = self._fixed(v, template, inputs)
                elif isinstance(v, _DescRef):
                    base = self._fixed(v.base, template, inputs)
                    v = (_Descriptor(_Pointer(base), v.shape, v.strides, v.padding)
                         if self.pointers else
                         TensorDescriptor(base, list(v.shape), list(v.strides),
                                          list(v.block_shape), v.padding))
                elif isinstance(v, Tensor) and self.pointers:
                    v = v.data_ptr()  # persistent: never moves
                args.append(v)
            self.launches.append((L, args, per_call))
        self.aligned = template.aligned[:dynamic]
        # the caller's fixed inputs where they were bound (a parameter's .data replaced moves it)
        self.fixed = [(t, t.data_ptr()) for t in inputs[dynamic:] if t is not None]

    def _fixed(self, ref: _Ref, template: Template, inputs: Sequence[Tensor | None]):
        """A caller's input or a workspace allocation: its pointer, or (interpreter) a tensor."""
        if ref.space == "in":
            base, off = inputs[ref.index], ref.byte_offset
        else:
            base, off = self.ws, template.workspace[ref.index] + ref.byte_offset
        return base.data_ptr() + off if self.pointers else _view(base, off, ref)

    def __call__(self, *tensors: Tensor) -> bool:
        """Launch the region for these per-call inputs; False (nothing launched) when a pointer's
        alignment differs from the recording's, a fixed input has moved, the tensors' device is
        not the current one, or a launch hook (a profiler) is installed: the caller then runs
        the region itself."""
        for t, p in self.fixed:
            if t.data_ptr() != p:
                return False
        if self.pointers:
            device = tensors[0].get_device()
            if device != torch._C._cuda_getDevice() or _hooked():
                return False
            ptrs = []
            for t, aligned in zip(tensors, self.aligned):
                p = t.data_ptr()
                if (p % 16 == 0) != aligned:
                    return False
                ptrs.append(p)
            stream = torch._C._cuda_getCurrentRawStream(device)
            for L, bound, per_call in self.launches:
                args = bound.copy()  # not in place: another thread may replay this plan
                for pos, i, off, _ in per_call:
                    args[pos] = ptrs[i] + off
                k = L.compiled
                k.run(L.grid[0], L.grid[1], L.grid[2], stream, k.function, k.packed_metadata,
                      None, None, None, *args)
            return True
        for L, bound, per_call in self.launches:
            args = bound.copy()
            for pos, i, off, ref in per_call:
                args[pos] = _view(tensors[i], off, ref)
            L.fn[L.grid](*args, **L.options)
        return True


def _hooked() -> bool:
    """Whether Triton launch hooks (e.g. its profiler's) are installed: replays skip them."""
    rt = knobs.runtime
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)
