"""Correctness helpers shared by the tests, the demo and the benchmarks' checks.

One tolerance table per dtype. An output passes when every element is finite and
    |out - ref| <= atol * rms(ref) + rtol * |ref|   elementwise, and
    ||out - ref|| <= rel_l2 * ||ref||
so a single wrong row (an error of order rms) fails, and so does a small systematic bias.
The bounds are a small multiple of the errors measured on the CPU over many random layers (see
tests/test_tolerances.py, which also checks they are not loose).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tolerance:
    atol: float  # times rms(ref)
    rtol: float
    rel_l2: float


# bf16: unit roundoff u = 2^-8 = 3.9e-3; a layer rounds its activations 3-4 times (GEMM13 output,
# SwiGLU output, GEMM2 output/scatter), each error of order u * rms.
# fp8 e4m3: u = 2^-4 on both activations and weights, but the reference quantizes the same way,
# so only roundings of bf16 intermediates that flip an fp8 rounding remain.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-12, rtol=1e-12, rel_l2=1e-13),
    "float32": Tolerance(atol=2e-5, rtol=2e-5, rel_l2=5e-6),
    "float16": Tolerance(atol=1e-2, rtol=4e-3, rel_l2=2e-3),
    "bfloat16": Tolerance(atol=6e-2, rtol=2e-2, rel_l2=1.2e-2),
    "fp8_rowwise": Tolerance(atol=2.5e-1, rtol=5e-2, rel_l2=5e-2),
}


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    key = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    return TOLERANCES[key]


@dataclass(frozen=True)
class Comparison:
    max_err_over_rms: float  # max |out - ref| / rms(ref)
    rel_l2: float
    ok: bool
    why: str


def compare(out: Tensor, ref: Tensor, tol: Tolerance | torch.dtype | str) -> Comparison:
    """Compare ``out`` with a (float64) reference under a tolerance."""
    tol = tol if isinstance(tol, Tolerance) else tolerance_for(tol)
    if out.shape != ref.shape:
        return Comparison(float("inf"), float("inf"), False, f"shape {list(out.shape)} != {list(ref.shape)}")
    o, r = out.double().cpu(), ref.double().cpu()
    if r.numel() == 0:
        return Comparison(0.0, 0.0, True, "")
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        return Comparison(float("nan"), float("nan"), False, f"{bad} non-finite values")
    rms = r.square().mean().sqrt().item() or 1.0
    err = (o - r).abs()
    max_err = err.max().item() / rms
    rel_l2 = (o - r).norm().item() / max(r.norm().item(), 1e-300)
    over = err > tol.atol * rms + tol.rtol * r.abs()
    if over.any():
        idx = tuple(over.nonzero()[0].tolist())
        return Comparison(max_err, rel_l2, False,
                          f"{over.sum().item()} elements out of tolerance, first at {idx}: "
                          f"{o[idx].item():.6g} vs {r[idx].item():.6g}")
    if rel_l2 > tol.rel_l2:
        return Comparison(max_err, rel_l2, False, f"relative L2 error {rel_l2:.3g} > {tol.rel_l2}")
    return Comparison(max_err, rel_l2, True, "")


def assert_close(out: Tensor, ref: Tensor, tol: Tolerance | torch.dtype | str, name: str = "output") -> Comparison:
    c = compare(out, ref, tol)
    if not c.ok:
        raise AssertionError(f"{name}: {c.why} (max err {c.max_err_over_rms:.3g} rms, rel L2 {c.rel_l2:.3g})")
    return c


def poisoned(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """A new tensor full of NaN (or, for integers, an out-of-range -1): unwritten outputs fail."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -1, dtype=dtype, device=device)
