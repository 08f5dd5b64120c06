"""The public API's surface: every name ``ggmlpy`` exports and, for a function or class, its parameters (name,
kind, default; annotations left out, as they are documentation), for a constant its value.

``python tools/api_surface.py OUT.json`` writes the surface of the ``ggmlpy`` the interpreter imports (run it
from outside the repository with another install's interpreter to record that install's).
``tests/public/test_api_surface.py`` checks that the current package keeps a recorded surface:
``compatible(old, new)`` lists what a caller of the old one would find missing or changed.
"""
from __future__ import annotations

import inspect
import json
import sys
from typing import Any


def _parameters(obj: Any) -> list[list[str]] | None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, "" if p.default is p.empty else repr(p.default)]
            for p in signature.parameters.values()]


def surface(package: Any) -> dict[str, dict[str, Any]]:
    """name -> {"kind": "function" | "class" | "value", "parameters": [[name, kind, default repr]] or
    "value": repr} for every name in ``package.__all__``."""
    out: dict[str, dict[str, Any]] = {}
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.isclass(value):
            out[name] = {"kind": "class", "parameters": _parameters(value)}
        elif callable(value):
            out[name] = {"kind": "function", "parameters": _parameters(value)}
        else:
            out[name] = {"kind": "value", "value": repr(value)}
    return out


_POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
_KEYWORD = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")


def compatible(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """What a caller of the ``old`` surface would find missing or changed in ``new``: a name gone or of
    another kind, a constant's value changed, a parameter gone, moved, no longer taken the way it was
    (by position or by keyword), given another default, or a new parameter without a default."""
    problems = []
    for name, was in sorted(old.items()):
        now = new.get(name)
        if now is None or now["kind"] != was["kind"]:
            problems.append(f"{name}: {'gone' if now is None else 'now a ' + now['kind']}")
        elif was["kind"] == "value":
            if now["value"] != was["value"]:
                problems.append(f"{name}: value {was['value']} became {now['value']}")
        elif was["parameters"] is not None:
            problems += [f"{name}: {p}" for p in _parameter_changes(was["parameters"], now["parameters"] or [])]
    return problems


def _parameter_changes(was: list[list[str]], now: list[list[str]]) -> list[str]:
    by_name = {p[0]: p for p in now}
    kinds_now = {p[1] for p in now}
    out = []
    old_positional = [p[0] for p in was if p[1] in _POSITIONAL]
    new_positional = [p[0] for p in now if p[1] in _POSITIONAL]
    if new_positional[:len(old_positional)] != old_positional and "VAR_POSITIONAL" not in kinds_now:
        out.append(f"positional parameters {old_positional} became {new_positional}")
    for name, kind, default in was:
        if kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if kind not in kinds_now:
                out.append(f"no longer takes {'*args' if kind == 'VAR_POSITIONAL' else '**kwargs'}")
            continue
        p = by_name.get(name)
        if p is None:
            if not {"VAR_POSITIONAL", "VAR_KEYWORD"} <= kinds_now:   # a pass-through (*args, **kwargs) keeps it
                out.append(f"parameter {name!r} gone")
            continue
        if (kind in _KEYWORD and p[1] not in _KEYWORD) or (kind in _POSITIONAL and p[1] not in _POSITIONAL):
            out.append(f"parameter {name!r} was {kind}, is {p[1]}")
        if p[2] != default and default:   # a required parameter may gain a default: every call still works
            out.append(f"parameter {name!r}: default {default or '(none)'} became {p[2] or '(none)'}")
    old_names = {p[0] for p in was}
    out += [f"new parameter {p[0]!r} has no default" for p in now
            if p[0] not in old_names and p[1] not in ("VAR_POSITIONAL", "VAR_KEYWORD") and not p[2]]
    return out


def main() -> None:
    import ggmlpy
    with open(sys.argv[1], "w") as f:
        json.dump(surface(ggmlpy), f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"wrote {sys.argv[1]}: {len(ggmlpy.__all__)} names of {ggmlpy.__file__}")


if __name__ == "__main__":
    main()
