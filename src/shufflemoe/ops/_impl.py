"""Which implementation an op runs (its Triton kernel or its torch reference), and how both are
registered as torch custom ops.

``impl="auto"`` (the default) runs the kernel on CUDA tensors and the reference elsewhere.
``impl="triton"`` forces the kernel: on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``
(how CI tests kernels). ``impl="torch"`` forces the reference. ``use_impl`` sets the default for
a block of code, which is how tests and benchmarks compare the two on the same pipeline.

Every implementation of every op, kernel launcher and reference alike, is an in-place custom op
(``inplace_op``): it writes outputs its caller allocated and returns None, so its fake
implementation allocates nothing and torch.compile traces around it without a graph break. A
reference runs opaque (it may read sizes of CPU tensors on the host); a kernel launcher is also
a ``triton_op`` that torch.compile traces at static sizes (see ``inplace_op``'s ``kernels``).
``ops_for(impl)`` bundles one implementation's unvalidated entry points (``Ops``): the public
functions validate their arguments and call them; the layer validates its weights once and
calls them directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import inspect
import os
import typing
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

IMPLS = ("auto", "triton", "torch")
_default: contextvars.ContextVar[str] = contextvars.ContextVar("shufflemoe_impl", default="auto")
# Looked up once: torch.compile cannot trace importlib.
_TRITON = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    return _TRITON


@torch._dynamo.assume_constant_result
def _default_impl() -> str:
    """The use_impl() default; a constant to torch.compile, which cannot trace a ContextVar."""
    return _default.get()


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (TRITON_INTERPRET=1), read at call time."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def use_impl(impl: str):
    """Run ops with ``impl`` ("auto" | "triton" | "torch") inside the block."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    token = _default.set(impl)
    try:
        yield
    finally:
        _default.reset(token)


def resolve(impl: str | None, x: Tensor) -> str:
    """Decide "triton" or "torch" for an op whose main input is ``x``."""
    impl = _default_impl() if impl is None else impl
    if impl == "auto":
        return "triton" if x.is_cuda and _TRITON else "torch"
    if impl == "triton":
        if not _TRITON:
            raise RuntimeError("impl='triton' needs the triton package")
        if not (x.is_cuda or interpreting()):
            raise ValueError(
                f"impl='triton' needs CUDA tensors (got {x.device}) or TRITON_INTERPRET=1"
            )
    elif impl != "torch":
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


_is_compiling = torch.compiler.is_compiling  # bound once: called for every op in eager


def inplace_op(name: str, mutates_args: tuple[str, ...], kernels: bool = False):
    """Register ``fn`` (it writes its outputs in place and returns None) as the custom op
    ``torch.ops.shufflemoe.<name>``, and return a callable that skips the op dispatcher outside
    compilation: on an H100 host the eager custom-op path cost about 200 us of CPU a call
    (cProfile, benchmarks/probe_layer.py), more than the kernels themselves.

    ``kernels``: fn launches Triton kernels (through ``_launch.launch``). It is then also
    registered with ``torch.library.triton_op`` as ``<name>_kernels``, which torch.compile
    traces on fake tensors: each launch becomes a call of its kernel in the graph, and Inductor
    launches the kernels from its own generated code (no Python launcher, no op dispatch per
    call). fn picks tiles by size, so that op serves static shapes; traced with a symbolic
    size (dynamic shapes), its body is the opaque op, which picks them when it runs. The choice
    is made there, on fake tensors, not in ``call``: Dynamo, which runs ``call``, reports a
    symbolic size as an int. Under the interpreter (CPU CI) kernels cannot be traced: the
    opaque op only."""

    def wrap(fn):
        op = torch.library.custom_op(f"shufflemoe::{name}", fn, mutates_args=mutates_args)
        op.register_fake(_no_output)
        traced_op = static_sizes_only = None
        if kernels:
            static_sizes_only = _same_signature(fn, lambda *args: (op if _symbolic(args)
                                                                    else fn)(*args))
            if _TRITON and not interpreting():
                traced_op = torch.library.triton_op(f"shufflemoe::{name}_kernels",
                                                    static_sizes_only, mutates_args=mutates_args)

        # Compiled, call runs the op's overload (what CustomOpDef.__call__ runs): Dynamo then
        # guards one object per op, not the CustomOpDef, its __dict__ and its type's __call__
        opaque = op._opoverload
        traced = opaque if traced_op is None else traced_op._opoverload

        def call(*args) -> None:
            if not _is_compiling():
                fn(*args)
            else:
                traced(*args)

        call.__name__ = call.__qualname__ = fn.__name__
        call.__doc__ = fn.__doc__
        call.op = op
        call.traced_op = traced_op
        call.static_sizes_only = static_sizes_only  # traced_op's body (tests check its schema)
        call.mutates_args = mutates_args
        if kernels:
            KERNEL_OPS[name] = call
        return call

    return wrap


KERNEL_OPS: dict[str, Callable] = {}  # name -> call of every inplace_op(kernels=True)


def _same_signature(fn: Callable, body: Callable) -> Callable:
    """body with fn's name and signature, its annotations resolved (fn's module may write them
    as strings, which torch.library would evaluate in the wrong module)."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    ret = hints.get("return")
    body.__signature__ = sig.replace(
        parameters=[p.replace(annotation=hints[p.name]) for p in sig.parameters.values()],
        return_annotation=None if ret is type(None) else ret)
    body.__name__ = body.__qualname__ = fn.__name__
    body.__doc__ = fn.__doc__
    return body


def _symbolic(args) -> bool:
    """Whether a tensor among ``args`` has a symbolic size (torch.compile's dynamic shapes), on
    fake tensors (under Dynamo a SymInt passes for an int)."""
    return any(isinstance(a, Tensor) and any(isinstance(n, torch.SymInt) for n in a.shape)
               for a in args)


def kernel_op(name: str, mutates_args: tuple[str, ...]):
    """inplace_op for a Triton launcher (see ``kernels`` there)."""
    return inplace_op(name, mutates_args, kernels=True)


def _no_output(*args, **kwargs) -> None:
    """Fake (meta) implementation of an in-place op: nothing to allocate."""
    return None


@dataclass(frozen=True)
class Ops:
    """One implementation's ops without argument checks (positional, as documented on the
    public functions of the same name, which check them)."""

    name: str  # "triton" | "torch"
    # (scores, top_k, scoring, renormalize, scaling, capacity, batch_invariant=False,
    #  groups=None, bias=None) -> Routing
    index_shuffle: Callable
    # (topk_ids, num_experts, topk_weights, capacity[, ids_valid]) -> Routing
    sort_by_expert: Callable
    # (x, token_ids, weights, num_valid, quantize, out[, positions]) -> xs | (q, scale)
    gather_scale: Callable
    # (x, w, m_sizes, x_scale, w_scale, weight_ids, row_weights, scatter_ids, out, out_dtype,
    #  scatter, quantization, bias, scale_split, all_rows[, x_ids, glu]) -> out
    grouped_gemm: Callable
    # (h, num_valid, quantize, out, (activation, alpha, limit)) -> a | (q, scale)
    silu_mul: Callable
    scatter_add: Callable  # (out, y, token_ids, weights, num_valid, rows) -> out
    token_sum: Callable  # (out, y, positions, weights, num_valid, rows, accumulate=True) -> out
    combine_shuffling: Callable  # (x, counts, starts, out) -> (out, counts per local expert)
    split_shuffling: Callable  # (y, counts, starts, out) -> out
    # (x, w13, w13_scale, counts, token_ids, row_weights, out[, workspace, quant, bias,
    #  (activation, alpha, limit)]) -> a | (q, scale)
    decode_gate_up: Callable
    # (a, a_scale, w2, w2_scale, counts, token_ids, positions, row_weights, out[, accumulate,
    #  workspace, quant, bias, shared=, early=, shared_a=, shared_gate=, gate_input=]) -> out
    decode_down: Callable
    quantize_fp8_groups: Callable  # (x, num_valid, q, scale, group) -> None (fills q, scale)
    router_logits: Callable  # (x [T, D], w [E, D], bias [E] | None[, dtype]) -> logits [T, E]


_OPS: dict[str, Ops] = {}


def ops_for(impl: str) -> Ops:
    """The Ops of "triton" or "torch" (a dict lookup, constant to torch.compile)."""
    return _OPS[impl]


def backend_for(x: Tensor) -> Ops:
    """The Ops an op whose main input is ``x`` runs by default (see resolve)."""
    impl = _default_impl()
    if impl == "auto":  # the common case, without resolve's checks
        return _OPS["triton" if x.is_cuda and _TRITON else "torch"]
    return _OPS[resolve(impl, x)]


def load_ops() -> None:
    """Fill the Ops table at import (the kernels' modules take ~40 ms once triton is loaded):
    torch.compile cannot trace an import made on first use."""
    impls = ("torch", "triton") if _TRITON else ("torch",)
    for impl in impls:
        kind = "kernel" if impl == "triton" else "reference"
        route, gather, gemm, silu, scatter, shuffle, quant, decode, router = (
            importlib.import_module(f"shufflemoe.ops.{op}.{kind}")
            for op in ("index_shuffle", "gather_scale", "grouped_gemm", "silu_mul", "scatter_add",
                       "shuffling", "quantize", "moe_decode", "router"))
        _OPS[impl] = Ops(impl, route.index_shuffle, route.sort_by_expert, gather.gather_scale,
                         gemm.grouped_gemm, silu.silu_mul, scatter.scatter_add,
                         scatter.token_sum, shuffle.combine_shuffling, shuffle.split_shuffling,
                         decode.gate_up, decode.down, quant.quantize_fp8_groups_into,
                         router.router_logits)
