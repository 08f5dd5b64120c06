"""The fuzz suite's switch and its summary line.

``GGMLPY_FUZZ=long`` runs many more cases per family (``GGMLPY_FUZZ_CASES``, default 600) with a random
seed (``GGMLPY_FUZZ_SEED`` to repeat one); the default is the quick, deterministic subset that runs with
the normal test command. The counts (cases, crashes, hangs, ...) are printed at the end of the session.
"""
from __future__ import annotations


COUNTS: dict[str, dict[str, int]] = {}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("ggmlpy fuzz counts")
    keys = ["cases", "ok", "refused", "crash", "hang", "leak", "wrong"]
    tr.write_line(f"{'family':8} " + " ".join(f"{k:>8}" for k in keys))
    total = dict.fromkeys(keys, 0)
    for fam, c in sorted(COUNTS.items()):
        tr.write_line(f"{fam:8} " + " ".join(f"{c.get(k, 0):>8}" for k in keys))
        for k in keys:
            total[k] += c.get(k, 0)
    tr.write_line(f"{'total':8} " + " ".join(f"{total[k]:>8}" for k in keys))
