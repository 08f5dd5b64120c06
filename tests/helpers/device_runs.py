"""pytest hooks for runs on devices, loaded by tests/conftest.py (tests/project/test_device_runs.py tests them):

* ``GGMLPY_REQUIRE_DEVICES=CUDA0,Vulkan0``: this machine has those devices (``benchmarks/gpu_check.py`` sets it),
  so a test that skips for lack of one of them (its id or its reason names the device or its backend, and the
  reason says something is missing: "no ...", "not built", "needs ...", "without ...", "missing") fails instead: on
  a machine with the device, such a skip is a failure. A skip because the device is there ("Vulkan0 is present")
  or for what a test cannot reach on it stays a skip.
* ``GGMLPY_VK_VALIDATION=<folder>`` (every process runs Vulkan under the Khronos validation layer, logging to
  ``<folder>/vvl-<pid>.log``; see ggmlpy/_ffi/__init__.py): the session fails when any log holds a message, and
  lists them.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest


# what a skip's reason says when something the test needs is absent
ABSENT = re.compile(r"\b(no|not built|needs|without|missing|is not)\b", re.IGNORECASE)


def required_devices() -> list[str]:
    return [d.strip() for d in os.environ.get("GGMLPY_REQUIRE_DEVICES", "").split(",") if d.strip()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    required = required_devices()
    if not required or not rep.skipped:
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    text = f"{item.nodeid} {reason}".lower()
    named = [d for d in required if d.lower() in text or d.rstrip("0123456789").lower() in text]
    if named and ABSENT.search(reason):
        rep.outcome = "failed"
        rep.longrepr = (f"skipped on a machine that must have {', '.join(named)} (GGMLPY_REQUIRE_DEVICES): "
                        f"{reason}")


def validation_messages(folder: Path) -> dict[str, list[str]]:
    """The messages of the validation logs in ``folder``, by kind (the VUID or hazard name)."""
    messages: dict[str, list[str]] = {}
    for log in sorted(folder.glob("vvl-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "VUID" in line or "Validation" in line or "SYNC-" in line:
                key = line.split("(", 1)[0].split("]", 1)[0].strip()[:120]
                messages.setdefault(key, []).append(f"{log.name}: {line[:600]}")
    return messages


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("GGMLPY_VK_VALIDATION")
    if not folder:
        return
    messages = validation_messages(Path(folder))
    if messages:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        write = tr.write_line if tr else print
        write(f"Vulkan validation layer: {sum(map(len, messages.values()))} message(s) of {len(messages)} kind(s)")
        for key, lines in messages.items():
            write(f"  {len(lines)} x {key}\n    {lines[0]}")
        session.exitstatus = 1
