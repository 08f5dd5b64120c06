#!/usr/bin/env python3
"""The GPU check: everything ggmlpy claims about NVIDIA GPUs, run on a bare GPU machine in one command.

    python3 benchmarks/gpu_check.py                  # CUDA, then Vulkan on the NVIDIA driver
    python3 benchmarks/gpu_check.py --part cuda      # or vulkan
    python3 benchmarks/gpu_check.py --budget 480     # seconds for everything (default 470)
    python3 benchmarks/gpu_check.py --rehearse       # without a GPU: Vulkan on a CPU device, small benchmarks

Made for the lent H100/H200 machines (16 cores, no compiler needed, no network, 64 MiB carried, 10 minutes a
command): ``python tools/gpu_pack.py`` first, here, packs into ``.gpu/`` the libraries built for the machine
(CUDA for sm_90, Vulkan, the CPU backend for the AVX2 baseline, the cffi extension), wheels of cffi, pycparser
and gguf, and Debian's Vulkan loader. This script, there:

1. unpacks the libraries over the checkout, installs the wheels into a private folder (``--no-deps``: the
   image's numpy and PyTorch stay), unpacks the Vulkan loader where the image has none, and puts the CUDA
   runtime and cuBLAS of the image's NVIDIA wheels on the library path;
2. fails at once unless CUDA0 exists (and, for the second part, a Vulkan device on the NVIDIA driver), saying
   why in ggmlpy's words (``ggml_backend_load_errors``);
3. runs, with ``GGMLPY_REQUIRE_DEVICES`` set so that a test skipped for the device fails: the kernel tests
   (patches 0016/0018/0038-0044, float32 precision and the TF32 switch), the model-layer and ag_* tests on the
   device, the placement report with its assertion (one split and no CPU op for each benchmark model), the GPU-sized
   benchmarks against PyTorch on the same device, on Vulkan the backward products on ggml's matmul shaders
   against out_prod.comp, the tiled matmul shaders and the blocked kernel (``bench_vk_backward.py``,
   patches/0043 and 0045), the host's waits per training step and samples/s (``bench_host_waits.py``, patches
   0051-0052), and the kernel tests past 2^31/2^32 elements;
4. writes everything to ``$OUT`` (else ``benchmarks/out/gpu``): ``gpu_check.log`` (every step's output),
   ``summary.txt`` (one line a step, the device, the figures) and ``results.json`` (placement and benchmark
   figures); three files, since a device run returns at most eight.

Each step has a time limit, and the whole run a budget: a step that would start past it is reported as not run
(and counted as failing). The exit status is the number of failing steps. On a machine without a GPU every
step after the setup says so and fails, as it must. ``--rehearse`` runs the Vulkan part on whatever Vulkan device
there is (Mesa's lavapipe) with reduced benchmark sizes: the whole script, rehearsed before GPU time is spent.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / ".gpu"
SITE = Path("/tmp/ggmlpy-site")
OUT = Path(os.environ.get("OUT") or os.environ.get("GPU_OUT") or ROOT / "benchmarks" / "out" / "gpu")
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]


class Run:
    """The steps of one check: their logs in one file, a summary line each, the figures in one JSON."""

    def __init__(self, budget: float) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.deadline = self.started + budget
        self.log = open(OUT / "gpu_check.log", "w", buffering=1)
        self.lines: list[str] = []
        self.results: dict = {}
        self.failed = 0

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.lines.append(text)

    def step(self, name: str, limit: float, cmd: list[str], env: dict | None = None) -> bool:
        """Run ``cmd`` for at most ``limit`` s (less when the budget is nearly spent); log it; say how it went."""
        left = self.deadline - time.monotonic()
        if left < 20:
            self.failed += 1
            self.say(f"gpu_check: {name}: NOT RUN (the budget is spent)")
            return False
        limit = min(limit, left - 10)
        self.log.write(f"\n===== {name}: {' '.join(cmd)}\n")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace", timeout=limit)
            rc, output = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            rc, output = "timeout", (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
                else (exc.stdout or "")
        self.log.write(output)
        ok = rc == 0
        self.failed += not ok
        tail = [line for line in output.strip().splitlines() if line.strip()][-3:]
        self.say(f"gpu_check: {name}: {'ok' if ok else 'FAILED'} (rc={rc}, {time.monotonic() - t0:.0f} s) "
                 + " | ".join(tail))
        return ok

    def finish(self) -> int:
        self.say(f"gpu_check: {self.failed} failing step(s) in {time.monotonic() - self.started:.0f} s")
        (OUT / "summary.txt").write_text("\n".join(self.lines) + "\n")
        (OUT / "results.json").write_text(json.dumps(self.results, indent=2) + "\n")
        self.log.close()
        return self.failed


# ---------------------------------------------------------------- setting the machine up (compiles nothing)

def unpack(run: Run) -> None:
    tarball = PACK / "ggmlpy-gpu.tar.xz"
    if not tarball.exists():
        raise SystemExit(f"gpu_check: {tarball} is missing: run 'python tools/gpu_pack.py' where ggmlpy builds, "
                         "and carry .gpu/ along")
    with tarfile.open(tarball) as tar:
        tar.extractall(ROOT, filter="data")
    manifest = json.loads((PACK / "MANIFEST.json").read_text())
    run.results["pack"] = {k: manifest.get(k) for k in ("commit", "uncommitted_changes", "source_key", "cuda_arch",
                                                         "cpu")}
    run.say(f"gpu_check: libraries of commit {manifest['commit'][:10]}"
            f"{' (with uncommitted changes)' if manifest['uncommitted_changes'] else ''}, sm_{manifest['cuda_arch']}")
    sys.path.insert(0, str(ROOT))
    from tools.ggml_build import read_pin, source_key  # the pin and patches/ of this checkout
    here = source_key(read_pin())
    run.results["pack"]["matches_checkout"] = manifest.get("source_key") == here
    if manifest.get("source_key") != here:
        run.failed += 1
        run.say(f"gpu_check: STALE PACK: its libraries were built from other patches than this checkout's (source "
                f"key {manifest.get('source_key')} vs {here}): run 'python tools/gpu_pack.py' again; the checks below "
                "test those libraries")


def install_wheels(run: Run) -> None:
    """cffi, pycparser and gguf from .gpu/wheels (the ones for this Python), beside the image's packages."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--upgrade", "--find-links", str(PACK / "wheels"), "--target", str(SITE),
                    "cffi", "pycparser", "gguf"], check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = [str(SITE), str(ROOT)]


def vulkan_loader(run: Run) -> None:
    """Debian's libvulkan1 where the image has no loader; NVIDIA's ICD where the loader finds none."""
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libvulkan.so.1" not in found:
        for deb in sorted(glob.glob(str(PACK / "debs" / "*.deb"))):
            subprocess.run(["dpkg", "-x", deb, "/"], check=True)
        subprocess.run(["ldconfig"], check=False)
        run.say("gpu_check: unpacked the Vulkan loader from .gpu/debs")
    icd = "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json"
    if Path(icd).exists() and not any(Path(d).glob("*nvidia*") for d in ("/usr/share/vulkan/icd.d",
                                                                          "/etc/vulkan/icd.d")):
        os.environ.setdefault("VK_DRIVER_FILES", icd)


def cuda_libraries() -> None:
    """cudart and cuBLAS where the image keeps them (the CUDA toolkit, NVIDIA's wheels beside PyTorch)."""
    dirs: set[str] = set()
    for root in ["/usr/local/cuda/lib64", *site.getsitepackages()]:
        for pattern in ("libcublas.so.*", "nvidia/*/lib/libcublas.so.*", "nvidia/*/lib/libcudart.so.*"):
            dirs.update(os.path.dirname(p) for p in glob.glob(os.path.join(root, pattern)))
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(sorted(dirs) + [os.environ.get("LD_LIBRARY_PATH", "")])


def machine(run: Run) -> None:
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if smi else "no nvidia-smi: no NVIDIA GPU"
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    run.results["machine"] = {"gpu": gpu, "cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0]}
    run.say(f"gpu_check: {gpu}; {cpu}, {os.cpu_count()} cores; Python {sys.version.split()[0]}")


# ---------------------------------------------------------------- the device gate and the steps

GATE = """
import json, sys, ggmlpy as g
want, any_vulkan = sys.argv[1], sys.argv[2] == "1"
devs = {d.name: d.description for d in g.ggml_backend_devices()}
print("devices:", json.dumps(devs))
print("load errors:", json.dumps([p["message"] for p in g.ggml_backend_load_errors()]))
if want not in devs or (want.startswith("Vulkan") and not any_vulkan and "nvidia" not in devs[want].lower()):
    sys.exit(f"no GPU: {want} is missing (or not on the NVIDIA driver); see the load errors above")
"""


def part(run: Run, device: str, family: str, quick: bool, rehearse: bool = False) -> None:
    """The steps for one GPU device (CUDA0, or Vulkan0 on the NVIDIA driver; any Vulkan0 when rehearsing)."""
    env = dict(os.environ, GGMLPY_REQUIRE_DEVICES=device, PYTHONUNBUFFERED="1")
    if not run.step(f"{device}: device present", 60, [sys.executable, "-c", GATE, device, "1" if rehearse else "0"],
                    env):
        run.failed += 1  # the steps below cannot run: count them as one more failure, do not wait for each
        run.say(f"gpu_check: {device}: no GPU, the remaining {family} steps are not run")
        return
    other = "Vulkan0" if family == "cuda" else "CUDA0"
    xdist = ["-n", "12"] if _has("xdist") else []
    run.step(f"{device}: kernel and precision tests", 120,
             PYTEST + xdist + ["tests/patches/test_gpu_kernels.py", "tests/patches/test_gpu_precision.py",
                               "tests/backend/test_modules.py", "-k", f"not {other}"], env)
    run.step(f"{device}: model-layer and ag_* tests on the device", 150,
             PYTEST + xdist + ["tests/backend", "tests/compute/test_async.py", "tests/patches", "tests/models",
                               "tests/training", "tests/autograd", "--ignore",
                               "tests/patches/test_gpu_kernels_large.py", "-m", family],
             env)
    placement = OUT / f"placement-{device}.json"
    if run.step(f"{device}: placement (one split, no CPU op)", 90,
                [sys.executable, "benchmarks/placement_report.py", "--backend", device, "--models", "all", "--check",
                 "--json", str(placement)], env) and placement.exists():
        run.results[f"placement {device}"] = json.loads(placement.read_text())
    placement.unlink(missing_ok=True)
    bench = OUT / f"bench-{device}.json"
    # one round (a fresh process per model and side: 7 processes): the budget holds both parts
    size = ["--size", "reduced", "--steps", "4", "--split-steps", "2"] if rehearse else ["--size", "full"]
    if run.step(f"{device}: GPU-sized models against PyTorch", 90 if quick else 120,
                [sys.executable, "benchmarks/bench_gpu.py", "--backend", device, *size, "--rounds", "1",
                 "--threads", str(min(8, os.cpu_count() or 1)), "--tf32", "off", "--json", str(bench)], env) \
            and bench.exists():
        run.results[f"bench_gpu {device}"] = json.loads(bench.read_text())
    bench.unlink(missing_ok=True)
    mixed = OUT / f"mixed-{device}.json"   # issue 44: mixed precision against PyTorch's AMP on the same GPU
    if not rehearse and run.step(f"{device}: BF16 mixed precision against F32 and PyTorch AMP", 120,
                                 [sys.executable, "benchmarks/bench_vs_torch.py", "--backend", device, "--precision",
                                  "bf16", "--models", "mnist-fc,cnn,transformer", "--rounds", "1", "--json",
                                  str(mixed)], env) and mixed.exists():
        run.results[f"bench_vs_torch bf16 {device}"] = json.loads(mixed.read_text())
    mixed.unlink(missing_ok=True)
    waits = OUT / f"waits-{device}.json"  # issue 42: one wait per step, and samples/s on the device
    cases = ["--cases", "mnist-fc,mnist-fc/rmsprop"] if rehearse else []
    if run.step(f"{device}: host waits per training step", 60,
                [sys.executable, "benchmarks/bench_host_waits.py", "--device", device, "--rounds", "1", *cases,
                 "--json", str(waits)], env) and waits.exists():
        run.results[f"bench_host_waits {device}"] = json.loads(waits.read_text())
    waits.unlink(missing_ok=True)
    if family == "vulkan":  # issue 42: backward products, each kernel (the GPU's choice between them is unmeasured)
        backward = OUT / f"backward-{device}.json"
        models = ["--models", "transformer"] if rehearse else []
        if run.step(f"{device}: backward products, out_prod.comp vs matmul shaders vs blocked kernel", 90,
                    [sys.executable, "benchmarks/bench_vk_backward.py", "--device", device, "--rounds", "1", *models,
                     "--kernels", "naive,matmul,blocked,default", "--json", str(backward)], env) and backward.exists():
            run.results[f"bench_vk_backward {device}"] = json.loads(backward.read_text())
        backward.unlink(missing_ok=True)
    if family == "cuda":
        run.step(f"{device}: kernels past 2^31 and 2^32 elements", 120,
                 PYTEST + ["tests/patches/test_gpu_kernels_large.py", "-k", device], env)


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["all", "cuda", "vulkan"], default="all")
    ap.add_argument("--budget", type=float, default=470, help="seconds for the whole check (default 470)")
    ap.add_argument("--rehearse", action="store_true",
                    help="without a GPU: the Vulkan part on any Vulkan device (lavapipe), reduced benchmarks")
    args = ap.parse_args(argv)
    run = Run(args.budget)
    machine(run)
    unpack(run)
    install_wheels(run)
    cuda_libraries()
    if args.part in ("all", "vulkan"):
        vulkan_loader(run)
    os.environ["GGML_VK_VISIBLE_DEVICES"] = os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")
    if args.part in ("all", "cuda"):
        part(run, "CUDA0", "cuda", quick=False)
    if args.part in ("all", "vulkan"):
        part(run, "Vulkan0", "vulkan", quick=args.part == "all", rehearse=args.rehearse)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
