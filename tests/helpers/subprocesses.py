"""Fresh interpreters for what could abort the test runner (a ggml assertion is SIGABRT in the child, not the end
of the session), and the scripts of the cases that run in them. Pure Python: nothing here imports ggmlpy (the
code run in the child does)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT


def run_in_subprocess(code: str, timeout: float = 60, env: dict | None = None) -> tuple[int, str, str]:
    """Run ``code`` in a fresh interpreter from the repository root; (returncode, stdout, stderr).

    A ggml assertion aborts the process, which shows up here as returncode -6 (SIGABRT)
    instead of taking the test runner down with it. ``env``: variables set for that process.
    """
    env = dict(os.environ, **(env or {}))
    env["GGML_NO_BACKTRACE"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_cases_in_subprocess(template: str, cases: dict, timeout: float = 120) -> tuple[int, dict, str]:
    """Run ``template.format(expr=...)`` for every ``cases[key][0]`` in one fresh interpreter, each case's
    printed lines prefixed with ``key:``. Returns (returncode, {key: the rest of its first line}, stderr): a
    case that makes ggml abort kills only that interpreter, and the keys after it have no line."""
    script = ["import sys"]
    for key, (expr, *_rest) in cases.items():
        body = template.format(expr=expr).replace('print("', f'print("{key}:')
        script.append(f"def case_{key}():\n" + "\n".join("    " + line for line in body.splitlines()))
        script.append(f"case_{key}(); sys.stdout.flush()")
    rc, out, err = run_in_subprocess("\n".join(script), timeout=timeout)
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return rc, lines, err


def backward_refusal_script(declare: str, after: str = "") -> str:
    """The script of a case whose op has no backward pass: ``declare`` creates ``x`` in ``ctx`` (made a
    parameter next), ``after`` may build views of it; ``{expr}`` (filled per case) is the op, whose squared
    sum becomes the loss; building the backward pass must raise ValueError. For run_cases_in_subprocess."""
    return ("import numpy as np, ggmlpy as G\n"
            "ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)\n"
            f"{declare}\nG.ggml_set_param(x)\n{after}\n"
            "y = {expr}\n"
            "loss = G.ggml_sum(ctx, G.ggml_sqr(ctx, y))\n"
            "G.ggml_set_loss(loss)\n"
            "g = G.ggml_new_graph_custom(ctx, 256, True)\n"
            "G.ggml_build_forward_expand(g, loss)\n"
            "try:\n"
            "    G.ggml_build_backward_expand(ctx, g)\n"
            "except ValueError as e:\n"
            "    print(\"VALUEERROR\", e)\n"
            "else:\n"
            "    print(\"NO ERROR\")\n")


def assert_refused_naming_op(results: tuple, cases: dict, key: str) -> None:
    """``key``'s case (from run_cases_in_subprocess over ``cases``: key -> (expr, op name)) raised a
    ValueError naming its op, and the interpreter survived them all."""
    rc, lines, err = results
    assert key in lines, f"no result for {key}; the interpreter exited with {rc}: {err[-2000:]}"
    assert lines[key].startswith("VALUEERROR"), lines[key]
    assert cases[key][1] in lines[key], lines[key]
    assert rc == 0, err[-2000:]


def json_with_switch(code: str, switch: str, on: bool, timeout: float = 300) -> dict:
    """Run ``code``, which prints one JSON object on its last line, in a fresh interpreter from the repository root
    with the environment variable ``switch`` set to 1 (``on``) or absent, and return the object: how a test compares
    a kernel with the one a switch read once per process selects."""
    env = {k: v for k, v in os.environ.items() if k != switch}
    if on:
        env[switch] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_flags() -> set[str]:
    """The instruction-set flags /proc/cpuinfo lists for this machine's first CPU (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
