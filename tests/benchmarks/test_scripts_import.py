"""Every script in benchmarks/ imports names that exist: a probe whose library name was renamed
fails here, on the CPU, not in the one GPU call (probe_layer and probe_prefill still named the
layer suite's _dense_us five days after 97e43f6 made it _dense)."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
LOCAL = {p.stem for p in SCRIPTS}


def _imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """(module, name) for each ``from M import name`` of the library or of another script."""
    pairs = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module.split(".")[0] in LOCAL | {"shufflemoe"}):
            pairs += [(node.module, a.name) for a in node.names if a.name != "*"]
    return pairs


def test_scripts_found():
    assert len(SCRIPTS) > 10 and "decode_check" in LOCAL


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_imported_names_exist(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    missing = []
    for module, name in _imports(path):
        m = importlib.import_module(module)
        if not hasattr(m, name):
            try:  # a submodule not yet imported
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.name} imports names that do not exist: {missing}"
