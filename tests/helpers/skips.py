"""A summary of the skipped tests by reason at the end of a run, so that `python -m pytest` says why hundreds of
tests did not run on this machine (devices it lacks, optional packages) without listing each (``-rs`` does)."""
from __future__ import annotations

from collections import Counter


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001 - pytest's signature
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: Counter[str] = Counter()
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    terminalreporter.section(f"{len(skipped)} skipped tests, by reason (-rs lists each)")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:6d}  {reason}")
