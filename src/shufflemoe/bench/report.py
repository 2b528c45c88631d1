"""Benchmark results: a JSON file and a markdown table per suite, each stamped with the device,
versions, code commit and a digest of the package source that produced it."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import platform
import subprocess

import torch

SRC = pathlib.Path(__file__).resolve().parents[1]  # src/shufflemoe


def source_digest() -> str:
    """sha256 of every .py file of the package: ties a result to the exact code that made it."""
    h = hashlib.sha256()
    for path in sorted(SRC.rglob("*.py")):
        h.update(str(path.relative_to(SRC)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def git_commit() -> str:
    """SHUFFLEMOE_COMMIT (set by the GPU run, whose copy has no .git) or git rev-parse HEAD."""
    if os.environ.get("SHUFFLEMOE_COMMIT"):
        return os.environ["SHUFFLEMOE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=SRC, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def metadata() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=git_commit(),
        source_digest=source_digest(),
        torch=torch.__version__,
        triton=triton_version,
        python=platform.python_version(),
    )
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda,
                    l2_mb=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
    else:
        meta.update(gpu=None, cpu=platform.processor() or platform.machine())
    return meta


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(suite: str, rows: list[dict], out_dir: str | os.PathLike, *, ceilings: dict | None = None,
                  targets: list[dict] | None = None, columns: list[str] | None = None,
                  notes: str = "") -> pathlib.Path:
    """Write <out_dir>/<suite>.json and <suite>.md; returns the JSON path."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = metadata()
    doc = dict(suite=suite, meta=meta, ceilings=ceilings, targets=targets or [], rows=rows, notes=notes)
    path = out / f"{suite}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    md = [f"# {suite}", "",
          f"{meta.get('gpu') or meta.get('cpu')}, torch {meta['torch']}, triton {meta['triton']}, "
          f"commit {meta['commit'][:10]}, source {meta['source_digest']}, {meta['date']}", ""]
    if ceilings:
        md += ["Ceilings measured in the same run: " + ", ".join(f"{k} {v}" for k, v in ceilings.items()), ""]
    if notes:
        md += [notes, ""]
    if targets:
        md += ["## Targets", "", markdown_table(targets)]
    md += ["## Results", "", markdown_table(rows, columns)]
    (out / f"{suite}.md").write_text("\n".join(md))
    return path
