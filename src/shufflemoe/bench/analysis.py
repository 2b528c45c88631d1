"""What the benchmark rows mean: floors from the run's ceilings, like-for-like ratios, targets.

A row is one implementation timed one way on one case: the case's fields (the suite's keys),
``impl`` (what ran), ``side`` ("ours" or "peer"), ``mode`` (how it was issued, MODES), the time
(``us`` or ``ms``) with its spread (``_lo`` / ``_hi``: p20 / p80 of the samples, or min / max
over repeats), and what it must move: ``read_bytes``, ``write_bytes``, ``flops`` (``fp8`` when the
FLOPs run in fp8). Suites time; this module judges, so every judgement is tested on the CPU with
synthetic rows (tests/bench/test_analysis.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .ceilings import Ceilings, write_ns_per_byte

# How a timed call was issued. A ratio compares two rows of the same mode unless a suite names a
# cross pair, which is then labelled as such and never a headline.
MODES = {
    "eager": "each op launched from Python, no CUDA graph",
    "graph": "replays of a captured CUDA graph",
    "compile": "torch.compile (default mode), launched from Python",
    "layer_graphs": "the patched model's default: each MoE layer replays its own CUDA graphs",
    "step_graph": "the whole forward (prefill) or decode step captured in one CUDA graph",
    "compiled_generate": "transformers' generate(cache_implementation='static'): compiled decode",
}


def time_key(row: dict) -> str:
    return "ms" if "ms" in row else "us"


def failed_check(row: dict) -> bool:
    """A row whose timed path gave a wrong answer: its time proves nothing, so no ratio uses it."""
    return "check" in row and not str(row["check"]).startswith("ok")


def apply_ceilings(rows: Iterable[dict], c: Ceilings) -> None:
    """Add the floor columns a row's byte and FLOP counts imply under ceilings ``c``:
    floor (memory: reads at the read ceiling, writes at what a copy leaves for them; compute: the
    dense GEMM rate of the row's precision), x_floor = time / floor, pct_floor = 100 / x_floor,
    pct_read (bytes read over the
    read ceiling) for rows bound by reads, pct_copy (bytes read + written over the copy ceiling)
    for rows that write as much as they read."""
    for r in rows:
        key = time_key(r)
        t = r.get(key)
        if not t or ("read_bytes" not in r and "flops" not in r):
            continue
        scale = 1e3 if key == "ms" else 1.0  # us per unit of the row's time
        read, write = r.get("read_bytes") or 0, r.get("write_bytes") or 0
        mem_us = (read / c.read_gbps + write * write_ns_per_byte(c)) / 1e3
        rate = c.fp8_tflops if r.get("fp8") and c.fp8_tflops else c.bf16_tflops
        compute_us = (r.get("flops") or 0) / rate / 1e6
        floor_us = max(mem_us, compute_us)
        t_us = t * scale
        r[f"floor_{key}"] = floor_us / scale
        r["x_floor"] = t_us / floor_us if floor_us else None
        r["pct_floor"] = 100 * floor_us / t_us
        if read:
            r["gbps"] = (read + write) / t_us / 1e3
            if r.get("bound") == "copy":
                r["pct_copy"] = 100 * r["gbps"] / c.copy_gbps
            else:
                r["pct_read"] = 100 * read / t_us / 1e3 / c.read_gbps
        if r.get("flops"):
            r["tflops"] = r["flops"] / t_us / 1e6


def ratios(rows: Sequence[dict], keys: Sequence[str],
           cross: Sequence[tuple[str, str, str]] = (), keep_failed: bool = False) -> list[dict]:
    """Every ours row against every peer row of the same case (``keys``) issued the same way:
    ratio = peer time / ours (> 1: ours faster), ratio_lo / ratio_hi from the spreads (peer's low
    over ours' high, and the reverse). ``cross`` adds labelled cross-mode pairs
    (ours mode, peer mode, label), e.g. each library's default path; like_for_like says which is
    which. best_peer marks, per ours row and pairing, the comparison with the fastest peer. Rows
    that failed their check make no ratio unless ``keep_failed`` (for targets that then report
    such a case as not measured)."""
    out = []
    usable = (lambda r: True) if keep_failed else (lambda r: not failed_check(r))  # noqa: E731
    peers = [p for p in rows if p.get("side") == "peer" and p.get(time_key(p)) and usable(p)]
    pairings = {(m, m): f"{m} vs {m}" for m in MODES} | {(a, b): label for a, b, label in cross}
    for o in rows:
        key = time_key(o)
        if o.get("side") != "ours" or not o.get(key) or not usable(o):
            continue
        group = []
        for p in peers:
            label = pairings.get((o.get("mode"), p.get("mode")))
            if label is None or any(o.get(k) != p.get(k) for k in keys):
                continue
            group.append(dict({k: o.get(k) for k in keys}, ours=o["impl"], peer=p["impl"],
                              modes=label, like_for_like=o.get("mode") == p.get("mode"),
                              ratio=p[key] / o[key],
                              ratio_lo=_div(p.get(f"{key}_lo"), o.get(f"{key}_hi")),
                              ratio_hi=_div(p.get(f"{key}_hi"), o.get(f"{key}_lo")),
                              peer_time=p[key]))
        for label in {g["modes"] for g in group}:
            same = [g for g in group if g["modes"] == label]
            fastest = min(same, key=lambda g: g["peer_time"])
            for g in same:
                g["best_peer"] = g is fastest
        out += group
    for g in out:
        del g["peer_time"]
    return out


def _div(a, b):
    return a / b if a and b else None


def select(rows: Iterable[dict], **match) -> list[dict]:
    """Rows whose fields equal ``match`` (a callable value is a predicate on the field)."""
    def ok(r: dict) -> bool:
        return all(v(r.get(k)) if callable(v) else r.get(k) == v for k, v in match.items())

    return [r for r in rows if ok(r)]


def target(name: str, measured: float | None, *, at_least: float | None = None,
           at_most: float | None = None, unit: str = "") -> dict:
    """One target. Not measured (None) is not met. The threshold goes into the name."""
    if (at_least is None) == (at_most is None):
        raise ValueError("a target needs exactly one of at_least / at_most")
    bound = f">= {at_least:g}{unit}" if at_least is not None else f"<= {at_most:g}{unit}"
    met = measured is not None and (measured >= at_least if at_least is not None else measured <= at_most)
    return dict(target=f"{name}: {bound}", measured=None if measured is None else round(measured, 3),
                met=bool(met))


def span(values: Iterable[float | None], fmt: str = "{:.2f}", unit: str = "") -> str:
    """'lo-hi' of the values with their unit (one value: itself; none: 'not measured')."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return "not measured"
    lo, hi = fmt.format(vals[0]), fmt.format(vals[-1])
    return (lo if lo == hi else f"{lo}-{hi}") + unit


def tally(targets: Sequence[dict], prefix: str = "") -> str:
    """'met n of m' over the targets whose name starts with ``prefix``, naming the misses."""
    sel = [t for t in targets if t["target"].startswith(prefix)]
    if not sel:
        return "no target measured"
    missed = [t for t in sel if not t["met"]]
    text = f"met {len(sel) - len(missed)} of {len(sel)}"
    if missed:
        shown = "; ".join(f"{t['target'][len(prefix):].lstrip(' :')} ({t['measured']})" for t in missed[:6])
        text += f"; missed: {shown}" + (f"; and {len(missed) - 6} more" if len(missed) > 6 else "")
    return text
