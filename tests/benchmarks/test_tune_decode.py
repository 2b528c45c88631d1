"""A CPU dry run of benchmarks/tune_decode.py (the interpreter, tiny shapes, no timing): every
candidate compiles and passes its check, a table is written in the form configs reads, and the
layer rows run with it, so the one GPU call does not fail on a typo."""

from __future__ import annotations

import pytest
import torch

from dry_run import dry_run


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    result = dry_run("tune_decode", tmp_path)
    assert not result["errors"], result["errors"]
    assert all(not r["failed"] and r["ran"] for r in result["compile"])
    assert {(r["preset"], r["gemm"]) for r in result["sweep"]} >= {
        ("llama4-shared-tp8", "gate_up"), ("qwen3-30b-a3b", "down")}
    assert {r["dtype"] for r in result["layer"]} == {"bf16", "fp8", "w8a16"}
    # fp8 rowwise's one-pair down candidates (and only they) run on a's fp32 rows, as the layer
    # runs them (configs.down_quantizes)
    fp8_down = [r for r in result["sweep"] if r["dtype"] == "fp8" and r["gemm"] == "down"]
    assert fp8_down and all(r["a_fp32"] and all(lab.endswith(" gemv") for lab in r["a_fp32"])
                            for r in fp8_down)
    assert not any(r["a_fp32"] for r in result["sweep"] if r["dtype"] != "fp8")
    # ... and where the best down is an MMA tile (the dry run ranks those tiles last), the
    # fastest of them is judged in the layer as the alt row
    assert all(r["alt"] in r["a_fp32"] and r["best"] not in r["a_fp32"] for r in fp8_down)
    fp8_layer = [r for r in result["layer"] if r["dtype"] == "fp8"]
    assert fp8_layer and all("alt_us" in r and "alt_pdl_us" in r for r in fp8_layer)
    assert not any("alt_us" in r for r in result["layer"] if r["dtype"] != "fp8")
    # the shared expert's row at A = 4 judged in Scout's layer at T = 4 (unmerged), not A = 1's
    # (Scout merges its shared expert at T = 1)
    shared = [r for r in result["layer"] if r["preset"] == "llama4-shared-tp8 in scout-tp8"]
    assert [(r["T"], eval(r["key"])[1:]) for r in shared] == [(4, (1, 64, 32, "bfloat16", 4))]
    table: dict = {}
    exec((tmp_path / "tuned.py").read_text(), table)  # the module configs imports
    assert len(table["TABLE"]) == len(result["table"]) == 5
    assert sum(key[4] == "fp8_w8a16" for key in table["TABLE"]) == 1
    for key, (gate_up, down, pdl) in table["TABLE"].items():
        assert len(key) == 6 and len(gate_up) == len(down) == 6 and pdl in (True, False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_layer_only_dry_run_keeps_the_tiles(tmp_path):
    """--layer-only sweeps nothing and writes the committed table back, every row with its PDL
    bit (the dry run's tiny shapes hold no row, so every bit stays as committed)."""
    from shufflemoe.ops.moe_decode import configs

    result = dry_run("tune_decode", tmp_path, "--layer-only", result="tune_decode_pdl")
    assert not result["errors"] and not result["sweep"] and not result["compile"]
    assert {r["dtype"] for r in result["layer"]} == {"bf16", "fp8", "w8a16"}
    table: dict = {}
    exec((tmp_path / "tuned.py").read_text(), table)
    assert table["TABLE"] == configs.TABLE


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_one_dtype_keeps_the_other_rows(tmp_path):
    """--dtypes w8a16 sweeps that format alone: the committed rows of the others stay, its own
    row is added, the results take the dtype's name, and tuned.py keeps the committed
    provenance and adds the run's."""
    from shufflemoe.ops.moe_decode import configs, tuned

    result = dry_run("tune_decode", tmp_path, "--dtypes", "w8a16", result="tune_decode_w8a16")
    assert not result["errors"]
    assert {(r["preset"], r["dtype"]) for r in result["sweep"]} == {("qwen3-30b-a3b", "w8a16")}
    table: dict = {}
    source = (tmp_path / "tuned.py").read_text()
    exec(source, table)
    new = {k: v for k, v in table["TABLE"].items() if k not in configs.TABLE}
    assert [k[4] for k in new] == ["fp8_w8a16"]
    assert {k: v for k, v in table["TABLE"].items() if k in configs.TABLE} == configs.TABLE
    doc = table["__doc__"]
    assert tuned.__doc__.strip().splitlines()[9] in doc  # the committed provenance's first line
    assert "Rows of fp8_w8a16 swept (--dtypes)" in doc and "tune_decode_w8a16.md" in doc


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_a_named_gpu_gets_rows_of_its_own(tmp_path):
    """On a GPU other than the base table's (--as-device stands in for the name), a run writes
    BY_DEVICE[name] and leaves the base table and its provenance as committed; --results names
    the folder in the new provenance line; --presets sweeps those presets alone."""
    from shufflemoe.ops.moe_decode import configs, tuned

    result = dry_run("tune_decode", tmp_path, "--dtypes", "bf16", "--presets", "qwen3-30b-a3b",
                     "--as-device", "Fake GPU", "--results", "benchmarks/results/fake",
                     result="tune_decode_bf16_qwen3-30b-a3b")
    assert {(r["preset"], r["dtype"]) for r in result["sweep"]} == {("qwen3-30b-a3b", "bf16")}
    assert not result["errors"] and result["table_of"] == "Fake GPU"
    table: dict = {}
    exec((tmp_path / "tuned.py").read_text(), table)
    assert table["TABLE"] == configs.TABLE and table["BASE_DEVICE"] == tuned.BASE_DEVICE
    assert set(table["BY_DEVICE"]) == {"Fake GPU", *tuned.BY_DEVICE}
    assert [k[1:5] for k in table["BY_DEVICE"]["Fake GPU"]] == [(16, 64, 32, "bfloat16")]
    doc = table["__doc__"]
    assert tuned.__doc__.strip() in doc.strip()  # every committed line kept
    line = " ".join(ln.strip() for ln in doc.splitlines())
    assert ("BY_DEVICE['Fake GPU']: Rows of bf16 for qwen3-30b-a3b swept (--dtypes, --presets) on"
            in line)
    assert "benchmarks/results/fake/tune_decode_bf16_qwen3-30b-a3b.md" in line


def test_skipped_cases_named_in_the_provenance():
    """What the deadlines left out goes into tuned.py's provenance line: whole presets, single
    A buckets, layer verdicts (T)."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    assert tune_decode.skipped_text([]) == ""
    text = tune_decode.skipped_text([
        dict(phase="time", case=["qwen3-30b-a3b", "bf16", 16]),
        dict(phase="time", case=["mixtral-tp2", "fp8", [2, 4]]),
        dict(phase="layer", case=["scout-tp8", "bf16", 64])])
    assert text == (" Not swept (out of time): qwen3-30b-a3b bf16 A = 16, mixtral-tp2 fp8; not "
                    "judged in the layer (out of time): scout-tp8 bf16 T = 64.")


def test_overrides_vary_the_judged_row_alone():
    """The layer phase's overrides (functions of the key) vary the judged row and nothing else:
    a shared expert's launches (E = 1, bf16 beside fp8_w8a16 experts) and other buckets keep
    what the layer plans, in its own format, in every variant."""
    import pathlib
    import sys

    from shufflemoe import preset
    from shufflemoe.ops import FP8_DTYPE
    from shufflemoe.ops.moe_decode import configs

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    cfg = preset("llama4-scout", tp=8).replace(quantization="fp8_w8a16")
    routed, shared = (8, 16, 5120, 1024, FP8_DTYPE, 132), (8, 1, 5120, 1024, torch.bfloat16, 132)
    other = (2, 16, 5120, 1024, FP8_DTYPE, 132)
    key = configs.table_key(*routed, quant="fp8_w8a16")
    assert configs.planned(routed, "fp8_w8a16") != configs.w8a16_rule(routed)  # a row to judge
    pdl, untuned = (tune_decode.judged(key, cfg, v) for v in ("tuned_pdl", "untuned"))
    row = ((8, 1024, 1, 4, 2, 1), (16, 512, 1, 4, 2, 1), True)
    before = tune_decode.judged(key, cfg, "committed", committed=row)
    assert pdl(routed) == configs.planned(routed, "fp8_w8a16").with_(pdl=True)
    assert untuned(routed) == configs.w8a16_rule(routed)
    assert before(routed) == configs.DecodeConfig(configs.GemmConfig(*row[0]),
                                                  configs.GemmConfig(*row[1]), pdl=True)
    for choose in (pdl, untuned, before):
        assert choose(shared) == configs.planned(shared) == configs.select(*shared)
        assert choose(other) == configs.planned(other, "fp8_w8a16")
    assert configs.planned(shared, "fp8_w8a16") != configs.planned(shared)  # what it once took


def test_judge_keeps_rows_the_layer_is_faster_with():
    """judge: a row stays only where the layer was over KEEP_MARGIN faster with it (PDL as
    measured) than with the untuned tiles, on the sums over the T that share it; PDL where it
    was faster by over 0.5%; rows no layer row ran with stay untouched; NaN times (dry run) keep
    the row."""
    import math
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    g = ((4, 2048, 1, 4, 2, 1), (16, 1024, 1, 4, 2, 1))
    table = {"shared by T = 1, 2": (*g, False), "slower": (*g, True), "pdl": (*g, False),
             "not run": (*g, True), "dry": (*g, True)}
    layer = [dict(key="shared by T = 1, 2", T=1, tuned_us=26.0, tuned_pdl_us=27.0, untuned_us=28.0),
             dict(key="shared by T = 1, 2", T=2, tuned_us=38.0, tuned_pdl_us=38.0, untuned_us=37.0),
             dict(key="slower", T=1, tuned_us=29.9, tuned_pdl_us=29.8, untuned_us=30.0),
             dict(key="pdl", T=4, tuned_us=50.0, tuned_pdl_us=45.0, untuned_us=55.0),
             dict(key="dry", T=1, tuned_us=math.nan, tuned_pdl_us=math.nan, untuned_us=math.nan),
             dict(key="no row", T=8, tuned_us=10.0, tuned_pdl_us=10.0, untuned_us=10.0)]
    dropped: list = []
    tune_decode.judge(table, layer, dropped)
    # 64.0 against 65.0: 1.5% faster over both T (T = 2 alone was slower); 29.8 vs 30.0: 0.7%
    assert table == {"shared by T = 1, 2": (*g, False), "pdl": (*g, True),
                     "not run": (*g, True), "dry": (*g, False)}
    assert [(d["key"], d["T"]) for d in dropped] == [("slower", [1])]
    assert [(r["row"], r["pdl"]) for r in layer] == [
        ("kept", False), ("kept", False), ("dropped", False), ("kept", True), ("kept", False),
        ("no row", False)]


def test_judge_takes_the_alt_row_where_the_layer_is_faster_with_it():
    """judge with alt rows (fp8 rowwise's one-pair down on fp32 rows): the alt row replaces the
    swept row where the layer was faster with it, PDL as chosen, by over 0.5% on the sums over
    its T; it must still beat the untuned tiles by KEEP_MARGIN; keys without layer alt times
    keep the swept row."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    g = ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 4, 3, 16))
    a = (g[0], (32, 512, 1, 4, 2, 1))
    table = {k: (*g, False) for k in ("merged", "close", "both lose", "no alt times")}
    alts = {k: (*a, False) for k in table}
    t = dict(tuned_pdl_us=100.0, untuned_us=100.0)
    layer = [dict(key="merged", T=1, tuned_us=24.3, alt_us=21.0, alt_pdl_us=20.5, **t),
             dict(key="merged", T=2, tuned_us=32.0, alt_us=33.1, alt_pdl_us=33.0, **t),
             dict(key="close", T=1, tuned_us=30.0, alt_us=29.9, alt_pdl_us=29.95, **t),
             dict(key="both lose", T=1, tuned_us=99.5, alt_us=99.4, alt_pdl_us=99.6, **t),
             dict(key="no alt times", T=1, tuned_us=50.0, **t)]
    dropped: list = []
    tune_decode.judge(table, layer, dropped, alts)
    # merged: 53.5 (alt, PDL) against 56.3 over T = 1, 2, though T = 2 alone was slower with it
    assert table == {"merged": (*a, True), "close": (*g, False), "no alt times": (*g, False)}
    assert [(d["key"], d["tuned_us"], d["row"]) for d in dropped] == [
        ("both lose", 99.5, (*g, False))]
    assert [(r["row"], r["pdl"]) for r in layer] == [
        ("kept: alt", True), ("kept: alt", True), ("kept", False), ("dropped", False),
        ("kept", False)]


def test_judge_keeps_the_committed_row_unless_a_change_wins_by_the_margin():
    """judge with the committed table: new tiles, another PDL bit or a drop replace the
    committed row only where the layer was over KEEP_MARGIN faster than with it (layer rows
    "committed_us"); else the committed row stays, its PDL bit as committed; keys without a
    committed row are judged against the untuned tiles alone; NaN (dry run) takes the change."""
    import math
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    g = ((4, 2048, 1, 4, 2, 1), (32, 256, 1, 4, 2, 1))  # this run's tiles
    c = ((4, 2048, 1, 4, 2, 1), (16, 512, 1, 4, 2, 1))  # the committed tiles
    committed = {"tiles lose": (*c, True), "tiles win": (*c, False), "close": (*c, False),
                 "drop by noise": (*g, True), "drop wins": (*g, False),
                 "pdl by noise": (*g, True), "pdl wins": (*g, True), "same": (*g, False),
                 "dry": (*c, True)}
    table = {k: (*g, False) for k in list(committed) + ["new key"]}
    t = lambda tuned, pdl, untuned, before=None: dict(  # noqa: E731
        tuned_us=tuned, tuned_pdl_us=pdl, untuned_us=untuned,
        **({} if before is None else dict(committed_us=before)))
    layer = [dict(key="tiles lose", T=1, **t(30.0, 30.1, 33.0, 29.8)),
             dict(key="tiles win", T=1, **t(28.0, 28.5, 33.0, 29.8)),
             dict(key="close", T=1, **t(29.6, 29.9, 33.0, 29.8)),
             dict(key="drop by noise", T=16, **t(131.7, 131.0, 131.8, 131.0)),
             dict(key="drop wins", T=1, **t(50.0, 50.0, 45.0, 50.0)),
             dict(key="pdl by noise", T=4, **t(59.5, 60.0, 62.0, 60.0)),
             dict(key="pdl wins", T=4, **t(58.6, 60.1, 62.0, 60.1)),
             dict(key="same", T=1, **t(30.0, 31.0, 35.0, 30.0)),
             dict(key="dry", T=1, **t(math.nan, math.nan, math.nan, math.nan)),
             dict(key="new key", T=1, **t(30.0, 31.0, 35.0))]
    dropped: list = []
    tune_decode.judge(table, layer, dropped, committed=committed)
    assert table == {"tiles lose": (*c, True), "tiles win": (*g, False), "close": (*c, False),
                     "drop by noise": (*g, True), "pdl by noise": (*g, True),
                     "pdl wins": (*g, False), "same": (*g, False), "dry": (*g, False),
                     "new key": (*g, False)}
    assert [d["key"] for d in dropped] == ["drop wins"]
    assert [r["row"] for r in layer] == [
        "kept: committed", "kept", "kept: committed", "kept: committed", "dropped",
        "kept: committed", "kept", "kept", "kept", "kept"]


def test_drop_stale_drops_rows_no_case_names():
    """drop_stale: rows of a covered (SMs, format) that no case names go; other formats' rows,
    other GPUs' rows and named rows stay."""
    import math
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    row = ((4, 2048, 1, 4, 2, 1), (16, 1024, 1, 4, 2, 1), False)
    named = {(132, 16, 5120, 1024, "fp8_w8a16", 1)}
    table = {k: row for k in [*named, (132, 1, 5120, 1024, "fp8_w8a16", 1),
                              (132, 1, 5120, 1024, "bfloat16", 1), (114, 1, 5120, 1024, "fp8_w8a16", 1)]}
    dropped: list = []
    tune_decode.drop_stale(table, named, dropped)
    assert set(table) == {*named, (132, 1, 5120, 1024, "bfloat16", 1), (114, 1, 5120, 1024, "fp8_w8a16", 1)}
    assert [(d["key"], d["why"]) for d in dropped] == [(str((132, 1, 5120, 1024, "fp8_w8a16", 1)), "no case")]
    assert math.isnan(dropped[0]["tuned_us"])
    # a run of some presets only: rows of other shapes of the same format stay
    table = {k: row for k in [*named, (132, 1, 5120, 1024, "fp8_w8a16", 1),
                              (132, 16, 5120, 1024, "fp8_w8a16", 2)]}
    tune_decode.drop_stale(table, named, dropped, every_preset=False)
    assert set(table) == {*named, (132, 1, 5120, 1024, "fp8_w8a16", 1)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_shared_judge_runs_the_shared_rows():
    """shared_judge: Scout's layer at the T where its shared expert has launches of its own
    (not T = 1, 2, merged under the layer phase's switch), and there the layer asks for the
    shared expert's key (E = 1, A = T) beside the routed experts', so varying it times it."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode
    from decode_check import inputs

    from shufflemoe.ops import use_impl
    from shufflemoe.ops.moe_decode import configs

    layers, Ts = tune_decode.shared_judge("bf16", True, "cpu", [1, 2, 4, 8])
    assert Ts == [4, 8]
    cfg, seen = layers[0].config, []

    def record(k):
        seen.append(k)
        return configs.planned(k, tune_decode.quant_at(k, cfg))
    with use_impl("triton"), configs.override(configs.ALWAYS), configs.override(record):
        layers[0](inputs(cfg, 4, "cpu", 1)[0])
    assert {(k[0], k[1]) for k in seen} == {(4, 1), (4, cfg.num_experts)}


def test_markdown_gives_the_weights_share_of_the_read_ceiling():
    """A GEMM streaming 40 MB in 10 us reads at 4000 GB/s: 100% of a 4000 GB/s ceiling (the
    renderer once divided MB per us by GB/s and printed 0 in every row)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "tune_decode.py"
    spec = importlib.util.spec_from_file_location("tune_decode_md", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    row = dict(preset="p", dtype="fp8", A=8, gemm="gate_up", best="b", best_us=10.0,
               untuned_us=20.0, weight_mb=40.0)
    md = mod.markdown(dict(meta={}, ceilings=dict(read_gbps=4000.0), sweep=[row], layer=[],
                           dropped=[], errors=[], skipped=[]))
    assert "| p | fp8 | 8 | gate_up | b | 10.0 | 100 | 20.0 | 50 | 2.00 |" in md


def test_keep_unjudged_keeps_committed_rows_no_layer_row_read():
    """keep_unjudged: a swept key that no layer row read (Maverick bf16 A = 1, whose T = 1
    reads A = 2 with the shared expert merged) keeps its committed row; keys the layer read,
    and keys without a committed row, keep what the sweep (and judge) left."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import tune_decode

    g = ((8, 1024, 1, 8, 2, 1), (32, 256, 1, 4, 2, 1), False)  # this run's tiles
    c = ((4, 2048, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), True)  # the committed tiles
    committed = {"unread": c, "read": c, "same": g}
    table = {"unread": g, "read": g, "same": g, "new": g}
    kept = tune_decode.keep_unjudged(table, committed, ["unread", "read", "same", "new", "read"],
                                     [dict(key="read", T=1)])
    assert table == {"unread": c, "read": g, "same": g, "new": g}
    assert kept == [dict(key="unread", swept=g, committed=c)]
    md = tune_decode.markdown(dict(meta={}, ceilings={}, sweep=[], layer=[], dropped=[],
                                   unjudged=kept, errors=[], skipped=[]))
    assert f"kept as committed (the sweep's tiles in brackets): unread [{g}]" in md
