"""The build: CMake configure and compile into the cache (reused when nothing changed, resumed or wiped
when a build was interrupted), then the libraries installed into ggmlpy/lib/."""
from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .cache import cache_root, file_lock, held_locks, remove_leftovers, remove_tree, replace_dir, stamp_is, write_atomic
from .checkout import LIB_DIR, read_pin, VENDOR_DIR
from .index import fetch_archive
from .messages import BuildError, log
from .options import cmake_options, cpu_level, require_tool
from .source import patch_files, source_key, source_tree, sync_vendor


# Bump when the way we configure or install changes, so old cache entries are not reused.
BUILD_RECIPE_VERSION = "4"
BUILT_STAMP = ".ggmlpy-built"


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
        if stamp_is(build_dir / BUILT_STAMP, key):
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
    # Ctrl-C is held back while the command starts: arriving inside Popen, it would leave a compile that
    # nobody stops holding the build's locks. The child unblocks it before exec.
    interrupts = {signal.SIGINT, signal.SIGTERM}
    held = signal.pthread_sigmask(signal.SIG_BLOCK, interrupts)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1, start_new_session=True,
                                pass_fds=tuple(held_locks),
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, held))
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise BuildError(f"could not run {cmd[0]}: {exc}") from None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl-C that came meanwhile is raised here
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
                    "cpu": cpu_level(), "build_key": key, "patches": [p.name for p in patch_files()]}
            (stage / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
            names = ", ".join(p.name for p in sorted(stage.iterdir()))
            replace_dir(stage, LIB_DIR)
        finally:
            remove_tree(stage)
    log(f"installed {names} into {LIB_DIR}")
