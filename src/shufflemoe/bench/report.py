"""Benchmark results: per suite a JSON file, a markdown report and a line appended to the suite's
history (history/<suite>.jsonl), each stamped with the device, its clocks, the versions, the code
commit, a digest of the package source and the run id of the GPU call that produced it."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import uuid

import torch

from .ceilings import read_clocks

SRC = pathlib.Path(__file__).resolve().parents[1]  # src/shufflemoe
REPO_RESULTS = SRC.parents[1] / "benchmarks" / "results"  # in a source checkout
_RUN_ID = None


def run_id() -> str:
    """SHUFFLEMOE_RUN_ID (benchmarks/gpu_check.sh sets one per GPU call), else one per process."""
    global _RUN_ID
    if _RUN_ID is None:
        _RUN_ID = os.environ.get("SHUFFLEMOE_RUN_ID") or (
            datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6])
    return _RUN_ID


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


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def metadata() -> dict:
    meta = dict(
        run_id=run_id(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=git_commit(),
        source_digest=source_digest(),
        torch=torch.__version__,
        triton=_version("triton"),
        transformers=_version("transformers"),
        python=platform.python_version(),
    )
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda,
                    l2_mb=round(getattr(p, "L2_cache_size", 0) / 2**20, 1), clocks=read_clocks())
    else:
        meta.update(gpu=None, cpu=platform.processor() or platform.machine())
    return meta


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def cell(row: dict, column: str) -> str:
    """A markdown cell; a value with a spread (column_lo / column_hi) reads 'v [lo, hi]'."""
    v = row.get(column)
    lo, hi = row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if v is not None and lo is not None and hi is not None:
        return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"
    return _fmt(v)


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    columns = columns or [c for c in rows[0] if not c.endswith(("_lo", "_hi"))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, c).replace("|", "/") for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _ceilings_table(ceilings: dict) -> str:
    rates = ("read_gbps", "copy_gbps", "bf16_tflops", "fp8_tflops")
    rows = [dict(when=when, **{k: ceilings[when].get(k) for k in rates},
                 sm_mhz=ceilings[when].get("clocks", {}).get("clocks.sm"),
                 temp_c=ceilings[when].get("clocks", {}).get("temperature.gpu"),
                 power_w=ceilings[when].get("clocks", {}).get("power.draw"),
                 host_loop_ms=ceilings[when].get("host_loop_ms"))
            for when in ("start", "end", "shown", "used") if when in ceilings]
    return markdown_table(rows)


def render_markdown(doc: dict, columns: list[str] | None = None) -> str:
    meta = doc["meta"]
    md = [f"# {doc['suite']}", "",
          f"{meta.get('gpu') or meta.get('cpu')}, torch {meta['torch']}, triton {meta['triton']}, "
          f"transformers {meta.get('transformers')}, commit {meta['commit'][:10]}, source "
          f"{meta['source_digest']}, run {meta['run_id']}, {meta['date']}", ""]
    if doc.get("ceilings"):
        md += ["## Ceilings (measured at the start and the end of this suite; 'shown': the fastest "
               "rates rows of this suite moving 200 MB or more reached, bytes over time; 'used' is "
               "the highest of the three, against which every % and floor below is computed; "
               "host_loop_ms: a 200k-step Python loop at the measurement, the host's speed, which "
               "rows bound by the host follow)", "",
               _ceilings_table(doc["ceilings"])]
    if doc.get("notes"):
        md += [doc["notes"], ""]
    if doc.get("headlines"):
        md += ["## Headlines", "", markdown_table(doc["headlines"])]
    if doc.get("targets"):
        md += ["## Targets", "", markdown_table(doc["targets"])]
    like = [r for r in doc.get("ratios", []) if r["like_for_like"]]
    cross = [r for r in doc.get("ratios", []) if not r["like_for_like"]]
    cols = lambda rs: [c for c in rs[0] if c not in ("like_for_like",) and not c.endswith(("_lo", "_hi"))]  # noqa: E731
    if like:
        md += ["## Like-for-like ratios (peer time / ours, same mode; [p20/p80 bounds])", "",
               markdown_table(like, cols(like))]
    if cross:
        md += ["## Cross-mode ratios (labelled; not like for like)", "", markdown_table(cross, cols(cross))]
    md += ["## Results (median [p20, p80])", "", markdown_table(doc["rows"], columns)]
    return "\n".join(md)


def seed_history(out_dir: str | os.PathLike, suite: str, source: pathlib.Path | None) -> pathlib.Path:
    """<out_dir>/history/<suite>.jsonl, started from ``source``'s copy (the committed history)
    when the run's folder has none yet, so that the run's folder holds the whole history."""
    path = pathlib.Path(out_dir) / "history" / f"{suite}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = None if source is None else pathlib.Path(source) / f"{suite}.jsonl"
    if not path.exists() and seed is not None and seed.exists() and seed.resolve() != path.resolve():
        shutil.copyfile(seed, path)
    return path


def write_results(doc: dict, out_dir: str | os.PathLike, columns: list[str] | None = None,
                  history_from: pathlib.Path | None = None) -> pathlib.Path:
    """Write <out_dir>/<suite>.json and .md and append the document to the suite's history;
    returns the JSON path."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suite = doc["suite"]
    path = out / f"{suite}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{suite}.md").write_text(render_markdown(doc, columns))
    history = seed_history(out, suite, history_from)
    with history.open("a") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return path
