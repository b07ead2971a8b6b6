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
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        try:
            ray.init(address=address or "local", **kwargs)
        except _authentication_errors() as exc:
            raise RayUnavailable(_authentication_message(where, exc)) from None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise RayUnavailable(f"cannot start or reach {where}: "
                                 f"{lines[-1] if lines else type(exc).__name__}") from None
    return ray


AUTH_HINT = ("set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file holding it) to the cluster's "
             "token: it runs with RAY_AUTH_MODE=token")


def _authentication_errors() -> tuple[type[BaseException], ...]:
    """Ray's AuthenticationError (a token-authenticated cluster refused us), where this Ray has
    one."""
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:
        return ()
    return (AuthenticationError,)


def _authentication_message(where: str, exc: BaseException) -> str:
    """One line: who refused, Ray's own first line (its `message`: `str()` of the error adds
    paragraphs), and what to set."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    first = next((line.strip() for line in str(text).splitlines() if line.strip()),
                 type(exc).__name__)
    return f"{where} refused the connection (authentication): {first[:300]}; {AUTH_HINT}"


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
