"""The glossary: argument descriptions that many docstrings share, written once.

A docstring's argument line ``ctx: [glossary]`` (or ``ctx: [glossary: gguf]`` for a variant) is filled
from ``TERMS`` when ``ggmlpy`` is imported (``explain``), so ``help()`` shows the full sentence while the
source keeps one copy of it. A term is worth an entry when at least three docstrings share it word for
word; ``tests/public/test_docstrings.py`` checks that every marker is filled and every entry is used.
"""
from __future__ import annotations

import re
from typing import TypeVar


TERMS = {
    "ctx": "the context the result tensor is created in.",
    "ctx: room": "the context the result tensor is created in (it must have room for it).",
    "ctx: view": "the context the result tensor (a view, no data of its own) is created in.",
    "ctx: header": "the context the result tensor's header is created in.",
    "ctx: owner": "the context that owns the tensor (created by ``ggml_init``).",
    "ctx: gguf": "a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).",
    "opt_ctx": "an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).",
    "ctx_compute": "the Context holding the model graph.",
    "optimizer": "``ggml_opt_optimizer_type_adamw()`` (the default) or ``..._sgd()``.",
    "weight_decay": "decoupled weight decay in [0, 1] applied at every optimizer step (default 0: off).",
    "silent": "True suppresses the progress bar and the per-epoch line (default False).",
    "val_split": "the fraction in [0, 1) of the logical batches kept for validation (default 0).",
    "ihead": "the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).",
    "key": "a non-empty str without NUL characters, e.g. ``\"general.name\"``.",
    "tensor: data": "an allocated Tensor of type I8, I16, I32, I64, F32, F16, BF16 or F64.",
    "i: element": "the element index, an int in ``[0, ggml_nelements(tensor))`` (else GgmlValueError).",
}

MARKER = re.compile(r"^(\s*)(\w+): \[glossary(?:: (\w+))?\]", re.M)


T = TypeVar("T")


def fill_doc(obj: T, **parts: str) -> T:
    """Fill the ``{name}`` fields of ``obj``'s docstring with ``parts`` (text shared by several docstrings of a
    module); returns ``obj``."""
    obj.__doc__ = (obj.__doc__ or "").format(**parts)
    return obj


def explain(obj: T) -> T:
    """Fill the glossary markers of ``obj``'s docstring in place (unknown ones stay, for the tests to see);
    returns ``obj``."""
    doc = getattr(obj, "__doc__", None)
    if doc and "[glossary" in doc:
        def fill(m: re.Match) -> str:
            key = m.group(2) + (f": {m.group(3)}" if m.group(3) else "")
            return f"{m.group(1)}{m.group(2)}: {TERMS[key]}" if key in TERMS else m.group(0)
        obj.__doc__ = MARKER.sub(fill, doc)
    return obj
