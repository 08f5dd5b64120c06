"""Nothing lost: every public name and signature of a recorded release is still there (issue 41, item 6).

``api_a0551ef.json`` is the surface of a0551ef, the tree before the model layer's redesign, written by
``tools/api_surface.py`` with that install's interpreter; a caller of any of its names, by position or by keyword,
with or without its optional arguments, must find the same thing here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ggmlpy as G
from tests.helpers import load_script


def _tool():
    return load_script("tools/api_surface.py", "api_surface")


def test_every_name_and_signature_of_a0551ef_is_kept():
    tool = _tool()
    old = json.loads((Path(__file__).parent / "api_a0551ef.json").read_text())
    assert len(old) == 648 and "ggml_layer_dense" in old and "ggml_fit_opt_gen" in old
    assert tool.compatible(old, tool.surface(G)) == []


def f_base(a, b=1, *, c="x"):
    pass


def f_moved(b, a=1, *, c="x"):
    pass


def f_keyword_only(a, *, b=1, c="x"):
    pass


def f_new_default(a, b=2, *, c="x"):
    pass


def f_new_required(a, b=1, *, c="x", d):
    pass


def f_gone(a, *, c="x"):
    pass


def f_grown(a, b=1, e=None, *, c="x", d=0):
    pass


def f_pass_through(*args, **kwargs):
    pass


def f_optional_now(a=None, b=1, *, c="x"):
    pass


@pytest.mark.parametrize("now, problem", [
    (f_moved, "positional parameters ['a', 'b'] became ['b', 'a']"),
    (f_keyword_only, "parameter 'b' was POSITIONAL_OR_KEYWORD, is KEYWORD_ONLY"),
    (f_new_default, "parameter 'b': default 1 became 2"),
    (f_new_required, "new parameter 'd' has no default"),
    (f_gone, "parameter 'b' gone"),
    (None, "gone"),
])
def test_the_check_finds_each_kind_of_change(now, problem):
    tool = _tool()

    class Package:
        __all__ = ["f"]
        f = staticmethod(f_base)
    old = tool.surface(Package)
    Package.f = staticmethod(now) if now is not None else None
    if now is None:
        Package.__all__ = []
    assert any(p.endswith(problem) for p in tool.compatible(old, tool.surface(Package))), problem


@pytest.mark.parametrize("now", [f_base, f_grown, f_pass_through, f_optional_now])
def test_the_check_accepts_what_keeps_every_call_working(now):
    tool = _tool()

    class Package:
        __all__ = ["f"]
        f = staticmethod(f_base)
    old = tool.surface(Package)
    Package.f = staticmethod(now)
    assert tool.compatible(old, tool.surface(Package)) == []


def test_a_changed_constant_is_found():
    tool = _tool()
    assert tool.compatible({"K": {"kind": "value", "value": "1"}}, {"K": {"kind": "value", "value": "2"}}) == \
        ["K: value 1 became 2"]
