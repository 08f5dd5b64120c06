#!/usr/bin/env python3
"""Build the documentation site: the README, the user guide and the API reference in one folder.

    python docs/build.py                 # writes docs/site/ (not tracked by git); open docs/site/index.html
    python docs/build.py --out DIR       # writes DIR instead
    python docs/build.py --no-check      # skips the check of every link in the rendered pages

The site mirrors the repository, so the relative links of the Markdown files keep working:

- README.md becomes index.html, and every other page ``P.md`` becomes ``P.html`` at the same path
  (docs/guide/models.md -> docs/guide/models.html). The pages are the README, every Markdown file under
  docs/, and every Markdown file those link to (patches/README.md, benchmarks/README.md).
- The API reference is rendered by pdoc into docs/api/, where ``pdoc -o docs/api ggmlpy`` puts it
  (docs/README.md), so a guide page links to it as ``../api/ggmlpy.html#ggml_fit``.
- Other repository files a page links to (examples, patches, images) are copied in at their paths.

After building, every link of the rendered pages is checked: the file it names exists in the site and,
for a link with ``#anchor``, that page has an element with that id. A broken link fails the build.

Needs pdoc (``pip install -e ".[docs]"``; it brings markdown2, which renders the Markdown). The API is
that of the ggmlpy package in this checkout.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit


ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "site"
API_DIR = "docs/api"             # where pdoc's pages go, relative to the site (and to the repository)
GUIDE_INDEX = "docs/guide/index.md"
MARKER = ".ggmlpy-docs-site"     # written into the output folder: only such a folder is ever emptied
GENERATED = ("docs/site", "docs/api")  # folders of generated files, never read as sources

MARKDOWN_EXTRAS = ["fenced-code-blocks", "tables", "code-friendly", "cuddled-lists", "strike"]

# ------------------------------------------------------------------------------ Markdown helpers
# (also used by tests/public/test_guide.py, so that the tests and the site agree on links and anchors)

_FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def without_fences(text: str) -> str:
    """The Markdown text with its fenced code blocks blanked out (the line count stays the same)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_code(text: str) -> str:
    """The Markdown text with fenced code blocks and inline code spans blanked out."""
    return _INLINE_CODE.sub("", without_fences(text))


def markdown_links(text: str) -> list[str]:
    """The targets of the inline links and images of a Markdown text, outside code."""
    return _LINK.findall(without_code(text))


def is_external(target: str) -> bool:
    return bool(urlsplit(target).scheme) or target.startswith("//")


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _dedupe(slugs: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for s in slugs:
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if n == 0 else f"{s}-{n}")
    return out


def _plain_heading(md: str) -> str:
    """A Markdown heading's text as rendered: links to their text, code spans and emphasis unmarked."""
    md = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", md)
    md = md.replace("`", "")
    md = re.sub(r"(\*\*|\*)(.+?)\1", r"\2", md)
    return html.unescape(md)


def heading_ids(text: str) -> list[str]:
    """The anchors of a Markdown text's headings (GitHub's, which the site uses too)."""
    return _dedupe([slug(_plain_heading(m.group(2))) for m in _HEADING.finditer(without_fences(text))])


def guide_order() -> list[str]:
    """The guide pages in the order of the table of contents (docs/guide/index.md), index first."""
    index = ROOT / GUIDE_INDEX
    order = [GUIDE_INDEX]
    for target in markdown_links(index.read_text(encoding="utf-8")):
        path = urlsplit(target).path
        if is_external(target) or not path.endswith(".md") or "/" in path:
            continue
        rel = f"docs/guide/{path}"
        if rel not in order and (ROOT / rel).is_file():
            order.append(rel)
    return order


def source_pages() -> list[str]:
    """The Markdown files the site is made of: the README, docs/**/*.md, and the .md files they link to."""
    pages = ["README.md"] + sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")
        if not any(p.relative_to(ROOT).as_posix().startswith(g + "/") for g in GENERATED))
    queue = list(pages)
    while queue:
        page = queue.pop()
        for target in markdown_links((ROOT / page).read_text(encoding="utf-8")):
            if is_external(target):
                continue
            path = urlsplit(target).path
            if not path.endswith(".md"):
                continue
            rel = _resolve(page, path)
            if rel is not None and rel not in pages and (ROOT / rel).is_file():
                pages.append(rel)
                queue.append(rel)
    return pages


def _resolve(page: str, path: str) -> str | None:
    """The repository path a relative link of ``page`` points to (None when it leaves the repository)."""
    if not path:
        return page
    target = os.path.normpath(os.path.join(os.path.dirname(page), path))
    if target.startswith(".."):
        return None
    return Path(target).as_posix()


def site_path(page: str) -> str:
    """Where a Markdown page lands in the site."""
    return "index.html" if page == "README.md" else page[:-3] + ".html"


# ------------------------------------------------------------------------------ rendering

_CSS = """
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
nav.top { padding: .6em 1.5em; background: #24292f; }
nav.top a { color: #fff; margin-right: 1.5em; text-decoration: none; font-weight: 600; }
main { max-width: 60em; margin: 0 auto; padding: 1em 1.5em 3em; }
a { color: #0969da; }
h1, h2, h3 { line-height: 1.25; margin-top: 1.6em; }
h1 { margin-top: .6em; }
code { font: .9em ui-monospace, SFMono-Regular, Menlo, monospace; background: #f3f4f6; padding: .1em .3em;
       border-radius: 4px; }
pre { background: #f6f8fa; padding: .8em 1em; overflow-x: auto; border-radius: 6px; line-height: 1.4; }
pre code { background: none; padding: 0; font-size: .85em; }
table { border-collapse: collapse; margin: 1em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: .35em .7em; vertical-align: top; text-align: left; }
th { background: #f6f8fa; }
img { max-width: 100%; }
nav.pager { display: flex; justify-content: space-between; max-width: 60em; margin: 0 auto; padding: 0 1.5em 2em; }
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - ggmlpy</title>
<style>{css}{pygments}</style>
</head>
<body>
<nav class="top"><a href="{up}index.html">ggmlpy</a><a href="{up}docs/guide/index.html">User guide</a>\
<a href="{up}{api}/ggmlpy.html">API reference</a></nav>
<main>
{body}
</main>
{pager}
</body>
</html>
"""


def _pygments_css() -> str:
    try:
        from pygments.formatters import HtmlFormatter
    except ImportError:
        return ""
    return HtmlFormatter().get_style_defs(".codehilite")


def _add_heading_ids(body: str) -> str:
    """Give every heading GitHub's id, so that links written for GitHub work in the site."""
    found = list(re.finditer(r"<h([1-6])>(.*?)</h\1>", body, re.S))
    ids = _dedupe([slug(html.unescape(re.sub(r"<[^>]+>", "", m.group(2)))) for m in found])
    for m, anchor in zip(reversed(found), reversed(ids)):
        level, inner = m.group(1), m.group(2)
        body = body[:m.start()] + f'<h{level} id="{anchor}">{inner}</h{level}>' + body[m.end():]
    return body


class BrokenLink(Exception):
    pass


def _rewrite_links(body: str, page: str, pages: set[str], copies: set[str]) -> str:
    """Point a page's relative links at the site's files: .md pages at their .html, other repository
    files at their copies (collected in ``copies``), the API reference where pdoc writes it."""
    problems = []

    def fix(m: re.Match) -> str:
        attr, url = m.group(1), html.unescape(m.group(2))
        if is_external(url) or url.startswith("#") or url.startswith("mailto:"):
            return m.group(0)
        parts = urlsplit(url)
        target = _resolve(page, parts.path)
        if target is None:
            problems.append(f"{page}: {url} leaves the repository")
            return m.group(0)
        if target == API_DIR or target.startswith(API_DIR + "/"):
            new = target                                  # generated by pdoc below
        elif target in pages:
            new = site_path(target)
        elif (ROOT / target).is_file():
            copies.add(target)
            new = target
        elif (ROOT / target).is_dir():
            problems.append(f"{page}: {url} is a folder (link a file in it instead)")
            return m.group(0)
        else:
            problems.append(f"{page}: {url} does not exist")
            return m.group(0)
        rel = os.path.relpath(new, os.path.dirname(site_path(page)) or ".")
        rel = Path(rel).as_posix() + (f"#{parts.fragment}" if parts.fragment else "")
        return f'{attr}="{html.escape(rel, quote=True)}"'

    body = re.sub(r'\b(href|src)="([^"]*)"', fix, body)
    if problems:
        raise BrokenLink("\n".join(problems))
    return body


def _pager(page: str, order: list[str]) -> str:
    if page not in order:
        return ""
    i = order.index(page)
    here = os.path.dirname(site_path(page))
    cells = []
    for j, label in ((i - 1, "&larr; "), (i + 1, "")):
        if 0 <= j < len(order):
            text = (ROOT / order[j]).read_text(encoding="utf-8")
            title = html.escape(_title(text, order[j]))
            href = Path(os.path.relpath(site_path(order[j]), here)).as_posix()
            cells.append(f'<a href="{href}">{label}{title}{"" if label else " &rarr;"}</a>')
        else:
            cells.append("<span></span>")
    return f'<nav class="pager">{cells[0]}{cells[1]}</nav>'


def _title(text: str, page: str) -> str:
    m = re.search(r"^#[ \t]+(.+)$", without_fences(text), re.M)
    return _plain_heading(m.group(1)).strip() if m else page


def render_pages(out: Path) -> list[str]:
    import markdown2

    pages = source_pages()
    order = guide_order()
    copies: set[str] = set()
    pygments = _pygments_css()
    problems = []
    for page in pages:
        text = (ROOT / page).read_text(encoding="utf-8")
        body = markdown2.markdown(text, extras=MARKDOWN_EXTRAS)
        body = _add_heading_ids(str(body))
        try:
            body = _rewrite_links(body, page, set(pages), copies)
        except BrokenLink as exc:
            problems.append(str(exc))
            continue
        dest = out / site_path(page)
        dest.parent.mkdir(parents=True, exist_ok=True)
        up = "../" * site_path(page).count("/")
        dest.write_text(_PAGE.format(title=html.escape(_title(text, page)), css=_CSS, pygments=pygments,
                                     up=up, api=API_DIR, body=body, pager=_pager(page, order)),
                        encoding="utf-8")
    if problems:
        raise BrokenLink("\n".join(problems))
    for rel in sorted(copies):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, out / rel)
    return [site_path(p) for p in pages]


def render_api(out: Path) -> None:
    """The API reference of this checkout's ggmlpy, by pdoc, with links back to the guide and a headed section
    per family of the public names (tools/exports.py's FAMILIES, given to the template as ``families``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import pdoc
    import pdoc.render

    from tools.exports import families

    pdoc.render.configure(docformat="google", template_directory=ROOT / "docs" / "pdoc-templates")
    pdoc.render.env.globals["families"] = families()
    try:
        pdoc.pdoc("ggmlpy", output_directory=out / API_DIR)
    finally:
        del pdoc.render.env.globals["families"]


# ------------------------------------------------------------------------------ checking the site

def check_site(out: Path, pages: list[str]) -> list[str]:
    """Every href/src of the rendered pages that stays inside the site names an existing file, and its
    #anchor (if any) an id on that page. Returns the broken ones."""
    ids: dict[Path, set[str]] = {}

    def ids_of(path: Path) -> set[str]:
        if path not in ids:
            text = path.read_text(encoding="utf-8", errors="replace")
            ids[path] = set(re.findall(r'\s(?:id|name)="([^"]+)"', text))
        return ids[path]

    broken = []
    for page in pages:
        path = out / page
        for url in re.findall(r'\b(?:href|src)="([^"]*)"', path.read_text(encoding="utf-8")):
            url = html.unescape(url)
            if is_external(url) or url.startswith("mailto:"):
                continue
            parts = urlsplit(url)
            target = (path.parent / parts.path).resolve() if parts.path else path.resolve()
            if not target.is_file():
                broken.append(f"{page}: {url} (no file {target})")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in ids_of(target):
                broken.append(f"{page}: {url} (no id {parts.fragment!r} in {target.name})")
    return broken


# ------------------------------------------------------------------------------ main

def _prepare(out: Path) -> None:
    if out.exists():
        if (out / MARKER).exists():
            shutil.rmtree(out)
        elif any(out.iterdir()):
            raise SystemExit(f"{out} exists and was not made by docs/build.py (no {MARKER}): refusing to empty it")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by docs/build.py; the whole folder is replaced by the next build\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default docs/site)")
    ap.add_argument("--no-check", action="store_true", help="do not check the links of the rendered pages")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    _prepare(out)
    try:
        pages = render_pages(out)
    except BrokenLink as exc:
        print(f"docs/build.py: broken links:\n{exc}", file=sys.stderr)
        return 1
    render_api(out)
    if not args.no_check:
        broken = check_site(out, pages)
        if broken:
            print("docs/build.py: broken links in the site:\n" + "\n".join(broken), file=sys.stderr)
            return 1
    shown = os.path.relpath(out) if out.is_relative_to(Path.cwd()) else str(out)
    print(f"docs/build.py: {len(pages)} pages and the API reference written to {shown}/; "
          f"open {shown}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
