"""build_ggml.py's cache, without building ggml: a fake ggml archive, a fake index and a fake
``cmake`` on PATH (which, like the real one, refuses a build folder configured from another source).

Every test works in its own fake checkout (a copy of build_ggml.py and of its package tools/ggml_build/
next to a fake ggml.pin) and its own cache, so nothing here touches this checkout's ggmlpy/lib/ or the
user's cache.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT


PACKAGE = "fake-ggml"
VERSION = "1.0"
FILENAME = f"fake_ggml-{VERSION}.tar.gz"
SUBDIR = f"fake_ggml-{VERSION}/ggml"

FAKE_CMAKE = r'''
import json, os, sys, time
from pathlib import Path

def event(**kw):
    kw.update(pid=os.getpid(), t=time.time())
    with open(os.environ["FAKE_CMAKE_LOG"], "a") as f:
        f.write(json.dumps(kw) + "\n")

args = sys.argv[1:]
if "--build" in args:
    build = Path(args[args.index("--build") + 1])
    event(what="build-start", dir=str(build))
    time.sleep(float(os.environ.get("FAKE_CMAKE_SLEEP", "0")))
    if os.environ.get("FAKE_CMAKE_FAIL"):
        print("fake compiler error")
        sys.exit(2)
    for rel in ("src/libggml-base.so.0", "src/libggml.so.0", "bin/libggml-cpu.so"):
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text("fake library\n")
    event(what="build-end", dir=str(build))
else:
    src, build = Path(args[args.index("-S") + 1]), Path(args[args.index("-B") + 1])
    cache = build / "CMakeCache.txt"
    if cache.exists():
        home = [l.split("=", 1)[1] for l in cache.read_text().splitlines() if l.startswith("CMAKE_HOME_DIRECTORY")]
        if home and home[0] != str(src):
            print(f'CMake Error: The source "{src}/CMakeLists.txt" does not match the source '
                  f'"{home[0]}/CMakeLists.txt" used to generate cache.')
            sys.exit(1)
    if not (src / "CMakeLists.txt").exists():
        print(f"CMake Error: no CMakeLists.txt in {src}")
        sys.exit(1)
    build.mkdir(parents=True, exist_ok=True)
    generator = args[args.index("-G") + 1] if "-G" in args else "Unix Makefiles"
    cache.write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\nCMAKE_GENERATOR:INTERNAL={generator}\n")
    event(what="configure", src=str(src), dir=str(build))
'''

PATCH = """\
--- a/include/ggml.h
+++ b/include/ggml.h
@@ -1 +1 @@
-#define FAKE_GGML 1
+#define FAKE_GGML 2
"""


def make_archive(path: Path, extra: bytes = b"") -> str:
    files = {f"{SUBDIR}/CMakeLists.txt": b"project(fake)\n", f"{SUBDIR}/include/ggml.h": b"#define FAKE_GGML 1\n",
             f"{SUBDIR}/src/ggml.c": b"int x;\n" + extra, f"fake_ggml-{VERSION}/PKG-INFO": b"Name: fake-ggml\n"}
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def world(tmp_path):
    """A fake archive and its sha256, a fake cmake (and ninja) on PATH, an empty cache, no pip config."""
    archive = tmp_path / "dist" / FILENAME
    archive.parent.mkdir()
    sha = make_archive(archive)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(f"#!{sys.executable}\n{FAKE_CMAKE}")
    (bin_dir / "ninja").write_text("#!/bin/sh\nexit 1\n")  # only looked for: cmake is fake
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    patch = shutil.which("patch")
    if patch is None:
        pytest.skip("the build needs 'patch' (apt-get install patch)")
    (bin_dir / "patch").symlink_to(patch)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "GGMLPY_", "FAKE_CMAKE"))}
    env.update(PATH=str(bin_dir), PIP_CONFIG_FILE=os.devnull,  # PATH: the fake tools only
               PIP_NO_INDEX="1", GGMLPY_CACHE=str(tmp_path / "cache"), FAKE_CMAKE_LOG=str(tmp_path / "cmake.log"))
    world = {"tmp": tmp_path, "archive": archive, "sha": sha, "env": env, "cache": tmp_path / "cache",
             "log": tmp_path / "cmake.log", "groups": []}
    yield world
    for group in world["groups"]:  # a fake compile a failed test left sleeping (if still that one)
        with contextlib.suppress(OSError):
            if str(tmp_path) in Path(f"/proc/{group}/cmdline").read_text():
                os.killpg(group, signal.SIGKILL)


_names = itertools.count()


def checkout(world, name: str, seed_archive: bool = True) -> Path:
    """A fake checkout: build_ggml.py and tools/ggml_build/, a pin for the fake archive, one patch;
    optionally the archive already in the cache."""
    root = world["tmp"] / name
    (root / "patches").mkdir(parents=True)
    (root / "ggmlpy").mkdir()
    (root / "build_ggml.py").write_text((ROOT / "build_ggml.py").read_text())
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "patches" / "0001-fake.patch").write_text(PATCH)
    (root / "ggml.pin").write_text(json.dumps({"package": PACKAGE, "version": VERSION, "filename": FILENAME,
                                               "sha256": world["sha"], "subdir": SUBDIR, "ggml_version": "0.0.1"}))
    if seed_archive:
        (world["cache"] / "archives").mkdir(parents=True, exist_ok=True)
        (world["cache"] / "archives" / FILENAME).write_bytes(world["archive"].read_bytes())
    return root


def start(world, root: Path, *args: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(root / "build_ggml.py"), "--backends", "cpu", *args], cwd=root,
                            env={**world["env"], **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 30) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return err


def events(world) -> list[dict]:
    if not world["log"].exists():
        return []
    return [json.loads(line) for line in world["log"].read_text().splitlines()]


def _pop_tools() -> dict:
    """Take the ``tools`` package and its modules out of sys.modules; returns them."""
    return {name: sys.modules.pop(name) for name in list(sys.modules) if name == "tools" or name.startswith("tools.")}


def import_cli(root: Path):
    """(build_ggml, tools.ggml_build) of a fake checkout, as its build_ggml.py imports them in this
    process. sys.path and sys.modules are put back afterwards, so every call imports its own checkout's
    copy, never this checkout's or another test's (the package imports its modules at the top only, so
    nothing is looked up there later)."""
    saved_path, saved_modules = sys.path[:], _pop_tools()
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location(f"build_ggml_under_test_{next(_names)}", root / "build_ggml.py")
        cli = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cli)
        package = sys.modules["tools.ggml_build"]
    finally:
        sys.path[:] = saved_path
        _pop_tools()
        sys.modules.update(saved_modules)
    assert package.checkout.ROOT == root.resolve()  # the fake checkout's paths, not this checkout's
    return cli, package


def load(world, root: Path, monkeypatch):
    """The build package (tools.ggml_build) of a fake checkout, imported by its build_ggml.py in this
    process with the world's environment."""
    for k in list(os.environ):
        if k.startswith(("PIP_", "GGMLPY_")):
            monkeypatch.delenv(k)
    for k, v in world["env"].items():
        monkeypatch.setenv(k, v)
    cli, package = import_cli(root)
    assert cli.build is package.builder.build and cli.read_pin is package.checkout.read_pin
    return package


def patch_used_by(monkeypatch, caller, name: str, value) -> None:
    """Replace the global ``name`` where ``caller`` looks it up: in the module that defines ``caller``
    (a name imported into another module is a second binding there; patching that one changes nothing)."""
    assert name in caller.__code__.co_names and name in caller.__globals__, f"{caller.__qualname__} uses no {name}"
    monkeypatch.setitem(caller.__globals__, name, value)


def installed(root: Path) -> dict:
    assert [p.name for p in (root / "ggmlpy").iterdir()] == ["lib"]  # no staging folder left
    info = json.loads((root / "ggmlpy" / "lib" / "build_info.json").read_text())
    assert {p.name for p in (root / "ggmlpy" / "lib").iterdir()} == {
        "build_info.json", "libggml-base.so.0", "libggml.so.0", "libggml-cpu.so"}
    return info


# ------------------------------------------------------------------------------------------- tests

def test_two_checkouts_share_one_build_configured_from_the_cache_not_from_either_checkout(world):
    a, b = checkout(world, "a"), checkout(world, "b")
    finish(start(world, a))
    finish(start(world, b))
    assert installed(a)["build_key"] == installed(b)["build_key"]
    configures = [e for e in events(world) if e["what"] == "configure"]
    builds = [e for e in events(world) if e["what"] == "build-start"]
    assert len(configures) == len(builds) == 1  # b reused a's build
    src = Path(configures[0]["src"])
    assert src.parent == world["cache"] / "src"  # neither a/vendor/ggml nor b/vendor/ggml
    assert (src / "include" / "ggml.h").read_text() == "#define FAKE_GGML 2\n"  # patched
    for root in (a, b):  # each checkout still gets its own vendor/ggml (the cffi build's headers)
        assert (root / "vendor" / "ggml" / "include" / "ggml.h").read_text() == "#define FAKE_GGML 2\n"


def test_two_source_paths_never_share_a_cmake_build_folder(world, monkeypatch):
    build_key = load(world, checkout(world, "a"), monkeypatch).builder.build_key
    options = ["-DGGML_X=ON"]
    assert build_key(Path("/one/src"), options) != build_key(Path("/two/src"), options)
    assert build_key(Path("/one/src"), options) == build_key(Path("/one/src"), list(options))
    assert build_key(Path("/one/src"), options) != build_key(Path("/one/src"), ["-DGGML_X=OFF"])


def test_a_different_patch_set_gets_its_own_source_tree_and_build(world):
    a, b = checkout(world, "a"), checkout(world, "b")
    (b / "patches" / "0002-more.patch").write_text(PATCH.replace("FAKE_GGML 1", "FAKE_GGML 2").replace(
        "+#define FAKE_GGML 2", "+#define FAKE_GGML 3"))
    pa, pb = start(world, a), start(world, b)  # at once: different keys do not wait for each other
    finish(pa), finish(pb)
    configures = [e for e in events(world) if e["what"] == "configure"]
    assert len({e["src"] for e in configures}) == 2 and len({e["dir"] for e in configures}) == 2
    assert installed(a)["build_key"] != installed(b)["build_key"]
    assert (b / "vendor" / "ggml" / "include" / "ggml.h").read_text() == "#define FAKE_GGML 3\n"


def test_concurrent_builds_of_one_key_wait_for_each_other(world):
    a, b = checkout(world, "a"), checkout(world, "b")
    # --force: both really build, one after the other, never at the same time in the same folder
    procs = [start(world, root, "--force", FAKE_CMAKE_SLEEP="0.5") for root in (a, b)]
    errs = [finish(p) for p in procs]
    assert sum("to finish building ggml" in e for e in errs) == 1, errs
    spans = {}
    for e in events(world):
        if e["what"].startswith("build-"):
            spans.setdefault(e["pid"], {})[e["what"]] = e["t"]
    assert len(spans) == 2
    (s1, e1), (s2, e2) = sorted((s["build-start"], s["build-end"]) for s in spans.values())
    assert e1 <= s2, "two builds of the same key ran at the same time"
    assert installed(a) == installed(b)


def test_concurrent_builds_without_force_build_once(world):
    a, b = checkout(world, "a"), checkout(world, "b")
    procs = [start(world, root, FAKE_CMAKE_SLEEP="0.5") for root in (a, b)]
    errs = [finish(p) for p in procs]
    assert len([e for e in events(world) if e["what"] == "build-start"]) == 1
    assert sum("reusing" in e for e in errs) == 1, errs
    assert installed(a) == installed(b)


def _built_stamps(world) -> list[Path]:
    return list((world["cache"] / "build").glob("*/.ggmlpy-built"))


def _wait_for_compiler(world, proc) -> int:
    """The pid of the fake compile once it has started (it leads its own process group)."""
    deadline = time.monotonic() + 20
    while True:
        started = [e["pid"] for e in events(world) if e["what"] == "build-start"]
        if started:
            world["groups"].append(started[-1])
            return started[-1]
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the build never started compiling"
        time.sleep(0.02)


def test_a_build_killed_midway_leaves_no_stamp_and_the_next_build_redoes_it(world):
    a = checkout(world, "a")
    proc = start(world, a, FAKE_CMAKE_SLEEP="60")
    compiler = _wait_for_compiler(world, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the whole build, compiler included
    os.killpg(compiler, signal.SIGKILL)
    proc.communicate()
    assert _built_stamps(world) == []
    assert not (a / "ggmlpy" / "lib").exists()
    err = finish(start(world, a), timeout=20)  # the lock died with its holders: no wait
    assert "waiting" not in err and "resuming the unfinished build" in err  # Ninja: resumed, not trusted
    assert [e["what"] for e in events(world)] == ["configure", "build-start", "configure", "build-start",
                                                 "build-end"]
    assert len(_built_stamps(world)) == 1
    installed(a)


def test_ctrl_c_stops_the_compile_and_leaves_no_stamp(world):
    a = checkout(world, "a")
    proc = start(world, a, FAKE_CMAKE_SLEEP="60")
    compiler = _wait_for_compiler(world, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    with pytest.raises(ProcessLookupError):  # the compile (its own process group) was stopped too
        for _ in range(200):
            os.killpg(compiler, 0)
            time.sleep(0.05)
    assert _built_stamps(world) == []
    finish(start(world, a))
    assert len(_built_stamps(world)) == 1


def test_a_compiler_outliving_its_killed_build_keeps_the_next_build_waiting(world):
    a = checkout(world, "a")
    proc = start(world, a, FAKE_CMAKE_SLEEP="1.0")
    _wait_for_compiler(world, proc)
    proc.kill()  # kill -9 of build_ggml alone: its compile goes on, still holding the lock
    proc.communicate()
    err = finish(start(world, a), timeout=20)
    assert "to finish building ggml" in err
    evs = events(world)
    first_end = next(e["t"] for e in evs if e["what"] == "build-end")
    second_configure = [e["t"] for e in evs if e["what"] == "configure"][1]
    assert first_end <= second_configure, "the next build went into the folder while it was being built"
    installed(a)


def test_a_failed_build_without_ninja_is_wiped_and_redone(world):
    a = checkout(world, "a")
    (world["tmp"] / "bin" / "ninja").unlink()  # so CMake's default generator (Make)
    proc = start(world, a, FAKE_CMAKE_FAIL="1")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "fake compiler error" in err
    assert _built_stamps(world) == []
    leftover = next((world["cache"] / "build").iterdir())
    (leftover / "half-written.o").write_text("garbage")
    err = finish(start(world, a))
    assert "removing the unfinished build" in err
    assert not (leftover / "half-written.o").exists()
    assert len(_built_stamps(world)) == 1
    installed(a)


def test_a_half_made_source_tree_is_not_trusted(world, monkeypatch):
    a = checkout(world, "a")
    bg = load(world, a, monkeypatch)
    pin = bg.checkout.read_pin()
    half = world["cache"] / "src" / bg.source.source_key(pin)
    (half / "include").mkdir(parents=True)  # as if it had been left without its stamp
    leftover = half.with_name(half.name + ".tmp-999999")  # a killed unpacking's temporary folder
    (leftover / "include").mkdir(parents=True)
    src = bg.source.source_tree(pin, bg.index.fetch_archive(pin))
    assert src == half and (src / "include" / "ggml.h").read_text() == "#define FAKE_GGML 2\n"
    assert (src / ".ggmlpy-source").read_text().strip() == bg.source.source_key(pin)
    assert sorted(p.name for p in src.parent.iterdir()) == [half.name]


def no_pip(*args):
    raise AssertionError("pip was asked to download the archive")


def _index(world, archive: Path, fragment: str = "") -> str:
    """A file:// simple index listing ``archive`` under the pinned file name."""
    page = world["tmp"] / "index" / PACKAGE
    page.mkdir(parents=True)
    (page / FILENAME).write_bytes(archive.read_bytes())
    (page / "index.html").write_text(f'<html><body><a href="{FILENAME}{fragment}">{FILENAME}</a></body></html>')
    return (world["tmp"] / "index").as_uri()


def test_the_archive_comes_from_the_configured_index_and_is_checked(world, monkeypatch):
    a = checkout(world, "a", seed_archive=False)
    index = _index(world, world["archive"], f"#sha256={world['sha']}")
    config = world["tmp"] / "pip.conf"
    config.write_text(f"[global]\nindex-url = {index}\n")
    world["env"].pop("PIP_NO_INDEX")
    bg = load(world, a, monkeypatch)
    patch_used_by(monkeypatch, bg.index.pip_settings, "pip_config_files", lambda: [config])  # not this machine's
    assert bg.index.archive_sources(bg.index.pip_settings()) == [f"index:{index}"]
    patch_used_by(monkeypatch, bg.index.fetch_archive, "_fetch_with_pip", no_pip)
    got = bg.index.fetch_archive(bg.checkout.read_pin())
    assert got == world["cache"] / "archives" / FILENAME
    assert hashlib.sha256(got.read_bytes()).hexdigest() == world["sha"]
    assert [p.name for p in got.parent.iterdir()] == [FILENAME]
    got.write_bytes(b"truncated")  # a damaged copy in the cache is replaced
    assert bg.index.fetch_archive(bg.checkout.read_pin()) == got
    assert hashlib.sha256(got.read_bytes()).hexdigest() == world["sha"]


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted-hash", "listed-hash"])
def test_an_archive_with_another_checksum_is_refused(world, monkeypatch, listed):
    a = checkout(world, "a", seed_archive=False)
    tampered = world["tmp"] / "tampered" / FILENAME
    tampered.parent.mkdir()
    bad_sha = make_archive(tampered, extra=b"/* evil */\n")
    index = _index(world, tampered, f"#sha256={bad_sha}" if listed else "")
    world["env"].pop("PIP_NO_INDEX")
    world["env"]["PIP_INDEX_URL"] = index
    bg = load(world, a, monkeypatch)
    patch_used_by(monkeypatch, bg.index.fetch_archive, "_fetch_with_pip", no_pip)
    with pytest.raises(bg.messages.ChecksumMismatch, match="sha256"):
        bg.index.fetch_archive(bg.checkout.read_pin())
    archives = world["cache"] / "archives"
    assert not archives.exists() or list(archives.iterdir()) == []  # nothing named, no .part left
    # and a wrong file already in the cache is not used either: it is fetched again (here: refused again)
    archives.mkdir(parents=True, exist_ok=True)
    (archives / FILENAME).write_bytes(tampered.read_bytes())
    with pytest.raises(bg.messages.ChecksumMismatch):
        bg.index.fetch_archive(bg.checkout.read_pin())
    assert [p.name for p in archives.iterdir()] == [FILENAME]  # no .part left


def test_pip_settings_follow_pips_files_and_variables(world, monkeypatch, tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text(textwrap.dedent("""\
        [global]
        index-url = https://mirror.example/simple
        extra-index-url =
            file:///srv/one/simple
            https://two.example/simple
        find-links = /srv/wheels
        [download]
        timeout = 7
        """))
    world["env"].pop("PIP_NO_INDEX")
    index = load(world, checkout(world, "a"), monkeypatch).index
    real_files = index.pip_config_files
    patch_used_by(monkeypatch, index.pip_settings, "pip_config_files", lambda: [config])
    settings = index.pip_settings()
    assert index._timeout(settings) == 7
    assert index.archive_sources(settings) == ["link:/srv/wheels", "index:file:///srv/one/simple",
                                            "index:https://mirror.example/simple", "index:https://two.example/simple"]
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert index.archive_sources(index.pip_settings()) == ["link:/srv/wheels"]
    monkeypatch.delenv("PIP_NO_INDEX")
    assert "index:https://env.example/simple" in index.archive_sources(index.pip_settings())
    monkeypatch.delenv("PIP_INDEX_URL")
    patch_used_by(monkeypatch, index.pip_settings, "pip_config_files", lambda: [])
    assert index.archive_sources(index.pip_settings()) == ["index:https://pypi.org/simple/"]
    # which files: $PIP_CONFIG_FILE last, and then no user files; os.devnull: none at all
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    files = real_files()
    assert files[-1] == config and Path("/etc/pip.conf") in files
    assert Path.home() / ".pip" / "pip.conf" not in files
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert real_files() == []


# --------------------------------------------------------------------------- the package's shape

BUILD_PACKAGE = ROOT / "tools" / "ggml_build"


def _package_imports(path: Path) -> tuple[set[str], list[str]]:
    """The modules of tools/ggml_build that ``path`` imports ("__init__" for the package itself), and a
    description of each such import made inside a function or class (run later, not at import)."""
    modules = {p.stem for p in BUILD_PACKAGE.glob("*.py")}

    def in_package(dotted: str) -> str | None:
        """The module that ``tools.ggml_build[.x...]`` names, or None outside the package."""
        parts = dotted.split(".")
        return (parts[2:] or ["__init__"])[0] if parts[:2] == ["tools", "ggml_build"] else None

    def imported(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [m for m in (in_package(a.name) for a in node.names) if m]
        if not isinstance(node, ast.ImportFrom):
            return []
        assert node.level <= 1, f"{path.name}:{node.lineno} reaches outside the package"
        if node.level == 1 and node.module:  # from .x import y
            return [node.module.split(".")[0]]
        if node.level == 0 and in_package(node.module or "") != "__init__":  # from tools.ggml_build.x import y
            return [m for m in [in_package(node.module or "")] if m]
        # from . import x / from tools.ggml_build import x: a module, or a name of the package's __init__
        return [a.name if a.name in modules else "__init__" for a in node.names]

    found: set[str] = set()
    nested: list[str] = []

    def visit(node, depth: int) -> None:
        for name in imported(node):
            found.add(name)
            if depth:
                nested.append(f"{path.name}:{node.lineno} imports {name} inside a function or class")
        inner = depth + isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text()), 0)
    return found, nested


def test_the_build_package_has_small_modules_that_import_each_other_one_way():
    """One concern a module, each small enough to read at once, and an import order without cycles: a
    module uses only those below it, and never the package's __init__ (which re-exports them all). They
    import each other at the top only, so a name a test patches is bound once, when the module loads."""
    modules = {p.stem: p for p in BUILD_PACKAGE.glob("*.py")}
    assert {"__init__", "messages", "checkout", "cache", "index", "source", "options", "builder"} <= set(modules)
    for path in modules.values():
        lines = len(path.read_text().splitlines())
        assert lines <= 400, f"{path.name} has {lines} lines; split it"
    graph, nested = {}, []
    for name, path in modules.items():
        graph[name], inside = _package_imports(path)
        nested += inside
        assert graph[name] <= set(modules), f"{name} imports {graph[name] - set(modules)}, not in the package"
    assert nested == []
    assert not any("__init__" in deps for name, deps in graph.items() if name != "__init__")
    assert "__init__" not in graph["__init__"]
    order: list[str] = []  # each module after every module it imports
    while len(order) < len(graph):
        ready = sorted(name for name, deps in graph.items() if name not in order and deps <= set(order))
        assert ready, f"import cycle among {sorted(set(graph) - set(order))}: " + \
            ", ".join(f"{n} -> {sorted(graph[n] - set(order))}" for n in sorted(set(graph) - set(order)))
        order += ready
    assert order[-1] == "__init__"


def test_build_ggml_keeps_what_setup_py_uses_with_the_checkouts_paths(world):
    """setup.py calls build_ggml.build, backends_from_env, BuildError, LIB_DIR and log; the paths are the
    checkout's own (the package's ROOT is two folders above it)."""
    a = checkout(world, "a")
    cli, _ = import_cli(a)
    for name in ("build", "backends_from_env", "BuildError", "LIB_DIR", "log", "read_pin", "main"):
        assert hasattr(cli, name), name
    assert cli.LIB_DIR == a.resolve() / "ggmlpy" / "lib" and cli.VENDOR_DIR == a.resolve() / "vendor" / "ggml"
    assert cli.read_pin()["filename"] == FILENAME
    assert issubclass(cli.ChecksumMismatch, cli.BuildError)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the instruction-set options are x86's")
def test_the_cpu_level_names_the_instruction_sets(monkeypatch):
    """GGMLPY_CPU=avx2 builds the CPU backend for the AVX2 baseline (no AVX-512 whatever this machine has), so a
    library carried to another x86-64-v3 machine runs there; anything but native/avx2 is refused, saying why."""
    from tools.ggml_build import options
    avx2 = options.cpu_flag_options("avx2")
    for opt in ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"):
        assert f"-D{opt}=ON" in avx2
    for opt in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"):
        assert f"-D{opt}=OFF" in avx2
    monkeypatch.delenv("GGMLPY_CPU", raising=False)
    assert options.cpu_level() == "native"
    monkeypatch.setenv("GGMLPY_CPU", "AVX2")
    assert options.cpu_level() == "avx2"
    assert options.cpu_flag_options(options.cpu_level()) == avx2
    monkeypatch.setenv("GGMLPY_CPU", "x86-64-v4")
    with pytest.raises(options.BuildError, match="native, avx2"):
        options.cpu_level()
