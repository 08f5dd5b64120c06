"""Run fuzz cases in subprocesses: many cases per process for speed, the culprit of a crash found and
confirmed on its own.

A case is a JSON-able dict handed to ``tests/fuzz/worker.py`` (``family`` says which executor runs it).
The worker reports, on a pipe of its own, ``start`` before each case and its outcome after it:
``ok`` (accepted, and right where an oracle checks it), ``refused`` (a ggmlpy error), ``leak`` (any
other exception escaped ggmlpy), ``wrong`` (an oracle failed: a result differs from numpy). The runner
adds ``crash`` (the process died: a signal, an abort) and ``hang`` (a case ran past its time limit),
restarts a worker after the culprit and re-runs that case alone to confirm it. The reproducer of any
case is ``python -m tests.fuzz.worker --case '<json>'``.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).parents[2]
BAD = ("crash", "hang", "leak", "wrong")


@dataclass
class Outcome:
    case: dict
    status: str
    detail: str = ""
    alone: bool | None = None  # crash/hang: did it reproduce in a fresh process on its own

    def reproducer(self) -> str:
        return f"python -m tests.fuzz.worker --case '{json.dumps(self.case)}'"

    def __str__(self) -> str:
        alone = "" if self.alone is None else (" (reproduces alone)" if self.alone else
                                               " (only after the cases before it in its batch)")
        return f"{self.status.upper()}{alone}: {self.detail[:1500]}\n    reproducer: {self.reproducer()}"


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def bad(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in BAD]

    def counts(self) -> dict[str, int]:
        out = {"cases": len(self.outcomes)}
        for s in ("ok", "refused") + BAD:
            out[s] = self.count(s)
        return out


def _env() -> dict:
    env = dict(os.environ)
    env["GGML_NO_BACKTRACE"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GGMLPY_N_THREADS", "1")
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _run_worker(cases: list[dict], case_timeout: float, start: int, tmp: Path,
                stop: int | None = None) -> tuple[dict[int, dict], int | None, str, str]:
    """Run cases[start:stop] in one worker until done or it dies. Returns (results by index, index of the
    case running when it died or hung, 'crash'/'hang'/'' , the tail of its output)."""
    stop = len(cases) if stop is None else stop
    cases = cases[:stop]
    cases_file = tmp / "cases.json"
    cases_file.write_text(json.dumps(cases[start:]))
    out_file = tmp / "output.txt"
    r, w = os.pipe()
    with open(out_file, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker", "--cases", str(cases_file), "--fd", str(w)],
                                cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                pass_fds=(w,), start_new_session=True)
    os.close(w)
    results: dict[int, dict] = {}
    current: int | None = None
    started = time.monotonic()
    buf = b""
    status = ""
    try:
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while True:
                limit = case_timeout + (30.0 if current is None else 0.0)  # the first case also imports ggmlpy
                left = limit - (time.monotonic() - started)
                if left <= 0:
                    status = "hang"
                    break
                ready, _, _ = select.select([pipe], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = pipe.read(65536)
                if not chunk:  # the worker is gone
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if msg["event"] == "start":
                        current, started = start + msg["i"], time.monotonic()
                    else:
                        results[start + msg["i"]] = msg
                        current = None
    finally:
        if proc.poll() is None and status == "hang":
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    tail = out_file.read_text(errors="replace")[-3000:]
    if status == "hang":
        return results, current, "hang", tail
    if current is None and rc != 0 and len(results) == len(cases) - start:
        # every case ended, then the process died (a finalizer at exit): blame the last case, not confirmed
        return results, len(cases) - 1, "crash", f"at interpreter exit, status {rc}; {tail}"
    if current is not None or (rc != 0 and len(results) < len(cases) - start):
        if current is None:
            current = start + len(results)
        return results, current, "crash", f"exit status {rc}" + (f" (signal {-rc})" if rc < 0 else "") + f"; {tail}"
    return results, None, "", tail


def run_cases(cases: list[dict], case_timeout: float = 30.0, confirm: bool = True, batch: int = 200) -> Report:
    """Run every case, ``batch`` cases per worker process; each crash or hang is attributed to the case that
    was running and re-run alone."""
    report = Report()
    by_index: dict[int, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="ggmlpy-fuzz-") as d:
        tmp = Path(d)
        start = 0
        while start < len(cases):
            stop = min(len(cases), start + batch)
            results, culprit, status, detail = _run_worker(cases, case_timeout, start, tmp, stop)
            for i, msg in results.items():
                by_index[i] = Outcome(cases[i], msg["status"], msg.get("detail", ""))
            if culprit is None:
                start = stop
                continue
            alone = None
            if confirm:
                again, c2, s2, d2 = _run_worker([cases[culprit]], case_timeout, 0, tmp)
                alone = c2 is not None
                if alone:
                    status, detail = s2, d2
            by_index[culprit] = Outcome(cases[culprit], status, detail, alone)
            start = culprit + 1
    report.outcomes = [by_index[i] for i in sorted(by_index)]
    return report
