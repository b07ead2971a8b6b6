"""Ray for peakmem's many-estimates paths (`peakmem batch`, `peakmem bench --ray`): connect (a
local Ray by default, a cluster by address) and map work over it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from peakmem.inputs import InputError


def ray_connect(address: str | None = None, workers: int | None = None) -> Any:
    """Start a local Ray with `workers` CPUs, or join the cluster at `address`; the `ray`
    module."""
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "logging_level": "ERROR"}
        if address is None:  # a Ray of our own, even where a cluster runs on this machine
            kwargs["num_cpus"] = workers or os.cpu_count() or 1
        try:
            ray.init(address=address or "local", **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise RayUnavailable(f"cannot start or reach {where}: "
                                 f"{lines[-1] if lines else type(exc).__name__}") from None
    return ray


class RayUnavailable(InputError):
    """Ray cannot be started here or the cluster address cannot be reached (bad_input: the
    address or the machine is the user's to fix)."""


def ray_imap_unordered(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    workers: int | None = None,
    address: str | None = None,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> Iterator[Any]:
    """`fn(item)` for every item on a pool of Ray actors (each set up once by `initializer`),
    in the order they finish."""
    ray_connect(address, workers)
    from ray.util.multiprocessing import Pool

    pool = Pool(processes=workers, initializer=initializer, initargs=initargs)
    try:
        yield from pool.imap_unordered(fn, list(items))
    finally:
        pool.terminate()
