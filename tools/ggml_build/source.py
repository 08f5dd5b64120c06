"""The patched source tree: the archive's ggml tree unpacked and patched once per source key inside
the cache, and copied to this checkout's vendor/ggml/."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from .cache import cache_root, file_lock, remove_leftovers, remove_tree, replace_dir, stamp_is, write_atomic
from .checkout import PATCH_DIR, VENDOR_DIR
from .messages import BuildError, log


SOURCE_STAMP = ".ggmlpy-source"


def patch_files() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch")) if PATCH_DIR.is_dir() else []


def source_key(pin: dict) -> str:
    h = hashlib.sha256(pin["sha256"].encode())
    for p in patch_files():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def source_tree(pin: dict, archive: Path) -> Path:
    """``<cache>/src/<key>/``: the archive's ggml tree with our patches applied; made once per key
    (in a temporary folder renamed into place), shared by every checkout and build."""
    key = source_key(pin)
    src_root = cache_root() / "src"
    dest = src_root / key
    if stamp_is(dest / SOURCE_STAMP, key):
        return dest
    with file_lock(cache_root() / "locks" / f"src-{key}.lock", f"unpacking ggml ({key})"):
        if stamp_is(dest / SOURCE_STAMP, key):
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
    if stamp_is(VENDOR_DIR / SOURCE_STAMP, key):
        return
    VENDOR_DIR.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(VENDOR_DIR.parent / ".ggmlpy.lock", "updating this checkout's vendor/ggml"):
        if stamp_is(VENDOR_DIR / SOURCE_STAMP, key):
            return
        remove_leftovers(VENDOR_DIR.parent, f".{VENDOR_DIR.name}.tmp-*", f".{VENDOR_DIR.name}.old-*")
        tmp = VENDOR_DIR.parent / f".{VENDOR_DIR.name}.tmp-{os.getpid()}"
        remove_tree(tmp)
        shutil.copytree(src, tmp, symlinks=True)
        replace_dir(tmp, VENDOR_DIR)
        log(f"copied the patched ggml tree to {VENDOR_DIR}")
