"""The pure tests make no ggml call: the tests of tests/project/ (marked ``pure`` by tests/helpers/markers.py) pass
in a process where ggmlpy's compiled extension cannot be imported, nor in any process they start
(tests/helpers/no_ggml on ``PYTHONPATH``), so they run before ggml is built, where it cannot be, or as a first
check in seconds:

    PYTHONPATH=tests/helpers/no_ggml python -m pytest tests/project      # or, where ggml loads: -m pure
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from tests.helpers import ROOT
from tests.helpers.markers import PURE_FOLDERS


NO_GGML = ROOT / "tests" / "helpers" / "no_ggml"


def _env() -> dict[str, str]:
    paths = [str(NO_GGML), str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def test_where_the_extension_is_hidden_ggmlpy_cannot_be_imported():
    """The proof can fail: with tests/helpers/no_ggml on PYTHONPATH, importing ggmlpy raises, in the process and in
    a process it starts."""
    code = ("import subprocess, sys\n"
            "try:\n"
            "    import ggmlpy\n"
            "    print('IMPORTED')\n"
            "except ImportError as e:\n"
            "    print('HIDDEN', 'no_ggml' in str(e))\n"
            "child = subprocess.run([sys.executable, '-c', 'import ggmlpy'], capture_output=True, text=True)\n"
            "print('CHILD', child.returncode != 0 and 'no_ggml' in child.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["HIDDEN", "True", "CHILD", "True"], out.stdout + out.stderr


def test_the_pure_tests_run_where_ggml_cannot_load():
    me = f"{os.path.relpath(__file__, ROOT)}::test_the_pure_tests_run_where_ggml_cannot_load"
    folders = [str(ROOT / "tests" / f) for f in PURE_FOLDERS]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pure", *folders,
                          "--deselect", me], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.fullmatch(r"\d+ passed, 1 deselected in .*", summary), summary


def test_no_pure_test_module_imports_ggmlpy():
    """What the run above proves, found by reading: no module of a pure folder imports ggmlpy (at any depth)."""
    found = []
    for folder in PURE_FOLDERS:
        for path in sorted((ROOT / "tests" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "ggmlpy"]
    assert not found, f"pure test modules that import ggmlpy: {found}"
