"""The per-capture set-up a held-out GPUMemNet CNN row pays in a bench worker (issue 14, branch
u3): the save functions' namespace search (capture/side_effects.py, capture/namespace_index.py)
and the compiler configs put back at the end (capture/compiled_code.py), each with the cache /
shortcut on and off.

    python benchmarks/capture_setup_speed.py [--rows 12]

The rows are `--rows` of the held-out CNN set (`spread_subset`, a warm-up row first), estimated
in this process after the bench worker's initializer (`_init_worker`), as cnn_row_profile.py
does. Rows alternate between the namespace search with the dict-version cache (on) and a read of
every namespace (off: `dict_version` None, what `install` did before); printed are the mean CPU
milliseconds of `_Patches.install` per capture each way, and whether every row's estimate bytes
and stated margin are the same both ways. Then `compiler_configs_restored` is entered and left
200 times with the shortcut on and off (`_still_equal` answering False: a `getattr` of every
setting, the loop it replaced, plus the one `get_config_copy` the shortcut reads).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from cnn_row_profile import _rows

    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.bench.runner import _init_worker, estimate_row
    from peakmem.capture import compiled_code, namespace_index, side_effects

    rows = _rows(args.rows)
    estimator = PeakmemEstimator()
    _init_worker({"peakmem": estimator})
    estimate_row(estimator, rows[0])

    spent: list[float] = []
    install = side_effects._Patches.install

    def timed(self, entries):
        start = time.process_time()
        try:
            return install(self, entries)
        finally:
            spent.append(time.process_time() - start)

    side_effects._Patches.install = timed
    cached = namespace_index.dict_version
    by_way: dict[str, list[float]] = {"on": [], "off": []}
    answers: dict[str, dict[str, tuple]] = {"on": {}, "off": {}}
    try:
        sample = rows[1:]
        for index, row in enumerate(sample * 2):  # each row once each way, alternately
            way = "on" if (index + index // len(sample)) % 2 == 0 else "off"
            namespace_index.dict_version = cached if way == "on" else None
            spent.clear()
            result = estimate_row(estimator, row)
            by_way[way].append(sum(spent))
            answers[way][row.id] = (result.estimate_bytes, result.stated_margin, result.error)
    finally:
        namespace_index.dict_version = cached
        side_effects._Patches.install = install
    same = answers["on"] == answers["off"]
    for way, label in (("on", "dict-version cache"), ("off", "every namespace read")):
        print(f"namespace search ({label}): {1000 * statistics.mean(by_way[way]):.2f} ms CPU "
              f"per capture over {len(by_way[way])} captures")
    print(f"every row's estimate the same both ways: {same}")

    still_equal = compiled_code._still_equal
    for label, shortcut in (("get_config_copy shortcut", still_equal),
                            ("a getattr per setting", lambda *a: False)):
        compiled_code._still_equal = shortcut
        try:
            start = time.process_time()
            for _ in range(200):
                with compiled_code.compiler_configs_restored():
                    pass
            cpu = (time.process_time() - start) / 200
        finally:
            compiled_code._still_equal = still_equal
        print(f"compiler configs saved and put back ({label}): {1000 * cpu:.2f} ms CPU")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
