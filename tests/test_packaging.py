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
EXTRAS = {r.name: r for group in PROJECT["optional-dependencies"].values()
          for r in map(Requirement, group)}


@pytest.mark.parametrize("name, tested, untested", [
    ("torch", ["2.11.0+cu130", "2.12.1", "2.13.0+cpu"], ["2.10.0", "2.14.0"]),
    # 3.9 broke 107 interpreter tests ("mask has unsupported dtype")
    ("triton", ["3.6.0"], ["3.5.1", "3.7.0", "3.9.0"]),
])
def test_dependencies_are_bounded_to_the_tested_versions(name, tested, untested):
    spec = REQUIRES[name].specifier
    assert all(spec.contains(v) for v in tested), f"{name} {spec} excludes a tested version"
    assert not any(spec.contains(v) for v in untested), f"{name} {spec} admits an untested one"


@pytest.mark.parametrize("name, tested, untested", [
    # 9.2 came unbounded into a fresh install and its approx failed on tensors (fixed since)
    ("pytest", ["8.4.2", "9.0.3", "9.2.0"], ["9.3.0"]),
    ("hypothesis", ["6.155.2", "6.170.17"], ["6.171.0"]),
    ("pytest-xdist", ["3.8.0"], ["3.9.0"]),
    ("transformers", ["5.17.0"], ["5.16.3", "5.18.0"]),
])
def test_extras_are_bounded_to_the_tested_versions(name, tested, untested):
    spec = EXTRAS[name].specifier
    assert all(spec.contains(v) for v in tested), f"{name} {spec} excludes a tested version"
    assert not any(spec.contains(v) for v in untested), f"{name} {spec} admits an untested one"


def test_every_requirement_has_an_upper_bound():
    """A fresh machine resolves the newest release a range admits: every dependency and extra
    (what the README's two commands install) names the newest version it was tested on."""
    for req in list(REQUIRES.values()) + list(EXTRAS.values()):
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), req


def test_readme_commands_pin_what_they_name():
    """The README's two commands pin the packages they name (torch, triton, transformers)."""
    text = (ROOT / "README.md").read_text()
    installs = [part.split()[2:] for line in text.splitlines() if line.startswith("pip install")
                for part in line.split("&&") if part.split()[:2] == ["pip", "install"]]
    assert len(installs) == 4, installs
    for args in installs:
        for arg in args:
            if not arg.startswith(("-", ".", "'.")):  # a package by name, not the project
                assert "==" in arg, f"{arg!r} is not pinned: pip install {' '.join(args)}"


def test_installed_versions_are_within_the_bounds():
    import torch

    assert REQUIRES["torch"].specifier.contains(torch.__version__)
    triton = pytest.importorskip("triton")
    assert REQUIRES["triton"].specifier.contains(triton.__version__)
    from importlib.metadata import PackageNotFoundError, version

    for name, req in list(EXTRAS.items()) + [("numpy", REQUIRES["numpy"])]:
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue
        assert req.specifier.contains(installed), f"{name} {installed} is outside {req.specifier}"


def test_license_file_matches_the_metadata():
    assert PROJECT["license"] == {"text": "BSD-3-Clause"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the shufflemoe authors" in text
    assert "Neither the name of the copyright holder" in text
