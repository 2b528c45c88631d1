"""The benchmarks' judgement on synthetic timings (CPU): floors from the ceilings, like-for-like
pairing, spreads, targets that can fail."""

import pytest
import torch

from shufflemoe.bench import ceilings
from shufflemoe.bench.analysis import apply_ceilings, ratios, select, span, tally, target
from shufflemoe.bench.ceilings import (Ceilings, parse_clocks, raised, shown, stricter,
                                       write_ns_per_byte)
from shufflemoe.bench.timing import L2_BYTES, _settle, rotations, summarize

C = Ceilings(read_gbps=3200.0, copy_gbps=2900.0, bf16_tflops=750.0, fp8_tflops=1300.0)


def row(impl, side, mode, us, case="c", **extra):
    return dict(case=case, impl=impl, side=side, mode=mode, us=us, us_lo=0.9 * us, us_hi=1.1 * us, **extra)


def test_read_bound_rows_use_the_read_ceiling():
    r = row("ours", "ours", "graph", 100.0, read_bytes=3.2e8, write_bytes=0, bound="read")
    apply_ceilings([r], C)
    assert r["floor_us"] == pytest.approx(100.0)  # 320 MB at 3.2 TB/s
    assert r["pct_read"] == pytest.approx(100.0) and "pct_copy" not in r
    assert r["x_floor"] == pytest.approx(1.0) and r["pct_floor"] == pytest.approx(100.0)


def test_copy_bound_rows_count_reads_and_writes():
    r = row("ours", "ours", "graph", 200.0, read_bytes=2.9e8, write_bytes=2.9e8, bound="copy")
    apply_ceilings([r], C)
    assert r["pct_copy"] == pytest.approx(100.0) and "pct_read" not in r
    # a copy of N bytes takes 2N / copy: the floor of N read + N written is exactly that
    assert r["floor_us"] == pytest.approx(200.0)


def test_write_cost_never_negative():
    assert write_ns_per_byte(Ceilings(1000.0, 3000.0, 1.0, 1.0)) == 0.0
    assert write_ns_per_byte(C) == pytest.approx(2 / 2900 - 1 / 3200)


def test_compute_floor_uses_the_rows_precision():
    bf16 = row("ours", "ours", "graph", 2000.0, read_bytes=1e6, flops=1.5e12)
    fp8 = dict(bf16, fp8=True)
    apply_ceilings([bf16, fp8], C)
    assert bf16["floor_us"] == pytest.approx(2000.0)  # 1.5 TFLOP at 750 TFLOP/s: 2 ms
    assert fp8["floor_us"] == pytest.approx(2000.0 * 750 / 1300)
    assert bf16["tflops"] == pytest.approx(750.0)


def test_ms_rows_get_ms_floors():
    r = dict(phase="decode", ms=2.0, read_bytes=3.2e9, bound="read")
    apply_ceilings([r], C)
    assert r["floor_ms"] == pytest.approx(1.0) and r["x_floor"] == pytest.approx(2.0)


def test_ceilings_the_stricter_wins():
    slow = Ceilings(3000.0, 2800.0, 760.0, 1200.0)
    s = stricter(C, slow)
    assert (s.read_gbps, s.copy_gbps, s.bf16_tflops, s.fp8_tflops) == (3200.0, 2900.0, 760.0, 1300.0)


def test_rows_raise_a_slow_ceiling_measurement():
    """A row that read 330 MB in 100 us showed 3.3 TB/s: a read ceiling measured at 3.0 is raised
    to it; rows under 200 MB (L2 could serve them), rows that failed their check and rows
    without bytes do not count; copy-bound rows raise the copy ceiling by reads + writes."""
    rows = [row("ours", "ours", "graph", 100.0, read_bytes=3.3e8, bound="read"),
            row("ours", "ours", "graph", 1.0, read_bytes=1e8, bound="read"),  # 100 TB/s from L2
            row("ours", "ours", "graph", 50.0, read_bytes=3.3e8, bound="read", check="wrong"),
            dict(phase="decode", ms=0.2, read_bytes=3e8, write_bytes=3e8, bound="copy"),
            row("torch", "peer", "graph", 10.0)]
    best = shown(rows)
    assert best == pytest.approx(dict(read_gbps=3300.0, copy_gbps=3000.0))
    slow = Ceilings(3000.0, 2800.0, 760.0, 1200.0, clocks={"clocks.sm": 1980.0})
    up = raised(slow, best)
    assert (up.read_gbps, up.copy_gbps, up.bf16_tflops, up.fp8_tflops) == pytest.approx(
        (3300.0, 3000.0, 760.0, 1200.0))
    assert up.clocks == slow.clocks
    assert raised(C, best).read_gbps == 3300.0 and raised(C, dict(read_gbps=0.0, copy_gbps=0.0)) == C
    r = rows[0]
    apply_ceilings([r], up)
    assert r["pct_read"] == pytest.approx(100.0)


def test_parse_clocks():
    assert parse_clocks("1980, 2619, 1980, 41, 120.5") == {
        "clocks.sm": 1980.0, "clocks.mem": 2619.0, "clocks.max.sm": 1980.0, "temperature.gpu": 41.0,
        "power.draw": 120.5}
    assert parse_clocks("1980, [N/A], 1980, 41, 120.5")["clocks.mem"] is None
    assert parse_clocks("garbage") == {}


def test_host_speed_is_the_median_python_loop(monkeypatch):
    assert 0 < ceilings.python_loop_ms(1000) < ceilings.python_loop_ms(400_000)
    timings = iter([5.0, 1.0, 9.0, 3.0, 7.0, 100.0])
    monkeypatch.setattr(ceilings, "python_loop_ms", lambda: next(timings))
    assert ceilings.host_loop_ms() == 5.0  # the median of five rounds, the sixth never taken
    # a speed, not a rate to judge rows against: the stricter ceilings do not carry it
    assert stricter(C, Ceilings(1.0, 1.0, 1.0, 1.0, host_loop_ms=6.0)).host_loop_ms is None


def test_ratios_pair_only_the_same_mode():
    rows = [row("ours", "ours", "graph", 10.0), row("ours", "ours", "eager", 30.0),
            row("torch", "peer", "graph", 20.0), row("torch", "peer", "eager", 40.0),
            row("loop", "peer", "eager", 300.0), row("torch", "peer", "graph", 99.0, case="other")]
    rs = ratios(rows, ["case"])
    got = {(r["ours"], r["peer"], r["modes"]): round(r["ratio"], 3) for r in rs}
    assert got == {("ours", "torch", "graph vs graph"): 2.0, ("ours", "torch", "eager vs eager"): 1.333,
                   ("ours", "loop", "eager vs eager"): 10.0}
    assert all(r["like_for_like"] for r in rs)
    best = {r["peer"] for r in rs if r["modes"] == "eager vs eager" and r["best_peer"]}
    assert best == {"torch"}  # the fastest peer of the mode


def test_rows_that_failed_their_check_make_no_ratio():
    wrong = dict(row("ours", "ours", "graph", 10.0), check="logits rel L2 0.12")
    rows = [wrong, dict(row("torch", "peer", "graph", 20.0), check="ok"),
            dict(row("ours", "ours", "eager", 30.0), check="ok (reference)"),
            dict(row("loop", "peer", "eager", 60.0), check="max err 3.0")]
    assert ratios(rows, ["case"]) == []
    rows[0]["check"] = "ok"
    assert [round(r["ratio"], 3) for r in ratios(rows, ["case"])] == [2.0]


def test_ratio_spread_is_the_bounds_of_the_spreads():
    rs = ratios([row("ours", "ours", "graph", 10.0), row("torch", "peer", "graph", 20.0)], ["case"])
    assert rs[0]["ratio_lo"] == pytest.approx(18 / 11) and rs[0]["ratio_hi"] == pytest.approx(22 / 9)


def test_cross_pairs_are_labelled_and_not_like_for_like():
    rows = [row("ours default", "ours", "layer_graphs", 10.0), row("hf", "peer", "eager", 20.0)]
    assert ratios(rows, ["case"]) == []  # never paired unless asked
    rs = ratios(rows, ["case"], cross=[("layer_graphs", "eager", "default vs default")])
    assert len(rs) == 1 and rs[0]["modes"] == "default vs default" and not rs[0]["like_for_like"]


def test_rows_without_a_time_are_not_paired():
    rows = [row("ours", "ours", "graph", 10.0), dict(case="c", impl="torch", side="peer", mode="graph",
                                                     note="failed: OOM")]
    assert ratios(rows, ["case"]) == []


@pytest.mark.parametrize("measured, met", [(1.2, True), (1.19, False), (None, False)])
def test_at_least_target(measured, met):
    t = target("x vs y", measured, at_least=1.2, unit="x")
    assert t == dict(target="x vs y: >= 1.2x", measured=None if measured is None else measured, met=met)


@pytest.mark.parametrize("measured, met", [(1.15, True), (1.16, False), (None, False)])
def test_at_most_target(measured, met):
    assert target("time / floor", measured, at_most=1.15)["met"] is met


def test_a_target_needs_one_bound():
    with pytest.raises(ValueError):
        target("x", 1.0)
    with pytest.raises(ValueError):
        target("x", 1.0, at_least=1.0, at_most=2.0)


def test_tally_names_the_misses():
    ts = [target("a", 2.0, at_least=1.0), target("b", 0.5, at_least=1.0), target("c", None, at_least=1.0)]
    assert tally(ts) == "met 1 of 3; missed: b: >= 1 (0.5); c: >= 1 (None)"
    assert tally([]) == "no target measured"


def test_span_and_select():
    assert span([2.0, None, 1.0]) == "1.00-2.00" and span([3.0]) == "3.00" and span([]) == "not measured"
    rows = [dict(a=1, b="x"), dict(a=2, b="y")]
    assert select(rows, a=lambda v: v > 1) == [rows[1]] and select(rows, b="x") == [rows[0]]


def test_summarize_spread():
    t = summarize([float(v) for v in range(1, 11)], "graph")
    assert (t.median_us, t.min_us, t.max_us, t.n, t.graph) == (5.5, 1.0, 10.0, 10, True)
    assert t.p20_us == pytest.approx(2.8) and t.p80_us == pytest.approx(8.2)
    assert t.fields() == dict(us=5.5, us_lo=t.p20_us, us_hi=t.p80_us)
    one = summarize([4.0], "eager")
    assert (one.p20_us, one.p80_us, one.graph) == (4.0, 4.0, False)


def test_a_new_graph_replays_for_its_settling_time_before_samples():
    """_settle replays at least `least` times and until `seconds` have passed, syncing each."""
    import time
    calls = []
    _settle(lambda: calls.append("replay"), lambda: calls.append("sync"), seconds=0.0, least=3)
    assert calls == ["replay", "sync"] * 3
    n = []
    t0 = time.perf_counter()
    _settle(lambda: (n.append(1), time.sleep(0.002)), lambda: None, seconds=0.03, least=1)
    assert time.perf_counter() - t0 >= 0.03 and 3 <= len(n) <= 16


def test_rotations_leave_l2():
    h100, h200 = 50 << 20, 60 << 20
    assert rotations(1 << 20, h100) == 32  # capped
    assert rotations(30 << 20, h100) == 4  # 4 x 30 MB > 2 x 50 MB
    assert (rotations(26 << 20, h100), rotations(26 << 20, h200)) == (4, 5)
    assert rotations(1 << 30, h100) == 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if torch.cuda.is_available() else L2_BYTES
    assert rotations(26 << 20) == rotations(26 << 20, l2)  # the GPU's own L2 by default


def test_host_cost_analysis_takes_a_skipped_model():
    """A model the time budget skipped leaves a row with no T (H100 part 1 at 24223fa lost its
    whole host_cost result to a KeyError there): its targets read as missing, the rest stand."""
    from shufflemoe.bench.suites import host_cost

    rows = [dict(model="qwen3", T=1, impl="shufflemoe (graph_buckets=None)", side="ours",
                 mode="eager", us=80.0),
            dict(model="gpt-oss", impl="shufflemoe", side="ours", note="skipped: time budget")]
    a = host_cost.analyse(rows)
    met = {t["target"].split(":")[0]: t["met"] for t in a.targets}
    assert met["qwen3 T=1 eager host us per block call"]
    assert not met["gpt-oss T=1 eager host us per block call"]  # not measured
    assert any(h["what"].startswith("host-cost targets") for h in a.headlines)
