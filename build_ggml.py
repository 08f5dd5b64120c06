#!/usr/bin/env python3
"""Fetch, patch and build the pinned ggml into ggmlpy/lib/.

    python build_ggml.py [--backends cpu,blas,vulkan,cuda,rpc] [--cuda-arch 90] [--force] [--jobs N]

Steps: read ggml.pin -> download the pinned sdist straight from the package index pip is configured
with (it is only data: nothing of it is built or resolved by pip) -> check its sha256 -> unpack its
ggml tree and apply patches/*.patch inside the cache -> CMake with GGML_BACKEND_DL (each backend its
own loadable module) -> copy the libraries into ggmlpy/lib/ together with build_info.json. The patched
tree is also copied to vendor/ggml/ (the cffi extension compiles against its headers).

A build whose source, patches and options are unchanged is reused from the cache
(``$GGMLPY_CACHE`` or ``~/.cache/ggmlpy``), so repeated installs are quick. The backends also come
from ``$GGMLPY_BACKENDS`` (default ``cpu,blas``: the BLAS backend is built when OpenBLAS is installed --
``apt-get install libopenblas-dev libopenblas0-openmp`` -- and left out, with a message, when it is not;
it loads OpenBLAS's OpenMP build where that is installed, see ``openblas_openmp_dir``).

The cache may be shared by several checkouts building at once, and survives interrupted builds:

    archives/<sdist>   downloaded under a temporary name, checked, then renamed into place
    src/<key>/         the patched ggml tree, made in a temporary folder, then renamed into place;
                       every checkout configures CMake from here, so build folders never depend
                       on where a checkout lies
    build/<key>/       CMake build folders; ``.ggmlpy-built`` is written last, after a successful build
                       (a folder without it is resumed or wiped, never trusted)
    locks/             fcntl locks: two builds of the same key wait for each other, others run at once
"""
from __future__ import annotations

import argparse
import collections
import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent
PIN_FILE = ROOT / "ggml.pin"
PATCH_DIR = ROOT / "patches"
VENDOR_DIR = ROOT / "vendor" / "ggml"
LIB_DIR = ROOT / "ggmlpy" / "lib"
KNOWN_BACKENDS = ("cpu", "blas", "vulkan", "cuda", "rpc")
# What a plain ``pip install .`` builds. "blas" (ggml's BLAS backend on OpenBLAS: MUL_MAT and OUT_PROD
# through cblas_sgemm, 2-4x ggml's own F32 kernels) is dropped with a message when OpenBLAS is missing.
DEFAULT_BACKENDS = "cpu,blas"
BLAS_HINT = ("apt-get install libopenblas-dev libopenblas0-openmp (Debian/Ubuntu; dnf install openblas-devel "
             "on Fedora)")
BLAS_OPENMP_HINT = "apt-get install libopenblas0-openmp (Debian/Ubuntu)"
# Bump when the way we configure or install changes, so old cache entries are not reused.
BUILD_RECIPE_VERSION = "4"
SOURCE_STAMP = ".ggmlpy-source"
BUILT_STAMP = ".ggmlpy-built"
PYPI_SIMPLE = "https://pypi.org/simple/"


class BuildError(RuntimeError):
    """A build step failed; the message says what to install or change."""


class ChecksumMismatch(BuildError):
    """A file (or an index's listing of it) does not match the pinned sha256."""


# ------------------------------------------------------------------------------------------ messages

_tty: object = None  # None: not looked for yet; False: none to write to
_tty_lines = 0


def _progress_tty():
    """pip captures a build's output and shows it only with -v or on failure; when pip runs us from a
    terminal, progress lines also go to that terminal (GGMLPY_PROGRESS=0 turns this off)."""
    global _tty
    if _tty is None:
        _tty = False
        under_pip = "PIP_BUILD_TRACKER" in os.environ or "PIP_REQ_TRACKER" in os.environ
        if under_pip and os.environ.get("GGMLPY_PROGRESS", "1") != "0" and not sys.stderr.isatty():
            try:
                _tty = open("/dev/tty", "w")  # noqa: SIM115 - kept open for the whole build
            except OSError:
                _tty = False
    return _tty or None


def log(msg: str) -> None:
    line = f"[ggmlpy] {msg}"
    print(line, file=sys.stderr, flush=True)
    tty = _progress_tty()
    if tty is not None:
        global _tty_lines
        try:
            # The first line starts below pip's "Building wheel for ggmlpy ..."; later ones clear the
            # spinner character pip wrote at the start of the line.
            tty.write(("\n" if _tty_lines == 0 else "\r\033[K") + line + "\n")
            tty.flush()
            _tty_lines += 1
        except OSError:
            pass


def cache_root() -> Path:
    return Path(os.environ.get("GGMLPY_CACHE") or Path.home() / ".cache" / "ggmlpy")


def read_pin() -> dict:
    return json.loads(PIN_FILE.read_text())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------- locks and atomic writes

_held_locks: list[int] = []  # descriptors of the locks held; build commands inherit them


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive fcntl lock on ``path``; waits (saying so) while another process holds it.
    The kernel drops the lock when its holder exits, however it exits (Ctrl-C, kill -9) -- and the
    build commands started under it hold it too, so a compiler outliving a killed build still keeps
    the next build out of its folder until it ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    _held_locks.append(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            log(f"waiting for {holder} to finish {what} (lock {path})")
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log(f"waited {time.monotonic() - started:.0f} s for {what}")
        except OSError as exc:  # a file system without locks: go on, as before locks existed
            log(f"cannot lock {path} ({exc}); do not run two builds into this cache at once")
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        _held_locks.remove(fd)
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(new: Path, target: Path) -> None:
    """Put the complete folder ``new`` at ``target`` (same file system) by renames: ``target`` is never
    half-written (between the two renames it is briefly absent). The caller holds the lock guarding
    ``target``."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        remove_tree(old)
        os.rename(target, old)
    os.rename(new, target)
    if old is not None:
        remove_tree(old)


def remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def remove_leftovers(folder: Path, *patterns: str) -> None:
    """Remove the temporary folders killed builds left behind. Only called under the lock that every
    writer of those folders holds, so none of them is in use."""
    for pattern in patterns:
        for p in folder.glob(pattern):
            with contextlib.suppress(OSError):
                remove_tree(p)


# ------------------------------------------------------------------------------- fetching the archive

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
        def __init__(self):
            super().__init__()
            self.base: str | None = None
            self.hrefs: list[str] = []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "base" and attrs.get("href") and self.base is None:
                self.base = attrs["href"]
            elif tag == "a" and attrs.get("href"):
                self.hrefs.append(attrs["href"])

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


# ------------------------------------------------------------------------------- the patched source

def patch_files() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch")) if PATCH_DIR.is_dir() else []


def source_key(pin: dict) -> str:
    h = hashlib.sha256(pin["sha256"].encode())
    for p in patch_files():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _stamp_is(stamp: Path, key: str) -> bool:
    try:
        return stamp.read_text().strip() == key
    except OSError:
        return False


def source_tree(pin: dict, archive: Path) -> Path:
    """``<cache>/src/<key>/``: the archive's ggml tree with our patches applied; made once per key
    (in a temporary folder renamed into place), shared by every checkout and build."""
    key = source_key(pin)
    src_root = cache_root() / "src"
    dest = src_root / key
    if _stamp_is(dest / SOURCE_STAMP, key):
        return dest
    with file_lock(cache_root() / "locks" / f"src-{key}.lock", f"unpacking ggml ({key})"):
        if _stamp_is(dest / SOURCE_STAMP, key):
            return dest
        remove_leftovers(src_root, f"{key}.tmp-*", f".{key}.old-*")
        tmp = src_root / f"{key}.tmp-{os.getpid()}"
        remove_tree(tmp)
        started = time.monotonic()
        unpack(pin, archive, tmp)
        apply_patches(pin, tmp)
        write_atomic(tmp / SOURCE_STAMP, key + "\n")
        replace_dir(tmp, dest)
        log(f"unpacked and patched ggml {pin['ggml_version']} ({len(patch_files())} patches, "
            f"{time.monotonic() - started:.1f} s)")
    return dest


def unpack(pin: dict, archive: Path, dest: Path) -> None:
    import tarfile

    prefix = pin["subdir"].rstrip("/") + "/"
    dest.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            m.name = m.name[len(prefix):]
            if m.name and not m.name.startswith(("/", "..")) and "/../" not in m.name:
                members.append(m)
        if not members:
            raise BuildError(f"{archive.name} has no {prefix} folder")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # Python < 3.9.17 / 3.10.12 / 3.11.4: names were checked above; no links or devices
            tar.extractall(dest, members=[m for m in members if m.isfile() or m.isdir()])


def apply_patches(pin: dict, tree: Path) -> None:
    for patch in patch_files():
        proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)],
                              cwd=tree, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"patch {patch.name} does not apply to ggml {pin['ggml_version']}:\n"
                             f"{proc.stdout}{proc.stderr}")


def sync_vendor(src: Path, key: str) -> None:
    """Make vendor/ggml/ of this checkout a copy of the patched tree (its headers compile the cffi
    extension), replaced as a whole when the source key changes."""
    if _stamp_is(VENDOR_DIR / SOURCE_STAMP, key):
        return
    VENDOR_DIR.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(VENDOR_DIR.parent / ".ggmlpy.lock", "updating this checkout's vendor/ggml"):
        if _stamp_is(VENDOR_DIR / SOURCE_STAMP, key):
            return
        remove_leftovers(VENDOR_DIR.parent, f".{VENDOR_DIR.name}.tmp-*", f".{VENDOR_DIR.name}.old-*")
        tmp = VENDOR_DIR.parent / f".{VENDOR_DIR.name}.tmp-{os.getpid()}"
        remove_tree(tmp)
        shutil.copytree(src, tmp, symlinks=True)
        replace_dir(tmp, VENDOR_DIR)
        log(f"copied the patched ggml tree to {VENDOR_DIR}")


# ----------------------------------------------------------------------------- options per backend

def cpu_flag_options() -> list[str]:
    """GGML_NATIVE cannot be combined with GGML_BACKEND_DL, so name this CPU's features."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []  # ggml's defaults for the architecture
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return []
    wanted = {
        "GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_BMI2": "bmi2",
        "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX512": "avx512f",
        "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
        "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni",
    }
    return [f"-D{opt}={'ON' if feat in flags else 'OFF'}" for opt, feat in wanted.items()]


def require_tool(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise BuildError(f"'{tool}' was not found on PATH. {hint}")
    return path


def vulkan_options() -> list[str]:
    require_tool("glslc", "The Vulkan backend compiles its shaders with glslc: "
                          "apt-get install glslc libvulkan-dev (or install the Vulkan SDK).")
    headers = [Path("/usr/include/vulkan/vulkan.hpp"), Path("/usr/local/include/vulkan/vulkan.hpp")]
    sdk = os.environ.get("VULKAN_SDK")
    if sdk:
        headers.append(Path(sdk) / "include" / "vulkan" / "vulkan.hpp")
    if not any(h.exists() for h in headers):
        raise BuildError("Vulkan C++ headers (vulkan/vulkan.hpp) were not found: "
                         "apt-get install libvulkan-dev (or set VULKAN_SDK).")
    spirv = [Path("/usr/include/spirv/unified1/spirv.hpp"), Path("/usr/local/include/spirv/unified1/spirv.hpp")]
    if sdk:
        spirv.append(Path(sdk) / "include" / "spirv" / "unified1" / "spirv.hpp")
    if not any(h.exists() for h in spirv):
        raise BuildError("SPIR-V headers were not found (ggml's Vulkan build needs them): "
                         "apt-get install spirv-headers (or set VULKAN_SDK).")
    return ["-DGGML_VULKAN=ON"]


def cuda_options(cuda_arch: str | None) -> tuple[list[str], list[str]]:
    """CMake options of the CUDA backend, and the folders its module loads libraries from."""
    toolkit = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    nvcc = str(toolkit / "bin" / "nvcc") if (toolkit / "bin" / "nvcc").exists() else shutil.which("nvcc")
    if not nvcc:
        raise BuildError("The CUDA backend needs nvcc: install the CUDA toolkit "
                         "(https://developer.nvidia.com/cuda-downloads) and put nvcc on PATH or set CUDA_HOME.")
    if not (toolkit / "bin" / "nvcc").exists():
        toolkit = Path(nvcc).resolve().parent.parent
    opts = ["-DGGML_CUDA=ON", "-DGGML_CUDA_FA=OFF", "-DGGML_CUDA_NO_VMM=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    arch = cuda_arch or os.environ.get("GGMLPY_CUDA_ARCH") or detect_cuda_arch() or "75;80;86;89;90"
    opts.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    cublas, cublas_lib = cublas_options(toolkit)
    return opts + cublas, cuda_runtime_dirs(toolkit, cublas_lib)


def cuda_runtime_dirs(toolkit: Path, cublas_lib: Path | None) -> list[str]:
    """Where the CUDA module finds cudart and cuBLAS at run time, wherever they live."""
    return [str(toolkit / "lib64"), str(toolkit / "lib")] + ([str(cublas_lib)] if cublas_lib else [])


def detect_cuda_arch() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                          capture_output=True, text=True)
    caps = sorted({c.strip().replace(".", "") for c in proc.stdout.split() if c.strip()})
    return ";".join(caps) or None


def cublas_options(toolkit: Path) -> tuple[list[str], Path | None]:
    """cuBLAS from the toolkit, else from the nvidia-cublas wheel (which lacks unversioned names);
    returns the CMake options and the wheel's library folder (None for the toolkit's)."""
    if list(toolkit.glob("**/libcublas.so")) and list(toolkit.glob("**/cublas_v2.h")):
        return [], None
    base = _cublas_wheel_dir()
    if base is None:
        raise BuildError("cuBLAS was not found in the CUDA toolkit: pip install nvidia-cublas "
                         "(or install the toolkit's libcublas-dev)")
    link_dir = cache_root() / "cublas-links"
    link_dir.mkdir(parents=True, exist_ok=True)
    opts = [f"-DCMAKE_CUDA_FLAGS=-I{base / 'include'}", f"-DCMAKE_CXX_FLAGS=-I{base / 'include'}"]
    for name, var in (("libcublas", "CUDA_cublas_LIBRARY"), ("libcublasLt", "CUDA_cublasLt_LIBRARY")):
        real = sorted((base / "lib").glob(f"{name}.so.*"))
        if not real:
            raise BuildError(f"{name}.so.* missing from the nvidia-cublas wheel at {base}")
        link = link_dir / f"{name}.so"
        if not (link.is_symlink() and os.readlink(link) == str(real[0])):
            tmp = link_dir / f".{name}.so.{os.getpid()}"  # replaced atomically: builds may run at once
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(real[0])
            os.replace(tmp, link)
        opts.append(f"-D{var}={link}")
    return opts, base / "lib"


def _cublas_wheel_dir() -> Path | None:
    """The folder of the nvidia-cublas wheel holding include/cublas_v2.h and lib/libcublas.so.* (its layout
    changed between releases: nvidia/cublas/ or nvidia/cu13/)."""
    try:
        import nvidia  # type: ignore[import-not-found]  # namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in map(Path, nvidia.__path__):
        for header in sorted(root.glob("*/include/cublas_v2.h")):
            if list((header.parent.parent / "lib").glob("libcublas.so.*")):
                return header.parent.parent
    return None


def cmake_options(backends: list[str], cuda_arch: str | None) -> list[str]:
    opts = [
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON",
        "-DGGML_NATIVE=OFF", "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
        "-DGGML_CCACHE=OFF",
        # llamafile's tinyBLAS kernels for F32/F16 matrix products (llama.cpp builds them, ggml's own
        # CMake leaves them off): the products the BLAS backend does not take (sides < 32, batched
        # attention products) run on them instead of one vec_dot per output element.
        "-DGGML_LLAMAFILE=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ]
    rpath = ["$ORIGIN"]  # every library finds its siblings in its own folder (ggmlpy/lib/)
    opts += cpu_flag_options()
    if "vulkan" in backends:
        opts += vulkan_options()
    if "cuda" in backends:
        cuda, dirs = cuda_options(cuda_arch)
        opts += cuda
        rpath += dirs
    if "rpc" in backends:
        opts.append("-DGGML_RPC=ON")
    if "blas" in backends:
        opts += ["-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS"]
        openmp = openblas_openmp_dir()
        if openmp is not None:
            # Searched before the system's choice of libopenblas.so.0 (Debian's default: the pthreads build)
            rpath.append(str(openmp))
        else:
            log(f"OpenBLAS's OpenMP build was not found: the BLAS backend will use the system's default "
                f"OpenBLAS, whose own threads compete with ggml's for the cores (1.1-1.3x slower CNN and "
                f"transformer training). To get it: {BLAS_OPENMP_HINT}, then reinstall.")
    return opts + [f"-DCMAKE_INSTALL_RPATH={';'.join(rpath)}"]


def openblas_openmp_dir() -> Path | None:
    """The folder of Debian/Ubuntu's OpenMP build of OpenBLAS (``libopenblas0-openmp``), or None.

    ggml's CPU backend runs on OpenMP; OpenBLAS built on OpenMP runs its products on the same threads, so
    each can take every core (its pthreads build keeps a pool of its own whose idle workers spin beside
    ggml's). The BLAS backend links the generic ``libopenblas.so.0``; putting this folder in its run path
    makes it load the OpenMP build whatever the system's default is."""
    roots = sorted(Path("/usr/lib").glob("*-linux-gnu*")) + [Path("/usr/lib"), Path("/usr/lib64")]
    return next((d / "openblas-openmp" for d in roots if (d / "openblas-openmp" / "libopenblas.so.0").exists()),
                None)


def openblas_found() -> bool:
    """OpenBLAS's library and cblas.h, where ggml's CMake (FindBLAS with BLA_VENDOR=OpenBLAS, then
    pkg-config or the usual include folders) will look for them."""
    pkg = shutil.which("pkg-config")
    if pkg:
        for name in ("openblas", "openblas64"):
            if subprocess.run([pkg, "--exists", name], capture_output=True).returncode == 0:
                return True
    lib_dirs = ["/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/opt/homebrew/opt/openblas/lib", "/usr/local/opt/openblas/lib"]
    lib_dirs += os.environ.get("LIBRARY_PATH", "").split(os.pathsep)
    have_lib = any(list(Path(d).glob("libopenblas*.so")) + list(Path(d).glob("libopenblas*.dylib"))
                   for d in lib_dirs if d and Path(d).is_dir())
    inc_dirs = ["/usr/include", "/usr/local/include", "/usr/include/openblas",
                "/usr/include/x86_64-linux-gnu/openblas/include", "/opt/homebrew/opt/openblas/include"]
    have_header = any((Path(d) / "cblas.h").exists() for d in inc_dirs)
    return have_lib and have_header


def backends_from_env() -> list[str]:
    """The backends to build: $GGMLPY_BACKENDS, else DEFAULT_BACKENDS (whose "blas" is optional)."""
    text = os.environ.get("GGMLPY_BACKENDS", "").strip()
    return parse_backends(text) if text else parse_backends(DEFAULT_BACKENDS, optional=("blas",))


def parse_backends(text: str, optional: tuple[str, ...] = ()) -> list[str]:
    """The backends named in ``text`` (comma-separated), in build order. A backend in ``optional`` whose
    library is missing is left out with a message; one asked for by name is an error instead."""
    names = [b.strip().lower() for b in text.split(",") if b.strip()]
    if "blas" in names and not openblas_found():
        if "blas" in optional:
            log(f"OpenBLAS was not found: building without the BLAS backend (the CPU backend's own "
                f"matrix kernels are 2-4x slower for training). To get it: {BLAS_HINT}, then reinstall; "
                f"GGMLPY_BACKENDS=cpu silences this message.")
            names.remove("blas")
        else:
            raise BuildError(f"the BLAS backend needs OpenBLAS (library and cblas.h): {BLAS_HINT}; "
                             f"or leave 'blas' out of GGMLPY_BACKENDS")
    unknown = [b for b in names if b not in KNOWN_BACKENDS]
    if unknown:
        raise BuildError(f"unknown backend(s) {unknown}; expected a comma-separated subset of "
                         f"{', '.join(KNOWN_BACKENDS)}")
    if "cpu" not in names:
        names.insert(0, "cpu")  # the scheduler always needs a CPU backend last
    return sorted(set(names), key=KNOWN_BACKENDS.index)


# ------------------------------------------------------------------------------------------- the build

def build_key(src: Path, options: list[str]) -> str:
    """The cache key of a build: recipe, source tree (by its path inside the cache, which names its
    source key), CMake options and toolchain."""
    key_src = json.dumps([BUILD_RECIPE_VERSION, str(src), options, platform.machine(), sys.platform,
                          shutil.which("c++") or "", os.environ.get("CC", ""), os.environ.get("CXX", "")])
    return hashlib.sha256(key_src.encode()).hexdigest()[:16]


def default_jobs() -> int:
    env = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0)) or 2
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def build(backends: list[str], cuda_arch: str | None = None, force: bool = False,
          jobs: int | None = None) -> Path:
    started = time.monotonic()
    pin = read_pin()
    archive = fetch_archive(pin)
    src = source_tree(pin, archive)
    sync_vendor(src, source_key(pin))
    options = cmake_options(backends, cuda_arch)
    key = build_key(src, options)
    build_dir = cache_root() / "build" / key
    with file_lock(cache_root() / "locks" / f"build-{key}.lock", f"building ggml ({key})"):
        if force:
            remove_tree(build_dir)
        if _stamp_is(build_dir / BUILT_STAMP, key):
            log(f"ggml unchanged since the last build; reusing {build_dir}")
        else:
            cmake_build(src, build_dir, options, backends, jobs or default_jobs(), pin)
            write_atomic(build_dir / BUILT_STAMP, key + "\n")  # last: only a finished build has it
        install_libs(build_dir, backends, pin, key)
    log(f"ggml ready in {time.monotonic() - started:.1f} s")
    return LIB_DIR


def _configured_from(build_dir: Path) -> tuple[str, str]:
    """(source folder, generator) recorded in a build folder's CMakeCache.txt; empty when unreadable."""
    found = {"CMAKE_HOME_DIRECTORY": "", "CMAKE_GENERATOR": ""}
    try:
        for line in (build_dir / "CMakeCache.txt").read_text(errors="replace").splitlines():
            name, _, value = line.partition("=")
            name = name.split(":", 1)[0]
            if name in found:
                found[name] = value
    except OSError:
        pass
    return found["CMAKE_HOME_DIRECTORY"], found["CMAKE_GENERATOR"]


def cmake_build(src: Path, build_dir: Path, options: list[str], backends: list[str], jobs: int,
                pin: dict) -> None:
    """Configure and build into ``build_dir`` (the caller holds its lock). A folder left by an
    interrupted build is resumed when Ninja drives it (Ninja redoes whatever did not finish), and
    otherwise -- or when resuming fails -- wiped and built from scratch."""
    require_tool("cmake", "apt-get install cmake (or pip install cmake).")
    ninja = shutil.which("ninja")
    generator = ["-G", "Ninja"] if ninja else []
    resume = False
    if build_dir.exists():
        resume = bool(ninja) and _configured_from(build_dir) == (str(src), "Ninja")
        log(f"{'resuming' if resume else 'removing'} the unfinished build in {build_dir}")
        if not resume:
            remove_tree(build_dir)
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    targets = ["ggml"] + [f"ggml-{b}" for b in backends]  # not ggml's other targets
    steps = [
        (f"configuring ggml {pin['ggml_version']} for backends {','.join(backends)}",
         ["cmake", "-S", str(src), "-B", str(build_dir), *generator, *options]),
        (f"compiling ggml with {jobs} jobs (the CPU backend takes about 45 s on 2 idle cores; "
         f"Vulkan about 4 min; CUDA much longer)",
         ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", *targets]),
    ]
    try:
        for message, cmd in steps:
            log(message)
            t0 = time.monotonic()
            cpu = run(cmd)
            log(f"{message.split(' ', 1)[0]} took {time.monotonic() - t0:.1f} s ({cpu:.1f} s of CPU time)")
    except BuildError:
        if not resume:
            raise
        log("resuming failed; building from scratch")
        remove_tree(build_dir)
        cmake_build(src, build_dir, options, backends, jobs, pin)


_PROGRESS = re.compile(r"^\[\s*(\d+)\s*/\s*(\d+)\s*\]|^\[\s*(\d+)%\]")


def run(cmd: list[str]) -> float:
    """Run a build command, its output kept for the error message, and return the CPU seconds it
    used; says how far a build got every 15 s (from Ninja's [n/N] or Make's [ n%] prefixes). The
    command runs in its own process group, which is stopped as a whole on Ctrl-C or an error here;
    it inherits the held locks (see file_lock)."""
    tail: collections.deque[str] = collections.deque(maxlen=300)
    last_report = time.monotonic()
    cpu_before = os.times()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1, start_new_session=True,
                                pass_fds=tuple(_held_locks))
    except OSError as exc:
        raise BuildError(f"could not run {cmd[0]}: {exc}") from None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            m = _PROGRESS.match(line)
            if m and time.monotonic() - last_report >= 15:
                last_report = time.monotonic()
                log(f"  {m.group(1)}/{m.group(2)} steps" if m.group(1) else f"  {m.group(3)}%")
        returncode = proc.wait()
    except BaseException:  # Ctrl-C: stop the compilers too
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    if returncode != 0:
        raise BuildError(f"command failed (exit {returncode}): {' '.join(cmd)}\n{''.join(tail)[-8000:]}")
    cpu_after = os.times()
    return (cpu_after.children_user - cpu_before.children_user
            + cpu_after.children_system - cpu_before.children_system)


def install_libs(build_dir: Path, backends: list[str], pin: dict, key: str) -> None:
    """Copy the core libraries under their SONAMEs and every backend module into ggmlpy/lib/, which
    is replaced as a whole (never left half-copied)."""
    LIB_DIR.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(VENDOR_DIR.parent / ".ggmlpy.lock", "installing into this checkout's ggmlpy/lib"):
        remove_leftovers(LIB_DIR.parent, f".{LIB_DIR.name}.tmp-*", f".{LIB_DIR.name}.old-*")
        stage = LIB_DIR.parent / f".{LIB_DIR.name}.tmp-{os.getpid()}"
        remove_tree(stage)
        stage.mkdir()
        try:
            for core in ("libggml-base.so.0", "libggml.so.0"):
                src = build_dir / "src" / core
                if not src.exists():
                    raise BuildError(f"expected {src} after the build")
                shutil.copy2(src.resolve(), stage / core)
            for module in sorted((build_dir / "bin").glob("libggml-*.so")):
                shutil.copy2(module, stage / module.name)
            missing = [b for b in backends if not (stage / f"libggml-{b}.so").exists()]
            if missing:
                raise BuildError(f"the build produced no module for backend(s) {missing}")
            info = {"ggml_version": pin["ggml_version"], "pin_sha256": pin["sha256"], "backends": backends,
                    "build_key": key, "patches": [p.name for p in patch_files()]}
            (stage / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
            names = ", ".join(p.name for p in sorted(stage.iterdir()))
            replace_dir(stage, LIB_DIR)
        finally:
            remove_tree(stage)
    log(f"installed {names} into {LIB_DIR}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=None,
                    help="comma-separated subset of cpu,blas,vulkan,cuda,rpc (env GGMLPY_BACKENDS; "
                         f"default {DEFAULT_BACKENDS}, blas only when OpenBLAS is installed)")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES, e.g. 90")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache matches")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: the usable cores)")
    ap.add_argument("--print-source-dir", action="store_true",
                    help="only fetch and unpack, then print vendor/ggml's path")
    args = ap.parse_args(argv)
    try:
        if args.print_source_dir:
            pin = read_pin()
            sync_vendor(source_tree(pin, fetch_archive(pin)), source_key(pin))
            print(VENDOR_DIR)
            return 0
        backends = parse_backends(args.backends) if args.backends else backends_from_env()
        build(backends, args.cuda_arch, args.force, args.jobs)
    except BuildError as exc:
        print(f"build_ggml.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
