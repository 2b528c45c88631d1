"""benchmarks/probe_merged_tiles.py on the CPU: a dry run (tiny shapes, the interpreter, one
candidate a part) finds the routed launches' keys, descends and checks each against float64; and
--write-table's tuned.py puts a key's best in TABLE, leaving every other row as it was."""

from __future__ import annotations

import pathlib

import pytest
import torch

from dry_run import dry_run

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_dry_run(tmp_path):
    result = dry_run("probe_merged_tiles", tmp_path, "--presets", "scout-tp8", "--dtypes", "bf16",
                     "fp8", "--tokens", "1", "2")
    rows = result["rows"]
    for dtype in ("bf16", "fp8"):  # T = 1 fused in both (merged); T = 2 (unfused in fp8 off the
        # H100) under one key at most
        Ts = sorted(T for r in rows if r["dtype"] == dtype for T in r["T"])
        assert Ts[0] == 1 and Ts in ([1], [1, 2]), (dtype, Ts)
    assert all(r["preset"] == "scout-tp8" for r in rows)
    for r in rows:
        assert r["check"] == ["ok"] * len(r["T"])
        assert {next(iter(t)) for t in r["tried"]} == {"down", "gate_up", "pdl"}
        assert all("error" not in t for t in r["tried"]), r["tried"]
        assert r["key"][4] == {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}[r["dtype"]]
    assert all(r["merged"] == [True] for r in rows if r["T"] == [1])  # Scout's shared expert


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_the_t_of_one_key_descend_together(tmp_path):
    """Mixtral (top-2) at T = 3 and 4: A = 6 and 8, one key (A rounds up to 8), one descent
    scored over both."""
    rows = dry_run("probe_merged_tiles", tmp_path, "--presets", "mixtral-tp2", "--dtypes",
                   "bf16", "--tokens", "3", "4")["rows"]
    assert [(r["T"], r["A"], r["key"][5]) for r in rows] == [([3, 4], [6, 8], 8)]
    assert rows[0]["check"] == ["ok", "ok"] and len(rows[0]["best_us"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself runs")
def test_keys_past_the_budget_are_named_not_tried(tmp_path):
    table = tmp_path / "new" / "cand_tuned.py"
    result = dry_run("probe_merged_tiles", tmp_path, "--presets", "scout-tp8", "--dtypes", "bf16",
                     "--tokens", "1", "2", "--budget", "0", "--write-table", str(table))
    assert result["rows"] == []  # so no row beat its own: tuned.py as it is
    assert table.read_text() == (BENCHMARKS.parent / "src/shufflemoe/ops/moe_decode/tuned.py"
                                 ).read_text()
    assert sorted(T for s in result["skipped"] for T in s["T"]) == [1, 2]


def test_write_table_replaces_one_row(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import probe_device_rows
    import probe_merged_tiles
    from shufflemoe.ops.moe_decode import configs

    key = next(k for k in configs.TABLE if k[4] == "float8_e4m3fn")
    tile = dict(block_n=16, block_k=512, split_k=2, num_warps=4, num_stages=2, block_m=1)
    new_key = (132, 3, 64, 32, "bfloat16", 4)  # no such row: appended
    path = tmp_path / "cand_tuned.py"
    probe_merged_tiles.write_table(path, [dict(key=list(key), best=[tile, tile, True]),
                                          dict(key=new_key, best=[tile, tile, False])])
    cand = probe_device_rows.load_tables(path)
    assert cand.TABLE[key] == ((16, 512, 2, 4, 2, 1), (16, 512, 2, 4, 2, 1), True)
    assert cand.TABLE[new_key] == ((16, 512, 2, 4, 2, 1), (16, 512, 2, 4, 2, 1), False)
    assert {k: v for k, v in cand.TABLE.items() if k not in (key, new_key)} == {
        k: v for k, v in configs.TABLE.items() if k != key}
    assert cand.BY_DEVICE == configs.BY_DEVICE
    assert probe_device_rows.differing(cand, "") == {key: configs.TABLE[key], new_key: None}


def test_routed_keys_skip_the_first_calls_reservation(monkeypatch):
    """On a GPU a layer's first call also reserves the fused kernels' arrival words, selecting a
    plan for every A the Switch fuses: the keys are those of a later call, its own A alone (the
    fifty-third session's descent spent its budget on Scout's reserved A = 5..80 at T = 1)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import probe_merged_tiles
    import tune_decode
    from shufflemoe.ops.moe_decode import configs

    cfg = tune_decode.PRESETS["scout-tp8"]
    E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    calls = []

    def layer(x):
        if not calls:  # as moe_decode.reserve on the first call
            for A in range(1, configs.Switch().max_pairs + 1):
                configs.select(A, E, D, I, torch.bfloat16, 132, "none", "")
        calls.append(x)
        return configs.select(2, E, D, I, torch.bfloat16, 132, "none", "")

    keys = probe_merged_tiles.routed_keys(cfg, layer, torch.ones(1), "")
    assert [k[0] for k in keys] == [2] and len(calls) == 2
