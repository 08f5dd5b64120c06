"""Fetching the pinned sdist: a small client of the package index pip is configured with (pip.conf and
$PIP_* settings, --find-links folders and pages, PEP 503 simple indexes), sha256-verified downloads into
the cache, and pip itself as the last resort."""
from __future__ import annotations

import configparser
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
from pathlib import Path

from .cache import cache_root
from .messages import BuildError, ChecksumMismatch, log


PYPI_SIMPLE = "https://pypi.org/simple/"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_archive(pin: dict) -> Path:
    """The pinned sdist in the cache, downloaded if missing. Its sha256 is checked before it is given
    its name there, so a file at that name is always complete."""
    archive_dir = cache_root() / "archives"
    archive = archive_dir / pin["filename"]
    if archive.exists():
        if sha256_of(archive) == pin["sha256"]:
            return archive
        log(f"{archive} does not match the pinned sha256; downloading it again")  # and replacing it
    archive_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    errors: list[str] = []
    found_one = mismatch = False
    settings = pip_settings()
    for source in archive_sources(settings):
        try:
            url = find_in_source(source, pin, settings)
        except ChecksumMismatch as exc:
            found_one = mismatch = True
            errors.append(f"{source}: {exc}")
            continue
        except (OSError, ValueError, urllib.error.URLError) as exc:
            errors.append(f"{source}: {exc}")
            continue
        if url is None:
            errors.append(f"{source}: no {pin['filename']}")
            continue
        found_one = True
        log(f"downloading {pin['filename']} from {_display(url)}")
        try:
            download_verified(url, archive, pin["sha256"], settings)
        except (OSError, urllib.error.URLError, BuildError) as exc:
            mismatch = mismatch or isinstance(exc, ChecksumMismatch)
            errors.append(f"{_display(url)}: {exc}")
            continue
        log(f"downloaded and checked {pin['filename']} "
            f"({archive.stat().st_size / 1e6:.1f} MB, {time.monotonic() - started:.1f} s)")
        return archive
    if not found_one:
        # An index we cannot read ourselves (one needing keyring or netrc credentials, say): let pip
        # fetch the file, with every other package (the sdist's build tools) allowed only as wheels.
        try:
            return _fetch_with_pip(pin, archive)
        except BuildError as exc:
            errors.append(str(exc))
    raise (ChecksumMismatch if mismatch else BuildError)(
        f"could not download {pin['package']}=={pin['version']} ({pin['filename']}); "
        f"place that file, sha256 {pin['sha256']}, in {archive_dir}\n  " + "\n  ".join(errors))


def _display(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]  # never print credentials
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def pip_config_files() -> list[Path]:
    """pip's configuration files, in the order pip reads them (later ones win): site-wide, user (unless
    $PIP_CONFIG_FILE names an existing file), the virtual environment's, $PIP_CONFIG_FILE; none at all
    when $PIP_CONFIG_FILE is os.devnull."""
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs.split(os.pathsep) if d]
    files.append(Path("/etc/pip.conf"))
    if not (env_file and os.path.exists(env_file)):
        config_home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
        files += [Path.home() / ".pip" / "pip.conf", Path(config_home) / "pip" / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if env_file:
        files.append(Path(env_file))
    return files


def pip_settings() -> dict[str, str]:
    """The options pip itself would use for a download: its configuration files (sections global,
    install, download), then $PIP_* variables. Read directly, because pip is hidden inside pip's own
    isolated build environment (and options given on pip's command line reach no build backend)."""
    settings: dict[str, str] = {}
    for path in pip_config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "install", "download"):
            if parser.has_section(section):
                settings.update({k.replace("_", "-"): v for k, v in parser.items(section)})
    for name, value in os.environ.items():
        if name.startswith("PIP_"):
            settings[name[4:].lower().replace("_", "-")] = value
    return settings


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def archive_sources(settings: dict[str, str]) -> list[str]:
    """Where to look for the archive, local ones first: --find-links folders and pages, then the
    indexes (index-url, else PyPI, and every extra-index-url)."""
    find_links = (settings.get("find-links") or "").split()
    indexes = [] if _truthy(settings.get("no-index")) else \
        [settings.get("index-url") or PYPI_SIMPLE] + (settings.get("extra-index-url") or "").split()
    sources = [("link", s) for s in find_links] + [("index", s) for s in indexes]
    local = [s for s in sources if "://" not in s[1] or s[1].startswith("file:")]
    remote = [s for s in sources if s not in local]
    seen: list[str] = []
    for kind, where in local + remote:
        tagged = f"{kind}:{where}"
        if tagged not in seen:
            seen.append(tagged)
    return seen


def _links(page: str) -> tuple[str | None, list[str]]:
    """(the <base href>, every <a href>) of an HTML page."""
    import html.parser

    class Links(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.base: str | None = None
            self.hrefs: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            href = dict(attrs).get("href")
            if tag == "base" and href and self.base is None:
                self.base = href
            elif tag == "a" and href:
                self.hrefs.append(href)

    parser = Links()
    parser.feed(page)
    return parser.base, parser.hrefs


def _url_of(where: str) -> str:
    if "://" in where:
        return where
    return Path(where).expanduser().resolve().as_uri()


def find_in_source(source: str, pin: dict, settings: dict[str, str]) -> str | None:
    """The URL of the pinned file in one find-links location or simple (PEP 503) index; None if it is
    not there. A link whose #sha256= differs from the pin is refused."""
    import urllib.request

    kind, where = source.split(":", 1)
    base = _url_of(where)
    if kind == "index":
        base = base.rstrip("/") + "/" + re.sub(r"[-_.]+", "-", pin["package"]).lower() + "/"
    if base.startswith("file:"):
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(base).path))
        if path.is_dir():
            if (path / pin["filename"]).is_file():
                return (path / pin["filename"]).as_uri()
            path = path / "index.html"
            base = path.as_uri()
        if not path.is_file():
            return None
        page = path.read_bytes()
    else:
        request = urllib.request.Request(base, headers={"Accept": "text/html"})
        try:
            with _opener(settings).open(request, timeout=_timeout(settings)) as resp:
                page, base = resp.read(), resp.geturl()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
    page_base, hrefs = _links(page.decode("utf-8", errors="replace"))
    base = urllib.parse.urljoin(base, page_base) if page_base else base
    for href in hrefs:
        parts = urllib.parse.urlsplit(urllib.parse.urljoin(base, href))
        if urllib.parse.unquote(parts.path.rsplit("/", 1)[-1]) == pin["filename"]:
            listed = urllib.parse.parse_qs(parts.fragment).get("sha256", [None])[0]
            if listed and listed != pin["sha256"]:
                raise ChecksumMismatch(f"lists sha256 {listed} for {pin['filename']}, "
                                       f"not the pinned {pin['sha256']}; refusing it")
            return urllib.parse.urlunsplit(parts._replace(fragment=""))
    return None


def _timeout(settings: dict[str, str]) -> float:
    try:
        return float(settings.get("timeout") or settings.get("default-timeout") or 30)
    except ValueError:
        return 30.0


def _opener(settings: dict[str, str]):
    import ssl
    import urllib.request

    cafile = settings.get("cert")
    context = ssl.create_default_context(cafile=cafile if cafile and os.path.isfile(cafile) else None)
    handlers: list = [urllib.request.HTTPSHandler(context=context)]
    if settings.get("proxy"):
        proxy = settings["proxy"] if "://" in settings["proxy"] else "http://" + settings["proxy"]
        handlers.append(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    return urllib.request.build_opener(*handlers)


def download_verified(url: str, dest: Path, sha256: str, settings: dict[str, str]) -> None:
    """Download ``url`` to a temporary file beside ``dest``, check its sha256, rename it to ``dest``."""
    import urllib.request

    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": "ggmlpy-build"})
            with _opener(settings).open(request, timeout=_timeout(settings)) as resp:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    digest.update(chunk)
                    out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != sha256:
            raise ChecksumMismatch(f"sha256 mismatch for {dest.name}: expected {sha256}, got {got}; "
                             f"refusing to build from an unverified archive")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fetch_with_pip(pin: dict, archive: Path) -> Path:
    spec = f"{pin['package']}=={pin['version']}"
    log(f"asking pip to download {spec}")
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=archive.parent) as tmp:
        got = Path(tmp) / pin["filename"]
        errors = []
        for cmd, env in _pip_commands():
            # --only-binary :all: keeps pip from compiling the sdist's build tools (cmake among them)
            # from source to prepare its metadata; --no-binary for the package itself gets the sdist.
            cmd = cmd + ["download", "--no-deps", "--only-binary", ":all:", "--no-binary", pin["package"],
                         spec, "-d", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode == 0 and got.exists():
                break
            errors.append(f"$ {' '.join(cmd)}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        else:
            raise BuildError("pip could not download it either:\n" + "\n".join(errors))
        digest = sha256_of(got)
        if digest != pin["sha256"]:
            raise ChecksumMismatch(f"sha256 mismatch for {pin['filename']}: expected {pin['sha256']}, "
                             f"got {digest}; refusing to build from an unverified archive")
        os.replace(got, archive)
    return archive


def _pip_commands() -> list[tuple[list[str], dict]]:
    """Ways to run pip. Inside pip's isolated build environment pip itself is hidden (its PYTHONPATH
    overlay shadows the interpreter's site-packages), so also try without that overlay, and pip on PATH."""
    plain = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    commands = [([sys.executable, "-m", "pip"], dict(os.environ)), ([sys.executable, "-m", "pip"], plain)]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            commands.append(([found], plain))
    return commands
