"""The ggmlR parity table (docs/parity.tsv -> docs/ggmlr-parity.md) stays honest.

Every export of ggmlR (one row each, exactly ``GGMLR_EXPORTS`` of them for ``GGMLR_VERSION``) has a
status; a ``mirrored`` / ``mirrored, differs`` row names a function ggmlpy exports and that some test
under tests/ uses; a ``not yet`` row names something ggmlpy does not export (else the row is stale);
rows that are not plainly mirrored say why in their note; the Markdown page is what the .tsv gives.

The checks are plain functions of the rows / the test files so that ``test_the_checks_can_fail`` can
show each of them failing on a broken copy.
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import ggmlpy as G
from tests.helpers import load_script, ROOT


TESTS = ROOT / "tests"

GGMLR_VERSION = "0.8.2"
GGMLR_EXPORTS = 667          # names exported by ggmlR 0.8.2's NAMESPACE

STATUSES = ("mirrored", "mirrored, differs", "not yet", "out of scope")
AVAILABLE = ("mirrored", "mirrored, differs")
NEED_NOTE = ("mirrored, differs", "not yet", "out of scope")

# Files whose mention of a name is not a test of it: this file (it lists every name). Add a file
# here only if all it does is enumerate names.
LISTING_FILES = {"test_parity.py"}


def _load_generator():
    return load_script("docs/parity.py", "ggmlpy_docs_parity")


parity = _load_generator()
ROWS = parity.read_rows()


def python_name(row: dict[str, str]) -> str:
    return row["ggmlpy_name"] or row["ggmlr_name"]


# ---------------------------------------------------------------- the checks

def table_problems(rows: list[dict[str, str]], expected: int = GGMLR_EXPORTS) -> list[str]:
    """Problems with the table itself: count, duplicates, statuses, families, notes."""
    problems = []
    if len(rows) != expected:
        problems.append(f"{len(rows)} rows, expected {expected} (ggmlR {GGMLR_VERSION}'s exports)")
    dups = sorted(n for n, k in Counter(r["ggmlr_name"] for r in rows).items() if k > 1)
    if dups:
        problems.append(f"duplicate ggmlR names: {dups}")
    for r in rows:
        name = r["ggmlr_name"]
        if r["status"] not in STATUSES:
            problems.append(f"{name}: status {r['status']!r} is not one of {STATUSES}")
        if r["family"] not in parity.FAMILIES:
            problems.append(f"{name}: unknown family {r['family']!r}")
        if r["status"] in NEED_NOTE and not r["note"]:
            problems.append(f"{name}: a {r['status']!r} row needs a note saying why / how it differs")
        if r["ggmlpy_name"] and r["status"] not in AVAILABLE:
            problems.append(f"{name}: a ggmlpy name on a {r['status']!r} row")
    return problems


def export_problems(rows: list[dict[str, str]], module=G) -> list[str]:
    """Mirrored rows must name an export of ggmlpy; not-yet rows must not (else the row is stale)."""
    problems = []
    exported = set(module.__all__)
    for r in rows:
        name = python_name(r)
        if r["status"] in AVAILABLE and not (name in exported and hasattr(module, name)):
            problems.append(f"{r['ggmlr_name']}: marked {r['status']!r} but ggmlpy does not export {name}")
        if r["status"] == "not yet" and name in exported:
            problems.append(f"{r['ggmlr_name']}: marked 'not yet' but ggmlpy exports it now: update docs/parity.tsv")
    return problems


def test_sources(tests_dir: Path = TESTS) -> dict[str, str]:
    """The text of every test module under ``tests_dir`` except the listing files."""
    return {str(p.relative_to(tests_dir)): p.read_text(encoding="utf-8")
            for p in sorted(tests_dir.rglob("*.py")) if p.name not in LISTING_FILES}


test_sources.__test__ = False  # a helper, not a test


def uncovered(names: set[str], sources: dict[str, str]) -> list[str]:
    """The names that occur, as a whole word, in none of the sources."""
    words = set()
    for text in sources.values():
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    return sorted(names - words)


def mirrored_names(rows: list[dict[str, str]]) -> set[str]:
    return {python_name(r) for r in rows if r["status"] in AVAILABLE}


# ---------------------------------------------------------------- the tests

def test_generator_and_test_agree_on_ggmlr_version():
    assert parity.GGMLR_VERSION == GGMLR_VERSION
    assert parity.STATUSES == STATUSES


def test_one_row_per_ggmlr_export_with_a_valid_status_and_note():
    problems = table_problems(ROWS)
    assert not problems, "\n".join(problems)


def test_every_mirrored_name_is_exported_and_no_not_yet_name_is():
    problems = export_problems(ROWS)
    assert not problems, "\n".join(problems)


def test_tests_cover_every_mirrored_name():
    missing = uncovered(mirrored_names(ROWS), test_sources())
    assert not missing, (f"{len(missing)} mirrored names that no test under tests/ uses "
                         f"(add a real test, e.g. to tests/public/test_parity_coverage.py): {missing}")


def test_markdown_page_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "parity.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = (ROOT / "docs" / "ggmlr-parity.md").read_text(encoding="utf-8").splitlines()
    first_cells = Counter(line.split(" | ")[0] for line in lines if line.startswith("| `"))
    assert first_cells == Counter(f"| `{r['ggmlr_name']}`" for r in ROWS)   # one table row per name


def test_the_generator_refuses_an_unknown_status(tmp_path):
    bad = tmp_path / "parity.tsv"
    bad.write_text("\t".join(parity.COLUMNS) + "\nggml_add\tops\tdone\t\t\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="unknown status"):
        parity.render(parity.read_rows(bad))


@pytest.mark.parametrize("damage", ["drop a row", "duplicate a row", "bad status", "no note",
                                    "unexported mirrored name", "stale not-yet", "lost test reference",
                                    "stale page"])
def test_the_checks_can_fail(damage, tmp_path):
    """Each check above fails on a copy of the table (or of the tests) with one thing broken."""
    rows = [dict(r) for r in ROWS]
    mirrored = next(r for r in rows if r["status"] == "mirrored")
    if damage == "drop a row":
        assert table_problems(rows[1:])
    elif damage == "duplicate a row":
        assert table_problems(rows[:-1] + [rows[0]])
    elif damage == "bad status":
        rows[0]["status"] = "mirorred"
        assert table_problems(rows)
    elif damage == "no note":
        next(r for r in rows if r["status"] == "out of scope")["note"] = ""
        assert table_problems(rows)
    elif damage == "unexported mirrored name":
        mirrored["ggmlpy_name"] = "ggml_no_such_function"
        assert export_problems(rows)
    elif damage == "stale not-yet":
        mirrored["status"] = "not yet"
        assert export_problems(rows)
    elif damage == "lost test reference":
        name = python_name(mirrored)
        sources = test_sources()
        assert name not in uncovered({name}, sources)
        pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
        stripped = {path: pattern.sub("removed", text) for path, text in sources.items()}
        assert uncovered({name}, stripped) == [name]
    elif damage == "stale page":
        rows[0]["note"] += " (edited)"
        page = (ROOT / "docs" / "ggmlr-parity.md").read_text(encoding="utf-8")
        assert parity.render(rows) != page
