"""Documentation: every public name of ggmlpy has a docstring a user can learn from.

``help(ggmlpy.<name>)`` must be useful for every name in ``ggmlpy.__all__``, and the API reference
(``pdoc -o docs/api ggmlpy``, see docs/README.md) is generated from these docstrings. The form is
that of ggmlR's reference pages: a summary line, what it does, the arguments with their defaults,
the value, an example.
"""
from __future__ import annotations

import inspect
import re
from html.parser import HTMLParser

import pytest

import ggmlpy as G


PUBLIC = {name: getattr(G, name) for name in G.__all__ if callable(getattr(G, name))}
FUNCTIONS = {name: obj for name, obj in PUBLIC.items() if not inspect.isclass(obj)}

# The model layer's entry points: every parameter is explained in the docstring.
MODEL_API = ["ggml_fit", "ggml_compile", "ggml_fit_generator", "ggml_predict", "ggml_evaluate", "ggml_trainer"]
# The low-level training API, documented in the same way.
TRAINING_API = ["ggml_fit_opt_gen", "ggml_fit_opt", "ggml_fit_opt_multi", "ggml_opt_fit", "ggml_opt_fit_multi",
                "ggml_opt_epoch", "ggml_opt_init", "ggml_opt_init_for_fit", "ggml_opt_init_for_fit_multi",
                "ggml_opt_dataset_init", "ggml_backend_sched_new"]


def _doc(obj) -> str:
    return inspect.getdoc(obj) or ""


def _parameters(fn) -> list[str]:
    """The named parameters of ``fn`` (``*args``/``**kwargs`` excluded)."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _undocumented_parameters(fn) -> list[str]:
    doc = _doc(fn)
    return [p for p in _parameters(fn) if not re.search(rf"(?<![\w]){re.escape(p)}(?![\w])", doc)]


def test_public_names_exist():
    assert len(PUBLIC) > 250  # guards the checks below against an empty __all__


def test_every_public_callable_has_a_docstring():
    missing = sorted(name for name, obj in PUBLIC.items() if not _doc(obj).strip())
    assert not missing, f"{len(missing)} public names of ggmlpy have no docstring: {missing}"


def test_every_docstring_starts_with_a_summary_line():
    bad = sorted(name for name, obj in PUBLIC.items()
                 if len(_doc(obj).splitlines()[0].strip()) < 10)
    assert not bad, f"docstrings whose first line is not a summary: {bad}"


@pytest.mark.parametrize("name", MODEL_API + TRAINING_API)
def test_entry_points_explain_every_parameter(name):
    fn = getattr(G, name)
    missing = _undocumented_parameters(fn)
    assert not missing, f"{name}'s docstring does not mention its parameters {missing}"


def test_low_level_functions_explain_every_parameter():
    """Outside the model layer (whose layer constructors forward ``*args``), every public function's
    docstring names each of its parameters."""
    missing = {name: _undocumented_parameters(fn) for name, fn in FUNCTIONS.items()
               if not fn.__module__.startswith("ggmlpy.models")}
    missing = {name: params for name, params in missing.items() if params}
    assert not missing, f"docstrings that do not mention these parameters: {missing}"


def test_low_level_functions_have_an_example():
    missing = sorted(name for name, fn in FUNCTIONS.items()
                     if not fn.__module__.startswith("ggmlpy.models") and ">>>" not in _doc(fn))
    assert not missing, f"docstrings without a '>>>' example: {missing}"


def test_loss_types_say_logits_or_probabilities():
    """Where the loss is chosen, the docstring says what the outputs must be."""
    assert "logits" in _doc(G.ggml_opt_loss_type_cross_entropy)
    assert "probabilities" in _doc(G.ggml_opt_loss_type_binary_cross_entropy)
    for name in ("ggml_fit_opt_gen", "ggml_fit_opt", "ggml_opt_init"):
        doc = _doc(getattr(G, name))
        assert "logits" in doc, name


def test_generated_op_docstrings_are_specific():
    """The element-wise ops are made by factories: each gets its own docstring, not a shared stub."""
    unary = ["ggml_sqr", "ggml_sqrt", "ggml_log", "ggml_exp", "ggml_sin", "ggml_cos", "ggml_abs", "ggml_sgn",
             "ggml_neg", "ggml_step", "ggml_relu", "ggml_elu", "ggml_silu", "ggml_gelu", "ggml_tanh",
             "ggml_sigmoid", "ggml_softplus", "ggml_hardswish", "ggml_dup", "ggml_cont"]
    binary = ["ggml_add", "ggml_sub", "ggml_mul", "ggml_div"]
    reshape = ["ggml_reshape_1d", "ggml_reshape_2d", "ggml_reshape_3d", "ggml_reshape_4d"]
    for group in (unary, binary, reshape):
        docs = [_doc(getattr(G, name)) for name in group]
        assert len(set(docs)) == len(docs)
        for name, doc in zip(group, docs):
            assert "Arguments:" in doc and "Value:" in doc and ">>>" in doc, name
            assert name in doc, name


def test_pdoc_renders_the_api_reference(tmp_path):
    """The API reference builds (docs/README.md): pdoc imports the package and renders every name."""
    pdoc = pytest.importorskip("pdoc")
    pdoc.pdoc("ggmlpy", output_directory=tmp_path)
    page = (tmp_path / "ggmlpy.html").read_text(encoding="utf-8")
    absent = [name for name in G.__all__ if f'id="{name}"' not in page]
    assert not absent, f"names missing from the generated reference: {absent}"


class _Sections(HTMLParser):
    """A rendered reference page's public names by family heading, in the page's order, in the content and in the
    navigation. A heading is an element of class ``ggmlpy-family``: in the content an ``<h2>`` named by its ``id``,
    in the navigation one whose link (``#anchor``) names it. A name is a member's ``<section id>`` in the content, a
    link to it in the navigation. Names before any heading are under None."""

    def __init__(self, names: set[str]):
        super().__init__()
        self.names = names
        self.found: dict[str, dict[str | None, list[str]]] = {"main": {}, "nav": {}}
        self.headings: dict[str, dict[str, str]] = {"main": {}, "nav": {}}   # anchor -> the heading's text
        self.region: str | None = None    # "main" or "nav"
        self.family: str | None = None    # the current heading's anchor
        self.heading: str | None = None   # the tag of the heading being read, till its end

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag in ("main", "nav"):
            self.region, self.family = tag, None
        elif self.region and "ggmlpy-family" in a.get("class", "").split():
            self.heading, self.family = tag, a.get("id")      # None in the nav until the heading's link
        elif self.region == "nav" and tag == "a" and a.get("href", "").startswith("#"):
            if self.heading:
                self.family = a["href"][1:]
            elif a["href"][1:] in self.names:
                self.found["nav"].setdefault(self.family, []).append(a["href"][1:])
        elif self.region == "main" and tag == "section" and a.get("id") in self.names:
            self.found["main"].setdefault(self.family, []).append(a["id"])

    def handle_data(self, data):
        if self.region and self.heading and self.family:
            texts = self.headings[self.region]
            texts[self.family] = " ".join((texts.get(self.family, "") + data).split())

    def handle_endtag(self, tag):
        if tag == self.heading:
            self.heading = None
        elif tag in ("main", "nav"):
            self.region = None


def test_the_site_reference_has_a_search_and_a_headed_section_per_family(tmp_path):
    """A first-time user found one 4.8 MB page of 563 names without a search, ggml_fit at entry 299 after 250
    ggml_backend_* names, under an intro written for maintainers: the site's reference (docs/build.py's template)
    has pdoc's search, the model layer's workflow comes first, and the intro is a user's. Then the families were
    still one flat list: each family of tools/exports.py's FAMILIES is a headed section, in order, with its names
    under its heading, in the content (an <h2> with an anchor) and in the navigation (its heading over its links)."""
    render = pytest.importorskip("pdoc.render")

    from tests.helpers import load_script
    build = load_script("docs/build.py", "ggmlpy_docs_build")
    families = load_script("tools/exports.py", "ggmlpy_exports_tool").families()
    try:
        build.render_api(tmp_path)
    finally:
        render.configure()   # pdoc's defaults for the other tests
    api = tmp_path / build.API_DIR
    page = (api / "ggmlpy.html").read_text(encoding="utf-8")
    assert 'role="searchbox"' in page and (api / "search.js").exists()
    order = [page.index(f'id="{name}"') for name in ("ggml_model_sequential", "ggml_compile", "ggml_fit")]
    assert order == sorted(order) and order[-1] < page.index('id="ggml_backend_cpu_init"') < page.index('id="ggml_add"')
    assert "Start with the model layer" in page

    assert [name for *_, names in families for name in names] == G.__all__   # the families are __all__, in order
    expected = {anchor: names for anchor, _, _, names in families}
    headings = {anchor: heading for anchor, heading, _, _ in families}
    sections = _Sections(set(G.__all__))
    sections.feed(page)
    for region in ("main", "nav"):   # dicts in order: the headings' order counts
        assert list(sections.found[region].items()) == list(expected.items()), f"{region}: names by family heading"
        assert sections.headings[region] == headings, f"{region}: the family headings' text"
    for anchor in expected:
        assert page.count(f'id="{anchor}"') == 1, anchor


# ---------------------------------------------------------------- the glossary (ggmlpy/core/glossary.py)

def test_every_glossary_marker_is_filled():
    unfilled = sorted(name for name, obj in PUBLIC.items() if "[glossary" in (obj.__doc__ or ""))
    assert not unfilled, f"docstrings with a glossary marker that names no entry: {unfilled}"


def test_every_glossary_entry_is_shared_by_at_least_three_docstrings():
    from pathlib import Path

    from ggmlpy.core.glossary import MARKER, TERMS
    uses = {key: 0 for key in TERMS}
    for path in Path(G.__file__).parent.rglob("*.py"):
        for m in MARKER.finditer(path.read_text()):
            key = m.group(2) + (f": {m.group(3)}" if m.group(3) else "")
            uses[key] = uses.get(key, 0) + 1
    assert not [k for k, n in uses.items() if n < 3], uses


def test_explain_fills_known_markers_and_leaves_unknown_ones():
    from ggmlpy.core.glossary import explain, TERMS

    def f(ctx, bogus):
        """Do a thing.

        Arguments:
            ctx: [glossary]
            bogus: [glossary: nothing]
        """
    explain(f)
    assert f"ctx: {TERMS['ctx']}" in f.__doc__ and "bogus: [glossary: nothing]" in f.__doc__


def _arguments_section(doc: str) -> list[str]:
    """The names an ``Arguments:`` section lists (``name:`` at its first indent; ``**params:`` counts)."""
    assert "Arguments:" in doc
    body = doc.split("Arguments:", 1)[1].split("\nValue:", 1)[0].split("\nExample:", 1)[0]
    return re.findall(r"^    \**(\w+): ", body, re.M)


@pytest.mark.parametrize("name, key", [("ggml_metric_precision", "precision"), ("ggml_metric_recall", "recall"),
                                       ("ggml_metric_top_k_accuracy", "top_k_categorical_accuracy"),
                                       ("ggml_metric_auc", "auc")])
def test_metric_factories_list_every_argument_and_the_default_log_key(name, key):
    fn = getattr(G, name)
    doc = _doc(fn)
    assert _arguments_section(doc) == _parameters(fn), name
    assert f'(default ``"{key}"``' in doc and "Value:" in doc, name
    assert fn().name == key   # the key the docstring names is the one logged


@pytest.mark.parametrize("cls", ["GgmlClassifier", "GgmlRegressor"])
def test_estimators_document_their_own_get_params_and_set_params(cls):
    pytest.importorskip("sklearn")
    est = getattr(G, cls)
    for method, args in (("get_params", ["deep"]), ("set_params", ["params"])):
        doc = _doc(getattr(est, method))
        assert "scikit-learn" in doc and _arguments_section(doc) == args and "Value:" in doc, (cls, method)
