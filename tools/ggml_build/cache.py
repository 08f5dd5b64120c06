"""The build cache (``$GGMLPY_CACHE`` or ``~/.cache/ggmlpy``): its root, file locks, atomic writes and
folder replaces, stamps, and the leftovers of killed builds.

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

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from .messages import log


def cache_root() -> Path:
    return Path(os.environ.get("GGMLPY_CACHE") or Path.home() / ".cache" / "ggmlpy")


# ------------------------------------------------------------------------- locks and atomic writes

held_locks: list[int] = []  # descriptors of the locks held; build commands inherit them


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive fcntl lock on ``path``; waits (saying so) while another process holds it.
    The kernel drops the lock when its holder exits, however it exits (Ctrl-C, kill -9) -- and the
    build commands started under it hold it too, so a compiler outliving a killed build still keeps
    the next build out of its folder until it ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    held_locks.append(fd)
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
        held_locks.remove(fd)
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


def stamp_is(stamp: Path, key: str) -> bool:
    """Whether ``stamp`` (written last, by write_atomic) names ``key``: a folder without it is unfinished."""
    try:
        return stamp.read_text().strip() == key
    except OSError:
        return False
