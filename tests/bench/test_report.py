"""Results files on the CPU: markdown with spreads, history appended (not overwritten), metadata,
the default output folder, the CLI's --list, the README section rebuilt from results."""

import importlib.util
import json
import pathlib

import pytest

from shufflemoe.bench import report
from shufflemoe.bench.run import default_out_dir, describe
from shufflemoe.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def doc(suite="s", us=10.0, run="r1"):
    meta = dict(report.metadata(), run_id=run)
    return dict(suite=suite, meta=meta, ceilings=dict(start=dict(read_gbps=3200.0, clocks={"clocks.sm": 1980.0}),
                                                      end=dict(read_gbps=3100.0), used=dict(read_gbps=3200.0)),
                notes="n", headlines=[dict(what="w", result="r")],
                targets=[dict(target="t: >= 1x", measured=1.5, met=True)],
                ratios=[dict(case="c", ours="o", peer="p", modes="graph vs graph", like_for_like=True,
                             ratio=2.0, ratio_lo=1.8, ratio_hi=2.2, best_peer=True)],
                rows=[dict(case="c", impl="o", us=us, us_lo=us - 1, us_hi=us + 1)])


def test_metadata_names_what_produced_the_numbers(monkeypatch):
    monkeypatch.setattr(report, "_RUN_ID", None)
    monkeypatch.setenv("SHUFFLEMOE_RUN_ID", "call-7")
    meta = report.metadata()
    for key in ("run_id", "date", "commit", "source_digest", "torch", "triton", "transformers", "gpu"):
        assert key in meta
    assert meta["run_id"] == "call-7" and meta["transformers"]


def test_cells_show_the_spread():
    assert report.cell(dict(us=191.84, us_lo=90.24, us_hi=193.15), "us") == "191.8 [90.2, 193.2]"
    assert report.cell(dict(us=1234.5), "us") == "1234.5"
    assert report.cell(dict(met=False), "met") == "False"
    table = report.markdown_table([dict(a=1.0, a_lo=0.5, a_hi=1.5, b="x|y")])
    assert table.splitlines()[0] == "| a | b |" and "1 [0.5, 1.5]" in table and "x/y" in table


def test_results_and_history(tmp_path):
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "s.jsonl").write_text(json.dumps(doc(run="old")) + "\n")
    out = tmp_path / "run"
    report.write_results(doc(run="r1"), out, history_from=committed)
    report.write_results(doc(us=12.0, run="r2"), out, history_from=committed)
    history = [json.loads(line) for line in (out / "history" / "s.jsonl").read_text().splitlines()]
    assert [h["meta"]["run_id"] for h in history] == ["old", "r1", "r2"]  # appended, seeded once
    assert json.loads((out / "s.json").read_text())["rows"][0]["us"] == 12.0  # the latest run
    md = (out / "s.md").read_text()
    for part in ("## Ceilings", "## Headlines", "## Targets", "## Like-for-like ratios", "12 [11, 13]", "run r2"):
        assert part in md
    assert (committed / "s.jsonl").read_text().count("\n") == 1  # the committed history untouched


def test_default_out_dir_is_new_and_outside_the_repository(monkeypatch):
    monkeypatch.setattr(report, "_RUN_ID", "abc")
    d = default_out_dir()
    assert d.name == "abc" and not d.exists()
    assert ROOT not in d.resolve().parents and d.resolve() != (ROOT / "benchmarks" / "results").resolve()


def test_bench_list_names_every_suite_with_its_part(capsys):
    assert main(["bench", "--list"]) == 0
    text = capsys.readouterr().out
    for name in ("index_shuffle", "token_movement", "grouped_gemm", "grouped_gemm_sweep", "layer", "e2e_hf"):
        assert name in text
    assert "part 1:" in text and "part 2:" in text and text == describe() + "\n"


def test_readme_section_from_results(tmp_path):
    spec = importlib.util.spec_from_file_location("readme_results", ROOT / "benchmarks" / "readme_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = tmp_path / "results"
    results.mkdir()
    for suite in ("layer", "e2e_hf"):
        d = doc(suite)
        d["headlines"] = [dict(what=f"{suite} headline", result="1.20-1.50x")]
        d["targets"] = [dict(target="a: >= 1x", measured=2.0, met=True),
                        dict(target="b: >= 1x", measured=0.5, met=False)]
        if suite == "e2e_hf":  # the host's speed, recorded since 2026-12-04 (layer's run: not)
            d["ceilings"]["start"]["host_loop_ms"], d["ceilings"]["end"]["host_loop_ms"] = 6.4, 11.9
            d["rows"].append(dict(model="m", phase="decode", batch=64, impl="o", us=5.0,
                                  check="logits rel L2 0.12"))
        (results / f"{suite}.json").write_text(json.dumps(d))
    stale = doc("layer")  # a suite's results kept under another name (a reverted run's copy)
    stale["headlines"] = [dict(what="stale headline", result="9.99x")]
    (results / "layer_kept.json").write_text(json.dumps(stale))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{mod.BEGIN}\nold\n{mod.END}\nrest\n")
    mod.main(["--results", str(results), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "layer headline" in text and "e2e_hf headline" in text and "stale" not in text
    assert "met 1 of 2; missed: b" in text  # misses listed next to hits
    speed = [line for line in text.splitlines() if line.startswith("Host speed")]
    assert len(speed) == 1 and speed[0].endswith(": e2e_hf 6.4 / 11.9.")
    failed = [line for line in text.splitlines() if "failed checks" in line]
    assert len(failed) == 1 and "m decode 64 o: logits rel L2 0.12" in failed[0]
    with pytest.raises(SystemExit):
        mod.main(["--results", str(tmp_path / "none"), "--readme", str(readme)])
    # a second section of its own markers (another GPU's runs): the first stays as it was
    begin, end = mod.markers("measured-h200")
    readme.write_text(text + f"{begin}\nold\n{end}\n")
    (results / "probe_x.json").write_text(json.dumps(dict(meta={}, rows=[])))  # not a suite's
    mod.main(["--results", str(results), "--readme", str(readme), "--marker", "measured-h200"])
    second = readme.read_text()
    assert second.startswith(text) and "old" not in second and second.count("layer headline") == 2
    assert f"`{results}/*.md`" in second.split(begin, 1)[1]


def test_runner_judges_each_suite_against_its_start_and_end_ceilings(tmp_path, monkeypatch):
    """The run's flow on the CPU with a fake suite and fake ceilings: the rows are judged against
    the higher of the start and end measurements, both are written, history is appended."""
    from shufflemoe._registry import Registry
    from shufflemoe.bench import run as runner
    from shufflemoe.bench.analysis import ratios
    from shufflemoe.bench.ceilings import Ceilings
    from shufflemoe.bench.suites import Analysis, Suite, SuiteResult

    measured = iter([Ceilings(3000.0, 2900.0, 700.0, 1300.0, {"clocks.sm": 1980.0}, 6.5),
                     Ceilings(3200.0, 2800.0, 750.0, 1200.0, {"clocks.sm": 1755.0}, 12.25)])

    def fake(ctx):
        rows = [dict(case="c", impl="ours", side="ours", mode="graph", us=100.0, us_lo=99.0, us_hi=101.0,
                     read_bytes=3.2e8, bound="read"),
                dict(case="c", impl="torch", side="peer", mode="graph", us=150.0, us_lo=149.0, us_hi=151.0)]
        return SuiteResult(rows, lambda rs: Analysis(ratios(rs, ["case"]), [], [dict(what="w", result="r")]))

    suites = Registry("benchmark suite")
    suites.register("fake")(Suite(fake, "a fake suite", 1, 1))
    monkeypatch.setattr(runner, "SUITES", suites)
    monkeypatch.setattr(runner, "load_suites", lambda: suites.names())
    monkeypatch.setattr(runner, "measure_ceilings", lambda: next(measured))
    meta = dict(report.metadata(), gpu="fake")
    monkeypatch.setattr(runner, "metadata", lambda: meta)
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    assert runner.run(None, str(tmp_path), history_from=None) == 0
    d = json.loads((tmp_path / "fake.json").read_text())
    assert d["ceilings"]["start"]["read_gbps"] == 3000.0 and d["ceilings"]["end"]["read_gbps"] == 3200.0
    assert d["ceilings"]["used"] == dict(read_gbps=3200.0, copy_gbps=2900.0, bf16_tflops=750.0,
                                         fp8_tflops=1300.0, clocks={}, host_loop_ms=None)
    assert d["ceilings"]["end"]["clocks"]["clocks.sm"] == 1755.0
    # the host's speed at each measurement, in the json and in the markdown's ceilings table
    assert (d["ceilings"]["start"]["host_loop_ms"], d["ceilings"]["end"]["host_loop_ms"]) == (6.5, 12.2)
    table = (tmp_path / "fake.md").read_text().split("## Ceilings", 1)[1].split("\n\n", 2)[1]
    assert "host_loop_ms" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| 6.5 |") and table.splitlines()[3].endswith("| 12.2 |")
    assert d["rows"][0]["pct_read"] == pytest.approx(100.0)  # 320 MB in 100 us at the stricter 3.2 TB/s
    assert d["ratios"][0]["ratio"] == 1.5 and d["ratios"][0]["like_for_like"]
    assert len((tmp_path / "history" / "fake.jsonl").read_text().splitlines()) == 1
