"""Per-row costs of a bench worker that branch q3 cut (issue 14), each timed against the way it was
done before, in one process after a warm-up CNN row (the loggers, modules and caches a worker has).

    python benchmarks/row_fixed_costs_speed.py [--repeat 7]

Printed, CPU microseconds per call (best of `--repeat` rounds, each round many calls):

- `logger restore`: `process_state`'s root-logger saver, saved and put back with nothing changed
  (as after a CNN row), against the previous restore (`setLevel` on every logger: each call
  clears every logger's cache, quadratic in the loggers) re-implemented here;
- `safe_open search`: the modules binding safetensors' `safe_open` found through the namespace
  index (`modules_binding`, as `weights_loading` does now) against a read of every loaded
  module's namespace (before);
- `known values: args to host` / `result leaves`: known_values' plain walk against pytree's
  `tree_map` / `tree_flatten` on batch norm's `num_batches_tracked.add_(1)` call (the known-value
  op every batch-norm forward of a CNN row makes).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _best(fn, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


def _old_restore(level: int, levels: dict) -> None:
    """The restore before branch q3: every logger's level set, changed or not."""
    root = logging.getLogger()
    root.setLevel(level)
    for name, logger in list(root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import cnn_row_profile
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.bench.runner import _init_worker, _work
    from peakmem.capture import known_values
    from peakmem.capture.namespace_index import modules_binding
    from peakmem.capture.process_state import _root_logger

    rows = cnn_row_profile._rows(1)
    _init_worker({"peakmem": PeakmemEstimator()})
    for row in rows:
        _work("peakmem", row)  # warm: the worker's loggers, modules, caches

    root = logging.getLogger()
    loggers = sum(isinstance(v, logging.Logger) for v in root.manager.loggerDict.values())
    levels = {name: lg.level for name, lg in root.manager.loggerDict.items()
              if isinstance(lg, logging.Logger)}
    results = {
        "logger restore": (_best(lambda: _root_logger()(), 50, args.repeat),
                           _best(lambda: _old_restore(root.level, levels), 50, args.repeat)),
    }

    import safetensors

    original = safetensors.safe_open

    def full_read() -> list:
        return [m for m in list(sys.modules.values())
                if isinstance(getattr(m, "__dict__", None), dict)
                and m.__dict__.get("safe_open") is original]

    def indexed() -> list:
        return [m for m, ns in list(modules_binding((id(original),)))
                if ns.get("safe_open") is original]

    assert indexed() == full_read()
    results["safe_open search"] = (_best(indexed, 20, args.repeat),
                                   _best(full_read, 20, args.repeat))

    tracked = torch.zeros((), dtype=torch.long)
    call = ((tracked, 1), {})
    fn = lambda value: value  # noqa: E731
    results["known values: args to host"] = (
        _best(lambda: known_values._fast_tree_map(fn, call), 2000, args.repeat),
        _best(lambda: tree_map(fn, call), 2000, args.repeat))
    results["known values: result leaves"] = (
        _best(lambda: known_values._fast_leaves(tracked), 2000, args.repeat),
        _best(lambda: tree_flatten(tracked)[0], 2000, args.repeat))

    print(f"{loggers} loggers, {len(sys.modules)} modules loaded")
    print("item | now (CPU us a call) | before | saved")
    for item, (now, before) in results.items():
        print(f"{item} | {now:.1f} | {before:.1f} | {before - now:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
