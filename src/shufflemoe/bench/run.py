"""Run benchmark suites on the GPU and write their results (``shufflemoe bench``)."""

from __future__ import annotations

import importlib
import pathlib
import sys
import time
import traceback

import torch

from .report import markdown_table, write_results
from .suites import SUITES, Context
from .timing import measure_ceilings

# Each module registers its suites in SUITES when imported.
SUITE_MODULES = ("token_ops", "grouped_gemm", "layer", "e2e_hf")


def load_suites() -> list[str]:
    for name in SUITE_MODULES:
        try:
            importlib.import_module(f"{__package__}.suites.{name}")
        except ModuleNotFoundError as e:  # a suite's optional dependency (transformers) is missing
            print(f"skipping benchmark suites in {name}: {e}", file=sys.stderr)
    return SUITES.names()


def run(names: list[str] | None, out_dir: str, quick: bool = False) -> int:
    """Run the named suites (all when None). Returns the number of suites that failed."""
    if not torch.cuda.is_available():
        print("shufflemoe bench needs a CUDA GPU; on the CPU run `shufflemoe demo`.", file=sys.stderr)
        return 1
    available = load_suites()
    names = names or available
    for n in names:
        SUITES.get(n)  # fails early on a typo
    ceilings = measure_ceilings()
    print(f"ceilings: {ceilings.as_dict()}", flush=True)
    ctx = Context(ceilings=ceilings, quick=quick)
    failed = 0
    for n in names:
        t0 = time.time()
        try:
            res = SUITES.get(n)(ctx)
        except Exception:  # one broken suite must not lose the others' results
            traceback.print_exc()
            failed += 1
            continue
        path = write_results(n, res.rows, out_dir, ceilings=ceilings.as_dict(), targets=res.targets,
                             columns=res.columns, notes=res.notes)
        if res.plot is not None:
            res.plot(str(pathlib.Path(out_dir)))
        print(f"\n== {n} ({time.time() - t0:.0f} s) -> {path}")
        print(markdown_table(res.targets) if res.targets else "(no targets)", flush=True)
    return failed
