"""The command line: usage errors are one line and exit 2, the help explains every option, and
the CPU demo runs with one torch thread (restored after)."""

from __future__ import annotations

import sys

import pytest
import torch

from shufflemoe import MoEConfig, __version__, cli
from shufflemoe.presets import MODELS


def _fails(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, says", [
    (["plan", "--tokens", "-5"], "argument --tokens: must be a positive integer, got -5"),
    (["plan", "--tokens", "many"], "argument --tokens: 'many' is not an integer"),
    (["plan", "--tp", "0"], "argument --tp: must be a positive integer, got 0"),
    (["plan", "--ep", "0"], "argument --ep: must be a positive integer, got 0"),
    (["plan", "--ep", "3"], "ep=3 must divide E"),
    (["plan", "--model", "llama5"], "argument --model: invalid choice: 'llama5'"),
    (["demo", "--device", "foo"], "argument --device: 'foo' is not a device"),
    (["demo", "--device", "mps"], "the demo runs on cpu or cuda"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, says, capsys):
    line = _fails(argv, capsys)
    assert line.startswith("shufflemoe") and "error:" in line and says in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_demo_on_cuda_without_a_gpu_is_a_usage_error(capsys):
    assert "no CUDA GPU on this machine" in _fails(["demo", "--device", "cuda"], capsys)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"shufflemoe {__version__}"


def test_plan_help_lists_the_models_and_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    names = out.replace("- ", "-")  # argparse may wrap a line after a name's hyphen
    assert all(model in names for model in MODELS)
    for option, words in [("--tokens", "tokens per rank"), ("--tp", "tensor-parallel ranks"),
                          ("--ep", "expert-parallel ranks"), ("--ep-mode", "all-to-all"),
                          ("--hw", "bandwidth"), ("--fp8", "fp8 rowwise")]:
        assert words in out, option


def test_plan_prints_every_strategy(capsys):
    assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s in ("shuffled", "blockwise", "selective"))


def test_demo_hf_without_transformers_says_what_to_install(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.startswith("shufflemoe.integrations.transformers")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    assert cli.main(["demo", "--hf"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs transformers" in err and "shufflemoe[hf]" in err


def test_cpu_demo_runs_with_one_thread_and_restores_the_count(monkeypatch, capsys):
    """With torch's default threads the demo took 47-188 s instead of 6-9 s on 2 cores with one
    busy (OpenMP spin-waits); a tiny layer here, the thread count seen while it runs."""
    tiny = MoEConfig(hidden_size=16, intermediate_size=8, num_experts=4, top_k=2)
    monkeypatch.setattr(cli, "DEMO_LAYERS", {"tiny": (tiny, {})})
    seen = []
    monkeypatch.setattr(cli, "_time_us", lambda fn, device, graph_ok: seen.append(
        torch.get_num_threads()) or 1.0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cli.main(["demo", "--device", "cpu"]) == 0
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert "tiny" in capsys.readouterr().out
