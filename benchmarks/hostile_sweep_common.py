"""The runner the k6, k7, k8 and k9 adversarial sweeps share: one case run by k5's `run_case`
with the sweep's own `materialise` and `check`, where the sweep's own failure to set a case up
is that case's row, not the end of the sweep.

`JSON_ERRORS` holds the cases whose stdout was one JSON error object (k7's `check` fills it):
with --json, estimate and fit say the error there only (README "Exit codes"), so no stderr line
is owed and `no peakmem line` is no problem of theirs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_sweep_k5 import Case, run_case  # noqa: E402

JSON_ERRORS: set[str] = set()


def error_row(case: Case, problem: str) -> dict:
    """The row of a case the sweep could not run: one problem, no exit status."""
    return {"name": case.name, "surface": case.surface, "exit": None, "lines": 0,
            "traceback": False, "seconds": 0, "problems": [problem], "last": "",
            "stdout_bytes": 0}


def run_guarded(case: Case, materialise: Callable | None = None,
                check: Callable | None = None) -> dict:
    """`run_case(case, materialise, check)`, its exception a `sweep error` row."""
    try:
        row = run_case(case, materialise, check)
        if case.name in JSON_ERRORS and row["exit"] not in (0, None):
            row["problems"] = [p for p in row["problems"] if p != "no peakmem line"]
        return row
    except Exception as exc:  # noqa: BLE001 - one broken case must not end the sweep
        return error_row(case, f"sweep error {exc!r}")
