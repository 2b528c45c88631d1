"""benchmarks/two_devices.py: the fixed / bandwidth split of a row timed on two GPUs (CPU)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "two_devices.py"
spec = importlib.util.spec_from_file_location("two_devices", SCRIPT)
two = importlib.util.module_from_spec(spec)
spec.loader.exec_module(two)


@pytest.mark.parametrize("fixed,streamed", [(12.0, 16.0), (0.0, 100.0), (30.0, 0.0)])
def test_split_recovers_the_model(fixed, streamed):
    ratio = 1.39
    t_a, t_b = fixed + streamed, fixed + streamed / ratio
    f, s = two.split(t_a, t_b, ratio)
    assert f == pytest.approx(fixed, abs=1e-9) and s == pytest.approx(streamed, abs=1e-9)


def test_split_refuses_a_ratio_that_says_nothing():
    with pytest.raises(ValueError, match="ratio"):
        two.split(10.0, 8.0, 1.0)


def _doc(gpu, read, rows):
    return dict(meta=dict(gpu=gpu, commit="abcdef1", run_id=gpu), ceilings=dict(used=dict(read_gbps=read)),
                rows=rows)


def _row(T, us, **kw):
    return dict(dict(preset="p", format="bf16", T=T, impl="shufflemoe", mode="graph", routing="random", us=us,
                     check="ok", floor_us=10.0), **kw)


def test_table_pairs_checked_graph_rows_only():
    a = _doc("A", 3000.0, [_row(1, 30.0), _row(8, 90.0), _row(64, 200.0, check="FAILED"),
                           _row(1, 99.0, mode="eager")])
    b = _doc("B", 4200.0, [_row(1, 26.0), _row(8, 66.0), _row(64, 150.0)])
    md = two.table(a, b)
    rows = [line for line in md.splitlines() if line.startswith("| p |")]
    assert len(rows) == 2  # T = 64 failed its check on a; the eager row is not paired
    f, _ = two.split(30.0, 26.0, 1.4)
    assert f"| p | bf16 | 1 | 30.0 | 26.0 | 1.15 | {f:.1f} |" in rows[0]
