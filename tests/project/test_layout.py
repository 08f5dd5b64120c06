"""The package's layout contract: folders are tiers, and imports only go down.

Tiers, lowest first (docs/guide/architecture.md). A module may import from its own package and from
packages of lower tiers; packages in one tier do not import each other; nothing imports upward. Imports
inside functions and under ``TYPE_CHECKING`` count like any other, and no import cycle may exist between
modules. Every module is at most 600 lines. Run ``python tests/project/test_layout.py`` for the full report.
"""
from __future__ import annotations

import ast
import os
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/project/ -> the root
PACKAGE = "ggmlpy"
# lowest first; packages in one entry are independent siblings
TIERS = [
    ["ggmlpy._ffi", "ggmlpy.errors"],
    ["ggmlpy.core"],
    ["ggmlpy.graph"],
    ["ggmlpy.ops", "ggmlpy.backend"],
    ["ggmlpy.compute"],
    ["ggmlpy.opt", "ggmlpy.gguf"],
    ["ggmlpy.training"],
    # the model layer's sub-tiers, lowest first; ggmlpy.models itself (the builders, the trainer, the placement
    # report) stands above them all
    ["ggmlpy.models.layers"],
    ["ggmlpy.models.network"],
    ["ggmlpy.models.engine"],
    ["ggmlpy.models.io"],
    ["ggmlpy.models"],
    ["ggmlpy.autograd"],  # ggmlR's second API, the dynamic autograd engine: beside the model layer, above it
    ["ggmlpy.onnx"],  # ggmlR's ONNX importer: graphs of ggml's ops, run by the model layer's scheduler
    ["ggmlpy._guard"],  # the public-surface guard: only the package's __init__ uses it
]
MAX_LINES = 600


def modules(root: str = ROOT, package: str = PACKAGE) -> dict[str, str]:
    """dotted module name -> file path, for every module of ``package`` under ``root``."""
    out = {}
    base = os.path.join(root, *package.split("."))
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def imports_of(name: str, path: str, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import of a package module in ``path``, at any depth: ``from
    .x import y`` counts as ``x.y`` when that is a module, else as ``x``."""
    is_package = path.endswith("__init__.py")
    here = name if is_package else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in known else base, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == PACKAGE]
    return out


def tier_of(module: str) -> tuple[int, str] | None:
    for level, packages in enumerate(TIERS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return level, package
    return None


def violations(root: str = ROOT, package: str = PACKAGE) -> list[str]:
    """Every breach of the contract, as a readable line."""
    mods = modules(root, package)
    known = set(mods)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in sorted(mods.items()):
        lines = sum(1 for _ in open(path))
        if lines > MAX_LINES:
            problems.append(f"{name}: {lines} lines (at most {MAX_LINES}: split it by concern)")
        if name == package:
            continue  # the package's __init__ re-exports every tier
        mine = tier_of(name)
        if mine is None:
            problems.append(f"{name}: not in a tier folder (add it to one, or to TIERS)")
            continue
        for target, line in imports_of(name, path, known):
            if target == package:
                problems.append(f"{name}:{line} imports the package root (import the module that defines it)")
                continue
            if target in known:
                graph[name].add(target)
            theirs = tier_of(target)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] >= mine[0]:
                what = "a sibling tier" if theirs[0] == mine[0] else "upward"
                problems.append(f"{name}:{line} imports {target} ({what}: {mine[1]} is tier {mine[0]}, "
                                f"{theirs[1]} tier {theirs[0]})")
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (or a self-import)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(_one_cycle(graph, sorted(comp)))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    start, members = comp[0], set(comp)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1 or (back and start in graph[start]):
            return path + [start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:
            return path + ["..."]
        path.append(step)
        seen.add(step)


def private_crossings(root: str = ROOT, package: str = PACKAGE) -> list[str]:
    """A module that imports another module's ``_private`` name, or reads ``x._private`` where no class of
    its own sets that attribute: what it needs should be a public name or accessor of the owner."""
    out = []
    for name, path in sorted(modules(root, package).items()):
        if name.startswith(f"{package}._ffi"):
            continue
        tree = ast.parse(open(path).read())
        own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id in ("self", "cls")}
        own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").split(".")[0] == package):
                out += [f"{name}:{n.lineno} imports the private name {a.name}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__") \
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls", "lib", "ffi")) \
                    and n.attr not in own:
                out.append(f"{name}:{n.lineno} reads another module's private attribute .{n.attr}")
    return out


def test_modules_use_each_other_through_public_names():
    problems = private_crossings()
    assert not problems, "private names crossing module lines:\n" + "\n".join(problems)


def test_the_private_check_catches_both_kinds(tmp_path):
    _write(tmp_path, {"ggmlpy/__init__.py": "", "ggmlpy/core/__init__.py": "",
                      "ggmlpy/core/a.py": "_x = 1\nclass A:\n    def __init__(self):\n        self._y = 1\n",
                      "ggmlpy/core/b.py": "from .a import _x\ndef f(o):\n    return o._y\n"})
    problems = private_crossings(str(tmp_path))
    assert len(problems) == 2 and "private name _x" in problems[0] and "._y" in problems[1], problems


def test_the_package_keeps_the_contract():
    problems = violations()
    assert not problems, "layout contract broken:\n" + "\n".join(problems)


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


@pytest.mark.parametrize("files, expected", [
    ({"ggmlpy/core/a.py": "from ..graph.b import x\n", "ggmlpy/graph/b.py": "x = 1\n"}, "upward"),
    ({"ggmlpy/core/a.py": "def f():\n    from ..graph import b\n", "ggmlpy/graph/b.py": ""}, "upward"),
    ({"ggmlpy/ops/a.py": "from ..backend.b import x\n", "ggmlpy/backend/b.py": "x = 1\n"}, "sibling"),
    ({"ggmlpy/core/a.py": "from .b import x\n", "ggmlpy/core/b.py": "from typing import TYPE_CHECKING\n"
      "if TYPE_CHECKING:\n    from .a import y\nx = 1\n"}, "cycle"),
    ({"ggmlpy/flat.py": "x = 1\n"}, "not in a tier"),
    ({"ggmlpy/core/big.py": "x = 1\n" * (MAX_LINES + 1)}, "lines"),
    ({"ggmlpy/core/a.py": "from ggmlpy import ggml_add\n"}, "package root"),
])
def test_the_check_catches(tmp_path, files, expected):
    """The contract test itself fails on each kind of breach (a check that cannot fail proves nothing)."""
    _write(tmp_path, {"ggmlpy/__init__.py": "", "ggmlpy/core/__init__.py": "", "ggmlpy/graph/__init__.py": "",
                      "ggmlpy/ops/__init__.py": "", "ggmlpy/backend/__init__.py": "", **files})
    problems = violations(str(tmp_path))
    assert any(expected in p for p in problems), problems


def test_a_clean_made_up_package_passes(tmp_path):
    _write(tmp_path, {"ggmlpy/__init__.py": "from .graph.b import x\n", "ggmlpy/core/__init__.py": "",
                      "ggmlpy/core/a.py": "from ..errors import E\nfrom .._ffi import lib\n",
                      "ggmlpy/errors.py": "E = 1\n", "ggmlpy/_ffi/__init__.py": "lib = 1\n",
                      "ggmlpy/graph/__init__.py": "", "ggmlpy/graph/b.py": "from ..core.a import E as x\n"})
    assert violations(str(tmp_path)) == []


# ---------------------------------------------------------------- the tests mirror the package

# the folders of tests/ that are not a tier's, and what each holds (docs/guide/architecture.md, "Tests")
TEST_FOLDERS = {
    "helpers": "what the tests share (no tests)",
    "project": "the repository's contracts that make no ggml call (marked pure)",
    "public": "the public surface and what users run: names, docstrings, guide, examples, installation, parity",
    "safety": "process-level misuse: aborts, exit, fork, threads, double frees",
    "patches": "our ggml patches (patches/), on the CPU and the GPU kernels",
    "fuzz": "the fuzz suite",
    "peer": "ggml's and ggmlR's own tests, translated",
}
TESTS_TOP_FILES = {"__init__.py", "conftest.py"}


def tier_folders(root: str = ROOT, package: str = PACKAGE) -> set[str]:
    """The tests/ folder of each tier that is a folder of the package ("core", "models/layers", ...): the
    tiers of TIERS but the private ones (the bindings, the guard), tested through the public surface."""
    out = set()
    for packages in TIERS:
        for name in packages:
            rel = name[len(package) + 1:]
            if not rel.startswith("_") and os.path.isdir(os.path.join(root, *name.split("."))):
                out.add(rel.replace(".", "/"))
    return out


def mirror_problems(root: str = ROOT, package: str = PACKAGE) -> list[str]:
    """Every way the tests/ folder fails to mirror the package, as a readable line."""
    tests = os.path.join(root, "tests")
    tiers = tier_folders(root, package)
    known = tiers | set(TEST_FOLDERS)
    problems = []
    for folder, dirs, files in os.walk(tests):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, tests).replace(os.sep, "/")
        if rel == ".":
            problems += [f"tests/{f}: a file directly in tests/ (it goes in the folder of what it tests)"
                         for f in sorted(files) if f.endswith(".py") and f not in TESTS_TOP_FILES]
            problems += [f"tests/{d}/: names no tier of {package} (a tier's folder, or one of TEST_FOLDERS)"
                         for d in dirs if d not in known]
            continue
        top = rel.split("/")[0]
        if top in tiers and rel not in tiers:
            problems.append(f"tests/{rel}/: names no sub-tier of {package}.{top.replace('/', '.')}")
        if (top in tiers or top in ("project", "public", "safety", "patches")) and any(
                f.startswith("test_") and f.endswith(".py") for f in files) and "__init__.py" not in files:
            problems.append(f"tests/{rel}/: no __init__.py (test files of different folders may share a name)")
    problems += [f"tests/{t}/: missing (every tier has its tests folder)" for t in sorted(tiers)
                 if not os.path.isdir(os.path.join(tests, *t.split("/")))]
    return problems


def test_the_tests_mirror_the_package():
    problems = mirror_problems()
    assert not problems, "the tests/ tree does not mirror the package:\n" + "\n".join(problems)


def test_the_tests_tree_check_catches(tmp_path):
    _write(tmp_path, {"ggmlpy/__init__.py": "", "ggmlpy/core/__init__.py": "", "ggmlpy/graph/__init__.py": "",
                      "ggmlpy/models/__init__.py": "",
                      "ggmlpy/models/layers/__init__.py": "", "tests/__init__.py": "", "tests/conftest.py": "",
                      "tests/test_flat.py": "", "tests/ops_old/test_x.py": "", "tests/core/test_args.py": "",
                      "tests/models/__init__.py": "", "tests/models/layers/__init__.py": "",
                      "tests/models/layerz/__init__.py": "", "tests/helpers/x.py": ""})
    problems = mirror_problems(str(tmp_path))
    for expected in ("tests/test_flat.py: a file directly", "tests/ops_old/: names no tier",
                     "tests/models/layerz/: names no sub-tier", "tests/core/: no __init__.py",
                     "tests/graph/: missing"):
        assert any(p.startswith(expected) for p in problems), (expected, problems)
    assert not any("helpers" in p or "conftest" in p or "tests/models/layers" in p for p in problems), problems


if __name__ == "__main__":
    print("\n".join(violations() + private_crossings() + mirror_problems()) or "the layout keeps the contract")


def test_no_model_layer_module_repeats_a_lower_tiers_name():
    """A module of models/ is not named as a module or folder of a tier below it (models/graph.py beside graph/,
    models/fit.py beside training/fit.py made every reader ask which one was meant)."""
    mods = modules()
    lower = {n.rsplit(".", 1)[-1] for n in mods if not n.startswith(f"{PACKAGE}.models")}
    lower |= {n.split(".")[1] for n in mods if n.count(".") >= 1 and not n.startswith(f"{PACKAGE}.models")}
    clashes = sorted(n for n in mods if n.startswith(f"{PACKAGE}.models.") and n.rsplit(".", 1)[-1] in lower)
    assert not clashes, f"model-layer modules named as a lower tier's module or folder: {clashes}"
