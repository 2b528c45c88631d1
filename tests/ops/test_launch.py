"""ops._launch.FastKernel: a later launch with the same specialization skips Triton's binding and
passes the compiled kernel every parameter in order (defaults filled in); anything Triton would
specialize on differently goes through Triton again. On the CPU with a stand-in for a JIT
function (the interpreter has none); on a GPU, the layer's kernels after their first call."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from shufflemoe.ops import _launch  # noqa: E402


class _Compiled:
    def __init__(self):
        self.function, self.packed_metadata, self.launches = "fn", "meta", []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        self.launches.append(((gx, gy, gz), stream, args))


class _Jit:
    """Stand-in for a JITFunction of kernel(x, n, scale, BLOCK: constexpr, FLAG: constexpr = 7)."""

    def __init__(self):
        def param(name, constexpr, default=inspect.Parameter.empty):
            return SimpleNamespace(name=name, is_constexpr=constexpr,
                                   _param=inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                            default=default))
        self.params = [param("x", False), param("n", False), param("scale", False), param("BLOCK", True),
                       param("FLAG", True, 7)]
        self.compiles = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            kernel = _Compiled()
            self.compiles.append((grid, args, kwargs, kernel))
            return kernel
        return run


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    return _launch.FastKernel(_Jit())


def test_same_specialization_launches_the_kept_kernel(kernel):
    x = torch.empty(64, dtype=torch.bfloat16)
    first = kernel[(4,)](x, 32, 0.5, BLOCK=16, num_warps=4)
    assert len(kernel.fn.compiles) == 1
    y = torch.empty(64, dtype=torch.bfloat16)  # another tensor, same dtype and alignment
    again = kernel[(5, 2)](y, 48, 2.0, BLOCK=16, num_warps=4)
    assert again is first and len(kernel.fn.compiles) == 1
    assert first.launches == [((5, 2, 1), 1234, (y, 48, 2.0, 16, 7))]  # every parameter, default too


@pytest.mark.parametrize("change", [
    dict(n=1), dict(n=33), dict(n=2**31), dict(BLOCK=32), dict(FLAG=8), dict(num_warps=8),
    dict(x="unaligned"), dict(x="float32"),
])
def test_a_different_specialization_goes_through_triton(kernel, change):
    base = torch.empty(64, dtype=torch.bfloat16)
    args = dict(x=base, n=32, BLOCK=16, num_warps=4)
    kernel[(1,)](args["x"], args["n"], 1.0, BLOCK=16, num_warps=4)
    x = {"unaligned": base[1:], "float32": base.float()}.get(change.get("x"), base)
    extra = {k: v for k, v in change.items() if k in ("FLAG",)}
    kernel[(1,)](x, change.get("n", 32), 1.0, BLOCK=change.get("BLOCK", 16),
                 num_warps=change.get("num_warps", 4), **extra)
    assert len(kernel.fn.compiles) == 2


def test_interpreter_kernels_are_left_alone():
    fn = object()
    assert _launch.fast_launch(fn) is fn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="launches compiled kernels")
def test_layer_kernels_skip_triton_after_the_first_call(monkeypatch):
    import triton.runtime.jit as jit

    from shufflemoe import MoE, MoEConfig

    layer = MoE(MoEConfig(hidden_size=256, intermediate_size=128, num_experts=8, top_k=2), device="cuda")
    x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)
    first = layer(x)
    calls = []
    run = jit.JITFunction.run
    monkeypatch.setattr(jit.JITFunction, "run", lambda self, *a, **k: calls.append(self) or run(self, *a, **k))
    assert torch.equal(layer(x), first)
    assert calls == []
