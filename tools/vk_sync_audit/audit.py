#!/usr/bin/env python3
"""Judge the hazards Vulkan's synchronization validation reports: does any pair of dispatches that ggml left
without a barrier between them really touch the same bytes, or do only their bound ranges overlap?

    python tools/vk_sync_audit/audit.py tests/models/layers/test_sequence_layers.py -k vulkan

The layer sees each dispatch's descriptor bindings (buffer, offset, range) and must assume the shader touches
all of a binding; ggml binds some tensors wider than they are (a matrix product's result to the end of its
buffer, a misaligned view from the aligned offset below it), so it reports hazards between dispatches whose
tensors do not overlap. This tool builds ggml's Vulkan backend from this checkout's patched tree
(``vendor/ggml``) with ``trace.patch`` (which prints, when GGMLPY_VK_TRACE is set, every node's tensors with the
bytes they occupy, every dispatch's bindings and every barrier), runs the given pytest selection in-process under
the layer with synchronization validation, and for each reported hazard finds the two dispatches and their
nodes: it prints the bound ranges the layer compared and the tensors' bytes. It exits 1 when a hazard is real
(the bytes overlap), 0 when every one is an over-wide binding. Needs the Vulkan build tools and
vulkan-validationlayers; the build goes to ``~/.cache/ggmlpy/vk-sync-audit`` (about 4 min the first time).
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

Range = tuple[int, int]


def build() -> Path:
    """The traced libggml-vulkan.so, built from vendor/ggml with trace.patch in a cache folder."""
    from tools.ggml_build.cache import cache_root
    from tools.ggml_build.options import cmake_options
    work = cache_root() / "vk-sync-audit"
    src, out = work / "src", work / "build"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(ROOT / "vendor" / "ggml", src, symlinks=True)
    subprocess.run(["patch", "-p1", "--batch", "-s", "-i", str(HERE / "trace.patch")], cwd=src, check=True)
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", *cmake_options(["cpu", "vulkan"], None)],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(out), "--target", "ggml-vulkan"], check=True)
    return out / "bin" / "libggml-vulkan.so"


def run_traced(library: Path, pytest_args: list[str], folder: Path) -> tuple[Path, Path]:
    """A copy of ggmlpy using ``library``; the pytest selection run in it, in-process (-s), traced and validated."""
    pkg = folder / "pkg"
    shutil.copytree(ROOT / "ggmlpy", pkg / "ggmlpy")
    shutil.copytree(ROOT / "tests", pkg / "tests")
    shutil.copy2(ROOT / "pyproject.toml", pkg)
    shutil.copy2(library, pkg / "ggmlpy" / "lib" / "libggml-vulkan.so")
    env = dict(os.environ, GGMLPY_VK_TRACE="1", GGML_VK_DEBUG_MARKERS="1", GGMLPY_VK_VALIDATION=str(folder / "vvl"),
               GGMLPY_VK_VALIDATION_SYNC="1", GGML_VK_VISIBLE_DEVICES=os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"),
               PYTHONPATH=str(pkg))
    trace = folder / "trace.txt"
    with open(trace, "w") as err:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *pytest_args],
                       cwd=pkg, env=env, stdout=subprocess.DEVNULL, stderr=err)
    return trace, folder / "vvl"


def reported(vvl: Path) -> collections.Counter:
    """(kind, buffer, pipeline, binding) of every hazard the layer logged."""
    found: collections.Counter = collections.Counter()
    pattern = re.compile(r"\[ SYNC-HAZARD-([A-Z-]+) \].*?handle = (0x[0-9a-f]+).*?VkPipeline 0x[0-9a-f]+\[([^\]]*)\]"
                         r".*?binding #(\d+)")
    for log in vvl.glob("vvl-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = pattern.search(line)
            if m:
                found[(m.group(1), int(m.group(2), 16), m.group(3), int(m.group(4)))] += 1
    return found


def events(trace: Path) -> list:
    """The trace in order: None for a barrier, else (pipeline, [(buffer, offset, range)], node), where node is
    (op, [(role, buffer, offset, bytes)]) of the node being dispatched."""
    out: list[tuple[str, list[tuple[int, int, int]], tuple[str, list[tuple[str, int, int, int]]] | None] | None] = []
    node = None
    for line in trace.read_text(errors="replace").splitlines():
        if not line.startswith("TRACE "):
            continue
        words = line.split()
        if words[1] == "barrier":
            out.append(None)
        elif words[1] == "node":
            node = (words[2], [(k, int(b, 16), int(o), int(n)) for k, b, o, n in
                               re.findall(r"(dst|src)\[([0-9a-f]+) (\d+) (\d+)\]", line)])
        elif words[1] == "dispatch":
            out.append((words[2], [(int(b, 16), int(o), int(r)) for b, o, r in
                                   re.findall(r"\[([0-9a-f]+) (\d+) (\d+)\]", line)], node))
    return out


def overlap(a: Range, b: Range) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def _bytes(node, buffer: int, role: str) -> list[Range]:
    """The bytes a node's result ("dst") or sources ("src") occupy in ``buffer``."""
    return [(o, o + n) for r, b, o, n in (node[1] if node else []) if b == buffer and r == role]


def judge(hazard: tuple, trace: list) -> dict | None:
    """The first dispatch of the hazard's pipeline binding its buffer at its binding number, the earlier
    dispatch since the last barrier whose binding of that buffer overlaps it, and the bytes their nodes' tensors
    occupy in that buffer."""
    _, buffer, pipeline, binding = hazard
    since: list = []
    for e in trace:
        if e is None:
            since = []
            continue
        pipe, binds, node = e
        if pipe == pipeline and binding < len(binds) and binds[binding][0] == buffer:
            bound = (binds[binding][1], binds[binding][1] + binds[binding][2])
            for ppipe, pbinds, pnode in reversed(since):
                prev = next(((o, o + r) for b, o, r in pbinds if b == buffer and overlap(bound, (o, o + r))), None)
                if prev is not None:
                    mine_w, mine_r = _bytes(node, buffer, "dst"), _bytes(node, buffer, "src")
                    their_w, their_r = _bytes(pnode, buffer, "dst"), _bytes(pnode, buffer, "src")
                    # a hazard needs a write: this one's write against anything of theirs, or its read of their write
                    real = any(overlap(x, y) for x in mine_w for y in their_w + their_r) or \
                        any(overlap(x, y) for x in mine_r for y in their_w)
                    return {"after": ppipe, "bound": bound, "prev_bound": prev, "writes": mine_w, "reads": mine_r,
                            "prev_writes": their_w, "prev_reads": their_r, "real": real}
        since.append(e)
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    library = build()
    with tempfile.TemporaryDirectory(prefix="vk-sync-audit-") as tmp:
        trace_file, vvl = run_traced(library, argv, Path(tmp))
        hazards, trace = reported(vvl), events(trace_file)
    real = 0
    for hazard, n in sorted(hazards.items(), key=lambda kv: -kv[1]):
        kind, _, pipeline, binding = hazard
        j = judge(hazard, trace)
        if j is None:
            print(f"{n:3d} x {kind} {pipeline} binding {binding}: not found in the trace (a subprocess's?)")
            continue
        real += j["real"]
        print(f"{n:3d} x {kind} {pipeline} binding {binding} after {j['after']}: bound {j['bound']} vs "
              f"{j['prev_bound']}; bytes written {j['writes']} read {j['reads']}, before: written "
              f"{j['prev_writes']} read {j['prev_reads']}: "
              f"{'REAL: the bytes overlap' if j['real'] else 'the bytes do not overlap'}")
    print(f"{sum(hazards.values())} hazards reported, {real} kinds real")
    return 1 if real else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
