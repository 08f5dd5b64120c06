"""Checked style that ruff and mypy do not see (both run in .ci/run; docs/guide/architecture.md lists the rules).

* ``Any`` annotations are counted: the count may fall, never grow (``ANY_CEILING``). C pointers are
  ``_ffi.CData``, arguments a function checks itself ``object``, the rest a real type, a Protocol or a TypedDict.
* Argument validators live in ``core/args.py`` (one validator per rule). Outside it, no module

  1. defines a name that ``core/args.py`` defines (a second ``bool_arg``, ``INT32_MAX``, ...);
  2. defines a function that only checks the kind of a parameter: its body is ``if`` statements whose test reads
     nothing but that parameter (``isinstance`` of plain kinds, ``is_int``/``is_real``, comparisons with
     literals or ``core/args`` constants), at least one of them its kind, and whose branch only raises, then at
     most a ``return`` of the parameter or of ``int``/``float``/``bool``/``str`` of it;
  3. defines a function whose body is one ``return`` of a call of a ``core/args`` function (a local alias of a
     validator, ``None if x is None else`` one included).

  A tier's own check (a device type, a padding name, a layer name) reads more than the kind of one value and is
  not caught; it calls ``core/args`` for the kind part.

``python tests/project/test_style.py`` prints every finding and the ``Any`` count.
"""
from __future__ import annotations

import ast
import os

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/project/ -> the root
PACKAGE = os.path.join(ROOT, "ggmlpy")
ANY_CEILING = 183  # 797 when issue 41 item 4 began (728 at a0551ef): lower it as more get their types


def python_files(root: str) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return out


# ---------------------------------------------------------------- Any

def _names_any(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    return any(isinstance(n, ast.Name) and n.id == "Any" or isinstance(n, ast.Attribute) and n.attr == "Any"
               for n in ast.walk(annotation))


def any_annotations(path: str) -> list[int]:
    """The lines of the annotations in ``path`` that are or contain ``Any`` (parameters, returns, variables)."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        annotations: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations += [arg.annotation for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                            if arg is not None and arg.annotation is not None]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        found += [node.lineno for ann in annotations if _names_any(ann)]
    return found


def any_count(root: str = PACKAGE) -> dict[str, list[int]]:
    return {os.path.relpath(p, ROOT): lines for p in python_files(root) if (lines := any_annotations(p))}


def test_any_annotations_do_not_grow_back():
    counts = any_count()
    total = sum(len(v) for v in counts.values())
    worst = sorted(counts.items(), key=lambda kv: -len(kv[1]))[:5]
    assert total <= ANY_CEILING, (f"{total} Any annotations, at most {ANY_CEILING}: type the new ones (most in "
                                  f"{', '.join(f'{p} ({len(v)})' for p, v in worst)})")


def test_the_any_count_reads_every_kind_of_annotation(tmp_path):
    (tmp_path / "m.py").write_text("from typing import Any\nimport typing\nx: Any = 1\n"
                                   "def f(a: Any, *b: list[Any], c: 'Any' = 1, **d: typing.Any) -> dict[str, Any]:\n"
                                   "    y: int = 0\n    return {}\n")
    assert any_annotations(str(tmp_path / "m.py")) == [3, 4, 4, 4, 4, 4]


# ---------------------------------------------------------------- validators

ARGS = os.path.join(PACKAGE, "core", "args.py")
_PLAIN_KINDS = {"bool", "int", "float", "str", "bytes", "complex", "Real", "Integral", "Number", "bool_", "integer",
                "floating", "number"}
_KIND_TESTS = {"isinstance", "is_int", "is_real"}


def _args_names(args_path: str) -> tuple[set[str], set[str]]:
    """(every top-level name of core/args, its functions)."""
    tree = ast.parse(open(args_path).read())
    names, functions = set(), set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names.add(n.name)
            if isinstance(n, ast.FunctionDef):
                functions.add(n.name)
        for t in n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []:
            if isinstance(t, ast.Name):
                names.add(t.id)
    return names, functions


def _reads_only(test: ast.expr, param: str, constants: set[str]) -> bool | None:
    """Whether ``test`` reads nothing but ``param`` (its kind, its value against literals or args constants):
    None if it reads more, False if it reads only the value, True if it reads its kind."""
    checks_kind = False
    for n in ast.walk(test):
        if isinstance(n, ast.Call):
            if not isinstance(n.func, ast.Name) or n.func.id not in _KIND_TESTS | {"int", "float", "len"}:
                return None
            if n.func.id == "isinstance":
                kinds = n.args[1].elts if isinstance(n.args[1], ast.Tuple) else [n.args[1]]
                if any((k.attr if isinstance(k, ast.Attribute) else getattr(k, "id", None)) not in _PLAIN_KINDS
                       for k in kinds):
                    return None
            checks_kind = checks_kind or n.func.id in _KIND_TESTS
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == param:
            return None  # a field or method of the value: a fact about it, not its kind
        elif isinstance(n, ast.Name) and n.id != param and n.id not in constants | _KIND_TESTS | _PLAIN_KINDS \
                | {"int", "float", "len", "np", "numbers"}:
            return None
    return checks_kind


def _only_raises(body: list[ast.stmt]) -> bool:
    return all(isinstance(s, ast.Raise) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
               and isinstance(s.value.func, ast.Name) and s.value.func.id in ("fail", "raise_type") for s in body)


def _returns_it(stmt: ast.stmt, param: str) -> bool:
    value = stmt.value if isinstance(stmt, ast.Return) else None
    if value is None:
        return isinstance(stmt, ast.Return)
    if isinstance(value, ast.Name):
        return value.id == param
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
        value.func.id in ("int", "float", "bool", "str") and len(value.args) == 1 and \
        isinstance(value.args[0], ast.Name) and value.args[0].id == param


def _calls(expr: ast.expr | None, functions: set[str]) -> bool:
    if isinstance(expr, ast.IfExp):
        return _calls(expr.body, functions) or _calls(expr.orelse, functions)
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in functions


def validators(root: str = PACKAGE, args_path: str = ARGS) -> list[str]:
    """Every validator defined outside core/args, as a readable line (the rules: the module's docstring)."""
    names, functions = _args_names(args_path)
    constants = {n for n in names if n.isupper()}
    found = []
    for path in python_files(root):
        if os.path.abspath(path) == os.path.abspath(args_path):
            continue
        where = os.path.relpath(path, os.path.dirname(root))
        tree = ast.parse(open(path).read())
        for n in tree.body:
            targets = [n] if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else \
                n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                name = getattr(t, "name", None) or getattr(t, "id", None)
                if name in names:
                    found.append(f"{where}:{n.lineno} defines {name} again (core/args has it: import it)")
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = [s for s in f.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return) and _calls(body[0].value, functions):
                found.append(f"{where}:{f.lineno} {f.name} only wraps a core/args validator: call that one")
                continue
            checks = body[:-1] if body and isinstance(body[-1], ast.Return) else body
            for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]:
                reads = [_reads_only(s.test, a.arg, constants) if isinstance(s, ast.If) and not s.orelse
                         and _only_raises(s.body) else None for s in checks]
                if checks and None not in reads and any(reads) \
                        and (len(checks) == len(body) or _returns_it(body[-1], a.arg)):
                    found.append(f"{where}:{f.lineno} {f.name} only checks the kind of {a.arg}: a validator "
                                 "belongs in core/args")
                    break
    return found


def test_no_validator_outside_core_args():
    found = validators()
    assert not found, "argument validators outside core/args.py:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("INT32_MAX = 2 ** 31 - 1\n", "defines INT32_MAX again"),
    ("def bool_arg(v):\n    return v\n", "defines bool_arg again"),
    ("def flag(value, name):\n    if not isinstance(value, (bool, np.bool_)):\n"
     "        raise GgmlTypeError(name)\n    return bool(value)\n", "only checks the kind of value"),
    ("def count(value, what):\n    if not is_int(value) or not 1 <= value <= INT32_MAX:\n"
     "        raise GgmlValueError(what)\n    return int(value)\n", "only checks the kind of value"),
    ("def rate(v):\n    '''A rate.'''\n    if not is_real(v):\n        fail(None, 'rate', GgmlTypeError)\n"
     "    if v < 0:\n        raise GgmlValueError('rate')\n    return v\n", "only checks the kind of v"),
    ("def steps(value, name):\n    return None if value is None else c_int_arg(None, name, value, 1)\n",
     "only wraps a core/args validator"),
])
def test_the_validator_check_catches(tmp_path, source, expected):
    """The check fails on each kind of local validator (a check that cannot fail proves nothing)."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "args.py").write_text(
        "INT32_MAX = 1\ndef bool_arg(fn, name, value):\n    pass\ndef c_int_arg(fn, name, value, lo):\n    pass\n")
    (tmp_path / "m.py").write_text(source)
    found = validators(str(tmp_path), str(tmp_path / "core" / "args.py"))
    assert len(found) == 1 and expected in found[0], found


def test_a_tiers_own_check_is_not_a_validator(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "args.py").write_text("def bool_arg(fn, name, value):\n    pass\n")
    (tmp_path / "m.py").write_text(
        "def padding_arg(value):\n    if value not in ('valid', 'same'):\n        raise GgmlValueError(value)\n"
        "    return value\n"
        "def layer_name(name):\n    if not isinstance(name, str) or not name.isidentifier():\n"
        "        raise GgmlValueError(name)\n    return name\n"
        "def optimizer(o):\n    if isinstance(o, bool) or o not in (ADAMW, SGD):\n        raise GgmlValueError(o)\n"
        "    return int(o)\n")
    assert validators(str(tmp_path), str(tmp_path / "core" / "args.py")) == []


if __name__ == "__main__":
    print("\n".join(validators()) or "no validator outside core/args")
    counts = any_count()
    print(f"{sum(len(v) for v in counts.values())} Any annotations (ceiling {ANY_CEILING})")
    for path, lines in sorted(counts.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(lines):3} {path}")
