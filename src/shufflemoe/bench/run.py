"""Run benchmark suites on the GPU and write their results (``shufflemoe bench``).

Per suite: the ceilings measured at its start (the previous suite's end) and at its end, the rows
judged against the higher of the two (raised to the rates its rows showed: ceilings.shown),
ratios, targets and headlines computed from them, then
<out>/<suite>.json, .md, .png and a line appended to <out>/history/<suite>.jsonl."""

from __future__ import annotations

import importlib
import pathlib
import sys
import tempfile
import time
import traceback

import torch

from .analysis import apply_ceilings
from .ceilings import measure_ceilings, raised, shown, stricter
from .plots import plot_ratios
from .report import REPO_RESULTS, metadata, run_id, write_results
from .suites import SUITES, Context

# Each module registers its suites in SUITES when imported.
SUITE_MODULES = ("token_ops", "grouped_gemm", "layer", "e2e_hf", "host_cost")


def load_suites() -> list[str]:
    for name in SUITE_MODULES:
        try:
            importlib.import_module(f"{__package__}.suites.{name}")
        except ModuleNotFoundError as e:  # a suite's optional dependency (transformers) is missing
            print(f"skipping benchmark suites in {name}: {e}", file=sys.stderr)
    return SUITES.names()


def describe() -> str:
    """The suites, their GPU call (part) and estimated time: ``shufflemoe bench --list``."""
    lines = [f"{'suite':20} {'part':>4} {'est. s':>7}  description"]
    for name in load_suites():
        s = SUITES.get(name)
        lines.append(f"{name:20} {s.part:>4} {s.est_s:>7}  {s.description}")
    for part in sorted({SUITES.get(n).part for n in SUITES.names()}):
        total = sum(SUITES.get(n).est_s for n in SUITES.names() if SUITES.get(n).part == part)
        lines.append(f"part {part}: about {total} s on an H100 (benchmarks/gpu_check.sh part{part})")
    return "\n".join(lines)


def default_out_dir() -> pathlib.Path:
    """A new folder per run, outside the repository: never the committed results by accident."""
    return pathlib.Path(tempfile.gettempdir()) / "shufflemoe-bench" / run_id()


def select(names: list[str] | None, part: int | None) -> list[str]:
    available = load_suites()
    if names:
        for n in names:
            SUITES.get(n)  # fails early on a typo, listing the suites
        return names
    return [n for n in available if part is None or SUITES.get(n).part == part]


def run(names: list[str] | None, out_dir: str | None, quick: bool = False, part: int | None = None,
        budget_s: float | None = None, history_from: pathlib.Path | None = REPO_RESULTS / "history") -> int:
    """Run the named suites (default: all, or those of ``part``). Returns how many failed."""
    if not torch.cuda.is_available():
        print("shufflemoe bench needs a CUDA GPU; on the CPU run `shufflemoe demo`.", file=sys.stderr)
        return 1
    names = select(names, part)
    out = pathlib.Path(out_dir) if out_dir else default_out_dir()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    print(f"run {run_id()}: suites {', '.join(names)} -> {out}", flush=True)
    start = measure_ceilings()
    print(f"ceilings: {start.as_dict()}", flush=True)
    failed = 0
    for n in names:
        t0 = time.time()
        ctx = Context(ceilings=start, quick=quick, deadline=deadline, suite=n)
        try:
            res = SUITES.get(n).run(ctx)
            end = measure_ceilings()
            best = shown(res.rows)
            used = raised(stricter(start, end), best)
            apply_ceilings(res.rows, used)
            a = res.analyse(res.rows)
        except Exception:  # one broken suite must not lose the others' results
            traceback.print_exc()
            failed += 1
            torch.cuda.empty_cache()
            start = measure_ceilings()
            continue
        doc = dict(suite=n, meta=metadata(), elapsed_s=round(time.time() - t0, 1),
                   ceilings=dict(start=start.as_dict(), end=end.as_dict(),
                                 shown={k: round(v, 1) for k, v in best.items()},
                                 used=used.as_dict()),
                   notes=res.notes, headlines=a.headlines, targets=a.targets, ratios=a.ratios,
                   rows=res.rows)
        path = write_results(doc, out, res.columns, history_from)
        _plots(n, res, a, out)
        met = sum(t["met"] for t in a.targets)
        print(f"\n== {n} ({time.time() - t0:.0f} s; estimated {SUITES.get(n).est_s} s) -> {path}; "
              f"targets met {met} of {len(a.targets)}", flush=True)
        for h in a.headlines:
            print(f"  {h['what']}: {h['result']}", flush=True)
        start = end  # the end of one suite is the start of the next
    return failed


_RATIO_FIELDS = ("ours", "peer", "modes", "like_for_like", "ratio", "ratio_lo", "ratio_hi", "best_peer")


def _plots(name: str, res, a, out: pathlib.Path) -> None:
    """<suite>.png (the like-for-like ratios) and the suite's own figure; a plot that fails is
    reported, never the end of the run."""
    keys = [k for k in (a.ratios[0] if a.ratios else {}) if k not in _RATIO_FIELDS]
    try:
        plot_ratios(name, a.ratios, keys, str(out))
        if res.plot is not None:
            res.plot(res.rows, str(out))
    except Exception:  # noqa: BLE001
        traceback.print_exc()
