"""What the built distributions carry, read from the build configuration (nothing is built
here; `python -m build` plus `tar tzf` / `unzip -l` showed it once by hand): the package and
its license file, never the checkout's tests, benchmarks or examples, whose test modules
import ``tests.conftest`` and cannot run from an sdist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f))


def test_the_license_file_ships_with_the_license_expression() -> None:
    config = _pyproject()
    project = config["project"]
    assert isinstance(project, dict)
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    # PEP 639's license expression and license-files need setuptools 77
    assert "setuptools>=77" in config["build-system"]["requires"]  # type: ignore[index]


def test_only_the_package_is_shipped() -> None:
    tool = _pyproject()["tool"]
    assert tool["setuptools"]["packages"]["find"]["include"] == ["alkstore_sa*"]  # type: ignore[index]
    # setuptools puts tests/test*.py into an sdist by default: MANIFEST.in takes them out
    pruned = {line.split()[1] for line in (ROOT / "MANIFEST.in").read_text().splitlines() if line.startswith("prune ")}
    assert {"tests", "benchmarks", "examples"} <= pruned


def test_the_version_the_command_prints_is_the_distributions() -> None:
    """``alkstore --version`` prints ``alkstore_sa.__version__``: the one in pyproject.toml."""
    import alkstore_sa

    project = _pyproject()["project"]
    assert isinstance(project, dict) and project["version"] == alkstore_sa.__version__


def test_the_install_guide_lists_every_extra() -> None:
    """docs/install.md's install commands name every optional extra the package declares
    (it listed postgres, metrics and flask, not tracing: a reader of the install guide did
    not learn that `alkstore_sa.tracing` needs `alkstore-sa[tracing]` until its import
    failed)."""
    extras = set(_pyproject()["project"]["optional-dependencies"]) - {"dev"}  # type: ignore[index]
    install = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    commands = install.split("```sh\n", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"pip install 'alkstore-sa\[(\w+)\]'", commands))
    assert listed == extras, sorted(extras - listed)
