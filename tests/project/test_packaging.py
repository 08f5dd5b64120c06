"""What ``pip install .`` puts in the wheel: every package folder of ggmlpy, with its data files.

The package list comes from ``[tool.setuptools.packages.find]`` in pyproject.toml; a folder it misses
would import from a source checkout (and an editable install) but be absent from a real install.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")


def _package_dirs(root: Path) -> set[str]:
    return {".".join(p.parent.relative_to(root).parts) for p in (root / "ggmlpy").rglob("__init__.py")
            if "__pycache__" not in p.parts}


def found_packages(config: dict, root: Path) -> set[str]:
    from setuptools import find_packages
    find = config["tool"]["setuptools"]["packages"]["find"]
    return set(find_packages(where=str(root), include=find.get("include", ["*"]), exclude=find.get("exclude", ())))


def test_every_package_folder_goes_into_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    missing = _package_dirs(ROOT) - found_packages(config, ROOT)
    assert len(_package_dirs(ROOT)) >= 10 and not missing, f"left out of the wheel: {sorted(missing)}"


def test_the_check_sees_a_folder_left_out(tmp_path):
    for folder in ("ggmlpy", "ggmlpy/core", "ggmlpy/graph"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    narrow = {"tool": {"setuptools": {"packages": {"find": {"include": ["ggmlpy", "ggmlpy.core"]}}}}}
    assert _package_dirs(tmp_path) - found_packages(narrow, tmp_path) == {"ggmlpy.graph"}
