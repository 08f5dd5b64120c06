"""The public surface: ``ggmlpy/__init__.py`` is generated (``python tools/exports.py``) and current.

``__all__`` is a literal list a reviewer can read, every name in it is bound by an explicit import (so
IDEs and type checkers see it), each public function is wrapped by the guard, and a name defined in two
modules is exported from the one ``tools/exports.py`` names.
"""
from __future__ import annotations

import ast
import inspect

import pytest

import ggmlpy as G
from tests.helpers import load_script, ROOT


INIT = ROOT / "ggmlpy" / "__init__.py"


def _exports_tool():
    return load_script("tools/exports.py", "ggmlpy_exports_tool")


def test_init_is_what_the_generator_writes():
    assert INIT.read_text() == _exports_tool().render(), \
        "ggmlpy/__init__.py is stale: run `python tools/exports.py` and commit the result"


def test_all_is_a_literal_list_of_unique_names():
    tree = ast.parse(INIT.read_text())
    (assign,) = [n for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
    names = ast.literal_eval(assign.value)
    assert names == G.__all__ and len(names) == len(set(names)) and len(names) > 500


def test_every_exported_name_is_imported_explicitly():
    tree = ast.parse(INIT.read_text())
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert not [n for n in G.__all__ if n not in imported | assigned]


def test_public_functions_are_guarded_and_keep_their_help():
    for name in G.__all__:
        obj = getattr(G, name)
        if inspect.isfunction(obj):
            inner = obj.__wrapped__
            assert inner.__name__ == name or name in ("ggml_conv_1d", "ggml_conv_2d", "ggml_dropout"), name
            assert inspect.getdoc(obj) == inspect.getdoc(inner) and inspect.signature(obj) == inspect.signature(inner)


@pytest.mark.parametrize("name", ["ggml_conv_1d", "ggml_conv_2d", "ggml_dropout"])
def test_op_and_layer_clash_is_settled_by_the_model_layer(name):
    """The model layer's function takes both the op's (ctx, ...) call and the layer's."""
    assert G.__dict__[name].__wrapped__.__module__ == "ggmlpy.models.builders"


def test_a_new_clash_is_an_error(tmp_path, monkeypatch):
    tool = _exports_tool()
    pkg = tmp_path / "ggmlpy"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "x.py").write_text("def ggml_thing():\n    pass\n")
    (pkg / "a" / "y.py").write_text("ggml_thing = 1\n")
    monkeypatch.setattr(tool, "PACKAGE", str(pkg))
    monkeypatch.setattr(tool, "ROOT", str(tmp_path))
    with pytest.raises(SystemExit, match="ggml_thing is defined in ggmlpy.a.x and ggmlpy.a.y"):
        tool.public_names()
