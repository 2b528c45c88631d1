"""Benchmark suites, chosen by name from SUITES. A suite is ``run(ctx) -> SuiteResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..._registry import Registry
from ..timing import Ceilings


@dataclass
class Context:
    ceilings: Ceilings
    quick: bool = False  # fewer shapes and repetitions (smoke runs)


@dataclass
class SuiteResult:
    rows: list[dict]
    targets: list[dict] = field(default_factory=list)  # each: target, measured, met
    columns: list[str] | None = None
    notes: str = ""
    plot: Callable[[str], None] | None = None  # writes a PNG into the given folder


SUITES: Registry[Callable[[Context], SuiteResult]] = Registry("benchmark suite")
