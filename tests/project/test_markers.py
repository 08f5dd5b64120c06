"""The markers hook (tests/helpers/markers.py): which tests it marks ``gpu``, ``vulkan``, ``cuda`` and ``pure``,
each rule on a made-up test (a rule that cannot fail proves nothing), and the markers pyproject.toml declares."""
from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT
from tests.helpers.markers import folder_of, markers_for


tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")


@pytest.mark.parametrize("name, params, fixtures, marks, expected", [
    ("test_sum", {}, [], [], set()),
    ("test_sum", {"device": "cpu", "n": 3}, ["rng"], [], set()),
    ("test_trains", {"backend": "Vulkan0"}, [], [], {"gpu", "vulkan"}),
    ("test_trains", {"family": "cuda"}, [], [], {"gpu", "cuda"}),
    ("test_trains", {"each_device": "CUDA0", "other": "vulkan"}, [], [], {"gpu", "cuda", "vulkan"}),
    ("test_copies", {}, ["cpu", "vulkan"], [], {"gpu", "vulkan"}),
    ("test_events_on_vulkan", {}, [], [], {"gpu", "vulkan"}),
    ("test_cuda_uses_tf32_only_when_asked", {}, [], [], {"gpu", "cuda"}),
    ("test_replicas", {}, [], ["vulkan", "parametrize"], {"gpu", "vulkan"}),
    # a word, a value: not parts of one ("vulkan-loader" is a library's name, "cudart" a file's)
    ("test_the_fix_named", {"library": "vulkan-loader", "module": "cudart"}, [], [], set()),
    ("test_vulkanised", {"count": 0}, ["vulkan_sdk"], [], set()),
])
def test_gpu_markers_follow_parameters_fixtures_names_and_marks(name, params, fixtures, marks, expected):
    assert markers_for("ops", name, params, fixtures, marks) == expected


def test_pure_is_the_pure_folders_alone():
    assert markers_for("project", "test_layout", {}, [], []) == {"pure"}
    assert markers_for("ops", "test_layout", {}, [], []) == set()
    assert markers_for("", "test_layout", {}, [], []) == set()


def test_the_folder_is_the_first_under_tests():
    assert folder_of(ROOT / "tests" / "models" / "layers" / "test_masking.py") == "models"
    assert folder_of(ROOT / "tests" / "project" / "test_layout.py") == "project"
    assert folder_of(ROOT / "tests" / "conftest.py") == ""
    assert folder_of(ROOT / "examples" / "train_digits.py") == ""


def test_pyproject_declares_every_marker_the_hook_sets():
    declared = {m.split(":")[0] for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
                ["ini_options"]["markers"]}
    assert {"gpu", "vulkan", "cuda", "pure"} <= declared
