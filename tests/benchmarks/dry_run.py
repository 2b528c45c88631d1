"""Run a script of benchmarks/ with --dry-run on the CPU (its own process: the script sets
TRITON_INTERPRET before triton loads) and return the rows of the JSON it writes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dry_run_rows(name: str, out: pathlib.Path) -> list[dict]:
    """Rows of benchmarks/<name>.py --dry-run --out ``out`` (out/<name>.json); fails on a non-zero exit."""
    return dry_run(name, out)["rows"]


def dry_run(name: str, out: pathlib.Path, *args: str, result: str | None = None) -> dict:
    """What benchmarks/<name>.py --dry-run --out ``out`` [args] wrote to out/<result or
    name>.json."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--dry-run", "--out", str(out),
                           *args],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((out / f"{result or name}.json").read_text())


def check(name: str) -> str:
    """stdout of benchmarks/<name>.py --check under the interpreter (a probe's kernel against its
    reference on small shapes); fails on a non-zero exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1",
               TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--check"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout
