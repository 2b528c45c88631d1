"""Which implementation an op runs: its Triton kernel or its torch reference.

``impl="auto"`` (the default) runs the kernel on CUDA tensors and the reference elsewhere.
``impl="triton"`` forces the kernel: on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``
(how CI tests kernels). ``impl="torch"`` forces the reference. ``use_impl`` sets the default for
a block of code, which is how tests and benchmarks compare the two on the same pipeline.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os

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
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if x.is_cuda and triton_available() else "torch"
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' needs the triton package")
        if not (x.is_cuda or interpreting()):
            raise ValueError(
                f"impl='triton' needs CUDA tensors (got {x.device}) or TRITON_INTERPRET=1"
            )
    return impl


def kernel_op(name: str, mutates_args: tuple[str, ...]):
    """Register a kernel launcher (it writes its outputs in place and returns None) as the op
    ``torch.ops.shufflemoe.<name>``, so torch.compile traces around the Triton launch, and return a
    callable that skips the op dispatcher outside compilation: on an H100 host the eager custom-op
    path cost about 200 us of CPU a call (cProfile, benchmarks/probe_layer.py), more than the
    kernels themselves, which made eager prefill host-bound."""

    def wrap(fn):
        op = torch.library.custom_op(f"shufflemoe::{name}", fn, mutates_args=mutates_args)
        op.register_fake(_no_output)

        def call(*args) -> None:
            if torch.compiler.is_compiling():
                op(*args)
            else:
                fn(*args)

        call.__name__ = call.__qualname__ = fn.__name__
        call.__doc__ = fn.__doc__
        return call

    return wrap


def _no_output(*args, **kwargs) -> None:
    """Fake (meta) implementation of an in-place kernel op: nothing to allocate."""
    return None
