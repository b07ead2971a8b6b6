"""Wall and CPU time of each case of a hostile corpus test module's cold CLI runs.

    python benchmarks/corpus_case_times.py tests.jobs.test_hostile_corpus [--workers 4]
        [--timeout S] [--only CASE_ID ...]

Runs every `CASES` entry of the module as its module fixture does (`peakmem estimate --json
--gpu a100-40gb --timeout T [flags] -- python SCRIPT ARGS` in a copy of its `CORPUS`), `--workers`
at a time (`--timeout` in place of each case's own: a loaded machine's runs are not cut
short; `--only`: those cases), and prints per case: exit status, wall seconds, CPU seconds (user + sys of the CLI
and every child it waited for, from /usr/bin/time), the slowest first, then the totals. Where a
fixture's time goes: a case that sleeps or waits out a limit shows wall far above its CPU.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_case(module, case, root: Path, timeout: float | None = None,
             ) -> tuple[str, int, float, float]:
    workdir = root / case.id
    shutil.copytree(module.CORPUS, workdir)
    argv = ["--json", "--gpu", "a100-40gb", "--timeout", str(timeout or case.timeout),
            *getattr(case, "flags", ()), "--", "python", case.script, *case.args]
    env = {**os.environ, "PYTHONPATH": str(module.SRC)}
    started = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "%U %S", sys.executable, "-m", "peakmem",
                           "estimate", *argv], cwd=workdir, env=env, capture_output=True,
                          text=True, errors="replace", stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    user, system = proc.stderr.strip().splitlines()[-1].split()
    return case.id, proc.returncode, wall, float(user) + float(system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="e.g. tests.jobs.test_hostile_corpus")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--only", nargs="*", default=None)
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    module = importlib.import_module(options.module)
    with tempfile.TemporaryDirectory(prefix="corpus-times-") as root, \
            ThreadPoolExecutor(options.workers) as pool:
        cases = [case for case in module.CASES if options.only is None or case.id in options.only]
        rows = list(pool.map(lambda case: run_case(module, case, Path(root), options.timeout),
                             cases))
    for name, code, wall, cpu in sorted(rows, key=lambda row: -row[2]):
        print(f"{name:40} {code:4} {wall:7.1f} s wall {cpu:6.1f} s CPU")
    print(f"{len(rows)} cases: {sum(r[3] for r in rows):.1f} s CPU, "
          f"{sum(r[2] for r in rows):.1f} s wall summed")


if __name__ == "__main__":
    main()
