"""Plots of the results (matplotlib is optional: without it, plots are skipped with a note).

Every suite gets <suite>.png: its like-for-like ratios, one bar each with the p20/p80 bounds as
error bars, on a log axis with 1x marked; suites may add their own figure (SuiteResult.plot)."""

from __future__ import annotations

import pathlib
import sys


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: plots skipped (pip install matplotlib)", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ratio_label(r: dict, keys: list[str]) -> str:
    case = " ".join(str(r[k]) for k in keys if r.get(k) is not None)
    return f"{case}: {r['ours']} / {r['peer']} ({r['modes']})"


def plot_ratios(suite: str, ratios: list[dict], keys: list[str], folder: str) -> pathlib.Path | None:
    """<folder>/<suite>.png: the like-for-like ratios against each case's fastest peer."""
    rows = [r for r in ratios if r["like_for_like"] and r.get("best_peer")]
    plt = pyplot()
    if plt is None or not rows:
        return None
    height = max(3.0, 0.22 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(11, height))
    ys = range(len(rows))
    vals = [r["ratio"] for r in rows]
    lo = [r["ratio"] - (r.get("ratio_lo") or r["ratio"]) for r in rows]
    hi = [(r.get("ratio_hi") or r["ratio"]) - r["ratio"] for r in rows]
    ax.barh(list(ys), vals, xerr=[lo, hi], color=["tab:green" if v >= 1 else "tab:red" for v in vals],
            error_kw=dict(lw=0.8, capsize=2))
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(list(ys), [ratio_label(r, keys) for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("peer time / ours (like for like; > 1: ours faster; bars: p20/p80 bounds)")
    ax.set_title(f"{suite}: like-for-like ratios against the fastest peer of each mode")
    fig.tight_layout()
    path = pathlib.Path(folder) / f"{suite}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
