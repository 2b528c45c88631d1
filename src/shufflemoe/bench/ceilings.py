"""The device's ceilings, measured in the same run as the results they judge (at the start and at
the end of every suite), and the GPU clocks at the time of each measurement.

- read_gbps: the faster of a sum and a max over a 2 GiB bf16 tensor, bytes read only. The ceiling
  of kernels that stream weights (decode GEMMs, MoE layers): they read far more than they write.
- copy_gbps: a device-to-device copy of 512 MiB, bytes read + written. The ceiling of kernels that
  write as much as they read (gather, SwiGLU, scatter).
- bf16_tflops / fp8_tflops: 8192^3 cuBLAS GEMMs; fp8 is torch._scaled_mm rowwise with fast
  accumulation, the accumulation mode shufflemoe's fp8 kernels use.
- host_loop_ms: the host's speed, not a ceiling: a 200k-step Python loop (median of 5). Rows that
  the host bounds (eager, torch.compile, per-layer graphs at small T) scale with it, and some
  hosts run a whole process ~1.8x slower than another (the H200 VM: 6.2-7.6 ms against
  11.2-13.0, benchmarks/probe_host_modes.py); it says which draw a run's host-bound rows had.

A suite's rows are judged against the higher of its start and end measurements, raised to the
fastest read and copy rates its own rows showed (``shown``): a measurement below what the device
did in the same run is a slow measurement, and would flatter every row.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

import torch

from .timing import time_fn

_SMI_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "temperature.gpu", "power.draw")


@dataclass(frozen=True)
class Ceilings:
    read_gbps: float
    copy_gbps: float
    bf16_tflops: float
    fp8_tflops: float  # 0 when the device has no fp8 GEMM
    clocks: dict = field(default_factory=dict)  # nvidia-smi fields at the measurement
    host_loop_ms: float | None = None  # host_loop_ms() at the measurement

    RATES = ("read_gbps", "copy_gbps", "bf16_tflops", "fp8_tflops")

    def as_dict(self) -> dict:
        d = asdict(self)
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in d.items()}


def stricter(a: Ceilings, b: Ceilings) -> Ceilings:
    """The higher of two measurements of each ceiling: results are judged against the best the
    device showed in the run, so a slow ceiling measurement cannot flatter them."""
    return Ceilings(*(max(getattr(a, k), getattr(b, k)) for k in Ceilings.RATES))


SHOWN_MIN_BYTES = 200e6  # rows that move less may be helped by L2 (50 MB on an H100)


def shown(rows: Iterable[dict], min_bytes: float = SHOWN_MIN_BYTES) -> dict:
    """The fastest read and copy rates rows of a run showed: bytes read (copy-bound rows: read +
    written) over the row's time, for rows that passed their check and move at least
    ``min_bytes`` (so that no cache served them). The device did that, so a ceiling measured
    below it is a slow measurement (the read ceiling's reduction has measured 5% under what
    the layer's decode kernels reached in the same run)."""
    best = dict(read_gbps=0.0, copy_gbps=0.0)
    for r in rows:
        key = "ms" if "ms" in r else "us"
        t, read = r.get(key), r.get("read_bytes") or 0
        if not t or not read or ("check" in r and not str(r["check"]).startswith("ok")):
            continue
        copy = r.get("bound") == "copy"
        moved = read + ((r.get("write_bytes") or 0) if copy else 0)
        if moved < min_bytes:
            continue
        rate = moved / (t * (1e3 if key == "ms" else 1.0)) / 1e3
        k = "copy_gbps" if copy else "read_gbps"
        best[k] = max(best[k], rate)
    return best


def raised(c: Ceilings, best: dict) -> Ceilings:
    """c with its read and copy rates raised to what rows showed (``shown``)."""
    return replace(c, read_gbps=max(c.read_gbps, best["read_gbps"]),
                   copy_gbps=max(c.copy_gbps, best["copy_gbps"]))


def python_loop_ms(steps: int = 200_000) -> float:
    """One timing of a ``steps``-step Python loop, ms."""
    t0 = time.perf_counter()
    s = 0
    for i in range(steps):
        s += i
    return (time.perf_counter() - t0) * 1e3


def host_loop_ms(rounds: int = 5) -> float:
    """The host's speed for Python work: the median of ``rounds`` python_loop_ms() timings."""
    return statistics.median(python_loop_ms() for _ in range(rounds))


def write_ns_per_byte(c: Ceilings) -> float:
    """Time to write one byte, from the copy (read + write) and read rates: a copy of N bytes
    takes 2N / copy, of which N / read is reading (never below zero)."""
    return max(0.0, 2 / c.copy_gbps - 1 / c.read_gbps)


def read_clocks() -> dict:
    """GPU 0's clocks (MHz), temperature (C) and power (W) from nvidia-smi; {} when unreadable."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(_SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_clocks(out)


def parse_clocks(line: str) -> dict:
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(_SMI_FIELDS):
        return {}
    parsed = {}
    for key, v in zip(_SMI_FIELDS, values):
        try:
            parsed[key] = float(v)
        except ValueError:  # "[N/A]"
            parsed[key] = None
    return parsed


def measure_ceilings(n: int = 8192) -> Ceilings:
    """Measure every ceiling now. The GEMMs run first: an idle GPU needs a moment to raise its
    clocks, and a copy timed at once read up to 12% low on an H100. Bandwidths: the best of
    several medians."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = time_fn(lambda i: a @ b.t(), 1, graph=False, reps=10)
    bf16 = 2 * n**3 / (t.median_us * 1e-6) / 1e12
    fp8 = 0.0
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        sa, sb = torch.ones(n, 1, device="cuda"), torch.ones(1, n, device="cuda")
        t = time_fn(lambda i: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                               use_fast_accum=True), 1, graph=False, reps=10)
        fp8 = 2 * n**3 / (t.median_us * 1e-6) / 1e12
        del a8, b8
    except (RuntimeError, AttributeError):
        pass
    del a, b
    big = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    best = min(time_fn(lambda i: reduce(big), 1, graph=False, reps=10).median_us
               for reduce in (lambda t: t.sum(dtype=torch.float32), torch.amax) for _ in range(2))
    read = big.numel() * big.element_size() / (best * 1e-6) / 1e9
    del big
    src = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)  # 512 MiB
    dst = torch.empty_like(src)
    best = min(time_fn(lambda i: dst.copy_(src), 1, graph=False, reps=30).median_us for _ in range(3))
    copy = 2 * src.numel() * src.element_size() / (best * 1e-6) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return Ceilings(read, copy, bf16, fp8, read_clocks(), host_loop_ms())
