"""What `pip install .` gets: dependency bounds that hold the versions tested, and the license
the metadata declares."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIRES = {r.name: r for r in map(Requirement, PROJECT["dependencies"])}


@pytest.mark.parametrize("name, tested, untested", [
    ("torch", ["2.11.0+cu130", "2.12.1", "2.13.0+cpu"], ["2.10.0", "2.14.0"]),
    # 3.9 broke 107 interpreter tests ("mask has unsupported dtype")
    ("triton", ["3.6.0"], ["3.5.1", "3.7.0", "3.9.0"]),
])
def test_dependencies_are_bounded_to_the_tested_versions(name, tested, untested):
    spec = REQUIRES[name].specifier
    assert all(spec.contains(v) for v in tested), f"{name} {spec} excludes a tested version"
    assert not any(spec.contains(v) for v in untested), f"{name} {spec} admits an untested one"


def test_installed_versions_are_within_the_bounds():
    import torch

    assert REQUIRES["torch"].specifier.contains(torch.__version__)
    triton = pytest.importorskip("triton")
    assert REQUIRES["triton"].specifier.contains(triton.__version__)


def test_license_file_matches_the_metadata():
    assert PROJECT["license"] == {"text": "BSD-3-Clause"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the shufflemoe authors" in text
    assert "Neither the name of the copyright holder" in text
