"""Triton launches with less host work per call.

``kernel[grid](...)`` binds the arguments, computes Triton's specialization key and checks the
kernel's globals on every call: ~20 us of Python on an H100 host, more than a decode kernel runs.
``fast_launch`` wraps a ``@triton.jit`` kernel (call sites keep ``kernel[grid](...)``): the
first call of each specialization goes through Triton (compiling if needed) and keeps the
compiled kernel; later calls with the same specialization launch it directly.

The specialization is at least as fine as Triton's: per tensor its dtype and whether its data
pointer is 16-byte aligned; per int whether it is 1, divisible by 16 and which integer type holds
it; floats by type; constexpr parameters and launch options (num_warps, ...) by value; the current
device. Under the interpreter (TRITON_INTERPRET=1) kernels are not JIT functions and run as before.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

_I32, _I64 = 2**31, 2**63


def _spec(a):
    """How Triton specializes a non-constexpr argument (coarse to fine: never coarser)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a is None or isinstance(a, bool):
        return a
    if isinstance(a, int):
        return a == 1, a % 16 == 0, -_I32 <= a < _I32, a < _I64
    if isinstance(a, float):
        return float
    return a


class FastKernel:
    """A ``@triton.jit`` kernel launched as ``kernel[grid](*args, **kwargs)`` (see module doc)."""

    def __init__(self, fn: JITFunction):
        self.fn = fn
        self._names = [p.name for p in fn.params]
        self._constexpr = [p.is_constexpr for p in fn.params]
        self._runtime = {p.name for p in fn.params if not p.is_constexpr}  # specialized like _spec
        self._defaults = [p._param.default for p in fn.params]
        self._compiled: dict = {}

    def __getitem__(self, grid) -> Callable:
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args: tuple, kwargs: dict):
        device = torch.cuda.current_device()
        key = (device, tuple(a if c else _spec(a) for a, c in zip(args, self._constexpr)),
               tuple((k, _spec(v) if k in self._runtime else v) for k, v in kwargs.items()))
        try:
            kernel = self._compiled.get(key)
        except TypeError:  # an unhashable argument: Triton's own path
            return self.fn[grid](*args, **kwargs)
        if kernel is None:
            kernel = self._compiled[key] = self.fn[grid](*args, **kwargs)
            return kernel
        bound = list(args)
        for name, default in zip(self._names[len(args):], self._defaults[len(args):]):
            bound.append(kwargs[name] if name in kwargs else default)
        stream = torch._C._cuda_getCurrentRawStream(device)
        n = len(grid)
        kernel.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, kernel.launch_metadata(grid, stream, *bound),
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound)
        return kernel


_CURRENT = contextlib.nullcontext()


def on_device(t: torch.Tensor):
    """A context making t's CUDA device current: nothing to do (the common case, ~5 us less than
    torch.cuda.device) when it already is, or for a CPU tensor (the interpreter)."""
    if not t.is_cuda or t.get_device() == torch.cuda.current_device():
        return _CURRENT
    return torch.cuda.device(t.device)


def fast_launch(fn):
    """Decorator over ``@triton.jit``: a FastKernel, or ``fn`` itself when it is not a JIT function
    (the interpreter's)."""
    return FastKernel(fn) if isinstance(fn, JITFunction) else fn
