"""Benchmark suites, chosen by name from SUITES. A suite is ``run(ctx) -> SuiteResult``; its rows
are judged after the run's ceilings are known (``SuiteResult.analyse``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..._registry import Registry
from ..ceilings import Ceilings


@dataclass
class Context:
    ceilings: Ceilings  # measured at the start of this suite (rows store bytes, not percentages)
    quick: bool = False  # fewer shapes and repetitions (smoke runs)
    deadline: float | None = None  # time.monotonic() by which the run must end (None: no limit)
    started: float = field(default_factory=time.monotonic)
    suite: str = ""

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def progress(self, done: int, total: int, what: str) -> None:
        """One line per case: how far, how long so far, and what runs next."""
        elapsed = time.monotonic() - self.started
        left = self.seconds_left()
        budget = "" if left == float("inf") else f", {left:.0f} s of budget left"
        print(f"[{self.suite} {done}/{total} {elapsed:.0f} s{budget}] {what}", flush=True)


@dataclass
class Analysis:
    ratios: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)  # analysis.target(...) dicts
    headlines: list[dict] = field(default_factory=list)  # {what, result}: README's lines


@dataclass
class SuiteResult:
    rows: list[dict]
    analyse: Callable[[list[dict]], Analysis]  # after apply_ceilings
    columns: list[str] | None = None
    notes: str = ""
    plot: Callable[[list[dict], str], None] | None = None  # extra PNG into the given folder


@dataclass(frozen=True)
class Suite:
    run: Callable[[Context], SuiteResult]
    description: str
    est_s: int  # full (non-quick) run on an H100, seconds: how benchmarks/gpu_check.sh splits
    part: int  # which of gpu_check.sh's two GPU calls runs it


SUITES: Registry[Suite] = Registry("benchmark suite")


def suite(name: str, description: str, est_s: int, part: int):
    """Register ``run(ctx) -> SuiteResult`` as suite ``name``."""
    def add(run: Callable[[Context], SuiteResult]) -> Callable[[Context], SuiteResult]:
        SUITES.register(name)(Suite(run, description, est_s, part))
        return run

    return add
