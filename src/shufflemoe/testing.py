"""Correctness helpers shared by the tests, the demo and the benchmarks' checks.

One tolerance table per dtype. An output passes when every element is finite and
    |out - ref| <= atol * rms(ref) + rtol * |ref|   elementwise, and
    ||out - ref|| <= rel_l2 * ||ref||
so a single wrong row (an error of order rms) fails, and so does a small systematic bias.
Where the reference can also give the scale of the rounding error behind each output
(naive_moe(with_magnitude=True): root-sum-squares of the terms of every sum, the probabilistic
running-error bound), the bound is instead
    |out - ref| <= mag * magnitude   elementwise,
so outputs that cancel to nearly zero get no false alarms while the bound stays a few unit
roundoffs (tests/test_tolerances.py re-measures the errors and fails if a bound becomes loose).
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
    mag: float  # times the magnitude of the terms (when the reference provides it)


# Unit roundoff u: float32 6e-8, float16 4.9e-4, bfloat16 3.9e-3. Measured on the CPU over 600
# random layers (every router and strategy, D and I down to 1), the largest |out - ref| / magnitude
# was 1.5e-7 (2.4u) in float32, 2.9e-3 (0.7u) in bfloat16 and 2.3e-2 in fp8 rowwise (the reference
# quantizes exactly as the kernels do; what remains are fp8 roundings flipped by a bf16 rounding
# upstream, and row scales that move with them). The bounds allow about 4u: on the GPU the fused
# scatter also rounds the bf16 output once per added pair (k + 1 adds, errors of random sign).
# The weight formats (tests/test_tolerances.py, narrowest layers): fp8_w8a16 and mxfp4 are bf16
# arithmetic on exactly dequantized weights (measured 2.2e-3, as bf16: its row); fp8_block rounds
# activations to e4m3 per 128 columns instead of per row (measured 9.9e-3: fp8_rowwise's row).
# rtol/atol/rel_l2 serve ops whose reference has no magnitude: a few roundings of the output.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-12, rtol=1e-12, rel_l2=1e-13, mag=1e-13),
    "float32": Tolerance(atol=2e-5, rtol=2e-5, rel_l2=5e-6, mag=5e-7),
    "float16": Tolerance(atol=1e-2, rtol=4e-3, rel_l2=2e-3, mag=2e-3),
    "bfloat16": Tolerance(atol=6e-2, rtol=2e-2, rel_l2=1.2e-2, mag=1.6e-2),
    "fp8_rowwise": Tolerance(atol=2.5e-1, rtol=5e-2, rel_l2=5e-2, mag=5e-2),
    "fp8_w8a16": Tolerance(atol=6e-2, rtol=2e-2, rel_l2=1.2e-2, mag=1.6e-2),
    "fp8_block": Tolerance(atol=2.5e-1, rtol=5e-2, rel_l2=5e-2, mag=5e-2),
    "mxfp4": Tolerance(atol=6e-2, rtol=2e-2, rel_l2=1.2e-2, mag=1.6e-2),
}


def tolerance_key(cfg) -> str:
    """The TOLERANCES row of an MoEConfig's arithmetic: its dtype, or its quantization."""
    return cfg.quantization if cfg.quantized else str(cfg.dtype).replace("torch.", "")


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    key = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    return TOLERANCES[key]


@dataclass(frozen=True)
class Comparison:
    max_err_over_rms: float  # max |out - ref| / rms(ref)
    rel_l2: float
    ok: bool
    why: str


def compare(out: Tensor, ref: Tensor, tol: Tolerance | torch.dtype | str,
            magnitude: Tensor | None = None) -> Comparison:
    """Compare ``out`` with a (float64) reference under a tolerance; ``magnitude`` (same shape,
    >= |ref|) switches to the magnitude-relative bound."""
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
    # Below the normal range the output's spacing stops shrinking with the value (fp16: 2^-24),
    # so relative bounds cannot hold there: allow two of those steps (rounding of the output and
    # of what it was made from).
    floor = 2 * subnormal_step(out.dtype)
    if magnitude is not None:
        over = err > tol.mag * magnitude.double().cpu() + floor
    else:
        over = err > tol.atol * rms + tol.rtol * r.abs() + floor
    if over.any():
        idx = tuple(over.nonzero()[0].tolist())
        return Comparison(max_err, rel_l2, False,
                          f"{over.sum().item()} elements out of tolerance, first at {idx}: "
                          f"{o[idx].item():.6g} vs {r[idx].item():.6g}")
    if magnitude is None and rel_l2 > tol.rel_l2:
        return Comparison(max_err, rel_l2, False, f"relative L2 error {rel_l2:.3g} > {tol.rel_l2}")
    return Comparison(max_err, rel_l2, True, "")


def subnormal_step(dtype: torch.dtype) -> float:
    """The spacing of a floating dtype's subnormals (0 for other dtypes)."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def assert_close(out: Tensor, ref: Tensor, tol: Tolerance | torch.dtype | str, name: str = "output",
                 magnitude: Tensor | None = None) -> Comparison:
    c = compare(out, ref, tol, magnitude)
    if not c.ok:
        raise AssertionError(f"{name}: {c.why} (max err {c.max_err_over_rms:.3g} rms, rel L2 {c.rel_l2:.3g})")
    return c


def poisoned(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """A new tensor full of NaN (or, for integers, an out-of-range -1): unwritten outputs fail."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -1, dtype=dtype, device=device)
