"""Environment variables set for the duration of a call, and put back after it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environment_set(env: dict[str, str]) -> Iterator[None]:
    """`os.environ` updated with `env` for the duration; each name put back (or removed) after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
