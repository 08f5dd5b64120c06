"""Write ``ggmlpy/__init__.py``: the public API as explicit imports and a literal ``__all__``.

Run ``python tools/exports.py`` after adding, renaming or moving a public name; ``tests/public/test_exports.py``
fails while the file is stale. A public name is a ``ggml_*``, ``GGML_*`` or ``gguf_*`` name defined at the top of a
module (``ggml_logger*`` excepted: the FFI's log plumbing; in a module with a literal ``__all__``, such as ggmlR's
``ag_*`` engine or its quantization family, the names it lists), or one of the two functions the model layer makes
for each built-in layer class (``models/builders.py``: ``ggml_layer_<kind>`` and ``ggml_<kind>``, read here from the
classes' ``kind`` and ``builder_functions``). A name defined in two modules is an error, but a layer function named
as an op: it takes the op's call too, and the package exports it.
"""
from __future__ import annotations

import ast
import os
import textwrap


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "ggmlpy")
INIT = os.path.join(PACKAGE, "__init__.py")
PREFIXES = ("ggml_", "GGML_", "gguf_")
# the classes a user's own layer is written with (docs/guide/models.md, "A layer of your own")
LAYER_CLASSES = {"Layer": "models.layers.layer", "Weight": "models.layers.weight"}
LAYERS = os.path.join(PACKAGE, "models", "layers")   # the built-in layer classes
BUILDERS = "ggmlpy.models.builders"                   # their functions: LAYER_FUNCTIONS there
ERRORS = ["GgmlpyError", "GgmlpyWarning", "GgmlStateError", "GgmlInUseError", "GgmlTypeError", "GgmlValueError",
          "BackendUnavailableError", "GgufFileError", "GgufFileNotFoundError", "GgufKeyError"]

# the package's docstring (the API reference's introduction); {families} becomes the sentence naming the families
HEADER = '''"""ggmlpy: train models on ggml's backends (CPU, Vulkan, CUDA, RPC) from Python.

Start with the model layer, ggmlR's Keras-like API (the first names below): build a model with
``ggml_model_sequential`` and the ``ggml_layer_*`` functions (or ``ggml_input``, the layers applied to nodes, and
``ggml_model``), ``ggml_compile`` it (optimizer, loss, metrics, backend), train it with ``ggml_fit`` (arrays) or
``ggml_fit_generator`` (batches streamed from a generator), then ``ggml_evaluate``, ``ggml_predict`` and
``ggml_save_model``. The user guide (linked at the bottom left) walks through each; the search box finds any name.

{families}

(For maintainers: this file only re-exports the public names of the tiered subpackages,
docs/guide/architecture.md; ``python tools/exports.py`` writes it: edit the modules, then run that.)
"""
from __future__ import annotations

from inspect import isfunction as _isfunction

from ._ffi import BUILD_INFO
from ._guard import guard as _guard
from .core.glossary import explain as _explain
'''

# names loaded on first use from modules that import an optional dependency (scikit-learn); not in __all__, so
# that `from ggmlpy import *` never needs it
LAZY = {"GgmlClassifier": "models.io.estimators", "GgmlRegressor": "models.io.estimators"}

FOOTER = '''
_LAZY = ''' + repr(LAZY) + '''


def __getattr__(name: str):  # the scikit-learn estimators load (and import scikit-learn) when first used
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module("." + _LAZY[name], __name__), name)
    raise AttributeError(f"module 'ggmlpy' has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too: dir(ggmlpy) and tab completion show the estimators
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"
__docformat__ = "google"  # for pdoc (docs/README.md): "Arguments:" sections render as lists, examples as code
GGML_VERSION = BUILD_INFO.get("ggml_version", "unknown")

# docstrings get their shared argument descriptions (core/glossary.py); one wrapper (_guard.py) makes calls on one
# context take turns and a Python error from inside ggmlpy leave a public function as a ggmlpy error
for _name in __all__:
    if _isfunction(globals()[_name]):
        globals()[_name] = _guard(_explain(globals()[_name]))
del _name
'''


def module_files() -> list[tuple[str, str]]:
    """(dotted name, path) of every module of the package but ``__init__`` files, the FFI and the guard."""
    out = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py") or f == "__init__.py":
                continue
            path = os.path.join(folder, f)
            name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            if name.startswith(("ggmlpy._ffi", "ggmlpy._guard")):
                continue
            out.append((name, path))
    return out


def defined_names(path: str) -> list[str]:
    """Public names a module defines at its top level (read from its source: the package is not imported,
    so a stale or broken ``__init__`` can always be rewritten)."""
    tree = ast.parse(open(path).read())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(e, ast.Name):
                        names.append(e.id)
    listed = _literal_all(tree)
    if listed:  # a module that lists its public names (ggmlR's ag_* engine, the quantization family) exports them
        return listed
    return [n for n in names if n.startswith(PREFIXES) and not n.startswith("ggml_logger")]


def _literal_all(tree: ast.Module) -> list[str]:
    """The names of a module's literal ``__all__`` (none: an empty list)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)) and \
                any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [str(e.value) for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def layer_function_names() -> list[str]:
    """The functions ``models/builders.py`` makes from the built-in layer classes: for each class with a
    ``kind = "<kind>"`` of its own and ``builder_functions`` not False, ``ggml_layer_<kind>`` and (unless
    ``builder_functions = "layer"``) ``ggml_<kind>``."""
    names = []
    for f in sorted(os.listdir(LAYERS)):
        if not f.endswith(".py"):
            continue
        for node in ast.parse(open(os.path.join(LAYERS, f)).read()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            settings = {t.id: s.value.value for s in node.body if isinstance(s, ast.Assign)
                        and isinstance(s.value, ast.Constant) for t in s.targets if isinstance(t, ast.Name)}
            kind, functions = settings.get("kind"), settings.get("builder_functions", True)
            abstract = settings.get("_abstract") or any(k.arg == "abstract" for k in node.keywords)
            if isinstance(kind, str) and functions and not abstract:
                names += [f"ggml_layer_{kind}"] + ([f"ggml_{kind}"] if functions != "layer" else [])
    return names


def public_names() -> dict[str, list[str]]:
    """module -> the public names the package takes from it."""
    generated = set(layer_function_names())
    home: dict[str, str] = {name: BUILDERS for name in generated}
    for module, path in module_files():
        for name in defined_names(path):
            if name in generated:
                continue   # the layer function takes the op's call too
            if name in home:
                raise SystemExit(f"{name} is defined in {home[name]} and {module}: rename one")
            home[name] = module
    by_module: dict[str, list[str]] = {}
    for name, module in home.items():
        by_module.setdefault(module, []).append(name)
    return {m: sorted(ns, key=str.lower) for m, ns in sorted(by_module.items())}


def render() -> str:
    by_module = public_names()
    generated = set(layer_function_names())
    lines = [HEADER.replace("{families}", _families_sentence()), _import("errors", ERRORS),
             *(_import(m, [n]) for n, m in LAYER_CLASSES.items())]
    for module, names in by_module.items():
        lines.append(_import(module[len("ggmlpy."):], [n for n in names if n not in generated]))
    lines.append("from .models.builders import LAYER_FUNCTIONS as _layer_functions\n\n"
                 "# made from the built-in layer classes (models/builders.py)\n")
    lines += [f'{name} = _layer_functions["{name}"]\n' for name in sorted(generated, key=str.lower)]
    # the reference's order (pdoc follows __all__): the families of FAMILIES, the model layer first
    exported = [name for *_, names in families() for name in names]
    lines.append(FOOTER.replace("\n# docstrings", "\n__all__ = [\n" + _listing(exported) + "]\n\n# docstrings", 1))
    return "".join(lines)


# The families of the public API, in the order of __all__ and of the API reference (where each is a headed section,
# docs/build.py): the tier (the subpackage, or ggmlpy/errors.py) whose names it takes, its heading, and what it
# holds (under the heading, and in the package's introduction, HEADER).
FAMILIES = (
    ("models", "The model layer", "ggmlR's Keras-like API: the workflow first (``ggml_model_sequential`` to "
     "``ggml_trainer``), then the layers, metrics, optimizers and the other helpers, and the classes of a layer of "
     "your own (``Layer``, ``Weight``)"),
    ("autograd", "The autograd engine (ag_*)", "ggmlR's dynamic autograd engine: eager PyTorch-style code whose "
     "every step runs as one ggml graph (``ag_tensor``, ``ag_param``, ``with_grad_tape``, ``backward``, the ``ag_*`` "
     "ops, layers and losses, ``optimizer_*``, ``lr_scheduler_*``)"),
    ("onnx", "ONNX import (onnx_*)", "ggmlR's ONNX importer: an ONNX model as one ggml graph on a device "
     "(``onnx_load``, ``onnx_run``, ``onnx_summary``, ``onnx_inputs``, ``onnx_device_info``), and an imported model "
     "as a ggmlpy model that trains (``onnx_to_model``)"),
    ("training", "Training loops, callbacks and schedules", "the training loops, callbacks and learning-rate "
     "schedules (``ggml_fit_opt_gen``, ``ggml_callback_*``, ``ggml_schedule_*``)"),
    ("opt", "ggml-opt", "ggml-opt, ggml's optimizer (``ggml_opt_*``)"),
    ("gguf", "GGUF files", "GGUF files (``gguf_*``)"),
    ("backend", "Backends, devices and buffers", "backends, devices and buffers (``ggml_backend_*``)"),
    ("compute", "The scheduler and graph computation", "the scheduler and graph computation "
     "(``ggml_backend_sched_*``, ``ggml_gallocr_*``)"),
    ("graph", "Graphs and tensors", "graphs and tensors (``ggml_init``, ``ggml_new_tensor_*``, ``ggml_graph_*``)"),
    ("ops", "Ops", "ggml's ops (``ggml_add``, ``ggml_mul_mat``, ... with the context first, then operands, then "
     "scalars, as in ggmlR)"),
    ("core", "The library and its types", "the library's version, CPU features and timers, and the tensor types "
     "(``GGML_VERSION``, ``ggml_cpu_has_*``, ``GGML_TYPE_*``)"),
    ("errors", "Errors", "the errors (``GgmlpyError`` and its subclasses)"),
)
# the model layer's workflow, at the head of the reference
FIRST = ("ggml_model_sequential", "ggml_input", "ggml_model", "ggml_compile", "ggml_fit", "ggml_fit_generator",
         "ggml_evaluate", "ggml_predict", "ggml_save_model", "ggml_load_model", "ggml_model_summary", "ggml_trainer")


def families() -> list[tuple[str, str, str, list[str]]]:
    """(anchor, heading, description, names) of each family of FAMILIES, in order: ``__all__`` is their names.
    A family's names are those of its tier's modules, by module then by name; the model layer's workflow (FIRST)
    leads, ``GGML_VERSION`` (defined by ``__init__`` itself) heads the library's."""
    names: dict[str, list[str]] = {tier: [] for tier, _, _ in FAMILIES}
    for module, defined in public_names().items():
        tier = module.split(".")[1]
        if tier not in names:
            raise SystemExit(f"{module}: its tier {tier!r} is no family of tools/exports.py's FAMILIES: add one")
        names[tier] += defined
    models = names["models"]
    names["models"] = [n for n in FIRST if n in models] + [n for n in models if n not in FIRST] + list(LAYER_CLASSES)
    names["core"].insert(0, "GGML_VERSION")
    names["errors"] += ERRORS
    return [(tier, heading, description, names[tier]) for tier, heading, description in FAMILIES]


def _families_sentence() -> str:
    """The introduction's sentence on the families after the model layer, wrapped as the docstring is."""
    text = ("The other families follow in this order, each under its heading: "
            + "; ".join(description for _, _, description in FAMILIES[1:]) + ". Every function keeps its ggmlR name.")
    return textwrap.fill(text, 116, break_long_words=False, break_on_hyphens=False)


def _import(module: str, names: list[str]) -> str:
    prefix = f"from .{module} import ("
    out, line = [], prefix
    for name in names:
        piece = name + ", "
        if len(line) + len(piece) > 118:
            out.append(line.rstrip() + "\n")
            line = " " * len(prefix)
        line += piece
    out.append(line.rstrip().rstrip(",") + ")\n")
    return "".join(out)


def _listing(names: list[str]) -> str:
    out, line = [], "   "
    for name in names:
        piece = f' "{name}",'
        if len(line) + len(piece) > 118:
            out.append(line + "\n")
            line = "   "
        line += piece
    out.append(line + "\n")
    return "".join(out)


def main() -> None:
    text = render()
    with open(INIT, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(INIT, ROOT)}")


if __name__ == "__main__":
    main()
